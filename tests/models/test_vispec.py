"""ViSpec / EAGLE-2 draft trees: unit tests on hand-made tensors, greedy equality with Hugging
Face ``generate()`` on a tiny LLaVA, and the exactness harness at temperature 1."""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, DraftTreeConfig, SamplingConfig
from raydec.models.hf_vlm import VisionLanguageTarget, VlmPrompt
from raydec.models.vispec_draft import DraftConfig, VispecDraft
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.draft_tree import DraftTreeProposer, _select_on_tensors, _TreeLayout, select_tree_nodes
from raydec.speculative.proposers.tree_search import SearchConstants
from tests.lawtest import compare_to_law, sample_engine
from tests.toys import lm_law, tiny_llama
from tests.vlm_toys import build_tiny_llava, draft_for, hf_greedy_vlm, successor_draft, vlm_prompts

torch.set_num_threads(1)


# -- tree selection and sequences -----------------------------------------------------------


def test_selection_prefers_score_then_shallower_so_parents_survive():
    # candidates: a (depth 1, logp 0), its child b (depth 2, logp 0: a tie), c (depth 1, -1)
    scores = torch.tensor([[0.0, -1.0, 0.0, -3.0]])
    depths = torch.tensor([[1, 1, 2, 2]])
    assert select_tree_nodes(scores, depths, 2).tolist() == [[0, 2]]
    assert select_tree_nodes(scores, depths, 3).tolist() == [[0, 2, 1]]


def _random_candidates(batch: int, k: int, depth: int, gen: torch.Generator):
    """Candidates laid out as the proposer grows them (level 1: the root's K children; level l:
    K children of each of the K best of level l-1), with scores on a coarse grid so that ties
    are common. -> scores, tokens, parents [B, C], depth [C]"""
    score = -torch.randint(0, 3, (batch, k), generator=gen).float()
    scores, parents, depths = [score], [torch.full((batch, k), -1)], [1] * k
    frontier, frontier_score, offset = torch.arange(k).expand(batch, k), score, k
    for level in range(2, depth + 1):
        child = (frontier_score.unsqueeze(-1) - torch.randint(0, 3, (batch, k, k), generator=gen).float()).view(batch, k * k)
        scores.append(child)
        parents.append(frontier.repeat_interleave(k, dim=1))
        depths += [level] * (k * k)
        best = child.topk(k, dim=-1).indices
        frontier, frontier_score, offset = best + offset, child.gather(1, best), offset + k * k
    scores = torch.cat(scores, 1)
    tokens = torch.randint(0, 50, scores.shape, generator=gen)
    return scores, tokens, torch.cat(parents, 1), torch.tensor(depths)


def _select_on_lists(  # the tensor form, on Python lists: the reference it is tested against

    roots: list[int], scores: list[list[float]], tokens: list[list[int]], parents: list[list[int]], depths: list[int], count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_select_on_tensors`` for a few rows, on Python lists (the same order: score descending,
    then depth ascending, then candidate index; then by depth, stable), with the ancestor mask
    [B, count + 1, count + 1] built as it goes. depths: [C] per candidate."""
    out_tokens, out_parents, out_depth, out_ancestors = [], [], [], []
    for root, row_scores, row_tokens, row_parents in zip(roots, scores, tokens, parents):
        ranked = sorted(range(len(row_scores)), key=lambda c: (-row_scores[c], depths[c], c))[:count]
        chosen = sorted(ranked, key=depths.__getitem__)  # stable: by depth, then rank
        node_of = {c: i + 1 for i, c in enumerate(chosen)}
        node_parents, ancestors = [-1], [[True] + [False] * count]
        for i, c in enumerate(chosen, start=1):
            parent = 0 if row_parents[c] < 0 else node_of.get(row_parents[c], -1)
            if parent < 0:
                raise RuntimeError("draft tree selection dropped a parent")
            node_parents.append(parent)
            seen = list(ancestors[parent])  # a parent precedes its children: its row is complete
            seen[i] = True
            ancestors.append(seen)
        out_tokens.append([root] + [row_tokens[c] for c in chosen])
        out_parents.append(node_parents)
        out_depth.append([0] + [depths[c] for c in chosen])
        out_ancestors.append(ancestors)
    return torch.tensor(out_tokens), torch.tensor(out_parents), torch.tensor(out_depth), torch.tensor(out_ancestors)


def test_tree_selection_equals_a_selection_on_lists():
    """The tensor selection's nodes, their order, parents and depths equal a plain Python
    selection's (score descending, then depth, then index; then by depth), and the tree's derived
    ancestor masks equal the ones built along the way, on 400 random candidate sets full of ties."""
    from raydec.speculative.tree import DraftTree, ancestors_within

    gen = torch.Generator().manual_seed(0)
    for trial in range(400):
        batch, k, depth = 1 + trial % 3, 2 + trial % 4, 1 + trial % 5
        scores, tokens, parents, depths = _random_candidates(batch, k, depth, gen)
        count = min(scores.shape[1], 1 + trial % 17)
        layout = _TreeLayout(key=(batch, k, depth), cand_depth=depths.expand(batch, -1),
                             search=SearchConstants.make(batch, k, torch.device("cpu"), torch.float32))
        roots = torch.randint(0, 50, (batch,), generator=gen)
        on_tensors = _select_on_tensors(roots, layout, scores, tokens, parents, count)
        on_lists = _select_on_lists(roots.tolist(), scores.tolist(), tokens.tolist(), parents.tolist(), depths.tolist(), count)
        for name, a, b in zip(("tokens", "parents", "depth"), on_tensors[:3], on_lists[:3]):
            assert torch.equal(a, b), (trial, name, a, b)
        tree = DraftTree(on_lists[0], on_lists[1], torch.ones_like(on_lists[1], dtype=torch.bool),
                         torch.full_like(on_lists[1], -1), torch.zeros_like(on_lists[1], dtype=torch.bool), torch.zeros(batch, 0, 50))
        assert torch.equal(on_lists[3], tree.ancestor_mask()), trial
        assert torch.equal(on_lists[3], ancestors_within(on_lists[1], torch.ones_like(on_lists[1], dtype=torch.bool), depth)), trial  # the captured step's
        assert torch.equal(on_lists[2], tree.depth()), trial


def test_compressed_tokens_take_the_last_positions_of_their_span():
    config = DraftConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=4, vocab_size=5, num_q=3, adaptor_heads=2)
    draft = VispecDraft(config)
    token_image = torch.tensor([-1, -1, 0, 0, 0, 0, -1, 1, 1, -1])
    n = token_image.numel()
    embeds, features = torch.randn(n, 8), torch.randn(n, 8)
    seq = draft.build_sequence(embeds, features, token_image, torch.arange(n))
    assert seq.positions.tolist() == [0, 1, 4, 5, 6, 7, 8, 9]
    assert seq.global_index.tolist() == [-1, -1, -1, -1, 0, -1, -1, 1]
    assert seq.globals_.shape == (2, 8)
    # features keep their own slots; embeddings of the kept span slots are the adaptor's outputs
    assert torch.equal(seq.features, features[[0, 1, 4, 5, 6, 7, 8, 9]])
    assert torch.allclose(seq.token_embeds[2:4], draft.adaptor(embeds[2:6])[:2])
    assert torch.allclose(seq.token_embeds[5:7], draft.adaptor(embeds[7:9])[:2])
    assert torch.equal(seq.token_embeds[4], embeds[6])


def test_fresh_img_fc_reproduces_the_eagle_draft(tmp_path):
    """img_fc = [I|0] and no image tokens: the ViSpec draft equals the text-only draft exactly."""
    target = tiny_llama(tmp_path, vocab=8, dtype=torch.float64)
    vispec, eagle = draft_for(target, vision=True), draft_for(target, vision=False)
    eagle.load_state_dict({k: v for k, v in vispec.state_dict().items() if not k.startswith(("adaptor.", "img_fc."))})
    x, f, g = (torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(5).expand(2, 5)
    use = torch.rand(2, 5) < 0.5
    assert torch.equal(vispec(x, f, pos, globals_=g, use_global=use), eagle(x, f, pos))
    config = DecodeConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=1.0), draft_tree=DraftTreeConfig(depth=3, top_k=2, total_tokens=6))
    outs = []
    for draft in (vispec, eagle):
        engine = Engine(target, DraftTreeProposer(draft, config.tree), config.sampling, config.max_new_tokens)
        outs.append([(o.tokens, o.stats.accepted_lengths) for o in engine.generate([RowRequest([1, 2, 3], seed=s) for s in range(4)])])
    assert outs[0] == outs[1]


def test_draft_checkpoint_round_trip(tmp_path):
    target = tiny_llama(tmp_path, vocab=8, dtype=torch.float32)
    draft = draft_for(target, vision=True)
    draft.save_pretrained(tmp_path / "draft")
    loaded = VispecDraft.from_pretrained(tmp_path / "draft")
    for (name, a), (_, b) in zip(draft.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(FileNotFoundError, match="no draft checkpoint"):
        VispecDraft.from_pretrained(tmp_path / "missing")


def test_fused_inference_layer_computes_the_hugging_face_layer():
    """The inference snapshot (fused GEMMs, rotary table) equals the HF decoder layer: with a
    cache and a tree mask, grouped-query heads, far positions; training or casting drops it."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    config = DraftConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=4, vocab_size=9, vision=False)
    draft = VispecDraft(config).to(torch.float64).eval()
    x, f = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [300, 301, 302, 303, 304, 305, 306]])
    window = (torch.rand(2, 3, 3) < 0.5) | torch.eye(3, dtype=torch.bool)
    mask = torch.zeros(2, 1, 3, 7, dtype=torch.float64)
    mask[:, 0, :, 4:] = torch.zeros(2, 3, 3, dtype=torch.float64).masked_fill(~window, float("-inf"))
    outputs = []
    for fused in (False, True):
        if fused:
            draft.prepare_inference()
        cache = DynamicCache()
        prefix = draft(x[:, :4], f[:, :4], pos[:, :4], None, cache)
        outputs.append((prefix, draft(x[:, 4:], f[:, 4:], pos[:, 4:], mask, cache)))
    for hf, fused in zip(*outputs):
        assert torch.allclose(hf, fused, rtol=1e-10, atol=1e-10)
    assert draft._fused is not None and draft.train()._fused is None
    assert draft.eval().prepare_inference().float()._fused is None


def test_folded_input_computes_fc_after_img_fc():
    """Decode steps' inference form folds img_fc into fc (one GEMM + a per-row bias): equal to the
    two-step form, for rows with and without an image in one batch; the text-only draft folds
    nothing; ``decode_forward`` of the prepared draft equals ``forward`` of the module."""
    from transformers import DynamicCache

    from raydec.models.folded_input import FoldedDraftInput

    torch.manual_seed(0)
    config = DraftConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=4, vocab_size=9, vision=True)
    draft = VispecDraft(config).to(torch.float64).eval()
    with torch.no_grad():
        draft.img_fc.weight.normal_()  # a trained img_fc, not [I|0]: the global term matters
        draft.img_fc.bias.normal_()
    e, f = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 5, 16, dtype=torch.float64)
    g = torch.randn(3, 16, dtype=torch.float64)
    folded = FoldedDraftInput(draft.fc, draft.img_fc)
    for has in ([True, False, True], [True] * 3, [False] * 3):
        has = torch.tensor(has)
        use = has.unsqueeze(1).expand(3, 5)
        expected = draft.fc(torch.cat([e, draft.inject_global(f, g.unsqueeze(1).expand(3, 5, 16), use)], dim=-1))
        assert torch.allclose(folded(e, f, folded.rows(g, has)), expected, rtol=1e-12, atol=1e-12), has
        assert torch.allclose(folded(e[:1], f[:1], folded.rows(g[:1], has[:1])), expected[:1], rtol=1e-12, atol=1e-12)
        for keep in ([2, 0], [1], [0, 2]):  # rows leaving the batch: the kept rows' biases and flags
            kept, index = folded.rows(g, has).select(keep), torch.tensor(keep)
            assert torch.allclose(folded(e[index], f[index], kept), expected[index], rtol=1e-12, atol=1e-12), (has, keep)
            fresh = folded.rows(g[index], has[index])
            assert (kept.mixed, kept.any_global) == (fresh.mixed, fresh.any_global) and torch.equal(kept.bias, fresh.bias)
    text_only = VispecDraft(config.model_copy(update={"vision": False})).to(torch.float64)
    plain = FoldedDraftInput(text_only.fc, None)
    assert torch.allclose(plain(e, f, plain.rows(g, torch.ones(3, dtype=torch.bool))),
                          text_only.fc(torch.cat([e, f], dim=-1)), rtol=1e-12, atol=1e-12)

    pos = torch.arange(5).expand(3, 5) + 7
    mask = torch.zeros(3, 1, 5, 5, dtype=torch.float64)
    has = torch.tensor([True, False, True])
    outputs = []
    for prepared in (False, True):
        if prepared:
            draft.prepare_inference()
        outputs.append(draft.decode_forward(e, f, pos, mask, DynamicCache(), draft.decode_rows(g, has)))
    assert torch.allclose(outputs[0], outputs[1], rtol=1e-10, atol=1e-10)
    assert draft._input is not None and draft.train()._input is None


def test_inference_logits_multiply_by_the_heads_row_major_copy(llava):
    """A prepared fp32 draft of a bf16 CPU target whose linears keep fp32 row-major copies
    (cpu_matmul) scores with the head's own copy: one GEMM, fp32 logits, equal to the bf16 head's
    up to its rounding; an unprepared draft calls the head in its dtype."""
    from raydec.models.cpu_matmul import route_cpu_linears, row_major_weight

    draft = draft_for(llava, vision=True, dtype=torch.float32)
    torch.manual_seed(0)
    head = torch.nn.Linear(draft.config.hidden_size, draft.config.vocab_size, bias=False).to(torch.bfloat16)
    draft.attach_target(draft.embed, head)  # a bf16 head of our own: the fixture's stays untouched
    h = torch.randn(2, 3, draft.config.hidden_size)
    route_cpu_linears(head, torch.float32)
    weight_t, _ = row_major_weight(head, torch.float32)
    assert row_major_weight(head, torch.bfloat16) is None
    assert draft.logits(h).dtype == torch.bfloat16  # training form: the head, in its dtype
    draft.prepare_inference()
    logits = draft.logits(h)
    assert logits.dtype == torch.float32 and torch.equal(logits, (h.reshape(6, -1) @ weight_t).view(2, 3, -1))
    assert torch.allclose(logits, head(h.to(torch.bfloat16)).float(), rtol=2e-2, atol=2e-2)


# -- greedy equality on a tiny LLaVA ----------------------------------------------------------


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return VisionLanguageTarget.from_pretrained(build_tiny_llava(tmp_path_factory.mktemp("llava")))


@pytest.mark.parametrize("vision", [True, False], ids=["vispec", "eagle"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_hf_generate(llava, vision, batch):
    """With drafts the target accepts (several tokens per forward), so accepted tree nodes,
    their cache entries and the draft's re-drafting after them are all on the tested path."""
    length = 16
    prompts = vlm_prompts(llava, 4)
    expected = [hf_greedy_vlm(llava, prompt, length) for prompt in prompts]
    config = DecodeConfig(max_new_tokens=length, sampling=SamplingConfig(temperature=0.0), draft_tree=DraftTreeConfig(depth=3, top_k=3, total_tokens=10))
    draft = successor_draft(llava, expected, vision)
    if batch > 1:  # the inference form loaded drafts run (fused layer, folded input)
        draft.prepare_inference()
    engine = Engine(llava, DraftTreeProposer(draft, config.tree), config.sampling, config.max_new_tokens, eos_token_ids=llava.eos_token_ids)
    outputs = []
    for start in range(0, len(prompts), batch):
        outputs += engine.generate([RowRequest(p, seed=0) for p in prompts[start : start + batch]])
    assert [out.tokens for out in outputs] == expected
    accepted = [out.stats.accepted_lengths for out in outputs]
    assert all(max(a) >= 2 for a in accepted) and max(map(max, accepted)) == 4, accepted  # 4: depth 3 + bonus


def test_continuous_batching_with_image_rows_equals_hf_generate(llava):
    """At most 2 rows at a time over 5 prompts of one or two images and different lengths: rows
    join mid-run through their own draft prefill (their image's global feature with them)."""
    prompts = vlm_prompts(llava, 5)
    lengths = [16, 5, 11, 16, 3]
    expected = [hf_greedy_vlm(llava, prompt, n) for prompt, n in zip(prompts, lengths)]
    config = DecodeConfig(max_new_tokens=16, sampling=SamplingConfig(temperature=0.0), draft_tree=DraftTreeConfig(depth=3, top_k=3, total_tokens=10))
    engine = Engine(llava, DraftTreeProposer(successor_draft(llava, expected, True), config.tree), config.sampling, config.max_new_tokens, eos_token_ids=llava.eos_token_ids)
    outputs = engine.generate([RowRequest(p, seed=0, max_new_tokens=n) for p, n in zip(prompts, lengths)], batch_size=2)
    assert [out.tokens for out in outputs] == expected
    assert max(max(out.stats.accepted_lengths, default=0) for out in outputs) >= 3


def test_captured_vispec_steps_decode_the_eager_tokens(llava):
    """``compile: on`` captures the draft's catch-up, tree search and selection with the rest of
    the step. A ViSpec draft in its inference form; prompts with one or two images and one
    without, so rows with and without an image's g share the batch; at most 2 rows at a time
    (rows leave, queued rows join): the drafts the eager step makes, so the same accepted lengths,
    and HF's greedy tokens."""
    prompts = vlm_prompts(llava, 3) + [VlmPrompt(llava.format_prompt("describe it .", 0), ())]
    lengths = [12, 5, 12, 9]
    expected = [hf_greedy_vlm(llava, prompt, n) for prompt, n in zip(prompts, lengths)]
    draft = successor_draft(llava, expected, True).prepare_inference()
    tree = DraftTreeConfig(depth=3, top_k=3, total_tokens=10)
    requests = [RowRequest(prompt, seed=0, max_new_tokens=n) for prompt, n in zip(prompts, lengths)]
    outputs, proposers = {}, {}
    for mode in ("off", "on"):
        proposers[mode] = DraftTreeProposer(draft, tree)
        engine = Engine(llava, proposers[mode], SamplingConfig(temperature=0.0), 12, eos_token_ids=llava.eos_token_ids, compile=mode)
        outputs[mode] = engine.generate(requests, batch_size=2)
    assert [out.tokens for out in outputs["on"]] == [out.tokens for out in outputs["off"]] == expected
    accepted = {mode: [out.stats.accepted_lengths for out in outputs[mode]] for mode in outputs}
    assert accepted["on"] == accepted["off"] and max(map(max, accepted["on"])) >= 3, accepted
    assert proposers["on"]._step_graph.calls > 0


def test_a_draft_in_another_precision_than_the_target_stays_lossless(llava):
    """decode.draft_dtype: a bfloat16 draft on a float32 target (the draft reads the target's
    embedding and head in their own dtype) still gives HF's greedy output."""
    length = 12
    prompts = vlm_prompts(llava, 2)
    config = DecodeConfig(max_new_tokens=length, sampling=SamplingConfig(temperature=0.0), draft_tree=DraftTreeConfig(depth=3, top_k=2, total_tokens=6))
    draft = draft_for(llava, vision=True, dtype=torch.bfloat16)
    engine = Engine(llava, DraftTreeProposer(draft, config.tree), config.sampling, config.max_new_tokens, eos_token_ids=llava.eos_token_ids)
    outputs = engine.generate([RowRequest(p, seed=0) for p in prompts])
    assert next(draft.parameters()).dtype == torch.bfloat16 and llava.dtype == torch.float32
    for prompt, out in zip(prompts, outputs):
        assert out.tokens == hf_greedy_vlm(llava, prompt, length)


def test_draft_dtype_auto_is_float32_on_a_cpu_else_the_named_one(llava):
    from raydec.api import draft_dtype

    assert draft_dtype(llava) == torch.float32
    assert draft_dtype(llava, "bfloat16") == torch.bfloat16 and draft_dtype(llava, "float16") == torch.float16


# -- exactness at temperature 1 --------------------------------------------------------------


SAMPLES = 20_000


@pytest.fixture(scope="module")
def llama64(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("toy"), vocab=8, seed=1, dtype=torch.float64)


PROMPTS = [[5, 2, 6], [1], [3, 3], [7, 0, 1, 2]]


def _sampling_config(length: int = 5) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=length, sampling=SamplingConfig(temperature=1.0),
                        draft_tree=DraftTreeConfig(depth=3, top_k=2, total_tokens=6))


def test_draft_tree_exactness(llama64):
    """Batch 4, prompts of different lengths: every prompt's output law is the target's."""
    config = _sampling_config()
    proposer = DraftTreeProposer(draft_for(llama64, vision=False, seed=3), config.tree)
    samples = sample_engine(llama64, proposer, config, PROMPTS, list(range(4 * SAMPLES)), 5000)
    for i, prompt in enumerate(PROMPTS):
        report = compare_to_law(samples[i :: len(PROMPTS)], lm_law(llama64, prompt, config.max_new_tokens, config.sampling))
        assert report.passed, f"prompt {prompt}: {report}"


@pytest.mark.parametrize("shape", [(4, 3, 12), (3, 2, 11), (1, 4, 3), (3, 1, 4)], ids=["4-3-12", "all-candidates", "depth-1", "chain"])
def test_tree_structure_the_proposer_records_is_the_trees_own(llama64, shape):
    """The proposer hands the verifier each tree's depth and its most children per node; they
    equal what ``DraftTree`` derives from the parents alone, at 4 rows and at 8."""
    from raydec.speculative.tree import DraftTree

    depth, top_k, total = shape
    config = DecodeConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0),
                          draft_tree=DraftTreeConfig(depth=depth, top_k=top_k, total_tokens=total))
    proposer = DraftTreeProposer(draft_for(llama64, vision=False, seed=3), config.tree)
    original, checked = proposer.propose, []

    def checking(state):
        tree = original(state)
        bare = DraftTree(tree.tokens, tree.parents, tree.valid, tree.proposal_index, tree.without_replacement, tree.proposal_probs)
        assert torch.equal(tree.ancestor_mask(), bare.ancestor_mask()) and torch.equal(tree.depth(), bare.depth())
        assert bare.children_bound() <= tree.max_children == top_k and bare.is_chain() == (top_k == 1)
        assert bare.branch_node_bound() <= tree.branch_nodes  # the verifier's residual passes cover every branching node
        assert bare.num_nodes == min(total, 1 + top_k + (depth - 1) * top_k * top_k)
        checked.append(tree.batch_size)
        return tree

    proposer.propose = checking
    for prompts in (PROMPTS, PROMPTS * 2):
        checked.clear()
        Engine(llama64, proposer, config.sampling, config.max_new_tokens).generate([RowRequest(p, seed=i) for i, p in enumerate(prompts)])
        assert checked and checked[0] == len(prompts)


def test_batch_rows_equal_batch_one_rows(llama64):
    """Rows accept different lengths in a batch, yet each row's output equals its batch-1 run."""
    config = _sampling_config(length=12)
    proposer = DraftTreeProposer(draft_for(llama64, vision=False, seed=3), config.tree)
    engine = Engine(llama64, proposer, config.sampling, config.max_new_tokens)
    requests = [RowRequest(PROMPTS[i % 4], seed=i, max_new_tokens=6 + i % 7) for i in range(24)]
    batched = engine.generate(requests)
    assert len({tuple(o.stats.accepted_lengths) for o in batched}) > 1
    for request, out in zip(requests, batched):
        (single,) = engine.generate([request])
        assert single.tokens == out.tokens
    continuous = engine.generate(requests, batch_size=5)  # finished rows' places go to queued ones
    assert [o.tokens for o in continuous] == [o.tokens for o in batched]


def test_tree_expansion_equals_sequential_drafting(llama64):
    """Every expanded tree node's draft hidden equals running the draft one pair at a time along
    its root path on a copy of the committed draft cache: the tree mask is the ancestor closure
    and tree positions are depth + the committed length."""
    import copy

    from raydec.speculative.proposers.base import DecodeState

    config = _sampling_config(length=8)
    config = config.model_copy(update={"draft_tree": DraftTreeConfig(depth=4, top_k=3, total_tokens=12)})
    draft = draft_for(llama64, vision=False, seed=3)
    proposer = DraftTreeProposer(draft, config.tree)
    engine = Engine(llama64, proposer, config.sampling, config.max_new_tokens)
    engine.generate([RowRequest(p, seed=1) for p in PROMPTS])  # leaves the proposer after its last step
    # a fresh step on new rows: prefill through the engine, then one traced propose
    captured = {}
    original = proposer.propose

    def traced(state: DecodeState):
        if not captured:
            proposer._sync_rows(state)
            proposer._catch_up()
            captured["kv"] = copy.deepcopy(proposer.cache.kv)
            captured["valid"] = proposer.cache.valid.clone()
            captured["next"] = proposer.cache.next_position.clone()
            captured["root"] = proposer.root_hidden.clone()
            proposer.trace = []
            tree = original(state)
            captured["trace"] = proposer.trace
            proposer.trace = None
            return tree
        return original(state)

    proposer.propose = traced
    engine.generate([RowRequest(p, seed=2) for p in PROMPTS])
    trace = captured["trace"]
    assert len(trace) == 3  # depth 4: levels 2..4 expand
    tokens, parents = trace[-1][2], trace[-1][3]
    hidden_of = {}  # (row, candidate) -> draft hidden
    for frontier, h, _, _ in trace:
        for row in range(frontier.shape[0]):
            for j, cand in enumerate(frontier[row].tolist()):
                hidden_of[(row, cand)] = h[row, j]
    checked = 0
    with torch.inference_mode():
        checked = _check_sequential(draft, captured, hidden_of, tokens, parents)
    assert checked == 4 * 3 * 3


def _check_sequential(draft, captured, hidden_of, tokens, parents) -> int:
    import copy

    checked = 0
    for (row, cand), h in hidden_of.items():
        path = [cand]
        while parents[row, path[-1]] >= 0:
            path.append(int(parents[row, path[-1]]))
        path.reverse()
        kv = copy.deepcopy(captured["kv"])
        valid = captured["valid"][row : row + 1]
        kv.batch_select_indices(torch.tensor([row]))
        feature = captured["root"][row]
        for depth, node in enumerate(path):
            mask = torch.cat([valid, torch.ones(1, depth + 1, dtype=torch.bool)], dim=1)
            additive = torch.zeros(1, 1, 1, mask.shape[1], dtype=torch.float64).masked_fill(~mask.view(1, 1, 1, -1), torch.finfo(torch.float64).min)
            embed = draft.embed_tokens(tokens[row, node].view(1, 1)).to(torch.float64)
            position = captured["next"][row].view(1, 1) + depth
            out = draft(embed, feature.view(1, 1, -1), position, additive, kv)[0, 0]
            feature = out
        assert torch.allclose(out, h, atol=1e-10), (row, cand, path)
        checked += 1
    return checked
