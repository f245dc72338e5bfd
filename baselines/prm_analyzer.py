"""Intel PRM's Analyzer: contention fences per LC utilisation bin (intel/platform-resource-manager,
`prm/prm/analyze/analyzer.py` and `gmmfense.py`, which `eris/analyze` links to).

The Analyzer bins the LC app's metrics by its CPU utilisation, in half-CPU steps from half of the
CPUs the app requested to one more than them (`analyzer.py:81-92` partition_utilization, bin step
`UTIL_BIN_STEP` = 50%), and in each bin fits a Gaussian mixture to each metric, the number of
components (1..10) chosen by BIC (`gmmfense.py:32-56`). The upper fence of a metric is read off the
mixture (`gmmfense.py:123-193` get_gaussian_round_fense, called strict with span 4 by
`analyzer.py:213-214` build_model): each component proposes min(mean + 4 sigma, the largest value
assigned to it); the proposal whose share of values above it is the largest not over 10% wins (the
smallest share when all are over). Bins with no data get no fence (`analyzer.py:182-186`: the fit
fails and the bin is skipped).

The mixture is fitted here by EM with a deterministic start (components at evenly spaced quantiles;
the Analyzer uses scikit-learn's k-means start with a fixed seed) and scikit-learn's variance floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

UTIL_BIN_STEP_CORES = 0.5  # analyzer.py:63 UTIL_BIN_STEP = 50 (% of one CPU)
MAX_COMPONENTS = 10  # gmmfense.py:32 max_mixture
FENCE_SPAN = 4.0  # analyzer.py:214 span=4
OUTLIER_FRAC = 0.1  # gmmfense.py:32 threshold=0.1
_VAR_FLOOR = 1e-6  # scikit-learn GaussianMixture reg_covar
_EM_ITERATIONS = 200
_EM_TOL = 1e-7


@dataclass(frozen=True)
class Mixture:
    """A 1-D Gaussian mixture: component weights, means and variances."""

    weights: tuple[float, ...]
    means: tuple[float, ...]
    variances: tuple[float, ...]

    def responsibilities(self, xs: np.ndarray) -> np.ndarray:
        """(n, k) posterior probability of each component for each value."""
        w, m, v = (np.asarray(a) for a in (self.weights, self.means, self.variances))
        logp = np.log(w) - 0.5 * (np.log(2 * math.pi * v) + (xs[:, None] - m) ** 2 / v)
        logp -= logp.max(axis=1, keepdims=True)
        p = np.exp(logp)
        return p / p.sum(axis=1, keepdims=True)

    def log_likelihood(self, xs: np.ndarray) -> float:
        w, m, v = (np.asarray(a) for a in (self.weights, self.means, self.variances))
        logp = np.log(w) - 0.5 * (np.log(2 * math.pi * v) + (xs[:, None] - m) ** 2 / v)
        top = logp.max(axis=1)
        return float(np.sum(top + np.log(np.exp(logp - top[:, None]).sum(axis=1))))

    def bic(self, xs: np.ndarray) -> float:
        """Bayesian information criterion (3k - 1 free parameters), as scikit-learn's `bic`."""
        k = len(self.weights)
        return -2.0 * self.log_likelihood(xs) + (3 * k - 1) * math.log(len(xs))


def fit_mixture(xs: np.ndarray, k: int) -> Mixture:
    """EM fit of a k-component mixture to the values `xs` (at least k of them)."""
    n = len(xs)
    means = np.quantile(xs, (np.arange(k) + 0.5) / k)
    variances = np.full(k, max(float(np.var(xs)), 0.0) + _VAR_FLOOR)
    weights = np.full(k, 1.0 / k)
    mix = Mixture(tuple(weights), tuple(means), tuple(variances))
    last = -math.inf
    for _ in range(_EM_ITERATIONS):
        r = mix.responsibilities(xs)
        nk = r.sum(axis=0) + 10 * np.finfo(float).eps
        means = (r * xs[:, None]).sum(axis=0) / nk
        variances = (r * (xs[:, None] - means) ** 2).sum(axis=0) / nk + _VAR_FLOOR
        mix = Mixture(tuple(nk / n), tuple(means), tuple(variances))
        ll = mix.log_likelihood(xs)
        if abs(ll - last) <= _EM_TOL * max(1.0, abs(ll)):
            break
        last = ll
    return mix


def best_mixture(xs: np.ndarray, max_components: int = MAX_COMPONENTS) -> Mixture:
    """The mixture of 1..`max_components` components with the lowest BIC (gmmfense.py:44-56)."""
    best: Mixture | None = None
    for k in range(1, min(max_components, len(xs)) + 1):
        mix = fit_mixture(xs, k)
        if best is None or mix.bic(xs) < best.bic(xs):
            best = mix
    assert best is not None, "no values to fit"
    return best


def upper_fence(
    values: list[float] | np.ndarray, span: float = FENCE_SPAN, outlier_frac: float = OUTLIER_FRAC
) -> float:
    """The strict upper fence of gmmfense.py:123-193 (module docstring) over `values` (not empty)."""
    xs = np.asarray(values, dtype=float)
    mix = best_mixture(xs)
    labels = mix.responsibilities(xs).argmax(axis=1)
    proposals: list[tuple[float, float]] = []  # (share of values above, fence)
    for c, (mean, var) in enumerate(zip(mix.means, mix.variances)):
        mine = xs[labels == c]
        if mine.size == 0:
            continue
        fence = min(mean + span * math.sqrt(var), float(mine.max()))
        proposals.append((float(np.mean(xs > fence)), fence))
    proposals.sort(key=lambda p: p[0])
    under = [p for p in proposals if p[0] <= outlier_frac]
    return under[-1][1] if under else proposals[0][1]


def utilization_bins(requested_cores: float) -> list[tuple[float, float]]:
    """The Analyzer's utilisation bins in cores: [start, next start) from half the requested CPUs
    to one more than them in half-CPU steps, the last one half a CPU wide (analyzer.py:81-92,
    :143-148)."""
    starts = np.arange(requested_cores * 0.5, requested_cores + 1.0, UTIL_BIN_STEP_CORES)
    ends = [*starts[1:], starts[-1] + UTIL_BIN_STEP_CORES] if len(starts) else []
    return [(float(a), float(b)) for a, b in zip(starts, ends)]
