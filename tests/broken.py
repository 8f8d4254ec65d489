"""Deliberately broken verifiers. The exactness harness must reject each of them.

1. ``longest_path_verifier``: tests every node against its parent's P independently and keeps
   the longest accepted path (spec pitfall 1).
2. ``stale_proposal_verifier``: tests a sibling drawn without replacement against the outdated
   proposal (its group's q before the earlier siblings were removed).
3. ``batch_minimum_verifier``: every row commits the batch-minimum number of drafts and then a
   residual token, even rows that accepted the next draft (spec pitfall 5).
4. ``near_match_coupled_verifier``: Gumbel coupling that accepts a draft close to the target's
   Gumbel-max sample, not equal to it.
"""

from __future__ import annotations

import dataclasses
import torch

from raydec.speculative.sampling import sample_with_uniform
from raydec.speculative.tree import DraftTree
from raydec.speculative.verify import VerifyResult, proposal_rows, residual, verify_coupled, verify_tree


def longest_path_verifier(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    # every node tested on its own against its parent's P (no residual between siblings)
    parents = tree.parents.clamp(min=0)
    p_parent = target_probs.gather(1, parents.unsqueeze(-1).expand(-1, -1, target_probs.shape[-1]))  # [B, N, V]
    p_x = p_parent.gather(-1, tree.tokens.unsqueeze(-1)).squeeze(-1)
    q_x = torch.stack([_proposal_at_token(tree, node) for node in range(width)], dim=1).to(p_x.dtype)
    passed = (uniforms.to(p_x.dtype) < (p_x / q_x.clamp_min(1e-12)).clamp(max=1.0)) & tree.valid
    passed_list, parents_list = passed.tolist(), tree.parents.tolist()
    path = torch.full((batch, width), -1, dtype=torch.long)
    num_accepted = torch.zeros(batch, dtype=torch.long)
    end_node = torch.zeros(batch, dtype=torch.long)
    first_child = torch.zeros(batch, dtype=torch.long)
    for row in range(batch):
        depth_of, best = {0: 0}, 0
        for node in range(1, width):
            parent = parents_list[row][node]
            if passed_list[row][node] and parent in depth_of:
                depth_of[node] = depth_of[parent] + 1
                if depth_of[node] > depth_of[best]:
                    best = node
        trail = [best]
        while trail[-1] != 0:
            trail.append(parents_list[row][trail[-1]])
        trail.reverse()
        path[row, : len(trail)] = torch.tensor(trail)
        num_accepted[row] = len(trail) - 1
        end_node[row] = best
        kids = [n for n in range(1, width) if parents_list[row][n] == best and tree.valid[row, n]]
        first_child[row] = kids[0] if kids else -1
    p = target_probs[rows, end_node]
    rejected = first_child >= 0
    if bool(rejected.any()):
        q = proposal_rows(tree, first_child.clamp(min=0).unsqueeze(1))[:, 0].to(p.dtype)
        p = torch.where(rejected.unsqueeze(1), residual(p, q), p)
    next_token = sample_with_uniform(p, uniforms[:, 0])
    return VerifyResult(path, num_accepted, next_token, end_node, rejected)


def _proposal_at_token(tree: DraftTree, node: int) -> torch.Tensor:
    """q(x) of every row's node ``node`` at its own token -> [B]."""
    index = tree.proposal_index[:, node]
    token = tree.tokens[:, node]
    if tree.proposal_probs.shape[1] == 0:
        return torch.ones(tree.batch_size)
    dense = tree.proposal_probs[torch.arange(tree.batch_size), index.clamp(min=0), token]
    return torch.where(index < 0, torch.ones_like(dense), dense)


def stale_proposal_verifier(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    stale = dataclasses.replace(tree, without_replacement=torch.zeros_like(tree.without_replacement), any_without_replacement=False)
    stale._memo = dict(tree._memo)
    return verify_tree(stale, target_probs, uniforms)


def batch_minimum_verifier(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    result = verify_tree(tree, target_probs, uniforms)
    minimum = int(result.num_accepted.min())
    extra = (uniforms[:, 0] * 7919.0) % 1.0  # a second number per row, as fresh as the first
    for row in range(tree.batch_size):
        if int(result.num_accepted[row]) <= minimum:
            continue
        parent = int(result.path[row, minimum])
        child = int(result.path[row, minimum + 1])
        p = target_probs[row, parent].unsqueeze(0)
        q = tree.proposal_of(row, child).to(p.dtype).unsqueeze(0)
        result.next_token[row] = sample_with_uniform(residual(p, q)[0], extra[row])
        result.path[row, minimum + 1 :] = -1
        result.num_accepted[row] = minimum
        result.stop_node[row] = parent
        result.rejected[row] = True
    return result


def near_match_coupled_verifier(tree: DraftTree, target_probs: torch.Tensor, exponentials: torch.Tensor) -> VerifyResult:
    """Gumbel coupling that also accepts a draft whose perturbed score log P + G (G = -log E)
    comes within 3 of the target's best (a near-match): the first such child of each node is
    made the target's own sample by shrinking its token's noise at the parent's level."""
    depth = tree.depth().clamp(max=exponentials.shape[1] - 1)
    noise = exponentials.clone()  # [B, L + 1, V]
    for row in range(tree.batch_size):
        bumped: set[int] = set()
        for node in range(1, tree.num_nodes):
            parent, token = int(tree.parents[row, node]), int(tree.tokens[row, node])
            if parent < 0 or not bool(tree.valid[row, node]) or parent in bumped:
                continue
            level = int(depth[row, parent])
            scores = torch.log(target_probs[row, parent].to(torch.float64)) - torch.log(noise[row, level])
            if float(scores[token]) >= float(scores.max()) - 3.0:
                noise[row, level, token] *= 1e-3  # now the parent's argmax (its log-score up by 6.9)
                bumped.add(parent)
    return verify_coupled(tree, target_probs, noise)
