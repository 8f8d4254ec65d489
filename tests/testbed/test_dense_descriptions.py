"""Dense descriptions: every stated count and relation is true of the scene, the judge reads
them back (and marks a flipped one wrong), and a trained VLM's vocabulary grows to them without
moving an old id or changing what it computes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.judge import score_caption
from raydec.reference.llava.evaluate import CaptionEval, statement_summary
from raydec.reference.judge.relations import check_statements, verdicts_by_kind
from raydec.reference.judge.text import parse_text, sentences, statement_kind, word_kind
from raydec.reference.llava.model import VLMSizes, extend_vocabulary, prompt_text
from raydec.reference.llava.settings import TrainSettings
from raydec.reference.llava.train import run_training
from raydec.reference.shapes import HELD_OUT_SEED_START, SHAPES, ShapeObject, make_sample, vocabulary, words
from raydec.reference.shapes.dense import (
    DENSE_INSTRUCTION,
    RELATION_KINDS,
    dense_description,
    dense_vocabulary,
    describe_dense,
    relation,
)

SEEDS = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 150)


@pytest.fixture(scope="module")
def samples():
    return [make_sample(seed) for seed in SEEDS]


def test_dense_descriptions_are_long_seeded_and_varied(samples):
    lengths = {n: [len(words(dense_description(s))) for s in samples if len(s.objects) == n] for n in (1, 2, 3)}
    assert 120 <= np.median(lengths[3]) <= 250 and min(lengths[3]) >= 120 and max(lengths[3]) <= 290
    assert 80 <= np.median(lengths[2]) < 150 and max(lengths[1]) < 60
    assert dense_description(samples[0]) == dense_description(make_sample(samples[0].seed))
    three = next(s for s in samples if len(s.objects) == 3)
    texts = {describe_dense(three.objects, three.background, three.background_color, np.random.default_rng(k))
             for k in range(20)}
    assert len(texts) == 20  # order and phrasing drawn from the rng
    used = {w for s in samples for w in words(dense_description(s))} | set(words(DENSE_INSTRUCTION))
    assert used <= set(vocabulary()) | set(dense_vocabulary()) | {"describe"}


def test_counts_and_relations_follow_the_order_the_objects_were_named(samples):
    checked = 0
    for s in samples:
        text = dense_description(s)
        named = [o.shape for o in parse_text(text).objects]  # in order of mention
        if len(set(named)) < len(named) or len(named) < 2:
            continue
        described = []  # shapes of the object sentences so far
        for sentence in sentences(words(text)):
            shapes = [w for w in sentence if w in SHAPES]  # singular: no shape is repeated here
            kind = statement_kind(sentence)
            if kind is None and shapes:
                described.append(shapes[0])
            elif kind == "relation":  # right after its subject's sentence: "compared with <before> , <subject> ..."
                assert shapes == [described[-2], described[-1]] and sentence[:2] == ["compared", "with"], text
                checked += 1
            elif kind == "count" and shapes:  # values in order of first mention, after every object
                assert shapes == named == described, text
    assert checked > 2 * len(samples) // 3


def test_each_object_sentence_says_where_before_what(samples):
    for s in samples:
        for sentence in sentences(words(dense_description(s)))[1:]:
            if statement_kind(sentence) is None and sentence[0] != "it":  # an object's own sentence
                kinds = [word_kind(w) for w in sentence]
                assert kinds.index("position") < min(kinds.index(k) for k in ("colour", "shape")), sentence


def test_every_stated_count_and_relation_is_true_and_the_judge_reads_it(samples):
    statements = 0
    for s in samples:
        text = dense_description(s)
        verdicts = check_statements(sentences(words(text)), s.objects)
        assert all(verdicts), text
        statements += len(verdicts)
        assert score_caption(text, truth=s) == 1.0
        assert score_caption(text, image=s.image) == 1.0  # the judge's own reading of the image
        assert parse_text(text).objects and len(parse_text(text).objects) == len(s.objects)
    assert statements > 10 * len(samples)
    # llava.evaluate --dense's summary of the ground truth's own answers: every statement right
    truth = CaptionEval([s.seed for s in samples], [dense_description(s) for s in samples], [1.0] * len(samples),
                        [1.0] * len(samples), 0.0)
    counts, relations, firsts = re.findall(r"(\d+)/(\d+)", statement_summary(truth))
    assert all(right == total and int(total) > 0 for right, total in (counts, relations, firsts))


def test_a_flipped_relation_or_count_is_marked_wrong():
    a = ShapeObject("circle", "red", "large", "top left", "solid")
    b = ShapeObject("square", "blue", "small", "bottom right", "striped")
    objects = (a, b)
    assert [relation(k, a, b) for k in RELATION_KINDS] == ["left", "above", "larger", "different"]
    right = "the circle is to the left of the square and larger than it . one of them is red and one is blue ."
    wrong = "the circle is to the right of the square and larger than it . two of them are red ."
    assert check_statements(sentences(words(right)), objects) == [True, True, True, True]
    compared = "compared with the blue square , the red circle is above it , the same size as it and right of it ."
    assert check_statements(sentences(words(compared)), objects) == [True, False, False]
    assert check_statements(sentences(words(wrong)), objects) == [False, True, False]
    assert verdicts_by_kind(sentences(words(wrong)), objects) == {"count": [False], "relation": [False, True]}
    # an ambiguous or unknown reference makes the relation wrong, never raises
    assert check_statements(sentences(words("the shape is above the square .")), objects) == [False]
    assert statement_kind(words("behind them is a plain grey background")) is None
    assert [word_kind(w) for w in ("above", "same", "both", "than")] == ["relation", "relation", "count", "other"]


def test_extending_the_vocabulary_keeps_old_ids_and_outputs(tmp_path):
    tiny = VLMSizes(vision_hidden=32, vision_layers=1, vision_heads=2, vision_intermediate=64, text_hidden=48,
                    text_layers=1, text_heads=2, text_intermediate=96)
    run_training(TrainSettings(out_dir=tmp_path / "short", steps=1, batch_size=2, warmup=1, eval_n=0), tiny)
    model = LlavaForConditionalGeneration.from_pretrained(tmp_path / "short").eval()
    processor = LlavaProcessor.from_pretrained(tmp_path / "short")
    old_vocab = processor.tokenizer.get_vocab()
    image = make_sample(HELD_OUT_SEED_START).image
    inputs = processor(text=[prompt_text()], images=[image], return_tensors="pt")
    with torch.no_grad():
        before = model(**inputs).logits  # [1, T, V]
    model, extended = extend_vocabulary(model, processor, dense_vocabulary())
    vocab = extended.tokenizer.get_vocab()
    assert {w: vocab[w] for w in old_vocab} == old_vocab and len(vocab) == len(old_vocab) + len(
        [w for w in dense_vocabulary() if w not in old_vocab])
    assert "<unk>" not in extended.tokenizer.tokenize(prompt_text(DENSE_INSTRUCTION))
    with torch.no_grad():
        after = model(**extended(text=[prompt_text()], images=[image], return_tensors="pt")).logits
    torch.testing.assert_close(after[..., : before.shape[-1]], before, rtol=0, atol=0)

    # a phase with dense descriptions extends the saved model and trains on them
    dense = TrainSettings(out_dir=tmp_path / "dense", steps=1, batch_size=4, warmup=1, eval_n=0, dense_share=1.0,
                          max_positions=768, init_from=tmp_path / "short", first_step=1)
    run_training(dense, tiny)
    saved = LlavaForConditionalGeneration.from_pretrained(tmp_path / "dense")
    assert saved.config.text_config.vocab_size == len(vocab)
    assert saved.config.text_config.max_position_embeddings == 768
