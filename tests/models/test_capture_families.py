"""The captured step (``compile: on``) decodes the eager step's tokens on every model family's
real classes, float32: SJD-PAC on the text-to-image families (Janus, the reference model; Emu3
with its forced layout tokens; Chameleon / Lumina-mGPT), each with its CFG and its vocabulary
constraint, and ViSpec on the reference VLM with its trained draft and on LLaVA-NeXT, Qwen2-VL
and Qwen2.5-VL (grouped queries; the Qwens' multimodal rotary positions). Three rows at batch 2,
so a row leaves, a queued row joins and the last one decodes alone (a batch padded to its
bucket). The other captured paths (the Jacobi methods, EAGLE, ViSpec on LLaVA) are checked on a
tiny Llama and LLaVA in tests/core/test_capture.py and tests/models/test_vispec.py."""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.hf_vlm import VisionLanguageTarget
from raydec.models.image_gen import ImagePrompt
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.factory import make_proposer
from raydec.speculative.requests import RowRequest
from tests.t2i_toys import tiny_chameleon, tiny_emu3, tiny_janus
from tests.vlm_toys import build_tiny_llava_next, build_tiny_qwen2_5_vl, build_tiny_qwen2_vl, hf_greedy_vlm, successor_draft, vlm_prompts

PROMPTS = ["a red circle", "two blue squares", "a green triangle"]
VLM_BUILDERS = {"llava_next": build_tiny_llava_next, "qwen2_vl": build_tiny_qwen2_vl, "qwen2_5_vl": build_tiny_qwen2_5_vl}


def _t2i_target(name: str, folder):
    from raydec.api import load_target
    from raydec.models.registry import load_t2i_target

    if name == "janus":
        return load_t2i_target(tiny_janus(folder, seed=0))
    if name == "emu3":
        return load_t2i_target(tiny_emu3(folder, seed=0), image_area=32 * 32)  # 4 x 4 tokens
    return load_target(str(tiny_chameleon(folder, seed=0)), task="t2i")


@pytest.mark.parametrize("name", ["emu3", "chameleon"])  # Janus: the reference model's test below
def test_captured_sjd_pac_decodes_the_eager_tokens_on_every_image_family(tmp_path, name):
    target = _t2i_target(name, tmp_path / name)
    requests = [RowRequest(ImagePrompt(p, None), seed=i) for i, p in enumerate(PROMPTS)]
    tokens = {}
    for mode in ("off", "on"):
        config = DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(window=8, branching=2, tree_depth=1), compile=mode)
        engine = Engine(target, make_proposer(config, target), target.default_sampling(), target.num_image_tokens, compile=mode,
                        constraint=target.vocab_constraint(), eos_token_ids=target.eos_token_ids)
        tokens[mode] = [out.tokens for out in engine.generate(requests, batch_size=2)]
        assert (engine.verify_graph.calls > 0) == (mode == "on")
    assert tokens["on"] == tokens["off"]
    assert all(len(t) == target.num_image_tokens for t in tokens["on"])


@pytest.mark.parametrize("name", list(VLM_BUILDERS))
def test_captured_vispec_decodes_the_eager_tokens_on_every_vlm_family(tmp_path, name):
    torch.manual_seed(0)
    target = VisionLanguageTarget.from_pretrained(VLM_BUILDERS[name](tmp_path / name))
    prompts = vlm_prompts(target, 3)
    lengths = [10, 4, 10]
    expected = [hf_greedy_vlm(target, prompt, n) for prompt, n in zip(prompts, lengths)]
    draft = successor_draft(target, expected, True).prepare_inference()
    requests = [RowRequest(prompt, seed=0, max_new_tokens=n) for prompt, n in zip(prompts, lengths)]
    outputs = {}
    for mode in ("off", "on"):
        proposer = DraftTreeProposer(draft, DraftTreeConfig(depth=3, top_k=3, total_tokens=10))
        engine = Engine(target, proposer, SamplingConfig(temperature=0.0), 10, eos_token_ids=target.eos_token_ids, compile=mode)
        outputs[mode] = engine.generate(requests, batch_size=2)
        assert (proposer._step_graph.calls > 0) == (mode == "on")
    assert [out.tokens for out in outputs["on"]] == [out.tokens for out in outputs["off"]] == expected
    assert [out.stats.accepted_lengths for out in outputs["on"]] == [out.stats.accepted_lengths for out in outputs["off"]]


def test_captured_steps_decode_the_eager_tokens_on_the_reference_models():
    """The shipped reference models (float32): SJD-PAC on the reference Janus and ViSpec with its
    trained draft on the reference VLM, the first tokens of three rows at batch 2."""
    from raydec.api import load_target
    from raydec.api.inputs import caption_decode_config, image_decode_config
    from raydec.models.hf_vlm import VlmPrompt
    from raydec.models.loading import load_draft_model
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    janus = load_target("reference", task="t2i")
    vlm = load_target("reference", task="caption")
    draft_model = load_draft_model(vlm, "vispec", "reference")
    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(3)]
    cases = {
        "t2i": (janus, image_decode_config(DecodeConfig(method="sjd_pac"), janus),
                [RowRequest(ImagePrompt(s.prompt, None), seed=i, max_new_tokens=24) for i, s in enumerate(samples)]),
        "caption": (vlm, caption_decode_config(DecodeConfig(method="vispec", sampling=SamplingConfig(temperature=1.0)), vlm),
                    [RowRequest(VlmPrompt(vlm.format_prompt("describe the image .", 1), [to_pil(s.image)]), seed=i, max_new_tokens=16)
                     for i, s in enumerate(samples)]),
    }
    for task, (target, config, requests) in cases.items():
        tokens = {}
        for mode in ("off", "on"):
            proposer = make_proposer(config, target, draft_model if task == "caption" else None)
            constraint = target.vocab_constraint() if task == "t2i" else None
            engine = Engine(target, proposer, config.sampling, config.max_new_tokens, compile=mode, constraint=constraint,
                            eos_token_ids=target.eos_token_ids)
            tokens[mode] = [out.tokens for out in engine.generate(requests, batch_size=2)]
        assert tokens["on"] == tokens["off"], task
        assert all(tokens["on"]), task
