"""Tiny random checkpoints of the real Hugging Face VLM classes, saved and loaded by path.

Every builder writes a random float32 model of the real class plus a real processor built
offline (a word-level ``tokenizers`` tokenizer with the special tokens the processor needs, the
real image processor class at a small image size, a chat template) into ``folder`` with
``save_pretrained``, so ``VisionLanguageTarget.from_pretrained(folder)`` loads it by path.
The output head is scaled up: sharp logits make greedy decoding free of near-ties.

- ``build_tiny_llava``: the reference VLM's processor (64x64 CLIP images, 64 tokens each).
- ``build_tiny_llava_next``: any-resolution tiling (16x16 base tile, 8x8 patches, pinpoints up
  to 32x32); an image gives 4 base tokens plus 6 to 20 grid and newline tokens by aspect ratio.
- ``build_tiny_qwen2_vl`` / ``build_tiny_qwen2_5_vl`` / ``build_tiny_qwen3_vl``: 4x4 patches merged
  2x2 (one token per 8x8 pixels), images resized into 64 to 1024 pixels, so 1 to 16 tokens per
  image; M-RoPE (interleaved for Qwen3-VL, whose vision tower also feeds both decoder layers).
  The processor is saved without a video processor (``image_only_processor_class``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raydec.models.hf_vlm import VlmPrompt
from raydec.models.vispec_draft import DraftConfig, VispecDraft
from raydec.reference.shapes import make_sample, to_pil

REFERENCE_VLM = Path(__file__).resolve().parent.parent / "raydec" / "reference" / "weights" / "vlm"

#: scale of the output head: random logits become sharp, so greedy argmaxes are not near-ties
HEAD_SCALE = 20.0

#: plain words of the toy vocabularies (prompts use the first few)
WORDS = ["describe", "the", "image", ".", "what", "colour", "is", "it", "?", "a", "and", "of", "in", "picture"] + [
    f"w{i}" for i in range(90)
]

QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>",
]

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _sharpen_and_save(model: Any, folder: Path, eos_token_id: int, pad_token_id: int, dtype: torch.dtype) -> None:
    model = model.to(dtype).eval()
    with torch.no_grad():  # larger logits: sharper, less tie-prone random model
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.do_sample = False
    model.save_pretrained(folder)


def build_tiny_llava(folder: Path, seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Path:
    """Save a random ``LlavaForConditionalGeneration`` with the reference processor into ``folder``."""
    from transformers import AutoProcessor, LlavaConfig, LlavaForConditionalGeneration

    folder = Path(folder)
    reference = LlavaConfig.from_pretrained(REFERENCE_VLM)
    text = reference.text_config.to_dict()
    text.update(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)
    vision = reference.vision_config.to_dict()
    vision.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = LlavaConfig(
        text_config=text, vision_config=vision, image_token_index=reference.image_token_id,
        image_seq_length=reference.image_seq_length, projector_hidden_act="gelu",
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    _sharpen_and_save(model, folder, reference.text_config.eos_token_id, 0, dtype)
    AutoProcessor.from_pretrained(REFERENCE_VLM).save_pretrained(folder)
    return folder


def build_tiny_llava_next(folder: Path, seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Path:
    """Save a random ``LlavaNextForConditionalGeneration`` with a ``LlavaNextProcessor`` into ``folder``.

    Tokenizer and chat template are the reference VLM's (``<image>``, ``USER:``, ``ASSISTANT:``).
    """
    from transformers import (
        AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
        LlavaNextProcessor,
    )
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(REFERENCE_VLM)
    tile, patch = 16, 8
    pinpoints = [[16, 32], [32, 16], [32, 32]]
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template or (REFERENCE_VLM / "chat_template.jinja").read_text(),
        image_token="<image>",
    )
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=tile, patch_size=patch, projection_dim=32, hidden_act="quick_gelu")
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pinpoints, vision_feature_select_strategy="default", vision_feature_layer=-1,
        projector_hidden_act="gelu", image_seq_length=(tile // patch) ** 2, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config)
    with torch.no_grad():  # the newline embedding is zeros-initialised in some versions
        model.model.image_newline.normal_(0.0, 1.0)
    _sharpen_and_save(model, folder, tokenizer.eos_token_id, tokenizer.pad_token_id, dtype)
    processor.save_pretrained(folder)
    return folder


def build_qwen_tokenizer() -> Any:
    """A word-level tokenizer with Qwen's chat and vision special tokens (EOS ``<|im_end|>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(QWEN_SPECIALS + ["<unk>", "user", "assistant", "system"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[,.?]"), behavior="isolated")]
    )
    tok.add_special_tokens(QWEN_SPECIALS + ["<unk>"])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"},
        padding_side="left", model_max_length=512, clean_up_tokenization_spaces=False,
    )


def _build_tiny_qwen(folder: Path, version: str, seed: int, layers: int, dtype: torch.dtype) -> Path:
    import transformers
    from raydec.models.hf_vlm import image_only_processor_class
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    tokenizer = build_qwen_tokenizer()
    patch, merge, temporal = 4, 2, 2
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 64, "longest_edge": 1024}, patch_size=patch, merge_size=merge,
        temporal_patch_size=temporal, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )
    common = dict(in_channels=3, patch_size=patch, spatial_merge_size=merge, temporal_patch_size=temporal)
    if version == "3":  # interleaved M-RoPE; visual features also added after both decoder layers (DeepStack)
        text["rope_parameters"]["mrope_interleaved"] = True
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      num_position_embeddings=256, deepstack_visual_indexes=[0, 1], **common)
        names = ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor")
    elif version == "2":
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, **common)
        names = ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor")
    else:  # window attention over 2x2 merged tokens, one full-attention block
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      window_size=2 * patch * merge, fullatt_block_indexes=[1], **common)
        names = ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor")
    config_class, model_class, processor_class = (getattr(transformers, n) for n in names)
    config = config_class(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )
    # the real processor class less its video processor (whose classes need torchvision)
    processor = image_only_processor_class(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN_CHAT_TEMPLATE
    )
    torch.manual_seed(seed)
    model = model_class(config)
    _sharpen_and_save(model, folder, ids["<|im_end|>"], ids["<|endoftext|>"], dtype)
    processor.save_pretrained(folder)
    return folder


def build_tiny_qwen2_vl(folder: Path, seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Path:
    """Save a random ``Qwen2VLForConditionalGeneration`` with a ``Qwen2VLProcessor`` into ``folder``."""
    return _build_tiny_qwen(folder, "2", seed, layers, dtype)


def build_tiny_qwen2_5_vl(folder: Path, seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Path:
    """Save a random ``Qwen2_5_VLForConditionalGeneration`` with a ``Qwen2_5_VLProcessor`` into ``folder``."""
    return _build_tiny_qwen(folder, "2.5", seed, layers, dtype)


def build_tiny_qwen3_vl(folder: Path, seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Path:
    """Save a random ``Qwen3VLForConditionalGeneration`` with a ``Qwen3VLProcessor`` into ``folder``."""
    return _build_tiny_qwen(folder, "3", seed, layers, dtype)


def successor_draft(target: Any, references: list[list[int]], vision: bool, num_q: int = 3, seed: int = 0) -> Any:
    """A real ``VispecDraft`` set by hand so that the target accepts its drafts, without training.

    The target's greedy outputs (``references``) on tiny random weights run in short loops, so
    the token after a token is nearly a function of it. ``fc`` maps the embedding of the token
    the draft reads to the target's head row of that token's first successor in ``references``
    (least squares); the feature half of ``fc`` is zero. The decoder layer's attention and MLP
    outputs are scaled down to 1%, not removed, so the draft's cache and image tokens still run.
    """
    torch.manual_seed(seed)
    model = target.model
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    draft = VispecDraft(DraftConfig.for_target(model.config.get_text_config(), vision=vision, num_q=num_q))
    draft.attach_target(embed, head)
    successor: dict[int, int] = {}
    for tokens in references:
        for token, following in zip(tokens, tokens[1:]):
            successor.setdefault(token, following)
    read = sorted(successor)
    with torch.no_grad():
        inputs = embed.weight[read].float()                                   # [n, H]
        wanted = head.weight[[successor[t] for t in read]].float() * 4.0      # [n, H]
        fc_embed = torch.linalg.lstsq(inputs, wanted).solution.T             # [H, H]: fc(e) = fc_embed @ e
        hidden = draft.config.hidden_size
        draft.fc.weight.zero_()
        draft.fc.weight[:, :hidden].copy_(fc_embed)
        draft.fc.bias.zero_()
        layer = draft.decoder.layers[0]
        layer.self_attn.o_proj.weight.mul_(0.01)
        layer.mlp.down_proj.weight.mul_(0.01)
    return draft.to(target.dtype).eval()


def draft_for(target, vision: bool, seed: int = 0, dtype=None) -> VispecDraft:
    torch.manual_seed(seed)
    model = target.model
    text_config = model.config.get_text_config()
    draft = VispecDraft(DraftConfig.for_target(text_config, vision=vision, num_q=3))
    draft.attach_target(model.get_input_embeddings(), model.get_output_embeddings())
    return draft.to(dtype or target.dtype).eval()


def vispec_testbed(folder: Path, family: str, first_image: int, images: int, max_new_tokens: int) -> tuple[Any, list[Any], dict]:
    """A tiny float64 VLM of ``family`` ("llava" or "qwen2_5_vl") with a ViSpec draft saved beside it, ``images`` sample
    images from seed ``first_image`` on, and a sampled ViSpec decode config with a small draft tree."""
    from raydec.api import load_target  # lazy, as the tests that use it

    builder = {"llava": build_tiny_llava, "qwen2_5_vl": build_tiny_qwen2_5_vl}[family]
    target = load_target(str(builder(folder / family)), task="caption", dtype=torch.float64)
    draft_for(target, vision=True).save_pretrained(folder / "draft")
    pictures = [to_pil(make_sample(first_image + i).image) for i in range(images)]
    decode = {"method": "vispec", "draft_model": str(folder / "draft"), "max_new_tokens": max_new_tokens,
              "sampling": {"temperature": 1.0}, "draft_tree": {"depth": 3, "top_k": 2, "total_tokens": 6}}
    return target, pictures, decode


def vlm_prompts(target, count: int) -> list[VlmPrompt]:
    questions = ["describe the image .", "what colour is the circle ?", "how many objects are there ?", "describe it ."]
    prompts = []
    for i in range(count):
        images = [to_pil(make_sample(100 + i + j).image) for j in range(1 + i % 2)]
        prompts.append(VlmPrompt(target.format_prompt(questions[i % 4], len(images)), images))
    return prompts


def hf_greedy_vlm(target, prompt, max_new_tokens: int) -> list[int]:
    """Hugging Face ``generate(do_sample=False)`` on one VLM prompt (text only when it has no image)."""
    inputs = target.processor(text=[prompt.text], images=list(prompt.images) or None, return_tensors="pt")
    out = target.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def vlm_law(target, prompt: VlmPrompt, length: int, sampling: Any) -> torch.Tensor:
    """Exact law of the first ``length`` tokens the VLM samples after ``prompt`` under ``sampling``.
    -> [V] * length (float64)

    Each step's distribution comes from Hugging Face's own forward over the prompt and the prefix
    (its own multimodal merge and positions), processed as the engine processes logits; only
    prefixes of nonzero probability are enumerated, so a top-k keeps it small."""

    from raydec.speculative.sampling import process_logits

    base = dict(target.processor(text=[prompt.text], images=list(prompt.images) or None, return_tensors="pt"))
    vocab = target.vocab_size
    law = torch.zeros([vocab] * length, dtype=torch.float64)

    def next_probs(prefix: tuple[int, ...]) -> torch.Tensor:
        inputs = dict(base)
        extra = torch.tensor([list(prefix)], dtype=torch.long)
        inputs["input_ids"] = torch.cat([base["input_ids"], extra], 1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if "mm_token_type_ids" in base:
            inputs["mm_token_type_ids"] = torch.cat([base["mm_token_type_ids"], torch.zeros_like(extra)], 1)
        with torch.no_grad():
            logits = target.model(**inputs).logits[:, -1:].to(torch.float64)  # [1, 1, V]
        return process_logits(logits, sampling, 1, None, torch.full((1, 1), len(prefix)))[0, 0]

    frontier = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, mass in frontier.items():
            probs = next_probs(prefix)
            for token in probs.nonzero().flatten().tolist():
                grown[prefix + (token,)] = mass * float(probs[token])
        frontier = grown
    for sequence, mass in frontier.items():
        law[sequence] = mass
    assert abs(float(law.sum()) - 1.0) < 1e-9
    return law
