"""The reference VLM: a small LLaVA (CLIP vision tower + Llama language model) for the shapes world.

This module builds the pieces (config, word-level tokenizer, processor, generation config) and
is the entry point of ``python -m raydec.reference.train vlm`` through :func:`train_vlm`.
The data and the training loop live in :mod:`raydec.reference.llava.train`.

Chat format (one image, one turn)::

    <bos> USER: <image>*64 describe the image . ASSISTANT: <description> <eos>
    <bos> USER: <image>*64 what colour is the circle ? ASSISTANT: red <eos>
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

logger = logging.getLogger(__name__)

DEFAULT_WEIGHTS_DIR = Path(__file__).parent.parent / "weights" / "vlm"

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
IMAGE_TOKEN = "<image>"
USER, ASSISTANT = "USER:", "ASSISTANT:"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, IMAGE_TOKEN, USER, ASSISTANT]
DESCRIBE_INSTRUCTION = "describe the image ."

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image> {% elif part['type'] == 'text' %}{{ part['text'] }} {% endif %}"
    "{% endfor %}"
    "{% else %}ASSISTANT: "
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    " <eos> "
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass(frozen=True)
class VLMSizes:
    """Architecture sizes of the reference VLM."""

    image_size: int = 64
    patch_size: int = 8
    vision_hidden: int = 128
    vision_layers: int = 3
    vision_heads: int = 4
    vision_intermediate: int = 512
    text_hidden: int = 192
    text_layers: int = 8
    text_heads: int = 4
    text_intermediate: int = 512
    max_positions: int = 256

    @property
    def num_image_tokens(self) -> int:
        """Image tokens per image (CLS dropped by the "default" feature strategy)."""
        return (self.image_size // self.patch_size) ** 2


def prompt_text(instruction: str = DESCRIBE_INSTRUCTION) -> str:
    """The un-expanded chat prompt for one image and one instruction (the processor expands <image>)."""
    return f"{USER} {IMAGE_TOKEN} {instruction} {ASSISTANT}"


def build_tokenizer(vocabulary: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocabulary`` plus the special and chat tokens.

    Normalisation and pre-tokenisation match ``shapes.words``: lower case, whitespace split,
    with ``,`` ``.`` ``?`` as separate tokens (special and chat tokens are matched first). A ``<bos>`` is prepended to every encoded sequence.
    """
    words = [w for w in dict.fromkeys(list(vocabulary) + DESCRIBE_INSTRUCTION.split()) if w not in SPECIAL_TOKENS]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[,.?]"), behavior="isolated")]
    )
    tok.add_special_tokens([PAD, BOS, EOS, UNK, IMAGE_TOKEN, USER, ASSISTANT])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
        padding_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    return fast


def extend_vocabulary(
    model: LlavaForConditionalGeneration, processor: LlavaProcessor, new_words: list[str]
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """Append the words of ``new_words`` the tokenizer lacks, keeping every existing id.

    The embedding and LM-head rows of the new ids are drawn from the mean and covariance of the
    existing rows (Hugging Face's ``resize_token_embeddings``, seeded by torch's global seed);
    nothing the model computes on old ids changes.
    Returns the model (resized in place) and a new processor with the extended tokenizer.
    """
    old = processor.tokenizer
    vocab = old.get_vocab()
    missing = [w for w in dict.fromkeys(new_words) if w not in vocab]
    if not missing:
        return model, processor
    ordered = sorted(vocab, key=vocab.get)
    tokenizer = build_tokenizer([w for w in ordered if w not in SPECIAL_TOKENS] + missing)
    if tokenizer.get_vocab() != {**vocab, **{w: len(vocab) + i for i, w in enumerate(missing)}}:
        raise RuntimeError("extending the vocabulary moved existing token ids")
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    extended = LlavaProcessor(
        image_processor=processor.image_processor,
        tokenizer=tokenizer,
        patch_size=processor.patch_size,
        vision_feature_select_strategy=processor.vision_feature_select_strategy,
        num_additional_image_tokens=processor.num_additional_image_tokens,
        chat_template=processor.chat_template,
        image_token=IMAGE_TOKEN,
    )
    return model, extended


def build_image_processor(sizes: VLMSizes) -> CLIPImageProcessorPil:
    """A CLIP image processor that keeps 64x64 images as they are: rescale to [0,1], normalise to [-1,1]."""
    side = sizes.image_size
    return CLIPImageProcessorPil(
        do_resize=True,  # a no-op at the native size; resizes other sizes instead of failing
        size={"height": side, "width": side},
        do_center_crop=False,
        crop_size={"height": side, "width": side},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )


def build_processor(vocabulary: list[str], sizes: VLMSizes) -> LlavaProcessor:
    """The LLaVA processor: expands each ``<image>`` into ``sizes.num_image_tokens`` image tokens."""
    return LlavaProcessor(
        image_processor=build_image_processor(sizes),
        tokenizer=build_tokenizer(vocabulary),
        patch_size=sizes.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def build_config(tokenizer: PreTrainedTokenizerFast, sizes: VLMSizes) -> LlavaConfig:
    """A small LLaVA config: CLIP vision tower, 2-layer GELU projector, deep narrow Llama."""
    vision = CLIPVisionConfig(
        hidden_size=sizes.vision_hidden,
        intermediate_size=sizes.vision_intermediate,
        num_hidden_layers=sizes.vision_layers,
        num_attention_heads=sizes.vision_heads,
        image_size=sizes.image_size,
        patch_size=sizes.patch_size,
        projection_dim=sizes.vision_hidden,
        num_channels=3,
        hidden_act="quick_gelu",
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes.text_hidden,
        intermediate_size=sizes.text_intermediate,
        num_hidden_layers=sizes.text_layers,
        num_attention_heads=sizes.text_heads,
        num_key_value_heads=sizes.text_heads,
        max_position_embeddings=sizes.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=sizes.num_image_tokens,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )


def build_generation_config(tokenizer: PreTrainedTokenizerFast, max_new_tokens: int = 96) -> GenerationConfig:
    """Greedy defaults; sampling callers pass ``do_sample=True`` themselves."""
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )


def build_model(processor: LlavaProcessor, sizes: VLMSizes, seed: int) -> LlavaForConditionalGeneration:
    """A freshly initialised model (seeded) with its generation config set."""
    import torch

    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(build_config(processor.tokenizer, sizes))
    model.generation_config = build_generation_config(processor.tokenizer)
    return model


def load_vlm(path: str | Path = DEFAULT_WEIGHTS_DIR) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """Load the shipped (or any saved) reference VLM and its processor from a local folder."""
    path = str(path)
    model = LlavaForConditionalGeneration.from_pretrained(path)
    processor = LlavaProcessor.from_pretrained(path)
    model.eval()
    return model, processor
