"""Fixtures the core's tests share."""

from __future__ import annotations

import pytest

from tests.toys import tiny_llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A float64 two-layer Llama over 8 tokens (seed 1): the law tests' target. Test modules
    that need another shape define their own ``llama``."""
    return tiny_llama(tmp_path_factory.mktemp("toy"), vocab=8, seed=1)
