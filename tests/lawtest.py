"""Two-sided goodness-of-fit of sampled sequences against an exact law.

Per-position marginals and every pairwise joint are compared with Pearson chi-square tests
(cells with expected count < 5 pooled), Bonferroni-corrected to one family-wise false-alarm
rate. Seeds are fixed, so a verdict is reproducible; the broken-variant tests show the same
test has the power to reject.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest

FALSE_ALARM_RATE = 1e-3


@dataclass
class LawReport:
    min_p_value: float
    num_tests: int
    max_tv: float
    worst: str

    @property
    def passed(self) -> bool:
        return self.min_p_value >= FALSE_ALARM_RATE / self.num_tests

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: min p={self.min_p_value:.2e} over {self.num_tests} tests "
                f"(threshold {FALSE_ALARM_RATE / self.num_tests:.1e}), max TV={self.max_tv:.4f}, worst={self.worst}")


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    if (~keep & (obs > 0)).any():
        return 0.0  # an impossible outcome was observed
    obs, exp = obs[keep], exp[keep]
    if len(obs) < 2:
        return 1.0
    statistic = ((obs - exp) ** 2 / exp).sum()
    return float(stats.chi2.sf(statistic, len(obs) - 1))


def compare_to_law(samples: torch.Tensor, law: torch.Tensor) -> LawReport:
    """samples: [n, T] long; law: [V] * T exact joint law (sums to 1)."""
    n, length = samples.shape
    vocab = law.shape[0]
    x = samples.numpy()
    law_np = law.numpy()
    p_values, tvs, names = [], [], []
    for t in range(length):
        marginal = law_np.sum(axis=tuple(a for a in range(length) if a != t))
        counts = np.bincount(x[:, t], minlength=vocab).astype(float)
        p_values.append(_chi2(counts, marginal))
        tvs.append(0.5 * np.abs(counts / n - marginal).sum())
        names.append(f"x{t}")
    for s, t in itertools.combinations(range(length), 2):
        joint = law_np.sum(axis=tuple(a for a in range(length) if a not in (s, t))).reshape(-1)
        counts = np.bincount(x[:, s] * vocab + x[:, t], minlength=vocab * vocab).astype(float)
        p_values.append(_chi2(counts, joint))
        tvs.append(0.5 * np.abs(counts / n - joint).sum())
        names.append(f"(x{s},x{t})")
    worst = int(np.argmin(p_values))
    return LawReport(min(p_values), len(p_values), max(tvs), names[worst])


SAMPLES = 20_000  # draws per law test: every exactness test samples this many rows, except:
# PATH_SAMPLES: a budget for the law tests of a batching path (batch 1, ragged batches, continuous
# batching). Their sampler and verifier are the full tests'; these guard how rows enter, leave and
# line up in a batch, where a fault shifts the law grossly. One row at a time is the suite's slowest way
# to draw, so they take fewer draws.
PATH_SAMPLES = 5_000


def sample_engine(target, proposer, config, prompts, seeds, batch_size, verifier=None, constraint=None, coupling="rejection") -> torch.Tensor:
    """Run the engine over (prompt, seed) rows in batches; returns [n, max_new_tokens] tokens."""
    kwargs = {"constraint": constraint, "coupling": coupling}
    if verifier is not None:
        kwargs["verifier"] = verifier
    engine = Engine(target, proposer, config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, **kwargs)
    rows = []
    for start in range(0, len(seeds), batch_size):
        requests = [RowRequest(prompts[i % len(prompts)], seed=seeds[i]) for i in range(start, min(start + batch_size, len(seeds)))]
        rows += [out.tokens for out in engine.generate(requests)]
    return torch.tensor(rows, dtype=torch.long)
