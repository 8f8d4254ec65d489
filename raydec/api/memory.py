"""How many rows fit a worker's memory: what ``batch_size: auto`` decodes with.

    batch = largest_batch(memory_bytes, weights_bytes, kv_bytes_per_row, max_memory_fraction, best_batch)

A batch needs the weights once and, per row, the KV cache the engine reserves when it admits the
row: room for the prompt and the row's whole decode (its cap, the holes compaction leaves, a
window), the second stream of classifier-free guidance included. ``kv_bytes_per_row`` measures
it by admitting calibration rows (one prefill) and reading the cache's bytes, the figure
``raydec bench throughput`` reports as ``kv_bytes``. The memory is what the worker may use: the
device's free memory plus what this process already holds there (the loaded weights), times the
worker's share of a GPU. Activations of a forward are not counted: ``max_memory_fraction`` leaves
room for them.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from raydec.speculative.engine import DecodeSession

#: the largest batch ``auto`` chooses, whatever the memory would hold
MAX_AUTO_BATCH = 256


def largest_batch(
    memory_bytes: int, weights_bytes: int, kv_bytes_per_row: int, max_memory_fraction: float,
    best_batch: int | None = None, maximum: int = MAX_AUTO_BATCH,
) -> int:
    """The most rows whose KV cache fits ``max_memory_fraction`` of ``memory_bytes`` beside the
    weights, at most ``best_batch`` (the batch the tuner measured fastest, when it knows one) and
    ``maximum``. A ValueError naming the figures when not even one row fits."""
    if not 0.0 < max_memory_fraction <= 1.0:
        raise ValueError(f"max_memory_fraction must be in (0, 1], got {max_memory_fraction}")
    if kv_bytes_per_row <= 0:
        raise ValueError(f"kv_bytes_per_row must be > 0, got {kv_bytes_per_row}")
    budget = max_memory_fraction * memory_bytes - weights_bytes
    rows = int(budget // kv_bytes_per_row) if budget > 0 else 0
    if rows < 1:
        raise ValueError(
            f"batch_size='auto': not one row fits: max_memory_fraction={max_memory_fraction} of {memory_bytes / 2**30:.2f} GiB "
            f"is {max_memory_fraction * memory_bytes / 2**30:.2f} GiB, the weights take {weights_bytes / 2**30:.2f} GiB and a "
            f"row's KV cache {kv_bytes_per_row / 2**20:.1f} MiB (raise max_memory_fraction, or set batch_size)"
        )
    caps = [maximum] + ([best_batch] if best_batch is not None else [])
    return max(1, min(rows, *caps))


def module_bytes(*modules: Any) -> int:
    """Bytes of the parameters and buffers of ``modules`` (None entries skipped; a tensor shared
    between them counted once)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        if module is None:
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.numel() * tensor.element_size()
    return total


def available_system_bytes() -> int:
    """Memory the kernel says a new allocation may take without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def worker_memory_bytes(device: Any, weights_bytes: int, share: float = 1.0) -> int:
    """The memory a worker on ``device`` may use: a GPU's free memory plus what torch already
    holds there for this process (the weights among it), times ``share`` (a fractional
    ``gpus_per_worker``); on a CPU the system's available memory plus the weights (loaded in this
    process)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int((free + torch.cuda.memory_reserved(device)) * min(1.0, share))
    return available_system_bytes() + weights_bytes


def kv_bytes_per_row(session: DecodeSession) -> int:
    """The KV bytes per row of ``session``'s queued rows once admitted together (one step: their
    prefill, which reserves each row's whole decode). ``session``: none of its rows admitted yet."""
    if session.active or not session.queue:
        raise ValueError("kv_bytes_per_row: give a session with queued rows and none decoding")
    session.step()
    if session.cache is None or not session.active:
        raise ValueError("kv_bytes_per_row: the session admitted no row")
    return -(-session.cache.nbytes() // len(session.active))
