"""`raydec bench caption`: AR, Hugging Face assisted generation, EAGLE-2 and ViSpec side by side.

Same images, prompts and seeds for every method; methods interleaved batch by batch in one
run, so machine noise hits all alike. Per method: tokens per target forward (prefill
included), τ (accepted draft tokens per verification, without the bonus token), latency
speedup vs AR (total time ratio) and caption accuracy by the judge, with its difference from
AR's paired by image and that difference's standard error. ``hf`` is plain Hugging
Face ``generate()`` and ``hf_assisted`` is ``generate(assistant_model=...)`` with the small
LLaVA assistant shipped next to the reference VLM (batch 1 only, as Hugging Face requires).
Also prints what one draft step costs relative to one target forward.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydec.api import caption_images, continuous_batching, draft_dtype, load_target
from raydec.bench.common import (
    json_path_arg, non_negative_int, parse_methods, positive_int, positive_float, print_table, ratio_cell, resolve_device,
)
from raydec.bench.cost_tuner import window_cost
from raydec.config import DecodeConfig, DraftTreeConfig, SamplingConfig
from raydec.models.base import decoding_attention, synchronize
from raydec.models.cpu_matmul import route_if_cpu
from raydec.models.registry import REFERENCE_DRAFT_DIRS, resolve_draft_path
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

logger = logging.getLogger(__name__)

ALL_METHODS = ("ar", "hf", "hf_assisted", "eagle", "vispec")


def paired_difference(scores: list[float], baseline: list[float]) -> tuple[float, float | None]:
    """Mean of ``scores - baseline`` paired by image, and its standard error (None below 2 pairs).

    The same images for both sides, so the image-to-image spread cancels: a lossless method's
    accuracy differs from AR's only by sampling noise, about within 2 standard errors.
    """
    diff = np.asarray(scores, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)  # [N]
    if diff.size == 0:
        return 0.0, None
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else None
    return float(diff.mean()), se


def difference_cell(entry: dict) -> str:
    """'-0.003 ± 0.008' (accuracy minus AR's ± its standard error), or '-' for AR itself."""
    if entry.get("judge_accuracy_vs_ar_se") is None:
        return "-"
    return f"{entry['judge_accuracy_vs_ar']:+.3f} ± {entry['judge_accuracy_vs_ar_se']:.3f}"


@dataclass
class MethodRecord:
    seconds: float = 0.0
    forwards: list[int] = field(default_factory=list)  # target forwards per row, prefill included
    tokens: list[int] = field(default_factory=list)
    verifications: int = 0  # decode forwards
    accepted_drafts: int = 0  # draft tokens accepted over all verifications
    scores: list[float] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    target_calls: int = 0


class _Timed:
    """Wrap a bound method and sum the seconds spent in it."""

    def __init__(self, owner: Any, name: str, device: str = "cpu") -> None:
        self.owner, self.name, self.seconds, self.calls = owner, name, 0.0, 0
        self.original = getattr(owner, name)
        self.device = device

    def __enter__(self) -> "_Timed":
        def timed(*args: Any, **kwargs: Any) -> Any:
            synchronize(self.device)  # on a GPU, time the call's own work, not the queue before it
            start = time.perf_counter()
            try:
                return self.original(*args, **kwargs)
            finally:
                synchronize(self.device)
                self.seconds += time.perf_counter() - start
                self.calls += 1

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: Any) -> None:
        delattr(self.owner, self.name)


class _ForwardCounter:
    """Count forwards of a Hugging Face model (for assisted generation)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.count = module, 0

    def __enter__(self) -> "_ForwardCounter":
        self.hook = self.module.register_forward_pre_hook(self._count)
        return self

    def _count(self, *_: Any) -> None:
        self.count += 1

    def __exit__(self, *exc: Any) -> None:
        self.hook.remove()


def _hf_caption(target: Any, prompt: Any, sampling: SamplingConfig, max_new_tokens: int, seed: int, assistant: Any = None) -> tuple[list[int], int, float]:
    """One row through Hugging Face ``generate`` (optionally assisted): tokens, target forwards, seconds."""
    inputs = target.processor(text=[prompt.text], images=list(prompt.images), return_tensors="pt")
    inputs = {k: v.to(target.device) for k, v in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(target.dtype)
    kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    torch.manual_seed(seed)
    with _ForwardCounter(target.model) as counter:
        synchronize(target.device)
        start = time.perf_counter()
        with torch.inference_mode(), decoding_attention(target.device):  # the kernels our engine uses
            out = target.model.generate(**inputs, **kwargs)
        synchronize(target.device)
        seconds = time.perf_counter() - start
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = set(target.eos_token_ids)
    for i, token in enumerate(tokens):
        if token in eos:
            tokens = tokens[: i + 1]
            break
    return tokens, counter.count, seconds


def _load_assistant(path: Path, target: Any, dtype: torch.dtype) -> Any:
    """The HF assistant, in the precision and with the CPU GEMMs our drafts use (like for like)."""
    from transformers import AutoModelForImageTextToText

    if not (path / "config.json").is_file():
        raise SystemExit(f"--methods hf_assisted: no assistant model at {path} (train one: python -m raydec.reference.train assistant)")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    model = model.to(target.device).eval()
    route_if_cpu(model, target.device, dtype)
    return model


def _draft_path(args: argparse.Namespace, method: str) -> str:
    """--vispec-draft / --eagle-draft, else the draft shipped with --model."""
    explicit = getattr(args, f"{method}_draft")
    return str(resolve_draft_path(args.model, method, explicit))


def method_configs(args: argparse.Namespace, methods: list[str], sampling: SamplingConfig, tree: DraftTreeConfig) -> dict[str, DecodeConfig]:
    """Each method's decode config, from the CLI: ``hf`` and ``hf_assisted`` (run outside the engine)
    record AR's; ``eagle`` and ``vispec`` name their draft (``--eagle-draft`` / ``--vispec-draft``,
    else the one shipped with ``--model``)."""
    return {
        m: DecodeConfig(
            method="ar" if m in ("ar", "hf", "hf_assisted") else m, max_new_tokens=args.max_new_tokens,
            sampling=sampling, draft_tree=tree,
            draft_model=_draft_path(args, m) if m in ("eagle", "vispec") else None, draft_dtype=args.draft_dtype,
            batching=args.batching,
        )
        for m in methods
    }


def bench_caption(args: argparse.Namespace) -> dict:
    from raydec.models.hf_vlm import VlmPrompt  # lazy: keeps raydec bench --help light
    from raydec.reference.judge import score_caption  # lazy: keeps raydec bench --help light

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = parse_methods(args.methods, ALL_METHODS)
    if "hf_assisted" in methods and args.batch != 1:
        raise SystemExit("--methods hf_assisted: Hugging Face assisted generation runs at --batch 1 only")
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = resolve_device(args.device)
    sampling = SamplingConfig(temperature=args.temperature)  # validated before any model loads
    shape = {k: v for k, v in (("depth", args.depth), ("top_k", args.top_k), ("total_tokens", args.total_tokens)) if v is not None}
    tree = DraftTreeConfig(**{**DraftTreeConfig.for_temperature(args.temperature).model_dump(), **shape})
    target = load_target(args.model, "caption", dtype=dtype, device=None if device == "cpu" else device)
    configs = method_configs(args, methods, sampling, tree)
    small_dtype = draft_dtype(target, args.draft_dtype)  # eagle / vispec drafts and the HF assistant alike
    assistant = _load_assistant(args.assistant or REFERENCE_DRAFT_DIRS["assistant"], target, small_dtype) if "hf_assisted" in methods else None

    samples = [make_sample(HELD_OUT_SEED_START + args.offset + i) for i in range(args.images)]
    images = [to_pil(s.image) for s in samples]
    seeds = [args.seed + i for i in range(args.images)]
    records = {m: MethodRecord() for m in methods}
    caption_images(images[:1], prompt=args.prompt, model=target, decode=configs["ar"], seeds=seeds[:1])  # warm-up

    loop_start, measured = time.perf_counter(), 0
    for start in range(0, len(images), args.batch):
        if args.max_seconds and measured and time.perf_counter() - loop_start >= args.max_seconds:
            logger.warning("bench caption: --max-seconds %g reached, stopping after %d of %d images", args.max_seconds, measured, len(images))
            break
        batch_images, batch_seeds = images[start : start + args.batch], seeds[start : start + args.batch]
        measured += len(batch_images)
        for method in methods:
            record = records[method]
            if method in ("hf", "hf_assisted"):  # one image per generate() call (hf_assisted needs batch 1)
                seconds = _hf_batch(record, target, args, sampling, batch_images, batch_seeds, assistant if method == "hf_assisted" else None)
            else:
                seconds = _engine_batch(record, target, args, configs[method], batch_images, batch_seeds, device)
            record.seconds += seconds
            first = len(record.scores)
            record.scores += [score_caption(c, np.asarray(img)) for c, img in zip(record.captions[first:], batch_images)]
        logger.info("bench caption: %d/%d images", min(start + args.batch, len(images)), len(images))

    summary = caption_summary(records)
    ar = records["ar"]
    identical = {m: sum(a == b for a, b in zip(ar.captions, r.captions)) for m, r in records.items()}

    cost = window_cost(target, VlmPrompt(target.format_prompt(args.prompt, 1), [images[0]]), sorted({1, 4, 8, 16, tree.total_tokens}))
    batching = "continuous" if continuous_batching(device, args.batching) else "consecutive"
    print_table(
        f"bench caption: {args.model}, {measured} images, batch {args.batch} ({batching}), {args.dtype} (drafts {str(small_dtype).replace('torch.', '')}), "
        f"{device}, temperature {args.temperature}, draft tree depth {tree.depth} top_k {tree.top_k} total {tree.total_tokens}",
        *caption_table(summary),
    )
    if sampling.greedy:
        print("captions identical to AR: " + ", ".join(f"{m} {n}/{measured}" for m, n in identical.items()))
    print("accuracy - AR: the judge's score minus AR's, paired by image, ± its standard error "
          "(a lossless method differs by noise: about within 2 SE)")
    print("non-target step: a decode step's work outside the target forward (draft, verifier, bookkeeping; "
          "for ar only bookkeeping), per target forward")
    print("target forward cost relative to a 1-token forward: " + ", ".join(f"{n} tokens {c:.2f}x" for n, c in cost.items()))
    return {
        "methods": summary,
        "window_cost": {str(n): c for n, c in cost.items()},
        "draft_tree": tree.model_dump(),
        "captions_identical_to_ar": identical,
        "config": {m: c.model_dump() for m, c in configs.items()},
        "images": measured, "images_requested": args.images, "batch": args.batch, "batching": batching, "dtype": args.dtype,
        "draft_dtype": str(small_dtype).replace("torch.", ""), "temperature": args.temperature, "device": device,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "model": str(args.model), "prompt": args.prompt,
    }


def _hf_batch(record: MethodRecord, target: Any, args: argparse.Namespace, sampling: SamplingConfig, images: list, seeds: list[int],
              assistant: Any) -> float:
    """One batch through Hugging Face ``generate``, one image per call (assisted when ``assistant``
    is given), added to ``record`` -> its seconds."""
    from raydec.models.hf_vlm import VlmPrompt  # lazy: keeps raydec bench --help light

    seconds = 0.0
    for image, seed in zip(images, seeds):
        prompt = VlmPrompt(target.format_prompt(args.prompt, 1), [image])
        tokens, forwards, image_seconds = _hf_caption(target, prompt, sampling, args.max_new_tokens, seed, assistant)
        text = target.processor.tokenizer.decode([t for t in tokens if t not in set(target.eos_token_ids)], skip_special_tokens=True).strip()
        seconds += image_seconds
        record.captions.append(text)
        record.forwards.append(forwards)
        record.tokens.append(len(tokens))
        record.verifications += forwards - 1
        record.accepted_drafts += len(tokens) - forwards
    return seconds


def _engine_batch(record: MethodRecord, target: Any, args: argparse.Namespace, config: DecodeConfig, images: list, seeds: list[int],
                  device: str) -> float:
    """One batch through ``caption_images`` with ``config``, its target forwards timed apart from
    the rest of each step, added to ``record`` -> its seconds."""
    with _Timed(target, "forward", device) as target_timer:
        synchronize(device)
        begin = time.perf_counter()
        results = caption_images(images, prompt=args.prompt, model=target, decode=config, seeds=seeds, batch_size=args.batch)
        seconds = time.perf_counter() - begin
    record.target_seconds += target_timer.seconds
    record.target_calls += target_timer.calls
    record.draft_seconds += max(0.0, seconds - target_timer.seconds)
    for r in results:
        record.captions.append(r.caption)
        record.forwards.append(r.target_forwards)
        record.tokens.append(r.num_tokens)
        record.verifications += len(r.accepted_lengths)
        record.accepted_drafts += sum(r.accepted_lengths) - len(r.accepted_lengths)
    return seconds


def caption_summary(records: dict[str, MethodRecord]) -> dict[str, dict[str, float]]:
    """Per method: tokens per forward, τ, latency speedup vs AR (and vs ``hf_assisted`` when it ran),
    judge accuracy, and for the methods other than AR its difference from AR's paired by image."""
    ar = records["ar"]
    summary: dict[str, dict[str, float]] = {}
    for method, record in records.items():
        entry = {
            "tokens_per_forward": sum(record.tokens) / max(1, sum(record.forwards)),
            "tau": record.accepted_drafts / max(1, record.verifications),
            "latency_speedup": ar.seconds / record.seconds,
            "judge_accuracy": float(np.mean(record.scores)),
            "seconds": record.seconds,
            "tokens": sum(record.tokens),
        }
        if record.target_calls:
            # per step: everything outside target forwards (draft, verifier, bookkeeping) vs one target forward
            entry["overhead_per_step_vs_target_forward"] = (record.draft_seconds / max(1, record.target_calls)) / (record.target_seconds / record.target_calls)
        if "hf_assisted" in records:
            entry["latency_speedup_vs_hf_assisted"] = records["hf_assisted"].seconds / record.seconds
        if method != "ar":  # paired by image; SE None below 2 images
            entry["judge_accuracy_vs_ar"], entry["judge_accuracy_vs_ar_se"] = paired_difference(record.scores, ar.scores)
        summary[method] = entry
    return summary


def caption_table(summary: dict[str, dict[str, float]]) -> tuple[list[str], list[list[str]]]:
    """The printed table of ``caption_summary``: (header, one row per method)."""
    header = ["method", "tokens/fwd", "tau", "latency x AR", "x hf_assisted", "accuracy", "accuracy - AR (± SE)",
              "non-target step / target fwd"]
    rows = [
        [m, f"{e['tokens_per_forward']:.2f}", f"{e['tau']:.2f}", f"{e['latency_speedup']:.2f}",
         ratio_cell(e, "latency_speedup_vs_hf_assisted"), f"{e['judge_accuracy']:.3f}", difference_cell(e),
         f"{e['overhead_per_step_vs_target_forward']:.2f}" if "overhead_per_step_vs_target_forward" in e else "-"]
        for m, e in summary.items()
    ]
    return header, rows


def add_caption_parser(subparsers) -> None:
    parser = subparsers.add_parser("caption", help="AR / HF / HF assisted / EAGLE-2 / ViSpec on a VLM")
    parser.add_argument("--model", default="reference", help='"reference" or a local LLaVA / LLaVA-NeXT / Qwen2(.5)-VL folder')
    parser.add_argument("--methods", default="ar,hf_assisted,eagle,vispec", help="comma-separated subset of " + ",".join(ALL_METHODS))
    parser.add_argument("--images", type=positive_int, default=200, help="held-out shapes images")
    parser.add_argument("--offset", type=non_negative_int, default=0, help="first held-out image index")
    parser.add_argument(
        "--max-seconds", type=positive_float, default=None,
        help="stop taking new images once the measured loop has run this long; every method finishes the "
        "batch it is on, so all methods see the same images",
    )
    parser.add_argument("--prompt", default="describe the image .")
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument(
        "--batching", choices=["auto", "continuous", "consecutive"], default="auto",
        help="DecodeConfig.batching of ar / eagle / vispec: auto is continuous on a GPU and consecutive on a CPU",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when torch sees a GPU)")
    parser.add_argument(
        "--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
        help="precision of the eagle / vispec drafts and the hf_assisted assistant (auto: float32 on a CPU, "
        "--dtype on a GPU)",
    )
    parser.add_argument("--depth", type=positive_int, default=None, help="draft tree depth (default: DraftTreeConfig.for_temperature)")
    parser.add_argument("--top-k", type=positive_int, default=None, help="draft tree top-k (default: as --depth)")
    parser.add_argument("--total-tokens", type=positive_int, default=None, help="draft tree size, root included (default: as --depth)")
    parser.add_argument("--vispec-draft", type=Path, default=None, help="ViSpec draft folder (default: the shipped one)")
    parser.add_argument("--eagle-draft", type=Path, default=None, help="EAGLE draft folder (default: the shipped one)")
    parser.add_argument("--assistant", type=Path, default=None, help="assistant model folder for hf_assisted")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--json", type=json_path_arg, default=None)
    parser.set_defaults(bench=bench_caption)
