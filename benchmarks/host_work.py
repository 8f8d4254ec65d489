"""Host work per Jacobi decode step at a real codebook size, apart from the target forward.

    python benchmarks/host_work.py --codebook 16384

The reference Janus has a 512-code book; Janus-Pro has 16,384. Drafting, coupling and
verification run on the CPU over `[rows, slots, V]` probabilities, so their cost grows with the
codebook while the reference model hides it. This builds a small random Janus (2 layers, 64 wide)
with the given codebook in a temporary folder, decodes a few shapes prompts with sjd, sjd_ac and
sjd_pac (left copies, CFG on, bf16 off: float32), and prints milliseconds per decode step: the
whole step, the target forward, logit processing, and the proposer / verifier / bookkeeping
parts (cProfile, time with callees; the profiler adds its own overhead to every part).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import torch

PARTS = ("forward", "process_logits", "propose", "verify_tree", "_commit", "observe")


def build_janus(folder: Path, codebook: int) -> Path:
    from raydec.reference import janus_t2i as jt
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codebook", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from raydec.api import generate_images, load_pipeline
    from raydec.config import DecodeConfig, DraftSpec
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

    with tempfile.TemporaryDirectory() as tmp:
        target = load_pipeline(str(build_janus(Path(tmp), args.codebook)), "t2i", dtype=torch.float32)
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(8)]
    print(f"host_work: random Janus, {args.codebook}-code book, float32, CPU, {args.threads} thread(s); ms per decode step")
    print(f"{'batch':>5} {'window':>6} {'method':8} {'steps':>5} {'step':>6} " + " ".join(f"{p:>14}" for p in PARTS))
    for batch, window in ((1, 32), (8, 16)):
        for method, branching, depth in (("sjd", 1, 0), ("sjd_ac", 1, 0), ("sjd_pac", 2, 1)):
            decode = DecodeConfig(method=method, draft=DraftSpec(window=window, branching=branching, tree_depth=depth, init="left"))
            run = lambda: generate_images(prompts[:batch], model=target, decode=decode, seeds=list(range(batch)), batch_size=batch)  # noqa: E731
            run()  # warm-up
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.enable()
            run()
            profile.disable()
            wall = time.perf_counter() - start
            stats = pstats.Stats(profile).stats
            seconds = {p: sum(v[3] for k, v in stats.items() if k[2] == p and "raydec" in k[0]) for p in PARTS}
            steps = sum(v[1] for k, v in stats.items() if k[2] == "_commit" and "raydec" in k[0])
            print(f"{batch:>5} {window:>6} {method:8} {steps:>5} {1e3 * wall / steps:6.1f} "
                  + " ".join(f"{1e3 * seconds[p] / steps:14.2f}" for p in PARTS), flush=True)


if __name__ == "__main__":
    main()
