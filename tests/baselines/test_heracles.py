"""Heracles' state machine (Sec. 4.5, Alg. 1-4) on hand-built observations.

A `Drive` feeds the controller one 500 ms observation per tick, built from a real SimNode
observation (memcached + xapian + nginx + the BE job) with the LC job's latency, load, bandwidth,
frequency and the node's DRAM bandwidth and power replaced; the allocation of each observation is
the one the previous decision asked for, as if the node applied it. Heracles' LC job is memcached
(the strictest target, PARTIES Sec. 5.2.2); xapian and nginx are treated as BE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from baselines.heracles import (
    BE_CLOS,
    BE_GROUP,
    GROW_CORES,
    GROW_LLC,
    LC_CLOS,
    LC_GROUP,
    PAUSED_GROUP,
    HeraclesConfig,
    HeraclesController,
    load_heracles_config,
)
from env.config import ConfigError, build
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Allocation, Observation, validate_allocation

LC, BE = "memcached", "be_parties"
LC_AS_BE = ("xapian", "nginx")


@pytest.fixture(scope="module")
def base():
    node = SimNode(simple_scenario({"memcached": 0.3, "xapian": 0.2, "nginx": 0.2}), seed=0)
    return node.observe(), node.capabilities()


def hobs(
    base_obs: Observation,
    t: float,
    alloc: Allocation,
    *,
    slack: float = 0.5,
    load: float = 0.5,
    mem_bw: float = 10.0,
    lc_bw: float = 1.0,
    power: float = 100.0,
    lc_freq: float = 3000.0,
    lc_net: float = 1.5,
    be_tput: float = 0.3,
) -> Observation:
    apps = []
    for s in base_obs.apps:
        if s.name == LC:
            u = dataclasses.replace(s.usage, mem_bw_gbps=lc_bw, freq_mhz=lc_freq, net_gbps=lc_net)
            s = dataclasses.replace(
                s, p99_us=s.target_us * (1 - slack), load_frac=load, requests=1000, usage=u
            )
        apps.append(s)
    be = tuple(dataclasses.replace(b, throughput=be_tput) for b in base_obs.be)
    return dataclasses.replace(
        base_obs, time_s=t, apps=tuple(apps), be=be, allocation=alloc, mem_bw_gbps=mem_bw, power_w=power
    )


class Drive:
    """Ticks of 500 ms; keyword values may be callables of the allocation in force."""

    def __init__(self, ctrl: HeraclesController, base_obs: Observation) -> None:
        self.ctrl, self.base, self.alloc, self.t = ctrl, base_obs, base_obs.allocation, 0.0
        self.reasons: list[tuple[float, str]] = []

    def tick(self, **kw: Any) -> Allocation:
        self.t += 0.5
        vals = {k: (v(self.alloc) if isinstance(v, Callable) else v) for k, v in kw.items()}
        d = self.ctrl.decide(hobs(self.base, self.t, self.alloc, **vals))
        if d.allocation is not None:
            validate_allocation(d.allocation, self.ctrl.caps)
            self.alloc = d.allocation
        self.reasons.append((self.t, d.reason))
        return self.alloc

    def until(self, t_end: float, **kw: Any) -> Allocation:
        while self.t < t_end - 1e-9:
            self.tick(**kw)
        return self.alloc


def make(caps, **kw) -> HeraclesController:
    ctrl = HeraclesController(HeraclesConfig(), **kw)
    ctrl.reset(caps, np.random.default_rng(0))
    return ctrl


def be_cores(alloc: Allocation) -> float:
    return alloc[BE].cores


# ---- configuration and roles ------------------------------------------------------------------------
def test_yaml_config_is_the_papers_constants_and_strict():
    cfg = load_heracles_config()
    assert cfg == HeraclesConfig()
    assert (cfg.top_poll_s, cfg.disable_be_load_above, cfg.enable_be_load_below, cfg.cooldown_s) == (
        15,
        0.85,
        0.8,
        300,
    )
    with pytest.raises(ConfigError, match="unknown key"):
        build(HeraclesConfig, {"poll_s": 15}, "heracles.yaml")
    with pytest.raises(ConfigError, match="hysteresis"):
        build(HeraclesConfig, {"enable_be_load_below": 0.9}, "heracles.yaml")


def test_start_gives_be_one_core_and_10pct_llc_in_exclusive_partitions(base):
    obs, caps = base
    ctrl = make(caps)
    assert ctrl.lc == LC and ctrl.lc_as_be == LC_AS_BE and ctrl.be == (BE,)
    a = Drive(ctrl, obs).tick()
    lc = a[LC]
    assert (lc.cores, lc.core_group, lc.llc_ways, lc.clos) == (
        caps.cores - 1,
        LC_GROUP,
        caps.llc_ways - 2,
        LC_CLOS,
    )
    assert lc.freq_mhz == caps.freq_levels_mhz[-1] and lc.net_gbps == caps.net_gbps  # LC: no caps
    for name in (*LC_AS_BE, BE):  # one cpuset and one CLOS for everything that is not the LC job
        x = a[name]
        assert (x.cores, x.core_group, x.llc_ways, x.clos) == (1.0, BE_GROUP, 2, BE_CLOS)
    # memory capacity and disk bandwidth are not partitioned by Heracles
    assert {(x.memory_gb, x.disk_mbps) for x in a} == {(caps.memory_gb, caps.disk_mbps)}
    assert ctrl.phase == GROW_LLC and not ctrl.growth_allowed


# ---- Alg. 1: top-level controller -------------------------------------------------------------------
def test_disables_be_when_load_passes_85pct_and_reenables_under_80pct(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    a = drv.until(15.0, load=0.9)
    assert ctrl.enabled and be_cores(a) == 1  # the 15 s window has not been judged yet
    a = drv.tick(load=0.9)  # t = 15.5: first top-level poll
    assert not ctrl.enabled
    assert (a[BE].cores, a[BE].core_group) == (0.0, PAUSED_GROUP)  # the BE job is paused
    assert {a[n].cores for n in LC_AS_BE} == {caps.core_step}  # LC-as-BE: the smallest BE cpuset
    assert a[LC].cores == caps.cores - caps.core_step and a[LC].llc_ways == caps.llc_ways - caps.min_llc_ways
    a = drv.until(30.5, load=0.82)  # between the thresholds: hysteresis keeps BE disabled
    assert not ctrl.enabled and be_cores(a) == 0
    a = drv.until(45.5, load=0.78)
    assert ctrl.enabled
    assert (a[BE].cores, a[BE].core_group, a[BE].llc_ways) == (1.0, BE_GROUP, 2)


def test_negative_slack_disables_be_for_a_5_minute_cooldown(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    drv.until(15.5, slack=-0.2, load=0.3)
    assert not ctrl.enabled
    drv.until(315.0, slack=0.5, load=0.3)  # QoS met and low load, but the cooldown runs
    assert not ctrl.enabled and be_cores(drv.alloc) == 0
    a = drv.tick(slack=0.5, load=0.3)  # t = 315.5: the first poll at the end of the cooldown
    assert ctrl.enabled and be_cores(a) == 1


def test_single_lc_app_disabling_be_gives_the_lc_job_every_core(base):
    _, caps = base
    node = SimNode(simple_scenario({"memcached": 0.3}), seed=0)
    ctrl = make(node.capabilities())
    drv = Drive(ctrl, node.observe())
    a = drv.until(15.5, load=0.9)
    assert not ctrl.enabled
    assert (a[BE].cores, a[BE].core_group) == (0.0, BE_GROUP) and a[LC].cores == caps.cores


def _grown(caps, obs, cores: float) -> tuple[HeraclesController, Drive]:
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    drv.tick()
    ctrl.be_cores = cores
    return ctrl, drv


def test_slack_under_5pct_removes_two_be_cores_and_stops_growth(base):
    obs, caps = base
    ctrl, drv = _grown(caps, obs, 6.0)
    a = drv.until(15.5, slack=0.03)
    assert be_cores(a) == 4.0 and not ctrl.growth_allowed
    a = drv.until(30.5, slack=0.03)
    assert be_cores(a) == 2.0


def test_slack_between_5_and_10pct_only_disallows_growth(base):
    obs, caps = base
    ctrl, drv = _grown(caps, obs, 6.0)
    drv.until(15.5, slack=0.5)
    assert ctrl.growth_allowed
    a = drv.until(30.5, slack=0.07)
    assert not ctrl.growth_allowed and ctrl.enabled
    ways, cores = a[BE].llc_ways, be_cores(a)
    a = drv.until(44.5, slack=0.07)  # core/memory cycles run, but BE may not grow
    assert (a[BE].llc_ways, be_cores(a)) == (ways, cores)


# ---- Alg. 2: core & memory sub-controller -------------------------------------------------------------
def _bw_falls_with_ways(a: Allocation) -> float:
    """Total DRAM GB/s: 5 per BE core, minus 0.5 per BE way up to 5 ways (then no more gain)."""
    return 6.0 + 5.0 * a[BE].cores - 0.5 * min(a[BE].llc_ways, 5)


def test_grow_llc_then_rollback_then_grow_cores_until_the_dram_limit(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    perf = lambda a: 0.1 * a[BE].cores + 0.01 * min(a[BE].llc_ways, 5)  # noqa: E731
    trace = []
    while drv.t < 60.0:
        a = drv.tick(mem_bw=_bw_falls_with_ways, be_tput=perf)
        trace.append((drv.t, a[BE].llc_ways, a[BE].cores, ctrl.phase))
    by_t = {t: (w, c, p) for t, w, c, p in trace}
    # growth allowed at 15.5; GROW_LLC adds one way per 2 s cycle while DRAM bw falls
    assert [by_t[t][0] for t in (16.5, 18.5, 20.5, 22.5)] == [3, 4, 5, 6]
    # the 6th way did not lower bandwidth (derivative >= 0): rolled back, GROW_CORES
    assert by_t[24.5][:3] == (5, 1.0, GROW_CORES)
    cores = [by_t[t][1] for t in (26.5, 28.5, 30.5)]
    assert cores == [2.0, 3.0, 4.0]
    # cores grow until LC + BE + one more BE core would pass 90% of 50 GB/s: 8 cores
    # (8 cores: 38.5 GB/s measured; the 9th would need 38.5 + 38.5/8 + ... > 45)
    final_ways, final_cores, _ = by_t[60.0]
    assert final_cores == 8.0 and final_ways == 5
    assert _bw_falls_with_ways(drv.alloc) <= ctrl.dram_limit_gbps


def test_llc_growth_without_be_benefit_switches_to_cores_without_rollback(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    drv.until(16.5, mem_bw=_bw_falls_with_ways, be_tput=0.3)
    assert drv.alloc[BE].llc_ways == 3 and ctrl.phase == GROW_LLC
    # bw fell but BE throughput did not rise: the way is kept, and the same cycle grows cores
    a = drv.until(18.5, mem_bw=_bw_falls_with_ways, be_tput=0.3)
    assert ctrl.phase == GROW_CORES and a[BE].llc_ways == 3 and be_cores(a) == 2.0
    a = drv.until(20.5, mem_bw=_bw_falls_with_ways, be_tput=0.3)
    assert a[BE].llc_ways == 3 and be_cores(a) == 3.0


@pytest.mark.parametrize(
    ("total_gbps", "model", "expected_cores"),
    [
        (50.0, None, 8.0),  # LC measured 5: BE 45 GB/s on 9 cores, 5 over the limit -> 1 core
        (56.0, None, 7.0),  # 11 over at 5.67 GB/s per BE core -> 2 cores
        (50.0, lambda load, cores, ways: 20.0, 7.0),  # model: BE 30 GB/s -> 3.33 per core -> 2 cores
        (44.0, None, 9.0),  # under the limit: nothing removed
    ],
)
def test_dram_limit_removes_be_cores_by_overage_over_bandwidth_per_core(
    base, total_gbps, model, expected_cores
):
    obs, caps = base
    ctrl = make(caps, lc_bw_model=model)
    drv = Drive(ctrl, obs)
    drv.tick()
    ctrl.be_cores = 9.0
    a = drv.until(2.5, mem_bw=total_gbps, lc_bw=5.0)
    assert be_cores(a) == expected_cores
    assert ctrl.dram_limit_gbps == pytest.approx(45.0)


def test_the_lc_bandwidth_model_is_asked_about_the_candidate_allocation(base):
    obs, caps = base
    calls = []

    def model(load: float, cores: float, ways: int) -> float:
        calls.append((load, cores, ways))
        return 40.0 if cores < caps.cores - 1 else 1.0  # the LC job's traffic jumps below 13 cores

    grown = {}
    for m in (None, model):
        ctrl = make(caps, lc_bw_model=m)
        drv = Drive(ctrl, obs)
        drv.until(14.5)
        ctrl._phase = GROW_CORES
        grown[m is None] = be_cores(drv.until(16.5, lc_bw=1.0, mem_bw=10.0, load=0.4))  # growth from 15.5
    assert grown == {True: 2.0, False: 1.0}  # without a model: measured LC bw, BE grows
    assert (0.4, caps.cores - 2, caps.llc_ways - 2) in calls  # one core fewer for the LC job


def test_growth_stops_when_the_cycle_slack_drops_under_10pct(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    drv.until(15.5, slack=0.5)
    assert ctrl.growth_allowed
    a = drv.until(24.5, slack=0.07)
    assert ctrl.growth_allowed  # the top level has not polled again...
    assert (a[BE].llc_ways, be_cores(a)) == (2, 1.0)  # ...but the 2 s cycles saw the slack


# ---- Alg. 3: power ------------------------------------------------------------------------------------
def test_power_lowers_be_frequency_when_near_tdp_and_lc_is_slow_and_raises_it_with_headroom(base):
    obs, caps = base
    levels = caps.freq_levels_mhz
    ctrl = make(caps, guaranteed_freq_mhz=2800)
    drv = Drive(ctrl, obs)
    hot = 0.95 * caps.tdp_w
    cool = 0.80 * caps.tdp_w
    a = drv.until(6.5, power=hot, lc_freq=2500)  # cycles at 2.5, 4.5, 6.5
    assert a[BE].freq_mhz == levels[-4] and a[LC].freq_mhz == levels[-1]
    assert {a[n].freq_mhz for n in (*LC_AS_BE, BE)} == {levels[-4]}
    a = drv.until(10.5, power=hot, lc_freq=3000)  # LC at its guaranteed frequency: hold
    assert a[BE].freq_mhz == levels[-4]
    a = drv.until(14.5, power=cool, lc_freq=2500)  # LC slow but power is not the cause: hold
    assert a[BE].freq_mhz == levels[-4]
    a = drv.until(16.5, power=cool, lc_freq=3000)
    assert a[BE].freq_mhz == levels[-3]


def test_guaranteed_frequency_defaults_to_nominal(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    a = drv.until(2.5, power=0.95 * caps.tdp_w, lc_freq=caps.nominal_freq_mhz - 100)
    assert a[BE].freq_mhz == caps.freq_levels_mhz[-2]
    ctrl2 = make(caps)
    drv2 = Drive(ctrl2, obs)
    a2 = drv2.until(2.5, power=0.95 * caps.tdp_w, lc_freq=caps.nominal_freq_mhz)
    assert a2[BE].freq_mhz == caps.freq_levels_mhz[-1]


# ---- Alg. 4: network --------------------------------------------------------------------------------------
def test_network_limits_be_to_link_minus_lc_minus_headroom_every_second(base):
    obs, caps = base
    ctrl = make(caps)
    drv = Drive(ctrl, obs)
    a = drv.tick(lc_net=1.5)
    assert [a[n].net_gbps for n in (*LC_AS_BE, BE)] == pytest.approx([10 - 1.5 - 0.5] * 3)  # 5% of link
    a = drv.tick(lc_net=6.0)  # t = 1.0: not yet a network cycle
    assert a[BE].net_gbps == pytest.approx(8.0)
    a = drv.tick(lc_net=6.0)  # t = 1.5: one second after the last cycle
    assert a[BE].net_gbps == pytest.approx(10 - 6.0 - 0.6)  # 10% of LC bandwidth
    assert a[LC].net_gbps == caps.net_gbps


# ---- closed loop ------------------------------------------------------------------------------------------
def test_on_the_simulator_every_decision_is_valid_and_the_run_is_deterministic():
    def run() -> list:
        node = SimNode(simple_scenario({"memcached": 0.3, "xapian": 0.1}), seed=2)
        caps = node.capabilities()
        ctrl = make(caps)
        obs, allocs = node.observe(), []
        for _ in range(90):
            d = ctrl.decide(obs)
            if d.allocation is not None:
                validate_allocation(d.allocation, caps)
                allocs.append((obs.time_s, d.allocation))
            obs = node.step(d.allocation)
        return allocs

    first = run()
    assert len(first) > 3 and first == run()
