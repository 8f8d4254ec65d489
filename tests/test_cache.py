"""The KV store under the engine, on hand-made tensors: in-place appends and window packing.

(That any sequence of ragged commits still gives every node the logits of a fresh prefill is
tested on a real Llama in tests/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch

from raydec.spec.cache import GrowingLayer, RaggedCache


def kv(rows: int, slots: int, start: int = 0) -> torch.Tensor:
    """[rows, 1 head, slots, 1]: slot s of row r holds 100 * r + start + s."""
    values = 100 * torch.arange(rows).view(rows, 1, 1, 1) + start + torch.arange(slots).view(1, 1, slots, 1)
    return values.float()


def test_growing_layer_appends_into_spare_room_and_reads_like_a_concatenation():
    layer = GrowingLayer()
    keys, values = layer.update(kv(2, 5), -kv(2, 5))
    buffer = layer._key_buffer
    assert buffer.shape[-2] > 5  # spare room for the next window
    keys, values = layer.update(kv(2, 3, start=5), -kv(2, 3, start=5))
    assert layer._key_buffer.data_ptr() == buffer.data_ptr()  # written in place, not copied
    assert torch.equal(keys, kv(2, 8)) and torch.equal(values, -kv(2, 8))
    assert layer.get_seq_length() == 8
    layer.update(kv(2, 40, start=8), -kv(2, 40, start=8))  # past the room: the buffer grows, contents kept
    assert torch.equal(layer.keys, kv(2, 48)) and torch.equal(layer.values, -kv(2, 48))
    layer.crop(-6)
    assert torch.equal(layer.keys, kv(2, 42)) and layer.get_seq_length() == 42
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys, kv(2, 42)[1:]) and torch.equal(layer.values, -kv(2, 42)[1:])
    layer.update(kv(2, 1, start=42)[1:], -kv(2, 1, start=42)[1:])
    assert torch.equal(layer.keys, kv(2, 43)[1:])
    with pytest.raises(ValueError, match="negative"):
        layer.crop(3)


def test_growing_layer_adopts_assigned_tensors():
    layer = GrowingLayer()
    layer.update(kv(1, 4), kv(1, 4))
    layer.keys, layer.values = kv(1, 2, start=7), -kv(1, 2, start=7)  # e.g. a gather that shortens the cache
    assert layer.get_seq_length() == 2 and torch.equal(layer.values, -kv(1, 2, start=7))
    layer.update(kv(1, 1, start=9), -kv(1, 1, start=9))
    assert torch.equal(layer.keys, kv(1, 3, start=7))


def filled_cache(rows: int, prompt: int, compaction: str) -> RaggedCache:
    cache = RaggedCache(rows, compaction=compaction)
    cache.kv.update(kv(rows, prompt), -kv(rows, prompt), 0)
    cache.start(torch.ones(rows, prompt, dtype=torch.bool), torch.full((rows,), prompt))
    return cache


def test_commit_packs_each_rows_kept_window_nodes_to_the_front():
    cache = filled_cache(rows=2, prompt=3, compaction="auto")
    cache.kv.update(kv(2, 5, start=3), -kv(2, 5, start=3), 0)  # a 5-node window: slots 3..7
    keep = torch.tensor([[True, False, True, False, True],      # root, nodes 2 and 4 (a tree path)
                         [True, True, False, False, False]])
    cache.commit(keep)
    assert cache.length == 6 and cache.kv.get_seq_length() == 6  # 3 prompt slots + the most kept (3)
    assert cache.valid.tolist() == [[True] * 6, [True] * 5 + [False]]
    assert cache.next_position.tolist() == [6, 5]
    keys = cache.kv.layers[0].keys[:, 0, :, 0]
    assert keys[0].tolist() == [0, 1, 2, 3, 5, 7]  # row 0: node order kept
    assert keys[1, :5].tolist() == [100, 101, 102, 103, 104]


def test_commit_at_batch_1_leaves_no_hole_and_never_mode_keeps_them():
    keep = torch.tensor([[True, False, True, True, False, False]])
    packed = filled_cache(rows=1, prompt=2, compaction="auto")
    packed.kv.update(kv(1, 6, start=2), -kv(1, 6, start=2), 0)
    packed.commit(keep)
    assert packed.valid.all() and packed.length == 5
    assert packed.kv.layers[0].values[0, 0, :, 0].tolist() == [-0, -1, -2, -4, -5]
    holes = filled_cache(rows=1, prompt=2, compaction="never")
    holes.kv.update(kv(1, 6, start=2), -kv(1, 6, start=2), 0)
    holes.commit(keep)  # only the unused tail goes
    assert holes.valid.tolist() == [[True, True, True, False, True, True]]
    assert holes.kv.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_compaction_gathers_in_place_and_keeps_the_room_to_grow():
    cache = filled_cache(rows=2, prompt=4, compaction="never")
    cache.valid[0, 1] = False  # a hole left by an earlier step
    buffer = cache.kv.layers[0]._key_buffer
    cache.compact()
    assert cache.kv.layers[0]._key_buffer.data_ptr() == buffer.data_ptr()
    assert cache.valid.tolist() == [[True, True, True, False], [True] * 4]
    assert cache.kv.layers[0].keys[0, 0, :3, 0].tolist() == [0, 2, 3]
