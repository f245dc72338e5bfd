"""harness.be_dvfs: `be-dvfs:SPEC` keeps SPEC's LC decisions and sets the BE jobs' frequency by
Heracles' power sub-controller (Alg. 3, the `be_dvfs` guard of env.guards), every 2 s."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from env.config import ConfigError
from env.controller import ControllerContext
from env.guards import BeDvfsConfig, GuardsConfig, build_guards
from env.loop import run_episode
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Resource
from harness.be_dvfs import CYCLE_S, BeDvfsController
from harness.registry import make_controller, parse_spec

LOADS = {"memcached": 0.2, "xapian": 0.1, "nginx": 0.2}


def _run(spec: str, seconds: float, caps_change: dict | None = None, be: tuple[str, ...] = ("be_parties",)):
    scn = simple_scenario(LOADS, duration_s=seconds, warmup_s=1.0, seed=3, be=be)
    node = SimNode(scn, seed=3)
    caps = node.capabilities()
    if caps_change:
        caps = dataclasses.replace(caps, **caps_change)
    ctrl = make_controller(spec, ControllerContext(caps, scn, node, 3))
    ctrl.reset(caps, np.random.default_rng(5))
    return run_episode(node, ctrl, seconds), ctrl, node.capabilities()


def test_be_frequency_climbs_with_headroom_and_the_lc_apps_stay_as_the_inner_controller_sets_them():
    recs, ctrl, caps = _run("be-dvfs:parties", 12.0)
    alone, _, _ = _run("parties", 12.0)
    assert isinstance(ctrl, BeDvfsController) and ctrl.name == "be-dvfs:parties"
    lc = {a.name for a in caps.lc_apps}
    assert [[a for a in r.alloc if a.name in lc] for r in recs] == [
        [a for a in r.alloc if a.name in lc] for r in alone
    ]  # PARTIES' LC decisions, unchanged
    assert any(r.changed for r in alone), "PARTIES moved nothing: the comparison shows nothing"
    be_freq = [next(a.freq_mhz for a in r.alloc if a.name == "be_parties") for r in recs]
    nominal = caps.nominal_freq_mhz
    assert be_freq[0] == nominal  # PARTIES' start: every core at the nominal frequency
    # the fair start draws well under 90% of the TDP here, so the first cycle raises it a level
    assert max(r.power_w for r in recs[: int(CYCLE_S / caps.interval_s)]) < 0.9 * caps.tdp_w
    up = caps.freq_levels_mhz[caps.freq_levels_mhz.index(nominal) + 1]
    assert be_freq[-1] == up and ctrl.be_freq_mhz == up
    first = be_freq.index(up)
    assert 1 <= first * caps.interval_s <= CYCLE_S + caps.interval_s  # within one 2 s cycle
    assert "Heracles Alg. 3" in recs[first - 1].reason


def test_be_frequency_drops_when_over_budget_with_the_lc_apps_short_of_their_guarantee():
    # a TDP so low that the node is over budget at once; the LC apps' frequency is read from the
    # observation, so make them run short of it
    scn = simple_scenario(LOADS, duration_s=10.0, warmup_s=1.0, seed=3)
    node = SimNode(scn, seed=3)
    caps = dataclasses.replace(node.capabilities(), tdp_w=50.0)
    ctrl = BeDvfsController(make_controller("static", ControllerContext(caps, scn, node, 3)))
    ctrl.reset(caps, np.random.default_rng(0))
    obs, seen = node.observe(), []
    for _ in range(12):
        slow = tuple(
            dataclasses.replace(s, usage=dataclasses.replace(s.usage, freq_mhz=1500.0)) for s in obs.apps
        )
        obs = node.step(ctrl.decide(dataclasses.replace(obs, apps=slow)).allocation)
        seen.append(ctrl.be_freq_mhz)
    nominal = caps.nominal_freq_mhz
    below = caps.freq_levels_mhz[caps.freq_levels_mhz.index(nominal) - 1]
    assert seen[0] == nominal and below in seen and min(seen) < nominal
    assert next(a.freq_mhz for a in node.observe().allocation if a.name == "be_parties") == min(seen)


@pytest.mark.parametrize(
    "change, be",
    [
        ({}, ()),  # no BE job
        ({"tdp_w": float("nan")}, ("be_parties",)),  # no RAPL
        ({"knobs": frozenset(Resource) - {Resource.FREQ}}, ("be_parties",)),  # no DVFS
    ],
)
def test_a_node_without_the_knob_runs_the_inner_controller_unchanged(change, be):
    recs, _, _ = _run("be-dvfs:parties", 6.0, change, be)
    alone, _, _ = _run("parties", 6.0, change, be)
    assert [r.alloc for r in recs] == [r.alloc for r in alone]
    assert [r.reason for r in recs] == [r.reason for r in alone]


def test_specs():
    assert parse_spec("be-dvfs:rl:runs/x/policy.pt") == ("be-dvfs", "rl:runs/x/policy.pt")
    assert parse_spec("be-dvfs:handoff:5:parties+static")[0] == "be-dvfs"
    for bad in ("be-dvfs", "be-dvfs:", "be-dvfs:nope", "be-dvfs:rl"):
        with pytest.raises(ConfigError):
            parse_spec(bad)


def test_the_wrapper_is_the_guard_a_training_env_runs():
    """`be-dvfs:parties` under clamp only == PARTIES under clamp -> be_dvfs (what `env.guards.be_dvfs`
    puts in a training env): the same allocations, tick for tick."""
    scn = simple_scenario(LOADS, duration_s=10.0, warmup_s=1.0, seed=3, be=("be_parties",))
    runs = []
    for spec, guards in (
        ("be-dvfs:parties", GuardsConfig()),
        ("parties", GuardsConfig(be_dvfs=BeDvfsConfig())),
    ):
        node = SimNode(scn, seed=3)
        caps = node.capabilities()
        ctrl = make_controller(spec, ControllerContext(caps, scn, node, 3))
        ctrl.reset(caps, np.random.default_rng(5))
        runs.append(run_episode(node, ctrl, 10.0, guards=build_guards(guards)))
    wrapped, guarded = runs
    assert [r.alloc for r in wrapped] == [r.alloc for r in guarded]
    be = [next(a.freq_mhz for a in r.alloc if a.name == "be_parties") for r in guarded]
    assert len(set(be)) > 1  # the BE frequency moved: the comparison is not of two idle runs
