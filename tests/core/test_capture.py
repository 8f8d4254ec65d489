"""Captured steps (raydec.speculative.capture): buckets and the switch on hand-made values; the
compiled step decodes the tokens the eager one does; its law is the target's.

Compiling costs tens of seconds per function on a CPU, so the end-to-end tests share one
module of targets and keep to a few shapes.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative.capture import BATCH_BUCKETS, StepGraph, batch_bucket, pad_rows, resolve_compile
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.random import counter_uniforms
from raydec.speculative.requests import RowRequest
from raydec.speculative.sampling import VocabConstraint
from tests.lawtest import PATH_SAMPLES, compare_to_law, sample_engine
from tests.toys import lm_law, tiny_llama

torch.set_num_threads(1)


def test_batches_run_at_the_first_bucket_that_holds_them():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 33, 256)] == [1, 2, 4, 8, 8, 16, 64, 256]
    assert batch_bucket(257) == 2 * BATCH_BUCKETS[-1] and batch_bucket(600) == 3 * BATCH_BUCKETS[-1]
    with pytest.raises(ValueError, match="at least one row"):
        batch_bucket(0)
    rows = torch.tensor([[1, 2], [3, 4], [5, 6]])
    assert pad_rows(rows, 5).tolist() == [[1, 2], [3, 4], [5, 6], [5, 6], [5, 6]]
    assert pad_rows(rows, 3) is rows


def test_the_switch_is_on_for_cuda_under_auto():
    assert resolve_compile("auto", "cuda") and not resolve_compile("auto", "cpu")
    assert resolve_compile("on", "cpu") and not resolve_compile("off", "cuda")
    with pytest.raises(ValueError, match="compile: 'yes'"):
        resolve_compile("yes", "cpu")
    with pytest.raises(ValueError, match="compile"):
        DecodeConfig(compile="always")


def test_compiled_uniforms_are_the_eager_bits():
    """Counter-based uniforms wrap int64 products; a compiled graph calls the eager kernels
    (generated loops gave other bits in the tail of a row on this CPU)."""
    seeds, steps = torch.arange(5), torch.tensor([0, 1, 2, 3, 2**40])
    graph = StepGraph(lambda s, t: (counter_uniforms(s, t, 3, 28),), "uniforms", True, "cpu")
    (compiled,) = graph(5, (seeds, steps))
    assert torch.equal(compiled, counter_uniforms(seeds, steps, 3, 28)) and graph.calls == 1


# one float32 Llama and one CFG / top-k / constrained sampling for every test below, so the law
# test's graphs are the sjd_pac case's (compiled once: the compiler's cache holds them)
SAMPLING = SamplingConfig(temperature=1.0, top_k=4, cfg_scale=2.0)
CONSTRAINT = VocabConstraint(allowed=torch.tensor([True] * 7 + [False]))
SJD_PAC = dict(window=6, branching=2, tree_depth=2)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("capture"), vocab=8, seed=1, dtype=torch.float32)


def _decode(target, proposer, sampling, compile, requests, batch_size, constraint=None):
    engine = Engine(target, proposer, sampling, 10, compile=compile, constraint=constraint)
    return [out.tokens for out in engine.generate(requests, batch_size=batch_size)]


@pytest.mark.parametrize("variant,init,draft", [
    ("sjd", "uniform", dict(window=5)),
    ("sjd_ac", "left", dict(window=5)),
    ("sjd_pac", "above", SJD_PAC),
])
def test_captured_jacobi_steps_decode_the_eager_tokens(llama, variant, init, draft):
    """float32, CFG, top-k and a vocabulary constraint; five rows at batch size 3 (rows leave,
    queued rows join, the last one decodes alone): token for token what the eager step decodes."""
    spec = JacobiDraftConfig(**draft)
    requests = [RowRequest(CfgPrompt(cond=[1 + i, 5, 6], uncond=[0]), seed=i, max_new_tokens=[10, 4, 10, 7, 10][i]) for i in range(5)]
    outputs = {mode: _decode(llama, JacobiProposer(spec, variant, init, grid_width=2), SAMPLING, mode, requests, 3, CONSTRAINT)
               for mode in ("off", "on")}
    assert outputs["on"] == outputs["off"]


TREE = DraftTreeConfig(depth=3, top_k=2, total_tokens=6)


@pytest.fixture(scope="module")
def eagle_draft(llama):
    """A random text-only draft for ``llama``, in the inference form loaded drafts run."""
    from raydec.models.vispec_draft import DraftConfig, VispecDraft

    torch.manual_seed(0)
    draft = VispecDraft(DraftConfig.for_target(llama.model.config, vision=False, num_q=1))
    draft.attach_target(llama.model.get_input_embeddings(), llama.model.get_output_embeddings())
    return draft.eval().prepare_inference()


def test_captured_draft_tree_steps_decode_the_eager_tokens(llama, eagle_draft):
    """EAGLE on the same Llama: the draft's catch-up, tree search and selection, the verification
    and the processing captured; five rows at batch size 3 (rows leave, queued rows join, the
    last one decodes alone): token for token what the eager step decodes."""
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer

    requests = [RowRequest([1 + i, 5, 7], seed=i, max_new_tokens=[10, 4, 10, 7, 10][i]) for i in range(5)]
    proposers = {mode: DraftTreeProposer(eagle_draft, TREE) for mode in ("off", "on")}
    outputs = {mode: _decode(llama, proposers[mode], SamplingConfig(temperature=1.0), mode, requests, 3) for mode in ("off", "on")}
    assert outputs["on"] == outputs["off"]
    assert proposers["on"]._step_graph.calls > 0 and proposers["off"]._step_graph.calls == 0


def test_captured_sjd_pac_keeps_the_targets_law(llama):
    """The law test of the CFG / top-k / spatial-prior case (tests/core/test_exactness_sjd.py)
    with the step captured: the output law is still the target's."""
    length = 5
    config = DecodeConfig(max_new_tokens=length, sampling=SAMPLING, jacobi=JacobiDraftConfig(**SJD_PAC), compile="on")
    prompt = CfgPrompt(cond=[5, 2, 6], uncond=[0])
    proposer = JacobiProposer(config.jacobi, "sjd_pac", "above", grid_width=2)
    samples = sample_engine(llama, proposer, config, [prompt], list(range(PATH_SAMPLES)), PATH_SAMPLES, constraint=CONSTRAINT)
    report = compare_to_law(samples, lm_law(llama, prompt, length, SAMPLING, CONSTRAINT))
    assert report.passed, str(report)


@pytest.mark.parametrize("method", ["sjd_pac", "eagle"])
def test_a_captured_step_launches_a_few_graphs_and_operators(llama, eagle_draft, method):
    """``raydec bench step``'s count on a captured step: at most 60 launches outside the target
    forward for sjd_pac, 60 and 2 per draft level for EAGLE (eager, several hundred)."""
    from raydec.bench.step import TimedTarget, measure_session
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer

    counts = {}
    for mode in ("on", "off"):
        timed = TimedTarget(llama)
        if method == "eagle":
            engine = Engine(timed, DraftTreeProposer(eagle_draft, TREE), SamplingConfig(temperature=1.0), 10, compile=mode)
            prompts = [[1 + i, 5, 7] for i in range(3)]
        else:
            engine = Engine(timed, JacobiProposer(JacobiDraftConfig(**SJD_PAC), "sjd_pac", "above", grid_width=2), SAMPLING, 10,
                            compile=mode, constraint=CONSTRAINT)
            prompts = [CfgPrompt(cond=[1 + i, 5, 6], uncond=[0]) for i in range(3)]
        session = engine.session(batch_size=3)
        for i, prompt in enumerate(prompts):
            session.submit(RowRequest(prompt, seed=i))
        counts[mode] = measure_session(session, timed, steps=1, warmup=1)["launches_per_step"]
    bound = 60 + 2 * TREE.depth if method == "eagle" else 60
    assert counts["on"] <= bound < counts["off"], counts
