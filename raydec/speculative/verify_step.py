"""A step's verification as one pure tensor function (the unit the engine captures).

    verify_step(tree tensors, P, seeds, steps, positions, coupled)
        -> the verifier's result, the cache slots to keep, and the step's one read-back, packed

Inputs and outputs are tensors whose first dimension is the batch, so ``StepGraph`` can pad a
batch to its bucket and capture the whole function as one graph: the uniforms (counter-based,
from each row's seed and step) or the Gumbel noise (from its seed and each node's generated
position), the verifier, the keep mask and the packed outcome.
"""

from __future__ import annotations

from typing import Callable

import torch

from raydec.speculative import random as streams
from raydec.speculative.random import counter_uniforms, position_exponentials
from raydec.speculative.tree import DraftTree
from raydec.speculative.verify import VerifyResult, verify_coupled

# (tree, P [B, N, V], uniforms [B, N] float64) -> the verification, on P's device
Verifier = Callable[[DraftTree, torch.Tensor, torch.Tensor], VerifyResult]


def tree_tensors(tree: DraftTree) -> tuple[torch.Tensor, ...]:
    """The tree's batch tensors in ``verify_step``'s order (its structure included)."""
    return (tree.tokens, tree.parents, tree.valid, tree.proposal_index, tree.without_replacement, tree.proposal_probs,
            tree.depth(), tree.ancestor_mask())


def tree_facts(tree: DraftTree) -> dict:
    """The host facts a captured verification takes as constants."""
    return {"max_children": tree.children_bound(), "any_without_replacement": tree.without_replacement_anywhere(),
            "branch_nodes": tree.branch_node_bound(), "levels": tree.level_bound()}


def verify_step(
    tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, proposal_index: torch.Tensor,
    without_replacement: torch.Tensor, proposal_probs: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
    target_probs: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, positions: torch.Tensor, coupled: torch.Tensor,
    *, verifier: Verifier, max_children: int, any_without_replacement: bool, branch_nodes: int, levels: int,
    coupling: str = "rejection",
) -> tuple[torch.Tensor, ...]:
    """Verify every row's tree against P with its own randomness.

    tree tensors: as ``DraftTree`` ([B, N], proposal_probs [B, Q, V], depth [B, N], ancestors
    [B, N, N]); target_probs: [B, N, V]; seeds, steps, positions, coupled: [B] (the rows'
    ``RowRandom``); coupling: "rejection" (``verifier`` with uniforms of the step), "gumbel"
    (``verify_coupled`` with the noise of each node's position) or "mixed" (both, each row
    taking its own by ``coupled``)
    -> path [B, N], num_accepted [B], next_token [B], stop_node [B], rejected [B] (the
       ``VerifyResult``), keep [B, N] bool (root and accepted nodes: the slots the cache
       keeps), packed [B, N + 2] long (accepted count, stop node, committed tokens: -1 after)
    """
    tree = DraftTree(tokens, parents, valid, proposal_index, without_replacement, proposal_probs,
                     max_children, any_without_replacement, branch_nodes, levels).with_structure(depth, ancestors)
    if coupling != "rejection":  # the noise of each level's position, levels + 1 of them
        levels_at = positions.unsqueeze(1) + torch.arange(levels + 1, device=positions.device)
        result = verify_coupled(tree, target_probs, position_exponentials(seeds, levels_at, target_probs.shape[-1]))
    if coupling != "gumbel":
        uniforms = counter_uniforms(seeds, steps, streams.VERIFY, tokens.shape[1])
        plain = verifier(tree, target_probs, uniforms)
        result = plain if coupling == "rejection" else _per_row(coupled, result, plain)
    path = result.path.clamp(min=0)  # padding -> the root, which every path holds
    keep = torch.zeros(tokens.shape, dtype=torch.bool, device=path.device).scatter_(1, path, True)
    packed = torch.cat([result.num_accepted.unsqueeze(1), result.stop_node.unsqueeze(1), result.committed(tree)], dim=1)
    return result.path, result.num_accepted, result.next_token, result.stop_node, result.rejected, keep, packed


def _per_row(coupled: torch.Tensor, gumbel: VerifyResult, rejection: VerifyResult) -> VerifyResult:
    """Each row's own verification: ``gumbel``'s where coupled [B], ``rejection``'s elsewhere."""
    pick = lambda a, b: torch.where(coupled.view(-1, *([1] * (a.dim() - 1))), a, b)  # noqa: E731
    return VerifyResult(*(pick(a, b) for a, b in zip(
        (gumbel.path, gumbel.num_accepted, gumbel.next_token, gumbel.stop_node, gumbel.rejected),
        (rejection.path, rejection.num_accepted, rejection.next_token, rejection.stop_node, rejection.rejected))))
