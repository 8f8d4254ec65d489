"""Deliberately broken verifiers. The exactness harness must reject each of them.

1. ``longest_path_verifier``: tests every node against its parent's P independently and keeps
   the longest accepted path (spec pitfall 1).
2. ``stale_proposal_verifier``: tests a sibling drawn without replacement against the outdated
   proposal (its group's q before the earlier siblings were removed).
3. ``batch_minimum_verifier``: every row commits the batch-minimum number of drafts and then a
   residual token, even rows that accepted the next draft (spec pitfall 5).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from raydec.spec.sampling import draw_uniforms, sample_with_uniform
from raydec.spec.tree import DraftTree
from raydec.spec.verify import VerifyResult, acceptance_probability, residual, verify_tree


def longest_path_verifier(tree: DraftTree, target_probs: torch.Tensor, generators: Sequence[torch.Generator]) -> VerifyResult:
    batch, width = tree.tokens.shape
    uniforms = draw_uniforms(generators, tree.node_counts())
    path = torch.full((batch, width), -1, dtype=torch.long)
    num_accepted = torch.zeros(batch, dtype=torch.long)
    next_token = torch.zeros(batch, dtype=torch.long)
    stop_node = torch.zeros(batch, dtype=torch.long)
    rejected = torch.zeros(batch, dtype=torch.bool)
    for row in range(batch):
        children = tree.children_lists(row)
        accepted = {0: True}
        for node in range(1, len(children)):
            parent = int(tree.parents[row, node])
            p = target_probs[row, parent].unsqueeze(0)
            q = tree.proposal_of(row, node).to(p.dtype).unsqueeze(0)
            prob = float(acceptance_probability(p, q, tree.tokens[row, node].view(1)))
            accepted[node] = accepted[parent] and float(uniforms[row, node]) < prob
        best = [0]

        def walk(node: int, trail: list[int]) -> None:
            nonlocal best
            if len(trail) > len(best):
                best = trail
            for child in children[node]:
                if accepted[child]:
                    walk(child, trail + [child])

        walk(0, [0])
        end = best[-1]
        p = target_probs[row, end]
        if children[end]:
            p = residual(p.unsqueeze(0), tree.proposal_of(row, children[end][0]).to(p.dtype).unsqueeze(0))[0]
            rejected[row] = True
        path[row, : len(best)] = torch.tensor(best)
        num_accepted[row] = len(best) - 1
        next_token[row] = sample_with_uniform(p, uniforms[row, 0])
        stop_node[row] = end
    return VerifyResult(path, num_accepted, next_token, stop_node, rejected)


def stale_proposal_verifier(tree: DraftTree, target_probs: torch.Tensor, generators: Sequence[torch.Generator]) -> VerifyResult:
    stale = dataclasses.replace(tree, without_replacement=torch.zeros_like(tree.without_replacement))
    return verify_tree(stale, target_probs, generators)


def batch_minimum_verifier(tree: DraftTree, target_probs: torch.Tensor, generators: Sequence[torch.Generator]) -> VerifyResult:
    result = verify_tree(tree, target_probs, generators)
    minimum = int(result.num_accepted.min())
    extra = draw_uniforms(generators, [1] * tree.batch_size)[:, 0]
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
