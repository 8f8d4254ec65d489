"""Verifier unit tests on small hand-made and random tensors, including exact enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch

from raydec.speculative.tree import DETERMINISTIC, DraftTree, TreeBuilder
from raydec.speculative.verify import VerifyResult, acceptance_probability, output_law, residual, verify_tree

torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation cost


def _uniforms(batch: int, width: int, seed: int) -> torch.Tensor:
    return torch.rand(batch, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _random_p(generator: torch.Generator, vocab: int, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64) * sharp, dim=-1)


def _random_tree(generator: torch.Generator, vocab: int, kind: str) -> TreeBuilder:
    """A random tree: chains, without-replacement sibling groups, one-hot siblings, mixtures."""
    builder = TreeBuilder(root_token=0)
    frontier = [0]
    for _level in range(3):
        next_frontier = []
        for node in frontier:
            width = int(torch.randint(1, 3, (1,), generator=generator)) if kind != "chain" else 1
            if kind == "onehot" or (kind == "mixed" and node % 2 == 1):
                tokens = torch.randperm(vocab, generator=generator)[:width].tolist()
                next_frontier += [builder.add(node, t) for t in tokens]
            else:
                q = _random_p(generator, vocab, sharp=3.0)
                group = builder.add_proposal(q)
                weights = q.clone()
                for _ in range(width):
                    token = int(torch.multinomial(weights, 1, generator=generator))
                    weights[token] = 0
                    next_frontier.append(builder.add(node, token, group, without_replacement=width > 1))
        frontier = next_frontier[:2]
    return builder


def _add_draft(builder: TreeBuilder, parent: int, generator: torch.Generator, vocab: int, deterministic: bool) -> int:
    """One draft node under ``parent``: a random token with no q, or a token drawn from a random q."""
    if deterministic:
        return builder.add(parent, int(torch.randint(vocab, (1,), generator=generator)))
    q = _random_p(generator, vocab, 1.0)
    return builder.add(parent, int(torch.multinomial(q, 1, generator=generator)), builder.add_proposal(q))


def _one_hot_draft_trees(generator: torch.Generator, vocab: int, batch: int, min_nodes: int) -> tuple[list[TreeBuilder], DraftTree]:
    """``batch`` random trees of deterministic drafts (random parents and tokens; duplicate
    siblings happen), min_nodes..11 drafts each."""
    builders = []
    for _ in range(batch):
        builder = TreeBuilder(0)
        for _ in range(int(torch.randint(min_nodes, 12, (1,), generator=generator))):
            parent = int(torch.randint(builder.num_nodes, (1,), generator=generator))
            builder.add(parent, int(torch.randint(vocab, (1,), generator=generator)))
        builders.append(builder)
    return builders, DraftTree.stack(builders, vocab, torch.float64)


class RandomProcess:
    """A target process: a fixed random P after every prefix (memoised)."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(seed)
        self.table: dict = {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.table:
            self.table[prefix] = _random_p(self.generator, self.vocab)
        return self.table[prefix]

    def law(self, depth: int) -> dict:
        out = {}
        for seq in itertools.product(range(self.vocab), repeat=depth):
            prob = 1.0
            for t in range(depth):
                prob *= float(self(seq[:t])[seq[t]])
            out[seq] = prob
        return out

    def extend(self, committed: dict, depth: int) -> dict:
        """Continue every committed sequence with the target process up to ``depth`` tokens."""
        out: dict = {}

        def grow(prefix, weight):
            if len(prefix) >= depth:
                out[prefix[:depth]] = out.get(prefix[:depth], 0.0) + weight
                return
            for token, prob in enumerate(self(prefix).tolist()):
                if prob > 0:
                    grow(prefix + (token,), weight * prob)

        for seq, weight in committed.items():
            grow(seq, weight)
        return out


@pytest.mark.parametrize("kind", ["chain", "wr", "onehot", "mixed"])
def test_enumerated_law_equals_target(kind):
    """Exact enumeration of the verifier's output law equals the target law to 1e-9."""
    vocab = 4
    generator = torch.Generator().manual_seed(7)
    for trial in range(6):
        builder = _random_tree(generator, vocab, kind)
        tree = DraftTree.stack([builder], vocab, torch.float64)
        depth = int(tree.depth().max()) + 1
        process = RandomProcess(vocab, seed=100 + trial)
        committed = output_law(tree, 0, process)
        assert abs(sum(committed.values()) - 1.0) < 1e-12
        extended = process.extend(committed, depth)
        target = process.law(depth)
        worst = max(abs(extended.get(s, 0.0) - target[s]) for s in target)
        assert worst < 1e-9, f"{kind} trial {trial}: max deviation {worst}"


def test_enumeration_can_fail(monkeypatch):
    """The enumeration has teeth: with a verifier that resamples from p (not the residual) after
    a rejection, ``output_law`` extended by the target process visibly differs from the target."""
    import raydec.speculative.verify as verify

    vocab = 4
    generator = torch.Generator().manual_seed(7)
    builder = _random_tree(generator, vocab, "wr")
    tree = DraftTree.stack([builder], vocab, torch.float64)
    depth = int(tree.depth().max()) + 1
    process = RandomProcess(vocab, seed=100)
    monkeypatch.setattr(verify, "residual", lambda p, q: p)
    extended = process.extend(output_law(tree, 0, process), depth)
    target = process.law(depth)
    assert max(abs(extended.get(s, 0.0) - target[s]) for s in target) > 1e-2


def test_residual_hand_made():
    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.6, 0.2]], dtype=torch.float64)
    assert torch.allclose(residual(p, q), torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(residual(p, p), p)  # rejection impossible: p returned unchanged


def test_greedy_accepts_longest_matching_prefix():
    """Temperature 0: one-hot P; a chain is accepted up to the first mismatch, then the argmax."""
    vocab = 6
    builder = TreeBuilder(1)
    builder.add_chain(0, [2, 3, 4, 5])
    tree = DraftTree.stack([builder], vocab)
    argmax = torch.tensor([2, 3, 0, 5, 1])  # node 2 predicts 0, but the draft says 4
    probs = torch.nn.functional.one_hot(argmax, vocab).float().unsqueeze(0)
    result = verify_tree(tree, probs, _uniforms(1, tree.num_nodes, 0))
    assert result.num_accepted.tolist() == [2]
    assert result.committed_tokens(tree, 0) == [2, 3, 0]
    assert bool(result.rejected[0])


def test_first_accepted_sibling_wins_and_bonus():
    vocab = 4
    builder = TreeBuilder(0)
    a = builder.add(0, 1)       # sibling 1 (rejected: P says 2)
    b = builder.add(0, 2)       # sibling 2 (accepted)
    builder.add(a, 3)
    c = builder.add(b, 3)       # accepted, leaf -> bonus from P[c]
    tree = DraftTree.stack([builder], vocab)
    argmax = torch.tensor([2, 0, 3, 0, 1])
    probs = torch.nn.functional.one_hot(argmax, vocab).float().unsqueeze(0)
    result = verify_tree(tree, probs, _uniforms(1, tree.num_nodes, 0))
    assert result.path[0, :3].tolist() == [0, b, c]
    assert result.committed_tokens(tree, 0) == [2, 3, 1]
    assert not bool(result.rejected[0])


def test_rows_are_independent():
    """A row's verification does not depend on the other rows of the batch."""
    vocab = 5
    generator = torch.Generator().manual_seed(3)
    builders = [_random_tree(generator, vocab, "mixed") for _ in range(4)]
    width = max(b.num_nodes for b in builders)
    probs = torch.softmax(torch.randn(4, width, vocab, generator=generator, dtype=torch.float64), -1)
    uniforms = _uniforms(4, width, 10)
    together = verify_tree(DraftTree.stack(builders, vocab, torch.float64), probs, uniforms)
    for row in range(4):
        alone_tree = DraftTree.stack([builders[row]], vocab, torch.float64)
        n = builders[row].num_nodes
        alone = verify_tree(alone_tree, probs[row : row + 1, :n], uniforms[row : row + 1, :n])
        assert alone.committed_tokens(alone_tree, 0) == together.committed_tokens(DraftTree.stack(builders, vocab, torch.float64), row)


def test_tree_masks_and_depth():
    builder = TreeBuilder(0)
    a = builder.add(0, 1)
    b = builder.add(0, 2)
    c = builder.add(a, 3)
    builder.add(c, 4)
    tree = DraftTree.stack([builder, TreeBuilder(9)], 5)
    assert tree.depth()[0].tolist() == [0, 1, 1, 2, 3]
    mask = tree.ancestor_mask()[0]
    assert mask[4].tolist() == [True, True, False, True, True]
    assert mask[b].tolist() == [True, False, True, False, False]
    assert tree.ancestor_mask()[1].tolist() == torch.eye(5, dtype=torch.bool).tolist()  # padding: self only
    assert tree.proposal_index[0, 1] == DETERMINISTIC


def test_ancestor_mask_of_random_padded_trees_follows_the_parent_lists():
    """The batched pointer walk equals following each node's parents in Python: deep, wide and
    padded trees, rows of different sizes in one batch."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        builders = []
        for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
            builder = TreeBuilder(0)
            for node in range(1, int(torch.randint(2, 18, (1,), generator=generator))):
                deep = bool(torch.rand(1, generator=generator) < 0.4)
                builder.add(node - 1 if deep else int(torch.randint(0, node, (1,), generator=generator)), node)
            builders.append(builder)
        tree = DraftTree.stack(builders, 20)
        mask, depth = tree.ancestor_mask(), tree.depth()
        for row, builder in enumerate(builders):
            for node in range(tree.num_nodes):
                path, up = {node}, node  # padding (node >= the row's size) sees itself only
                while up < builder.num_nodes and builder.parents[up] >= 0:
                    up = builder.parents[up]
                    path.add(up)
                assert mask[row, node].tolist() == [j in path for j in range(tree.num_nodes)]
                assert depth[row, node] == (len(path) - 1 if node < builder.num_nodes else 0)



def _assert_equals_walk(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor) -> "VerifyResult":
    result = verify_tree(tree, probs, uniforms)
    for row in range(tree.batch_size):
        path, final, rejected = _walk_one_row(tree, probs, uniforms, row)
        n = int(result.num_accepted[row])
        assert result.path[row, : n + 1].tolist() == path and set(result.path[row, n + 1 :].tolist()) <= {-1}, row
        assert (int(result.next_token[row]), bool(result.rejected[row]), int(result.stop_node[row])) == (final, rejected, path[-1]), row
    return result


def test_chains_decide_what_a_node_by_node_walk_decides():
    vocab, batch = 6, 64
    generator = torch.Generator().manual_seed(11)
    for mode in ("dense", "onehot", "mixed"):
        builders = []
        for row in range(batch):
            builder = TreeBuilder(0)
            node = 0
            for _ in range(int(torch.randint(0, 6, (1,), generator=generator))):
                node = _add_draft(builder, node, generator, vocab, deterministic=mode == "onehot" or (mode == "mixed" and node % 2))
            builders.append(builder)
        tree = DraftTree.stack(builders, vocab, torch.float64)
        probs = torch.softmax(torch.randn(batch, tree.num_nodes, vocab, generator=generator, dtype=torch.float64), -1)
        assert tree.is_chain() and tree.children_bound() == 1
        _assert_equals_walk(tree, probs, _uniforms(batch, tree.num_nodes, 1))


def test_one_hot_targets_and_drafts_decide_what_a_walk_decides():
    """Temperature 0 over EAGLE-like trees, duplicate siblings included (the first matching wins)."""
    vocab, batch = 5, 96
    generator = torch.Generator().manual_seed(3)
    builders, tree = _one_hot_draft_trees(generator, vocab, batch, min_nodes=1)
    argmax = torch.randint(vocab, (batch, tree.num_nodes), generator=generator)
    for row, builder in enumerate(builders):
        for node, parent in enumerate(builder.parents):
            if parent >= 0 and torch.rand(1, generator=generator) < 0.5:
                argmax[row, parent] = builder.tokens[node]
    probs = torch.nn.functional.one_hot(argmax, vocab).to(torch.float64)
    result = _assert_equals_walk(tree, probs, _uniforms(batch, tree.num_nodes, 2))
    assert int(result.num_accepted.max()) >= 3


def test_one_hot_drafts_under_a_dense_target_decide_what_a_walk_decides():
    vocab, batch = 5, 128
    generator = torch.Generator().manual_seed(7)
    _, tree = _one_hot_draft_trees(generator, vocab, batch, min_nodes=0)
    probs = torch.softmax(2 * torch.randn(batch, tree.num_nodes, vocab, generator=generator, dtype=torch.float64), -1)
    result = _assert_equals_walk(tree, probs, _uniforms(batch, tree.num_nodes, 3))
    assert int(result.num_accepted.max()) >= 3 and bool(result.rejected.any()) and not bool(result.rejected.all())


@pytest.mark.parametrize("kind", ["chain", "wr", "onehot", "mixed"])
def test_random_trees_decide_what_a_walk_decides(kind):
    vocab, batch = 4, 96
    generator = torch.Generator().manual_seed(13)
    builders = [_random_tree(generator, vocab, kind) for _ in range(batch)]
    tree = DraftTree.stack(builders, vocab, torch.float64)
    probs = torch.softmax(3 * torch.randn(batch, tree.num_nodes, vocab, generator=generator, dtype=torch.float64), -1)
    result = _assert_equals_walk(tree, probs, _uniforms(batch, tree.num_nodes, 4))
    assert int(result.num_accepted.max()) >= 2 and bool(result.rejected.any())


def test_the_host_facts_a_proposer_gives_change_nothing():
    """``max_children`` / ``any_without_replacement`` / ``branch_nodes`` given by a proposer (no
    read-back) or derived from the tensors give the same decisions."""
    vocab, batch = 4, 32
    generator = torch.Generator().manual_seed(17)
    tree = DraftTree.stack([_random_tree(generator, vocab, "mixed") for _ in range(batch)], vocab, torch.float64)
    probs = torch.softmax(3 * torch.randn(batch, tree.num_nodes, vocab, generator=generator, dtype=torch.float64), -1)
    bare = DraftTree(tree.tokens, tree.parents, tree.valid, tree.proposal_index, tree.without_replacement, tree.proposal_probs)
    uniforms = _uniforms(batch, tree.num_nodes, 5)
    given, derived = verify_tree(tree, probs, uniforms), verify_tree(bare, probs, uniforms)
    assert bare.max_children == tree.max_children and bare.any_without_replacement == tree.any_without_replacement
    assert bare.branch_nodes == tree.branch_nodes >= 2
    for field in ("path", "num_accepted", "next_token", "stop_node", "rejected"):
        assert torch.equal(getattr(given, field), getattr(derived, field)), field


def test_vectorised_masks_equal_walking_the_parents():
    generator = torch.Generator().manual_seed(5)
    builders = []
    for _ in range(16):
        builder = TreeBuilder(0)
        for _ in range(int(torch.randint(0, 40, (1,), generator=generator))):
            builder.add(int(torch.randint(builder.num_nodes, (1,), generator=generator)), 1)
        builders.append(builder)
    tree = DraftTree.stack(builders, 4)
    mask, depth = tree.ancestor_mask(), tree.depth()
    for row, builder in enumerate(builders):
        for node in range(tree.num_nodes):
            expected, walk = {node}, node
            while node < builder.num_nodes and builder.parents[walk] >= 0:
                walk = builder.parents[walk]
                expected.add(walk)
            assert set(mask[row, node].nonzero().flatten().tolist()) == expected
            assert depth[row, node] == (len(expected) - 1 if node < builder.num_nodes else 0)


def _walk_one_row(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor, row: int) -> tuple[list[int], int, bool]:
    """The module docstring's algorithm, one row, node by node: (path, final token, rejected)."""
    from raydec.speculative.sampling import sample_with_uniform
    from raydec.speculative.verify import effective_proposal

    children = tree.children_lists(row)
    node, path, p = 0, [0], probs[row, 0].unsqueeze(0)
    while True:
        removed: set[tuple[int, int]] = set()  # (token, group) of the rejected siblings
        for child in children[node]:
            group = int(tree.proposal_index[row, child])
            q = tree.proposal_of(row, child).unsqueeze(0)
            if bool(tree.without_replacement[row, child]) and group != DETERMINISTIC:
                mask = torch.zeros_like(q, dtype=torch.bool)
                for token, owner in removed:
                    mask[0, token] = mask[0, token] or owner == group
                q = effective_proposal(q, mask)
            token = torch.tensor([int(tree.tokens[row, child])])
            if float(uniforms[row, child]) < float(acceptance_probability(p, q, token)):
                node, p = child, probs[row, child].unsqueeze(0)
                path.append(child)
                break
            p = residual(p, q)
            removed.add((int(token), group))
        else:
            final = int(sample_with_uniform(p, uniforms[row, :1])[0])
            return path, final, bool(children[node])


def test_recursion_equals_walking_each_row_with_chains_under_sibling_groups():
    """SJD-PAC's shape (sibling groups, then a long chain of only children under each) and
    random shapes: the batched recursion, which crosses runs of only children in one jump,
    decides exactly what a node-by-node walk decides with the same uniforms."""

    vocab, batch = 5, 48
    generator = torch.Generator().manual_seed(7)
    builders = []
    for row in range(batch):
        builder = TreeBuilder(0)
        tips = [0]
        for _level in range(int(torch.randint(0, 3, (1,), generator=generator))):  # sibling groups
            q = _random_p(generator, vocab, 1.0)
            group, weights, level = builder.add_proposal(q), q.clone(), []
            for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
                token = int(torch.multinomial(weights, 1, generator=generator))
                weights[token] = 0
                level.append(builder.add(tips[0], token, group, without_replacement=True))
            tips = level + tips[1:]
        for tip in tips:  # a chain under every tip: dense and deterministic drafts
            node = tip
            for _ in range(int(torch.randint(0, 8, (1,), generator=generator))):
                node = _add_draft(builder, node, generator, vocab, deterministic=bool(torch.rand(1, generator=generator) < 0.5))
        builders.append(builder)
    tree = DraftTree.stack(builders, vocab, torch.float64)
    # targets that often agree with the drafts, so runs of acceptances are long
    probs = torch.softmax(torch.randn(batch, tree.num_nodes, vocab, generator=generator, dtype=torch.float64), -1)
    for row, builder in enumerate(builders):
        for node, parent in enumerate(builder.parents):
            if parent >= 0 and torch.rand(1, generator=generator) < 0.7:
                probs[row, parent] = 0.1 * probs[row, parent] + 0.9 * torch.nn.functional.one_hot(torch.tensor(builder.tokens[node]), vocab)
    uniforms = torch.rand(batch, tree.num_nodes, generator=generator, dtype=torch.float64)
    result = _assert_equals_walk(tree, probs, uniforms)
    assert int(result.num_accepted.max()) >= 5
    # in float32 (the engine's P) as well
    typed = DraftTree(tree.tokens, tree.parents, tree.valid, tree.proposal_index, tree.without_replacement, tree.proposal_probs.float())
    _assert_equals_walk(typed, probs.float(), uniforms)


def test_top_k_selection_equals_torch_topk_with_ties_and_masked_ids():
    from raydec.speculative.sampling import _apply_top_k, kth_largest

    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        scores = torch.randint(-6, 6, (2, 7, 64), generator=g).to(dtype)  # many ties
        scores[0, 0, :40] = float("-inf")  # a constrained vocabulary
        for k in (1, 5, 24, 63):
            expected = torch.topk(scores, k, dim=-1).values[..., -1:]
            assert torch.equal(kth_largest(scores, k), expected)
            kept = _apply_top_k(scores, k)
            assert torch.equal(kept, scores.masked_fill(scores < expected, float("-inf")))
            finite = scores.isfinite().sum(-1)
            assert bool((kept.isfinite().sum(-1) >= torch.clamp(finite, max=k)).all())  # ties at the k-th stay


def test_a_uniform_just_below_one_neither_samples_a_zero_mass_token_nor_rejects_a_certain_draft():
    """In float32, 1 - 2**-26 rounds to 1.0: a zero inverse-CDF threshold (token 0, whatever its
    mass) and a failed ``u < 1`` test. Sampling and acceptance must stay in float64."""
    from raydec.speculative.sampling import sample_with_uniform

    near_one = torch.tensor([1 - 2**-26], dtype=torch.float64)
    assert near_one.float().item() == 1.0  # the rounding this test is about
    probs = torch.tensor([[0.0, 0.0, 0.3, 0.7]])  # float32, token 0 impossible
    assert sample_with_uniform(probs, near_one).item() == 2
    root_only = DraftTree.roots_only(torch.tensor([2]), 4)
    assert verify_tree(root_only, probs.unsqueeze(0), near_one.view(1, 1)).next_token.item() == 2
    builder = TreeBuilder(1)
    builder.add_chain(0, [3])
    chain = DraftTree.stack([builder], 4)
    certain = torch.tensor([[[0.0, 0.0, 0.3, 0.7], [0.0, 0.0, 0.0, 1.0]]])
    certain[0, 0] = torch.tensor([0.0, 0.0, 0.0, 1.0])  # P says token 3 with certainty; so does the draft
    result = verify_tree(chain, certain, torch.tensor([[0.1, 1 - 2**-26]], dtype=torch.float64))
    assert result.num_accepted.tolist() == [1]


def test_jacobi_coupling_keeps_a_certain_draft_at_a_uniform_just_below_one():
    from raydec.config import JacobiDraftConfig
    from raydec.speculative.proposers.jacobi import JacobiProposer

    proposer = JacobiProposer(JacobiDraftConfig(window=2, branching=2, tree_depth=1), "sjd_ac")
    p = torch.tensor([[[0.2, 0.3, 0.5]]])  # [B, S, V] float32; the old draft, token 2: p = q, kept for sure
    old_q = torch.tensor([[[0.3, 0.2, 0.5]]])  # a rejection would redraw from max(0, p - q) = token 1
    uniforms = torch.tensor([[[1 - 2**-26, 0.5]]], dtype=torch.float64)
    tokens, _ = proposer.couple(p, torch.tensor([[2]]), old_q, uniforms)
    assert tokens.tolist() == [[2]]


def test_two_level_sampling_over_a_large_vocabulary_is_the_inverse_cdf():
    """Over V > 2 blocks, the block-then-token inverse CDF returns the token one float64
    cumulative sum over V gives, zero-mass tokens and a ragged last block included."""
    from raydec.speculative.sampling import SAMPLE_BLOCK, sample_with_uniform

    generator = torch.Generator().manual_seed(21)
    vocab = 5 * SAMPLE_BLOCK + 37
    probs = torch.rand(6, 40, vocab, generator=generator) ** 8
    probs[0] = 0.0
    probs[0, :, -3] = 1.0  # all mass in the ragged tail
    probs[1, :, : 4 * SAMPLE_BLOCK] = 0.0
    probs[2, :, SAMPLE_BLOCK:] = 0.0  # all mass in the first block
    uniforms = torch.rand(6, 40, generator=generator, dtype=torch.float64)
    uniforms[:, :3] = torch.tensor([0.0, 1 - 2**-40, 0.5], dtype=torch.float64)
    cumulative = probs.to(torch.float64).cumsum(-1)
    expected = torch.searchsorted(cumulative, ((1 - uniforms) * cumulative[..., -1]).unsqueeze(-1)).squeeze(-1)
    tokens = sample_with_uniform(probs, uniforms)
    assert torch.equal(tokens, expected)
    assert bool((probs.gather(-1, tokens.unsqueeze(-1)) > 0).all())
    assert (tokens[0] == vocab - 3).all() and (tokens[2] < SAMPLE_BLOCK).all()
