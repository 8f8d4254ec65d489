"""Resumable checkpoints of the reference text-to-image training stages.

``save_checkpoint`` writes named modules' state dicts, the step, the loss history, torch's
RNG state and extra state atomically (safe for ``torch.load(weights_only=True)``);
``load_checkpoint`` restores them, letting modules a checkpoint predates start fresh.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

logger = logging.getLogger(__name__)


def save_checkpoint(path: Path, step: int, modules: dict, losses: list, extra: dict | None = None) -> None:
    """Write state dicts + step + loss history atomically (``torch.load(weights_only=True)`` safe)."""
    state = {name: obj.state_dict() for name, obj in modules.items()}
    state.update(step=step, losses=losses, torch_rng=torch.get_rng_state(), extra=extra or {})
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, modules: dict, optional: Sequence[str] = ()) -> tuple[int, list, dict]:
    """Restore a checkpoint written by ``save_checkpoint``; returns (step, losses, extra).

    Modules named in ``optional`` keep their current state when the checkpoint lacks them
    (a run that adds a training-only part resumes from one written before it existed).
    """
    state = torch.load(path, weights_only=True)
    for name, obj in modules.items():
        if name not in state and name in optional:
            logger.info("checkpoint %s has no %r; it starts fresh", path, name)
            continue
        obj.load_state_dict(state[name])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["losses"], state["extra"]
