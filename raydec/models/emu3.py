"""Adapter for Hugging Face ``Emu3ForConditionalGeneration`` text-to-image generation (Emu3-Gen).

Emu3's image tokens live in the main vocabulary (``<|visual token NNNNNN|>``). An image of
``h x w`` tokens is generated after the prefix the processor builds with
``return_for_image_generation=True``::

    <bos> prompt <|image start|> h * w <|image token|>

as the layout

    (w visual tokens, <eol>) x h,  <eof>, <|image end|>, <eos>        # h * (w + 1) + 3 tokens

which Hugging Face's example enforces with ``prefix_allowed_tokens_fn``.

The engine's output space is only these tokens: the visual codes, then end-of-line, eof,
end-of-image, eos and pad (``output_token_ids``, K = codes + 5; 32,768 + 5 for Emu3-Gen, not
its 184,622-entry head). The output head is the LM head's rows for them (one gathered copy),
so logits, P, drafts and the verifier all work over K columns; ``to_vocab_ids`` maps tokens
back. The layout is a ``VocabConstraint`` over that space: ``allowed`` = the visual codes, and
``forced`` puts end-of-line after every row and eof / end-of-image / eos at the end, by
generated-token index.

CFG: Hugging Face's example runs ``UnbatchedClassifierFreeGuidanceLogitsProcessor`` (a second,
unbatched forward of the negative prompt; the mix ``u + s (c - u)`` on log-softmax scores).
We run the unconditional row batched beside the conditional one, mixed in "logprobs" space,
which is the same distribution. The unconditional prefix is the negative prompt (or the empty
prompt) with the same image header, as the original Emu3 code builds it.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from raydec.config import SamplingConfig
from raydec.models.attention import use_window_attention
from raydec.models.base import PromptInputs, SharedVocabularyForward
from raydec.models.generation_config import sampling_from_generation_config
from raydec.models.image_gen import CodesThenLayout, gathered_head, pixels_to_pil, prompt_texts, vq_for_decoding

logger = logging.getLogger(__name__)

EOL_TOKEN = "<|extra_200|>"


class Emu3Layout:
    """Forced tokens of an ``h x w`` Emu3 image by generated-token index (0-based).

    index i < h*(w+1):  end-of-line when (i + 1) % (w + 1) == 0, else a visual token
    h*(w+1) + 0, 1, 2:  eof, end-of-image, eos;  beyond: pad
    """

    def __init__(self, height: int, width: int, eol: int, eof: int, eoi: int, eos: int, pad: int) -> None:
        self.height, self.width = height, width
        self.eol, self.pad = eol, pad
        self.tail = torch.tensor([eof, eoi, eos], dtype=torch.long)

    @property
    def body_length(self) -> int:
        return self.height * (self.width + 1)

    @property
    def num_tokens(self) -> int:
        return self.body_length + len(self.tail)

    def __call__(self, gen_index: torch.Tensor) -> torch.Tensor:
        # gen_index [B, N] -> forced id or -1 [B, N]
        index = gen_index.long()
        forced = torch.full_like(index, -1)
        in_body = index < self.body_length
        forced[in_body & ((index + 1) % (self.width + 1) == 0)] = self.eol
        offset = index - self.body_length
        in_tail = (offset >= 0) & (offset < len(self.tail))
        forced[in_tail] = self.tail.to(index.device)[offset[in_tail]]
        forced[offset >= len(self.tail)] = self.pad
        return forced


class Emu3T2ITarget(CodesThenLayout, SharedVocabularyForward):  # visual and layout tokens share the text embeddings
    """``Emu3ForConditionalGeneration`` as a ``DecodingTarget`` over its image tokens (see the
    module docstring): engine tokens index ``output_token_ids``.

    ratio / image_area: the processor's generation size knobs (``"1:1"``, pixels); None keeps
    the processor's defaults. The token grid is ``processor.calculate_generate_size``.
    """

    def __init__(self, model: torch.nn.Module, processor: Any, ratio: str | None = None, image_area: int | None = None) -> None:
        self.model = model.eval()
        use_window_attention(model)  # grouped-query windows attend without repeating K/V
        self.window_decoder = model.model.text_model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        ratio = ratio or processor.ratio
        image_area = int(image_area or processor.image_area)
        height, width = processor.calculate_generate_size(ratio, image_area, processor.downsample_ratio)
        if height < 1 or width < 1:
            raise ValueError(f"Emu3: ratio={ratio!r}, image_area={image_area} gives an empty {height}x{width} grid")
        mapping = model.vocabulary_mapping
        tokenizer = self.tokenizer
        eol = mapping.eol_token_id if mapping.eol_token_id is not None else tokenizer.convert_tokens_to_ids(EOL_TOKEN)
        generation = model.generation_config
        eos = generation.eos_token_id if generation.eos_token_id is not None else tokenizer.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        pad = generation.pad_token_id if generation.pad_token_id is not None else tokenizer.pad_token_id
        self.visual_token_ids = torch.tensor(mapping.image_tokens, dtype=torch.long)
        layout_ids = [int(eol), int(tokenizer.eof_token_id), int(tokenizer.eoi_token_id), int(eos), int(pad)]
        self.output_token_ids = torch.cat([self.visual_token_ids, torch.tensor(layout_ids)])  # [K] vocabulary id of each output token
        codes = self.num_codes = len(self.visual_token_ids)
        # output-space ids of the layout tokens (pad may equal eos: the first match is taken)
        eol_o, eof_o, eoi_o, eos_o = codes, codes + 1, codes + 2, codes + 3
        pad_o = codes + 3 if int(pad) == int(eos) else codes + 4
        self._layout_ids = dict(eol=eol_o, eof=eof_o, eoi=eoi_o, eos=eos_o, pad=pad_o)
        self.window_head = gathered_head(model.lm_head, self.output_token_ids)
        self._output_ids_on: dict = {}
        self.pixels_per_token = emu3_pixels_per_token(model.config)
        _set_grid(self, int(height), int(width), ratio, image_area)
        self._default_size = self.image_size
        self._views: dict[tuple[int, int], Emu3T2ITarget] = {(width * self.pixels_per_token, height * self.pixels_per_token): self}
        # (width, height) in pixels -> the view making that size, one dict shared by every view

    @property
    def sizes(self) -> str:
        height, width = self._default_size
        return f"{emu3_sizes(self.model.config)}; its own size is {width}x{height}"

    def with_size(self, width: int, height: int) -> "Emu3T2ITarget":
        """A view of this model at ``width`` x ``height`` (the same weights and gathered head)."""
        if (width, height) in self._views:
            return self._views[(width, height)]
        problem = emu3_size_problem(self.model.config, width, height)
        if problem is not None:
            raise ValueError(f"{problem}; its own size is {self._default_size[1]}x{self._default_size[0]}")
        step = self.pixels_per_token
        rows, columns = height // step, width // step
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        view = copy.copy(self)
        downsample = self.processor.downsample_ratio  # the processor's knobs that give this grid back
        _set_grid(view, rows, columns, f"{columns}:{rows}", rows * columns * downsample * downsample)
        if view.processor.calculate_generate_size(view.ratio, view.image_area, downsample) != (rows, columns):
            raise ValueError(f"size: '{width}x{height}': the processor cannot lay out a {rows}x{columns} grid")
        if limit is not None and len(view.prompt_ids("")) + view.num_image_tokens > limit:
            raise ValueError(f"size: '{width}x{height}' needs {view.num_image_tokens} tokens, more than the model's "
                             f"{limit} positions leave; it makes {self.sizes}")
        self._views[(width, height)] = view
        return view

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, ratio: str | None = None,
        image_area: int | None = None, **kwargs: Any,
    ) -> "Emu3T2ITarget":
        """Load model and processor from a local folder (never downloads)."""
        from transformers import Emu3ForConditionalGeneration, Emu3Processor

        model = Emu3ForConditionalGeneration.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
        processor = Emu3Processor.from_pretrained(str(path), local_files_only=True)
        logger.info("loaded Emu3 text-to-image model from %s (%s)", path, dtype)
        return cls(model, processor, ratio=ratio, image_area=image_area)

    # -- DecodingTarget ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """K: the visual codes and the layout tokens."""
        return int(self.output_token_ids.shape[0])

    def to_vocab_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Output-space tokens -> the model's vocabulary ids (same shape)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        return self._output_ids(tokens.device)[tokens]

    def from_vocab_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's vocabulary ids -> output-space tokens (an id outside the space is an error)."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        lookup = torch.full((int(self.output_token_ids.max()) + 1,), -1, dtype=torch.long)
        lookup[self.output_token_ids.flip(0)] = torch.arange(len(self.output_token_ids) - 1, -1, -1)  # first match wins
        tokens = lookup[ids.clamp(0, len(lookup) - 1)]
        bad = (tokens < 0) | (ids >= len(lookup)) | (ids < 0)
        if bool(bad.any()):
            raise ValueError(f"tokens: vocabulary id {int(ids[bad][0])} is not an Emu3 image or layout token")
        return tokens

    def prompt_ids(self, text: str) -> torch.Tensor:
        """``processor(text, return_for_image_generation=True)`` ids: BOS, prompt, image header. # [L]"""
        encoded = self.processor(
            text=[text], return_for_image_generation=True, ratio=self.ratio, image_area=self.image_area,
            return_tensors="pt",
        )
        return encoded["input_ids"][0].long()

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        text, negative = prompt_texts(prompt)
        if unconditional:
            text = negative if negative is not None else ""
        return PromptInputs(input_ids=self.prompt_ids(text))

    # -- ImageGenerator ----------------------------------------------------------------------

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self._grid

    @property
    def layout_grid(self) -> tuple[int, int]:
        """(rows, tokens per row) in generation order: each row is w visual tokens + end-of-line."""
        return (self._grid[0], self._grid[1] + 1)

    @property
    def num_image_tokens(self) -> int:
        return self.layout.num_tokens

    @property
    def image_size(self) -> tuple[int, int]:
        return self._image_size

    def default_sampling(self) -> SamplingConfig:
        """The checkpoint's generation_config; CFG in log-softmax space (HF's unbatched CFG)."""
        return sampling_from_generation_config(self.model.generation_config, "logprobs")

    def image_token_grid(self, tokens: torch.Tensor) -> torch.Tensor:
        """Strip end-of-line and end tokens: [B, num_image_tokens] output tokens -> visual vocabulary ids [B, h, w]."""
        height, width = self._grid
        body = self.to_vocab_ids(tokens)[:, : self.layout.body_length]
        return body.view(-1, height, width + 1)[..., :width]

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor) -> list[Image.Image]:
        """Generated layout -> PIL images via ``decode_image_tokens``. tokens: [B, h*(w+1)+3] output tokens"""
        tokens = self.to_vocab_ids(tokens)
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"decode_tokens: expected [B, {self.num_image_tokens}] tokens, got {tuple(tokens.shape)}")
        height, width = self._grid
        vq_for_decoding(self.model.model.vqmodel)
        pixels = self.model.decode_image_tokens(image_tokens=tokens.to(self.device), height=height, width=width)
        return pixels_to_pil(pixels, self.processor.image_processor, channels_last=False)  # pixels [B, C, H, W]


def emu3_pixels_per_token(config: Any) -> int:
    """Pixels per side of the square one image token decodes to (the VQ decoder's upsampling)."""
    return 2 ** (len(config.vq_config.channel_multiplier) - 1)


def emu3_sizes(config: Any) -> str:
    """The sizes an Emu3 makes, in words."""
    step = emu3_pixels_per_token(config)
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    within = f", within its {limit} positions (a {step}-pixel square is a token)" if limit else ""
    return f"widths and heights in multiples of {step} pixels{within}"


def emu3_size_problem(config: Any, width: int, height: int) -> str | None:
    """Why an Emu3 of ``config`` cannot make ``width`` x ``height`` images, or None (positions aside)."""
    step = emu3_pixels_per_token(config)
    if width % step or height % step:
        return f"size: '{width}x{height}' is not a size this Emu3 makes: {emu3_sizes(config)}"
    return None


def _set_grid(target: Emu3T2ITarget, height: int, width: int, ratio: str, image_area: int) -> None:
    """Lay ``target`` (itself while it is built, or a view being made) out on an h x w token grid,
    with the processor knobs that give that grid in the prompt."""
    target.ratio, target.image_area = ratio, image_area
    target._grid = (height, width)
    target.layout = Emu3Layout(height, width, **target._layout_ids)
    target._image_size = (height * target.pixels_per_token, width * target.pixels_per_token)
