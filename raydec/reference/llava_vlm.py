"""The reference VLM: a small LLaVA (CLIP vision tower + Llama language model) for the shapes world.

This module builds the pieces (config, word-level tokenizer, processor, generation config) and
is the entry point of ``python -m raydec.reference.train vlm`` through :func:`train_vlm`.
The data and the training loop live in :mod:`raydec.reference.llava_vlm_train`.

Chat format (one image, one turn)::

    <bos> USER: <image>*64 describe the image . ASSISTANT: <description> <eos>
    <bos> USER: <image>*64 what colour is the circle ? ASSISTANT: red <eos>
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

DEFAULT_WEIGHTS_DIR = Path(__file__).parent / "weights" / "vlm"

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
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    return fast


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


def add_vlm_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags of ``python -m raydec.reference.train vlm``."""
    group = parser.add_argument_group("vlm")
    group.add_argument("--vlm-out", type=Path, default=DEFAULT_WEIGHTS_DIR, help="output folder for the weights")
    group.add_argument("--vlm-steps", type=int, default=2400, help="optimizer steps")
    group.add_argument("--vlm-batch-size", type=int, default=16, help="sequences per step")
    group.add_argument("--vlm-lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    group.add_argument("--vlm-warmup", type=int, default=150, help="linear warm-up steps")
    group.add_argument("--vlm-seed", type=int, default=0, help="seed of initialisation and data order")
    group.add_argument("--vlm-question-share", type=float, default=0.25, help="share of question samples")
    group.add_argument("--vlm-patch-loss", type=float, default=0.5, help="weight of the auxiliary patch-word loss")
    group.add_argument("--vlm-vision-lr-mult", type=float, default=1.0,
                       help="learning-rate multiplier of the vision tower and projector")
    group.add_argument("--vlm-projector-in-lr-mult", type=float, default=1.0,
                       help="extra learning-rate multiplier of the projector's first linear layer")
    group.add_argument("--vlm-revive-projector", action="store_true",
                       help="re-initialise dead projector units at the start (function-preserving)")
    group.add_argument("--vlm-projector-probe", type=float, default=0.0,
                       help="weight of a training-only probe reading patch words from the projector output (0: off)")
    group.add_argument("--vlm-focus-questions", action="store_true",
                       help="questions only about an object's colour, shape or fill")
    group.add_argument("--vlm-eval-every", type=int, default=300, help="steps between checkpoints + quick evals")
    group.add_argument("--vlm-eval-n", type=int, default=24, help="held-out images per quick eval")
    group.add_argument("--vlm-max-minutes", type=float, default=0.0, help="stop early after this wall time (0: off)")
    group.add_argument("--vlm-stop-after", type=int, default=0,
                       help="stop after this many steps of the phase, keeping the --vlm-steps schedule (0: off)")
    group.add_argument("--vlm-init-from", type=Path, default=None, help="continue from this saved checkpoint")
    group.add_argument("--vlm-first-step", type=int, default=0, help="global step of this phase's first batch")
    group.add_argument("--vlm-refine-patches", type=int, default=0,
                       help="with --vlm-init-from: make its image patches this many times finer first (0: off)")
    group.add_argument("--vlm-recipe", type=Path, default=None,
                       help="retrain from scratch by replaying every phase recorded in this train_log.json "
                            "(e.g. raydec/reference/weights/vlm/train_log.json); other training flags are ignored")
    group.add_argument("--vlm-threads", type=int, default=1, help="torch CPU threads")
    group.add_argument("--vlm-bf16", action="store_true", help="bf16 autocast (slower than float32 on CPUs without bf16 units)")
    group.add_argument("--vlm-text-layers", type=int, default=VLMSizes.text_layers)
    group.add_argument("--vlm-text-hidden", type=int, default=VLMSizes.text_hidden)
    group.add_argument("--vlm-text-intermediate", type=int, default=VLMSizes.text_intermediate)
    group.add_argument("--vlm-vision-layers", type=int, default=VLMSizes.vision_layers)


def _get(args: Any, name: str, default: Any) -> Any:
    """Read ``args.<name>`` with a default, so a bare Namespace from another CLI also works."""
    return getattr(args, name, default) if args is not None else default


def train_vlm(args: Any = None) -> Path:
    """Train the reference VLM from scratch and save it; returns the output folder."""
    from raydec.reference.llava_vlm_train import TrainSettings, replay_recipe, run_training

    recipe = _get(args, "vlm_recipe", None)
    if recipe is not None:
        return replay_recipe(Path(recipe), Path(_get(args, "vlm_out", DEFAULT_WEIGHTS_DIR)))

    sizes = VLMSizes(
        text_layers=_get(args, "vlm_text_layers", VLMSizes.text_layers),
        text_hidden=_get(args, "vlm_text_hidden", VLMSizes.text_hidden),
        text_intermediate=_get(args, "vlm_text_intermediate", VLMSizes.text_intermediate),
        vision_layers=_get(args, "vlm_vision_layers", VLMSizes.vision_layers),
    )
    defaults = TrainSettings()
    settings = TrainSettings(
        out_dir=Path(_get(args, "vlm_out", defaults.out_dir)),
        steps=_get(args, "vlm_steps", defaults.steps),
        batch_size=_get(args, "vlm_batch_size", defaults.batch_size),
        lr=_get(args, "vlm_lr", defaults.lr),
        warmup=_get(args, "vlm_warmup", defaults.warmup),
        seed=_get(args, "vlm_seed", defaults.seed),
        question_share=_get(args, "vlm_question_share", defaults.question_share),
        patch_loss_weight=_get(args, "vlm_patch_loss", defaults.patch_loss_weight),
        vision_lr_mult=_get(args, "vlm_vision_lr_mult", defaults.vision_lr_mult),
        focus_questions=_get(args, "vlm_focus_questions", defaults.focus_questions),
        projector_in_lr_mult=_get(args, "vlm_projector_in_lr_mult", defaults.projector_in_lr_mult),
        revive_projector=_get(args, "vlm_revive_projector", defaults.revive_projector),
        projector_probe_weight=_get(args, "vlm_projector_probe", defaults.projector_probe_weight),
        stop_after=_get(args, "vlm_stop_after", defaults.stop_after),
        eval_every=_get(args, "vlm_eval_every", defaults.eval_every),
        eval_n=_get(args, "vlm_eval_n", defaults.eval_n),
        max_minutes=_get(args, "vlm_max_minutes", defaults.max_minutes),
        threads=_get(args, "vlm_threads", defaults.threads),
        bf16=_get(args, "vlm_bf16", False),
        init_from=_get(args, "vlm_init_from", None),
        first_step=_get(args, "vlm_first_step", 0),
        refine_patches=_get(args, "vlm_refine_patches", 0),
    )
    return run_training(settings, sizes)
