"""Read the draft dataset (``datagen`` shards) into memory and order it deterministically."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raydec.train.datagen import read_manifest


@dataclass
class DraftSample:
    """One stored sample (see ``datagen``).

    input_ids [T] long; image_index [T] long (-1 = text); loss_mask [T] bool (generated);
    embeds, hidden [T, H] in the storage dtype; prompt_len L; seed.
    """

    seed: int
    prompt_len: int
    input_ids: torch.Tensor
    image_index: torch.Tensor
    loss_mask: torch.Tensor
    embeds: torch.Tensor
    hidden: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


def load_samples(data_dir: str | Path) -> list[DraftSample]:
    """All samples of a dataset folder, sorted by seed (independent of shard layout)."""
    import pyarrow.parquet as pq

    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    hidden_size = int(manifest["hidden_size"])
    store = np.float16 if manifest["storage_dtype"] == "float16" else np.float32
    samples = []
    for shard in manifest["shards"]:
        for row in pq.read_table(data_dir / shard).to_pylist():
            length = int(row["length"])
            samples.append(DraftSample(
                seed=int(row["seed"]),
                prompt_len=int(row["prompt_len"]),
                input_ids=torch.tensor(row["input_ids"], dtype=torch.long),
                image_index=torch.tensor(row["image_index"], dtype=torch.long),
                loss_mask=torch.tensor(row["loss_mask"], dtype=torch.bool),
                embeds=torch.from_numpy(np.frombuffer(row["embeds"], dtype=store).reshape(length, hidden_size).copy()),
                hidden=torch.from_numpy(np.frombuffer(row["hidden"], dtype=store).reshape(length, hidden_size).copy()),
            ))
    samples.sort(key=lambda s: s.seed)
    return samples


def batch_indices(num_samples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Sample indices of global step ``step``: epoch-wise permutations seeded by (seed, epoch)."""
    per_epoch = max(1, num_samples // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    if num_samples < batch_size:  # tiny datasets: the same permutation, repeated
        order = order.repeat(-(-batch_size // num_samples))
    return order[offset * batch_size : (offset + 1) * batch_size].tolist()
