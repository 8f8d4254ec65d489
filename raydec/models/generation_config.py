"""A checkpoint's Hugging Face ``generation_config`` -> our ``SamplingConfig``.

Unset fields resolve as Hugging Face ``generate`` resolves them (``top_k`` 50, ...), so the
default law of every method is the checkpoint's own. Settings we do not apply (beam search,
n-gram bans, ...) are named in a warning rather than dropped silently.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from raydec.config import SamplingConfig

logger = logging.getLogger(__name__)

# generation-config fields that change the output law, with the value that leaves it alone
_NOT_APPLIED = {
    "num_beams": 1,
    "no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "typical_p": 1.0,
    "min_p": None,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_length": 0,
    "min_new_tokens": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
}


def hf_generation_defaults() -> dict[str, Any]:
    """The values Hugging Face ``generate`` falls back to for unset generation-config fields."""
    from transformers import GenerationConfig

    try:
        return dict(GenerationConfig._get_default_generation_params())
    except AttributeError:  # older transformers: the class defaults themselves
        return {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}


def settings_not_applied(generation_config: Any, penalty_applied: bool) -> dict[str, Any]:
    """Fields of ``generation_config`` set to a law-changing value raydec does not apply
    (``repetition_penalty`` among them unless the caller's path applies it)."""
    if generation_config is None:
        return {}
    neutral = _NOT_APPLIED if penalty_applied else {**_NOT_APPLIED, "repetition_penalty": 1.0}
    found = {}
    for name, default in neutral.items():
        value = getattr(generation_config, name, None)
        if value is None or value == default or (isinstance(value, (list, tuple, dict)) and not value):
            continue
        found[name] = value
    return found


_warned: set[str] = set()  # each distinct warning once per process, not once per call


def sampling_from_generation_config(
    generation_config: Any,
    cfg_space: Literal["logits", "logprobs"],
    default_guidance: float | None = None,
    repetition_penalty: bool = False,
) -> SamplingConfig:
    """A checkpoint's ``generation_config`` -> ``SamplingConfig`` (same law as its HF ``generate``).

    Unset fields take Hugging Face's global defaults (``do_sample=False``, ``top_k=50``...).
    ``do_sample=False`` becomes temperature 0 (greedy). ``guidance_scale`` becomes
    ``cfg_scale`` (``default_guidance`` when unset, as Janus's ``generate`` uses 5).
    ``repetition_penalty``: carry the checkpoint's penalty over (paths whose engine sees the
    prompt's token ids); else a set penalty is reported with the other settings not applied.
    Settings that change the law and are not applied are logged as a warning.
    """
    defaults = hf_generation_defaults()

    def value(name: str) -> Any:
        current = getattr(generation_config, name, None) if generation_config is not None else None
        return defaults.get(name) if current is None else current

    guidance = getattr(generation_config, "guidance_scale", None) if generation_config is not None else None
    if guidance is None:
        guidance = default_guidance if default_guidance is not None else 1.0
    ignored = settings_not_applied(generation_config, repetition_penalty)
    listed = ", ".join(f"{name}={setting!r}" for name, setting in ignored.items())
    if listed and listed not in _warned:
        _warned.add(listed)
        logger.warning(
            "the checkpoint's generation_config sets %s, which raydec does not apply: outputs follow the "
            "law without it (pass decode.sampling explicitly to choose the sampling yourself)", listed,
        )
    do_sample = bool(value("do_sample"))
    return SamplingConfig(
        temperature=float(value("temperature") or 1.0) if do_sample else 0.0,
        top_k=int(value("top_k") or 0),
        top_p=float(value("top_p") or 1.0),
        cfg_scale=float(guidance) if guidance > 1.0 else 1.0,
        cfg_space=cfg_space,
        repetition_penalty=float(value("repetition_penalty") or 1.0) if repetition_penalty else 1.0,
    )
