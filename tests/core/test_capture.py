"""Captured steps (raydec.speculative.capture): buckets and the switch on hand-made values; the
compiled step decodes the tokens the eager one does; its law is the target's.

Compiling costs tens of seconds per function on a CPU, so the end-to-end tests share one
module of targets and keep to a few shapes.
"""

from __future__ import annotations

import itertools

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


def test_a_variant_over_budget_or_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch, caplog):
    """Past ``MAX_VARIANTS`` a new variant runs the eager function; so does one whose compile fails
    (a branch on a tensor's value, which ``fullgraph`` refuses). One WARNING each, no exception, the
    eager result; variants compiled before keep running compiled."""
    import raydec.speculative.capture as capture

    def doubled(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2,)

    def branchy(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x + 1,) if bool(x.sum() > 0) else (x - 1,)

    monkeypatch.setattr(capture, "MAX_VARIANTS", 1)
    graph = StepGraph(doubled, "doubled", True, "cpu")
    rows = torch.ones(3, 4)
    with caplog.at_level("WARNING", logger="raydec.speculative.capture"):
        assert torch.equal(graph(3, (rows,))[0], rows * 2) and (graph.calls, graph.eager_calls) == (1, 0)
        for width in (5, 6):  # two more variants: over budget
            assert torch.equal(graph(3, (torch.ones(3, width),))[0], torch.full((3, width), 2.0))
        assert torch.equal(graph(2, (rows[:2],))[0], rows[:2] * 2)  # the first variant, another batch: compiled
        assert (graph.calls, graph.eager_calls) == (2, 2)
        failing = StepGraph(branchy, "branchy", True, "cpu")
        for _ in range(2):
            assert torch.equal(failing(3, (rows,))[0], rows + 1)
        assert (failing.calls, failing.eager_calls) == (0, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and "MAX_VARIANTS" in warnings[0] and "failed to compile" in warnings[1], warnings


# one float32 Llama and one CFG / top-k / constrained sampling for every test below, so the law
# test's graphs are the sjd_pac case's (compiled once: the compiler's cache holds them)
SAMPLING = SamplingConfig(temperature=1.0, top_k=4, cfg_scale=2.0)
CONSTRAINT = VocabConstraint(allowed=torch.tensor([True] * 7 + [False]))
SJD_PAC = dict(window=6, branching=2, tree_depth=2)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("capture"), vocab=8, seed=1, dtype=torch.float32)


@pytest.fixture(scope="module")
def llama16(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("capture16"), vocab=16, seed=2, dtype=torch.float32)


@pytest.fixture(scope="module")
def eagle_draft(llama):
    """A random text-only draft for ``llama``, in the inference form loaded drafts run."""
    from raydec.models.vispec_draft import DraftConfig, VispecDraft

    torch.manual_seed(0)
    draft = VispecDraft(DraftConfig.for_target(llama.model.config, vision=False, num_q=1))
    draft.attach_target(llama.model.get_input_embeddings(), llama.model.get_output_embeddings())
    return draft.eval().prepare_inference()


TREE = DraftTreeConfig(depth=3, top_k=2, total_tokens=6)


def _engine(target, config: DecodeConfig, draft=None, constraint=None) -> Engine:
    """An engine for ``config``; a Jacobi "above" prior reads a grid two tokens wide."""
    from raydec.speculative.proposers.factory import make_proposer

    if config.method in ("sjd", "sjd_ac", "sjd_pac") and config.jacobi.init == "above":
        proposer = JacobiProposer(config.jacobi, config.method, "above", grid_width=2)
    else:
        proposer = make_proposer(config, target, draft)
    return Engine(target, proposer, config.sampling, config.max_new_tokens, compile=config.compile, constraint=constraint)


def _requests(config: DecodeConfig, count: int) -> list[RowRequest]:
    """``count`` rows of different lengths (rows leave, queued rows join, the last decodes alone)."""
    lengths = [config.max_new_tokens, 4, config.max_new_tokens, 7, config.max_new_tokens]
    prompts = [CfgPrompt(cond=[1 + i % 7, 5, 6], uncond=[0]) if config.sampling.uses_cfg else [1 + i % 7, 5, 7] for i in range(count)]
    return [RowRequest(prompt, seed=i, max_new_tokens=lengths[i % len(lengths)]) for i, prompt in enumerate(prompts)]


def _shapes(vocab: int) -> list[DecodeConfig]:
    """Every method at a shape: on the vocabulary of 8 AR and the Jacobi methods with CFG, top-k and a
    vocabulary constraint (SJD-PAC's is the law test's below), EAGLE with plain sampling (the launch
    test's tree); on 16 AR and a chain with plain sampling. A shape compiles for up to half a minute
    here (a tree's verification the longest), while a batch is a dynamic size: the shapes are few,
    the batches many."""
    guided = DecodeConfig(max_new_tokens=10, sampling=SAMPLING if vocab == 8 else SamplingConfig(temperature=1.0), compile="on")
    jacobi = ([("sjd", dict(window=3), "uniform"), ("sjd_ac", dict(window=5), "left"), ("sjd_pac", SJD_PAC, "above")] if vocab == 8
              else [("sjd", dict(window=4), "uniform")])
    configs = [guided.model_copy(update={"method": "ar"})]
    configs += [guided.model_copy(update={"method": m, "jacobi": JacobiDraftConfig(**d, init=init)}) for m, d, init in jacobi]
    if vocab == 8:
        configs.append(guided.model_copy(update={"method": "eagle", "draft_tree": TREE, "sampling": SamplingConfig(temperature=1.0)}))
    return configs


def test_one_process_decodes_every_shape_it_meets_captured_as_the_eager_step_does(llama, llama16, eagle_draft, tmp_path, monkeypatch):
    """In one process with capture on: every method, several windows and trees, batches of 1 and 3
    (rows leave, queued rows join, the last one decodes alone; off CUDA a batch is a dynamic size, so
    batches 2 and 4 compile nothing new), two vocabularies, and a
    ``shape: auto`` tuning run over its full candidate list (screened eagerly, its finalists
    captured). More variants than dynamo's recompile limit (8) of one function; no decode raises or
    falls back to the eager step, and each decodes token for token what the eager step decodes."""
    from raydec.api.draft_shapes import candidate_configs
    from raydec.api.plan import CallCalibration, plan_decode
    from raydec.api.tuner import shape_label
    from raydec.speculative.capture import captured_variants

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path))
    compiled_before = {id(v) for v in captured_variants()}
    drafts = {8: eagle_draft, 16: None}
    decoded: set[tuple] = set()
    for vocab, target in ((8, llama), (16, llama16)):
        for config, batch in itertools.product(_shapes(vocab), (1, 3)):
            constraint = CONSTRAINT if vocab == 8 and config.method != "eagle" else None
            requests = _requests(config, batch + 2)
            tokens = {}
            for mode in ("off", "on"):
                engine = _engine(target, config.model_copy(update={"compile": mode}), drafts[vocab], constraint)
                tokens[mode] = [out.tokens for out in engine.generate(requests, batch_size=batch)]
                assert all(g.eager_calls == 0 for g in engine.step_graphs()) and (engine.verify_graph.calls > 0) == (mode == "on")
            assert tokens["on"] == tokens["off"], (vocab, shape_label(config), batch)
            decoded.add((vocab, config.method, shape_label(config), batch))

    # shape: auto at batch 2 over sjd's full candidate list (AR, four windows, two priors), captured: the tuner's own path
    base = DecodeConfig(method="sjd", jacobi="auto", max_new_tokens=8, sampling=SAMPLING, compile="on")
    requests = _requests(base, 8)
    met: list[str] = []

    def run(candidate: DecodeConfig, batch: int, rows: list[int]) -> None:
        met.append(f"{shape_label(candidate)}:{candidate.compile}")
        _engine(llama, candidate, constraint=CONSTRAINT).generate([requests[i] for i in rows], batch_size=batch)

    chosen = plan_decode(base, 2, CallCalibration(llama, len(requests), run, base.compile)).decode
    candidates = candidate_configs(base)
    assert len(candidates) == 9 and {f"{shape_label(c)}:off" for c in candidates} <= set(met)  # all screened eagerly
    captured = {m.split(":")[0] for m in met if m.endswith(":on")}
    assert 2 <= len(captured) <= 3 and shape_label(chosen) in captured and chosen.compile == "on"
    tokens = {mode: [out.tokens for out in _engine(llama, chosen.model_copy(update={"compile": mode}), constraint=CONSTRAINT)
                     .generate(requests, batch_size=2)] for mode in ("off", "on")}
    assert tokens["on"] == tokens["off"]
    decoded |= {(8, "tuned", label, 2) for label in captured}

    assert len(decoded) >= 14, len(decoded)  # 7 shapes at two batches, and the tuner's finalists
    steps = [v for v in captured_variants() if v.name in ("verify", "process", "jacobi_window", "jacobi_carry", "draft_tree")]
    verify = [v for v in steps if v.name == "verify"]
    assert len(verify) > 8 and all(v.compiled is not None for v in steps)  # past the limit, every variant compiled
    # a batch is a dynamic size off CUDA: each shape and vocabulary compiled once at most, whatever its batches
    assert len([v for v in verify if id(v) not in compiled_before]) <= len({(vocab, label) for vocab, _, label, _ in decoded})


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

