"""The simulated node's sub-interval p99s (env.sim.engine.sub_interval_p99s): the p99 of each 100 ms
sub-interval, as the load generator PARTIES' code reads every 100 ms would report it
(sc2682cornell/PARTIES manager/PARTIES.py:20 INTERVAL = 0.1, :280-295 getLat)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import poisson

from env.histogram import quantile_rank
from env.sim import model as M
from env.sim.engine import sub_interval_p99s
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario

SCN = simple_scenario({"memcached": 0.3, "xapian": 0.2}, be=("be_parties",), duration_s=60, warmup_s=0)


def _observations(n: int, **kw):
    node = SimNode(SCN, seed=7, **kw)
    out = []
    for _ in range(n):
        obs = node.step()
        dists = {node._names[w]: node._sim.a["dist"][0, w].copy() for w in node._lc_list}
        out.append((obs, dists))
    return out


def test_sub_intervals_change_no_other_draw_and_follow_the_seed():
    plain = _observations(30)
    subs = _observations(30, sub_interval_s=0.1)
    again = _observations(30, sub_interval_s=0.1)
    for (a, _), (b, _), (c, _) in zip(plain, subs, again):
        assert [s.p99_us for s in a.apps] == [s.p99_us for s in b.apps]
        assert [s.histogram for s in a.apps] == [s.histogram for s in b.apps]
        assert all(s.sub_p99_us == () for s in a.apps)
        assert all(len(s.sub_p99_us) == 5 for s in b.apps)  # 500 ms / 100 ms
        assert [s.sub_p99_us for s in b.apps] == [s.sub_p99_us for s in c.apps]


def _order_statistic_cdf(mean_requests: float) -> tuple[float, float]:
    """Mean and spread of the CDF value of the p99 of Poisson(mean_requests) requests: a mixture
    over n of Beta(k, n - k + 1), k = quantile_rank(0.99, n)."""
    n = np.arange(max(1, int(mean_requests - 12 * math.sqrt(mean_requests))), int(mean_requests * 2) + 50)
    w = poisson.pmf(n, mean_requests)
    a = quantile_rank(0.99, n)
    b = n - a + 1.0
    m = a / (a + b)
    v = a * b / ((a + b) ** 2 * (a + b + 1.0))
    mean = float(np.sum(w * m) / w.sum())
    return mean, math.sqrt(float(np.sum(w * (v + m * m)) / w.sum()) - mean * mean)


def test_each_sub_interval_p99_is_the_order_statistic_of_a_fifth_of_the_requests():
    """xapian at 1,600 rps: 800 requests per interval, 160 per sub-interval (Poisson). The CDF value
    of a p99 order statistic of n requests is Beta(k, n - k + 1), k = quantile_rank(0.99, n): its
    mean is ~0.99 either way, its spread larger for a sub-interval (fewer requests, noisier tail)."""
    u_sub, u_int = [], []
    for obs, dists in _observations(400, sub_interval_s=0.1):
        s, d = obs.app("xapian"), dists["xapian"]
        u_int.append(1.0 - M.dist_tail(d, s.p99_us * 1e-6))
        u_sub += [1.0 - M.dist_tail(d, x * 1e-6) for x in s.sub_p99_us if math.isfinite(x)]
    mean_sub, std_sub = _order_statistic_cdf(1600 * 0.1)
    mean_int, std_int = _order_statistic_cdf(1600 * 0.5)
    assert len(u_sub) > 1900
    assert np.mean(u_sub) == pytest.approx(mean_sub, abs=0.0005)
    assert np.mean(u_int) == pytest.approx(mean_int, abs=0.0005)
    assert np.std(u_sub) == pytest.approx(std_sub, rel=0.1)
    assert np.std(u_int) == pytest.approx(std_int, rel=0.15)


def test_timeouts_and_empty_sub_intervals():
    (_, dists), *_ = _observations(1)
    d = dists["memcached"].copy()
    rng = np.random.default_rng(0)
    assert all(math.isnan(x) for x in sub_interval_p99s(d, 0, 5, rng))  # no request, no p99
    few = sub_interval_p99s(d, 2, 5, rng)  # two requests: at most two sub-intervals report
    assert sum(math.isfinite(x) for x in few) in (1, 2)
    d[M.D_DROPPED] = 30.0  # > 1% of 100 requests timed out: the kernel's interval p99 is the timeout
    assert sub_interval_p99s(d, 100, 5, rng) == (d[M.D_TIMEOUT],) * 5


def test_the_sub_interval_must_divide_the_interval():
    with pytest.raises(ValueError, match="evenly"):
        SimNode(SCN, seed=0, sub_interval_s=0.3)
