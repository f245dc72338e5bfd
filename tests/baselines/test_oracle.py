"""The Oracle (PARTIES Sec. 5.2.3): its analytic evaluator, its search and its re-planning state
machine on hand-built observations, and a short run on a SimNode (memcached + nginx + the BE job, at
loads the PARTIES node serves easily, so that the assertions do not hang on the calibration)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

from baselines import oracle as O
from baselines.oracle import (
    AnalyticBatch,
    OracleConfig,
    OracleController,
    Planner,
    load_oracle_config,
)
from env import metrics
from env.allocations import fair_allocation
from env.config import CONFIGS, ConfigError, build
from env.controller import ControllerContext
from env.loop import run_episode
from env.sim import model as M
from env.sim.experiments import Setup, analytic_outputs
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Observation, validate_allocation
from harness.registry import make_controller

APPS = ("memcached", "nginx")
CFG = load_oracle_config()


def mix(loads=(0.2, 0.2), **kw):
    return simple_scenario(dict(zip(APPS, loads)), **kw)


@pytest.fixture(scope="module")
def light():
    scn = mix()
    node = SimNode(scn, seed=0)
    return scn, node.capabilities(), Planner(scn, node.capabilities(), CFG)


def test_config_is_strict_and_checked():
    assert isinstance(CFG, OracleConfig) and 0.95 < CFG.interval_meet_prob < 1
    with pytest.raises(ConfigError, match="unknown key"):
        build(OracleConfig, {"interval_meet_probability": 0.9}, "oracle.yaml")
    with pytest.raises(ConfigError, match="interval_meet_prob"):
        OracleConfig(interval_meet_prob=1.0)


def test_batch_evaluation_is_the_experiments_analytic_evaluation(light):
    """AnalyticBatch packs once but must compute exactly what env.sim.experiments does."""
    loads = {"memcached": 0.4, "xapian": 0.3, "nginx": 0.5}
    scn = simple_scenario(loads)
    caps = SimNode(scn, seed=0).capabilities()
    fair = fair_allocation(caps)
    other = fair.replace_app("memcached", cores=fair["memcached"].cores + 1).replace_app(
        "be_parties", cores=fair["be_parties"].cores - 1
    )
    batch = AnalyticBatch(scn, steps=8)
    evs = batch.evaluate([fair, other], [loads, loads])
    out, _, _ = analytic_outputs([Setup(scn, lambda c: fair), Setup(scn, lambda c: other)], np.array([0.4]))
    for k, ev in enumerate(evs):
        for w, app in enumerate(loads):
            target_s = caps.app(app).qos_target_us / 1e6
            assert ev.tardiness[app] == pytest.approx(out[k, 0, w, M.O_P99] / target_s, rel=1e-9)
    assert evs[0].tardiness != evs[1].tardiness  # the two allocations really differ
    # an idle app (load 0) always meets its target
    assert batch.evaluate([fair], [{"memcached": 0.3}])[0].p_meet["nginx"] == 1.0


def test_light_plan_is_viable_and_gives_be_more_than_the_fair_split(light):
    _scn, caps, planner = light
    loads = dict(zip(APPS, (0.2, 0.2)))
    plan = planner.plan(loads)
    validate_allocation(plan.allocation, caps)
    assert plan.viable and plan.evaluation.p_all >= CFG.interval_meet_prob
    assert 0 < max(plan.evaluation.utilization.values()) <= CFG.max_utilization
    fair = planner.batch.evaluate([fair_allocation(caps)], [loads])[0]
    assert plan.evaluation.be_throughput > fair.be_throughput
    assert plan.allocation["be_parties"].cores > fair_allocation(caps)["be_parties"].cores
    # exclusive partitions: one core group and one CLOS per LC app, one for BE
    assert len({a.clos for a in plan.allocation}) == len({a.core_group for a in plan.allocation}) == 3


def test_viability_needs_the_meet_probability_and_utilisation_headroom(light):
    planner = light[2]
    ok = O.Evaluation({"a": 0.999}, {"a": 0.8}, {"a": 0.1}, 0.5, {"a": 0.85})
    assert planner.viable(ok)
    assert not planner.viable(dataclasses.replace(ok, utilization={"a": 0.97}))  # near saturation
    assert not planner.viable(dataclasses.replace(ok, p_meet={"a": 0.9}))
    # viable beats non-viable whatever the BE throughput; then more BE throughput wins
    assert planner.score(ok) > planner.score(
        dataclasses.replace(ok, utilization={"a": 0.97}, be_throughput=1.0)
    )
    assert planner.score(dataclasses.replace(ok, be_throughput=0.6)) > planner.score(ok)


def test_impossible_loads_give_the_closest_plan(light):
    _scn, caps, planner = light
    loads = dict(zip(APPS, (1.5, 1.5)))
    plan = planner.plan(loads)
    validate_allocation(plan.allocation, caps)
    assert not plan.viable
    fair = planner.batch.evaluate([fair_allocation(caps)], [loads])[0]
    assert plan.evaluation.worst_tardiness <= fair.worst_tardiness


def test_too_few_closes_is_refused():
    scn = simple_scenario(
        {"memcached:a": 0.1, "memcached:b": 0.1, "nginx:c": 0.1, "nginx:d": 0.1, "nginx:e": 0.1},
        platform="coco",
        be=(),
    )
    from env.sim.platform import load_platform
    from env.types import AppSpec

    caps = load_platform("coco").capabilities([AppSpec(n, "lc", 600.0, 1e5) for n in "abcde"])
    ctrl = OracleController(scn, 0, CFG)
    with pytest.raises(ConfigError, match="CLOSes"):
        ctrl.reset(caps, np.random.default_rng(0))


# ---- a small node whose optimum is known by exhaustive enumeration ---------------------------------
def _small_platform(tmp: Path) -> str:
    """PARTIES' platform cut down to 6 cores, 8 LLC ways (4 CLOS) and three frequency levels (1.8 and
    2.2 GHz, turbo 3.6), so that every cores x ways x frequency allocation can be enumerated."""
    data = yaml.safe_load((CONFIGS / "node" / "parties.yaml").read_text())
    data.update(name="small", cores=6)
    data["llc"].update(ways=8, clos=4)
    data["freq"].update(min_mhz=1800, step_mhz=400)
    path = tmp / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("search", ["exhaustive", "frontier"])
@pytest.mark.parametrize("loads", [(0.2, 0.2), (0.1, 0.3)])
def test_finds_the_exhaustive_optimum_of_a_small_node(tmp_path, loads, search):
    """memcached + nginx + the BE job on 6 cores / 8 ways / 3 frequency levels: every split of the
    cores and ways (BE keeps a CLOS) and every frequency of each LC app, 2835 allocations, enumerated
    here independently and evaluated with the Oracle's own criterion and the memory, disk and network
    it plans. The space fits `max_exhaustive`, so the Oracle enumerates it (step 0); forced onto its
    per-app frontiers and refinement (steps 1-3, as on PARTIES' node) it must find the optimum too.
    Step 3 also moves memory, disk and network, so the Oracle may do better than the enumeration."""
    plat = _small_platform(tmp_path)
    loads = dict(zip(APPS, loads))
    scn = simple_scenario(loads, platform=plat, duration_s=3600, seed=0)
    caps = SimNode(scn, seed=0).capabilities()
    assert caps.freq_levels_mhz == (1800, 2200, 3600) and (caps.cores, caps.llc_ways) == (6.0, 8)
    cfg = CFG if search == "exhaustive" else dataclasses.replace(CFG, max_exhaustive=0)
    planner = Planner(scn, caps, cfg)
    storage = planner.storage(loads)
    every = []
    for cores, ways, freq in itertools.product(
        itertools.product(range(1, 6), repeat=2),
        itertools.product(range(1, 8), repeat=2),
        itertools.product(caps.freq_levels_mhz, repeat=2),
    ):
        if sum(cores) <= caps.cores and sum(ways) <= caps.llc_ways - caps.min_llc_ways:
            every.append(
                planner.allocation(
                    dict(zip(APPS, map(float, cores))), dict(zip(APPS, ways)), storage, dict(zip(APPS, freq))
                )
            )
    assert len(every) == 15 * 21 * 9 == planner.space_size() <= CFG.max_exhaustive
    evs = planner.batch.evaluate(every, [loads] * len(every))
    viable = [planner.viable(e) for e in evs]
    best = max(evs, key=planner.score)
    # the instance is informative: most allocations fail, and the optimum beats the fair split
    fair = planner.batch.evaluate([fair_allocation(caps)], [loads])[0]
    assert 0 < np.mean(viable) < 0.5 and planner.viable(best)
    assert best.be_throughput > fair.be_throughput + 0.05
    plan = planner.plan(loads)
    validate_allocation(plan.allocation, caps)
    assert plan.viable
    assert plan.evaluation.be_throughput >= best.be_throughput - 1e-9
    if search == "exhaustive":
        assert plan.candidates > len(every)
    else:
        assert plan.candidates < len(every) / 5  # the frontiers need a fraction of the enumeration


# ---- the re-planning state machine on hand-built observations -------------------------------------
def at(obs: Observation, t: float, loads: dict[str, float] | None = None) -> Observation:
    apps = tuple(
        dataclasses.replace(s, load_frac=loads[s.name]) if loads and s.name in loads else s for s in obs.apps
    )
    return dataclasses.replace(obs, time_s=t, apps=apps)


def test_replans_ahead_of_a_step_and_caches_plans():
    O._PLANS.clear()
    step_t = 20.0
    scn = simple_scenario(
        {"memcached": {"kind": "step", "steps": [[0, 0.2], [step_t, 0.5]]}, "nginx": 0.2},
        duration_s=40,
        warmup_s=5,
    )
    node = SimNode(scn, seed=3)
    obs0 = node.observe()
    ctrl = OracleController(scn, seed=3, config=CFG)
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    low = ctrl.decide(at(obs0, 1.0))
    assert low.allocation is not None and "memcached=20%" in low.reason
    validate_allocation(low.allocation, node.capabilities())
    # holds while the next lookahead_s of the trace stays at 20%
    held = ctrl.decide(dataclasses.replace(at(obs0, 5.0), allocation=low.allocation))
    assert held.allocation is None and ctrl.plans_made == 1
    # lookahead: the plan for 50% is in force before the step arrives
    before = step_t - CFG.lookahead_s + obs0.interval_s
    high = ctrl.decide(dataclasses.replace(at(obs0, before), allocation=low.allocation))
    assert high.allocation is not None and "memcached=50%" in high.reason and ctrl.plans_made == 2
    planner = Planner(scn, node.capabilities(), CFG)
    at_high = {"memcached": 0.5, "nginx": 0.2}
    ev_low, ev_high = planner.batch.evaluate([low.allocation, high.allocation], [at_high, at_high])
    assert ev_high.p_all >= CFG.interval_meet_prob > ev_low.p_all  # the step needed the new plan
    # a second controller for the same scenario reuses the cached plans (no new search)
    twin = OracleController(scn, seed=3, config=CFG)
    twin.reset(node.capabilities(), np.random.default_rng(1))
    assert twin.decide(at(obs0, 1.0)).allocation == low.allocation and twin.plans_made == 0


def test_observed_load_above_the_trace_is_planned_for():
    O._PLANS.clear()
    scn = mix()
    node = SimNode(scn, seed=0)
    obs = node.observe()
    ctrl = OracleController(scn, seed=0, config=CFG)
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    d = ctrl.decide(at(obs, 1.0, {"nginx": 0.5}))
    assert "nginx=50%" in d.reason and "differs from the trace for nginx" in d.reason
    assert "memcached=20%" in d.reason
    # an invalid observation: the trace alone decides (no crash, no check)
    bad = dataclasses.replace(at(obs, 1.5), valid=False)
    assert "nginx=20%" in ctrl.decide(bad).reason


def test_trace_is_the_nodes_trace_for_random_loads():
    scn = simple_scenario(
        {
            "memcached": {"kind": "bursty", "base": 0.2, "burst": 0.5, "mean_gap_s": 5, "mean_burst_s": 2},
            "nginx": 0.1,
        },
        duration_s=30,
        warmup_s=5,
    )
    node = SimNode(scn, seed=11)
    ctrl = OracleController(scn, seed=11, config=CFG)
    seen, predicted = [], []
    for _ in range(60):
        obs = node.step()
        seen.append(obs.app("memcached").load_frac)
        predicted.append(ctrl.trace_loads(obs.time_s - obs.interval_s, obs.interval_s, 1)["memcached"])
    assert np.ptp(seen) > 0.1  # the trace really varies
    assert predicted == pytest.approx(seen)


# ---- a short run on a SimNode ---------------------------------------------------------------------
def test_short_run_meets_every_target_with_more_be_than_static():
    scn = mix(duration_s=60, warmup_s=20)
    results = {}
    for spec in ("oracle", "static"):
        node = SimNode(scn, seed=0)
        ctrl = make_controller(spec, ControllerContext(node.capabilities(), scn, node, 0))
        recs = run_episode(node, ctrl, 60.0, rng=np.random.default_rng(0))
        results[spec] = recs
    assert metrics.qos_guarantee(results["oracle"], 20.0) >= 0.95
    assert metrics.be_throughput(results["oracle"], 20.0) > metrics.be_throughput(results["static"], 20.0)
    assert sum(r.changed for r in results["oracle"]) == 1  # one static plan, applied once
