"""Host milliseconds per Jacobi decode step outside the target forward, for any raydec version.

    python benchmarks/host_work.py --codebook 16384 --batch 8 --window 64 --method sjd_pac
    PYTHONPATH=/path/to/old/worktree python benchmarks/host_work.py ...   # an earlier commit

It uses only the public ``generate_images`` and the target loader (``load_target``, named
``load_pipeline`` before the layout change; present in every version), so
the same script measures the code before and after a change side by side: a small random
Janus (2 layers, 64 wide) with the given codebook, CFG on, float32, left copies, shapes
prompts. Per decode step: the whole wall time minus the target's forwards (prefill included)
and pixel decoding, divided by the decode steps (counted at the engine's commit). No profiler
runs, so nothing adds overhead to the host part. `raydec bench step` gives the structure
(read-backs, bytes, operators); this gives the one number both versions can be asked for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def build_janus(folder: Path, codebook: int) -> Path:
    # the same random Janus as raydec.bench.step.build_janus, written out here on purpose: this
    # script also runs against commits that have no raydec.bench.step
    from raydec.reference.janus import model as jt
    from raydec.reference.shapes import vocabulary

    tokenizer = jt.build_tokenizer(vocabulary())
    arch = jt.T2IArchitecture(
        vq_base_channels=32, vq_channel_multiplier=(1, 1, 1), vq_num_res_blocks=1, vq_latent_channels=32,
        vq_embed_dim=8, vq_num_embeddings=codebook, lm_hidden_size=64, lm_num_layers=2, lm_num_heads=2,
        lm_intermediate_size=128, lm_max_positions=512, vision_hidden_size=32,
    )
    model = jt.build_model(jt.build_config(tokenizer, arch), 0).eval()
    model.generation_config = jt.build_generation_config(tokenizer, guidance_scale=2.0)
    with torch.no_grad():
        model.save_pretrained(folder)
    jt.build_processor(tokenizer).save_pretrained(folder)
    return folder


def _commit_owner():
    """The class whose ``_commit`` runs once per decode step in this raydec version."""
    import raydec

    if (Path(raydec.__file__).parent / "spec" / "engine.py").exists():  # before the session API
        from raydec.spec.engine import Engine

        return Engine
    from raydec.speculative.engine import DecodeSession

    return DecodeSession


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codebook", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--method", default="sjd_pac", choices=["sjd", "sjd_ac", "sjd_pac"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (after one warm-up); the median is reported")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="e.g. cuda (default: the CPU)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import raydec
    from raydec.api import generate_images

    try:
        from raydec.api import load_target
    except ImportError:  # a commit before the rename
        from raydec.api import load_pipeline as load_target
    from raydec.config import DecodeConfig, JacobiDraftConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

    with tempfile.TemporaryDirectory() as tmp:
        target = load_target(str(build_janus(Path(tmp), args.codebook)), "t2i", dtype=torch.float32, device=args.device)
    # on an accelerator the forward is timed to its end, so its kernels are not charged to the step
    settle = torch.cuda.synchronize if args.device and args.device.startswith("cuda") else (lambda: None)
    spent = {"forward": 0.0, "pixels": 0.0, "steps": 0}

    def timed(name, function):
        def wrapper(*a, **k):
            settle()
            start = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                settle()
                spent[name] += time.perf_counter() - start
        return wrapper

    target.forward = timed("forward", target.forward)
    target.decode_tokens = timed("pixels", target.decode_tokens)
    owner = _commit_owner()
    commit = owner._commit

    def counted_commit(self, *a, **k):
        spent["steps"] += 1
        return commit(self, *a, **k)

    owner._commit = counted_commit
    branching, depth = (3, 1) if args.method == "sjd_pac" else (1, 0)
    decode = DecodeConfig(method=args.method, jacobi=JacobiDraftConfig(window=args.window, branching=branching, tree_depth=depth, init="left"))
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(args.batch)]

    def run() -> float:
        for key in spent:
            spent[key] = 0
        settle()
        start = time.perf_counter()
        generate_images(prompts, model=target, decode=decode, seeds=list(range(args.batch)), batch_size=args.batch)
        settle()
        wall = time.perf_counter() - start
        return 1e3 * (wall - spent["forward"] - spent["pixels"]) / max(1, spent["steps"])

    run()  # warm-up
    host_ms = [run() for _ in range(args.repeats)]
    result = {"raydec": str(Path(raydec.__file__).parent), "codebook": args.codebook, "batch": args.batch, "window": args.window,
              "method": args.method, "threads": args.threads, "device": args.device or "cpu", "steps": spent["steps"], "host_ms_per_step": statistics.median(host_ms),
              "host_ms_runs": host_ms}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
