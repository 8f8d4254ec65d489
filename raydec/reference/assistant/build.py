"""Building the LLaVA assistant from the target: ``build_assistant`` copies the target with fewer
language-model layers; ``file_sha256`` identifies the target weights the captions came from."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Sequence

from transformers import LlavaForConditionalGeneration


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file (identifies the target weights the captions came from)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_assistant(target: LlavaForConditionalGeneration, layers: Sequence[int] = (0, -1)) -> LlavaForConditionalGeneration:
    """A ``len(layers)``-layer LLaVA initialised from ``target`` (same width, vision tower, projector, vocab).

    Assistant layer ``i`` is a copy of target layer ``layers[i]`` (negative: from the end);
    every other weight is copied as is. Returns a float32 model in train mode.
    """
    total = target.config.text_config.num_hidden_layers
    picked = [layer % total for layer in layers]
    if not picked or len(set(picked)) != len(picked):
        raise ValueError(f"layers must be distinct target layers, got {list(layers)} of {total}")
    config = copy.deepcopy(target.config)
    config.text_config.num_hidden_layers = len(picked)
    if getattr(config.text_config, "layer_types", None) is not None:
        config.text_config.layer_types = [config.text_config.layer_types[i] for i in picked]
    assistant = LlavaForConditionalGeneration(config)
    source = target.state_dict()
    prefix = "model.language_model.layers."
    state = {}
    for name in assistant.state_dict():
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            state[name] = source[f"{prefix}{picked[int(index)]}.{rest}"]
        else:
            state[name] = source[name]
    assistant.load_state_dict(state, strict=True)
    assistant.generation_config = copy.deepcopy(target.generation_config)
    return assistant
