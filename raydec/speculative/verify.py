"""The lossless verifier: one function for every method.

Level-by-level recursive rejection sampling over a draft tree (Chen et al. 2023 speculative
sampling; recursive / multi-draft form as in SpecInfer and Jeon et al. 2024):

    node = root; p = P[root]
    loop:
        for each child c of node, in sibling order:
            q = proposal of c (its group's q minus earlier siblings' tokens if drawn
                without replacement, renormalised)
            accept c with probability min(1, p(x_c) / q(x_c)) -> node = c; p = P[c]; next level
            else p = norm(max(0, p - q))
        no child accepted -> commit x ~ p (the residual); stop
        node has no children -> commit the bonus x ~ P[node]; stop

By induction the committed token at every level is distributed exactly as the target's P at
that context, whatever the proposals were, as long as each proposal is reported honestly.
The first accepted sibling wins: choosing among accepted siblings (e.g. the longest path)
biases the output. At temperature 0, P is one-hot and this reduces to "accept the longest
prefix that matches the argmax".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from raydec.speculative.sampling import sample_with_uniform
from raydec.speculative.tree import DETERMINISTIC, DraftTree

_RESIDUAL_EPS = 1e-12


@dataclass
class VerifyResult:
    """Per-row outcome of one verification.

    path:          [B, N] long  accepted node indices, root first, padded with -1
    num_accepted:  [B]    long  accepted draft nodes (root excluded)
    next_token:    [B]    long  the token drawn at the stop node (residual or bonus)
    stop_node:     [B]    long  deepest accepted node (where next_token was drawn)
    rejected:      [B]    bool  True if next_token came from a residual (some child was rejected)
    accepted_counts: B ints     num_accepted on the host, set by the engine after its read-back
    """

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor
    stop_node: torch.Tensor
    rejected: torch.Tensor
    accepted_counts: list[int] | None = None

    def committed_tokens(self, tree: DraftTree, row: int) -> list[int]:
        """Accepted draft tokens then the final token, for one row (reads back: tests, debugging)."""
        n = int(self.num_accepted[row])
        nodes = self.path[row, 1 : n + 1].tolist()
        return [int(tree.tokens[row, node]) for node in nodes] + [int(self.next_token[row])]

    def committed(self, tree: DraftTree) -> torch.Tensor:
        """[B, N] every row's committed tokens (accepted drafts, then the final token), -1 after."""
        batch, width = tree.tokens.shape
        steps = torch.arange(width, device=self.path.device).unsqueeze(0)
        drafts = tree.tokens.gather(1, torch.cat([self.path[:, 1:], self.path[:, :1]], dim=1).clamp(min=0))
        out = torch.where(steps < self.num_accepted.unsqueeze(1), drafts, torch.full_like(drafts, -1))
        return torch.where(steps == self.num_accepted.unsqueeze(1), self.next_token.unsqueeze(1), out)


# ---------------------------------------------------------------------------------------------
# The three pieces of math, shared by the batched verifier and the exact-law enumeration.


def effective_proposal(q: torch.Tensor, removed: torch.Tensor | None) -> torch.Tensor:
    """q with the tokens in ``removed`` zeroed and renormalised (sampling without replacement).

    q: [B, V]; removed: [B, V] bool or None  -> [B, V]
    """
    if removed is None:
        return q
    q = q.masked_fill(removed, 0.0)
    return q / q.sum(dim=-1, keepdim=True).clamp_min(_RESIDUAL_EPS)


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)).  p, q: [..., V]; token: [...]  -> [...]"""
    p_x = p.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(_RESIDUAL_EPS)).clamp(max=1.0), (p_x > 0).to(p.dtype))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the target after a rejection.  p, q: [B, V] -> [B, V]

    If p <= q everywhere (p == q), a rejection has probability 0; p is returned unchanged.
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > _RESIDUAL_EPS, r / mass.clamp_min(_RESIDUAL_EPS), p)


def node_proposals(tree: DraftTree) -> torch.Tensor:
    """Every node's proposal q as a dense row (one-hot for deterministic drafts) -> [B, N, V]."""
    batch, width = tree.tokens.shape
    vocab = tree.proposal_probs.shape[-1]
    one_hot = torch.zeros(batch, width, vocab, dtype=tree.proposal_probs.dtype, device=tree.tokens.device)
    one_hot.scatter_(2, tree.tokens.unsqueeze(2), 1.0)
    if tree.proposal_probs.shape[1] == 0:
        return one_hot
    index = tree.proposal_index.clamp(min=0).unsqueeze(2).expand(batch, width, vocab)
    dense = tree.proposal_probs.gather(1, index)
    return torch.where((tree.proposal_index == DETERMINISTIC).unsqueeze(2), one_hot, dense)


# ---------------------------------------------------------------------------------------------
# The verifier


def verify_tree(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """Recursive rejection sampling over every row's tree, rows independent, on P's device.

    tree:         DraftTree with B rows, N nodes (on P's device)
    target_probs: [B, N, V] processed target distribution *after* each node
    uniforms:     [B, >= N] float64; column n tests node n, column 0 samples the final token

    The walk of the module docstring, decided for every node at once. The test of a child
    depends only on P at its parent and on the children before it (their q and tokens), never
    on how the walk reached the parent; so, with r_m^(j) the residual at node m after its
    first j children were rejected (r_m^(0) = P[m]), child number j of m is accepted iff
    u < min(1, r_m^(j)(x) / q'(x)), q' its proposal minus earlier same-group siblings' tokens.
    One pass per sibling rank (the tree's ``max_children``, known to its proposer) computes
    every test; the walk is then "go to the first accepted child", followed from the root by
    pointer doubling; the final token comes from r at the stop node (the residual after all
    its children failed, or P itself at a leaf). No step reads a value back to the host.
    """
    batch, width = tree.tokens.shape
    vocab = target_probs.shape[-1]
    device = target_probs.device
    nodes = torch.arange(width, device=device)
    is_child = tree.valid & (tree.parents >= 0)                                   # [B, N]
    parent = tree.parents.clamp(min=0)
    earlier = nodes.unsqueeze(1) > nodes.unsqueeze(0)                            # [i, j]: j before i
    sibling_before = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & earlier & is_child.unsqueeze(1)  # [B, N, N]
    rank = sibling_before.sum(dim=2)                                             # [B, N] sibling rank
    max_children = tree.children_bound()

    q = node_proposals(tree).to(target_probs.dtype)                              # [B, N, V]
    if bool(tree.without_replacement_anywhere()):
        same_group = sibling_before & (tree.proposal_index.unsqueeze(2) == tree.proposal_index.unsqueeze(1))
        same_group &= (tree.proposal_index != DETERMINISTIC).unsqueeze(2) & tree.without_replacement.unsqueeze(2)
        removed = torch.zeros(batch, width, vocab, dtype=torch.int32, device=device)
        removed.scatter_add_(2, tree.tokens.unsqueeze(1).expand(batch, width, width), same_group.int())
        q = torch.where(tree.without_replacement.unsqueeze(2), effective_proposal(q, removed > 0), q)

    residuals = torch.cat([target_probs, target_probs[:, :1]], dim=1)           # [B, N + 1, V]; row N: a sink
    accept_prob = torch.zeros(batch, width, dtype=target_probs.dtype, device=device)
    for j in range(max_children):
        at_rank = is_child & (rank == j)                                         # [B, N]
        at_parent = residuals.gather(1, parent.unsqueeze(2).expand(batch, width, vocab))  # r_parent^(j) per child
        accept_prob = torch.where(at_rank, acceptance_probability(at_parent, q, tree.tokens), accept_prob)
        target_row = torch.where(at_rank, parent, width).unsqueeze(2).expand(batch, width, vocab)
        residuals.scatter_(1, target_row, residual(at_parent, q))                 # r_parent^(j+1); others -> sink
    # compared in float64: a float32 copy rounds one uniform in 2**25 up to 1.0, which would reject
    # a draft the target accepts with certainty
    accepted = is_child & (uniforms[:, :width].to(torch.float64) < accept_prob.to(torch.float64))

    # every node's first accepted child (itself if none), then the walk from the root
    first_child = torch.full((batch, width + 1), width, dtype=torch.long, device=device)
    first_child.scatter_reduce_(1, torch.where(accepted, parent, width), torch.where(accepted, nodes, width), "amin")
    step = torch.where(first_child[:, :width] < width, first_child[:, :width], nodes)  # [B, N]
    for _ in range(max(1, (width - 1).bit_length())):  # 2**k >= N - 1 hops: the longest path
        step = step.gather(1, step)
    stop_node = step[:, 0]                                                       # [B]
    rows = torch.arange(batch, device=device)
    num_accepted = tree.depth()[rows, stop_node]
    rejected = (is_child & (tree.parents == stop_node.unsqueeze(1))).any(dim=1)
    next_token = sample_with_uniform(residuals[rows, stop_node], uniforms[:, 0])
    return VerifyResult(_path_to(tree, stop_node, num_accepted), num_accepted, next_token, stop_node, rejected)


def _path_to(tree: DraftTree, stop_node: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """[B, N] the root-to-stop-node path (node ids by depth), padded with -1."""
    batch, width = tree.tokens.shape
    rows = torch.arange(batch, device=stop_node.device)
    path_nodes = tree.ancestor_mask()[rows, stop_node]  # the stop node and its ancestors
    depth = tree.depth()
    order = torch.where(path_nodes, depth, torch.full_like(depth, width))
    path = torch.sort(order, dim=1, stable=True).indices
    steps = torch.arange(width, device=stop_node.device).unsqueeze(0)
    return torch.where(steps <= num_accepted.unsqueeze(1), path, torch.full_like(path, -1))


# ---------------------------------------------------------------------------------------------
# Exact law of the verifier's output (for tests and documentation)


def output_law(
    tree: DraftTree, row: int, target: Callable[[tuple[int, ...]], torch.Tensor]
) -> dict[tuple[int, ...], float]:
    """Exact law of the committed token sequence for one row's tree *shape*.

    Marginalises over the drafts: a node with a dense proposal takes every token its ``q``
    allows (without replacement within its group when so marked) with that probability; a
    deterministic node keeps its token. ``target(prefix)`` gives the target's P ([V]) after a
    committed prefix. Uses the same ``effective_proposal`` / ``acceptance_probability`` /
    ``residual`` math as ``verify_tree``. For a lossless verifier, extending each committed
    sequence by the target process gives exactly the target's law.
    """
    children = tree.children_lists(row)
    law: dict[tuple[int, ...], float] = {}

    def descend(node: int, prefix: tuple[int, ...], weight: float) -> None:
        test_siblings(children[node], 0, target(prefix).unsqueeze(0), prefix, weight, frozenset())

    def test_siblings(siblings: list[int], k: int, p: torch.Tensor, prefix: tuple[int, ...], weight: float, removed: frozenset[tuple[int, int]]) -> None:
        if k == len(siblings):  # nothing accepted: the committed token comes from p (residual or bonus)
            mass = float(p[0].sum())
            for token, prob in enumerate(p[0].tolist()):
                if prob > 0:
                    key = prefix + (token,)
                    law[key] = law.get(key, 0.0) + weight * prob / mass
            return
        child = siblings[k]
        group = int(tree.proposal_index[row, child])
        q = tree.proposal_of(row, child).to(p.dtype).unsqueeze(0)
        if bool(tree.without_replacement[row, child]) and group != DETERMINISTIC:
            mask = torch.zeros_like(q, dtype=torch.bool)
            for token, owner in removed:
                if owner == group:
                    mask[0, token] = True
            q = effective_proposal(q, mask)
        if group == DETERMINISTIC:
            draws = [(int(tree.tokens[row, child]), 1.0)]
        else:
            draws = [(token, prob) for token, prob in enumerate(q[0].tolist()) if prob > 0]
        for token, draw_prob in draws:
            accept = float(acceptance_probability(p, q, torch.tensor([token])))
            if accept > 0:
                descend(child, prefix + (token,), weight * draw_prob * accept)
            if accept < 1:
                test_siblings(siblings, k + 1, residual(p, q), prefix, weight * draw_prob * (1 - accept), removed | {(token, group)})

    descend(0, (), 1.0)
    return law
