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

from raydec.spec.sampling import draw_uniforms, sample_with_uniform
from raydec.spec.tree import DETERMINISTIC, DraftTree

_RESIDUAL_EPS = 1e-12
# up to this many rows the per-row walk beats the batched recursion (SJD-PAC trees, 2-core CPU:
# 0.6 vs 1.3 ms at 1 row; at 8 rows even or slower)
WALK_MAX_ROWS = 4


@dataclass
class VerifyResult:
    """Per-row outcome of one verification.

    path:          [B, N] long  accepted node indices, root first, padded with -1
    num_accepted:  [B]    long  accepted draft nodes (root excluded)
    next_token:    [B]    long  the token drawn at the stop node (residual or bonus)
    stop_node:     [B]    long  deepest accepted node (where next_token was drawn)
    rejected:      [B]    bool  True if next_token came from a residual (some child was rejected)
    """

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor
    stop_node: torch.Tensor
    rejected: torch.Tensor

    def committed_tokens(self, tree: DraftTree, row: int) -> list[int]:
        """Accepted draft tokens then the final token, for one row."""
        n = int(self.num_accepted[row])
        nodes = self.path[row, 1 : n + 1].tolist()
        return [int(tree.tokens[row, node]) for node in nodes] + [int(self.next_token[row])]


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


def _dense_proposal(tree: DraftTree, node: torch.Tensor) -> torch.Tensor:
    """Proposal q of one node per row ([B] node ids) -> [B, V] (one-hot if deterministic)."""
    batch = tree.batch_size
    rows = torch.arange(batch)
    vocab = tree.proposal_probs.shape[-1]
    index = tree.proposal_index[rows, node]
    token = tree.tokens[rows, node]
    deterministic = index == DETERMINISTIC
    if tree.proposal_probs.shape[1] == 0 or bool(deterministic.all()):
        one_hot = torch.zeros(batch, vocab, dtype=tree.proposal_probs.dtype)
        one_hot[rows, token] = 1.0
        return one_hot
    dense = tree.proposal_probs[rows, index.clamp(min=0)]
    if bool(deterministic.any()):
        dense = dense.clone()
        dense[deterministic] = 0.0
        dense[rows[deterministic], token[deterministic]] = 1.0
    return dense


# ---------------------------------------------------------------------------------------------
# The batched verifier


def verify_tree(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generators: Sequence[torch.Generator],
    uniforms: torch.Tensor | None = None,
) -> VerifyResult:
    """Recursive rejection sampling over every row's tree, rows independent.

    tree:         DraftTree with B rows, N nodes
    target_probs: [B, N, V] processed target distribution *after* each node
    generators:   one per row; row r draws one uniform per node index of its own tree
    uniforms:     optional [B, N] pre-drawn uniforms (column i tests node i, column 0 samples
                  the final token); drawn from ``generators`` when None
    """
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    if uniforms is None:
        uniforms = draw_uniforms(generators, tree.index_extent(), dtype=torch.float64)
    # compared in float64: a float32 copy rounds one uniform in 2**25 up to 1.0, which would reject
    # a draft the target accepts with certainty
    uniforms = uniforms.to(torch.float64)
    if width == 1:  # no drafts (AR): a sample of P at the root, as the chain verifier would draw
        zero = torch.zeros(batch, dtype=torch.long)
        next_token = sample_with_uniform(target_probs[:, 0], uniforms[:, 0])
        return VerifyResult(zero.unsqueeze(1), zero, next_token, zero.clone(), torch.zeros(batch, dtype=torch.bool))
    if is_chain(tree):
        return _verify_chain(tree, target_probs, uniforms)
    if _all_one_hot(tree, target_probs):
        return _verify_greedy(tree, target_probs)
    if _one_hot_drafts(tree):
        return _verify_one_hot_drafts(tree, target_probs, uniforms)
    if batch <= WALK_MAX_ROWS:
        return _verify_walk(tree, target_probs, uniforms)
    return _verify_recursive(tree, target_probs, uniforms)


def _verify_recursive(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """The general case: level by level, siblings in order (see the module docstring).

    Runs of only children (a chain inside the tree, e.g. SJD-PAC's spine below its tree
    levels) are crossed in one jump: an only child is tested against P at its parent with its
    own q (it has no earlier sibling), so its test does not depend on the walk that reaches it
    and all of them are decided up front with the same uniforms the walk would use.
    """
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    current = torch.zeros(batch, dtype=torch.long)           # node we stand on
    p = target_probs[:, 0].clone()                           # [B, V] target at `current`
    active = torch.ones(batch, dtype=torch.bool)             # still descending
    rejected = torch.zeros(batch, dtype=torch.bool)
    next_token = torch.zeros(batch, dtype=torch.long)
    stop_node = torch.zeros(batch, dtype=torch.long)
    is_node = tree.valid.clone()
    is_node[:, 0] = False                                     # the root is nobody's child
    run_end = _accepted_only_child_runs(tree, target_probs, uniforms, is_node)  # [B, N]

    while bool(active.any()):
        jumped = torch.where(active, run_end.gather(1, current.unsqueeze(1)).squeeze(1), current)
        p = torch.where((jumped != current).unsqueeze(1), target_probs[rows, jumped], p)
        current = jumped
        child_mask = (tree.parents == current.unsqueeze(1)) & is_node & active.unsqueeze(1)  # [B, N]
        rank = child_mask.long().cumsum(dim=1) - 1
        num_children = child_mask.sum(dim=1)
        moved = torch.zeros(batch, dtype=torch.bool)
        removed = torch.zeros(batch, p.shape[-1], dtype=torch.bool)  # earlier siblings' tokens
        removed_group = torch.full((batch, p.shape[-1]), -2, dtype=torch.long)

        for k in range(int(num_children.max()) if batch else 0):
            has_kth = (num_children > k) & ~moved
            if not bool(has_kth.any()):
                break
            node = ((rank == k) & child_mask).long().argmax(dim=1)           # [B]
            token = tree.tokens[rows, node]
            group = tree.proposal_index[rows, node]
            q = _dense_proposal(tree, node)
            wr = tree.without_replacement[rows, node]
            same_group = removed & (removed_group == group.unsqueeze(1))
            q = torch.where(wr.unsqueeze(1), effective_proposal(q, same_group & wr.unsqueeze(1)), q)

            accept_prob = acceptance_probability(p, q, token)
            accept = has_kth & (uniforms[rows, node] < accept_prob)
            reject = has_kth & ~accept

            # accepted: descend
            current = torch.where(accept, node, current)
            p = torch.where(accept.unsqueeze(1), target_probs[rows, node], p)
            moved |= accept
            # rejected: the target becomes the residual, the token leaves its group's q
            p = torch.where(reject.unsqueeze(1), residual(p, q), p)
            removed[rows[reject], token[reject]] = True
            removed_group[rows[reject], token[reject]] = group[reject]

        stopping = active & ~moved
        rejected |= stopping & (num_children > 0)
        active = active & moved
        if not bool(stopping.any()):
            continue
        final = sample_with_uniform(p, uniforms[:, 0])
        next_token = torch.where(stopping, final, next_token)
        stop_node = torch.where(stopping, current, stop_node)

    num_accepted = tree.depth().gather(1, stop_node.unsqueeze(1)).squeeze(1)
    return VerifyResult(_path_to(tree, stop_node, num_accepted), num_accepted, next_token, stop_node, rejected)


def _verify_walk(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """``_verify_recursive`` one row at a time: the same tests on the same uniforms, so the same
    outcome, with the tensor work only where a residual is needed.

    An only child is tested against P at its parent with its own q, so all of those tests are
    decided up front in one batched comparison (as ``_accepted_only_child_runs`` does); a walk
    down SJD's spine or a chain inside any tree is then Python list lookups. Sibling groups
    run the batched verifier's math on one [1, V] row. Cheaper than the batched walk at small
    batch sizes, where the per-level masks over [B, N] and [B, V] are mostly dispatch cost.
    """
    batch, width = tree.tokens.shape
    parent = tree.parents.clamp(min=0)
    is_node = tree.valid.clone()
    is_node[:, 0] = False
    single = (uniforms[:, :width] < _single_draft_acceptance(tree, target_probs, parent)[:, : uniforms.shape[1]]).tolist()
    tokens, parents, nodes = tree.tokens.tolist(), tree.parents.tolist(), is_node.tolist()
    groups, replace = tree.proposal_index.tolist(), tree.without_replacement.tolist()
    stop_nodes, finals = [], []
    rejected = torch.zeros(batch, dtype=torch.bool)
    path = torch.full((batch, width), -1, dtype=torch.long)
    for r in range(batch):
        children: list[list[int]] = [[] for _ in range(width)]
        for n in range(1, width):
            if nodes[r][n]:
                children[parents[r][n]].append(n)
        node, p = 0, None  # p: [1, V] residual at ``node`` once a sibling there was rejected
        walked = [0]
        while True:
            kids = children[node]
            if len(kids) == 1 and single[r][kids[0]]:
                node = kids[0]
                walked.append(node)
                continue
            if not kids:  # a leaf: the bonus token from P there
                break
            p = target_probs[r, node].unsqueeze(0)
            removed: dict[int, int] = {}  # token -> group of the rejected sibling that drew it
            for child in kids:
                token, group = tokens[r][child], groups[r][child]
                q = tree.proposal_of(r, child).to(p.dtype).unsqueeze(0)  # one-hot if deterministic
                if replace[r][child]:
                    mask = torch.zeros_like(q, dtype=torch.bool)
                    for t, owner in removed.items():
                        mask[0, t] = owner == group
                    q = effective_proposal(q, mask)
                if bool(uniforms[r, child] < acceptance_probability(p, q, torch.tensor([token]))):
                    node, p = child, None
                    walked.append(node)
                    break
                p = residual(p, q)
                removed[token] = group
            else:
                rejected[r] = True
                break
        stop_nodes.append(node)
        path[r, : len(walked)] = torch.tensor(walked)
        finals.append(p if p is not None else target_probs[r, node].unsqueeze(0))
    stop_node = torch.tensor(stop_nodes, dtype=torch.long)
    next_token = sample_with_uniform(torch.cat(finals), uniforms[:, 0])
    num_accepted = (path >= 0).sum(dim=1) - 1
    return VerifyResult(path, num_accepted, next_token, stop_node, rejected)


def _accepted_only_child_runs(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor, is_node: torch.Tensor) -> torch.Tensor:
    """[B, N] long: from each node, the deepest node reached by accepting only children in a row
    (the node itself when its child is not an only child, is rejected, or does not exist)."""
    batch, width = tree.tokens.shape
    parent = tree.parents.clamp(min=0)
    children = torch.zeros(batch, width, dtype=torch.long).scatter_add_(1, parent, is_node.long())  # [B, N]
    only_child = is_node & (children.gather(1, parent) == 1)
    accept_prob = _single_draft_acceptance(tree, target_probs, parent)  # q undisturbed: no earlier sibling
    if uniforms.shape[1] < width:  # columns past every row's last node: nothing to test there
        uniforms = torch.cat([uniforms, uniforms.new_ones(batch, width - uniforms.shape[1])], dim=1)
    accepted = only_child & (uniforms < accept_prob)
    # step[n]: n's accepted only child (at most one), else n; pointer doubling reaches every run's end
    nodes = torch.arange(width).expand(batch, width)
    child = torch.full((batch, width + 1), -1, dtype=torch.long)  # last column: a sink for the rest
    child.scatter_(1, torch.where(accepted, parent, width), torch.where(accepted, nodes, -1))
    step = torch.where(child[:, :width] >= 0, child[:, :width], nodes)
    hops = 1
    while hops < width:
        step = step.gather(1, step)
        hops *= 2
    return step


def _single_draft_acceptance(tree: DraftTree, target_probs: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """[B, N] min(1, P[parent](x) / q(x)) of every node's token x under its own q (no sibling
    removed), the test of a node with no earlier sibling. parent: [B, N] node ids (>= 0)."""
    rows = torch.arange(tree.batch_size).unsqueeze(1)
    p_x = target_probs[rows, parent, tree.tokens]
    if tree.proposal_probs.shape[1] > 0:
        q_x = tree.proposal_probs[rows, tree.proposal_index.clamp(min=0), tree.tokens]
        q_x = torch.where(tree.proposal_index == DETERMINISTIC, torch.ones_like(q_x), q_x)
    else:
        q_x = torch.ones_like(p_x)
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(_RESIDUAL_EPS)).clamp(max=1.0), (p_x > 0).to(p_x.dtype))


def _path_to(tree: DraftTree, stop_node: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """[B, N] the root-to-stop-node path (node ids by depth), padded with -1."""
    batch, width = tree.tokens.shape
    path_nodes = tree.ancestor_mask()[torch.arange(batch), stop_node]  # the stop node and its ancestors
    order = torch.where(path_nodes, tree.depth(), torch.full_like(tree.depth(), width))
    path = torch.sort(order, dim=1, stable=True).indices
    return torch.where(torch.arange(width).unsqueeze(0) <= num_accepted.unsqueeze(1), path, torch.full_like(path, -1))


def _all_one_hot(tree: DraftTree, target_probs: torch.Tensor) -> bool:
    """Deterministic drafts and one-hot targets (temperature 0): acceptance is 0 or 1."""
    if tree.proposal_probs.shape[1] > 0 and bool((tree.proposal_index[tree.valid] != DETERMINISTIC).any()):
        return False
    return bool((target_probs.amax(dim=-1) == 1.0).all())


def _verify_greedy(tree: DraftTree, target_probs: torch.Tensor) -> VerifyResult:
    """``verify_tree`` when every acceptance probability is 0 or 1, in one pass.

    A child is accepted iff its token is the argmax of P at its parent and no earlier sibling
    was (the first accepted sibling wins); the path ends at the deepest node whose every
    ancestor was accepted, and the final token is P's argmax there (a residual of a one-hot P
    after rejecting other tokens is the same one-hot P).
    """
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    argmax = target_probs.argmax(dim=-1)  # [B, N]
    parent = tree.parents.clamp(min=0)
    is_child = tree.valid & (tree.parents >= 0)
    matches = is_child & (tree.tokens == argmax.gather(1, parent))
    earlier = torch.arange(width).unsqueeze(1) > torch.arange(width).unsqueeze(0)  # [i, j]: j before i
    sibling = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & earlier  # [B, N, N]
    accepted = matches & ~(sibling & matches.unsqueeze(1)).any(dim=2)
    accepted[:, 0] = True
    ancestors = tree.ancestor_mask()
    on_path = ~(ancestors & ~accepted.unsqueeze(1)).any(dim=2) & tree.valid  # all of i's ancestors accepted
    depth = torch.where(on_path, tree.depth(), torch.full_like(argmax, -1))
    stop_node = depth.argmax(dim=1)  # one accepted node per depth
    num_accepted = depth.gather(1, stop_node.unsqueeze(1)).squeeze(1)
    path_nodes = ancestors[rows, stop_node]  # [B, N] the stop node and its ancestors
    order = torch.where(path_nodes, depth, torch.full_like(depth, width))
    path = torch.sort(order, dim=1, stable=True).indices
    path = torch.where(torch.arange(width).unsqueeze(0) <= num_accepted.unsqueeze(1), path, torch.full_like(path, -1))
    has_children = (is_child & (tree.parents == stop_node.unsqueeze(1))).any(dim=1)
    next_token = argmax[rows, stop_node]
    return VerifyResult(path, num_accepted, next_token, stop_node, has_children)


def _one_hot_drafts(tree: DraftTree) -> bool:
    """Every draft is deterministic and drawn with replacement (EAGLE-style draft trees)."""
    if tree.proposal_probs.shape[1] == 0 and not bool(tree.without_replacement.any()):
        return True  # no dense proposals and no node flagged (the flag on a root or padding means nothing)
    drafts = tree.valid & (tree.parents >= 0)
    if bool((tree.without_replacement & drafts).any()):
        return False
    return tree.proposal_probs.shape[1] == 0 or not bool(((tree.proposal_index != DETERMINISTIC) & drafts).any())


def _verify_one_hot_drafts(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """``verify_tree`` when every draft is one-hot (``_one_hot_drafts``) and P is not.

    With q = one-hot(x) the recursion needs only p(x) at each tested child: rejecting x zeroes
    it and renormalises, so the k-th sibling is accepted with p(x_k) / (total - removed mass),
    removed mass = p of the earlier siblings' distinct tokens. The walk runs on Python floats
    (a few values per node); only the final residual touches a [V] row.
    """
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    parent = tree.parents.clamp(min=0)
    p_x = target_probs[rows.unsqueeze(1), parent, tree.tokens].tolist()  # [B][N] P at the parent, at x
    totals = target_probs.sum(dim=-1).tolist()  # [B][N]
    tokens, parents, valid, u = tree.tokens.tolist(), tree.parents.tolist(), tree.valid.tolist(), uniforms.tolist()
    paths, stop_nodes, depths, removed, rejected = [], [], [], [], []
    for r in range(batch):
        children: list[list[int]] = [[] for _ in range(width)]
        for n in range(1, width):
            if valid[r][n] and parents[r][n] >= 0:
                children[parents[r][n]].append(n)
        node, path = 0, [0]
        while True:
            gone: set[int] = set()  # tokens rejected at this node
            mass = totals[r][node]  # P's mass left after those rejections
            for child in children[node]:
                x = tokens[r][child]
                p_child = 0.0 if x in gone else p_x[r][child]
                if mass > _RESIDUAL_EPS and u[r][child] < min(1.0, p_child / mass):
                    node = child
                    path.append(child)
                    break
                gone.add(x)
                mass -= p_child
            else:
                break
        paths.append(path + [-1] * (width - len(path)))
        stop_nodes.append(node)
        depths.append(len(path) - 1)
        removed.extend((r, x) for x in gone)
        rejected.append(bool(children[node]))
    stop_node = torch.tensor(stop_nodes, dtype=torch.long)
    p = target_probs[rows, stop_node]  # [B, V]
    if removed:  # the residual at the stop node: rejected tokens zeroed (normalised by sampling)
        p = p.clone()
        where = torch.tensor(removed, dtype=torch.long)
        p[where[:, 0], where[:, 1]] = 0.0
        p = torch.where(p.sum(dim=-1, keepdim=True) > _RESIDUAL_EPS, p, target_probs[rows, stop_node])
    next_token = sample_with_uniform(p, uniforms[:, 0])
    return VerifyResult(torch.tensor(paths), torch.tensor(depths, dtype=torch.long), next_token, stop_node, torch.tensor(rejected))


def is_chain(tree: DraftTree) -> bool:
    """Every valid node i >= 1 hangs under node i - 1."""
    return tree.is_chain()


def _verify_chain(tree: DraftTree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """The chain case of ``verify_tree`` in one pass (same uniforms, same outcome).

    Node i is tested against P[i - 1] (a chain has no siblings, so no residual carries over);
    the first rejection stops the chain and the final token comes from its residual.
    """
    batch, width = tree.tokens.shape
    rows = torch.arange(batch)
    previous = (torch.arange(width) - 1).clamp(min=0).expand(batch, width)  # node i hangs under i - 1
    accept_prob = _single_draft_acceptance(tree, target_probs, previous)[:, 1:]  # [B, N-1]
    accept = (uniforms[:, 1:] < accept_prob) & tree.valid[:, 1:]
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)               # [B]
    num_drafts = tree.valid[:, 1:].sum(dim=1)
    rejected = num_accepted < num_drafts
    p = target_probs[rows, num_accepted]                                 # P at the stop node
    if bool(rejected.any()):
        failed = (num_accepted + 1).clamp(max=width - 1)
        q = _dense_proposal(tree, failed).to(p.dtype)
        p = torch.where(rejected.unsqueeze(1), residual(p, q), p)
    next_token = sample_with_uniform(p, uniforms[:, 0])
    steps = torch.arange(width).expand(batch, width)
    path = torch.where(steps <= num_accepted.unsqueeze(1), steps, torch.full_like(steps, -1))
    return VerifyResult(path, num_accepted, next_token, num_accepted.clone(), rejected)


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
        test_siblings(children[node], 0, target(prefix).unsqueeze(0), prefix, weight, {})

    def test_siblings(siblings: list[int], k: int, p: torch.Tensor, prefix: tuple[int, ...], weight: float, removed: dict[int, int]) -> None:
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
        if bool(tree.without_replacement[row, child]):
            mask = torch.zeros_like(q, dtype=torch.bool)
            for token, owner in removed.items():
                mask[0, token] = owner == group
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
                test_siblings(siblings, k + 1, residual(p, q), prefix, weight * draw_prob * (1 - accept), {**removed, token: group})

    descend(0, (), 1.0)
    return law
