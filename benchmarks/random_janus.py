"""A random-weight Janus checkpoint whose language model has a bench shape, for ``raydec check`` on a GPU.

    python benchmarks/random_janus.py --size janus-pro-7b --device cuda --dtype bfloat16 --out /tmp/janus-7b
    raydec check --model /tmp/janus-7b --method sjd_pac --dtype bfloat16 --device cuda

The language model takes ``raydec bench engine``'s shapes (``janus-pro-7b``: Janus-Pro-7B's Llama,
30 layers, 4096 wide, 32 heads; ``small`` for a dry run on a CPU), with a ``--codebook``-code image
head; the rest is the reference Janus's (its word-level tokenizer and processor, 64 x 64 images of
16 x 16 tokens, a small VQ model). Built on ``--device`` in ``--dtype`` (no float32 copy on the
host). Random weights give near-uniform image-token distributions, so the image head is scaled until
its logits' standard deviation over a shapes prompt is ``--logit-std``: sharper distributions, as a
trained model's are, whose top perturbed scores can sit within a bfloat16 rounding of each other.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def build(size: str, codebook: int, dtype: torch.dtype, device: str, seed: int) -> tuple[torch.nn.Module, object]:
    """(the random JanusForConditionalGeneration, its processor)."""
    from transformers import JanusForConditionalGeneration

    from raydec.bench.engine import BENCH_LLAMA_SHAPES
    from raydec.reference.janus import model as jt
    from raydec.reference.shapes import vocabulary

    shape = BENCH_LLAMA_SHAPES[size]
    tokenizer = jt.build_tokenizer(vocabulary())
    arch = jt.T2IArchitecture(vq_num_embeddings=codebook, lm_hidden_size=shape["hidden_size"], lm_num_layers=shape["num_hidden_layers"],
                              lm_num_heads=shape["num_attention_heads"], lm_intermediate_size=shape["intermediate_size"],
                              lm_max_positions=1024)
    config = jt.build_config(tokenizer, arch)
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = JanusForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.generation_config = jt.build_generation_config(tokenizer)
    return model.to(dtype).eval(), jt.build_processor(tokenizer)


@torch.no_grad()
def sharpen(model: torch.nn.Module, processor: object, logit_std: float) -> float:
    """Scale the image head so its logits after a shapes prompt have standard deviation ``logit_std``; the factor."""
    ids = processor.tokenizer("a large red solid circle top left , on a plain white background", return_tensors="pt").input_ids
    embeds = model.get_input_embeddings()(ids.to(model.device))
    hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, -1]
    logits = model.model.generation_head(hidden).float()
    factor = logit_std / max(float(logits.std()), 1e-6)
    model.model.generation_head.vision_head.weight.mul_(factor)
    model.model.generation_head.vision_head.bias.mul_(factor)
    return factor


def main() -> None:
    from raydec.bench.engine import BENCH_LLAMA_SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(BENCH_LLAMA_SHAPES), default="janus-pro-7b", help="the language model's shape")
    parser.add_argument("--codebook", type=int, default=16384, help="image codes (Janus-Pro's 16,384)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--logit-std", type=float, default=4.0, help="the image logits' standard deviation after a prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder (written; a finished one is kept)")
    args = parser.parse_args()
    if (args.out / "config.json").is_file():
        print(f"random_janus: {args.out} already holds a checkpoint; kept")
        return
    start = time.perf_counter()
    model, processor = build(args.size, args.codebook, getattr(torch, args.dtype), args.device, args.seed)
    factor = sharpen(model, processor, args.logit_std)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"random_janus: {params / 1e9:.2f}B parameters ({args.size}, {args.codebook} codes, {args.dtype}), image head x{factor:.3g}, "
          f"saved to {args.out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
