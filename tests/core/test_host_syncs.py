"""A decode step reads the device back at most twice, whatever the batch or the window.

Every way a tensor's value reaches Python (``item``, ``tolist``, ``cpu``, ``numpy``, and
``bool`` / ``int`` / ``float`` / ``index`` of a tensor) is counted while the session runs its
decode steps, on a real tiny Llama with classifier-free guidance and a vocabulary constraint,
as a text-to-image target decodes. On a GPU each of these is a device-to-host sync; on the CPU
they are the same calls, so the count carries over.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from raydec.bench.step import ReadBacks
from raydec.config import DecodeConfig, JacobiDraftConfig, DraftTreeConfig, SamplingConfig
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative.engine import DecodeSession, Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.sampling import VocabConstraint
from tests.toys import tiny_llama

torch.set_num_threads(1)

MAX_PER_STEP = 2
VOCAB = 48


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("syncs"), vocab=VOCAB, seed=4, dtype=torch.float32, layers=1, hidden=16)


def _proposer(method: str, window: int):
    if method == "ar":
        return ARProposer(), JacobiDraftConfig(window=window)
    spec = JacobiDraftConfig(window=window, branching=3, tree_depth=1, init="left")
    variant = {"sjd": "sjd", "sjd_ac": "sjd_ac", "sjd_pac": "sjd_pac"}[method]
    return JacobiProposer(spec, variant, "left"), spec


def counted_steps(session: DecodeSession, steps: int) -> list[int]:
    """Run up to ``steps`` decode steps of ``session``: the read-backs of each."""
    counts: list[int] = []

    @contextlib.contextmanager
    def counted() -> Iterator[None]:
        with ReadBacks().counting() as tally:
            yield
        counts.append(tally.count)

    while session.busy and len(counts) < steps:
        session.step(decode_scope=counted)
    return counts


def read_backs_per_step(llama, method: str, batch: int, window: int, steps: int = 3) -> list[int]:
    """Read-backs of each of the first ``steps`` decode steps of a ``batch``-row session."""
    proposer, spec = _proposer(method, window)
    sampling = SamplingConfig(temperature=1.0, top_k=0, cfg_scale=3.0)
    config = DecodeConfig(method="ar" if method == "ar" else method, max_new_tokens=60, sampling=sampling, jacobi=spec)
    allowed = torch.arange(VOCAB) >= 8  # an image-token range: the first 8 ids are never sampled
    engine = Engine(llama, proposer, config.sampling, config.max_new_tokens, constraint=VocabConstraint(allowed=allowed))
    session = engine.session(batch_size=batch)
    for row in range(batch):
        session.submit(RowRequest(CfgPrompt(cond=[1, 2 + row % 5, 3], uncond=[1]), seed=row))
    return counted_steps(session, steps)


@pytest.mark.parametrize("method", ["ar", "sjd", "sjd_ac", "sjd_pac"])
def test_a_decode_step_reads_back_at_most_twice_at_any_batch_and_window(llama, method):
    seen = {}
    for batch in (1, 16):
        for window in (16, 64):
            counts = read_backs_per_step(llama, method, batch, window)
            assert len(counts) == 3
            assert max(counts) <= MAX_PER_STEP, (method, batch, window, counts)
            seen[batch, window] = counts
    assert len({tuple(c) for c in seen.values()}) == 1, seen  # the same count at every shape


def test_the_counter_sees_a_read_back(llama, monkeypatch):
    """The count has teeth: a proposer that reads its tensors back in a loop over rows is seen."""
    from raydec.speculative.proposers import jacobi

    original = jacobi.JacobiProposer.observe

    def chatty_observe(self, state, tree, target_probs, result, output):
        for row in range(state.batch_size):
            int(result.num_accepted[row])
        return original(self, state, tree, target_probs, result, output)

    monkeypatch.setattr(jacobi.JacobiProposer, "observe", chatty_observe)
    assert min(read_backs_per_step(llama, "sjd_pac", batch=4, window=16)) > MAX_PER_STEP


# -- draft-model trees (EAGLE, ViSpec) ----------------------------------------------------------

TREES = {16: DraftTreeConfig(depth=4, top_k=3, total_tokens=16), 64: DraftTreeConfig(depth=5, top_k=4, total_tokens=64)}


def _draft(target, vision: bool):
    from raydec.models.vispec_draft import DraftConfig, VispecDraft

    torch.manual_seed(0)
    model = target.model
    draft = VispecDraft(DraftConfig.for_target(model.config.get_text_config(), vision=vision, num_q=3))
    draft.attach_target(model.get_input_embeddings(), model.get_output_embeddings())
    return draft.to(target.dtype).eval().prepare_inference()  # the form loaded drafts run in


def tree_read_backs_per_step(target, draft, prompts, batch: int, total: int, steps: int = 3) -> list[int]:
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer

    config = DecodeConfig(method="vispec", max_new_tokens=40, sampling=SamplingConfig(temperature=1.0), draft_tree=TREES[total])
    engine = Engine(target, DraftTreeProposer(draft, config.tree), config.sampling, config.max_new_tokens)
    session = engine.session(batch_size=batch)
    for row in range(batch):
        session.submit(RowRequest(prompts[row % len(prompts)], seed=row))
    return counted_steps(session, steps)


def test_an_eagle_step_reads_back_at_most_twice_at_any_batch_and_tree(llama):
    draft = _draft(llama, vision=False)
    seen = {}
    for batch in (1, 16):
        for total in (16, 64):
            counts = tree_read_backs_per_step(llama, draft, [[1, 2, 3], [4, 5]], batch, total)
            assert len(counts) == 3 and max(counts) <= MAX_PER_STEP, (batch, total, counts)
            seen[batch, total] = counts
    assert len({tuple(c) for c in seen.values()}) == 1, seen


def test_a_vispec_step_on_a_vlm_reads_back_at_most_twice(tmp_path):
    from raydec.models.hf_vlm import VisionLanguageTarget, VlmPrompt
    from raydec.reference.shapes import make_sample, to_pil
    from tests.vlm_toys import build_tiny_llava

    llava = VisionLanguageTarget.from_pretrained(build_tiny_llava(tmp_path / "llava", layers=1))
    draft = _draft(llava, vision=True)
    prompts = [VlmPrompt(llava.format_prompt("describe the image .", 1), [to_pil(make_sample(100 + i).image)]) for i in range(2)]
    for batch in (1, 4):
        counts = tree_read_backs_per_step(llava, draft, prompts, batch, 16)
        assert len(counts) == 3 and max(counts) <= MAX_PER_STEP, (batch, counts)
