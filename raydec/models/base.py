"""What the engine needs from a target model: the adapter protocol.

``spec/`` sees models only through these types. An adapter turns its model family's prompts
into per-row prefix inputs and runs forwards over windows of *output tokens* with a caller-made
4-D mask, per-row position ids and a Hugging Face cache. It knows nothing of proposers.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Every fused attention kernel but cuDNN's (see decoding_attention).
DECODING_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def decoding_attention(device: str | torch.device) -> AbstractContextManager:
    """The attention kernels a decode loop on ``device`` may use (a context manager).

    Every decode step attends from a window of new tokens, under an arbitrary tree mask, to a
    cache whose length changes every step. On Hopper GPUs PyTorch may pick its cuDNN attention
    kernel for such calls, and cuDNN builds a new execution graph for each new sequence length:
    on an H200 (torch 2.11) that made a 10-token ViSpec step cost ~18 AR steps and an SJD step
    ~13. The memory-efficient kernel takes any additive mask and length without a per-shape
    build. On the CPU this changes nothing. The backend flags are process-wide: two threads
    decoding at once may briefly see each other's setting, which costs speed, never results.
    """
    if torch.device(device).type != "cuda":
        return nullcontext()
    return sdpa_kernel(list(DECODING_SDPA_BACKENDS))


class CheckpointError(ValueError):
    """A checkpoint folder this build cannot serve for the task (its model_type), or a draft
    that does not fit its target or method. The message names the path and the field."""


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
    """

    input_ids: torch.Tensor | None = None
    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    next_position: int | None = None
    image_index: torch.Tensor | None = None
    context_ids: torch.Tensor | None = None

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
    ) -> ForwardOutput:
        """One forward over a window.

        inputs_embeds: [M, N, H] (prefill) or None; output_tokens: [M, N] output-space ids
        (decode windows) or None; position_ids: [M, N] (or [P, M, N]);
        attention_mask: [M, 1, N, S + N] additive; cache: the HF Cache, appended in place.
        """


def decoder_window_forward(
    decoder: torch.nn.Module,
    head: torch.nn.Module,
    inputs_embeds: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    want_hidden: bool,
) -> ForwardOutput:
    """The forward every adapter shares: a Hugging Face decoder stack over a window with our
    own 4-D mask, per-row positions and cache, then the output head.

    inputs_embeds: [M, N, H]; position_ids: [M, N] (or [P, M, N]); attention_mask:
    [M, 1, N, S + N] additive  -> logits [M, N, V], hidden [M, N, H] when ``want_hidden``
    """
    device = inputs_embeds.device
    out = decoder(
        inputs_embeds=inputs_embeds,
        position_ids=position_ids.to(device),
        attention_mask=attention_mask.to(device),
        cache=cache,
        use_cache=True,
    )
    hidden = out.last_hidden_state
    return ForwardOutput(logits=head(hidden), hidden=hidden if want_hidden else None)


class WindowForward(abc.ABC):
    """The window forward every adapter shares. Subclasses set ``model`` (the wrapped Hugging
    Face model), ``window_decoder`` (its decoder stack) and ``window_head`` (the output head)
    and say how output tokens embed."""

    model: torch.nn.Module
    window_decoder: torch.nn.Module
    window_head: torch.nn.Module

    @property
    def dtype(self) -> torch.dtype:  # the decoder stack's: a VQ model may decode in float32
        return next(self.window_decoder.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.window_decoder.parameters()).device

    @abc.abstractmethod
    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embeddings of output-space ids. [M, N] -> [M, N, H]"""

    @torch.inference_mode()
    def forward(
        self,
        inputs_embeds: torch.Tensor | None,
        output_tokens: torch.Tensor | None,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        want_hidden: bool = False,
    ) -> ForwardOutput:
        # inputs_embeds [M, N, H] | output_tokens [M, N]; mask [M, 1, N, S+N] -> logits [M, N, V]
        if inputs_embeds is None:
            inputs_embeds = self.embed_output_tokens(output_tokens)
        return decoder_window_forward(
            self.window_decoder, self.window_head, inputs_embeds, position_ids, attention_mask, cache, want_hidden
        )


class SharedVocabularyForward(WindowForward):
    """Adapters whose output tokens are the model's own text vocabulary (causal LMs, VLMs).
    Subclasses set ``model``, ``window_decoder`` and ``window_head``."""

    model: torch.nn.Module

    def embed_prompt_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedding = self.model.get_input_embeddings()
        return embedding(input_ids.to(embedding.weight.device))

    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_tokens(tokens)


def stack_prompts(prompts: Sequence[PromptInputs]) -> list[PromptInputs]:
    """Validate a list of prompt inputs (all ids or all embeddings)."""
    kinds = {p.input_ids is not None for p in prompts}
    if len(kinds) > 1:
        raise ValueError("prompt inputs mix input_ids and inputs_embeds within one batch")
    for i, p in enumerate(prompts):
        if p.length == 0:
            raise ValueError(f"prompt[{i}]: empty prompt (length 0)")
    return list(prompts)
