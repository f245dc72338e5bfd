"""Intel PRM's Analyzer fences (baselines/prm_analyzer.py; intel/platform-resource-manager
prm/prm/analyze/analyzer.py and gmmfense.py)."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.prm_analyzer import best_mixture, upper_fence, utilization_bins


def test_utilisation_bins_start_at_half_the_requested_cpus():
    """analyzer.py:81-92: np.arange(cpus x 50, (cpus + 1) x 100, 50) in % of one CPU."""
    bins = utilization_bins(9.0)
    assert bins[0] == (4.5, 5.0) and bins[-1] == (9.5, 10.0) and len(bins) == 11


def test_upper_fence_follows_the_gaussian_round_rule_of_the_analyzer():
    """gmmfense.py:32-56 (BIC over 1..10 components) and :123-193 (strict, span 4: each component
    proposes min(mean + 4 sigma, its largest value); the largest outlier share <= 10% wins)."""
    sklearn = pytest.importorskip("sklearn.mixture")
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.normal(10.0, 1.0, 80), rng.normal(20.0, 1.0, 20)])
    ref = min(
        (sklearn.GaussianMixture(n_components=k, random_state=1005).fit(xs[:, None]) for k in range(1, 11)),
        key=lambda g: g.bic(xs[:, None]),
    )
    assert len(best_mixture(xs).weights) == ref.n_components == 2
    # the lower cluster's proposal leaves its upper fifth above it (> 10%): the upper cluster's wins
    assert upper_fence(xs) == pytest.approx(xs.max())
    assert upper_fence([5.0]) == 5.0 and upper_fence([3.0] * 4) == 3.0
