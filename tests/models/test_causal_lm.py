"""CausalLMTarget's logits are the model's own, including what its forward does after the head."""

from __future__ import annotations

import pytest
import torch

from raydec.models.causal_lm import CausalLMTarget, LogitTransformHead
from raydec.speculative.cache import RaggedCache
from raydec.speculative.prefill import prefill_mask

torch.set_num_threads(1)


def _tiny(kind: str) -> torch.nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

    common = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    if kind == "gemma2":  # soft-capped logits
        model = Gemma2ForCausalLM(Gemma2Config(**common, head_dim=16, final_logit_softcapping=5.0))
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(30.0)  # logits large enough for the cap to bite
    elif kind == "granite":  # scaled logits
        model = GraniteForCausalLM(GraniteConfig(**common, logits_scaling=8.0))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    return model


@pytest.mark.parametrize("kind", ["gemma2", "granite", "llama"])
def test_window_logits_equal_the_models_forward(kind, tmp_path):
    _tiny(kind).save_pretrained(tmp_path / kind)
    target = CausalLMTarget.from_pretrained(tmp_path / kind)
    assert isinstance(target.window_head, LogitTransformHead) == (kind != "llama")
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    cache = RaggedCache(1)
    mask = cache.attention_mask(prefill_mask(torch.ones(1, 5, dtype=torch.bool)), target.dtype)
    with torch.no_grad():
        theirs = target.model(input_ids=ids).logits
        ours = target.forward(target.embed_prompt_tokens(ids), None, torch.arange(5)[None], mask, cache.kv).logits
        head_only = target.model.get_output_embeddings()(target.model.get_decoder()(input_ids=ids).last_hidden_state)
    assert torch.allclose(ours, theirs, atol=1e-5), float((ours - theirs).abs().max())
    # the head alone gives other logits for these models: the test sees a missing transform
    assert torch.allclose(head_only, theirs, atol=1e-5) == (kind == "llama")


def test_a_prompt_token_outside_the_vocabulary_is_named() -> None:
    target = CausalLMTarget(_tiny("llama"))
    assert target.prompt_inputs([0, 5, 31]).input_ids.tolist() == [0, 5, 31]
    for bad in (32, -1):
        with pytest.raises(ValueError, match=rf"^prompt: token id {bad} is outside the model's vocabulary \(0\.\.31\)"):
            target.prompt_inputs([3, bad])
