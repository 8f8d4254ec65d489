"""One draft call of a tree level: the module's ``forward`` against the inference form's ``decode_forward``.

    python benchmarks/draft_step.py --rounds 30 --calls 200

Loads the reference LLaVA and its ViSpec draft as decoding does (``load_draft``: fused layer,
folded input, row-major CPU GEMMs), fills the draft cache with ``--cache`` slots, then times one
call over ``--nodes`` tree nodes per row, cropping the cache after each. The two forms alternate
round by round, so the machine's drift hits both; prints each form's median and fastest round
(microseconds per call) and the largest difference between their outputs.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--nodes", type=int, default=4, help="tree nodes per row (the tree's top_k)")
    parser.add_argument("--cache", type=int, default=80, help="committed draft-cache slots")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import DynamicCache

    from raydec.api import load_draft, load_target

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    target = load_target("reference", "caption", dtype=torch.bfloat16)
    draft = load_draft(target, "vispec", dtype=torch.float32)
    b, n, s, h = args.batch, args.nodes, args.cache, target.hidden_size
    cache = DynamicCache()
    with torch.inference_mode():
        draft(torch.randn(b, s, h), torch.randn(b, s, h), torch.arange(s).expand(b, s), torch.zeros(b, 1, s, s), cache,
              torch.randn(b, s, h), torch.ones(b, s, dtype=torch.bool))
    tokens, features = torch.randn(b, n, h), torch.randn(b, n, h)
    positions, mask = torch.full((b, n), s), torch.zeros(b, 1, n, s + n)
    globals_, has_global = torch.randn(b, h), torch.ones(b, dtype=torch.bool)
    rows = draft.decode_rows(globals_, has_global)  # once per batch of rows, as the proposer does
    forms = {
        "forward": lambda: draft(tokens, features, positions, mask, cache, globals_.unsqueeze(1).expand(b, n, h), has_global.unsqueeze(1).expand(b, n)),
        "decode_forward": lambda: draft.decode_forward(tokens, features, positions, mask, cache, rows, s),
    }
    outputs, times = {}, {name: [] for name in forms}
    with torch.inference_mode():
        for name, call in forms.items():
            outputs[name] = call()
            cache.crop(-n)
        for _ in range(args.rounds):
            for name, call in forms.items():
                start = time.perf_counter()
                for _ in range(args.calls):
                    call()
                    cache.crop(-n)
                times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    print(f"draft call over {n} nodes x {b} row(s), cache {s}, {args.rounds} rounds of {args.calls} calls, {args.threads} threads")
    for name, values in times.items():
        print(f"{name:15s} median {statistics.median(values):8.1f} us   fastest {min(values):8.1f} us")
    ratio = statistics.median(times["decode_forward"]) / statistics.median(times["forward"])
    gap = float((outputs["forward"] - outputs["decode_forward"]).abs().max())
    print(f"decode_forward / forward: {ratio:.3f}; largest output difference {gap:.2e}")


if __name__ == "__main__":
    main()
