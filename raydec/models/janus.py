"""Adapter for Hugging Face ``JanusForConditionalGeneration`` text-to-image generation.

Covers Janus-1.3B, Janus-Pro-1B / 7B and the shipped reference model. It reproduces
``JanusForConditionalGeneration.generate(generation_mode="image")``:

- prefix: ``processor(text, generation_mode="image")`` ids (the processor appends the
  image-start token; the processor's chat template is applied first when it has one, as the
  Hugging Face example does), embedded with the text embeddings;
- unconditional (CFG) prefix: the same ids with every token but BOS and image-start replaced
  by the pad token (same length, all attended), or the ids of an explicit negative prompt;
- output tokens: VQ codebook ids ``0..codebook-1``, embedded by ``generation_embeddings`` +
  ``generation_aligner``; logits from ``generation_head`` (not the text ``lm_head``);
- CFG: ``u + s (c - u)`` on raw head logits (``ClassifierFreeGuidanceLogitsProcessor``), then
  temperature / top-k / top-p.

Positions: a row's prefix gets ``0..L-1`` and image tokens continue from ``L``: exactly
Hugging Face's positions for an unpadded prompt. (HF ``generate`` counts left padding into
positions, so HF's own batched output depends on its batch; ours does not.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from raydec.config import SamplingConfig
from raydec.models.attention import use_window_attention
from raydec.models.base import PromptInputs, WindowForward
from raydec.models.generation_config import sampling_from_generation_config
from raydec.models.image_gen import pixels_to_pil, prompt_texts, vq_for_decoding
from raydec.speculative.sampling import VocabConstraint

logger = logging.getLogger(__name__)

#: Janus's ``generate`` uses this guidance scale when the generation config has none
HF_DEFAULT_GUIDANCE = 5.0


class JanusT2ITarget(WindowForward):
    """``JanusForConditionalGeneration`` as a ``DecodingTarget`` over VQ codebook ids.

    use_chat_template: wrap prompts in the processor's chat template (None: when it has one).
    """

    def __init__(self, model: torch.nn.Module, processor: Any, use_chat_template: bool | None = None) -> None:
        self.model = model.eval()
        use_window_attention(model)  # grouped-query windows attend without repeating K/V
        self.window_decoder = model.model.language_model
        self.window_head = model.model.generation_head  # codebook logits
        self.processor = processor
        self.tokenizer = processor.tokenizer
        has_template = getattr(processor, "chat_template", None) is not None
        self.use_chat_template = has_template if use_chat_template is None else use_chat_template
        generation = model.generation_config
        extra = getattr(generation, "generation_kwargs", None) or {}
        self.bos_token_id = self._special_id(generation.bos_token_id, self.tokenizer.bos_token_id, "bos_token_id")
        self.pad_token_id = self._special_id(generation.pad_token_id, self.tokenizer.pad_token_id, "pad_token_id")
        self.boi_token_id = self._special_id(
            extra.get("boi_token_id"), self.tokenizer.convert_tokens_to_ids(processor.image_start_token), "boi_token_id"
        )
        rows, cols = (int(d) for d in model.model.vqmodel.quantize.quant_state_dims)
        self._grid = (rows, cols)
        hf_tokens = int(model.config.vision_config.num_image_tokens)
        if hf_tokens != rows * cols:
            raise ValueError(f"Janus config: vision num_image_tokens={hf_tokens} but the VQ grid is {rows}x{cols}")
        self._image_size = janus_image_size(model.config)

    @staticmethod
    def _special_id(primary: int | None, fallback: int | None, name: str) -> int:
        value = primary if primary is not None else fallback
        if value is None:
            raise ValueError(f"Janus checkpoint: no {name} in generation_config or tokenizer")
        return int(value)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, use_chat_template: bool | None = None, **kwargs: Any
    ) -> "JanusT2ITarget":
        """Load model and processor from a local folder (never downloads)."""
        from transformers import JanusForConditionalGeneration, JanusProcessor

        model = JanusForConditionalGeneration.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
        processor = JanusProcessor.from_pretrained(str(path), local_files_only=True)
        logger.info("loaded Janus text-to-image model from %s (%s)", path, dtype)
        return cls(model, processor, use_chat_template=use_chat_template)

    # -- DecodingTarget ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.model.model.generation_head.vision_head.out_features)

    def prompt_ids(self, text: str) -> torch.Tensor:
        """Prompt text -> the ids ``processor(..., generation_mode="image")`` gives. # [L]"""
        if self.use_chat_template:
            messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
        encoded = self.processor(text=[text], generation_mode="image", return_tensors="pt")
        return encoded["input_ids"][0].long()

    def unconditional_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """HF Janus's CFG row: every id but BOS and image-start -> pad. [L] -> [L]"""
        keep = (input_ids == self.bos_token_id) | (input_ids == self.boi_token_id)
        return input_ids.masked_fill(~keep, self.pad_token_id)

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        text, negative = prompt_texts(prompt)
        if unconditional and negative is not None:
            return PromptInputs(input_ids=self.prompt_ids(negative))
        ids = self.prompt_ids(text)
        return PromptInputs(input_ids=self.unconditional_ids(ids) if unconditional else ids)

    def embed_prompt_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        # [M, L] text ids -> [M, L, H]
        return self.model.get_input_embeddings()(input_ids.to(self.device))

    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        # [M, N] codebook ids -> [M, N, H]
        return self.model.prepare_embeddings_for_image_generation(tokens.to(self.device))

    # -- ImageGenerator ----------------------------------------------------------------------

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self._grid

    @property
    def layout_grid(self) -> tuple[int, int]:
        """(rows, tokens per row) in generation order: the image grid itself."""
        return self._grid

    @property
    def num_image_tokens(self) -> int:
        return self._grid[0] * self._grid[1]

    @property
    def image_size(self) -> tuple[int, int]:
        return self._image_size

    @property
    def sizes(self) -> str:
        height, width = self._image_size
        return f"{width}x{height} only"

    def with_size(self, width: int, height: int) -> "JanusT2ITarget":
        problem = janus_size_problem(self.model.config, width, height)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def eos_token_ids(self) -> Sequence[int]:
        return ()

    def vocab_constraint(self) -> VocabConstraint:
        """Every codebook id may be sampled; nothing is forced."""
        return VocabConstraint(allowed=torch.ones(self.vocab_size, dtype=torch.bool))

    def default_sampling(self) -> SamplingConfig:
        """The checkpoint's generation_config as HF Janus uses it (CFG on raw logits)."""
        return sampling_from_generation_config(self.model.generation_config, "logits", HF_DEFAULT_GUIDANCE)

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor) -> list[Image.Image]:
        """Codebook ids -> PIL images via ``decode_image_tokens``. tokens: [B, rows*cols]"""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"decode_tokens: expected [B, {self.num_image_tokens}] tokens, got {tuple(tokens.shape)}")
        vq_for_decoding(self.model.model.vqmodel)
        pixels = self.model.decode_image_tokens(tokens.to(self.device))  # [B, H, W, C]
        return pixels_to_pil(pixels, self.processor.image_processor, channels_last=True)


def janus_image_size(config: Any) -> tuple[int, int]:
    """(height, width) in pixels of a Janus image: its VQ grid times the decoder's upsampling."""
    side = int(config.vq_config.num_patches) * 2 ** (len(config.vq_config.channel_multiplier) - 1)
    return side, side


def janus_size_problem(config: Any, width: int, height: int) -> str | None:
    """Why a Janus of ``config`` cannot make ``width`` x ``height`` images, or None: it makes one size."""
    own_height, own_width = janus_image_size(config)
    if (height, width) != (own_height, own_width):
        return f"size: '{width}x{height}' is not a size this Janus makes: {own_width}x{own_height} only"
    return None
