"""RaggedCache bookkeeping on hand-made tensors.

(That any sequence of ragged commits still gives every node the logits of a fresh prefill is
tested on a real Llama in tests/core/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

from raydec.speculative.cache import RaggedCache


def kv(rows: int, slots: int, start: int = 0) -> torch.Tensor:
    """[rows, 1 head, slots, 1]: slot s of row r holds 100 * r + start + s."""
    values = 100 * torch.arange(rows).view(rows, 1, 1, 1) + start + torch.arange(slots).view(1, 1, slots, 1)
    return values.float()


def filled_cache(rows: int, prompt: int, compaction: str) -> RaggedCache:
    cache = RaggedCache(rows, compaction=compaction)
    cache.kv.update(kv(rows, prompt), -kv(rows, prompt), 0)
    cache.start(torch.ones(rows, prompt, dtype=torch.bool), torch.full((rows,), prompt))
    return cache


def test_commit_keeps_accepted_slots_and_crops_the_unused_tail():
    cache = filled_cache(rows=2, prompt=3, compaction="never")
    cache.kv.update(kv(2, 5, start=3), -kv(2, 5, start=3), 0)  # a 5-node window: slots 3..7
    keep = torch.tensor([[True, False, True, False, False],     # root and node 2 (a tree path)
                         [True, True, False, False, False]])
    cache.commit(keep)
    # the slots no row kept at the end are cropped; the hole at slot 4 of row 0 stays (masked)
    assert cache.length == 6 and cache.kv.get_seq_length() == 6
    assert cache.valid.tolist() == [[True, True, True, True, False, True], [True] * 5 + [False]]
    assert cache.next_position.tolist() == [5, 5]


def test_compaction_gathers_each_rows_valid_slots_to_the_left():
    cache = filled_cache(rows=2, prompt=5, compaction="never")
    cache.valid[0, 1] = cache.valid[0, 3] = cache.valid[1, 4] = False  # holes left by earlier steps
    cache.lengths = [3, 4]  # the host's counts, which the engine keeps from its read-backs
    cache.clean = [1, 4]  # and each row's slots valid from the left
    cache.compact()
    assert cache.length == 4 and cache.kv.get_seq_length() == 4  # the longest row: 4 valid slots
    assert cache.valid.tolist() == [[True, True, True, False], [True] * 4]
    assert cache.kv.layers[0].keys[0, 0, :3, 0].tolist() == [0, 2, 4]
    assert cache.kv.layers[0].values[1, 0, :, 0].tolist() == [-100, -101, -102, -103]


def test_compaction_moves_only_each_rows_valid_slots_past_its_clean_prefix():
    """Rows compacted earlier keep their clean prefix in place, and a row moves only its valid slots
    past it: not the holes, and not the whole width. A row that joined since, left-padded, keeps
    its pad in front of it and its prompt where it is: it moves nothing."""
    cache = filled_cache(rows=3, prompt=6, compaction="never")
    cache.valid[:, 4] = False  # a hole in every row at slot 4
    cache.lengths = [5, 5, 5]
    cache.clean = [4, 4, 4]
    joining = RaggedCache(1, compaction="never")
    joining.kv.update(kv(1, 3, start=50), -kv(1, 3, start=50), 0)
    joining.start(torch.tensor([[False, True, True]]), torch.tensor([2]))  # left-padded: a pad, then its prompt
    cache.append_rows(joining)
    assert cache.clean == [4, 4, 4, 2] and cache.pads == [0, 0, 0, 1]
    layer = cache.kv.layers[0]
    before = layer.copied_bytes
    cache.compact()
    assert cache.length == 5 and cache.clean == [5, 5, 5, 2]
    assert layer.keys[:3, 0, :, 0].tolist() == [[0, 1, 2, 3, 5], [100, 101, 102, 103, 105], [200, 201, 202, 203, 205]]
    assert layer.keys[3, 0, 1:3, 0].tolist() == [51, 52] and layer.values[3, 0, 1:3, 0].tolist() == [-51, -52]
    assert cache.valid.tolist() == [[True] * 5] * 3 + [[False, True, True, False, False]]
    # three rows move one slot each (their slot 5), the joining row none; keys and values, each
    # read and written
    assert layer.copied_bytes - before == 2 * 2 * (3 * 1) * 4


def test_rows_with_room_leave_and_join_in_place():
    """A cache with room for its rows (a decode batch's): rows leave by moving the rows behind them
    up, rows join behind the others, in the same buffers; the rows read as a fresh copy would."""
    cache = filled_cache(rows=3, prompt=4, compaction="never")
    cache.reserve_rows(4)
    layer = cache.kv.layers[0]
    buffer, before = layer.buffer_keys.data_ptr(), layer.copied_bytes
    cache.select_rows([0, 2])  # row 1 leaves: row 2 moves up, row 0 stays
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 1, 2, 3], [200, 201, 202, 203]]
    assert layer.copied_bytes - before == 2 * 2 * 4 * 4  # row 2's 4 slots of keys and of values, read and written

    joining = filled_cache(rows=2, prompt=2, compaction="never")  # shorter: hole slots after its prompt
    before = layer.copied_bytes
    cache.append_rows(joining)
    assert layer.buffer_keys.data_ptr() == buffer  # no new buffer: the rows kept where they were
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 1, 2, 3], [200, 201, 202, 203], [0, 1, 0, 0], [100, 101, 0, 0]]
    assert layer.values[3, 0, :, 0].tolist() == [-100, -101, 0, 0]
    assert layer.copied_bytes - before == 2 * 2 * 2 * 4  # the joining rows' slots alone
    assert cache.valid.tolist() == [[True] * 4, [True] * 4, [True, True, False, False], [True, True, False, False]]
    assert cache.lengths == [4, 4, 2, 2] and cache.next_position.tolist() == [4, 4, 2, 2]

    before = layer.copied_bytes
    cache.select_rows([3, 1, 2])  # row 0 leaves, the last row takes its place: one row moves
    assert layer.keys[:, 0, :, 0].tolist() == [[100, 101, 0, 0], [200, 201, 202, 203], [0, 1, 0, 0]]
    assert layer.copied_bytes - before == 2 * 2 * 4 * 4 and layer.buffer_keys.data_ptr() == buffer
    assert cache.lengths == [2, 4, 2] and cache.valid[0].tolist() == [True, True, False, False]
    cache.select_rows([1, 2, 0])  # any order: the moving rows are read before any is overwritten
    assert layer.keys[:, 0, 0, 0].tolist() == [200, 0, 100]

    cache.append_rows(filled_cache(rows=2, prompt=6, compaction="never"))  # past the room: one copy into new buffers
    assert layer.buffer_keys.data_ptr() != buffer and layer.keys.shape == (5, 1, 6, 1)
    assert layer.keys[:, 0, :, 0].tolist()[2:] == [[100, 101, 0, 0, 0, 0], [0, 1, 2, 3, 4, 5], [100, 101, 102, 103, 104, 105]]


def test_holes_in_place_are_bounded_by_the_decoded_slots_not_the_prompt():
    """Written in place, compaction moves only the slots decoded since the last one, so it runs once
    holes are a quarter of those (32 at least), whatever the prompt: a long prompt does not let
    holes pile up past the room admission reserved (its decode and a quarter more). Concatenated,
    compaction copies everything, so there holes wait for a quarter of the whole cache."""
    def holes_before_compaction(layout: str, prompt: int) -> int:
        cache = RaggedCache(1, compaction="auto", layout=layout)
        cache.kv.update(kv(1, prompt), -kv(1, prompt), 0)
        cache.start(torch.ones(1, prompt, dtype=torch.bool), torch.full((1,), prompt))
        most = 0
        for step in range(40):  # 8-slot windows, 3 kept: 5 holes a step
            cache.kv.update(kv(1, 8, start=cache.length), -kv(1, 8, start=cache.length), 0)
            cache.commit(torch.tensor([[True, True] + [False] * 5 + [True]]))  # the last slot kept: no tail to crop
            most = max(most, cache.length - cache.lengths[0])
        return most

    assert holes_before_compaction("slots", 16) == holes_before_compaction("slots", 4000) <= 40
    assert holes_before_compaction("concat", 4000) == 40 * 5  # never compacted in these steps


def _jacobi_engine(target, layout: str, compaction: str = "auto", max_new_tokens: int = 40):
    from raydec.config import JacobiDraftConfig, SamplingConfig
    from raydec.speculative.engine import Engine
    from raydec.speculative.proposers.jacobi import JacobiProposer

    proposer = JacobiProposer(JacobiDraftConfig(window=5, branching=2, tree_depth=1), "sjd_pac", "uniform")
    return Engine(target, proposer, SamplingConfig(temperature=1.0), max_new_tokens, compaction=compaction, cache_layout=layout)


def test_a_decode_step_writes_its_window_whatever_the_context(llama):
    """Bytes the target's cache writes or copies per decode step, at 8 and 80 cached tokens per
    row: the same when slots are written in place; with concatenation they grow with the context."""
    from raydec.speculative.requests import RowRequest

    def per_step(layout: str, context: int) -> float:
        session = _jacobi_engine(llama, layout).session(batch_size=4)
        for i in range(4):
            session.submit(RowRequest([1 + (i + j) % 7 for j in range(context)], seed=i))
        while not session.active:
            session.step()  # admission (the prompt's writes are not a decode step's)
        before = session.cache.copied_bytes()
        for _ in range(5):  # at most 5 x 7 tokens per row: none of the 40-token rows finishes
            session.step()
        return (session.cache.copied_bytes() - before) / 5

    short, long = per_step("slots", 8), per_step("slots", 80)
    assert short > 0 and abs(long - short) <= 0.1 * short, (short, long)
    assert per_step("concat", 80) > 3 * per_step("concat", 8)


@pytest.mark.parametrize("compaction", ["auto", "always"])
def test_slots_written_in_place_decode_the_tokens_of_concatenation(llama, compaction):
    """Rows of different prompt lengths and caps, continuously batched (rows leave and join a
    running cache, compaction moves slots): the same tokens with either layout."""
    from raydec.speculative.requests import RowRequest

    requests = [RowRequest([1 + (i * j) % 7 for j in range(2 + 3 * i)], seed=i, max_new_tokens=6 + 4 * i) for i in range(5)]
    tokens = {layout: [o.tokens for o in _jacobi_engine(llama, layout, compaction).generate(requests, batch_size=2)]
              for layout in ("slots", "concat")}
    assert tokens["slots"] == tokens["concat"]
