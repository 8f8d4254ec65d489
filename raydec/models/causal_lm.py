"""Adapter for any Hugging Face causal LM (``LlamaForCausalLM`` and friends).

A prompt is a sequence of token ids, or a ``CfgPrompt`` pairing conditional and unconditional
ids for classifier-free guidance. Output tokens are the model's own vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from raydec.models.base import PromptInputs, SharedVocabularyForward


@dataclass(frozen=True)
class CfgPrompt:
    """A prompt with its unconditional counterpart for classifier-free guidance."""

    cond: Sequence[int]
    uncond: Sequence[int]


class CausalLMTarget(SharedVocabularyForward):
    """Wrap ``AutoModelForCausalLM``-style models for the engine."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()
        self.window_decoder = model.get_decoder()
        self.window_head = model.get_output_embeddings()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, **kwargs: Any) -> "CausalLMTarget":
        """Load from a local folder (never downloads)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
        return cls(model)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        if isinstance(prompt, CfgPrompt):
            ids = prompt.uncond if unconditional else prompt.cond
        elif unconditional:
            raise ValueError("CFG needs CfgPrompt(cond=..., uncond=...) prompts for a causal LM")
        else:
            ids = prompt
        return PromptInputs(input_ids=torch.as_tensor(list(ids), dtype=torch.long))
