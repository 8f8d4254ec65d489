"""Greedy caption accuracy of the reference VLM on held-out shapes images, judged by the classical judge.

Usage::

    python -m raydec.reference.llava.evaluate --n 200 [--weights raydec/reference/weights/vlm] [--batch-size 50]

Captions come from Hugging Face's own batched ``generate(do_sample=False)``.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.judge import score_caption
from raydec.reference.judge.relations import verdicts_by_kind
from raydec.reference.judge.text import sentences
from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR, DESCRIBE_INSTRUCTION, load_vlm, prompt_text
from raydec.reference.shapes.dense import DENSE_INSTRUCTION
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, words

logger = logging.getLogger(__name__)


@dataclass
class CaptionEval:
    """Per-image captions and judge scores."""

    seeds: list[int]
    captions: list[str]
    scores: list[float]  # judge reading the image (the reported number)
    truth_scores: list[float]  # judge against the generator's ground-truth scene (diagnostic)
    seconds: float

    @property
    def accuracy(self) -> float:
        """Mean attribute accuracy over the images."""
        return float(sum(self.scores) / max(len(self.scores), 1))

    @property
    def truth_accuracy(self) -> float:
        """Mean attribute accuracy against the ground-truth scenes."""
        return float(sum(self.truth_scores) / max(len(self.truth_scores), 1))


@torch.no_grad()
def generate_captions(
    model: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    images: list,
    max_new_tokens: int = 96,
    instruction: str = DESCRIBE_INSTRUCTION,
) -> list[str]:
    """Greedy answers to ``instruction`` for ``images`` (uint8 [H, W, 3] arrays or PIL images), one batched generate."""
    inputs = processor(text=[prompt_text(instruction)] * len(images), images=images, return_tensors="pt", padding=True)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)  # [B, T + new]
    new_tokens = out[:, inputs["input_ids"].shape[1] :]
    return [c.strip() for c in processor.batch_decode(new_tokens, skip_special_tokens=True)]


def evaluate_captions(
    model: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    n: int = 200,
    batch_size: int = 50,
    first_seed: int = HELD_OUT_SEED_START,
    progress: bool = True,
    dense: bool = False,
) -> CaptionEval:
    """Caption ``n`` held-out images (seeds from ``first_seed``) greedily and score them with the judge.

    ``dense``: ask for dense descriptions (``shapes.dense.DENSE_INSTRUCTION``, up to 300 tokens).
    """
    instruction, budget = (DENSE_INSTRUCTION, 300) if dense else (DESCRIBE_INSTRUCTION, 96)
    was_training = model.training
    model.eval()
    seeds = list(range(first_seed, first_seed + n))
    captions: list[str] = []
    scores: list[float] = []
    truth_scores: list[float] = []
    start = time.perf_counter()
    for lo in tqdm(range(0, n, batch_size), desc="caption eval", disable=not progress):
        samples = [make_sample(s) for s in seeds[lo : lo + batch_size]]
        batch_captions = generate_captions(model, processor, [s.image for s in samples], budget, instruction)
        captions.extend(batch_captions)
        scores.extend(float(score_caption(c, s.image)) for c, s in zip(batch_captions, samples))
        truth_scores.extend(float(score_caption(c, truth=s)) for c, s in zip(batch_captions, samples))
    if was_training:
        model.train()
    return CaptionEval(seeds, captions, scores, truth_scores, time.perf_counter() - start)


def statement_summary(result: CaptionEval) -> str:
    """How many of the captions' count clauses and relations are true of the ground-truth scenes,
    and in how many answers with relations the first one is (a wrong first relation tends to be
    copied into the rest of a greedy answer)."""
    tally = {"count": [0, 0], "relation": [0, 0]}
    first_right = answers = 0
    for seed, caption in zip(result.seeds, result.captions):
        verdicts = verdicts_by_kind(sentences(words(caption)), make_sample(seed).objects)
        for kind, said in verdicts.items():
            tally[kind][0] += sum(said)
            tally[kind][1] += len(said)
        if verdicts["relation"]:
            answers += 1
            first_right += verdicts["relation"][0]
    parts = [f"{kind} statements right {right}/{total}" for kind, (right, total) in tally.items()]
    return "against the ground truth: " + ", ".join(parts) + f"; first relation right in {first_right}/{answers} answers"


def main(argv: list[str] | None = None) -> None:
    """Print the greedy caption accuracy of a saved VLM on held-out images."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS_DIR, help="saved model folder")
    parser.add_argument("--n", type=int, default=200, help="held-out images")
    parser.add_argument("--batch-size", type=int, default=50, help="images per generate() call")
    parser.add_argument("--first-seed", type=int, default=HELD_OUT_SEED_START, help="first held-out seed")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--show", type=int, default=3, help="example captions to print")
    parser.add_argument("--dense", action="store_true", help="dense descriptions ('describe the image in detail .')")
    parser.add_argument("--write-card", action="store_true", help="(re)write MODEL_CARD.md in --weights with the result")
    parser.add_argument("--card-note", default="", help="free text added to the card's evaluation section")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    model, processor = load_vlm(args.weights)
    result = evaluate_captions(model, processor, args.n, args.batch_size, args.first_seed, dense=args.dense)
    for seed, caption, score in list(zip(result.seeds, result.captions, result.scores))[: args.show]:
        print(f"seed {seed} score {score:.3f}: {caption}")
    perfect = sum(s >= 0.999 for s in result.scores)
    if args.dense:
        print(statement_summary(result))
    print(
        f"greedy {'dense ' if args.dense else ''}caption accuracy on {args.n} held-out images: {result.accuracy:.4f} "
        f"(perfect captions: {perfect}/{args.n}; against ground-truth scenes: {result.truth_accuracy:.4f}; "
        f"{result.seconds:.1f} s)"
    )
    if args.write_card:
        from raydec.reference.llava.card import write_model_card

        examples = [
            {"seed": seed, "caption": caption, "score": score}
            for seed, caption, score in list(zip(result.seeds, result.captions, result.scores))[: args.show]
        ]
        evaluation = {
            "n": args.n,
            "first_seed": args.first_seed,
            "accuracy": result.accuracy,
            "truth_accuracy": result.truth_accuracy,
            "perfect": perfect,
            "seconds": result.seconds,
            "examples": examples,
            "note": args.card_note,
        }
        print(f"wrote {write_model_card(args.weights, evaluation)}")


if __name__ == "__main__":
    main()
