"""Adaptive continuation and proactive drafting commit more per forward where a texture needs them.

The exactness harness proves each SJD variant lossless, but an ``sjd_ac`` / ``sjd_pac`` that
silently redrew every slot like SJD would pass it too. These count target forwards on exact
toy textures (``raydec.reference.textures.potts_texture``, the real engine and proposer): where
the next token depends on the last, coupling keeps the tail of the window consistent and
SJD-PAC commits several times SJD's tokens per forward; where tokens are independent there is
nothing to repair, and coupling costs nothing.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.reference.textures import MarkovChainTarget, neighbour_tv, potts_texture
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.sampling import sample_with_uniform

torch.set_num_threads(1)

LENGTH, SEQUENCES, WINDOW = 256, 8, 32


class RedrawingCoupling(JacobiProposer):
    """Broken AC: redraws every carried slot from P (SJD's rule) while claiming to couple."""

    def couple(self, p, old_tokens, old_q, uniforms):
        return sample_with_uniform(p, uniforms[..., 0]), p


def tokens_per_forward(target: MarkovChainTarget, method: str, proposer_class=JacobiProposer) -> float:
    tree = dict(branching=3, tree_depth=1) if method == "sjd_pac" else {}
    config = DecodeConfig(method=method, max_new_tokens=LENGTH, sampling=SamplingConfig(temperature=1.0),
                          jacobi=JacobiDraftConfig(window=WINDOW, init="left", **tree))
    rows = Engine(target, proposer_class(config.jacobi, method, "left"), config.sampling, config.max_new_tokens).generate(
        [RowRequest([0], seed=seed) for seed in range(SEQUENCES)]
    )
    assert all(len(r.tokens) == LENGTH for r in rows)
    return sum(len(r.tokens) for r in rows) / sum(r.stats.target_forwards for r in rows)


@pytest.fixture(scope="module")
def dependent():
    return potts_texture(levels=3, beta=2.0)  # repeats its left neighbour with p = 0.79


def test_potts_texture_law():
    target = potts_texture(levels=3, beta=1.0, vocab=5)
    probs = torch.softmax(target.logits, dim=-1)
    e = torch.e
    assert torch.allclose(probs[1], torch.tensor([1, e, 1, 0, 0], dtype=torch.float64) / (e + 2))
    assert neighbour_tv(target, levels=3) == pytest.approx((e - 1) / (e + 2))
    assert neighbour_tv(potts_texture(levels=3, beta=0.0)) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="beta"):
        potts_texture(levels=3, beta=-1.0)
    with pytest.raises(ValueError, match="levels"):
        potts_texture(levels=4, beta=1.0, vocab=3)


def test_coupling_and_tree_beat_sjd_on_a_dependent_texture(dependent):
    sjd = tokens_per_forward(dependent, "sjd")
    assert tokens_per_forward(dependent, "sjd_ac") >= 2.0 * sjd
    assert tokens_per_forward(dependent, "sjd_pac") >= 2.0 * sjd


def test_a_coupling_that_redraws_loses_the_gain(dependent):
    """The test above can fail: SJD's redraw under the sjd_ac name gains nothing."""
    sjd = tokens_per_forward(dependent, "sjd")
    assert tokens_per_forward(dependent, "sjd_ac", RedrawingCoupling) < 1.2 * sjd


def test_coupling_costs_nothing_on_independent_tokens():
    independent = potts_texture(levels=3, beta=0.0)  # the shapes world's speckle
    sjd = tokens_per_forward(independent, "sjd")
    assert tokens_per_forward(independent, "sjd_ac") == pytest.approx(sjd, rel=0.02)
