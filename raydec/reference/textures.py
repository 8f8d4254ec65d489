"""Exact toy textures: image tokens drawn by a first-order Markov chain whose neighbour
dependence is set by hand.

The shapes world's default ("iid") texture draws every random block (a speckle's shade, a
noisy ground's level) independently of its neighbours given its region. Photographs do not: a
texture's next patch depends on the last. (The world's "runs" texture, which the shipped T2I
model draws, is the chain below with 3 levels and a repeat probability of 0.7: beta = ln 4.67.)
SJD's adaptive continuation and proactive drafting exist for that dependence, so how much they
gain over SJD is a property of the images. These chains let a
benchmark dial it in with no training, on the real engine and proposers:

- ``MarkovChainTarget`` speaks the adapter protocol (``raydec.models.base``):
  ``P(x_t | x_<t) = softmax(logits[x_{t-1}])``, so its output law is known exactly (the
  exactness harness uses it too);
- ``potts_texture(levels, beta)``: a token repeats its left neighbour with weight ``e^beta``
  against 1 for each other level. ``beta = 0`` is the "iid" speckle; the larger
  ``beta``, the more the next token depends on the last;
- ``neighbour_tv(target)``: the mean total variation between the next token's law after two
  different left neighbours.
"""

from __future__ import annotations

from typing import Any

import torch

from raydec.models.base import ForwardOutput, PromptInputs


class MarkovChainTarget:
    """P(x_t | x_<t) = softmax(logits[x_{t-1}]). Prompts are token lists; no CFG.

    logits: [V, V], row = previous token. It ignores the KV cache: the window's own tokens
    (each node's input) carry all the context a first-order chain needs.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
            raise ValueError(f"logits: expected a square [V, V] table, got shape {tuple(logits.shape)}")
        self.logits = logits.to(torch.float64)  # [V, V]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        if unconditional:
            raise ValueError("MarkovChainTarget has no unconditional prompt (CFG is off for it)")
        return PromptInputs(input_ids=torch.as_tensor(list(prompt), dtype=torch.long))

    def embed_prompt_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(input_ids, self.vocab_size).to(torch.float64)

    def forward(self, inputs_embeds, output_tokens, position_ids, attention_mask, cache, want_hidden=False,
                logits_to_keep=0) -> ForwardOutput:
        if inputs_embeds is None:
            inputs_embeds = self.embed_prompt_tokens(output_tokens)
        return ForwardOutput(logits=(inputs_embeds[:, -logits_to_keep:] if logits_to_keep else inputs_embeds) @ self.logits)


def potts_texture(levels: int, beta: float, vocab: int | None = None) -> MarkovChainTarget:
    """A texture over ``levels`` values (ids 0..levels-1 of a ``vocab``-token table; the other
    ids are never drawn): ``P(c | left = l) ∝ exp(beta * [c == l])``."""
    vocab = vocab or levels
    if levels < 2 or vocab < levels:
        raise ValueError(f"potts_texture: need 2 <= levels <= vocab, got levels={levels}, vocab={vocab}")
    if beta < 0:
        raise ValueError(f"potts_texture: beta must be >= 0, got {beta}")
    logits = torch.full((vocab, vocab), float("-inf"), dtype=torch.float64)
    logits[:, :levels] = 0.0
    same = torch.arange(levels)
    logits[same, same] = beta
    return MarkovChainTarget(logits)


def neighbour_tv(target: MarkovChainTarget, levels: int | None = None) -> float:
    """Mean total variation between ``P(. | l)`` and ``P(. | l')`` over pairs ``l != l'`` of the
    first ``levels`` tokens (all of them by default)."""
    probs = torch.softmax(target.logits, dim=-1)
    probs = probs[: levels or len(probs)]
    n = len(probs)
    tv = 0.5 * (probs[:, None, :] - probs[None, :, :]).abs().sum(-1)  # [n, n]
    return float(tv[~torch.eye(n, dtype=torch.bool)].mean())
