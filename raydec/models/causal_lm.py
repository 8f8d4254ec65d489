"""Adapter for any Hugging Face causal LM (``LlamaForCausalLM`` and friends).

A prompt is a sequence of token ids, or a ``CfgPrompt`` pairing conditional and unconditional
ids for classifier-free guidance. Output tokens are the model's own vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from raydec.models.attention import use_window_attention
from raydec.models.base import PromptInputs, SharedVocabularyForward


@dataclass(frozen=True)
class CfgPrompt:
    """A prompt with its unconditional counterpart for classifier-free guidance."""

    cond: Sequence[int]
    uncond: Sequence[int]


class LogitTransformHead(torch.nn.Module):
    """The output head plus what some ``ForCausalLM.forward`` does to its logits after it:
    ``/ logits_scaling`` (Granite), ``* logit_scale`` (Cohere), ``cap * tanh(x / cap)``
    (Gemma 2's ``final_logit_softcapping``)."""

    def __init__(self, head: torch.nn.Module, divide: float = 1.0, multiply: float = 1.0, softcap: float | None = None) -> None:
        super().__init__()
        self.head, self.divide, self.multiply, self.softcap = head, divide, multiply, softcap

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> torch.nn.Module:
        """The model's head, wrapped only if its config transforms the logits."""
        config, head = model.config, model.get_output_embeddings()
        divide = float(getattr(config, "logits_scaling", None) or 1.0)
        multiply = float(getattr(config, "logit_scale", None) or 1.0)
        softcap = getattr(config, "final_logit_softcapping", None)
        if divide == 1.0 and multiply == 1.0 and softcap is None:
            return head
        return cls(head, divide, multiply, float(softcap) if softcap is not None else None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        if self.divide != 1.0:
            logits = logits / self.divide
        if self.multiply != 1.0:
            logits = logits * self.multiply
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class CausalLMTarget(SharedVocabularyForward):
    """Wrap ``AutoModelForCausalLM``-style models for the engine.

    The logits are the model's own: its output head, then any scaling or soft-capping its
    ``forward`` applies (``LogitTransformHead``). Sliding-window attention is not applied:
    models that use it match their own ``forward`` only within the window.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()
        use_window_attention(model)  # grouped-query windows attend without repeating K/V
        self.window_decoder = model.get_decoder()
        self.window_head = LogitTransformHead.for_model(model)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, **kwargs: Any) -> "CausalLMTarget":
        """Load from a local folder (never downloads)."""
        from transformers import AutoModelForCausalLM

        if not (Path(path).expanduser() / "config.json").is_file():  # else HF reads it as a Hub repo id
            raise FileNotFoundError(f"no causal LM checkpoint at {path}: config.json not found")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
        return cls(model)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        if isinstance(prompt, CfgPrompt):
            ids = prompt.uncond if unconditional else prompt.cond
        elif unconditional:
            raise ValueError("CFG needs CfgPrompt(cond=..., uncond=...) prompts for a causal LM")
        else:
            ids = prompt
        input_ids = torch.as_tensor(list(ids), dtype=torch.long)
        rows = int(self.model.get_input_embeddings().weight.shape[0])
        outside = input_ids[(input_ids < 0) | (input_ids >= rows)]
        if outside.numel():
            raise ValueError(f"prompt: token id {int(outside[0])} is outside the model's vocabulary (0..{rows - 1})")
        return PromptInputs(input_ids=input_ids)
