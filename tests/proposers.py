"""A proposer that drafts at random: the workhorse of the exactness harness (tests only).

It knows nothing about the target, so any acceptance it gets is luck, but every draft is
reported honestly: a dense ``q`` the token was drawn from, or one-hot for "deterministic"
drafts (a token fixed before verification, whatever private randomness chose it). Tree shape:
a full ``branching``-ary tree of ``tree_depth`` levels (siblings drawn without replacement
from one shared ``q``), then a chain under the first-candidate spine up to ``window`` nodes.
"""

from __future__ import annotations

from typing import Literal

import torch

from raydec.config import JacobiDraftConfig
from raydec.speculative import random as streams
from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.sampling import sample_with_uniform
from raydec.speculative.tree import DETERMINISTIC, DraftTree

# this proposer's two streams: ids the engine and raydec's proposers leave free
RANDOM_TREE = streams.FIRST_FREE_STREAM  # the normals behind each group's q
RANDOM_TREE_PICK = streams.FIRST_FREE_STREAM + 1  # the uniforms that pick each node's token


def tree_shape(branching: int, depth: int, window: int) -> tuple[list[int], list[int], list[int]]:
    """Parents, proposal group and sibling rank of every node (node 0 = root, group -1).

    A full ``branching``-ary tree of ``depth`` levels (each parent's children share one group),
    then a chain under the first-candidate spine until ``window`` draft nodes.
    """
    parents, groups, ranks = [-1], [-1], [0]
    frontier, spine, num_groups = [0], 0, 0
    for _ in range(depth):
        next_frontier = []
        for node in frontier:
            for rank in range(branching):
                parents.append(node)
                groups.append(num_groups)
                ranks.append(rank)
                next_frontier.append(len(parents) - 1)
            num_groups += 1
        spine = next_frontier[frontier.index(spine) * branching]
        frontier = next_frontier
    while len(parents) - 1 < window:
        parents.append(spine)
        groups.append(num_groups)
        ranks.append(0)
        num_groups += 1
        spine = len(parents) - 1
    return parents, groups, ranks


class RandomTreeProposer(Proposer):
    """Random drafts with honest proposals (see module docstring).

    mode: "dense"   -> tokens ~ a random q per sibling group (without replacement within the
                       group), reported as that q
          "onehot"  -> tokens uniform over allowed ids, reported as deterministic
    sharpness: scale of the random logits behind q (higher = more concentrated q)
    Each row draws ``groups * V`` normals and ``nodes - 1`` uniforms from its own streams.
    """

    def __init__(self, draft: JacobiDraftConfig, mode: Literal["dense", "onehot"] = "dense", sharpness: float = 2.0) -> None:
        self.mode = mode
        self.sharpness = sharpness
        parents, groups, ranks = tree_shape(draft.branching, draft.tree_depth, draft.window)
        self.parents = torch.tensor(parents)
        self.groups = torch.tensor(groups)
        self.ranks = torch.tensor(ranks)
        self.num_groups = int(self.groups.max()) + 1 if len(groups) > 1 else 0
        self.branching = draft.branching
        # siblings sharing a group were drawn without replacement (chain nodes are alone)
        siblings = (self.parents.unsqueeze(0) == self.parents.unsqueeze(1)).sum(dim=1)
        self.without_replacement = (self.groups >= 0) & (siblings > 1)
        self.rank_nodes = [((self.ranks == rank) & (self.groups >= 0)).nonzero().flatten() for rank in range(self.branching)]
        children = torch.zeros(len(parents), dtype=torch.long).scatter_add_(0, self.parents[1:], torch.ones(len(parents) - 1, dtype=torch.long))
        self.max_children = int(children.max()) if len(parents) > 1 else 0
        self.branch_nodes = int((children >= 2).sum())

    def propose(self, state: DecodeState) -> DraftTree:
        batch, vocab, width = state.batch_size, state.vocab_size, len(self.parents)
        normals = state.random.normals(RANDOM_TREE, self.num_groups * vocab).view(batch, self.num_groups, vocab)
        uniforms = state.random.uniforms(RANDOM_TREE_PICK, width - 1)
        logits = normals * self.sharpness  # [B, G, V]
        if state.constraint is not None and state.constraint.allowed is not None:
            logits = logits.masked_fill(~state.constraint.allowed, float("-inf"))
        q = torch.softmax(logits, dim=-1)
        tokens = torch.zeros(batch, width, dtype=torch.long)
        tokens[:, 0] = state.roots()
        rows = torch.arange(batch).unsqueeze(1)
        if self.mode == "onehot":
            allowed = (q[0, 0] > 0).nonzero().flatten() if self.num_groups else torch.arange(vocab)
            index = (uniforms * len(allowed)).long().clamp(max=len(allowed) - 1)
            tokens[:, 1:] = allowed[index]
            proposal_index = torch.full((batch, width), DETERMINISTIC, dtype=torch.long)
            without_replacement = torch.zeros(batch, width, dtype=torch.bool)
            proposal_probs = torch.zeros(batch, 0, vocab, dtype=state.prob_dtype)
        else:
            picked = torch.zeros(batch, self.num_groups, vocab, dtype=torch.bool)
            for nodes in self.rank_nodes:
                groups = self.groups[nodes]
                weights = q[:, groups].masked_fill(picked[:, groups], 0.0)  # [B, n, V]
                chosen = sample_with_uniform(weights, uniforms[:, nodes - 1])  # [B, n]
                tokens[:, nodes] = chosen
                picked[rows, groups.unsqueeze(0), chosen] = True
            proposal_index = self.groups.expand(batch, width).clone()
            without_replacement = self.without_replacement.expand(batch, width)
            proposal_probs = q.to(state.prob_dtype)
        return DraftTree(
            tokens=tokens,
            parents=self.parents.expand(batch, width).clone(),
            valid=torch.ones(batch, width, dtype=torch.bool),
            proposal_index=proposal_index,
            without_replacement=without_replacement.clone(),
            proposal_probs=proposal_probs,
            max_children=self.max_children,
            branch_nodes=self.branch_nodes,
            any_without_replacement=self.mode == "dense" and bool(self.without_replacement.any()),
        )
