"""Replay the phases recorded in a reference VLM's ``train_log.json``: ``python -m raydec.reference.train vlm --vlm-recipe``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from raydec.reference.llava.model import VLMSizes
from raydec.reference.llava.settings import TrainSettings
from raydec.reference.llava.train import run_training

logger = logging.getLogger(__name__)


def _parse_recorded(value: str, default: bool | int | float) -> bool | int | float:
    """A setting as ``train_log.json`` records it (``str(value)``) back in the type of its default."""
    return value == "True" if isinstance(default, bool) else type(default)(value)


def recipe_phases(log: dict, out_dir: Path, work_dir: Path) -> list[TrainSettings]:
    """The phases recorded in a ``train_log.json``, chained to replay from scratch.

    Phase i continues from phase i-1's folder (``work_dir/phase-<i-1>``) and the last one writes
    ``out_dir``. Each phase stops after the steps it recorded (the next phase's ``first_step``
    minus its own), with no wall-time cap, so a phase that was cut short replays to the same
    step. Settings a phase does not record (an older run) keep their defaults, which are "off".
    """
    phases = log.get("phases") or [log["settings"]]
    starts = [int(p.get("first_step", 0)) for p in phases] + [int(log["steps_done"])]
    defaults = TrainSettings()
    chained = []
    for i, phase in enumerate(phases):
        values = {
            name: _parse_recorded(phase[name], getattr(defaults, name)) if name in phase else getattr(defaults, name)
            for name in TrainSettings.__dataclass_fields__
            if name not in ("out_dir", "init_from", "first_step")
        }
        values.update(
            max_minutes=0.0,
            stop_after=starts[i + 1] - starts[i],
            first_step=starts[i],
            init_from=work_dir / f"phase-{i - 1}" if i else None,
            out_dir=out_dir if i == len(phases) - 1 else work_dir / f"phase-{i}",
        )
        chained.append(TrainSettings(**values))
    return chained


def replay_recipe(log_path: Path, out_dir: Path, work_dir: Path | None = None) -> Path:
    """Retrain from scratch by replaying every phase recorded in ``log_path``; returns ``out_dir``.

    With the same torch build and thread counts the result equals the recorded run's weights.
    """
    log = json.loads(Path(log_path).read_text())
    work_dir = work_dir or Path("out/vlm-recipe-phases")  # the intermediate phases' folders (not shipped)
    phases = recipe_phases(log, out_dir, work_dir)
    sizes = VLMSizes(**log["sizes"])
    for i, settings in enumerate(phases):
        logger.info("recipe phase %d / %d: %d steps from global step %d", i + 1, len(phases), settings.stop_after,
                    settings.first_step)
        run_training(settings, sizes)
    return out_dir
