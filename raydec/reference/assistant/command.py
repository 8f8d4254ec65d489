"""A small LLaVA *assistant* for the reference VLM, for Hugging Face's own assisted generation.

``target.generate(**inputs, assistant_model=assistant)`` needs an assistant that shares the
target's tokenizer and processor. This module builds one from the shipped reference LLaVA
(``raydec/reference/weights/vlm``), distills it on the target's own answers (greedy, and with
``temperatures`` also sampled) and ships
it as a stock ``LlavaForConditionalGeneration`` folder with its processor and a model card:

- **build**: the target's config with ``num_hidden_layers`` = len(layers); the vision tower, the
  projector, the token embeddings, the final norm and the lm_head are copied from the target,
  and assistant layer ``i`` from target layer ``layers[i]`` (default: the first and the last).
- **captions**: the target answers held-in shapes-world images (seeds from ``first_seed``, all
  below :data:`~raydec.reference.shapes.HELD_OUT_SEED_START`), in batches: ``describe the
  image .`` or (a seeded share) one question of
  :func:`~raydec.reference.shapes.question_answers`. Each seed's answer is drawn at its
  ``temperature_of(seed)`` (``temperatures`` cycled over the seeds, default greedy only): greedy
  answers by HF ``generate``, sampled ones by raydec's AR decoder with a generator seeded by the
  image's seed (as the drafts' data), then one teacher-forced target forward for their logits.
  The answer tokens and the target's logits at every answer position are cached
  (``work_dir/captions-<target hash>.pt``).
- **distill**: teacher forcing on ``prompt + target answer``; loss on the answer positions only:
  cross-entropy on the target's answer tokens + ``kl_weight`` x KL(target || assistant) of the
  full next-token distributions. The vision tower stays frozen (it is the target's); the
  projector, embeddings, layers, norm and lm_head train. AdamW, warm-up + cosine.
- **measure**: on held-out images, batch 1, greedy: HF ``generate(assistant_model=...)`` vs plain
  ``generate``: identical outputs, wall-time ratio, target forwards (a forward hook) per token.

Everything is a pure function of the settings (data seeds, init, data order), except the time
cap. Entry point: ``python -m raydec.reference.train assistant [flags]``; re-measure a shipped
assistant with ``python -m raydec.reference.assistant.command measure [--n 50]``.

Modules: the settings and log are :mod:`raydec.reference.assistant.settings`, the captions
:mod:`raydec.reference.assistant.data`, build and distill
:mod:`raydec.reference.assistant.distill`, the measurement
:mod:`raydec.reference.assistant.measure`, the card :mod:`raydec.reference.assistant.card`;
this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Sequence

import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.assistant.card import write_model_card
from raydec.reference.assistant.distill import distill
from raydec.reference.assistant.measure import measure_assisted
from raydec.reference.assistant.settings import DEFAULT_ASSISTANT_DIR, AssistantSettings
from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR


def add_assistant_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m raydec.reference.train assistant``."""
    from raydec.reference.llava.draft_command import temperatures_arg

    d = AssistantSettings()
    parser.add_argument("--target", type=Path, default=d.target, help="the target LLaVA folder")
    parser.add_argument("--out", type=Path, default=d.out_dir, help="output folder (from_pretrained layout)")
    parser.add_argument("--work-dir", type=Path, default=d.work_dir, help="caption cache + resumable state (not shipped)")
    parser.add_argument("--layers", type=int, nargs="+", default=list(d.layers), help="target layers to copy (-1: last)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--num-captions", type=int, default=d.num_captions, help="held-in images the target answers")
    parser.add_argument("--first-seed", type=int, default=d.first_seed, help="first data seed (< 1,000,000)")
    parser.add_argument("--question-share", type=float, default=d.question_share)
    parser.add_argument("--temperatures", type=temperatures_arg, default=list(d.temperatures),
                        help="answer temperatures cycled over the seeds, e.g. 0,1 (default 0: greedy only)")
    parser.add_argument("--caption-batch-size", type=int, default=d.caption_batch_size)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--caption-max-minutes", type=float, default=d.caption_max_minutes)
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--warmup", type=int, default=d.warmup)
    parser.add_argument("--image-input", choices=("none", "pixels"), default=d.image_input,
                        help="none: train without pixel_values, as HF assisted generation runs the assistant")
    parser.add_argument("--kl-weight", type=float, default=d.kl_weight, help="weight of KL(target || assistant)")
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes, help="training time cap (0: off)")
    parser.add_argument("--anneal-on-time", action="store_true",
                        help="cosine progress = max(step / steps, elapsed / max-minutes): ends annealed at the time cap")
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--log-every", type=int, default=d.log_every)
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    parser.add_argument("--heldout-n", type=int, default=d.heldout_n)
    parser.add_argument("--eval-n", type=int, default=d.eval_n, help="held-out images of the final measurement")
    parser.add_argument("--tune-n", type=int, default=d.tune_n,
                        help="held-in images to pick draft length / confidence threshold on (0: HF defaults)")
    parser.add_argument("--resume", action="store_true", help="continue from work-dir/state.pt")


def distill_from_args(args: argparse.Namespace) -> Path:
    """Build :class:`AssistantSettings` from parsed flags and distill."""
    command = "python -m raydec.reference.train assistant " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    settings = AssistantSettings(
        target=args.target, out_dir=args.out, work_dir=args.work_dir, layers=tuple(args.layers), seed=args.seed,
        num_captions=args.num_captions, first_seed=args.first_seed, question_share=args.question_share,
        temperatures=tuple(args.temperatures),
        caption_batch_size=args.caption_batch_size, max_new_tokens=args.max_new_tokens,
        caption_max_minutes=args.caption_max_minutes, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        warmup=args.warmup, kl_weight=args.kl_weight, image_input=args.image_input, max_minutes=args.max_minutes, anneal_on_time=args.anneal_on_time, threads=args.threads,
        log_every=args.log_every, checkpoint_every=args.checkpoint_every, heldout_n=args.heldout_n,
        eval_n=args.eval_n, tune_n=args.tune_n, resume=args.resume, command=command.strip(),
    )
    return distill(settings)


def main(argv: Sequence[str] | None = None) -> None:
    """``measure``: re-measure a saved assistant against the target and (optionally) rewrite its card."""
    parser = argparse.ArgumentParser(prog="python -m raydec.reference.assistant.command")
    sub = parser.add_subparsers(dest="command", required=True)
    measure = sub.add_parser("measure", help="HF assisted vs plain generate on held-out images")
    measure.add_argument("--assistant", type=Path, default=DEFAULT_ASSISTANT_DIR)
    measure.add_argument("--target", type=Path, default=DEFAULT_WEIGHTS_DIR)
    measure.add_argument("--n", type=int, default=50)
    measure.add_argument("--max-new-tokens", type=int, default=96)
    measure.add_argument("--repeats", type=int, default=1, help="runs per image and side; the fastest is kept")
    measure.add_argument("--write-card", action="store_true", help="store the result in train_log.json and the card")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    target = LlavaForConditionalGeneration.from_pretrained(str(args.target)).eval()
    assistant = LlavaForConditionalGeneration.from_pretrained(str(args.assistant)).eval()
    processor = LlavaProcessor.from_pretrained(str(args.assistant))
    result = measure_assisted(target, assistant, processor, n=args.n, max_new_tokens=args.max_new_tokens,
                              repeats=args.repeats)
    summary = {k: v for k, v in result.items() if k != "per_image"}
    print(json.dumps(summary, indent=1))
    if args.write_card:
        log = json.loads((args.assistant / "train_log.json").read_text())
        if log.get("measurement"):
            earlier = {k: v for k, v in log["measurement"].items() if k != "per_image"}
            log.setdefault("earlier_measurements", []).append(earlier)
        log["measurement"] = result
        (args.assistant / "train_log.json").write_text(json.dumps(log, separators=(",", ":")))
        write_model_card(args.assistant, log)


if __name__ == "__main__":
    main()
