"""What the engine needs from a target model: the target protocol.

The decoding core sees models only through these types; adapters (``raydec.models``) implement
them. A target turns its model family's prompts into per-row prefix inputs and runs forwards
over windows of *output tokens* with a caller-made 4-D mask, per-row position ids and a cache.
It knows nothing of proposers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@dataclass
class PromptInputs:
    """One model row's prefix.

    Exactly one of ``input_ids`` ([L] long) and ``inputs_embeds`` ([L, H]) is set.
    position_ids: [L] or [P, L] (M-RoPE); None means 0..L-1.
    next_position: the position id of the first generated token (None: L).
    image_index: [L] long, which image of the prompt each position belongs to (-1 = text);
        None for prompts without images. Draft models use it to find image spans.
    context_ids: [L] long, the prompt's token ids when ``inputs_embeds`` carries it (a VLM's
        expanded image placeholders included, as Hugging Face's logits processors see them).
    layer_residuals: [K, L, H] added to the hidden states after each of the decoder's first K
        layers in the prefill (Qwen3-VL's DeepStack visual features at image positions, zero
        elsewhere); None: nothing is added. Generated tokens never have any.
    """

    input_ids: torch.Tensor | None = None
    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    next_position: int | None = None
    image_index: torch.Tensor | None = None
    context_ids: torch.Tensor | None = None
    layer_residuals: torch.Tensor | None = None

    @property
    def token_ids(self) -> torch.Tensor | None:
        """[L] the prompt's token ids, if the adapter knows them."""
        return self.input_ids if self.input_ids is not None else self.context_ids

    @property
    def length(self) -> int:
        source = self.input_ids if self.input_ids is not None else self.inputs_embeds
        assert source is not None, "PromptInputs needs input_ids or inputs_embeds"
        return int(source.shape[0])


@dataclass
class ForwardOutput:
    """logits: [M, N, V] over the output-token space; hidden: [M, N, H] last hidden states or None."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


@runtime_checkable
class DecodingTarget(Protocol):
    """A model the engine can decode with (text LM, VLM language model, AR image generator)."""

    @property
    def vocab_size(self) -> int:
        """Size of the output-token space the engine samples from."""

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        """The prefix of one row (the unconditional prefix when ``unconditional``, for CFG)."""

    def embed_prompt_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of prompt-vocabulary ids. [M, L] -> [M, L, H]"""

    def forward(
        self,
        inputs_embeds: torch.Tensor | None,
        output_tokens: torch.Tensor | None,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        want_hidden: bool = False,
        layer_residuals: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ForwardOutput:
        """One forward over a window.

        inputs_embeds: [M, N, H] (prefill) or None; output_tokens: [M, N] output-space ids
        (decode windows) or None; position_ids: [M, N] (or [P, M, N]);
        attention_mask: [M, 1, N, S + N] additive; cache: the HF Cache, appended in place;
        layer_residuals: [K, M, N, H] (a prefill of prompts that have them) or None;
        logits_to_keep: logits for the last this many positions only, [M, k, V] (0: all; a
        prefill needs its last: a long prompt's logits would take prompt x vocabulary floats)
        """


def stack_prompts(prompts: Sequence[PromptInputs]) -> list[PromptInputs]:
    """Validate a list of prompt inputs (all ids or all embeddings)."""
    kinds = {p.input_ids is not None for p in prompts}
    if len(kinds) > 1:
        raise ValueError("prompt inputs mix input_ids and inputs_embeds within one batch")
    for i, p in enumerate(prompts):
        if p.length == 0:
            raise ValueError(f"prompt[{i}]: empty prompt (length 0)")
    return list(prompts)
