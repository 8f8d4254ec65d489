"""The EAGLE-2 tree search of ``DraftTreeProposer``, on tensors alone.

From the draft hidden at each row's root, each level expands its K best candidates (by cumulative
draft log-probability) with one draft forward, and the ``total_tokens - 1`` best candidates become
the tree, in topological order; before the search, the draft catches up on the pairs the target
accepted last step. The draft's forwards are passed in, so the eager step and the captured one
(``DraftTreeProposer._step_on_tensors``) share these functions: they hold no state and read
nothing back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, N, S] bool -> [B, 1, N, S] additive mask (on ``allowed``'s device)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def top_tokens(logp: torch.Tensor, k: int, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The K candidates of each distribution and their log-probabilities: the K most likely, or
    with ``noise`` (the level's Gumbel noise, zero for rows that are not coupled) q's Gumbel-max
    sample under the noise the target samples with (``argmax log q + G``: the single token most
    likely to be the target's own sample when q is close to P), then the K - 1 most likely others.
    logp: [B, ..., V]; noise: [B, V]  -> log q, tokens [B, ..., K]"""
    if noise is None:
        return logp.topk(k, dim=-1)
    noise = noise[:, : logp.shape[-1]].to(logp.dtype).view(logp.shape[0], *([1] * (logp.dim() - 2)), logp.shape[-1])
    first = (logp + noise).argmax(dim=-1, keepdim=True)
    others = logp.scatter(-1, first, float("-inf")).topk(k - 1, dim=-1).indices
    token = torch.cat([first, others], dim=-1)
    return logp.gather(-1, token), token


def top_children(logp: torch.Tensor, frontier_score: torch.Tensor, k: int, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every frontier node's top-K children (``top_tokens``), scored by cumulative log-probability.
    logp [B, K, V]; frontier_score [B, K]; noise [B, V] or None -> child scores, tokens [B, K*K]
    (child c of node i at i*K + c)"""
    batch = logp.shape[0]
    child_score, child_token = top_tokens(logp, k, noise)  # [B, K, K]
    return (child_score + frontier_score.unsqueeze(-1)).view(batch, k * k), child_token.view(batch, k * k)


def select_tree_nodes(scores: torch.Tensor, depths: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` best candidates per row: score descending, then depth ascending,
    then index. scores, depths: [B, C] -> [B, count]."""
    order = torch.arange(scores.shape[1], device=scores.device).expand_as(scores)
    order = order.gather(1, torch.sort(depths.gather(1, order), dim=1, stable=True).indices)
    order = order.gather(1, torch.sort(-scores.gather(1, order), dim=1, stable=True).indices)
    return order[:, :count]


def candidate_depths(k: int, depth: int, device: torch.device) -> torch.Tensor:
    """[C] the depth of every candidate of ``search_tree``: K at depth 1, then K^2 per level."""
    return torch.cat([torch.full((k if level == 1 else k * k,), level, dtype=torch.long, device=device) for level in range(1, depth + 1)])


def select_nodes(
    roots: torch.Tensor, depths: torch.Tensor, root_parent: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor,
    parents: torch.Tensor, count: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """The ``count`` best candidates of every row as a tree: tokens, parents, depth [B, count + 1]
    (node 0 is the root, then by depth, then rank) and None (the tree derives its ancestor mask).
    roots [B]; depths [B, C]: the candidates' depths; root_parent [B, 1]: the root's parent (-1);
    scores, tokens, parents [B, C] (``search_tree``'s). A parent outranks its children (its score
    is higher, or equal and shallower), so every chosen node's parent is chosen."""
    batch, candidates = scores.shape
    device = scores.device
    chosen = select_tree_nodes(scores, depths, count)  # [B, count]
    node_depth = depths.gather(1, chosen)
    order = torch.sort(node_depth, dim=1, stable=True).indices  # topological: by depth, then rank
    chosen, node_depth = chosen.gather(1, order), node_depth.gather(1, order)
    node_of = torch.full((batch, candidates), -1, dtype=torch.long, device=device)
    node_of.scatter_(1, chosen, torch.arange(1, count + 1, device=device).expand(batch, count))
    parent_cand = parents.gather(1, chosen)
    parent_nodes = torch.where(parent_cand >= 0, node_of.gather(1, parent_cand.clamp(min=0)), 0)
    node_tokens = torch.cat([roots.unsqueeze(1), tokens.gather(1, chosen)], dim=1)
    node_parents = torch.cat([root_parent, parent_nodes], dim=1)
    depth = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), node_depth], dim=1)
    return node_tokens, node_parents, depth, None


# (token ids [B, N], features [B, N, H], positions [B, N], mask [B, 1, N, P + N], past keys,
# values [B, kv, P, d]) -> draft hidden [B, N, H], the window's keys and values [B, kv, N, d]
WindowForward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def catch_up_on_tensors(
    forward: WindowForward, feats: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, root_hidden: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, next_position: torch.Tensor, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``DraftTreeProposer._catch_up`` on tensors: each row's W pending pairs, the first counts[b]
    real, after the cache's slots. feats [B, W, H]; ids [B, W]; counts [B]; root_hidden [B, H];
    keys, values [B, kv, P, d] and visible [B, P] the cache's slots; next_position [B]
    -> root hidden [B, H] (the last real pair's; unchanged without one), the pairs' keys and
       values [B, kv, W, d], real pairs [B, W] bool"""
    batch, width = ids.shape
    steps = torch.arange(width, device=ids.device)
    fed = steps.unsqueeze(0) < counts.unsqueeze(1)  # [B, W]
    causal = steps.unsqueeze(0) <= steps.unsqueeze(1)  # [W, W]: pair i sees pairs j <= i
    window = (causal.unsqueeze(0) & fed.unsqueeze(1)) | (steps.unsqueeze(0) == steps.unsqueeze(1))  # a padding pair sees itself
    mask = additive_mask(torch.cat([visible.unsqueeze(1).expand(batch, width, visible.shape[1]), window], dim=2), dtype)
    h, new_keys, new_values = forward(ids.clamp(min=0), feats, next_position.unsqueeze(1) + steps, mask, keys, values)
    last = h[torch.arange(batch, device=ids.device), (counts - 1).clamp(min=0)]
    return torch.where((counts > 0).unsqueeze(1), last, root_hidden), new_keys, new_values, fed


# (frontier tokens [B, K], their parents' hidden [B, K, H], the expansion step (0 for level 2),
# mask [B, 1, K, P + tree slots so far + K] additive) -> hidden [B, K, H]; the forward keeps the
# frontier's keys and values where the next step's forward finds them
LevelForward = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SearchConstants:
    """What ``search_tree`` indexes with, for B rows and top-K (kept across steps by the eager path)."""

    index: torch.Tensor  # [K] 0..K-1: the level-1 candidates' ids
    eye: torch.Tensor  # [K, K] additive identity (0 on the diagonal, dtype-min elsewhere)
    rows: torch.Tensor  # [B, 1] row index
    child_parent: torch.Tensor  # [B, K*K] frontier slot of each child candidate of a level
    root_children: torch.Tensor  # [B, K] -1: level-1 candidates hang under the root

    @staticmethod
    def make(batch: int, k: int, device: torch.device, dtype: torch.dtype) -> "SearchConstants":
        index = torch.arange(k, device=device)
        return SearchConstants(
            index=index, eye=additive_mask((index.unsqueeze(0) == index.unsqueeze(1)).unsqueeze(0), dtype)[0, 0],
            rows=torch.arange(batch, device=device).unsqueeze(1), child_parent=index.repeat_interleave(k).expand(batch, k * k),
            root_children=torch.full((batch, k), -1, dtype=torch.long, device=device))


def search_tree(
    forward: LevelForward, log_probs: Callable[[torch.Tensor], torch.Tensor], root_hidden: torch.Tensor, seen: torch.Tensor,
    k: int, depth: int, dtype: torch.dtype, constants: SearchConstants | None = None, trace: list | None = None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree search of ``DraftTreeProposer.propose``: from the root, expand each level's K best
    candidates (by cumulative log-probability) with one draft forward, every child of each a
    candidate. root_hidden [B, H]; seen [B, P] bool: the cache slots every node sees
    -> candidate scores, tokens, parents (candidate ids, -1 = root) [B, C], C = K + (depth - 1) K^2.
    The frontier at level l attends the P slots and, among the tree slots (K per expanded level),
    what its parent attended and itself. constants: ``SearchConstants`` for these B and K (made
    here when None). trace: gets (frontier ids, hidden, tokens, parents so far) per expansion.
    noise: [B, depth, V] the Gumbel noise of each level's position (zero where a row is not
    coupled; None: no row is): a level's candidates are then its Gumbel top-K (``top_tokens``)."""
    batch, size = root_hidden.shape
    device, past = root_hidden.device, seen.shape[1]
    c = constants or SearchConstants.make(batch, k, device, dtype)
    mask = torch.full((batch, 1, k, past + k * (depth - 1)), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, 0, :, :past].masked_fill_(seen.unsqueeze(1), 0.0)
    tree_mask = mask[:, 0, :, past:]  # [B, K, tree slots], a view
    level_noise = (lambda level: None) if noise is None else (lambda level: noise[:, level - 1])  # noqa: E731
    score, token = top_tokens(log_probs(root_hidden), k, level_noise(1))  # [B, K]: level 1, the root's children
    cand_score, cand_token, cand_parent = [score], [token], [c.root_children]
    frontier, frontier_score, frontier_token = c.index.expand(batch, k), score, token
    frontier_feat = root_hidden.unsqueeze(1).expand(batch, k, size)  # parent hidden of each
    offset = k
    for level in range(2, depth + 1):
        slots = k * (level - 1)
        tree_mask[:, :, slots - k : slots] = c.eye
        h = forward(frontier_token, frontier_feat, level - 2, mask[..., : past + slots])
        if trace is not None:
            trace.append((frontier.clone(), h.detach().clone(), torch.cat(cand_token, 1), torch.cat(cand_parent, 1)))
        child_score, child_token = top_children(log_probs(h), frontier_score, k, level_noise(level))
        cand_score.append(child_score)
        cand_token.append(child_token)
        cand_parent.append(frontier.gather(1, c.child_parent))
        best = child_score.topk(k, dim=-1).indices  # [B, K] within this level
        parent = best // k  # frontier index of each best child's parent
        frontier_feat = h[c.rows, parent]
        frontier, frontier_score, frontier_token = best + offset, child_score.gather(1, best), child_token.gather(1, best)
        offset += k * k
        if level < depth:  # the next frontier sees its parent's tree slots
            tree_mask[:, :, :slots] = tree_mask[c.rows, parent, :slots]
    return torch.cat(cand_score, 1), torch.cat(cand_token, 1), torch.cat(cand_parent, 1)
