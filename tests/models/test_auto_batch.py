"""``batch_size: auto``: the largest batch whose KV cache fits a share of the worker's memory beside
the weights (raydec.api.memory), at most the batch the shape cache shows fastest; and the configs
that take it."""

from __future__ import annotations

import pytest

from raydec.api.memory import MAX_AUTO_BATCH, largest_batch

GiB, MiB = 2**30, 2**20


def test_the_largest_batch_that_fits_on_hand_made_numbers():
    # 0.9 of 10 GiB is 9 GiB; the weights take 2 GiB, so 7 GiB for rows of 100 MiB: 71 rows
    assert largest_batch(10 * GiB, 2 * GiB, 100 * MiB, 0.9) == 71
    assert largest_batch(10 * GiB, 2 * GiB, 100 * MiB, 0.5) == 30  # 5 GiB - 2 GiB = 3072 MiB
    assert largest_batch(10 * GiB, 2 * GiB, 100 * MiB, 0.9, best_batch=32) == 32  # the tuner's fastest batch caps it
    assert largest_batch(10 * GiB, 2 * GiB, 100 * MiB, 0.9, best_batch=128) == 71  # ... but never past the memory
    assert largest_batch(80 * GiB, 14 * GiB, 1 * MiB, 0.9) == MAX_AUTO_BATCH  # a sane maximum
    assert largest_batch(80 * GiB, 14 * GiB, 1 * MiB, 0.9, maximum=64) == 64
    assert largest_batch(10 * GiB, 2 * GiB, 7 * GiB, 0.9) == 1  # exactly one row
    with pytest.raises(ValueError, match=r"not one row fits: max_memory_fraction=0.3 of 10.00 GiB is 3.00 GiB, the weights take "
                                         r"2.00 GiB and a row's KV cache 2048.0 MiB"):
        largest_batch(10 * GiB, 2 * GiB, 2 * GiB, 0.3)
    with pytest.raises(ValueError, match="not one row fits"):
        largest_batch(10 * GiB, 12 * GiB, 1 * MiB, 0.9)  # the weights alone are past the budget
    with pytest.raises(ValueError, match=r"max_memory_fraction must be in \(0, 1\], got 1.5"):
        largest_batch(10 * GiB, 2 * GiB, 100 * MiB, 1.5)


def test_the_fastest_batch_the_shape_cache_knows_for_the_same_key(tmp_path):
    from raydec.api.draft_shapes import ShapeCache, apply_shape
    from raydec.api.tuner import ShapeTrial
    from raydec.config import DecodeConfig

    cache = ShapeCache(tmp_path)
    base = DecodeConfig(method="sjd_pac", jacobi="auto")
    key = {"weights": "w1", "device": "cpu x1", "dtype": "float32", "config": {"method": "sjd_pac"}}
    window = {"method": "sjd_pac", "jacobi": {"window": 16}, "label": "window=16,init=uniform"}
    ar = {"method": "ar", "label": "ar"}
    assert cache.best_batch({**key, "batch": 1}) is None
    for batch, shape, rates in ((1, window, (5.0, 9.0)), (8, window, (30.0, 40.0)), (32, ar, (45.0, 44.0))):
        trials = [ShapeTrial(DecodeConfig(method="ar"), rates[0], 1.0), ShapeTrial(apply_shape(base, window), rates[1], rates[1] / rates[0])]
        cache.put({**key, "batch": batch}, shape, trials)
    cache.put({**key, "weights": "w2", "batch": 64}, ar, [ShapeTrial(DecodeConfig(method="ar"), 99.0, 1.0)])  # another model
    assert cache.best_batch({**key, "batch": "auto"}) == 32  # its choice (AR) decoded 45 rows/s, batch 8's 40
    assert cache.best_batch({**key, "weights": "w3", "batch": 1}) is None


def test_batch_size_auto_in_job_and_serve_configs_and_bad_values_named():
    from pydantic import ValidationError

    from raydec.runtime import JobConfig
    from raydec.serve.config import ServedModel
    from raydec.validation import validation_problems

    job = {"model": "reference", "input": {"path": "in/*.parquet"}, "output": {"path": "out"}}
    config = JobConfig.model_validate({**job, "pool": {"batch_size": "auto"}})
    assert config.pool.batch_size == "auto" and config.pool.max_memory_fraction == 0.9
    assert config.processor_config().batch_size == "auto" and config.processor_config().max_memory_fraction == 0.9
    assert JobConfig.model_validate(job).pool.batch_size == 8
    served = ServedModel.model_validate({"name": "m", "task": "t2i", "batch_size": "auto", "max_memory_fraction": 0.5})
    assert served.batch_size == "auto" and served.max_memory_fraction == 0.5
    bad = {
        "pool.batch_size: expected an integer from 1 to 4096 or 'auto'": {"pool": {"batch_size": "max"}},
        "pool.batch_size: expected an integer from 1 to 4096 or 'auto' (the most rows that fit max_memory_fraction of the "
        "worker's memory) (got 0)": {"pool": {"batch_size": 0}},
        "pool.batch_size: expected an integer from 1 to 4096 or 'auto' (the most rows that fit max_memory_fraction of the "
        "worker's memory) (got True)": {"pool": {"batch_size": True}},
        "pool.max_memory_fraction: Input should be less than or equal to 1": {"pool": {"max_memory_fraction": 1.5}},
    }
    for needle, extra in bad.items():
        with pytest.raises(ValidationError) as caught:
            JobConfig.model_validate({**job, **extra})
        assert any(needle in line for line in validation_problems(caught.value)), (needle, validation_problems(caught.value))
    with pytest.raises(ValidationError, match=r"batch_size\n.*expected an integer from 1 to 1024 or 'auto'.*input_value=2048"):
        ServedModel.model_validate({"name": "m", "task": "t2i", "batch_size": 2048})
