"""The reference text-to-image model: a small, real ``JanusForConditionalGeneration``.

This module builds every piece of the model from scratch and holds the two training
forwards:

* the word-level tokenizer (``tokenizers`` WordLevel over the shapes vocabulary) and the
  ``JanusProcessor`` around it, so the loading path is the real Hugging Face one;
* the ``JanusConfig`` (tiny vision tower, a small VQ-VAE with downsample 4, a Llama language
  model and the generation head);
* the VQ's two training forwards and its initialisation (:mod:`raydec.reference.janus.pixels`);
* the language-model teacher-forcing loss over the image tokens, laid out exactly as
  ``JanusForConditionalGeneration.generate(generation_mode="image")`` lays out its
  conditional and unconditional (CFG) rows.

The training run lives in :mod:`raydec.reference.janus.train`, its loops in
:mod:`raydec.reference.janus.vq` and :mod:`raydec.reference.janus.lm`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    GenerationConfig,
    JanusConfig,
    JanusForConditionalGeneration,
    JanusImageProcessorPil,
    JanusProcessor,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

from raydec.reference.janus.pixels import init_vq_for_training

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
IMAGE_TOKEN = "<image_placeholder>"
BOI_TOKEN = "<begin_of_image>"
EOI_TOKEN = "<end_of_image>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN)

IMAGE_SIZE = 64
PATCH_SIZE = 4  # 64 / 4 = 16 x 16 = 256 image tokens, the VQ grid as well
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2


@dataclass
class T2IArchitecture:
    """Sizes of the reference Janus. Channel counts are multiples of 32 (GroupNorm 32)."""

    vq_base_channels: int = 32
    vq_channel_multiplier: tuple[int, ...] = (2, 2, 2)  # two downsamples: factor 4; >= 2 channels per GroupNorm group
    vq_num_res_blocks: int = 1
    vq_latent_channels: int = 64
    vq_embed_dim: int = 8
    vq_num_embeddings: int = 512
    lm_hidden_size: int = 192
    lm_num_layers: int = 6
    lm_num_heads: int = 3
    lm_intermediate_size: int = 576
    lm_max_positions: int = 512
    vision_hidden_size: int = 32


# ----------------------------------------------------------------------------- tokenizer


def build_tokenizer(vocabulary: Sequence[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocabulary`` plus the special tokens Janus needs.

    Pre-tokenisation matches ``shapes.words``: split on whitespace, and ``, . ?`` are
    tokens of their own. Every encoded text starts with ``<bos>`` (Janus's generate keeps
    BOS and the image-start token in the unconditional CFG row and pads the rest).
    """
    vocab: dict[str, int] = {}
    for token in list(SPECIAL_TOKENS) + [w for w in vocabulary if w not in SPECIAL_TOKENS]:
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[,.?]"), behavior="isolated")]
    )
    bos_id = vocab[BOS_TOKEN]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens={"image_token": IMAGE_TOKEN, "boi_token": BOI_TOKEN, "eoi_token": EOI_TOKEN},
        padding_side="left",
        model_max_length=256,
    )
    return tokenizer


def build_processor(tokenizer: PreTrainedTokenizerFast) -> JanusProcessor:
    """The real ``JanusProcessor``: pixels normalised to [-1, 1] at 64 x 64."""
    image_processor = JanusImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        min_size=4,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return JanusProcessor(image_processor=image_processor, tokenizer=tokenizer, num_image_tokens=NUM_IMAGE_TOKENS)


# ----------------------------------------------------------------------------- model


def build_config(tokenizer: PreTrainedTokenizerFast, arch: T2IArchitecture) -> JanusConfig:
    """A small but complete ``JanusConfig`` consistent with ``tokenizer``."""
    text_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.lm_hidden_size,
        intermediate_size=arch.lm_intermediate_size,
        num_hidden_layers=arch.lm_num_layers,
        num_attention_heads=arch.lm_num_heads,
        num_key_value_heads=arch.lm_num_heads,
        max_position_embeddings=arch.lm_max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    vision_config = dict(
        hidden_size=arch.vision_hidden_size,
        num_hidden_layers=1,
        num_attention_heads=1,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        mlp_ratio=2.0,
        projection_dim=arch.lm_hidden_size,
        depth=1,
        num_image_tokens=NUM_IMAGE_TOKENS,
    )
    vq_config = dict(
        embed_dim=arch.vq_embed_dim,
        num_embeddings=arch.vq_num_embeddings,
        latent_channels=arch.vq_latent_channels,
        base_channels=arch.vq_base_channels,
        channel_multiplier=list(arch.vq_channel_multiplier),
        num_res_blocks=arch.vq_num_res_blocks,
        num_patches=IMAGE_SIZE // PATCH_SIZE,
        projection_dim=arch.lm_hidden_size,
        image_token_embed_dim=arch.lm_hidden_size,
        num_hidden_layers=2,
    )
    return JanusConfig(
        text_config=text_config,
        vision_config=vision_config,
        vq_config=vq_config,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
    )


def build_generation_config(
    tokenizer: PreTrainedTokenizerFast, guidance_scale: float = 3.0, temperature: float = 1.0
) -> GenerationConfig:
    """Sampling defaults for ``generate(generation_mode="image")``."""
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=temperature,
        top_k=None,
        top_p=None,
        guidance_scale=guidance_scale,
        generation_kwargs={"boi_token_id": tokenizer.convert_tokens_to_ids(BOI_TOKEN)},
        max_length=512,
    )


def build_model(config: JanusConfig, seed: int) -> JanusForConditionalGeneration:
    """A freshly initialised model (deterministic given ``seed``), in train mode."""
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config)
    init_vq_for_training(model.model.vqmodel)
    model.train()  # the constructor leaves the VQ in eval mode
    return model


def count_parameters(module: torch.nn.Module) -> int:
    """Number of parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- LM


def unconditional_ids(input_ids: torch.Tensor, bos_token_id: int, boi_token_id: int, pad_token_id: int) -> torch.Tensor:
    """The CFG row exactly as HF Janus ``generate`` builds it: every token but BOS / BOI -> pad."""
    keep = (input_ids == bos_token_id) | (input_ids == boi_token_id)
    return input_ids.masked_fill(~keep, pad_token_id)


def image_token_hidden(
    model: JanusForConditionalGeneration,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    image_ids: torch.Tensor,
) -> torch.Tensor:
    """Teacher-forced last hidden states that predict every image token.

    prompt_ids / prompt_mask: ``[B, P]`` left-padded prompts ending in the image-start token
    (as the processor builds them in image mode); image_ids: ``[B, N]``. Position ids are the
    plain ``arange`` that HF Janus ``generate`` uses (it passes none). Returns ``[B, N, H]``:
    position ``i`` is the state the generation head reads to draw image token ``i``.
    """
    text_embeds = model.get_input_embeddings()(prompt_ids)  # [B, P, H]
    image_embeds = model.prepare_embeddings_for_image_generation(image_ids[:, :-1])  # [B, N-1, H]
    embeds = torch.cat([text_embeds, image_embeds], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(image_ids[:, :-1])], dim=1)
    hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    return hidden[:, prompt_ids.shape[1] - 1 :]


def image_token_logits(
    model: JanusForConditionalGeneration,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    image_ids: torch.Tensor,
) -> torch.Tensor:
    """Teacher-forced generation-head logits for every image token. # [B, N, K]

    Position ``i`` is the distribution of image token ``i`` (see :func:`image_token_hidden`).
    """
    return model.model.generation_head(image_token_hidden(model, prompt_ids, prompt_mask, image_ids))

