"""What every adapter shares: the window forward over a Hugging Face decoder stack, the
attention kernels a decode loop may use, and the checkpoint error. The target protocol itself
(``DecodingTarget``, ``PromptInputs``, ``ForwardOutput``) belongs to the decoding core
(``raydec.speculative.target``) and is re-exported here for the adapters.
"""

from __future__ import annotations

import abc
import functools
import inspect
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from raydec.speculative.target import DecodingTarget, ForwardOutput, PromptInputs, stack_prompts

__all__ = [
    "CheckpointError", "DecodingTarget", "ForwardOutput", "PromptInputs", "SharedVocabularyForward", "WindowForward",
    "cache_keyword", "decoder_window_forward", "decoding_attention", "stack_prompts", "synchronize",
]

# Every fused attention kernel but cuDNN's (see decoding_attention).
DECODING_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def decoding_attention(device: str | torch.device) -> AbstractContextManager:
    """The attention kernels a decode loop on ``device`` may use (a context manager).

    Every decode step attends from a window of new tokens, under an arbitrary tree mask, to a
    cache whose length changes every step. On Hopper GPUs PyTorch may pick its cuDNN attention
    kernel for such calls, and cuDNN builds a new execution graph for each new sequence length,
    so every step would pay a build (docs/benchmarks.md, "On one H200"). The memory-efficient
    kernel takes any additive mask and length without a per-shape build. On the CPU this changes nothing. The backend flags are process-wide: two threads
    decoding at once may briefly see each other's setting, which costs speed, never results.
    """
    if torch.device(device).type != "cuda":
        return nullcontext()
    return sdpa_kernel(list(DECODING_SDPA_BACKENDS))


@functools.cache
def _cache_keyword(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_keyword(module: torch.nn.Module) -> str:
    """The keyword ``module``'s forward takes its KV cache by in the installed transformers:
    ``cache`` in recent 5.x releases, ``past_key_values`` before (5.17 still has it). The other
    name would be swallowed by ``**kwargs`` and the forward would run without the cache."""
    return _cache_keyword(type(module).forward)


def synchronize(device: str | torch.device) -> None:
    """Wait for queued GPU work, so a host clock read after it times the work (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class CheckpointError(ValueError):
    """A checkpoint folder this build cannot serve for the task (its model_type), or a draft
    that does not fit its target or method. The message names the path and the field."""


def decoder_window_forward(
    decoder: torch.nn.Module,
    head: torch.nn.Module,
    inputs_embeds: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    want_hidden: bool,
    logits_to_keep: int = 0,
    **decoder_kwargs: Any,
) -> ForwardOutput:
    """The forward every adapter shares: a Hugging Face decoder stack over a window with our
    own 4-D mask, per-row positions and cache, then the output head.

    inputs_embeds: [M, N, H]; position_ids: [M, N] (or [P, M, N]); attention_mask:
    [M, 1, N, S + N] additive; decoder_kwargs: what else the decoder takes (an adapter's
    ``layer_residual_kwargs``)  -> logits [M, N, V] ([M, k, V]: the last ``logits_to_keep`` k
    positions only), hidden [M, N, H] when ``want_hidden``
    """
    device = inputs_embeds.device
    out = decoder(
        inputs_embeds=inputs_embeds,
        position_ids=position_ids.to(device),
        attention_mask=attention_mask.to(device),
        use_cache=True,
        **{cache_keyword(decoder): cache},
        **decoder_kwargs,
    )
    hidden = out.last_hidden_state
    logits = head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
    return ForwardOutput(logits=logits, hidden=hidden if want_hidden else None)


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
        layer_residuals: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ForwardOutput:
        # inputs_embeds [M, N, H] | output_tokens [M, N]; mask [M, 1, N, S+N] -> logits [M, N or k, V]
        if inputs_embeds is None:
            inputs_embeds = self.embed_output_tokens(output_tokens)
        extra = {} if layer_residuals is None else self.layer_residual_kwargs(layer_residuals)
        with decoding_attention(inputs_embeds.device):  # no cuDNN attention: it rebuilds per cache length
            return decoder_window_forward(
                self.window_decoder, self.window_head, inputs_embeds, position_ids, attention_mask, cache, want_hidden, logits_to_keep,
                **extra,
            )

    def layer_residual_kwargs(self, layer_residuals: torch.Tensor) -> dict[str, Any]:
        """The decoder's keyword arguments that add ``layer_residuals`` [K, M, N, H] after its
        first K layers; a model that has no such inputs refuses them."""
        raise ValueError(f"{type(self).__name__} takes no layer residuals")


class SharedVocabularyForward(WindowForward):
    """Adapters whose output tokens are the model's own text vocabulary (causal LMs, VLMs).
    Subclasses set ``model``, ``window_decoder`` and ``window_head``."""

    model: torch.nn.Module

    def embed_prompt_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedding = self.model.get_input_embeddings()
        return embedding(input_ids.to(embedding.weight.device))

    def embed_output_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_tokens(tokens)
