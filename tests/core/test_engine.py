"""Engine behaviour on real tiny LlamaForCausalLM checkpoints (saved and loaded by path)."""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.base import ForwardOutput
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.proposers.oracle import OracleProposer
from tests.proposers import RandomTreeProposer
from raydec.speculative.verify import verify_tree
from tests.toys import hf_greedy_lm, tiny_llama

torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation cost

PROMPTS = [[1, 5, 7, 9, 2], [3, 4], [8, 8, 8, 8, 8, 8, 2, 11], [10]]
GREEDY = SamplingConfig(temperature=0.0)
DRAFTS = {
    "chain-dense": (JacobiDraftConfig(window=5), "dense"),
    "chain-onehot": (JacobiDraftConfig(window=4), "onehot"),
    "tree": (JacobiDraftConfig(window=8, branching=2, tree_depth=2), "dense"),
}


@pytest.fixture(scope="module")
def llama32(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("l32"), vocab=64, seed=0, dtype=torch.float32, layers=2, hidden=32)


@pytest.fixture(scope="module")
def llama64(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("l64"), vocab=16, seed=2, dtype=torch.float64, layers=2, hidden=32)


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_hf_generate(llama32, draft, batch):
    spec, mode = DRAFTS[draft]
    config = DecodeConfig(max_new_tokens=20, sampling=GREEDY, jacobi=spec)
    engine = Engine(llama32, RandomTreeProposer(spec, mode), config.sampling, config.max_new_tokens, compaction=config.compaction)
    ours = []
    for start in range(0, len(PROMPTS), batch):
        ours += [o.tokens for o in engine.generate([RowRequest(p, seed=7) for p in PROMPTS[start : start + batch]])]
    assert ours == hf_greedy_lm(llama32, PROMPTS, 20, batch)


def test_ar_equals_hf_and_oracle_compresses(llama32):
    config = DecodeConfig(max_new_tokens=24, sampling=GREEDY)
    ar = Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    assert [o.tokens for o in ar] == hf_greedy_lm(llama32, PROMPTS, 24, 4)
    assert all(o.stats.target_forwards == 24 for o in ar)
    oracle = OracleProposer(window=7, references={i: o.tokens for i, o in enumerate(ar)})
    fast = Engine(llama32, oracle, config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    assert [o.tokens for o in fast] == [o.tokens for o in ar]
    # 1 prefill token, then 8 tokens per forward: 1 + 8 + 8 + 7 = 24 in 4 forwards
    assert all(o.stats.target_forwards == 4 for o in fast)


def test_eos_stops_rows_independently(llama32):
    config = DecodeConfig(max_new_tokens=30, sampling=GREEDY, jacobi=JacobiDraftConfig(window=4))
    free = Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    eos = free[0].tokens[5]
    engine = Engine(llama32, RandomTreeProposer(config.jacobi), config.sampling, config.max_new_tokens, compaction=config.compaction, eos_token_ids=[eos])
    outs = engine.generate([RowRequest(p, seed=0) for p in PROMPTS])
    for full, out in zip(free, outs):
        cut = full.tokens.index(eos) + 1 if eos in full.tokens else len(full.tokens)
        assert out.tokens == full.tokens[:cut]
        assert out.stats.finish_reason == ("eos" if eos in full.tokens else "length")


class RecordingTarget:
    """Delegates to a real target and remembers the raw logits of the last forward."""

    def __init__(self, inner):
        self.inner = inner
        self.last_logits = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, *args, **kwargs) -> ForwardOutput:
        out = self.inner.forward(*args, **kwargs)
        self.last_logits = out.logits
        return out


@pytest.mark.parametrize("compaction", ["never", "always", "auto"])
def test_ragged_cache_matches_fresh_prefill(llama32, compaction):
    """After any sequence of ragged commits, every tree node's logits equal a fresh prefill of
    the row's prompt + committed tokens + the node's draft path (max abs diff <= 1e-4)."""
    recorder = RecordingTarget(llama32)
    spec = JacobiDraftConfig(window=6, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=1.0), jacobi=spec, compaction=compaction)
    worst = [0.0]
    checks = [0]
    engine_ref: dict = {}

    def checking_verifier(tree, target_probs, uniforms):
        state_rows = engine_ref["state"]()
        logits = recorder.last_logits
        for i, (prompt, generated) in enumerate(state_rows):
            for node in range(tree.num_nodes):
                if not bool(tree.valid[i, node]):
                    continue
                path, cur = [], node
                while cur > 0:
                    path.append(int(tree.tokens[i, cur]))
                    cur = int(tree.parents[i, cur])
                ids = torch.tensor([prompt + generated + path[::-1]])
                with torch.no_grad():
                    fresh = llama32.model(input_ids=ids).logits[0, -1]
                worst[0] = max(worst[0], float((fresh - logits[i, node]).abs().max()))
                checks[0] += 1
        return verify_tree(tree, target_probs, uniforms)

    proposer = RandomTreeProposer(spec, "dense", sharpness=0.5)
    engine = Engine(recorder, proposer, config.sampling, config.max_new_tokens, compaction=config.compaction, verifier=checking_verifier)
    requests = [RowRequest(p, seed=3 + i, max_new_tokens=10 * (i + 1)) for i, p in enumerate(PROMPTS)]
    original_propose = proposer.propose

    def propose(state):
        engine_ref["state"] = lambda: [(PROMPTS[r], list(g)) for r, g in zip(state.row_handles, state.generated)]
        return original_propose(state)

    proposer.propose = propose
    outs = engine.generate(requests)
    assert [len(o.tokens) for o in outs] == [10, 20, 30, 40]
    assert checks[0] > 100
    assert worst[0] <= 1e-4, worst[0]


def test_row_alone_equals_row_in_batch(llama64):
    """Same seed -> identical tokens alone and inside a batch of 4 (float64 model)."""
    spec = JacobiDraftConfig(window=5, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=16, sampling=SamplingConfig(temperature=1.0, top_p=0.9), jacobi=spec)
    prompts = [[p % 16 for p in prompt] for prompt in PROMPTS]
    requests = [RowRequest(p, seed=100 + i) for i, p in enumerate(prompts)]
    together = Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate(requests)
    for i, request in enumerate(requests):
        alone = Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([request])[0]
        assert alone.tokens == together[i].tokens
    assert len({tuple(o.tokens) for o in together}) > 1


def test_cfg_rows_share_one_decision(llama64):
    """CFG: paired cond/uncond model rows, one window and one acceptance per prompt."""
    spec = JacobiDraftConfig(window=4)
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.5, top_k=5)
    config = DecodeConfig(max_new_tokens=12, sampling=sampling, jacobi=spec)
    prompts = [CfgPrompt(cond=[1, 2, 3], uncond=[0]), CfgPrompt(cond=[4, 5], uncond=[0])]
    outs = Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=i) for i, p in enumerate(prompts)])
    alone = Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(prompts[1], seed=1)])
    assert outs[1].tokens == alone[0].tokens
    assert all(len(o.tokens) == 12 for o in outs)


def test_a_draft_model_proposer_with_cfg_is_refused_when_the_engine_is_built(llama64):
    """A draft model drafts from the conditional rows' hidden states alone: with classifier-free
    guidance the engine refuses it at construction, naming the field, not at its first step."""
    from raydec.models.vispec_draft import DraftConfig, VispecDraft
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer

    draft = VispecDraft(DraftConfig.for_target(llama64.model.config, vision=False, num_q=1))
    with pytest.raises(ValueError, match=r"sampling.cfg_scale=2.5: classifier-free guidance needs a proposer without a draft"):
        Engine(llama64, DraftTreeProposer(draft), SamplingConfig(temperature=1.0, cfg_scale=2.5), 8)
    with pytest.raises(ValueError, match=r"sampling.cfg_scale=2.5: method 'eagle' drafts with a draft model"):  # and in a config
        DecodeConfig(method="eagle", sampling=SamplingConfig(cfg_scale=2.5))


@pytest.mark.parametrize("method", ["ar", "sjd_pac"])
def test_continuous_batching_equals_each_row_alone(llama64, method):
    """batch_size=2 over 6 requests of different prompts and lengths (CFG on, float64): queued
    rows take finished rows' places, and every row's tokens equal its run alone."""
    spec = JacobiDraftConfig(window=5, branching=2, tree_depth=1)
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.5, top_k=6)
    config = DecodeConfig(method=method, max_new_tokens=14, sampling=sampling, jacobi=spec)
    proposer = lambda: ARProposer() if method == "ar" else JacobiProposer(spec, "sjd_pac", "uniform")  # noqa: E731
    prompts = [CfgPrompt(cond=[p % 16 for p in prompt], uncond=[0]) for prompt in PROMPTS]
    requests = [RowRequest(prompts[i % 4], seed=10 + i, max_new_tokens=[14, 3, 9, 14, 1, 6][i]) for i in range(6)]
    finished, widths = [], []
    engine = Engine(llama64, proposer(), config.sampling, config.max_new_tokens, compaction=config.compaction)
    forward = llama64.forward

    def counting_forward(*args, **kwargs):
        widths.append(args[3].shape[0])  # model rows in this forward
        return forward(*args, **kwargs)

    llama64.forward = counting_forward
    try:
        together = engine.generate(requests, batch_size=2, on_finish=lambda i, out: finished.append((i, len(out.tokens))))
    finally:
        del llama64.forward
    assert max(widths) == 4  # two rows (cond + uncond each), never more
    assert sorted(finished) == [(i, r.max_new_tokens) for i, r in enumerate(requests)]
    assert [i for i, _ in finished] != list(range(6))  # a short queued row overtook a long one
    for i, request in enumerate(requests):
        alone = Engine(llama64, proposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([request])[0]
        assert alone.tokens == together[i].tokens, i
        assert together[i].stats.finish_reason == "length" and together[i].stats.wall_time_s > 0


def test_proposers_that_cannot_admit_rows_run_consecutive_batches(llama64):
    spec = JacobiDraftConfig(window=4)
    config = DecodeConfig(max_new_tokens=5, sampling=SamplingConfig(temperature=1.0), jacobi=spec)
    requests = [RowRequest([p % 16 for p in PROMPTS[i % 4]], seed=i, max_new_tokens=[5, 2, 4][i]) for i in range(3)]
    together = Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate(requests, batch_size=2)
    for i, request in enumerate(requests):
        assert Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([request])[0].tokens == together[i].tokens
    with pytest.raises(ValueError, match="batch_size"):
        Engine(llama64, RandomTreeProposer(spec), config.sampling, config.max_new_tokens, compaction=config.compaction).generate(requests, batch_size=0)


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="extra"):
        DecodeConfig.model_validate({"method": "ar", "max_new_tokenz": 3})
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="window"):
        DecodeConfig(jacobi=JacobiDraftConfig(window=4, branching=3, tree_depth=2))


def test_config_numbers_refuse_booleans():
    """Pydantic reads True as 1: `window: true` in a job file must not become a 1-token window."""
    from raydec.runtime.config import PoolConfig

    for make, field in [
        (lambda: JacobiDraftConfig(window=True), "window"),
        (lambda: SamplingConfig(temperature=False), "temperature"),
        (lambda: DecodeConfig.model_validate({"max_new_tokens": True}), "max_new_tokens"),
        (lambda: PoolConfig(workers=True), "workers"),
    ]:
        with pytest.raises(ValueError, match=rf"{field}\n.*expected a number, got the boolean"):
            make()
    spec = JacobiDraftConfig(window=8)
    with pytest.raises(ValueError, match="boolean"):  # on assignment too
        spec.branching = True
    assert JacobiDraftConfig(window=8, branching=2, tree_depth=1).window == 8 and SamplingConfig(temperature=1).temperature == 1.0


def test_keys_of_earlier_releases_load_with_a_warning_and_not_beside_their_new_name():
    """`decode.jacobi` is `decode.jacobi` now: a YAML file of an earlier release still loads (and
    says what to write instead); giving both is an error naming both."""
    with pytest.warns(FutureWarning, match="'draft' is now 'jacobi'"):
        config = DecodeConfig.model_validate({"method": "sjd", "draft": {"window": 8}})
    assert config.jacobi == JacobiDraftConfig(window=8) and "draft" not in DecodeConfig.model_fields
    with pytest.raises(ValueError, match="draft and jacobi: give only jacobi"):
        DecodeConfig.model_validate({"draft": {"window": 8}, "jacobi": {"window": 4}})
    from raydec.serve.config import ServedModel

    with pytest.warns(FutureWarning) as record:
        served = ServedModel.model_validate({"name": "m", "task": "t2i", "max_batch_size": 4, "num_gpus": 1, "num_cpus": 2})
    assert sorted(str(w.message).split(":")[1].split(";")[0].strip() for w in record) == [
        "the key 'max_batch_size' is now 'batch_size'", "the key 'num_cpus' is now 'cpus_per_worker'", "the key 'num_gpus' is now 'gpus_per_worker'"]
    assert (served.batch_size, served.gpus_per_worker, served.cpus_per_worker) == (4, 1.0, 2.0)


def test_python_names_of_earlier_releases_still_import_with_a_warning():
    """`raydec.api.load_draft` is `load_draft_model` now: the old name still imports (from
    raydec.api and raydec), with a warning naming the new one."""
    import raydec
    import raydec.api
    from raydec.api import RENAMED_NAMES

    assert RENAMED_NAMES == {"raydec.api.load_draft": "raydec.api.load_draft_model"}
    with pytest.warns(FutureWarning, match="raydec.api.load_draft is now load_draft_model; load_draft stops loading in raydec 0.2.0"):
        from raydec.api import load_draft
    assert load_draft is raydec.api.load_draft_model and "load_draft" not in raydec.api.__all__
    with pytest.warns(FutureWarning, match="load_draft is now load_draft_model"):
        assert raydec.load_draft is raydec.load_draft_model
    with pytest.raises(AttributeError):
        raydec.api.no_such_name


def test_gpu_decoding_excludes_cudnn_attention_and_restores_the_flags():
    """cuDNN's attention builds a graph per new sequence length: a decode loop on a GPU must
    not use it. The policy is scoped: flags come back on exit, and the CPU is left alone."""
    from raydec.models.base import decoding_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with decoding_attention("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with decoding_attention("cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_adapters_decode_under_the_attention_policy_of_their_device(llama32, monkeypatch):
    """The policy lives in the adapters (the decoding core knows no attention kernels): every
    window forward, prefill and decode steps alike, runs under it for the model's device."""
    from contextlib import nullcontext

    import raydec.models.base as base

    seen = []
    monkeypatch.setattr(base, "decoding_attention", lambda device: seen.append(device) or nullcontext())
    config = DecodeConfig(method="ar", max_new_tokens=3, sampling=SamplingConfig(temperature=0.0))
    Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(prompt=[1, 2, 3], seed=0)])
    assert seen == [llama32.device] * 3  # the prefill and two decode steps


def test_a_row_length_cap_below_one_is_refused(llama32):
    engine = Engine(llama32, ARProposer(), GREEDY, 4)
    with pytest.raises(ValueError, match=r"requests\[1\].max_new_tokens: 0 must be >= 1"):
        engine.generate([RowRequest([1, 2], seed=0), RowRequest([3], seed=0, max_new_tokens=0)])
    assert len(engine.generate([RowRequest([1, 2], seed=0, max_new_tokens=1)])[0].tokens) == 1


def test_rows_stop_where_the_models_positions_end(llama32):
    config = DecodeConfig(max_new_tokens=10, sampling=GREEDY)
    free = Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(PROMPTS[0], seed=0)])[0].tokens
    capped = Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction, max_positions=8).generate([RowRequest(PROMPTS[0], seed=0)])[0].tokens
    assert capped == free[:3]  # 5 prompt positions of 8
    with pytest.raises(ValueError, match=r"requests\[0\]: its prompt takes positions up to 8, the model has 8"):
        Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction, max_positions=8).generate([RowRequest(PROMPTS[2], seed=0)])
