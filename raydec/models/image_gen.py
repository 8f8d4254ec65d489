"""Shared pieces of the text-to-image adapters (Janus, Emu3, Lumina-mGPT / Chameleon, the reference model).

- ``ImagePrompt``: a prompt with an optional negative prompt (the CFG unconditional row).
- ``ImageGenerator``: what ``api.generate_images`` needs from a text-to-image adapter on top of
  the engine's ``DecodingTarget``: the token layout, its vocabulary constraint, default
  sampling and the VQ decoder.
- ``sampling_from_generation_config`` (from ``raydec.models.generation_config``): a
  checkpoint's ``generation_config`` -> our ``SamplingConfig``.
- ``pixels_to_pil``: VQ decoder output -> PIL images, undoing the processor's normalisation.
- ``vq_for_decoding``: the VQ model, in float32 when it sits on a CPU in half precision.
- ``gathered_head``: an output head restricted to the rows of an adapter's output space.
- ``CodesThenLayout``: an output space of image codes then layout tokens of the model's own
  vocabulary, with the layout forced by index (Emu3, Chameleon).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from PIL import Image

from raydec.config import SamplingConfig
from raydec.models.base import DecodingTarget
from raydec.speculative.sampling import VocabConstraint



@dataclass(frozen=True)
class ImagePrompt:
    """A text-to-image prompt. ``negative`` (if set) replaces the default unconditional row."""

    text: str
    negative: str | None = None


def prompt_texts(prompt: Any) -> tuple[str, str | None]:
    """``str`` or ``ImagePrompt`` -> (text, negative or None)."""
    if isinstance(prompt, ImagePrompt):
        return prompt.text, prompt.negative
    if isinstance(prompt, str):
        return prompt, None
    raise TypeError(f"prompt must be str or ImagePrompt, got {type(prompt).__name__}")


@runtime_checkable
class ImageGenerator(DecodingTarget, Protocol):
    """A ``DecodingTarget`` that generates one image per row as a fixed-length token layout."""

    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, columns) of the image-token grid."""

    @property
    def layout_grid(self) -> tuple[int, int]:
        """(rows, tokens per row) in generation order (Emu3: w + 1, with end-of-line)."""

    @property
    def num_image_tokens(self) -> int:
        """Generated tokens per image, layout tokens (end-of-line, end-of-image...) included."""

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels of a decoded image."""

    @property
    def eos_token_ids(self) -> Sequence[int]:
        """Output ids that end a row early (empty: the layout's length ends it)."""

    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embeddings of output-space ids (image tokens). [M, N] -> [M, N, H]"""

    def vocab_constraint(self) -> VocabConstraint:
        """Allowed output ids and tokens forced by the layout."""

    def default_sampling(self) -> SamplingConfig:
        """The checkpoint's own sampling defaults (as its ``generate`` would use them)."""

    def decode_tokens(self, tokens: torch.Tensor) -> list[Image.Image]:
        """Generated tokens -> images. tokens: [B, num_image_tokens]."""

    def with_size(self, width: int, height: int) -> "ImageGenerator":
        """This model making ``width`` x ``height`` images (the same weights; itself at its own
        size); a ValueError naming the sizes it can make otherwise."""

    @property
    def sizes(self) -> str:
        """The sizes it makes, in words (for errors and the API's model cards)."""


def vq_for_decoding(vqmodel: torch.nn.Module) -> torch.nn.Module:
    """``vqmodel``, moved to float32 (once, in place) when it is on a CPU in bf16 / fp16.

    PyTorch has no fast CPU kernel for half-precision convolutions (they fall back to
    ``aten::_slow_conv2d_forward``), slow enough to outweigh the whole token decode
    (docs/benchmarks.md, "Pixels in float32 on a CPU"). The VQ model is a small part of the
    checkpoint and only decodes pixels, so it pays its float32 weights. On a
    GPU it keeps the checkpoint's dtype.
    """
    weight = next(vqmodel.parameters())
    if weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16):
        vqmodel.float()
    return vqmodel


def pixels_to_pil(pixels: torch.Tensor, image_processor: Any, channels_last: bool) -> list[Image.Image]:
    """Decoder output -> uint8 PIL images, undoing the processor's normalise and rescale.

    pixels: [B, H, W, C] (channels_last) or [B, C, H, W], in the processor's normalised space.
    """
    if not channels_last:
        pixels = pixels.permute(0, 2, 3, 1)
    array = pixels.detach().float().cpu().numpy()  # [B, H, W, C]
    mean = np.asarray(getattr(image_processor, "image_mean", None) or [0.5] * 3, dtype=np.float32)
    std = np.asarray(getattr(image_processor, "image_std", None) or [0.5] * 3, dtype=np.float32)
    if getattr(image_processor, "do_normalize", True):
        array = array * std + mean
    rescale = float(getattr(image_processor, "rescale_factor", None) or 1 / 255)
    array = np.clip(np.round(array / rescale), 0, 255).astype(np.uint8)
    return [Image.fromarray(image) for image in array]


def gathered_head(head: torch.nn.Module, rows: torch.Tensor) -> torch.nn.Linear:
    """The output head restricted to ``rows`` ([K] vocabulary ids): one copy of those rows."""
    weight = head.weight.detach()
    gathered = torch.nn.Linear(weight.shape[1], len(rows), bias=getattr(head, "bias", None) is not None,
                               device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        gathered.weight.copy_(weight[rows.to(weight.device)])
        if gathered.bias is not None:
            gathered.bias.copy_(head.bias.detach()[rows.to(weight.device)])
    return gathered.requires_grad_(False)


class CodesThenLayout:
    """Adapters whose output space is image codes then layout tokens, all of the model's own
    vocabulary (Emu3, Chameleon). Subclasses set ``output_token_ids`` ([K] vocabulary id of each
    output token, the ``num_codes`` codes first), ``layout`` (gen_index [B, N] -> forced output ids,
    -1 free) and ``_output_ids_on`` (a dict), and embed prompt-vocabulary ids (``embed_prompt_tokens``)."""

    output_token_ids: torch.Tensor
    num_codes: int
    _output_ids_on: dict

    def _output_ids(self, device: torch.device) -> torch.Tensor:
        if device not in self._output_ids_on:
            self._output_ids_on[device] = self.output_token_ids.to(device)
        return self._output_ids_on[device]

    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_tokens(self._output_ids(tokens.device)[tokens])  # type: ignore[attr-defined]

    @property
    def eos_token_ids(self) -> Sequence[int]:
        return ()  # the layout's length ends a row

    def vocab_constraint(self) -> VocabConstraint:
        """The codes only, with the layout's tokens forced by index."""
        allowed = torch.zeros(len(self.output_token_ids), dtype=torch.bool)
        allowed[: self.num_codes] = True
        return VocabConstraint(allowed=allowed, forced=self._forced_on_device)

    def _forced_on_device(self, gen_index: torch.Tensor) -> torch.Tensor:
        # gen_index [B, N] -> forced ids [B, N] on the model's device, where the logits live
        return self.layout(gen_index).to(self.device)  # type: ignore[attr-defined]
