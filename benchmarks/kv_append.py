"""What appending to the KV cache costs a decode step: raydec's in-place growing cache against
Hugging Face's concatenating ``DynamicCache``, under our AR engine on a random Llama.

    python benchmarks/kv_append.py --device cuda --layers 8 --hidden 4096 --batch 16 --new-tokens 1024

``DynamicCache`` appends by ``torch.cat``, copying every layer's whole cache at each forward
(bandwidth that grows with the cache); ``raydec.spec.cache.GrowingCache`` writes the new slots
into spare room. Both decode the same greedy tokens; the script checks that and prints
milliseconds per decode step of each, in alternating rounds.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    import raydec.spec.cache as cache_module
    from raydec.bench import synchronize
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.models.causal_lm import CausalLMTarget
    from raydec.spec.engine import Engine, RowRequest
    from raydec.spec.proposers.ar import ARProposer

    config = LlamaConfig(
        vocab_size=16384, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.6875) // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=args.prompt + args.new_tokens + 64,
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())
    target = CausalLMTarget(model)
    engine = Engine(target, ARProposer(), DecodeConfig(max_new_tokens=args.new_tokens, sampling=SamplingConfig(temperature=0.0)))
    generator = torch.Generator().manual_seed(1)
    requests = [RowRequest(torch.randint(0, 16384, (args.prompt,), generator=generator).tolist(), seed=i) for i in range(args.batch)]
    caches = {"growing (raydec)": cache_module.GrowingCache, "concatenating (HF DynamicCache)": DynamicCache}

    def decode(cache_class):
        cache_module.GrowingCache = cache_class  # what RaggedCache builds its KV store from
        synchronize(args.device)
        start = time.perf_counter()
        outputs = engine.generate(requests)
        synchronize(args.device)
        return time.perf_counter() - start, [o.tokens for o in outputs]

    try:
        for cache_class in caches.values():  # warm-up
            cache_module.GrowingCache = cache_class
            engine.generate([RowRequest(requests[0].prompt, seed=0, max_new_tokens=8)])
        seconds = {name: [] for name in caches}
        tokens = {}
        for _ in range(args.rounds):
            for name, cache_class in caches.items():
                elapsed, tokens[name] = decode(cache_class)
                seconds[name].append(elapsed)
    finally:
        cache_module.GrowingCache = caches["growing (raydec)"]
    steps = args.new_tokens
    print(f"kv_append: {params / 1e9:.2f}B-param Llama ({args.layers} layers, width {args.hidden}), bf16, {args.device}, "
          f"batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, {args.rounds} rounds")
    base = min(seconds["concatenating (HF DynamicCache)"])
    for name, values in seconds.items():
        print(f"  {name:34s} {1e3 * min(values) / steps:7.3f} ms per step (best round)  x{base / min(values):.2f} vs concatenating")
    same = len({str(t) for t in tokens.values()}) == 1
    print(f"  same greedy tokens from both caches: {same}")


if __name__ == "__main__":
    main()
