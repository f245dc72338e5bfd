"""agents.bo: the CLITE-style BO controller.

* the search space: every candidate is a valid allocation in fair's layout, encodings agree,
  probes and memory floors are what they say;
* the acquisition step on synthetic data (constrained EI stays feasible, PoF seeks feasibility);
* the sample/search/hold state machine on hand-built observations;
* on a small simulated node whose optimum is known by exhaustive analytic evaluation of every
  candidate, the controller finds it within its budget;
* the GP's fitting: bounded warm-started chunks on idle ticks, none when a sample ends, no lazy import
  inside decide();
* decisions valid, free of I/O and deterministic for a seed once the GP runs (the generic contract,
  tests/harness/test_controller_contract.py, covers the rest for the spec `bo`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from agents.bo import AllocationSpace, BoConfig, BoController, Candidates, Phase, load_bo_config, make
from agents.bo import model as bo_model
from agents.bo.model import Surrogate, _quiet_single_thread, fit_gp
from env.allocations import fair_allocation
from env.config import CONFIGS, ConfigError
from env.controller import ControllerContext
from env.histogram import LatencyHistogram
from env.sim import model as M
from env.sim.engine import be_alone_progress, build_layout, meet_probability
from env.sim.experiments import Setup, analytic_outputs
from env.sim.node import SimNode
from env.sim.platform import load_platform
from env.sim.scenario import simple_scenario
from env.types import (
    Allocation,
    AppSample,
    BeSample,
    Capabilities,
    Decision,
    Observation,
    Resource,
    Usage,
    validate_allocation,
)
from tests.fakes import no_io

ALL = tuple(Resource)


# ---- config ------------------------------------------------------------------------------------------
def test_default_config_loads_strictly(tmp_path):
    cfg = load_bo_config()
    assert cfg == load_bo_config(CONFIGS / "agents" / "bo.yaml")
    assert set(cfg.resources) == {"core", "cache", "freq", "mem", "disk"}
    bad = tmp_path / "bad.yaml"
    for text, match in [
        ("max_sample: 3\n", "did you mean 'max_samples'"),
        ("max_samples: 40\nmax_samples_without_qos: 30\n", "max_samples"),
        ("resources: [core, gpu]\n", "resources"),
        ("qos_margin_log: 0.1\nrecheck_margin_log: 0.2\n", "recheck_margin_log"),
        ("local_centres: 0\n", "local_centres"),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_bo_config(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_bo_config(tmp_path / "missing.yaml")
    assert load_bo_config("bo") == cfg  # by name, from configs/agents/
    good = tmp_path / "good.yaml"
    good.write_text("max_samples: 7\nresources: [core]\n")
    ctrl = make(ControllerContext(capabilities=None), str(good))  # type: ignore[arg-type]
    assert ctrl.cfg.max_samples == 7 and ctrl.cfg.resources == ("core",)


# ---- the search space --------------------------------------------------------------------------------
def _layout(a: Allocation) -> list[tuple[str, int, int]]:
    return [(x.name, x.core_group, x.clos) for x in a]


def test_candidates_are_valid_allocations_in_fairs_layout(parties_caps):
    space = AllocationSpace(parties_caps, ALL)
    fair = fair_allocation(parties_caps)
    rng = np.random.default_rng(0)
    pool = Candidates.concat(
        [
            space.random(300, rng),
            space.random(300, rng, bundle_concentration=30.0),
            space.neighbours(space.point_of(fair), (0.1, 0.25)),
            space.probe("lc_max_each"),
        ]
    )
    X = space.encode(pool)
    assert X.shape == (len(pool), space.dim) and space.dim == 4 * 4 + 4
    assert X.min() >= 0.0 and X.max() <= 1.0
    for i in range(len(pool)):
        a = space.decode(pool, i)
        validate_allocation(a, parties_caps)
        assert _layout(a) == _layout(fair)
        # what is not searched stays fair; the encodings of the point and of its allocation agree
        assert [x.net_gbps for x in a] == [x.net_gbps for x in fair]
        np.testing.assert_allclose(space.encode_allocation(a), X[i])
        assert (space.point_of(a).keys() == pool.take([i]).keys()).all()
    # every pooled unit is handed out (the BE party holds the rest)
    assert (pool.units.sum(axis=1) == space.total_units).all() and space.admissible(pool).all()
    bad = pool.take([0])
    bad.units[0, 0, 0] = 0  # an LC app without a core
    assert not space.admissible(bad)[0]
    assert space.decode(space.point_of(fair)) == fair


def test_probes_are_clites_initial_samples(parties_caps):
    space = AllocationSpace(parties_caps, ALL)
    top = parties_caps.freq_levels_mhz[-1]
    lc = [a.name for a in parties_caps.lc_apps]
    maxed = space.probe("lc_max_each")
    assert len(maxed) == 3
    for k, name in enumerate(lc):
        a = space.decode(maxed, k)
        others = [o for o in lc if o != name]
        assert a[name].cores == parties_caps.cores - 2 * parties_caps.core_step  # BE may drop to 0
        assert a["be_parties"].cores == 0.0 and all(a[o].cores == parties_caps.core_step for o in others)
        assert (
            all(a[n].freq_mhz == top for n in lc)
            and a["be_parties"].freq_mhz == parties_caps.nominal_freq_mhz
        )
        assert a[name].llc_ways == parties_caps.llc_ways - 3 * parties_caps.min_llc_ways
    b = space.decode(space.probe("be_minimum"))
    assert b["be_parties"].cores == 0.0 and b["be_parties"].llc_ways == parties_caps.min_llc_ways
    assert sorted(b[n].cores for n in lc) == [4.0, 5.0, 5.0] and all(b[n].freq_mhz == top for n in lc)


def test_bundled_random_points_give_an_app_a_share_of_everything(parties_caps):
    """Bundled draws correlate a party's shares across resources; independent draws do not."""
    space = AllocationSpace(parties_caps, ALL)
    rng = np.random.default_rng(2)

    def core_cache_corr(c: Candidates) -> float:
        sh = c.units[:, :3, :2] / space.total_units[None, None, :2]
        return float(np.corrcoef(sh[..., 0].ravel(), sh[..., 1].ravel())[0, 1])

    assert abs(core_cache_corr(space.random(1000, rng))) < 0.15
    assert core_cache_corr(space.random(1000, rng, bundle_concentration=30.0)) > 0.7


def test_memory_floors_bound_every_candidate(parties_caps):
    base = AllocationSpace(parties_caps, ALL)
    floored = base.with_floors({Resource.MEM: np.array([12, 1, 3, 2])})
    rng = np.random.default_rng(1)
    pool = Candidates.concat(
        [
            floored.random(200, rng),
            floored.random(200, rng, bundle_concentration=30.0),
            floored.probe("lc_max_each"),
            floored.probe("be_minimum"),
        ]
    )
    j = floored.pooled.index(Resource.MEM)
    assert (pool.units[:, 0, j] >= 12).all() and (pool.units[:, 2, j] >= 3).all()
    assert (pool.units[:, 3, j] >= 2).all()
    # floors the pool cannot hold are scaled into it
    squeezed = base.with_floors({Resource.MEM: np.array([100, 100, 100, 100])})
    assert squeezed.min_units[:, j].sum() <= base.total_units[j]


def test_enumerate_all_lists_every_point_once(parties_caps):
    caps = dataclasses.replace(parties_caps, cores=5.0, llc_ways=6)
    space = AllocationSpace(caps, (Resource.CORE, Resource.CACHE))
    pts = space.enumerate_all()
    # cores: 3 LC apps >= 1, BE >= 0 over 5 -> C(2+3, 3) = 10; ways: all >= 1 over 6 -> C(2+3, 3) = 10
    assert len(pts) == 100 and len(pts.unique()) == 100
    assert all(validate_allocation(space.decode(pts, i), caps) is None for i in range(len(pts)))


# ---- the acquisition step ----------------------------------------------------------------------------
def test_constrained_ei_prefers_the_best_feasible_region_and_pof_seeks_feasibility():
    """Objective x0, constraint 0.6 - x0 >= 0: the feasible optimum is at x0 = 0.6."""
    rng = np.random.default_rng(0)
    train_x = rng.random((12, 2))
    train_y = np.stack([train_x[:, 0], 0.6 - train_x[:, 0]], axis=1)
    choices = np.array([[0.1, 0.5], [0.3, 0.5], [0.57, 0.5], [0.8, 0.5], [0.95, 0.5]])
    feasible = train_y[:, 1] >= 0
    assert feasible.any() and not feasible.all()
    p = Surrogate().propose(train_x, train_y, feasible, choices, 0.0, seed=0)
    assert p.fit_ok and p.kind == "log_cei" and p.index == 2
    # with no feasible sample, the most probably feasible candidate (lowest x0) is chosen
    train_y2 = np.stack([train_x[:, 0], -0.2 - train_x[:, 0]], axis=1)
    p2 = Surrogate().propose(train_x, train_y2, np.zeros(12, bool), choices, 0.0, seed=0)
    assert p2.kind == "log_pof" and p2.index == 0


def test_each_output_sees_only_its_input_columns():
    """output 0 depends on x0, output 1 on x5; each model is blind to the other's columns."""
    rng = np.random.default_rng(0)
    x = rng.random((15, 8))
    y = np.stack([x[:, 0], np.sin(3 * x[:, 5])], axis=1)
    with _quiet_single_thread(0):
        model = fit_gp(x, y, attempts=2, inputs=[[0, 1], [5, 6]])
        a = rng.random((6, 8))
        b = a.copy()
        b[:, 5] = rng.random(6)
        mean_a = model.posterior(torch.as_tensor(a)).mean.detach()
        mean_b = model.posterior(torch.as_tensor(b)).mean.detach()
    assert torch.allclose(mean_a[:, 0], mean_b[:, 0])  # column 5 is not output 0's
    assert not torch.allclose(mean_a[:, 1], mean_b[:, 1])


def _count_fits(monkeypatch) -> list[int | None]:
    """Patch `fit_model` to record the maxiter of every call."""
    calls: list[int | None] = []
    real = bo_model.fit_model

    def counting(model, attempts, maxiter=None, ftol=None):
        calls.append(maxiter)
        return real(model, attempts, maxiter, ftol)

    monkeypatch.setattr(bo_model, "fit_model", counting)
    return calls


def test_surrogate_fits_in_bounded_warm_chunks_and_proposes_without_fitting(monkeypatch):
    """`fit` runs one chunk of at most `maxiter` iterations from the stored hyperparameters;
    `propose` conditions on every sample (the newest too) with them and fits nothing."""
    calls = _count_fits(monkeypatch)
    rng = np.random.default_rng(0)
    x = rng.random((12, 2))
    y = np.stack([x[:, 0], 0.6 - x[:, 0]], axis=1)
    s = Surrogate(attempts=1, maxiter=3, ftol=1e-5)
    assert not s.ready
    assert s.fit(x[:-1], y[:-1], seed=0)
    first = dict(s._params)
    assert s.fit(x[:-1], y[:-1], seed=0)  # a second chunk on the same samples
    assert calls == [3, 3] and s.fitted_on == 11 and s.chunks == 2
    assert any(not torch.equal(first[k], v) for k, v in s._params.items())  # it went on from there
    choices = np.array([[0.1, 0.5], [0.3, 0.5], [0.57, 0.5], [0.8, 0.5], [0.95, 0.5]])
    p = s.propose(x, y, y[:, 1] >= 0, choices, 0.0, seed=0)  # the 12th sample is new to the model
    assert calls == [3, 3] and p.fit_ok and p.kind == "log_cei" and p.index == 2
    assert s.fit(x, y, seed=0) and s.fitted_on == 12 and s.chunks == 1  # new data: the count restarts
    s.clear()
    assert not s.ready and s.propose(x, y, y[:, 1] >= 0, choices, 0.0, seed=0).fit_ok  # fits first
    assert len(calls) == 4


# ---- the state machine on hand-built observations -----------------------------------------------------
SM = BoConfig(
    resources=("core", "cache"),
    settle_s=1.0,
    max_settle_s=2.0,
    measure_s=1.0,
    apply_timeout_s=2.0,
    max_samples=2,
    max_samples_without_qos=3,
    probes=("fair", "be_minimum", "lc_max_each"),
    recheck_window_s=1.0,
    recheck_meet_frac=0.5,
    qos_z=0.5,
)


class Feed:
    """Hand-built observations of `caps`' apps at 0.5 s intervals."""

    def __init__(self, caps: Capabilities, achieved_mhz: float = 2200.0) -> None:
        self.caps, self.t = caps, 0.0
        self.lc = caps.lc_apps
        self.achieved_mhz = achieved_mhz  # what Usage reports (NaN: a node without a frequency sensor)

    def obs(
        self,
        alloc: Allocation,
        tard: float | dict = 0.5,
        be: float = 0.2,
        load: float = 0.3,
        served: float | dict = 1.0,
        memory_gb: float = 2.0,
        step: bool = True,
    ) -> Observation:
        if step:
            self.t += 0.5
        apps = []
        for a in self.lc:
            f = tard.get(a.name, 0.5) if isinstance(tard, dict) else tard
            rps = load * a.max_load_rps
            apps.append(
                AppSample(
                    a.name,
                    f * a.qos_target_us,
                    a.qos_target_us,
                    rps,
                    load,
                    (served.get(a.name, 1.0) if isinstance(served, dict) else served) * rps,
                    0.0,
                    1000,
                    Usage(0.5, 1.0, 0.1, memory_gb, 0.0, 0.1, self.achieved_mhz),
                )
            )
        bes = tuple(
            BeSample(b.name, be, Usage(1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2200.0)) for b in self.caps.be_apps
        )
        return Observation(self.t, 0.5, tuple(apps), bes, alloc, 10.0, 100.0)


def _ctrl(caps, cfg=SM, seed=0) -> BoController:
    c = BoController(cfg)
    c.reset(caps, np.random.default_rng(seed))
    return c


def _space(caps, cfg=SM) -> AllocationSpace:
    return AllocationSpace(caps, [Resource(r) for r in cfg.resources])


def test_one_sample_settles_then_measures_then_requests_the_next_probe(parties_caps):
    c, feed, space = _ctrl(parties_caps), Feed(parties_caps), _space(parties_caps)
    fair = fair_allocation(parties_caps)
    be_min = space.decode(space.probe("be_minimum"))
    # the node already runs fair, the first probe: nothing to apply, the interval counts as in force
    d = c.decide(feed.obs(fair, be=0.9))  # interval [0, 0.5)
    assert d.allocation is None and "probe:fair" in d.reason
    assert c.decide(feed.obs(fair, be=0.9)).allocation is None  # [0.5, 1.0): settling (settle_s = 1)
    d = c.decide(feed.obs(fair, tard={"memcached": 0.5}, be=0.2))  # [1.0, 1.5): measured
    assert d.allocation is None and "measuring" in d.reason and not c.samples
    d = c.decide(feed.obs(fair, tard={"memcached": 0.8}, be=0.4))  # [1.5, 2.0): measured, sample done
    (s,) = c.samples
    assert s.label == "probe:fair" and s.allocation == fair and s.meets_qos
    assert s.be_throughput == pytest.approx(0.3)  # the settling intervals (0.9) are not measured
    # headroom: the worst interval (memcached: p99 = 0.5, then 0.8 x target), as mean - 0.5 sd is higher
    assert s.headroom[0] == pytest.approx(math.log(1 / 0.8)) and s.headroom[1] == pytest.approx(math.log(2))
    assert d.allocation == be_min and "probe:be_minimum" in d.reason
    validate_allocation(d.allocation, parties_caps)


def test_headroom_discounts_the_spread_of_intervals(parties_caps):
    """Two intervals at 0.5 and 0.8 x target, both met: with qos_z = 1.645 the spread says that
    about 1 interval in 10 would miss, so the sample does not meet QoS."""
    fair = fair_allocation(parties_caps)
    for z, meets in ((0.5, True), (1.645, False)):
        c, feed = _ctrl(parties_caps, dataclasses.replace(SM, qos_z=z)), Feed(parties_caps)
        for tard in (0.5, 0.5, 0.5, 0.8):
            c.decide(feed.obs(fair, tard={"memcached": tard}))
        (s,) = c.samples
        r = np.log([2.0, 1.25])
        assert s.headroom[0] == pytest.approx(min(r.min(), r.mean() - z * r.std(ddof=1)))
        assert s.meets_qos is meets


def test_a_target_not_in_force_is_requested_again_then_measured_as_applied(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    fair = fair_allocation(parties_caps)
    target = [c.decide(feed.obs(fair)) for _ in range(4)][-1].allocation  # fair measured, next asked at 2.0
    assert target is not None and target != fair
    # a guard keeps the node at fair: the target is asked again until apply_timeout_s (2 s) has passed
    assert [c.decide(feed.obs(fair)).allocation for _ in range(3)] == [target] * 3
    assert c.decide(feed.obs(fair)).allocation is None  # t = 4.0: measure what is in force instead
    for _ in range(3):  # settle [3.5, 4.5), measure [4.5, 5.5)
        c.decide(feed.obs(fair))
    assert len(c.samples) == 2
    assert c.samples[-1].label == "probe:be_minimum (as applied)" and c.samples[-1].allocation == fair


def test_settling_waits_for_a_backlog_to_drain(parties_caps):
    fair = fair_allocation(parties_caps)

    def ticks_to_first_sample(served: list[float]) -> int:
        c, feed = _ctrl(parties_caps), Feed(parties_caps)
        n = 0
        while not c.samples:
            c.decide(feed.obs(fair, served=served[min(n, len(served) - 1)]))
            n += 1
        return n

    assert ticks_to_first_sample([1.0]) == 4  # settle 1 s, measure 1 s
    assert ticks_to_first_sample([1.05]) == 6  # still draining: settling runs to max_settle_s = 2 s
    assert ticks_to_first_sample([1.05, 1.05, 1.05, 1.0]) == 5  # drained at [1.5, 2.0)


@pytest.mark.parametrize(
    ("tard", "served", "settle_ticks"),
    [
        ({"xapian": 0.5}, {"memcached": 1.05}, 4),  # memcached drains, no one else misses: wait
        ({"xapian": 2.5}, {"memcached": 1.05}, 2),  # xapian at 2.5x, no backlog of its own: measure
        ({"xapian": 2.5}, {"memcached": 1.05, "xapian": 1.05}, 4),  # xapian drains too: wait
        ({"xapian": 1.5}, {"memcached": 1.05}, 4),  # 1.5x < exp(abort_settle_log) = 2x: wait
    ],
)
def test_settling_stops_waiting_for_a_backlog_when_another_app_misses_without_one(
    parties_caps, tard, served, settle_ticks
):
    """Settling is extended while an app drains a backlog, but not while another app's p99 is
    over exp(abort_settle_log) x its target and it serves no more than it is offered: waiting
    will not change its verdict. The sample replaced fair, whose samples are not QoS-meeting
    here, so the settling abort does not apply; measuring starts (and abort_on_miss ends it)."""
    cfg = dataclasses.replace(SM, abort_settle_log=math.log(2.0), abort_on_miss=False)
    fair = fair_allocation(parties_caps)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    n = 0
    while not c.samples:
        c.decide(feed.obs(fair, tard=tard, served=served))
        n += 1
    assert n == settle_ticks + 2  # then 1 s of measuring


def test_invalid_and_repeated_observations_are_not_measured(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    fair = fair_allocation(parties_caps)
    for _ in range(2):  # settling
        c.decide(feed.obs(fair))
    bad = feed.obs(fair, tard=2.0)  # violations in an interval whose memcached feed failed
    bad = dataclasses.replace(
        bad, apps=(dataclasses.replace(bad.apps[0], p99_us=math.nan, valid=False), *bad.apps[1:])
    )
    assert c.decide(bad).allocation is None
    c.decide(feed.obs(fair))  # measured
    assert c.decide(feed.obs(fair, step=False)).reason == "bo: interval already seen"
    assert not c.samples
    c.decide(feed.obs(fair))  # measured: the sample is complete
    (s,) = c.samples
    assert s.meets_qos  # the 2x-target interval was never measured


def _run_samples(c, feed, results, alloc_of=None):
    """Drive `c` through one sample per entry of `results` ((tardiness, BE) each), answering every
    request by putting the target in force. Returns the last decision."""
    current = fair_allocation(c.caps)
    d = None
    for tard, be in results:
        n = len(c.samples)
        while len(c.samples) == n:
            d = c.decide(feed.obs(current, tard=tard, be=be))
            if d.allocation is not None:
                current = d.allocation
    return d, current


def test_budget_spent_then_best_qos_meeting_sample_is_held(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    # fair misses QoS, be_minimum meets it: max_samples = 2 ends the search on be_minimum
    d, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    assert c.phase is Phase.HOLD and c.held is c.samples[1] and current == c.samples[1].allocation
    assert d.allocation is None and "holding best QoS-meeting sample 2" in d.reason  # already in force
    assert c.decide(feed.obs(current)).allocation is None
    # a guard (or an operator) moved the node away: the held allocation is asked for again
    assert c.decide(feed.obs(fair_allocation(parties_caps))).allocation == c.samples[1].allocation


def test_the_sample_that_first_met_qos_is_reported(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    d, _ = _run_samples(c, feed, [(1.5, 0.3)])
    assert c.first_qos_sample is None and "misses QoS" in d.reason
    d, current = _run_samples(c, feed, [(0.5, 0.05)])
    assert c.first_qos_sample == 2 and "meets QoS (the search's first)" in d.reason
    assert "QoS first met at sample 2" in c.decide(feed.obs(current)).reason  # holding
    for _ in range(4):  # a load shift: a new search, which has met nothing yet
        c.decide(feed.obs(current, load=0.6))
    assert c.searches == 2 and c.first_qos_sample is None and c.first_qos_samples == {0: 2}


def test_no_qos_keeps_searching_then_holds_the_closest(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    _run_samples(c, feed, [(3.0, 0.3)])
    assert c.phase is Phase.SEARCH  # max_samples = 1 reached, but nothing met QoS
    _run_samples(c, feed, [(1.2, 0.1), (2.0, 0.2)])
    assert c.phase is Phase.HOLD and c.held is c.samples[1]  # max_samples_without_qos = 3


def test_qos_lost_while_holding_falls_back_then_restarts(parties_caps):
    cfg = dataclasses.replace(SM, max_samples=3)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(0.5, 0.2), (0.5, 0.1), (1.5, 0.9)])
    assert c.held is c.samples[0]
    # recheck_window_s = 1, recheck_meet_frac = 0.5: two intervals where memcached misses under the
    # held fair; be_minimum gives memcached more, so it is the fallback
    miss = {"memcached": 1.3}
    c.decide(feed.obs(current, tard=miss))
    d = c.decide(feed.obs(current, tard=miss))
    assert c.samples[-1].label == "recheck:held" and not c.samples[-1].meets_qos
    assert c.held is c.samples[1] and d.allocation == c.samples[1].allocation and "falling back" in d.reason
    current = d.allocation
    c.decide(feed.obs(current, tard=miss))
    d = c.decide(feed.obs(current, tard=miss))
    # none left: the same search goes on (the model keeps its 5 measurements), with a fresh budget
    assert c.phase is Phase.SEARCH and c.searches == 1 and "searching on" in d.reason
    assert len(c.search_samples) == 5 and d.allocation not in {s.allocation for s in c.samples}


@pytest.mark.parametrize(("failing", "falls_back"), [("memcached", True), ("nginx", False)])
def test_a_fallback_must_give_the_app_that_failed_more(parties_caps, failing, falls_back):
    """Held fair fails its recheck on one app. be_minimum (memcached 5 cores / 7 ways, nginx 4 / 6
    as under fair) is a fallback when memcached failed; when nginx failed it would fail the same
    way (nginx's partition is fair's), so it no longer counts as QoS-meeting (choice 8)."""
    cfg = dataclasses.replace(SM, max_samples=3)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(0.5, 0.2), (0.5, 0.1), (1.5, 0.9)])
    fair, be_min = c.samples[0], c.samples[1]
    assert c.held is fair and be_min.meets_qos
    assert be_min.allocation["nginx"] == fair.allocation["nginx"]
    assert be_min.allocation["memcached"].cores > fair.allocation["memcached"].cores
    for _ in range(2):
        d = c.decide(feed.obs(current, tard={failing: 1.3}))
    assert c.samples[-1].label == "recheck:held"
    if falls_back:
        assert c.held is be_min and "falling back" in d.reason
    else:
        assert c.phase is Phase.SEARCH and "none left, searching on" in d.reason
        assert d.allocation not in {s.allocation for s in c.samples}  # a new sample, not be_minimum
        # every later sample, and what is held at the end, gives nginx more of something than the
        # fair allocation under which it failed: the others could never count (choice 8)
        recheck, current = len(c.samples), d.allocation
        for _ in range(60):
            d = c.decide(feed.obs(current, tard=0.5))
            current = d.allocation or current
            if c.phase is Phase.HOLD:
                break
        later = [s.allocation for s in c.samples[recheck:]]
        assert later and c.phase is Phase.HOLD
        was = fair.allocation["nginx"]
        for a in [*later, c.held.allocation]:
            assert a["nginx"].cores > was.cores or a["nginx"].llc_ways > was.llc_ways


@pytest.mark.parametrize(
    ("pressure_only", "used_frac", "ruled_out"),
    [(True, 0.2, True), (True, 1.0, False), (True, math.nan, False), (False, 0.2, False)],
)
def test_more_memory_counts_after_a_failed_recheck_only_where_the_app_used_its_limit(
    parties_caps, pressure_only, used_frac, ruled_out
):
    """Held fair fails its recheck on nginx, which used `used_frac` of its memory limit. An
    allocation that gives nginx fair's cores and ways and one more memory step is ruled out, as
    fair itself is, when more memory could not have helped: nginx used under
    env.moves.PRESSURE_FRAC of its limit (`storage_pressure_only`, choice 8). On settle-mix5 a
    search escaped the rule by offering Sphinx 1 GB more beside the cores under which it had failed.
    A node that reports no memory use (NaN) gives no evidence of slack: more memory still counts."""
    cfg = dataclasses.replace(
        SM, resources=("core", "cache", "mem"), max_samples=3, storage_pressure_only=pressure_only
    )
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    fair = fair_allocation(parties_caps)
    limit_gb = fair["nginx"].memory_gb
    current = fair
    for tard, be in [(0.5, 0.2), (0.5, 0.1), (1.5, 0.9)]:  # fair is held (as in the test above)
        n = len(c.samples)
        while len(c.samples) == n:
            d = c.decide(feed.obs(current, tard=tard, be=be, memory_gb=0.2 * limit_gb))
            current = d.allocation or current
    assert c.held is c.samples[0] and current == fair
    for _ in range(2):
        c.decide(feed.obs(current, tard={"nginx": 1.3}, memory_gb=used_frac * limit_gb))
    recheck = c.samples[-1]
    assert recheck.label == "recheck:held" and not recheck.meets_qos
    nginx = list(c.caps.lc_apps).index(next(a for a in c.caps.lc_apps if a.name == "nginx"))
    assert recheck.storage_use[nginx][0] == pytest.approx(used_frac, nan_ok=True)
    donor = next(a.name for a in c.caps.lc_apps if a.name != "nginx")
    step = parties_caps.step(Resource.MEM)
    more = fair.replace_app("nginx", memory_gb=limit_gb + step).replace_app(
        donor, memory_gb=fair[donor].memory_gb - step
    )
    validate_allocation(more, parties_caps)
    x = c._space.encode_allocation(more)[None, :]
    assert c._ruled_out_by_rechecks(x)[0] == ruled_out
    assert c._ruled_out_by_rechecks(c._space.encode_allocation(fair)[None, :])[0]  # fair itself: always


@pytest.mark.parametrize(("every", "fails"), [(5, False), (3, True)])
def test_a_held_allocation_fails_when_too_many_recent_intervals_miss(parties_caps, every, fails):
    """recheck_window_s = 5, recheck_meet_frac = 0.8: more than 1 s of misses in 5 s fails it."""
    cfg = dataclasses.replace(SM, recheck_window_s=5.0, recheck_meet_frac=0.8)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    held = c.held
    for k in range(1, 31):  # a miss every `every` intervals for 15 s
        c.decide(feed.obs(current, tard=1.2 if k % every == 0 else 0.5))
        if c.held is not held:
            break
    assert (c.samples[-1].label == "recheck:held") is fails
    assert (c.held is held) is not fails


@pytest.mark.parametrize(("over", "fails"), [(1, False), (3, True)])
def test_a_held_allocation_fails_when_its_recent_window_p99_misses(parties_caps, over, fails):
    """The window verdict while holding: recheck_window_s = 5 s is 10 intervals of 200 requests,
    of which 1% (20) may be over the target. `over` of each interval's 200 are (every interval's p99
    misses when over >= 2): 10 in the window hold, 30 fail it once the window is full, not before."""
    cfg = dataclasses.replace(SM, recheck_window_s=5.0, recheck_meet_frac=0.8)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    held, lost_at = c.held, None
    for k in range(1, 31):
        c.decide(_with_histograms(feed.obs(current), {"memcached": over}))
        if c.held is not held:
            lost_at = k
            break
    assert (c.samples[-1].label == "recheck:held") is fails
    assert lost_at == (10 if fails else None)


@pytest.mark.parametrize(("recheck_margin", "fails"), [(None, True), (0.05, False)])
def test_a_held_allocation_is_rechecked_against_its_own_margin(parties_caps, recheck_margin, fails):
    """A sample must show headroom >= qos_margin_log (0.1: p99 <= 0.905 x target); a held allocation
    fails its recheck below recheck_margin_log (0.05: p99 above 0.95 x target, PARTIES' upsize
    trigger), or below qos_margin_log when that is unset. Memcached's last 5 s of requests all at
    0.93 x its target: the referee would pass them, a recheck at the sample's margin fails them."""
    cfg = dataclasses.replace(SM, recheck_window_s=5.0, qos_margin_log=0.1, recheck_margin_log=recheck_margin)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    held, lost_at = c.held, None
    for k in range(1, 31):
        c.decide(_with_histograms(feed.obs(current), {}, at={"memcached": 0.93}))
        if c.held is not held:
            lost_at = k
            break
    assert lost_at == (10 if fails else None)  # the 5 s window is full after 10 intervals


def test_a_load_shift_restarts_the_search_from_the_previous_best(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    assert c.phase is Phase.HOLD
    best = c.held
    # a one-interval blip is not a shift (smoothed, and load_shift_intervals = 3)
    for load in (0.6, 0.3, 0.3):
        assert c.decide(feed.obs(current, load=load)).allocation is None
    assert c.searches == 1
    decisions = [c.decide(feed.obs(current, load=0.6)) for _ in range(3)]
    assert c.searches == 2 and c.phase is Phase.SEARCH and not c.search_samples
    d = decisions[-1]
    assert "load shift" in d.reason and "probe:previous-best" in d.reason
    assert d.allocation is None  # the previous best is already in force
    assert len(c.samples) == 2 and best is not None  # the history stays
    assert "settling probe:previous-best" in c.decide(feed.obs(best.allocation, load=0.6)).reason


def _with_histograms(
    obs: Observation, n_over: dict[str, int], n: int = 200, at: dict[str, float] | None = None
) -> Observation:
    """`obs` with each LC app's interval made of `n` requests at `at[app]` (default 0.5) x its
    target, `n_over[app]` of them at 1.5 x instead; its p99 is the interval's (the order statistic
    ceil(0.99 n))."""
    apps = []
    for a in obs.apps:
        k = n_over.get(a.name, 0)
        base = (at or {}).get(a.name, 0.5)
        values = np.r_[np.full(n - k, base * a.target_us), np.full(k, 1.5 * a.target_us)]
        p99 = float(np.sort(values)[math.ceil(0.99 * n) - 1])
        apps.append(
            dataclasses.replace(a, p99_us=p99, requests=n, histogram=LatencyHistogram.of_values_us(values))
        )
    return dataclasses.replace(obs, apps=tuple(apps))


@pytest.mark.parametrize(("verdict", "meets"), [("window", True), ("intervals", False)])
def test_a_sample_is_judged_by_the_p99_of_all_its_requests(parties_caps, verdict, meets):
    """CLITE Sec. 4 / PARTIES Sec. 5.1: memcached's second measured interval has 3 of its 200
    requests over the target (interval p99 1.5 x target), the window's 400 requests 3 (p99 0.5 x):
    the window verdict meets QoS, the interval verdict does not."""
    fair = fair_allocation(parties_caps)
    c = _ctrl(parties_caps, dataclasses.replace(SM, sample_verdict=verdict))
    feed = Feed(parties_caps)
    for over in (0, 0, 0, 3):
        c.decide(_with_histograms(feed.obs(fair), {"memcached": over}))
    (s,) = c.samples
    assert s.meets_qos is meets
    if verdict == "window":
        assert math.exp(-s.headroom[0]) == pytest.approx(0.5, rel=0.01)  # the window's p99 / target


@pytest.mark.parametrize(("over", "ticks"), [(5, 3), (4, 4)])
def test_a_window_sample_ends_once_its_misses_exceed_what_its_window_allows(parties_caps, over, ticks):
    """abort_on_miss with the window verdict: after one of the two measured intervals (200 of the
    400 requests the sample will see), 5 over the target already exceed the 1% allowed (4); 4 do
    not, and the sample runs on."""
    fair = fair_allocation(parties_caps)
    c, feed, n = _ctrl(parties_caps), Feed(parties_caps), 0
    while not c.samples:
        n += 1
        c.decide(_with_histograms(feed.obs(fair), {"memcached": over if n == 3 else 0}))
    assert n == ticks and c.samples[0].meets_qos is (over <= 4)


def test_a_sample_ends_at_its_first_missed_interval(parties_caps):
    """abort_on_miss: the verdict is known at the first measured miss; without it the sample runs
    its whole measure_s (SM: 1 s = 2 intervals)."""
    fair = fair_allocation(parties_caps)
    for abort, ticks in ((True, 3), (False, 4)):
        c, feed = _ctrl(parties_caps, dataclasses.replace(SM, abort_on_miss=abort)), Feed(parties_caps)
        n = 0
        while not c.samples:
            c.decide(feed.obs(fair, tard={"memcached": 1.4}))
            n += 1
        assert n == ticks and not c.samples[0].meets_qos


def test_the_safe_search_stops_when_no_candidate_is_safe(parties_caps):
    """Once QoS is met, a candidate must be at least safe_pof likely to meet every target: with a
    model that has seen one QoS-meeting sample (fair) and one miss, none is, and the search holds
    fair; without the filter (safe_pof = 0) it goes on."""
    cfg = dataclasses.replace(
        SM,
        max_samples=10,
        max_samples_without_qos=10,
        safe_pof=0.99,
        trust_init=0.1,
        probes=("fair", "be_minimum"),
    )
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    d, _ = _run_samples(c, feed, [(0.9, 0.2), (1.3, 0.3)])
    assert c.phase is Phase.HOLD and c.held is c.samples[0]
    assert "no candidate with P(QoS) >= 0.99" in d.reason
    c, feed = _ctrl(parties_caps, dataclasses.replace(cfg, safe_pof=0.0)), Feed(parties_caps)
    d, _ = _run_samples(c, feed, [(0.9, 0.2), (1.3, 0.3)])
    assert c.phase is Phase.SEARCH and "next bo:log_cei" in d.reason


@pytest.mark.parametrize("achieved_mhz", [2200.0, math.nan])
def test_capacity_floors_drop_candidates_whose_cores_cannot_do_the_work(parties_caps, achieved_mhz):
    """Choice 14: every LC app's cores busy half the time at fair (Feed: cpu_util 0.5 at 2.2
    GHz, served = offered), so its CPU time per request is 0.5 x its fair cores / its offered rps,
    the least over the probes (be_minimum's larger shares, busy half the time too, cost more per
    request). A candidate is kept exactly when every app's cores are at least that time x its
    offered load, scaled by 2.2 GHz / the candidate's frequency where that is below 1; and
    nothing is dropped with the rule off or before a sample has been measured. A node without a
    frequency sensor (NaN) is read at the frequency set, fair's 2.2 GHz: the same floors."""
    cfg = dataclasses.replace(
        SM,
        resources=("core", "cache", "freq"),
        core_floor_util=1.0,
        max_samples=10,
        max_samples_without_qos=10,
    )
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps, achieved_mhz)
    space = _space(parties_caps, cfg)
    cands = space.random(400, np.random.default_rng(0))
    assert c._within_capacity(cands).all()  # nothing measured yet
    fair = fair_allocation(parties_caps)
    _run_samples(c, feed, [(0.5, 0.2), (0.5, 0.0)])
    assert len(c.samples) == 2
    j = space.pooled.index(Resource.CORE)
    mhz = np.asarray(space.levels_mhz, dtype=float)
    want = np.ones(len(cands), dtype=bool)
    for p, name in enumerate(space.lc):
        demand_core_s = 0.5 * fair[name].cores  # per second at 2.2 GHz: busy cores at fair
        scale = np.minimum(1.0, 2200.0 / mhz[cands.levels[:, p]])
        want &= cands.units[:, p, j] * space.step[j] >= demand_core_s * scale - 1e-9
    got = c._within_capacity(cands)
    assert 0 < got.sum() < len(cands)  # the rule binds on some candidates, not all
    assert np.array_equal(got, want)
    off = _ctrl(parties_caps, dataclasses.replace(cfg, core_floor_util=0.0))
    _run_samples(off, Feed(parties_caps), [(0.5, 0.2), (0.5, 0.0)])
    assert off._within_capacity(cands).all()


@pytest.mark.parametrize("seed", [10, 14])
def test_capacity_floors_keep_the_search_off_an_apps_cliff(seed):
    """mix3-const (memcached, xapian, NGINX at 20%), the seeds where the safe search, its GP
    confident (P(QoS) 1.00), gave NGINX 1 core while its 2 cores were busy ~1.9, twice, and the
    minute the referee judges missed (window p99 23x and 17x the target; as `evaluate.py compare`
    runs seed k). With capacity floors (configs/agents/bo.yaml) no sample gives NGINX fewer than 2
    cores and the window is met."""
    from env.loop import run_episode
    from env.metrics import window_tail
    from env.sim.scenario import load_scenario

    scn = load_scenario(CONFIGS / "scenarios" / "mix3-const.yaml")
    on = load_bo_config()
    assert on.core_floor_util == 1.0
    outcome = {}
    for name, cfg in (("on", on), ("off", dataclasses.replace(on, core_floor_util=0.0))):
        ctrl = BoController(cfg)
        records = run_episode(
            SimNode(scn, seed=seed), ctrl, scn.duration_s, rng=np.random.default_rng([seed, 1])
        )
        nginx_cores = min(s.allocation["nginx"].cores for s in ctrl.samples)
        outcome[name] = (nginx_cores, window_tail(records).sustained)
    assert outcome == {"on": (2.0, True), "off": (1.0, False)}, outcome


def test_repair_candidates_give_the_failing_app_more(parties_caps):
    """Before QoS is met, the trust region around the closest sample holds only moves that give
    every app that missed its target at least as much of everything and more of something."""
    cfg = dataclasses.replace(SM, trust_init=0.1, max_samples_without_qos=10)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _run_samples(c, feed, [({"xapian": 1.3}, 0.2), ({"xapian": 1.5}, 0.1)])
    best = c.best
    assert best is not None and best.index == 1  # fair: xapian missed, by less
    space = _space(parties_caps, cfg)
    cands = c._candidates()
    assert len(cands) > 0
    xi = [a.name for a in parties_caps.lc_apps].index("xapian")
    u0 = space.point_of(best.allocation).units[0, xi]
    assert (cands.units[:, xi, :] >= u0).all() and (cands.units[:, xi, :] > u0).any(axis=1).all()


@pytest.mark.parametrize(
    ("centres", "fair_exhausted", "next_region"), [(1, False, False), (2, False, True), (2, True, False)]
)
def test_a_trust_region_wholly_ruled_out_moves_to_the_next_ranked_sample(
    parties_caps, monkeypatch, centres, fair_exhausted, next_region
):
    """When every candidate around the best sample is ruled out (failed rechecks, capacity floors),
    the region around the next ranked sample is tried (`local_centres`) before random points from the
    whole space: on settle-mix5 a search whose region was all ruled out inside the judged window
    sampled NGINX on 1 core and 1 way (10x its target). A region with no move left at all (the
    repair has given the failing apps everything) still goes to the whole space."""
    cfg = dataclasses.replace(SM, trust_init=0.1, max_samples_without_qos=10, local_centres=centres)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    _run_samples(c, feed, [({"xapian": 1.3}, 0.2), ({"xapian": 1.5}, 0.1)])
    fair, be_min = c.samples
    assert c.best is fair  # closest to QoS; be_minimum is ranked second
    tried: list[int] = []  # the centres whose regions were built, in order
    fresh = {"fair": False}  # fair's region was just built: the next `_allowed` call filters it
    local, allowed = c._local_candidates, c._allowed

    def recording_local(s, qos_met):
        tried.append(s.index)
        if s is fair and fair_exhausted:
            return None
        fresh["fair"] = s is fair
        return local(s, qos_met)

    def none_around_fair(cands):  # everything in fair's region is ruled out (not the random points)
        if fresh.pop("fair", False):
            return cands.take(np.array([], dtype=int))
        return allowed(cands)

    monkeypatch.setattr(c, "_local_candidates", recording_local)
    monkeypatch.setattr(c, "_allowed", none_around_fair)
    cands = c._candidates()
    assert len(cands) > 0
    space = _space(parties_caps, cfg)
    xi = [a.name for a in parties_caps.lc_apps].index("xapian")
    u0 = space.point_of(be_min.allocation).units[0, xi]
    in_be_min_region = (cands.units[:, xi, :] >= u0).all(axis=1) & (cands.units[:, xi, :] > u0).any(axis=1)
    if next_region:  # the repair region around be_minimum, the next ranked sample
        assert tried == [fair.index, be_min.index] and in_be_min_region.all()
    else:  # random points from the whole space
        assert tried == [fair.index] and not in_be_min_region.all()


@pytest.mark.parametrize("closest_by", ["model", "measured"])
def test_the_closest_sample_and_its_failing_apps_follow_closest_by(parties_caps, monkeypatch, closest_by):
    """Before QoS is met, the sample closest to it (the repair region's centre) and the apps to
    repair are the model's with `closest_by: model`: here the measurements say fair missed by
    xapian alone and by less, the GP's posterior mean says fair's memcached is far off too, and
    be_minimum is the closer one, missing by nginx only."""
    cfg = dataclasses.replace(SM, trust_init=0.1, max_samples_without_qos=10, closest_by=closest_by)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    means = np.array(
        [  # objective, memcached, xapian, nginx (the caps' LC order)
            [0.2, -1.0, -0.1, 0.5],  # fair
            [0.1, 0.5, 0.5, -0.05],  # be_minimum
        ]
    )
    calls: list[int] = []

    def predict(train_x, train_y, x, inputs=None):
        calls.append(len(x))
        return means[: len(x)]

    monkeypatch.setattr(c._model, "predict", predict)
    _run_samples(c, feed, [({"xapian": 1.3}, 0.2), ({"nginx": 1.5}, 0.1)])
    best = c.best
    assert best is not None and best.index == (2 if closest_by == "model" else 1)
    repaired = "nginx" if closest_by == "model" else "xapian"
    space = _space(parties_caps, cfg)
    cands = c._candidates()
    assert len(cands) > 0
    # the posterior at both samples, once: asked for by `best`, then reused by the candidates
    assert (calls == [2]) is (closest_by == "model")
    i = [a.name for a in parties_caps.lc_apps].index(repaired)
    u0 = space.point_of(best.allocation).units[0, i]
    assert (cands.units[:, i, :] >= u0).all() and (cands.units[:, i, :] > u0).any(axis=1).all()


@pytest.mark.parametrize("repair_measured", [True, False])
def test_the_repair_gives_more_to_an_app_that_missed_at_its_centre_whatever_the_model_says(
    parties_caps, monkeypatch, repair_measured
):
    """With `repair_measured`, an app that missed in a measurement of the repair region's centre is
    repaired even where the GP's smoothed headroom says it meets its target: here fair, measured
    with xapian at 1.3x its target, is the closest sample by the model, which shows no app missing
    there; without the rule the region holds moves that give xapian less (on settle-mix5 such a
    region took memcached to 1 core and 1 way inside the judged window)."""
    cfg = dataclasses.replace(
        SM, trust_init=0.1, max_samples_without_qos=10, closest_by="model", repair_measured=repair_measured
    )
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    means = np.array(
        [  # objective, memcached, xapian, nginx (the caps' LC order)
            [0.2, 0.5, 0.5, 0.5],  # fair: smoothed, every app meets its target
            [0.1, 0.5, 0.5, -0.05],  # be_minimum
        ]
    )
    monkeypatch.setattr(c._model, "predict", lambda train_x, train_y, x, inputs=None: means[: len(x)])
    _run_samples(c, feed, [({"xapian": 1.3}, 0.2), ({"nginx": 1.5}, 0.1)])
    best = c.best
    assert best is not None and best.index == 1 and not best.meets_qos
    xi = [a.name for a in parties_caps.lc_apps].index("xapian")
    assert c._failing_apps(best) == ([xi] if repair_measured else [])
    cands = c._candidates()
    assert len(cands) > 0
    u0 = _space(parties_caps, cfg).point_of(best.allocation).units[0, xi]
    more = (cands.units[:, xi, :] >= u0).all(axis=1) & (cands.units[:, xi, :] > u0).any(axis=1)
    assert more.all() if repair_measured else not more.all()


def test_the_posterior_mean_pools_repeated_noisy_measurements():
    """`Surrogate.predict`: at a point measured four times (headroom -0.9, +0.3, -0.6, +0.2) the
    posterior mean lies near their average, far from the luckiest one; far from every sample it
    returns to the outputs' mean."""
    x = np.array([[0.2, 0.2]] * 4 + [[0.8, 0.8], [0.85, 0.8]])
    y = np.array([[0.1, -0.9], [0.1, 0.3], [0.1, -0.6], [0.1, 0.2], [0.5, 0.6], [0.5, 0.55]])
    s = Surrogate(attempts=1)
    assert s.predict(x, y, x[:1]) is None  # nothing fitted yet
    assert s.fit(x, y, seed=0)
    mean = s.predict(x, y, np.array([[0.2, 0.2], [0.8, 0.8]]))
    assert mean is not None and mean.shape == (2, 2)
    assert -0.5 < mean[0, 1] < 0.0  # the four measurements' average is -0.25
    assert mean[1, 1] > 0.4


def test_network_limits_follow_use_outside_the_search(parties_caps):
    """network: follow applies PARTIES' network rule every interval (env.moves.adjust_network):
    an app using far less than its limit gives bandwidth back, and a held allocation still counts
    as in force although its network limits moved."""
    c, feed = _ctrl(parties_caps, dataclasses.replace(SM, network="follow")), Feed(parties_caps)
    fair = fair_allocation(parties_caps)
    d = c.decide(feed.obs(fair))  # Feed's apps use 0.1 Gbps each
    assert d.allocation is not None and d.allocation["memcached"].net_gbps < fair["memcached"].net_gbps
    assert BoController._same(d.allocation, fair)  # nothing searched changed: still probe:fair
    current = d.allocation
    while not c.samples:
        d = c.decide(feed.obs(current))
        current = d.allocation or current
    assert c.samples[0].label == "probe:fair"  # measured although the limits kept moving


def test_run_stats_report_samples_to_qos_per_search(parties_caps):
    c, feed = _ctrl(parties_caps), Feed(parties_caps)
    _, current = _run_samples(c, feed, [(1.5, 0.3), (0.5, 0.05)])
    for _ in range(4):  # held: four intervals, all met
        c.decide(feed.obs(current))
    stats = c.run_stats()
    assert stats["samples_to_qos"] == 2 and stats["samples_to_kept_qos"] == 2
    (first,) = stats["searches"]
    assert first["samples"] == 2 and first["first_qos_sample"] == 2
    assert first["met_after_first_qos"] == 1.0


# ---- goals on the simulator -----------------------------------------------------------------------------
def _run_bo(scn, seed: int = 0) -> tuple[BoController, list[Observation]]:
    node = SimNode(scn, seed=seed)
    ctrl = BoController()  # configs/agents/bo.yaml
    ctrl.reset(node.capabilities(), np.random.default_rng(seed))
    obs, seen = node.observe(), []
    while node.time_s < scn.duration_s - 1e-9:
        obs = node.step(ctrl.decide(obs).allocation)
        seen.append(obs)
    return ctrl, seen


def test_meets_qos_within_a_few_samples_and_keeps_it_on_a_constant_3_app_mix():
    """PARTIES' strictest 3-app mix at 20% each (mix3-const, 90 s), seeds 0-3: the first sample
    that meets every target comes within 5 (CLITE's claim is 30); the run meets the referee's
    window verdict (every app's p99 over the minute after the 30 s warm-up, PARTIES Sec. 5.1) in
    every seed although the search goes on inside it (3 of 4 when the test was written: seed 0's
    exploration overloaded an app in the minute); and in 3 of them the BE job gets more than the equal
    split's 0.14 (the search improved on it; seed 3's stops on the equal split after 3 samples, the
    expected improvement having dropped: CLITE's termination). Without the safe search (its trust region and P(QoS) filter) the
    exploration missed in 16-36% of the intervals after the first QoS-meeting sample (seeds 0-2)."""
    from env.loop import run_episode
    from env.metrics import window_tail

    sustained, improved = [], []
    for seed in range(4):
        scn = simple_scenario({"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}, duration_s=90, seed=seed)
        ctrl = BoController()  # configs/agents/bo.yaml
        records = run_episode(SimNode(scn, seed=seed), ctrl, scn.duration_s, rng=np.random.default_rng(seed))
        stats = ctrl.run_stats()
        assert stats["samples_to_qos"] is not None and stats["samples_to_qos"] <= 5, stats
        improved.append(np.mean([r.be_throughput for r in records[-20:]]) > 0.2)
        wt = window_tail(records)
        assert wt.complete
        sustained.append(wt.sustained)
    assert all(sustained) and sum(improved) >= 3, (sustained, improved)


def test_a_load_step_restarts_the_search_from_what_the_model_knows():
    """memcached 20% -> 50% at 30 s: the load shift starts a second search within a few seconds;
    it samples the previous best first, keeps the first search's samples in the model (their
    loads are inputs), and meets QoS again within 10 samples."""
    scn = simple_scenario(
        {"memcached": {"kind": "step", "steps": [[0, 0.2], [30, 0.5]]}, "nginx": 0.2, "xapian": 0.1},
        duration_s=75,
        seed=0,
    )
    ctrl, _ = _run_bo(scn)
    stats = ctrl.run_stats()
    assert ctrl.searches == 2, stats
    second = stats["searches"][1]
    assert 30 < second["start_s"] < 36
    assert next(s.label for s in ctrl.samples if s.search == 1) == "probe:previous-best"
    assert len(ctrl._training_samples()) > len(ctrl.search_samples)  # the first search's samples stay
    assert second["first_qos_sample"] is not None and second["first_qos_sample"] <= 10, stats


def test_memory_floors_follow_resident_memory(parties_caps):
    cfg = dataclasses.replace(SM, resources=("core", "mem"), max_samples=3)
    c, feed = _ctrl(parties_caps, cfg), Feed(parties_caps)
    fair = fair_allocation(parties_caps)
    current = fair
    while len(c.samples) < 2:  # fair, then be_minimum, with every LC app's resident set at 20 GB
        d = c.decide(feed.obs(current, memory_gb=20.0))
        current = d.allocation or current
    lc = [a.name for a in parties_caps.lc_apps]
    for a in (c.samples[1].allocation, current):  # be_minimum, then lc_max_each for memcached
        assert all(a[n].memory_gb >= 22.0 for n in lc)
    assert current["xapian"].memory_gb == current["nginx"].memory_gb == 22.0  # the floor binds


# ---- a small node with a known optimum ----------------------------------------------------------------
def _small_platform(tmp: Path) -> str:
    """The PARTIES platform cut down to 6 cores and 8 LLC ways (4 CLOS)."""
    data = yaml.safe_load((CONFIGS / "node" / "parties.yaml").read_text())
    data.update(name="small", cores=6)
    data["llc"].update(ways=8, clos=4)
    path = tmp / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _fixed(alloc: Allocation):
    return lambda _caps: alloc


def _truth(scn, space: AllocationSpace, pts: Candidates, margin_log: float) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive analytic evaluation of every point: P(an interval meets every target), 0 where an
    app's p99 is not within BO's own margin (`qos_margin_log`: p99 <= e^-margin x target, the
    criterion its samples are judged by), and the BE throughput (normalised as SimNode reports it)."""
    setups = [Setup(scn, _fixed(space.decode(pts, i))) for i in range(len(pts))]
    out, rps, lc = analytic_outputs(setups, np.array([float(scn.apps[0].load)]))
    out, rps, lc = out[:, 0], rps[:, 0], lc[:, 0]
    dt = load_platform(scn.platform).interval_s
    p_all = np.where(lc, meet_probability(out[..., M.O_TAIL_T], rps * dt), 1.0).prod(axis=-1)
    lay = build_layout(scn)
    target_s = np.array([lay.lc_profile(w).qos_target_us / 1e6 for w in lay.lc])
    within = (out[:, list(lay.lc), M.O_P99] <= math.exp(-margin_log) * target_s).all(axis=-1)
    p_all = np.where(within, p_all, 0.0)
    be = np.zeros(len(pts))
    for idx in lay.be.values():
        be += out[:, list(idx), M.O_PROG].sum(axis=-1) / be_alone_progress(
            lay.components[idx[0]].profile, scn.platform
        )
    return p_all, be


SUSTAINED = 0.95  # DESIGN §5: an allocation is QoS-meeting when >= 95% of intervals meet every target
TOLERANCE = 0.05  # BE throughput within 5% of the optimum's


def test_finds_the_exhaustively_known_optimum_of_a_small_node(tmp_path):
    """2 LC apps + the BE job on 6 cores / 8 ways; cores and ways searched (315 allocations). The
    instance is the first load pair at which the optimum is neither fair nor trivial, so the test
    follows the simulator's calibration."""
    plat = _small_platform(tmp_path)
    for loads in (
        {"memcached": 0.2, "nginx": 0.2},
        {"memcached": 0.3, "nginx": 0.2},
        {"memcached": 0.15, "nginx": 0.15},
    ):
        scn = simple_scenario(loads, platform=plat, duration_s=3600, seed=0)
        caps = SimNode(scn, seed=0).capabilities()
        cfg = dataclasses.replace(
            load_bo_config(),
            resources=("core", "cache"),
            max_samples=20,
            max_samples_without_qos=20,
            random_candidates=512,
        )
        space = _space(caps, cfg)
        pts = space.enumerate_all()
        p, be = _truth(scn, space, pts, cfg.qos_margin_log)
        ok = p >= SUSTAINED
        fair_i = int(
            np.nonzero((pts.keys() == space.point_of(fair_allocation(caps)).keys()).all(axis=1))[0][0]
        )
        if ok.any() and ok.mean() < 0.9 and be[ok].max() > be[fair_i] + 0.05:
            break
    else:
        pytest.fail("no informative small-node instance at these loads: re-tune the test to the calibration")
    assert len(pts) == 315
    optimum = be[ok].max()
    index = {tuple(k): i for i, k in enumerate(pts.keys())}

    node = SimNode(scn, seed=0)
    ctrl = BoController(cfg)
    ctrl.reset(caps, np.random.default_rng(0))
    obs = node.observe()
    while ctrl.phase is Phase.SEARCH and node.time_s < 1000:
        obs = node.step(ctrl.decide(obs).allocation)
    assert ctrl.phase is Phase.HOLD and len(ctrl.samples) <= cfg.max_samples  # or stopped early (EI, safety)
    truth = [index[tuple(space.point_of(s.allocation).keys()[0])] for s in ctrl.samples]
    good = [n for n, i in enumerate(truth, 1) if ok[i] and be[i] >= (1 - TOLERANCE) * optimum]
    assert good, (
        f"no sample within {TOLERANCE:.0%} of the optimum BE {optimum:.3f} in {cfg.max_samples} samples"
    )
    # what it holds at the end meets QoS and is within the tolerance of the optimum
    held = index[tuple(space.point_of(ctrl.held.allocation).keys()[0])]
    assert ok[held] and be[held] >= (1 - TOLERANCE) * optimum
    for _ in range(20):
        obs = node.step(ctrl.decide(obs).allocation)
        assert BoController._same(obs.allocation, ctrl.held.allocation)  # network limits follow use


# ---- the controller contract --------------------------------------------------------------------------
# the GP must keep proposing for these mechanics tests: no safety stop, no EI stop
FAST = dataclasses.replace(
    load_bo_config(), settle_s=0.5, measure_s=1.0, random_candidates=256, safe_pof=0.0, stop_ei_rel=0.0
)


def _drive(seed: int, ticks: int, loads: dict[str, float]) -> tuple[SimNode, BoController, list[Decision]]:
    scn = simple_scenario(loads, duration_s=600, seed=seed)
    node = SimNode(scn, seed=seed)
    caps = node.capabilities()
    ctrl = BoController(FAST)
    ctrl.reset(caps, np.random.default_rng(seed))
    out = []
    obs = node.observe()
    for _ in range(ticks):
        with no_io():
            d = ctrl.decide(obs)
        assert isinstance(d, Decision) and isinstance(d.reason, str) and d.reason
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
        out.append(d)
        obs = node.step(d.allocation)
    return node, ctrl, out


def test_contract_valid_pure_decisions_and_deterministic_for_a_seed():
    loads = {"memcached": 0.6, "xapian": 0.4, "nginx": 0.5}
    _, ctrl, a = _drive(3, 30, loads)
    assert len(ctrl.samples) >= 6 and any(s.label.startswith("bo:") for s in ctrl.samples)  # the GP ran
    _, _, b = _drive(3, 30, loads)
    assert [(d.allocation, d.reason) for d in a] == [(d.allocation, d.reason) for d in b]


def test_the_gp_is_fitted_on_idle_ticks_in_bounded_chunks(monkeypatch):
    """After each new sample at most `fit_ticks` chunks of `fit_maxiter` iterations, each on a tick
    that only applies, settles or measures; a tick that ends a sample fits nothing (the GP is fitted
    by then), but the first proposal's (one chunk: no hyperparameters before two samples)."""
    bo_model.warm_up()  # once per process, from reset: not a decide() call
    calls = _count_fits(monkeypatch)
    node = SimNode(
        simple_scenario({"memcached": 0.6, "xapian": 0.4, "nginx": 0.5}, duration_s=600, seed=3), seed=3
    )
    ctrl = BoController(FAST)
    ctrl.reset(node.capabilities(), np.random.default_rng(3))
    obs, ticks = node.observe(), []  # (reason, fits in the tick)
    for _ in range(40):
        n = len(calls)
        d = ctrl.decide(obs)
        ticks.append((d.reason, len(calls) - n))
        obs = node.step(d.allocation)
    assert any(s.label.startswith("bo:") for s in ctrl.samples)  # the GP chose samples
    assert set(calls) == {FAST.fit_maxiter}
    ends = [i for i, (reason, _) in enumerate(ticks) if reason.startswith("bo: sample")]
    # the tick that ends the second probe makes the first proposal, with no hyperparameters yet:
    # one chunk; every later sample's end fits nothing
    assert len(ends) >= 6 and ticks[ends[1]][1] <= 1 and all(ticks[i][1] == 0 for i in ends[2:])
    assert all(k <= 1 for _, k in ticks)
    chunks = [sum(k for _, k in ticks[a + 1 : b]) for a, b in itertools.pairwise(ends)]
    assert max(chunks) <= FAST.fit_ticks and sum(chunks) > 0


def test_no_decide_call_imports_a_module():
    """The GP code imports modules lazily on its first fit (file reads); `reset` runs it first."""
    code = (
        "import sys, numpy as np\n"
        "from agents.bo import BoController\n"
        "from tests.agents.test_bo import FAST\n"
        "from env.sim.node import SimNode\n"
        "from env.sim.scenario import simple_scenario\n"
        "node = SimNode(simple_scenario({'memcached': 0.6, 'xapian': 0.4, 'nginx': 0.5}, duration_s=60, seed=0))\n"
        "c = BoController(FAST)\n"
        "c.reset(node.capabilities(), np.random.default_rng(0))\n"
        "obs, new = node.observe(), set()\n"
        "for _ in range(30):\n"
        "    before = set(sys.modules)\n"
        "    d = c.decide(obs)\n"
        "    new |= set(sys.modules) - before\n"
        "    obs = node.step(d.allocation)\n"
        "assert any(s.label.startswith('bo:') for s in c.samples), 'the GP never ran'\n"
        "print(sorted(new))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
