"""Adapter for Lumina-mGPT and other Chameleon-architecture text-to-image checkpoints
(``ChameleonForConditionalGeneration``), with our VQ-GAN decoder (``raydec.models.vqgan``).

Transformers' Chameleon sets the logits of every image token to the minimum (it generates text
only) and has no image decoder. The language model is used as it is; the logits come from our
own gather of the output head's rows, over the output space:

    output tokens:  0 .. C-1   the image codes' tokens (``vocabulary_mapping.image_tokens``, code order)
                    C          end of line        (``<reserved08799>``)
                    C + 1      end of image       (``<eoss>``)

An image is laid out as Lumina-mGPT generates it: ``<racm3:break>``, a height and a width token
(``<reserved{8800 + n}>``, n in 32-pixel grid cells), ``h`` rows of ``w`` image tokens each
followed by an end of line, then the end of image, where ``h``, ``w`` = 2 x the grid cells (a
token covers 16 pixels). The start and the two size tokens end the prompt (the size is the
request's), so the generated tokens are the rows and the end of image; ``forced`` puts the end
of line and the end of image by index.

Prompt: the conversation Lumina-mGPT was trained on, ``BOS + "Generate an image of {W}x{H}
according to the following prompt:\\n{text}" + <reserved08706>`` and the image header. CFG runs
the unconditional row on the image header alone (Lumina-mGPT's unconditional context starts at
the image start), or on a negative prompt's conversation and header; the mix is in logit space.

The VQ-GAN: ``vqgan.yaml`` and ``vqgan.ckpt`` (or ``vqgan.safetensors``) in ``vqgan/`` inside the
checkpoint folder, or the folder ``vqgan_path`` names (Lumina-mGPT keeps Meta's files in
``ckpts/chameleon/tokenizer/``).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from raydec.config import SamplingConfig
from raydec.models.attention import use_window_attention
from raydec.models.base import PromptInputs, SharedVocabularyForward
from raydec.models.generation_config import sampling_from_generation_config
from raydec.models.image_gen import CodesThenLayout, gathered_head, prompt_texts
from raydec.models.vqgan import VQGanDecoder

logger = logging.getLogger(__name__)

IMAGE_START, IMAGE_END, END_OF_LINE, TURN_END = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
GRID_PIXELS = 32  # a size token counts 32-pixel cells; a cell is 2 x 2 image tokens
TOKENS_PER_CELL = 2
PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{text}"
DEFAULT_SIZE = (512, 512)  # (width, height): Lumina-mGPT's 512 checkpoints; pass size for the 768 / 1024 ones
DEFAULT_GUIDANCE, DEFAULT_TOP_K = 3.0, 2000  # Lumina-mGPT's image generation defaults


def size_token(cells: int) -> str:
    """The token that states a side of ``cells`` 32-pixel cells."""
    return f"<reserved{8800 + cells:05d}>"


class ChameleonLayout:
    """Forced tokens of an ``h x w``-token image by generated-token index: end of line where
    ``(i + 1) % (w + 1) == 0`` below ``h * (w + 1)``, the end of image at ``h * (w + 1)``."""

    def __init__(self, height: int, width: int, eol: int, end: int) -> None:
        self.height, self.width, self.eol, self.end = height, width, eol, end

    @property
    def num_tokens(self) -> int:
        return self.height * (self.width + 1) + 1

    def __call__(self, gen_index: torch.Tensor) -> torch.Tensor:
        """gen_index [B, N] -> forced output ids [B, N] (-1: free)"""
        body = self.height * (self.width + 1)
        forced = torch.full_like(gen_index, -1)
        forced = torch.where((gen_index < body) & ((gen_index + 1) % (self.width + 1) == 0), torch.full_like(gen_index, self.eol), forced)
        return torch.where(gen_index == body, torch.full_like(gen_index, self.end), forced)


class ChameleonT2ITarget(CodesThenLayout, SharedVocabularyForward):
    """``ChameleonForConditionalGeneration`` (Lumina-mGPT) as a ``DecodingTarget`` over its image
    tokens; ``vqgan`` decodes them. size: (width, height) in pixels, multiples of 32."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, vqgan: VQGanDecoder, size: tuple[int, int] = DEFAULT_SIZE) -> None:
        self.model = model.eval()
        use_window_attention(model)  # grouped-query windows attend without repeating K/V
        self.window_decoder = model.model
        self.tokenizer = tokenizer
        self.vqgan = vqgan
        mapping = model.model.vocabulary_mapping
        codes = sorted(mapping.bpe2img.items(), key=lambda item: item[1])  # (token id, code) in code order
        if [code for _, code in codes] != list(range(len(codes))):
            raise ValueError("Chameleon checkpoint: its image tokens do not name codes 0..N-1")
        ids = {name: tokenizer.convert_tokens_to_ids(name) for name in (IMAGE_START, IMAGE_END, END_OF_LINE, TURN_END)}
        unknown = [name for name, value in ids.items() if value is None or value == tokenizer.unk_token_id]
        if unknown:
            raise ValueError(f"Chameleon checkpoint: its tokenizer lacks {unknown} (Lumina-mGPT's image layout tokens)")
        self._ids = ids
        self.image_token_ids = torch.tensor([token for token, _ in codes], dtype=torch.long)
        self.num_codes = len(self.image_token_ids)
        self.output_token_ids = torch.cat([self.image_token_ids, torch.tensor([ids[END_OF_LINE], ids[IMAGE_END]])])
        self.window_head = gathered_head(model.lm_head, self.output_token_ids)  # one copy of the output space's rows
        self._output_ids_on: dict = {}
        _set_size(self, *size)
        self._default_size = size
        self._views: dict[tuple[int, int], ChameleonT2ITarget] = {size: self}  # (width, height) -> view, shared by every view

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, vqgan_path: str | Path | None = None,
        size: tuple[int, int] = DEFAULT_SIZE, **kwargs: Any,
    ) -> "ChameleonT2ITarget":
        """Load the language model, its tokenizer and the VQ-GAN from local folders (never downloads)."""
        from transformers import AutoTokenizer, ChameleonForConditionalGeneration

        path = Path(path)
        vqgan = VQGanDecoder.from_folder(Path(vqgan_path) if vqgan_path is not None else path / "vqgan")
        model = ChameleonForConditionalGeneration.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        logger.info("loaded Chameleon text-to-image model from %s (%s)", path, dtype)
        return cls(model, tokenizer, vqgan, size=size)

    # -- DecodingTarget ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The image codes and the two layout tokens."""
        return int(self.output_token_ids.shape[0])

    def header_ids(self) -> list[int]:
        """The image start and the height and width tokens that open an image of this size."""
        width, height = self._size
        sizes = [self.tokenizer.convert_tokens_to_ids(size_token(side // GRID_PIXELS)) for side in (height, width)]
        return [self._ids[IMAGE_START], *sizes]

    def prompt_ids(self, text: str) -> torch.Tensor:
        """BOS, the conversation turn asking for the image, the image header. # [L]"""
        width, height = self._size
        turn = PROMPT_TEMPLATE.format(width=width, height=height, text=text) + TURN_END
        ids = [self.tokenizer.bos_token_id] + self.tokenizer(turn, add_special_tokens=False)["input_ids"] + self.header_ids()
        return torch.tensor(ids, dtype=torch.long)

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        text, negative = prompt_texts(prompt)
        if not unconditional:
            return PromptInputs(input_ids=self.prompt_ids(text))
        if negative is not None:
            return PromptInputs(input_ids=self.prompt_ids(negative))
        return PromptInputs(input_ids=torch.tensor(self.header_ids(), dtype=torch.long))

    # -- ImageGenerator ----------------------------------------------------------------------

    @property
    def pixels_per_token(self) -> int:
        return self.vqgan.config.pixels_per_code

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (self.layout.height, self.layout.width)

    @property
    def layout_grid(self) -> tuple[int, int]:
        """(rows, tokens per row) in generation order: each row is w image tokens + end of line."""
        return (self.layout.height, self.layout.width + 1)

    @property
    def num_image_tokens(self) -> int:
        return self.layout.num_tokens

    @property
    def image_size(self) -> tuple[int, int]:
        return (self._size[1], self._size[0])

    @property
    def sizes(self) -> str:
        width, height = self._default_size
        return f"{chameleon_sizes()}; its own size is {width}x{height}"

    def with_size(self, width: int, height: int) -> "ChameleonT2ITarget":
        """A view of this model at ``width`` x ``height`` (the same weights and gathered head)."""
        if (width, height) not in self._views:
            view = copy.copy(self)
            try:
                _set_size(view, width, height)
            except ValueError as error:
                raise ValueError(f"{error}; its own size is {self._default_size[0]}x{self._default_size[1]}") from None
            self._views[(width, height)] = view
        return self._views[(width, height)]

    def default_sampling(self) -> SamplingConfig:
        """The checkpoint's generation_config when it samples, else Lumina-mGPT's image defaults
        (temperature 1, top-k 2000, CFG 3); CFG in logit space, as Lumina-mGPT mixes."""
        generation = self.model.generation_config
        if getattr(generation, "do_sample", False):
            return sampling_from_generation_config(generation, "logits", default_guidance=DEFAULT_GUIDANCE)
        return SamplingConfig(temperature=1.0, top_k=DEFAULT_TOP_K, cfg_scale=DEFAULT_GUIDANCE, cfg_space="logits")

    def image_token_grid(self, tokens: torch.Tensor) -> torch.Tensor:
        """Generated output tokens [B, num_image_tokens] -> codes [B, h, w] (end of lines and end dropped)."""
        rows, columns = self.grid_shape
        return tokens[:, : rows * (columns + 1)].reshape(-1, rows, columns + 1)[..., :columns]

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor) -> list[Image.Image]:
        """Generated layout -> PIL images through the VQ-GAN. tokens: [B, h*(w+1)+1] output tokens"""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"decode_tokens: expected [B, {self.num_image_tokens}] tokens, got {tuple(tokens.shape)}")
        pixels = self.vqgan.decode_codes(self.image_token_grid(tokens))  # [B, 3, H, W] in [-1, 1]
        array = ((pixels.float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray((image * 255).astype(np.uint8)) for image in array]


def chameleon_sizes() -> str:
    return f"widths and heights in multiples of {GRID_PIXELS} pixels (Lumina-mGPT's grid cells)"


def chameleon_size_problem(pixels_per_code: int, width: int, height: int) -> str | None:
    """Why a Chameleon whose VQ-GAN code covers ``pixels_per_code`` pixels cannot make ``width`` x
    ``height`` images, or None. A 32-pixel cell must be 2 x 2 codes (Lumina-mGPT's layout)."""
    if width % GRID_PIXELS or height % GRID_PIXELS or width <= 0 or height <= 0:
        return f"size: '{width}x{height}' is not a size this Chameleon makes: {chameleon_sizes()}"
    if pixels_per_code * TOKENS_PER_CELL != GRID_PIXELS:
        return (f"size: this Chameleon's VQ-GAN makes {pixels_per_code}-pixel codes; Lumina-mGPT's layout needs "
                f"{GRID_PIXELS // TOKENS_PER_CELL}")
    return None


def _set_size(target: ChameleonT2ITarget, width: int, height: int) -> None:
    """Lay ``target`` (itself while it is built, or a view being made) out at ``width`` x ``height``."""
    problem = chameleon_size_problem(target.vqgan.config.pixels_per_code, width, height)
    if problem is not None:
        raise ValueError(problem)
    target._size = (width, height)
    codes = len(target.image_token_ids)
    rows, columns = height // target.pixels_per_token, width // target.pixels_per_token
    target.layout = ChameleonLayout(rows, columns, eol=codes, end=codes + 1)
