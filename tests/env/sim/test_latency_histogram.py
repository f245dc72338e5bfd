"""The simulated node's latency histograms (env.sim.engine.interval_histogram): the requests of
each interval drawn from the model's own latency distribution, so that a window's tail is right."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from env import metrics as Mt
from env.histogram import RELATIVE_ERROR, merge
from env.loop import run_episode
from env.sim import model as M
from env.sim.engine import interval_histogram
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from tests.fakes import HoldController


@njit(cache=True)
def _draw_latencies(d, u):
    """Per-request latencies of a `dist` row by inverting its tail at uniforms u."""
    out = np.empty(u.size)
    for i in range(u.size):
        out[i] = M.dist_quantile(d, u[i])
    return out


def _run_memcached(intervals: int, load: float = 0.4):
    node = SimNode(simple_scenario({"memcached": load}, be=("be_parties",), duration_s=1e4), seed=3)
    dists, counts, hists = [], [], []
    for _ in range(intervals):
        obs = node.step()
        dists.append(node._sim.a["dist"][0, node._lc_list[0]].copy())
        counts.append(obs.apps[0].requests)
        hists.append(obs.apps[0].histogram)
    return dists, counts, hists


def test_window_p99_agrees_with_per_request_latencies_of_the_same_distribution():
    dists, counts, hists = _run_memcached(12)
    assert all(h.count == n for h, n in zip(hists, counts)) and sum(counts) > 1_000_000
    window = merge(hists)
    rng = np.random.default_rng(0)
    draws = np.concatenate([_draw_latencies(d, rng.random(n)) for d, n in zip(dists, counts)]) * 1e6
    for q in (0.5, 0.99, 0.999):
        want = float(np.percentile(draws, 100 * q, method="inverted_cdf"))
        # bucket error plus the sampling noise of two independent samples of >1M requests
        assert window.quantile_us(q) == pytest.approx(want, rel=RELATIVE_ERROR + 0.003), q
    # and the exact p99 of the mixture of the intervals' distributions
    n = np.array(counts, dtype=float)

    def over(x_s: float) -> float:
        return float(sum(k * M.dist_tail(d, x_s) for k, d in zip(n, dists)) / n.sum())

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if over(mid) > 0.01 else (lo, mid)
    assert window.quantile_us(0.99) == pytest.approx(hi * 1e6, rel=RELATIVE_ERROR + 0.002)


def test_a_few_requests_are_drawn_from_the_whole_distribution():
    """Sphinx-like intervals of one request each: over many intervals their latencies follow the
    distribution, tail included (nothing clipped to the body)."""
    dists, _, _ = _run_memcached(1)
    d = dists[0]
    rng = np.random.default_rng(1)
    one = [interval_histogram(d, 1, rng) for _ in range(20_000)]
    assert all(h.count == 1 for h in one)
    got = merge(one).quantiles_us([0.5, 0.99, 0.999])
    want = [M.dist_quantile(d, 1 - q) * 1e6 for q in (0.5, 0.99, 0.999)]
    np.testing.assert_allclose(got, want, rtol=0.08)  # 20,000 draws: the 99.9th is ~20 values


def test_timed_out_requests_enter_at_the_timeout():
    dists, _, _ = _run_memcached(1)
    d = dists[0].copy()
    d[M.D_DROPPED] = 30.0
    h = interval_histogram(d, 100, np.random.default_rng(2))
    assert h.count == 100
    assert h.count_above_us(d[M.D_TIMEOUT] * 1e6 * (1 - 2 * RELATIVE_ERROR)) == 30
    assert interval_histogram(d, 0, np.random.default_rng(2)).count == 0


def test_histograms_change_no_other_draw_and_follow_the_seed():
    scn = simple_scenario({"memcached": 0.5, "xapian": 0.5}, be=("be_parties",), duration_s=20, warmup_s=5)
    with_h = run_episode(SimNode(scn, seed=4), HoldController(), 10.0, rng=np.random.default_rng(0))
    without = run_episode(
        SimNode(scn, seed=4, histograms=False), HoldController(), 10.0, rng=np.random.default_rng(0)
    )
    again = run_episode(SimNode(scn, seed=4), HoldController(), 10.0, rng=np.random.default_rng(0))
    assert [[a.p99_us for a in r.apps] for r in with_h] == [[a.p99_us for a in r.apps] for r in without]
    assert all(a.histogram is None for r in without for a in r.apps)
    assert [[a.histogram for a in r.apps] for r in with_h] == [[a.histogram for a in r.apps] for r in again]
    assert all(a.histogram.count == a.requests for r in with_h for a in r.apps)


def test_the_window_verdict_of_a_simulated_point():
    """memcached alone at half load meets its target over the minute; at twice its max load it does not."""
    for load, ok in ((0.5, True), (2.0, False)):
        scn = simple_scenario({"memcached": load}, be=(), duration_s=90, warmup_s=30)
        recs = run_episode(SimNode(scn, seed=5), HoldController(), 90.0, rng=np.random.default_rng(0))
        wt = Mt.window_tail(recs)
        assert wt.complete and wt.sustained is ok, (load, wt)
        assert math.isfinite(wt.tail_ratio) and (wt.tail_ratio <= 1.0) is ok
