"""The shipped reference VLM (a small LLaVA) loads offline with the stock HF classes and captions."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR, DESCRIBE_INSTRUCTION, prompt_text

WEIGHTS = DEFAULT_WEIGHTS_DIR
SHIPPED = ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "processor_config.json", "chat_template.jinja", "MODEL_CARD.md", "loss_curve.png"]


@pytest.fixture(scope="module")
def vlm() -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    torch.set_num_threads(1)
    model = LlavaForConditionalGeneration.from_pretrained(str(WEIGHTS))
    processor = LlavaProcessor.from_pretrained(str(WEIGHTS))
    model.eval()
    return model, processor


def test_shipped_files_present_and_small() -> None:
    missing = [name for name in SHIPPED if not (WEIGHTS / name).is_file()]
    assert not missing, f"missing in {WEIGHTS}: {missing}"
    total = sum(p.stat().st_size for p in WEIGHTS.iterdir() if p.is_file())
    assert total <= 20 * 2**20, f"shipped VLM is {total / 2**20:.1f} MB (> 20 MB)"


def test_architecture_is_stock_llava(vlm) -> None:
    model, _ = vlm
    config = model.config
    assert config.model_type == "llava"
    assert config.vision_config.model_type == "clip_vision_model"
    assert config.text_config.model_type == "llama"
    assert config.text_config.num_hidden_layers >= 8
    assert type(model.model.vision_tower).__name__ == "CLIPVisionModel"
    assert type(model.model.language_model).__name__ == "LlamaModel"


def test_auto_processor_loads_offline() -> None:
    processor = AutoProcessor.from_pretrained(str(WEIGHTS))
    assert isinstance(processor, LlavaProcessor)


def test_processor_round_trip(vlm) -> None:
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, words

    model, processor = vlm
    sample = make_sample(HELD_OUT_SEED_START + 7)
    tokenizer = processor.tokenizer
    ids = tokenizer.encode(sample.description, add_special_tokens=False)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids).split() == words(sample.description)

    inputs = processor(text=[prompt_text()], images=[sample.image], return_tensors="pt")
    input_ids = inputs["input_ids"][0]
    n_image = int((input_ids == model.config.image_token_id).sum())
    patch = model.config.vision_config.patch_size
    assert n_image == model.config.image_seq_length == (64 // patch) ** 2
    assert input_ids[0] == tokenizer.bos_token_id
    text = tokenizer.decode(input_ids[input_ids != model.config.image_token_id], skip_special_tokens=False)
    assert text.split()[-1] == "ASSISTANT:" and DESCRIBE_INSTRUCTION in text
    expected = (sample.image.astype(np.float32) / 255 - 0.5) / 0.5  # [H, W, 3]
    pixels = inputs["pixel_values"][0].permute(1, 2, 0).numpy()
    assert pixels.shape == (64, 64, 3)
    np.testing.assert_allclose(pixels, expected, atol=1e-5)

    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": DESCRIBE_INSTRUCTION}]}]
    templated = processor.apply_chat_template(chat, add_generation_prompt=True)
    assert templated.split() == prompt_text().split()


def test_hf_generate_captions_held_out_images(vlm) -> None:
    from raydec.reference.judge import score_caption
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

    model, processor = vlm
    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(2)]
    inputs = processor(text=[prompt_text()] * 2, images=[s.image for s in samples], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=96, do_sample=False)  # [2, T + new]
    new_tokens = out[:, inputs["input_ids"].shape[1]:]
    assert (new_tokens == processor.tokenizer.eos_token_id).any(dim=1).all(), "caption did not finish"
    captions = processor.batch_decode(new_tokens, skip_special_tokens=True)
    scores = [score_caption(c, s.image) for c, s in zip(captions, samples)]
    # A caption written from the language prior alone scores about 0.3; these two images score 0.89 and 0.92.
    assert all(c.strip().endswith(".") for c in captions), captions
    assert min(scores) >= 0.8, list(zip(captions, scores))


def test_greedy_captions_of_200_held_out_images_score_at_least_0_9(vlm) -> None:
    from raydec.reference.llava.evaluate import evaluate_captions

    model, processor = vlm
    result = evaluate_captions(model, processor, n=200, batch_size=50, progress=False)  # ~10 s
    assert len(result.captions) == 200 and all(result.captions)
    assert result.accuracy >= 0.9, f"judge accuracy {result.accuracy:.4f} on 200 held-out images"


def test_caption_images_refuses_bad_input_by_name_and_reads_16_bit_images() -> None:
    from PIL import Image

    from raydec import api
    from raydec.reference.shapes import make_sample, to_pil

    target = api.load_target("reference", task="caption")
    image = to_pil(make_sample(1_000_000).image)
    greedy = {"method": "ar", "max_new_tokens": 4, "sampling": {"temperature": 0.0}}
    with pytest.raises(TypeError, match="batch_size must be an integer >= 1, got str: '2'"):
        api.caption_images([image], model=target, batch_size="2")
    for prompt in (None, b"hi"):
        with pytest.raises(TypeError, match="prompt must be a string or a list of strings"):
            api.caption_images([image], prompt=prompt, model=target)
    with pytest.raises(ValueError, match="model: a loaded VisionLanguageTarget is not a text-to-image target"):
        api.generate_images(["a red circle"], model=target)
    with pytest.raises(ValueError, match=r"images\[0\]: float pixels \(PIL mode 'F'\)"):
        api.caption_images([Image.fromarray(np.full((8, 8), 0.5, np.float32))], model=target, decode=greedy)
    # a 16-bit grey image is scaled to 8 bits, not clipped to white: it captions as its 8-bit twin
    grey8 = np.asarray(image.convert("L"))
    grey16 = Image.fromarray(grey8.astype(np.uint16) * 257)
    assert grey16.mode.startswith("I")
    twins = api.caption_images([grey16, Image.fromarray(grey8, mode="L")], model=target, decode=greedy)
    assert twins[0].tokens == twins[1].tokens


def test_a_draft_of_the_wrong_kind_is_refused_even_when_cached() -> None:
    from raydec import api
    from raydec.models.registry import resolve_draft_path
    from raydec.reference.shapes import make_sample, to_pil

    target = api.load_target("reference", task="caption")
    vision_draft = str(resolve_draft_path("reference", "vispec", None))
    image = to_pil(make_sample(1_000_000).image)
    decode = {"max_new_tokens": 4, "sampling": {"temperature": 0.0}, "draft_model": vision_draft}
    api.caption_images([image], model=target, decode={**decode, "method": "vispec"})  # loads and caches it
    with pytest.raises(ValueError, match="decode.method='eagle' needs a text-only draft"):
        api.caption_images([image], model=target, decode={**decode, "method": "eagle"})
