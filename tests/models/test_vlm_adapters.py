"""The VLM adapter on tiny random checkpoints of the four Hugging Face VLM classes (float32).

Each checkpoint (real model class, real processor) is saved and loaded by path once per module.
Greedy decoding through the engine must equal the model's own ``generate(do_sample=False)``
token for token, for plain AR, the draft-tree proposer with a random ViSpec draft and with a
random text-only EAGLE draft, and an oracle chain (whole chains accepted: several tokens per
forward, so positions must advance right), at batch 1 and batch 4, with one and two images per
prompt and images of different sizes (different numbers of image tokens, non-square M-RoPE
grids for Qwen). The adapter's decode windows use 2-D positions; one test checks them against
the full-sequence forward of Hugging Face (for Qwen: M-RoPE with ``rope_deltas``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from transformers import DynamicCache

from raydec.config import DecodeConfig, DraftTreeConfig, SamplingConfig
from raydec.models.hf_vlm import VisionLanguageTarget, VlmPrompt
from raydec.models.vispec_draft import DraftConfig, VispecDraft
from raydec.reference.shapes import make_sample, to_pil
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.oracle import OracleProposer
from tests.vlm_toys import (
    build_tiny_llava, build_tiny_llava_next, build_tiny_qwen2_5_vl, build_tiny_qwen2_vl, build_tiny_qwen3_vl, hf_greedy_vlm,
    successor_draft,
)

torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation cost

MAX_NEW_TOKENS = 16
GREEDY = SamplingConfig(temperature=0.0)
TREE = DraftTreeConfig(depth=3, top_k=3, total_tokens=8)

BUILDERS: dict[str, Callable[..., Any]] = {
    "llava": build_tiny_llava,
    "llava_next": build_tiny_llava_next,
    "qwen2_vl": build_tiny_qwen2_vl,
    "qwen2_5_vl": build_tiny_qwen2_5_vl,
    "qwen3_vl": build_tiny_qwen3_vl,
}
CLASSES = {
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}

#: (question, image sample ids, image sizes (width, height)); prompt 0 is the batch-1 prompt
PROMPTS = [
    ("what colour is it ?", (1, 2), ((48, 24), (24, 40))),
    ("describe the image .", (0,), ((64, 64),)),
    ("describe the picture of the image and what colour is it ?", (3,), ((40, 56),)),
    ("what is it ?", (4, 5), ((32, 32), (56, 40))),
]


@dataclass
class Case:
    name: str
    target: VisionLanguageTarget
    prompts: list[VlmPrompt]
    references: list[list[int]]  # HF generate(do_sample=False), one prompt at a time


def make_prompts(target: VisionLanguageTarget) -> list[VlmPrompt]:
    prompts = []
    for question, samples, sizes in PROMPTS:
        images = [to_pil(make_sample(s).image).resize(size) for s, size in zip(samples, sizes)]
        prompts.append(VlmPrompt(target.format_prompt(question, len(images)), images))
    return prompts


def hf_inputs(target: VisionLanguageTarget, prompt: VlmPrompt) -> dict[str, torch.Tensor]:
    return dict(target.processor(text=[prompt.text], images=list(prompt.images) or None, return_tensors="pt"))


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def case(request, tmp_path_factory) -> Case:
    name = request.param
    folder = BUILDERS[name](tmp_path_factory.mktemp(name))
    target = VisionLanguageTarget.from_pretrained(folder)
    prompts = make_prompts(target)
    return Case(name, target, prompts, [hf_greedy_vlm(target, p, MAX_NEW_TOKENS) for p in prompts])


def decode(case: Case, proposer: Any, rows: list[int]) -> list[Any]:
    config = DecodeConfig(max_new_tokens=MAX_NEW_TOKENS, sampling=GREEDY)
    engine = Engine(case.target, proposer, config.sampling, config.max_new_tokens, eos_token_ids=case.target.eos_token_ids)
    return engine.generate([RowRequest(case.prompts[r], seed=r) for r in rows])


def draft_proposer(target: VisionLanguageTarget, vision: bool) -> DraftTreeProposer:
    torch.manual_seed(1)
    draft = VispecDraft(DraftConfig.for_target(target.text_config, vision=vision))
    draft.attach_target(target.model.get_input_embeddings(), target.head)
    return DraftTreeProposer(draft.eval(), TREE)


def test_loads_real_classes_and_prompts(case):
    target = case.target
    assert type(target.model).__name__ == CLASSES[case.name]
    assert target.model.dtype == torch.float32
    assert target.eos_token_ids
    for prompt, (_, samples, _) in zip(case.prompts, PROMPTS):
        inputs = hf_inputs(target, prompt)
        ids = inputs["input_ids"][0]
        p = target.prompt_inputs(prompt)
        assert p.inputs_embeds.shape == (ids.shape[0], target.hidden_size)
        # every image token belongs to an image, in order, each image a non-empty block
        is_image = ids == target.image_token_id
        assert torch.equal(p.image_index >= 0, is_image)
        found = p.image_index[is_image].tolist()
        assert found == sorted(found) and sorted(set(found)) == list(range(len(samples)))
        if "image_grid_thw" in inputs:  # Qwen: exact token counts per image, M-RoPE positions
            merge = target.model.config.vision_config.spatial_merge_size
            counts = (inputs["image_grid_thw"].prod(-1) // merge**2).tolist()
            assert [found.count(k) for k in range(len(samples))] == counts
            expected, _ = target.model.model.get_rope_index(
                inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"],
            )
            assert p.position_ids.shape == (3, ids.shape[0])
            assert torch.equal(p.position_ids, expected[:, 0])
            assert p.next_position == int(expected.max()) + 1 < ids.shape[0]
        elif "image_sizes" in inputs:  # LLaVA-NeXT: counts from each image's size
            counts = target.processor._get_num_multimodal_tokens(image_sizes=inputs["image_sizes"].tolist())
            assert [found.count(k) for k in range(len(samples))] == list(counts["num_image_tokens"])


def test_decode_window_matches_full_forward(case):
    """Prefix through the adapter (with Qwen3-VL's DeepStack features as layer residuals), then
    3 text tokens as one window with 2-D positions [next_position + k]: logits equal Hugging
    Face's forward over the whole sequence."""
    target, prompt, tokens = case.target, case.prompts[0], case.references[0][:3]
    p = target.prompt_inputs(prompt)
    length, n = p.length, len(tokens)
    causal = torch.tril(torch.ones(length + n, length + n, dtype=torch.bool))
    additive = torch.zeros(causal.shape).masked_fill_(~causal, torch.finfo(torch.float32).min)
    positions = p.position_ids if p.position_ids is not None else torch.arange(length)
    cache = DynamicCache()
    extra = {} if p.layer_residuals is None else {"layer_residuals": p.layer_residuals.unsqueeze(1)}  # Qwen3-VL: DeepStack
    first = target.forward(p.inputs_embeds[None], None, positions.unsqueeze(-2), additive[None, None, :length, :length], cache, **extra)
    start = p.next_position if p.next_position is not None else length
    window = target.forward(
        None, torch.tensor([tokens]), torch.arange(start, start + n)[None], additive[None, None, length:], cache
    )
    inputs = hf_inputs(target, prompt)
    extra = torch.tensor([tokens])
    inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(extra)], dim=1)
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(extra)], dim=1)
    with torch.no_grad():
        if hasattr(target.model.model, "rope_deltas"):
            target.model.model.rope_deltas = None
        full = target.model(**inputs, use_cache=False).logits[0]
    torch.testing.assert_close(first.logits[0], full[:length], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(window.logits[0], full[length:], atol=1e-4, rtol=1e-4)
    assert first.logits[0, -1].argmax().item() == tokens[0]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", ["ar", "vispec", "eagle"])
def test_greedy_equals_hf_generate(case, method, batch):
    """Drafts the target accepts (``successor_draft``): accepted tree nodes on every class."""
    if method == "ar":
        proposer = ARProposer()
    else:
        draft = successor_draft(case.target, case.references, vision=method == "vispec")
        proposer = DraftTreeProposer(draft, TREE)
    rows = list(range(batch))
    outputs = decode(case, proposer, rows)
    assert [o.tokens for o in outputs] == [case.references[r] for r in rows]
    if method != "ar":
        assert max(max(o.stats.accepted_lengths, default=0) for o in outputs) >= 3, [o.stats.accepted_lengths for o in outputs]


def test_oracle_chains_accepted_whole(case):
    """Right drafts: every chain is accepted, several tokens per forward, output unchanged."""
    rows = list(range(len(PROMPTS)))
    oracle = OracleProposer(window=4, references={r: case.references[r] for r in rows})
    outputs = decode(case, oracle, rows)
    assert [o.tokens for o in outputs] == case.references
    for out in outputs:
        assert out.stats.target_forwards <= 1 + -(-(len(out.tokens) - 1) // 5)


@pytest.mark.parametrize("method", ["ar", "vispec"])
def test_text_only_row_beside_image_rows(case, method):
    """A prompt without images in a batch with images (Qwen: M-RoPE positions for it too)."""
    text_only = VlmPrompt(case.target.format_prompt("what is the picture of ?", 0), ())
    prefix = case.target.prompt_inputs(text_only)
    assert bool((prefix.image_index == -1).all())
    if prefix.position_ids is not None:  # Qwen: plain positions on all three axes
        assert torch.equal(prefix.position_ids, torch.arange(prefix.length).expand(3, prefix.length))
        assert prefix.next_position == prefix.length
    proposer = ARProposer() if method == "ar" else draft_proposer(case.target, vision=True)
    config = DecodeConfig(max_new_tokens=MAX_NEW_TOKENS, sampling=GREEDY)
    engine = Engine(case.target, proposer, config.sampling, config.max_new_tokens, eos_token_ids=case.target.eos_token_ids)
    outputs = engine.generate([RowRequest(text_only, seed=0), RowRequest(case.prompts[0], seed=1)])
    assert [o.tokens for o in outputs] == [hf_greedy_vlm(case.target, text_only, MAX_NEW_TOKENS), case.references[0]]
