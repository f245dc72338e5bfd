"""P(one interval's p99 meets its target) as the simulated node reports p99s
(env.sim.engine.interval_meet_probability): what the Oracle's `verdict: intervals` plans with."""

from __future__ import annotations

import numpy as np
import pytest

from env.histogram import quantile_rank
from env.sim.engine import P99, interval_meet_probability, meet_probability
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario


@pytest.mark.parametrize(
    ("mean", "tail"), [(0.7, 0.05), (0.7, 0.005), (3.0, 0.05), (10.0, 0.02), (29.0, 0.01), (0.2, 0.3)]
)
def test_it_sums_over_the_poisson_count_and_an_empty_interval_reports_the_expected_p99(mean, tail):
    """Monte Carlo of the kernel's draw (`engine._draw`): a Poisson count, the p99 order statistic's
    CDF value ~ Beta(k, n - k + 1), and an empty interval at the 0.99 quantile."""
    rng = np.random.default_rng(0)
    n = rng.poisson(mean, 400_000)
    k = quantile_rank(P99, np.maximum(n, 1))
    u = rng.beta(k, np.maximum(n - k + 1, 1))
    met = np.where(n > 0, u <= 1.0 - tail, tail <= 1.0 - P99).mean()
    assert float(interval_meet_probability(tail, mean)) == pytest.approx(met, abs=0.004)


def test_it_is_meet_probability_at_the_mean_from_thirty_requests_on():
    tails = np.array([0.001, 0.01, 0.05])
    for mean in (30.0, 500.0, 1e5):
        assert np.array_equal(interval_meet_probability(tails, mean), meet_probability(tails, mean))
    # arrays of means and tails broadcast; a mean of zero is an empty interval every time
    got = interval_meet_probability(np.array([[0.005], [0.05]]), np.array([0.0, 0.7, 100.0]))
    assert got.shape == (2, 3)
    assert got[0, 0] == 1.0 and got[1, 0] == 0.0


def test_it_predicts_the_share_of_intervals_the_simulated_node_reports_met():
    """Sphinx at 10% of its max load (0.7 requests an interval) on 3 cores: its tail at the target
    is about 5%, so one request meets 95% of the time, but half the intervals have none and
    report the expected p99, over the target. The node meets in about half the intervals, which
    this predicts and `meet_probability` at the mean count (0.94) does not."""
    node = SimNode(simple_scenario({"sphinx": 0.1}), seed=0, histograms=False)
    alloc = node.current_allocation().replace_app("sphinx", cores=3.0, llc_ways=1)
    obs = node.step(alloc)
    met, predicted, at_mean = [], [], []
    for _ in range(600):
        obs = node.step()
        s = obs.apps[0]
        tail = node.tail_at_target()["sphinx"]
        mean = s.load_rps * obs.interval_s
        met.append(s.p99_us <= s.target_us)
        predicted.append(float(interval_meet_probability(tail, mean)))
        at_mean.append(float(meet_probability(tail, mean)))
    assert 0.02 < tail < 0.1 and mean < 1.0
    assert np.mean(predicted) == pytest.approx(np.mean(met), abs=0.06)
    assert np.mean(at_mean) > np.mean(met) + 0.3
