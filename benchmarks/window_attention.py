"""Attention of a decode window over a ragged cache, for grouped-query models: three kernels.

    python benchmarks/window_attention.py                        # CPU, bf16, Qwen2.5-VL-7B's heads
    python benchmarks/window_attention.py --device cuda --json out.json

One layer's attention of a decode step: ``batch`` rows, each a window (an SJD window, a draft
tree) of ``window`` new tokens under a tree mask, over ``context`` cached slots with holes (the
ragged cache's masked slots) plus the window itself. Per (context, window), milliseconds per
call of

    repeat_kv   Hugging Face's SDPA path with a mask: K/V repeated per query head, then SDPA
    window      ``raydec.models.attention.window_attention`` (what a decode step runs: SDPA
                with ``enable_gqa`` on a CPU, the query heads packed per K/V head elsewhere)
    flex        FlexAttention (``torch.nn.attention.flex_attention``, compiled), GQA native,
                the mask a ``BlockMask`` built once per step from the rows' tree and holes
                (its build is timed apart: ``flex_mask_ms``, paid once per step, not per layer)

and each kernel's largest difference from ``repeat_kv``'s output. Heads default to
Qwen2.5-VL-7B's (28 query heads over 4 K/V heads, 128 wide). Prints a table; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    fn()  # warm-up (and the compile, for flex)
    fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def step_mask(batch: int, window: int, context: int, holes: float, generator: torch.Generator) -> torch.Tensor:
    """[B, N, S + N] bool: each row's committed slots (a share ``holes`` masked, as the ragged cache
    leaves them) and a random tree over its window (each node sees its ancestors and itself)."""
    prefix = torch.rand(batch, context, generator=generator) >= holes
    prefix[:, 0] = True
    parent = torch.stack([torch.randint(0, max(1, i), (batch,), generator=generator) if i else torch.zeros(batch, dtype=torch.long)
                          for i in range(window)], dim=1)  # [B, N]: node i's parent (< i); the root is its own
    tree = torch.eye(window, dtype=torch.bool).expand(batch, -1, -1).clone()
    for i in range(1, window):
        tree[:, i] |= tree[torch.arange(batch), parent[:, i]]  # i's ancestors are its parent's and the parent
    return torch.cat([prefix[:, None, :].expand(-1, window, -1), tree], dim=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--windows", default="16,64", help="new tokens per row (comma-separated)")
    parser.add_argument("--contexts", default="256,1024,4096", help="cached slots per row (comma-separated)")
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--holes", type=float, default=0.2, help="share of the cached slots masked")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (e.g. where it does not compile)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from raydec.models.attention import window_attention

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    group = args.heads // args.kv_heads
    flex_attention = create_block_mask = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex_attention = torch.compile(flex_attention, dynamic=False)
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        for window in [int(w) for w in args.windows.split(",")]:
            slots = context + window
            query = torch.randn(args.batch, args.heads, window, args.head_dim, generator=generator).to(device, dtype)
            key = torch.randn(args.batch, args.kv_heads, slots, args.head_dim, generator=generator).to(device, dtype)
            value = torch.randn(args.batch, args.kv_heads, slots, args.head_dim, generator=generator).to(device, dtype)
            allowed = step_mask(args.batch, window, context, args.holes, generator).to(device)  # [B, N, S + N]
            additive = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
            scale = args.head_dim ** -0.5

            def repeat_kv() -> torch.Tensor:
                k = key[:, :, None].expand(-1, -1, group, -1, -1).reshape(args.batch, args.heads, slots, args.head_dim)
                v = value[:, :, None].expand(-1, -1, group, -1, -1).reshape(args.batch, args.heads, slots, args.head_dim)
                return F.scaled_dot_product_attention(query, k, v, attn_mask=additive, scale=scale)

            def window_kernel() -> torch.Tensor:
                return window_attention(torch.nn.Module(), query, key, value, additive, scaling=scale)[0].transpose(1, 2)

            reference = repeat_kv().float()
            row = {"batch": args.batch, "window": window, "context": context, "heads": args.heads, "kv_heads": args.kv_heads,
                   "head_dim": args.head_dim, "repeat_kv_ms": timed_ms(repeat_kv, device, args.repeats),
                   "window_ms": timed_ms(window_kernel, device, args.repeats),
                   "window_max_diff": float((window_kernel().float() - reference).abs().max())}
            if flex_attention is not None:
                def mask_mod(b, h, q, kv):  # noqa: ANN001, ANN202  (FlexAttention's signature)
                    return allowed[b, q, kv]

                def build() -> object:
                    return create_block_mask(mask_mod, args.batch, None, window, slots, device=device)

                start = time.perf_counter()
                block_mask = build()
                synchronize(device)
                row["flex_mask_ms"] = (time.perf_counter() - start) * 1e3

                def flex() -> torch.Tensor:
                    return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)

                try:
                    row["flex_ms"] = timed_ms(flex, device, args.repeats)
                    row["flex_max_diff"] = float((flex().float() - reference).abs().max())
                except Exception as exc:  # noqa: BLE001  (a kernel that does not build here is a result too)
                    row["flex_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    header = f"{'context':>8} {'window':>6} {'repeat_kv ms':>13} {'window ms':>10} {'flex ms':>9} {'flex mask ms':>13}"
    print(f"\nwindow attention, {args.device} {args.dtype}, batch {args.batch}, {args.heads} query heads over {args.kv_heads} K/V heads\n{header}")
    for r in rows:
        flex = f"{r['flex_ms']:9.2f}" if "flex_ms" in r else f"{'-':>9}"
        mask = f"{r['flex_mask_ms']:13.2f}" if "flex_mask_ms" in r else f"{'-':>13}"
        print(f"{r['context']:8d} {r['window']:6d} {r['repeat_kv_ms']:13.2f} {r['window_ms']:10.2f} {flex} {mask}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
