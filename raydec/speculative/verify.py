"""The lossless verifier: one function for every method, in two couplings.

``verify_tree`` (coupling "rejection") and ``verify_coupled`` (coupling "gumbel", below: a match
against the target's Gumbel-max sample under noise fixed per generated position, so the
committed tokens do not depend on the drafts).

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
from typing import Callable

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


def acceptance_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) from the two values (a draft q never proposed is accepted iff p(x) > 0)."""
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(_RESIDUAL_EPS)).clamp(max=1.0), (p_x > 0).to(p_x.dtype))


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)).  p, q: [..., V]; token: [...]  -> [...]"""
    p_x = p.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    return acceptance_ratio(p_x, q_x)


def residual_weights(p: torch.Tensor, q: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """max(0, p - q): the target after a rejection, unnormalised, and where it has no mass.

    p, q: [..., V]  -> weights [..., V] (written to ``out`` if given: it may be q), empty [..., 1]
    bool. Where empty (p <= q everywhere, i.e. p == q) a rejection has probability 0 and the
    target stays p.
    """
    r = torch.sub(p, q, out=out).clamp_min_(0.0)
    return r, r.sum(dim=-1, keepdim=True) <= _RESIDUAL_EPS


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), or p where that has no mass (``residual_weights``).  p, q: [..., V] -> [..., V]"""
    r, empty = residual_weights(p, q)
    return torch.where(empty, p, r / r.sum(dim=-1, keepdim=True).clamp_min(_RESIDUAL_EPS))


def proposal_rows(tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
    """The proposals q of the given nodes as dense rows (one-hot for deterministic drafts).
    nodes: [B, L] node ids  -> [B, L, V]"""
    batch, count = nodes.shape
    vocab = tree.proposal_probs.shape[-1]
    tokens = tree.tokens.gather(1, nodes)
    one_hot = torch.zeros(batch, count, vocab, dtype=tree.proposal_probs.dtype, device=nodes.device).scatter_(2, tokens.unsqueeze(2), 1.0)
    if tree.proposal_probs.shape[1] == 0:
        return one_hot
    index = tree.proposal_index.gather(1, nodes)
    dense = tree.proposal_probs.gather(1, index.clamp(min=0).unsqueeze(2).expand(batch, count, vocab))
    return torch.where((index == DETERMINISTIC).unsqueeze(2), one_hot, dense)


def _sibling_tests(tree: DraftTree, p: torch.Tensor, children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling along L parents' children in sibling order.

    p: [B, L, V] P at each parent; children: [B, L, K] its children by rank (-1: none)
    -> acceptance probability of each child given every earlier one was rejected [B, L, K],
       and the residual after all of them were rejected [B, L, V] (p where there are none)
    """
    r = p
    accept = torch.zeros(children.shape, dtype=p.dtype, device=p.device)
    group = lambda c: tree.proposal_index.gather(1, c.flatten(1)).view_as(c)  # noqa: E731  [B, L]
    for j in range(children.shape[-1]):
        child = children[..., j]
        exists = child >= 0
        node = child.clamp(min=0)
        q = proposal_rows(tree, node).to(p.dtype)
        token = tree.tokens.gather(1, node)
        if j and tree.without_replacement_anywhere():  # drawn after earlier same-group siblings' tokens were removed
            own = group(node)
            marked = tree.without_replacement.gather(1, node) & (own != DETERMINISTIC)
            removed = torch.zeros(q.shape, dtype=torch.bool, device=q.device)
            for i in range(j):
                earlier = children[..., i].clamp(min=0)
                same = (children[..., i] >= 0) & (group(earlier) == own) & marked
                removed |= torch.zeros_like(removed).scatter_(2, tree.tokens.gather(1, earlier).unsqueeze(2), same.unsqueeze(2))
            q = torch.where(marked.unsqueeze(2), effective_proposal(q, removed), q)
        accept[..., j] = torch.where(exists, acceptance_probability(r, q, token), 0.0)
        r = torch.where(exists.unsqueeze(2), residual(r, q), r)
    return accept, r


# ---------------------------------------------------------------------------------------------
# The verifier


def verify_tree(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """Recursive rejection sampling over every row's tree, rows independent, on P's device.

    tree:         DraftTree with B rows, N nodes (on P's device)
    target_probs: [B, N, V] processed target distribution *after* each node
    uniforms:     [B, >= N] float64; column n tests node n, column 0 samples the final token

    The walk of the module docstring, decided for every node at once. The test of a child
    depends only on P at its parent and on the children before it (their q and tokens), never
    on how the walk reached the parent. A first child is tested against P at its parent
    itself: one value per node, p(x) / q(x). Later siblings need the residual after the ones
    before them: computed only at the nodes with two or more children (at most the tree's
    ``branch_nodes``, known to its proposer), one pass per sibling rank. The walk is then "go
    to the first accepted child", followed from the root by pointer doubling; the final token
    comes from the residual at the stop node (after all its children failed; P at a leaf).
    Work over the vocabulary: the branch nodes and the stop node only. No step reads a value
    back to the host.
    """
    batch, width = tree.tokens.shape
    device = target_probs.device
    nodes = torch.arange(width, device=device)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    is_child = tree.valid & (tree.parents >= 0)                                   # [B, N]
    parent = tree.parents.clamp(min=0)
    earlier = nodes.unsqueeze(1) > nodes.unsqueeze(0)                            # [i, j]: j before i
    sibling_before = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & earlier & is_child.unsqueeze(1)  # [B, N, N]
    rank = sibling_before.sum(dim=2)                                             # [B, N] sibling rank
    most = max(1, tree.children_bound())
    # children[b, m, k]: node m's child of rank k (-1: none)
    table = torch.full((batch, width * most + 1), -1, dtype=torch.long, device=device)
    table.scatter_(1, torch.where(is_child & (rank < most), parent * most + rank, width * most), nodes.expand(batch, width))
    children = table[:, : width * most].view(batch, width, most)

    # first children: P at the parent, at the node's own token, under its own q
    p_x = target_probs[rows, parent, tree.tokens]
    if tree.proposal_probs.shape[1]:
        q_x = tree.proposal_probs[rows, tree.proposal_index.clamp(min=0), tree.tokens]
        q_x = torch.where(tree.proposal_index == DETERMINISTIC, 1.0, q_x.to(p_x.dtype))
    else:
        q_x = torch.ones_like(p_x)
    accept_prob = acceptance_ratio(p_x, q_x)                                     # [B, N]
    branch_nodes = tree.branch_node_bound()
    if most > 1 and branch_nodes:  # later siblings: residuals at the nodes with several children
        counts = (children >= 0).sum(dim=2)                                      # [B, N]
        branch = counts.topk(min(branch_nodes, width), dim=1).indices            # [B, L] every node with >= 2 children
        later, _ = _sibling_tests(tree, target_probs[rows, branch], children[rows, branch])
        tested = children[rows, branch][..., 1:]                                 # [B, L, K - 1]
        sink = torch.cat([accept_prob, accept_prob.new_zeros(batch, 1)], dim=1)
        sink.scatter_(1, torch.where(tested >= 0, tested, width).flatten(1), later[..., 1:].flatten(1))
        accept_prob = sink[:, :width]
    # compared in float64: a float32 copy rounds one uniform in 2**25 up to 1.0, which would reject
    # a draft the target accepts with certainty
    accepted = is_child & (uniforms[:, :width].to(torch.float64) < accept_prob.to(torch.float64))

    stop_node = _first_accepted_walk(tree, accepted).unsqueeze(1)               # [B, 1]
    _, final = _sibling_tests(tree, target_probs[rows, stop_node], children[rows, stop_node])
    next_token = sample_with_uniform(final[:, 0], uniforms[:, 0])
    stop_node = stop_node.squeeze(1)
    num_accepted = tree.depth().gather(1, stop_node.unsqueeze(1)).squeeze(1)
    rejected = children[rows.squeeze(1), stop_node, 0] >= 0
    return VerifyResult(_path_to(tree, stop_node, num_accepted), num_accepted, next_token, stop_node, rejected)


def _first_accepted_walk(tree: DraftTree, accepted: torch.Tensor) -> torch.Tensor:
    """The walk from the root that goes to each node's first accepted child, to its end.
    accepted: [B, N] bool (a child passed its test)  -> stop node [B]"""
    batch, width = tree.tokens.shape
    nodes = torch.arange(width, device=accepted.device)
    parent = tree.parents.clamp(min=0)
    # every node's first accepted child (itself if none), then the walk from the root
    first_child = torch.full((batch, width + 1), width, dtype=torch.long, device=accepted.device)
    first_child.scatter_reduce_(1, torch.where(accepted, parent, width), torch.where(accepted, nodes, width), "amin")
    step = torch.where(first_child[:, :width] < width, first_child[:, :width], nodes)  # [B, N]
    for _ in range(max(1, (width - 1).bit_length())):  # 2**k >= N - 1 hops: the longest path
        step = step.gather(1, step)
    return step[:, 0]


# ---------------------------------------------------------------------------------------------
# The coupled verifier: drafter-invariant (Gumbel coupling)


def coupled_tokens(target_probs: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """The target's own sample after every node: ``argmax(P / E)`` = ``argmax(log P + G)`` with
    ``G = -log E`` (Gumbel-max, exactly a sample of P; zero-mass tokens never win), computed in
    P's dtype. target_probs: [B, N, V]; exponentials: [B, N, V], each node's noise at its
    generated position  -> [B, N] long"""
    return torch.div(target_probs, exponentials.to(target_probs.dtype)).argmax(dim=-1)


def verify_coupled(tree: DraftTree, target_probs: torch.Tensor, exponentials: torch.Tensor) -> VerifyResult:
    """Drafter-invariant verification: a match test against the target's Gumbel-max sample.

    tree:         DraftTree with B rows, N nodes (on P's device)
    target_probs: [B, N, V] processed target distribution *after* each node
    exponentials: [B, L + 1, V] the rows' public noise by depth: depth d's is at the generated
                  position a depth-d node's P predicts (``random.position_exponentials``: a
                  function of seed and position only); L >= the deepest node's depth

    The token after node n is t_n = argmax(P_n / E_depth(n)). A child is accepted iff its token
    equals t at its parent; the walk follows the accepted children from the root and commits t
    at the node where it stops. Every committed token is the target's own sample for that
    prefix, so a row's output is the one plain decoding with the same noise gives, whatever was
    drafted; only how many tokens a step commits depends on the drafts. Proposals are not read:
    drafts need not be samples of anything.
    """
    batch, width = tree.tokens.shape
    depth = tree.depth().clamp(max=exponentials.shape[1] - 1)
    noise = exponentials.to(target_probs.dtype).gather(1, depth.unsqueeze(2).expand(batch, width, exponentials.shape[2]))
    target = torch.div(target_probs, noise, out=noise).argmax(dim=-1)          # [B, N]: coupled_tokens, one [B, N, V] buffer
    is_child = tree.valid & (tree.parents >= 0)
    parent = tree.parents.clamp(min=0)
    accepted = is_child & (tree.tokens == target.gather(1, parent))
    stop_node = _first_accepted_walk(tree, accepted)                            # [B]
    next_token = target.gather(1, stop_node.unsqueeze(1)).squeeze(1)
    num_accepted = tree.depth().gather(1, stop_node.unsqueeze(1)).squeeze(1)
    has_child = torch.zeros(batch, width + 1, dtype=torch.bool, device=target.device)
    has_child.scatter_(1, torch.where(is_child, parent, width), True)
    rejected = has_child[:, :width].gather(1, stop_node.unsqueeze(1)).squeeze(1)
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
