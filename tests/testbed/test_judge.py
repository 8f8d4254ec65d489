"""The classical judge: image parsing accuracy (clean and degraded), text parsing and scores."""

from __future__ import annotations

import logging
import random
from typing import Callable

import numpy as np
import pytest

from raydec.reference import shapes
from raydec.reference.judge import scene as judge_scene
from raydec.reference.judge import attribute_accuracy, score_caption, score_image
from raydec.reference.judge.image import parse_image
from raydec.reference.judge.text import parse_prompt, parse_text
from raydec.reference.shapes import HELD_OUT_SEED_START, ShapeObject, make_sample, render, to_pil

logger = logging.getLogger(__name__)
HELD_OUT = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 500)


def blur_and_quantise(image: np.ndarray) -> np.ndarray:
    """3 x 3 box blur (edges replicated), then 16 levels per channel: a stand-in for a VQ round trip."""
    padded = np.pad(image.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = image.shape[:2]
    blurred = sum(padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)) / 9.0
    return (np.round(blurred / 255.0 * 15.0) * 17.0).astype(np.uint8)


def replace_blocks(image: np.ndarray, seed: int, count: int = 3) -> np.ndarray:
    """Copy ``count`` random 4 x 4 blocks of another sample over the image: a few wrong tokens."""
    rng = np.random.default_rng(seed)
    donor = make_sample(seed + 7).image
    out = image.copy()
    for _ in range(count):
        by, bx, dy, dx = (4 * int(v) for v in rng.integers(0, 16, size=4))
        out[by : by + 4, bx : bx + 4] = donor[dy : dy + 4, dx : dx + 4]
    return out


@pytest.fixture(scope="module")
def held_out() -> list[shapes.ShapesSample]:
    return [make_sample(seed) for seed in HELD_OUT]


def _accuracy(
    samples: list[shapes.ShapesSample], degrade: Callable[[shapes.ShapesSample], np.ndarray],
) -> float:
    """Mean attribute accuracy of the judge on ``degrade(sample)`` images."""
    return float(np.mean([attribute_accuracy(parse_image(degrade(s)), s) for s in samples]))


def test_accuracy_on_held_out_ground_truth(held_out: list[shapes.ShapesSample]) -> None:
    accuracy = _accuracy(held_out, lambda s: s.image)
    logger.info("judge attribute accuracy, clean: %.4f", accuracy)
    assert accuracy >= 0.95


def test_accuracy_on_runs_textured_ground_truth() -> None:
    """The reference T2I model draws the "runs" texture: the judge must read it as well."""
    samples = [make_sample(seed, texture="runs") for seed in HELD_OUT]
    accuracy = _accuracy(samples, lambda s: s.image)
    logger.info("judge attribute accuracy, runs texture: %.4f", accuracy)
    assert accuracy >= 0.95
    noisy = [s for s in samples if s.background == "noisy"]
    assert noisy and all(parse_image(s.image).background == "noisy" for s in noisy)


def test_word_kind_names_what_the_parser_reads() -> None:
    from raydec.reference.judge.text import WORD_KINDS, word_kind

    assert [word_kind(w) for w in ("red", "crosses", "spotted", "little", "upper", "middle", "gray", "grainy", "two")] == [
        "colour", "shape", "fill", "size", "position", "position", "background", "background", "count"
    ]
    assert {word_kind(w) for w in ("there", "is", "a", ".", "with", "the")} == {"other"}
    sample = make_sample(HELD_OUT_SEED_START + 3)
    kinds = {word_kind(w) for w in shapes.words(sample.description)}
    assert kinds <= set(WORD_KINDS) and {"colour", "shape", "fill", "other"} <= kinds


def test_accuracy_after_blur_and_quantisation(held_out: list[shapes.ShapesSample]) -> None:
    accuracy = _accuracy(held_out, lambda s: blur_and_quantise(s.image))
    logger.info("judge attribute accuracy, 3x3 blur + 16 levels: %.4f", accuracy)
    assert accuracy >= 0.90


def test_accuracy_with_a_few_wrong_blocks(held_out: list[shapes.ShapesSample]) -> None:
    accuracy = _accuracy(held_out[:150], lambda s: replace_blocks(s.image, s.seed))
    assert accuracy >= 0.90


def test_ground_truth_prompts_and_captions_score_one(held_out: list[shapes.ShapesSample]) -> None:
    samples = held_out[:150]
    assert np.mean([score_image(s.image, s.prompt) for s in samples]) >= 0.98
    assert np.mean([score_caption(s.description, s.image) for s in samples]) >= 0.98
    assert all(score_caption(s.description, truth=s) == 1.0 for s in samples)


def test_mismatched_text_scores_clearly_lower(held_out: list[shapes.ShapesSample]) -> None:
    samples = held_out[:150]
    others = samples[1:] + samples[:1]
    own = np.mean([score_caption(s.description, s.image) for s in samples])
    foreign = np.mean([score_caption(o.description, s.image) for s, o in zip(samples, others)])
    assert foreign < own - 0.4
    own_prompt = np.mean([score_image(s.image, s.prompt) for s in samples])
    foreign_prompt = np.mean([score_image(s.image, o.prompt) for s, o in zip(samples, others)])
    assert foreign_prompt < own_prompt - 0.4


def test_text_parsing_recovers_every_template(held_out: list[shapes.ShapesSample]) -> None:
    for sample in held_out:
        prompt = parse_prompt(sample.prompt)
        assert prompt.objects == sample.objects
        assert (prompt.background, prompt.background_color) == (sample.background, sample.background_color)
        caption = parse_text(sample.description)
        assert sorted(caption.objects, key=POSITION_ORDER) == list(sample.objects), sample.description
        assert (caption.background, caption.background_color) == (sample.background, sample.background_color)
        assert caption.count == len(sample.objects)


def POSITION_ORDER(obj: ShapeObject) -> int:  # noqa: N802 - used as a sort key
    return shapes.POSITIONS.index(obj.position)


def test_partial_and_wrong_captions_score_in_between() -> None:
    sample = make_sample(HELD_OUT_SEED_START + 3)
    full = score_caption(sample.description, truth=sample)
    obj = sample.objects[0]
    partial = score_caption(f"there is a {obj.color} {obj.shape}.", truth=sample)
    wrong_colour = [c for c in shapes.COLORS if c != obj.color][0]
    wrong = score_caption(f"there is a {wrong_colour} {obj.shape}.", truth=sample)
    assert full == 1.0 and 0.0 < wrong < partial < full
    extra_objects = " a big red solid circle is in the middle. a small blue cross is at the top."
    hallucinated = sample.description + extra_objects
    assert score_caption(hallucinated, truth=sample) < full


@pytest.mark.parametrize(
    "caption",
    ["", "....", "???", "it is red.", "circle " * 40, "ünïcödé ; ! @@ 12", "the the the", None, 42],
)
def test_garbled_captions_score_low_and_never_raise(caption) -> None:
    sample = make_sample(HELD_OUT_SEED_START + 11)
    assert 0.0 <= score_caption(caption, sample.image) <= 0.35
    if isinstance(caption, str):
        assert 0.0 <= score_image(sample.image, caption) <= 1.0


def test_random_word_salad_scores_low(held_out: list[shapes.ShapesSample]) -> None:
    vocab = shapes.vocabulary()
    rng = random.Random(0)
    scores = [score_caption(" ".join(rng.choices(vocab, k=25)), truth=s) for s in held_out[:100]]
    assert np.mean(scores) < 0.3


def test_input_forms_and_sizes() -> None:
    sample = make_sample(HELD_OUT_SEED_START + 5)
    expected = parse_image(sample.image)
    assert expected.objects == sample.objects
    assert parse_image(to_pil(sample.image)) == expected
    assert parse_image(sample.image.astype(np.float32) / 255.0) == expected
    big = make_sample(sample.seed, image_size=128).image
    assert attribute_accuracy(parse_image(big), sample) >= 0.9


def test_empty_and_unusual_scenes() -> None:
    blank = render([], "gradient", "black", seed=0)
    scene = parse_image(blank)
    assert scene.objects == () and (scene.background, scene.background_color) == ("gradient", "black")
    every_cell = [ShapeObject("cross", "green", "large", p, "speckled") for p in shapes.POSITIONS]
    image = render(every_cell, "noisy", "white", seed=1)
    assert parse_image(image).objects == tuple(every_cell)


def test_attribute_accuracy_counts_missing_and_extra_objects() -> None:
    sample = make_sample(HELD_OUT_SEED_START)  # three objects
    truth = judge_scene.ParsedScene(sample.objects, sample.background, sample.background_color)
    assert attribute_accuracy(truth, sample) == 1.0
    missing = judge_scene.ParsedScene(sample.objects[1:], sample.background, sample.background_color)
    assert attribute_accuracy(missing, sample) == pytest.approx(12 / 17)
    extra_cell = next(p for p in shapes.POSITIONS if p not in {o.position for o in sample.objects})
    extra = ShapeObject("circle", "red", "small", extra_cell, "solid")
    more = judge_scene.ParsedScene((*sample.objects, extra), sample.background, "black")
    assert attribute_accuracy(more, sample) == pytest.approx(16 / 22)
