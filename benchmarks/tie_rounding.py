"""How far a dtype moves the race between the two best perturbed scores, in units of its rounding:
the measurement behind ``raydec.api.near_ties.TIE_ULPS``.

    python benchmarks/tie_rounding.py --task t2i --rows 24
    python benchmarks/tie_rounding.py --task caption --rows 24 --temperature 1

Every row is decoded with plain AR in float64 (coupling gumbel); then each dtype scores the whole
decoded prefix in one forward (``raydec.api.near_ties.position_scores``'s forward, keeping every
position). At each position, for the two tokens with the best float64 perturbed scores
``log P + G`` among the kept ones, the error of their difference in the dtype,
``|(s_a - s_b) - (s64_a - s64_b)|``, is divided by ``eps(dtype) * M`` (M: the position's largest
absolute raw logit, times ``|s| + |1 - s|`` under guidance of scale s, over the temperature: what
``near_ties.tolerance`` multiplies). Prints the largest, the 99.9th and 99th percentiles and the
median per dtype, and writes them with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from raydec.api.near_ties import PrefixProposer
from raydec.config import SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.random import RowRandom
from raydec.speculative.requests import RowRequest
from raydec.speculative.sampling import process_logits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EveryPosition(PrefixProposer):
    """The prefix's forward, keeping P and the raw logits after every node."""

    def observe(self, state, tree, target_probs, result, output) -> None:  # noqa: ANN001
        self.probs, self.logits = target_probs[0].clone(), output.logits.clone()


def prefix_scores(target, sampling: SamplingConfig, prompt, seed: int, tokens: list[int], constraint, max_positions):  # noqa: ANN001
    """Per position 1..len(tokens) - 1: (perturbed scores [N, V], kept [N, V], magnitude [N])."""
    prefix = tokens[:-1]
    untruncated = sampling.model_copy(update={"temperature": 1.0 if sampling.greedy else sampling.temperature, "top_k": 0, "top_p": 1.0})
    proposer = EveryPosition(prefix)
    engine = Engine(target, proposer, untruncated, len(prefix) + 1, constraint=constraint, max_positions=max_positions,
                    compile="off", coupling="gumbel")
    session = engine.session(batch_size=1)
    session.submit(RowRequest(prompt, seed=seed, max_new_tokens=len(prefix) + 1))
    session.step()
    session.step()
    log_probs = proposer.probs.to(torch.float64).log().cpu()  # [N, V]: positions 1..N
    count, vocab = log_probs.shape
    if sampling.greedy:
        kept, gumbel = log_probs > -math.inf, torch.zeros(count, vocab, dtype=torch.float64)
    else:
        cut = SamplingConfig(temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p)
        kept = process_logits(log_probs.view(1, count, vocab), cut, 1)[0] > 0
        noise = RowRandom.for_seeds([seed]).at_positions(torch.tensor([1])).exponentials(torch.arange(count), vocab)
        gumbel = -noise[0].log()
    logits = proposer.logits.to(torch.float64).cpu()  # [M, N, V]
    magnitude = torch.where(torch.isfinite(logits), logits.abs(), torch.zeros_like(logits)).amax(dim=(0, 2))
    if sampling.uses_cfg:
        magnitude = magnitude * (abs(sampling.cfg_scale) + abs(1.0 - sampling.cfg_scale))
    if not sampling.greedy:
        magnitude = magnitude / sampling.temperature
    return log_probs + gumbel, kept, magnitude


def rows_of(task: str, count: int, temperature: float | None, max_new_tokens: int):
    """(float64 target, resolved config, [(prompt, AR tokens)], constraint, max_positions) for ``count`` shapes rows."""
    from raydec.api import caption_images, generate_images, load_target
    from raydec.api.inputs import caption_decode_config, image_decode_config, max_positions
    from raydec.config import DecodeConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    target = load_target("reference", task=task, dtype=torch.float64)
    decode = DecodeConfig(method="ar", coupling="gumbel", **({"sampling": {"temperature": temperature}} if temperature is not None else {}))
    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(count)]
    if task == "t2i":
        from raydec.models.image_gen import ImagePrompt

        results = generate_images([s.prompt for s in samples], model=target, decode=decode, seeds=list(range(count)))
        rows = [(ImagePrompt(s.prompt, None), r.tokens) for s, r in zip(samples, results)]
        return target, image_decode_config(decode, target), rows, target.vocab_constraint(), None
    from raydec.models.hf_vlm import VlmPrompt

    decode = decode.model_copy(update={"max_new_tokens": max_new_tokens})
    images = [to_pil(s.image) for s in samples]
    results = caption_images(images, model=target, decode=decode, seeds=list(range(count)))
    rows = [(VlmPrompt(target.format_prompt("describe the image .", 1), [image]), r.tokens) for image, r in zip(images, results)]
    return target, caption_decode_config(decode, target), rows, None, max_positions(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["t2i", "caption"], default="t2i")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=None, help="captions: the sampling temperature (default: the checkpoint's)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="captions: most tokens per answer")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from raydec.api import load_target

    reference, config, rows, constraint, positions = rows_of(args.task, args.rows, args.temperature, args.max_new_tokens)
    report = {"task": args.task, "rows": args.rows, "sampling": config.sampling.model_dump(), "dtypes": {}}
    for name in args.dtypes.split(","):
        dtype, ratios = DTYPES[name], []
        target = load_target("reference", task=args.task, dtype=dtype)
        for seed, (prompt, tokens) in enumerate(rows):
            if len(tokens) < 2:
                continue
            exact, kept, magnitude = prefix_scores(reference, config.sampling, prompt, seed, tokens, constraint, positions)
            low, low_kept, _ = prefix_scores(target, config.sampling, prompt, seed, tokens, constraint, positions)
            best = torch.where(kept, exact, torch.full_like(exact, -math.inf)).topk(2, dim=-1).indices  # [N, 2]
            for j, (a, b) in enumerate(best.tolist()):
                if not (kept[j, a] and kept[j, b] and low_kept[j, a] and low_kept[j, b]):
                    continue
                error = abs(float((low[j, a] - low[j, b]) - (exact[j, a] - exact[j, b])))
                ratios.append(error / (torch.finfo(dtype).eps * float(magnitude[j])))
        r = torch.tensor(ratios)
        figures = {"positions": len(ratios), "max": float(r.max()), "p99.9": float(r.quantile(0.999)), "p99": float(r.quantile(0.99)),
                   "median": float(r.median())}
        report["dtypes"][name] = figures
        print(f"{args.task} {name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
