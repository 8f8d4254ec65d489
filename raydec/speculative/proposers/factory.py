"""The proposer for a decode config: one place that maps ``decode.method`` to a proposer, for
the public API, the benches and the tests alike."""

from __future__ import annotations

from typing import Any

from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.base import Proposer
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.jacobi import JacobiProposer


def layout_grid(target: Any) -> tuple[int, int] | None:
    """(rows, tokens per row in generation order) of the target's layout, for spatial drafts.

    Janus: the image grid; Emu3: (h, w + 1), since every row ends with an end-of-line token.
    """
    grid = getattr(target, "layout_grid", None) or getattr(target, "grid_shape", None)
    return (int(grid[0]), int(grid[1])) if grid is not None else None


def make_proposer(decode: DecodeConfig, target: Any, draft_model: Any = None) -> Proposer:
    """A fresh proposer for ``decode.method``.

    ar -> ARProposer; sjd / sjd_ac / sjd_pac -> JacobiProposer, fresh drafts from ``decode.jacobi.init``
    and the layout's row stride for the "above" prior; vispec / eagle -> DraftTreeProposer over
    ``draft_model``, a loaded draft model (``raydec.models.loading.load_draft_model``: the core loads nothing).
    """
    method = decode.method
    if decode.auto_shape:
        field = "jacobi" if method in JACOBI_METHODS else "draft_tree"
        raise ValueError(f"decode.{field}='auto': the shape is chosen for a batch size before an engine is built "
                         f"(raydec.api.plan.plan_decode; the public functions, jobs and sessions do it)")
    if method == "ar":
        return ARProposer()
    if method in JACOBI_METHODS:
        grid = layout_grid(target)
        return JacobiProposer(decode.jacobi, variant=method, init=decode.jacobi.init, grid_width=grid[1] if grid else None)
    if method in DRAFT_METHODS:
        if draft_model is None:
            raise ValueError(f"decode.method={method!r} needs its draft model (load it with raydec.models.loading.load_draft_model)")
        return DraftTreeProposer(draft_model, decode.tree)
    raise ValueError(f"decode.method={method!r} has no proposer here")
