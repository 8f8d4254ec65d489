"""ViSpec / EAGLE draft model training, submitted as a Ray job: `ray job submit --working-dir . -- python jobs/train_vispec.py --config CONFIG`.

The same as `raydec train --config CONFIG` (raydec/commands/train.py): generates the training
data with the target as a Ray Data job, trains each draft model with Ray Train and saves it.
"""

from __future__ import annotations

import sys

from raydec.commands.train import main as _main


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog="python jobs/train_vispec.py")


if __name__ == "__main__":
    sys.exit(main())
