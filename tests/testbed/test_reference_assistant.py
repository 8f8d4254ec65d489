"""The shipped LLaVA assistant of the reference VLM loads by path and keeps HF assisted greedy generation exact."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.assistant.settings import DEFAULT_ASSISTANT_DIR
from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR, prompt_text
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

ASSISTANT = DEFAULT_ASSISTANT_DIR


@pytest.fixture(scope="module")
def models() -> tuple[LlavaForConditionalGeneration, LlavaForConditionalGeneration, LlavaProcessor]:
    torch.set_num_threads(1)
    target = LlavaForConditionalGeneration.from_pretrained(str(DEFAULT_WEIGHTS_DIR)).eval()
    assistant = LlavaForConditionalGeneration.from_pretrained(str(ASSISTANT)).eval()
    processor = LlavaProcessor.from_pretrained(str(ASSISTANT))
    return target, assistant, processor


def test_shipped_assistant_is_small_and_shares_the_vocabulary(models) -> None:
    target, assistant, processor = models
    total = sum(p.stat().st_size for p in ASSISTANT.iterdir() if p.is_file())
    assert total < 10 * 2**20, f"shipped assistant is {total / 2**20:.1f} MB"
    assert (ASSISTANT / "MODEL_CARD.md").is_file()
    assert assistant.config.text_config.num_hidden_layers <= 2
    assert assistant.config.text_config.vocab_size == target.config.text_config.vocab_size
    assert processor.tokenizer.get_vocab() == LlavaProcessor.from_pretrained(str(DEFAULT_WEIGHTS_DIR)).tokenizer.get_vocab()


@torch.no_grad()
def test_hf_assisted_greedy_equals_plain_greedy(models) -> None:
    target, assistant, processor = models
    for seed in (HELD_OUT_SEED_START, HELD_OUT_SEED_START + 1):
        inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
        plain = target.generate(**inputs, max_new_tokens=96, do_sample=False)
        assisted = target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=assistant)
        assert torch.equal(plain, assisted), f"seed {seed}: assisted output differs from plain greedy"
        assert plain.shape[1] > inputs["input_ids"].shape[1] + 5


def test_sampled_caption_rows_follow_their_seed_and_line_up_with_generate(models) -> None:
    from raydec.api import caption_images, load_target
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.reference.assistant.data import build_caption_set, teacher_logits
    from raydec.reference.assistant.settings import AssistantSettings
    from raydec.reference.llava.model import DESCRIBE_INSTRUCTION
    from raydec.reference.shapes import to_pil

    target, _, processor = models
    decoder = load_target(DEFAULT_WEIGHTS_DIR, task="caption")
    settings = AssistantSettings(first_seed=200_000, temperatures=(0.0, 1.0))
    seeds = list(range(200_000, 200_006))
    rows = build_caption_set(target, processor, seeds, question_share=0.0, batch_size=3, max_new_tokens=24,
                             temperature_of=settings.temperature_of, decoder=decoder)
    assert [r["seed"] for r in rows] == seeds
    assert [r["temperature"] for r in rows] == [0.0, 1.0] * 3

    # teacher forcing puts the logits where generate() recorded them: the greedy rows agree
    for row in rows[::2]:
        again = teacher_logits(target, processor, [row["seed"]], [DESCRIBE_INSTRUCTION], [row["answer_ids"].tolist()])[0]
        assert torch.equal(again["prompt_ids"], row["prompt_ids"])
        assert torch.allclose(again["logits"].float(), row["logits"].float(), atol=2e-2), row["seed"]
        assert torch.equal(row["logits"].float().argmax(-1), row["answer_ids"])

    # a sampled answer is the one raydec's AR sampler draws for that image's seed alone, in any batch
    decode = DecodeConfig(method="ar", max_new_tokens=24, sampling=SamplingConfig(temperature=1.0))
    differs = 0
    for row in rows[1::2]:
        seed = row["seed"]
        alone = caption_images([to_pil(make_sample(seed).image)], model=decoder, decode=decode, seeds=[seed])[0]
        assert row["answer_ids"].tolist() == alone.tokens, seed
        assert row["logits"].shape == (len(alone.tokens), target.config.text_config.vocab_size)
        greedy = target.generate(**processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt"),
                                 max_new_tokens=24, do_sample=False)
        differs += greedy[0, row["prompt_ids"].numel():].tolist() != alone.tokens
    assert differs >= 1, "every sampled answer equals the greedy one"

    with pytest.raises(ValueError, match="decoder"):
        build_caption_set(target, processor, seeds[:2], 0.0, 2, 8, temperature_of=settings.temperature_of)
    with pytest.raises(ValueError, match=r"temperatures\[1\]: -1.0"):
        AssistantSettings(temperatures=(0.0, -1.0))


def test_caption_batches_interleave_kinds_and_temperatures_so_a_cap_cuts_them_alike() -> None:
    from raydec.reference.assistant.data import caption_batches
    from raydec.reference.llava.model import DESCRIBE_INSTRUCTION

    question = "what colour is the circle?"
    jobs = [(s, DESCRIBE_INSTRUCTION, float(s % 2)) for s in range(16)] + [(100 + s, question, float(s % 2)) for s in range(4)]
    batches = caption_batches(jobs, batch_size=2, max_new_tokens=40)
    assert sorted(j for b, _, _ in batches for j in b) == sorted(jobs)
    groups = {}
    for batch, limit, temperature in batches:
        kinds = {(q == DESCRIBE_INSTRUCTION, t) for _, q, t in batch}
        assert kinds == {(limit == 40, temperature)}, batch  # one kind and one temperature, the kind's limit
        groups.setdefault(kinds.pop(), []).append(batch)
    sizes = {g: len(b) for g, b in groups.items()}
    assert sizes == {(True, 0.0): 4, (True, 1.0): 4, (False, 0.0): 1, (False, 1.0): 1}
    # stopping after any k batches has made each group's share of them, to within one batch
    for k in range(1, len(batches) + 1):
        for group, size in sizes.items():
            done = sum((q == DESCRIBE_INSTRUCTION, t) == group for b, _, _ in batches[:k] for _, q, t in b[:1])
            assert abs(done - k * size / len(batches)) <= 1, (k, group, done)
    assert {t for _, _, t in batches[:2]} == {0.0, 1.0}  # not all greedy batches first


def test_rewriting_the_card_keeps_its_history_and_says_how_answers_were_drawn(tmp_path) -> None:
    import json
    import shutil

    from raydec.reference.assistant.card import write_model_card

    folder = tmp_path / "assistant"
    shutil.copytree(ASSISTANT, folder)
    shipped = (folder / "MODEL_CARD.md").read_text()
    history = shipped[shipped.index("## History"):shipped.index("## Limits")].strip()
    log = json.loads((folder / "train_log.json").read_text())
    card = write_model_card(folder, log).read_text()
    assert history in card and card.index("## History") < card.index("## Limits")
    assert f"{log['caption_sampled']} sampled by raydec's AR decoder" in card and log["caption_sampled"] > 0

    log["settings"].pop("temperatures")  # a log from before the field: greedy answers only
    (folder / "MODEL_CARD.md").unlink()
    card = write_model_card(folder, log).read_text()
    assert "Greedy answers by HF `generate`" in card and "## History" not in card
