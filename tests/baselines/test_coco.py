"""CoCo (Sec. 3) and its Fig. 2 references: configuration rules, the slowdown profile, Eq. 2 and the
MQ-WRR / round-robin schedulers, the controller's state machine (slices, migrations, admission
control) on hand-built observations, and short runs on SimNodes."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from baselines.coco import (
    RESERVED_CLOS,
    ClosConfig,
    CocoConfig,
    CocoController,
    Mqwrr,
    SlowdownProfile,
    assignable,
    build_allocation,
    build_coco,
    check_monotone,
    clos_plan,
    eq2_weights,
    full_search_points,
    lc_cores,
    load_coco_config,
    measure_retention,
    profile_scenario,
    profile_workload,
    round_robin,
    walk_points,
    working_set_sizes,
)
from env.allocations import fair_allocation, lc_clos_blocks, unmanaged_allocation
from env.config import ConfigError
from env.controller import ControllerContext
from env.sim.node import SimNode
from env.sim.platform import load_platform
from env.sim.scenario import load_scenario, simple_scenario
from env.types import AppSample, AppSpec, Observation, Usage, validate_allocation
from harness.registry import make_controller

APPS = ("memcached-1", "memcached-2", "nginx-1", "nginx-2", "mongodb-1", "mongodb-2")
FIG2_CLOSES = {0: (2, 10), 1: (3, 10), 2: (6, 30), 3: (9, 50)}


@pytest.fixture(scope="module")
def caps():
    return load_platform("coco").capabilities([AppSpec(a, "lc", 1000.0, 1e5) for a in APPS])


def fake_profile(sens: float, sl_full_rps: float = 1e5) -> SlowdownProfile:
    """Retention 1 at full resources, falling linearly with the missing ways and MBA (x sens)."""
    pl = load_platform("coco")
    ret = {}
    for w in range(1, 21):
        for m in pl.mba.levels_pct:
            ret[(w, m)] = max(0.05, 1.0 - sens * ((20 - w) / 40 + (100 - m) / 400))
    return SlowdownProfile("fake", 2.0, 1e5, sl_full_rps / 1e5, ret, 0, 0.0)


def observation(caps, t: float, alloc, loads_rps: dict[str, float] | None = None) -> Observation:
    usage = Usage(0.5, 1.0, 1.0, 1.0, 0.0, 0.1, 3000.0)
    apps = tuple(
        AppSample(a, 500.0, 1000.0, (loads_rps or {}).get(a, 1e4), 0.1, 1e4, 0.0, 5000, usage) for a in APPS
    )
    return Observation(t, 0.5, apps, (), alloc, 10.0, 100.0)


def controller(caps, cfg: CocoConfig | None = None, sens=None) -> CocoController:
    cfg = cfg or load_coco_config("coco")
    sens = sens or {a: (1.5 if a.startswith("mongodb") else 1.0) for a in APPS}
    profiles = {a: fake_profile(s) for a, s in sens.items()} if cfg.needs_profile else None
    ctrl = CocoController(cfg, profiles, 123.0, name="coco")
    ctrl.reset(caps, np.random.default_rng(0))
    return ctrl


def drive(ctrl, caps, ticks: int, loads=None, t0: float = 0.5):
    alloc = unmanaged_allocation(caps)
    out = []
    for k in range(ticks):
        d = ctrl.decide(observation(caps, t0 + 0.5 * k, alloc, loads))
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
            alloc = d.allocation
        out.append((d, alloc))
    return out


# ---- configuration ----------------------------------------------------------------------------------
def test_yaml_variants():
    coco, rr, nopart = (load_coco_config(v) for v in ("coco", "coco-rr", "coco-nopart"))
    assert coco.scheduler == "mq-wrr" and coco.admission_control
    assert (coco.reserved_clos, coco.lc_clos) == (
        ClosConfig(2, 10),
        (ClosConfig(3, 10), ClosConfig(6, 30), ClosConfig(9, 50)),
    )
    assert rr.scheduler == "rr" and not rr.admission_control and rr.lc_clos == coco.lc_clos
    assert nopart.scheduler == "none"
    cat, conflict = load_coco_config("coco-cat"), load_coco_config("coco-conflict")
    assert [c.ways for c in cat.lc_clos] == [c.ways for c in coco.lc_clos]
    assert {c.mba_pct for c in (cat.reserved_clos, *cat.lc_clos)} == {100}
    assert cat.scheduler == conflict.scheduler == "mq-wrr" and conflict.admission_control
    assert [(c.ways, c.mba_pct) for c in conflict.lc_clos] == [(3, 50), (6, 30), (9, 10)]
    with pytest.raises(ConfigError, match="conflicts"):  # Sec. 3.3: refused unless the flag is off
        check_monotone(conflict.lc_clos)
    with pytest.raises(ConfigError, match="unknown CoCo variant"):
        load_coco_config("coco-cat-only")


def test_config_is_strict(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("coco: {scheduler: mq-wrr, slice_interval: 2}\n")
    with pytest.raises(ConfigError, match=r"slice_interval.*unknown key"):
        load_coco_config("coco", p)
    p.write_text("coco: {}\nvariants: {coco-mba: {scheduler: rr}}\n")
    with pytest.raises(ConfigError, match="coco-mba"):
        load_coco_config("coco", p)
    with pytest.raises(ConfigError, match="admission control needs the profile"):
        CocoConfig(scheduler="rr", admission_control=True)


def test_cat_and_mba_must_move_together():
    """Sec. 3.3: a CLOS with more ways and less MBA is a conflict, refused unless allowed."""
    conflict = (ClosConfig(3, 50), ClosConfig(6, 30), ClosConfig(9, 10))
    with pytest.raises(ConfigError, match="conflicts"):
        CocoConfig(lc_clos=conflict)
    assert CocoConfig(lc_clos=conflict, coordinate_cat_mba=False).lc_clos == conflict


def test_clos_plan_on_each_platform(caps):
    plan = clos_plan(caps, load_coco_config("coco"))
    assert plan.reserved == ClosConfig(2, 10) and [c.ways for c in plan.lc] == [3, 6, 9]
    parties = load_platform("parties").capabilities([AppSpec("memcached", "lc", 600.0, 1e6)])
    p2 = clos_plan(parties, load_coco_config("coco"))  # no MBA there: CAT only
    assert {c.mba_pct for c in (p2.reserved, *p2.lc)} == {100}
    small = dataclasses.replace(caps, clos_count=3)  # the largest LC CLOSes that fit
    assert [c.ways for c in clos_plan(small, load_coco_config("coco")).lc] == [6, 9]
    with pytest.raises(ConfigError, match="ways"):
        clos_plan(caps, CocoConfig(lc_clos=(ClosConfig(10, 50), ClosConfig(10, 50))))
    assert lc_cores(caps, load_coco_config("coco")) == 2.0  # 16 cores // 6 apps


# ---- the fair start when LC apps outnumber the CLOSes (env.allocations.fair_allocation) -------------
def test_lc_clos_blocks_are_balanced():
    assert lc_clos_blocks(3, 15) == [1, 1, 1]  # enough CLOSes: one each
    assert lc_clos_blocks(6, 4) == [2, 2, 1, 1]
    assert lc_clos_blocks(6, 3) == [2, 2, 2]
    assert lc_clos_blocks(7, 1) == [7]
    for n, k in itertools.product(range(1, 13), range(1, 6)):
        b = lc_clos_blocks(n, k)
        assert sum(b) == n and len(b) == min(n, k) and max(b) - min(b) <= 1


def test_fair_allocation_shares_closes_when_lc_apps_outnumber_them(caps):
    """CoCo Fig. 2: six LC apps, four CLOSes, no BE job. The apps share CLOSes in balanced
    contiguous blocks; a CLOS of k apps holds k fair shares of the ways (3 of 20 each)."""
    alloc = fair_allocation(caps)
    validate_allocation(alloc, caps)
    assert [alloc[a].clos for a in APPS] == [0, 0, 1, 1, 2, 3]
    assert alloc.closes() == {0: (6, 100), 1: (6, 100), 2: (3, 100), 3: (3, 100)}
    assert [a.core_group for a in alloc] == [1, 2, 3, 4, 5, 6] and {a.cores for a in alloc} == {2.0}
    # with a BE job: it keeps CLOS 0 and the rest; the six LC apps share the other three CLOSes
    with_be = load_platform("coco").capabilities([*caps.lc_apps, AppSpec("be", "be")])
    alloc = fair_allocation(with_be)
    validate_allocation(alloc, with_be)
    assert [alloc[a].clos for a in APPS] == [1, 1, 2, 2, 3, 3]
    assert alloc.closes() == {1: (6, 100), 2: (6, 100), 3: (6, 100), 0: (2, 100)}
    assert (alloc["be"].core_group, alloc["be"].cores) == (0, 4.0)
    # a single CLOS and a BE job: nothing can be partitioned, every app holds the whole LLC
    one = dataclasses.replace(with_be, clos_count=1)
    alloc = fair_allocation(one)
    validate_allocation(alloc, one)
    assert alloc.closes() == {0: (20, 100)}
    # enough CLOSes: the exclusive layout (one CLOS per LC app, CLOS 0 for BE), as before
    parties = load_platform("parties").capabilities(
        [AppSpec("memcached", "lc", 600.0, 1e6), AppSpec("nginx", "lc", 1e4, 5e5), AppSpec("be", "be")]
    )
    alloc = fair_allocation(parties)
    assert [(a.name, a.clos) for a in alloc] == [("memcached", 1), ("nginx", 2), ("be", 0)]
    # more apps than ways: a CLOS cannot get its minimum
    many = load_platform("coco").capabilities([AppSpec(f"m{i}", "lc", 600.0, 1e5) for i in range(21)])
    with pytest.raises(ValueError, match="do not fit"):
        fair_allocation(dataclasses.replace(many, cores=32.0))


# ---- rule 1: profiling cost model -------------------------------------------------------------------
def test_profiling_cost_model():
    cfg = load_coco_config("coco").profiling
    assert walk_points(1.0, 5.0) == 21 and walk_points(0.33, 5.0) == 7 and walk_points(0.0, 5.0) == 1
    # doubling 0.05 -> 0.1 -> 0.2 -> 0.4 (fails) then 7 bisections to 1%
    assert full_search_points(0.3, cfg) == 4 + 7


def _table1_profile(app: str):
    """CoCo Sec. 4.1's set-up for `app` as a scenario CoCo would profile: the calibration's
    deployment (env.sim.fit.coco_setups: as many cores as threads, the CoCo overrides)."""
    from env.sim import fit as F
    from env.sim.profiles import load_profile

    threads = load_profile(app).threads
    ov = {"threads": threads, **F.COCO_OVERRIDES.get(app, {})}
    scn = simple_scenario({app: 0.3}, platform="coco", be=(), overrides={app: ov})
    cfg = load_coco_config("coco").profiling
    return profile_workload(scn, app, float(threads), cfg), cfg


def _table1_states():
    from env.sim import fit as F

    ways = load_platform("coco").llc.ways
    return [(k, 100) for _, k in F.COCO_CAT] + [(ways, p) for _, p in F.COCO_MBA]


@pytest.mark.parametrize("app", ["memcached", "nginx", "mongodb"])
def test_profile_is_the_calibrations_coco_table1_experiment(app):
    """The profile measures CoCo Table 1 exactly as the calibration does: the calibration's own
    set-ups (env.sim.fit.coco_setups: pinning, threads, overrides, full resources but one limit) run
    through the profile's measurement (same load grids, 60 s window, P(meet) >= 1/2) give the profile's
    SL_full and retentions to the last bit. Nothing here depends on the fitted app parameters."""
    from env.sim import fit as F

    prof, cfg = _table1_profile(app)
    setups = F.coco_setups(app)
    sl_full, found = measure_retention(setups[0], setups[1:], cfg)
    assert prof.sl_full == pytest.approx(sl_full, rel=1e-12) and sl_full > 0
    assert [prof.retention[s] for s in _table1_states()] == pytest.approx(found, abs=1e-12)
    ways = [prof.retention[(w, 100)] for w in range(1, 21)]
    assert all(b >= a - 0.02 for a, b in itertools.pairwise(ways))  # more ways never hurt
    assert prof.retention[(20, 100)] == 1.0 and prof.slowdown(20, 100, 100.0) == 1.0
    assert prof.slowdown(1, 10, 100.0) > prof.slowdown(9, 50, 100.0) > 1.0
    assert len(prof.retention) == 20 * 10  # every (ways, MBA) step of the platform
    assert prof.cost_s == prof.points * 90.0 and prof.points > 200 * 5


def test_profile_agrees_with_coco_sim_within_the_calibration_grid_cells():
    """`env.sim.fit.coco_sim` (the calibration's analytic Table 1, `evaluate.py calibrate`'s quick
    view) runs the same experiment but locates each max load on its own geometric grid COCO_LOADS,
    whose cells are 4.2% wide; its retentions are ratios of two such crossings, so they differ from
    the profile's finer ones by up to ~8 points near 100% (e.g. memcached MBA 60%: 92.0 vs 94.8). Like
    with like is therefore the crossing itself: each profile crossing (SL_full, and SL_S = retention x
    SL_full) lies in the COCO_LOADS cell where the calibration finds it, give or take the profile's own
    resolution (1% of SL_full per state; SL_full's refined cell)."""
    from env.sim import fit as F
    from env.sim.experiments import analytic_max_load, analytic_meet

    app = "memcached"
    prof, cfg = _table1_profile(app)
    g = F.COCO_LOADS
    x = analytic_max_load(analytic_meet(F.coco_setups(app), g), g)  # what coco_sim divides
    keys = [f"cat{k}" for _, k in F.COCO_CAT] + [f"mba{p}" for _, p in F.COCO_MBA]
    cal = F.coco_sim(app)
    assert [100 * v / x[0] for v in x[1:]] == pytest.approx([cal[k] for k in keys], rel=1e-12)
    ratio = (cfg.full_grid_hi / cfg.full_grid_lo) ** (1 / (cfg.full_grid_points - 1))
    full_res = prof.sl_full * (ratio - 1) / (cfg.full_refine_points - 1)
    state_res = prof.sl_full / 100.0  # the state grid's 1% step

    def assert_in_cell(profiled: float, calibrated: float, res: float, what: str) -> None:
        j = int(np.searchsorted(g, calibrated))
        lo, hi = g[max(j - 1, 0)], g[j]
        assert lo - res <= profiled <= hi + res, (
            f"{what}: {profiled:.4f} outside [{lo:.4f}, {hi:.4f}] +- {res:.4f}"
        )

    assert_in_cell(prof.sl_full, x[0], full_res, "SL_full")
    for k, state, xc in zip(keys, _table1_states(), x[1:]):
        assert_in_cell(prof.retention[state] * prof.sl_full, xc, state_res + full_res, k)


# ---- rule 3: Eq. 2, MQ-WRR and round-robin -----------------------------------------------------------
def test_eq2_weights():
    w = eq2_weights({"a": 3.0, "b": 1.0})
    assert w == {"a": 0.75, "b": 0.25}


def test_wrr_long_run_shares_follow_eq2():
    w = eq2_weights({"a": 3.0, "b": 1.0})
    wrr = Mqwrr({1: w, 2: w})  # two singleton working sets: the larger CLOS 2 goes by Eq. 2
    seq = [wrr.next_slice(["a", "b"]) for _ in range(40)]
    assert sum(s == {"a": 2, "b": 1} for s in seq) == 30 and sum(s == {"a": 1, "b": 2} for s in seq) == 10
    assert max(len(list(g)) for g in _runs(seq)) <= 3  # smooth: never a long run of one app


def test_working_sets_hold_every_admitted_workload():
    """Choice a: singletons in the largest CLOSes when N <= K, else N // K (+1 for the larger)."""
    assert working_set_sizes(2, 3) == {1: 0, 2: 1, 3: 1}
    assert working_set_sizes(6, 3) == {1: 2, 2: 2, 3: 2}
    assert working_set_sizes(5, 3) == {1: 1, 2: 2, 3: 2}
    assert working_set_sizes(7, 3) == {1: 2, 2: 2, 3: 3}
    assert assignable(["a", "b"], {"a": {3}, "b": {3}}, {1: 1, 3: 2})
    assert not assignable(["a", "b"], {"a": {3}, "b": {3}}, {1: 1, 3: 1})


def test_wrr_places_a_workload_only_where_it_is_eligible():
    """Rule 6: with eligibility, MQ-WRR never puts a workload in a CLOS that cannot serve its load,
    and still places every workload (it looks ahead so that nobody is left without a place)."""
    apps = list(APPS)
    wrr = Mqwrr({c: eq2_weights(dict.fromkeys(apps, 1.0)) for c in (1, 2, 3)})
    elig = {a: ({2, 3} if a.startswith("mongodb") else {1, 2, 3}) for a in apps}
    elig["memcached-1"] = {3}
    for _ in range(30):
        ws = wrr.next_slice(apps, elig)
        assert set(ws) == set(apps) and sorted(ws.values()) == [1, 1, 2, 2, 3, 3]
        assert all(ws[a] in elig[a] for a in apps)


def _runs(seq):
    import itertools

    return [list(g) for _, g in itertools.groupby(seq)]


def test_wrr_multi_level_preference_and_no_starvation():
    apps = list(APPS)
    slow = {a: (4.0 if a.startswith("mongodb") else 1.0) for a in apps}
    wrr = Mqwrr({c: eq2_weights(slow) for c in (1, 2, 3)})
    seen = {a: set() for a in apps}
    big = dict.fromkeys(apps, 0)
    for k in range(60):
        ws = wrr.next_slice(apps)
        assert sorted(ws.values()) == [1, 1, 2, 2, 3, 3]  # 6 workloads, 3 LC CLOSes: pairs
        for a, c in ws.items():
            seen[a].add(c)
            big[a] += c == 3
        if k >= len(apps):
            assert all(seen[a] for a in apps)  # nobody starves
    assert big["mongodb-1"] > 2 * big["memcached-1"]  # high slowdown -> the largest CLOS more often
    shares = wrr.shares(apps, 120)
    assert shares["mongodb-1"][1] < shares["memcached-1"][1]  # ... and the smallest less often
    assert sum(shares["nginx-2"].values()) == pytest.approx(1.0)


def test_round_robin_rotates_through_every_clos():
    apps = list(APPS)
    visits = {a: set() for a in apps}
    for p in range(0, len(apps), 2):  # the controller advances by one working set per slice
        ws = round_robin(apps, 3, p)
        assert sorted(ws.values()) == [1, 1, 2, 2, 3, 3]
        assert ws["memcached-1"] == ws["memcached-2"]  # companions move together
        for a in apps:
            visits[a].add(ws[a])
    assert all(v == {1, 2, 3} for v in visits.values())  # never parked in the reserved CLOS


# ---- the controller on hand-built observations ------------------------------------------------------
def test_slices_place_singletons_and_keep_cat_with_mba(caps):
    ctrl = controller(caps)
    for d, alloc in drive(ctrl, caps, 12):
        assert "admission_reject" not in d.signals  # light loads: everyone is admitted
        for a in alloc:
            assert (a.llc_ways, a.mba_pct) == FIG2_CLOSES[a.clos]  # a CLOS moves with both settings
            assert a.cores == 2.0 and a.core_group != 0
        assert sorted(a.clos for a in alloc) == [1, 1, 2, 2, 3, 3]  # pairs, nobody in the reserved CLOS
    assert ctrl.slices == 12 and ctrl.migrations > 0
    assert "profiling cost" in drive(controller(caps), caps, 1)[0][0].reason


def test_migrations_are_counted(caps):
    ctrl = controller(caps)
    prev = None
    moved = 0
    for _, alloc in drive(ctrl, caps, 10):
        if prev is not None:
            moved += sum(prev[a].clos != alloc[a].clos for a in APPS)
        prev = alloc
    assert ctrl.migrations == moved > 0


def test_slice_length_holds_the_allocation(caps):
    ctrl = controller(caps, dataclasses.replace(load_coco_config("coco"), slice_intervals=3))
    decisions = [d for d, _ in drive(ctrl, caps, 9)]
    assert [d.allocation is not None for d in decisions] == [True, False, False] * 3
    assert ctrl.slices == 3


def test_admission_control_rejects_and_readmits(caps):
    """Rule 6: a workload whose load exceeds what any schedule affords is rejected (it stays in the
    reserved CLOS, signalled), and re-admitted once its load fits again."""
    ctrl = controller(caps)
    heavy = {"nginx-1": 2e5}  # twice its SL_full: no share of any CLOS can serve it
    out = drive(ctrl, caps, 8, heavy)
    for d, alloc in out:
        assert alloc["nginx-1"].clos == RESERVED_CLOS
        assert d.signals.get("admission_reject") == "nginx-1"
    assert "rejects nginx-1" in out[0][0].reason
    assert ctrl.weights(ctrl._admitted)[3].keys() == set(APPS) - {"nginx-1"}
    # a failed feed for nginx-1 keeps its last known load (and the verdict)
    obs = observation(caps, 4.5, out[-1][1], heavy)
    dead = tuple(
        dataclasses.replace(x, valid=False, p99_us=math.nan, load_rps=math.nan) if x.name == "nginx-1" else x
        for x in obs.apps
    )
    assert ctrl.decide(dataclasses.replace(obs, apps=dead)).signals.get("admission_reject") == "nginx-1"
    back = drive(ctrl, caps, 8, {"nginx-1": 1e3}, t0=10.0)
    assert "re-admits nginx-1" in back[0][0].reason and not back[0][0].signals
    assert any(alloc["nginx-1"].clos != RESERVED_CLOS for _, alloc in back)


def test_light_loads_admit_everyone(caps):
    ctrl = controller(caps)
    for d, _ in drive(ctrl, caps, 6, dict.fromkeys(APPS, 1e3)):
        assert "admission_reject" not in d.signals
    assert ctrl._admitted == list(APPS)


def test_member_state_splits_the_ways_of_a_working_set(caps):
    """Choice a: with 6 workloads on 3 LC CLOSes each one is allocated half of its CLOS's ways (at
    the CLOS's MBA level); alone in a CLOS, all of them."""
    ctrl = controller(caps)
    assert [ctrl.member_state(c, 6) for c in (1, 2, 3)] == [(1, 10), (3, 30), (4, 50)]
    assert [ctrl.member_state(c, 3) for c in (1, 2, 3)] == [(3, 10), (6, 30), (9, 50)]
    assert ctrl.sl_rps("nginx-1", 3, 6) == pytest.approx(ctrl.profiles["nginx-1"].retention[(4, 50)] * 1e5)


def test_a_workload_never_runs_where_its_load_is_not_sustained(caps):
    """Rule 6: at a load the smaller CLOSes' member states cannot serve, the sensitive workload is
    kept in the largest CLOS (time-sharing degenerates to what the SLOs allow), nobody is rejected."""
    ctrl = controller(caps, sens={a: (1.5 if a == "mongodb-1" else 0.5) for a in APPS})
    load = 0.2 * 1e5  # above mongodb-1's member states in CLOS 1 and 2, below CLOS 3's
    assert ctrl.sl_rps("mongodb-1", 2, 6) < load <= ctrl.sl_rps("mongodb-1", 3, 6)
    for d, alloc in drive(ctrl, caps, 12, {"mongodb-1": load}):
        assert "admission_reject" not in d.signals
        assert alloc["mongodb-1"].clos == 3
    assert ctrl.migrations > 0  # the others still rotate


def test_round_robin_controller_has_no_profile_and_rotates(caps):
    ctrl = build_coco("coco-rr", caps, None)  # no scenario: round-robin needs no profile
    ctrl.reset(caps, np.random.default_rng(0))
    assert ctrl.profiles == {} and ctrl.profile_cost_s == 0.0
    ((_, first),) = drive(ctrl, caps, 1)
    assert sorted(a.clos for a in first) == [1, 1, 2, 2, 3, 3]
    seen = {a: set() for a in APPS}
    for d, alloc in drive(ctrl, caps, 6, {"nginx-1": 1e9}, t0=1.0):  # no admission control at any load
        assert not d.signals
        for a in APPS:
            seen[a].add(alloc[a].clos)
    assert all(len(v) >= 3 for v in seen.values())


def test_nopart_is_one_clos_with_everything(caps):
    ctrl = controller(caps, load_coco_config("coco-nopart"))
    (_d, alloc), (d2, _) = drive(ctrl, caps, 2)
    assert {(a.clos, a.llc_ways, a.mba_pct) for a in alloc} == {(0, 20, 100)}
    assert [a.core_group for a in alloc] == [1, 2, 3, 4, 5, 6] and {a.cores for a in alloc} == {2.0}
    assert d2.allocation is None  # then holds


def test_be_jobs_run_in_the_reserved_clos():
    caps = load_platform("coco").capabilities(
        [AppSpec("memcached", "lc", 600.0, 1e6), AppSpec("nginx", "lc", 1e4, 5e5), AppSpec("be", "be")]
    )
    plan = clos_plan(caps, load_coco_config("coco"))
    alloc = build_allocation(caps, {"memcached": 3, "nginx": RESERVED_CLOS}, plan, 4.0)
    validate_allocation(alloc, caps)
    assert (alloc["be"].clos, alloc["be"].cores) == (RESERVED_CLOS, 8.0)
    assert alloc["nginx"].clos == alloc["be"].clos and alloc["nginx"].core_group != alloc["be"].core_group


def test_invalid_observation_keeps_the_schedule(caps):
    ctrl = controller(caps)
    alloc = unmanaged_allocation(caps)
    obs = observation(caps, 0.5, alloc)
    dead = tuple(dataclasses.replace(s, p99_us=math.nan, valid=False) for s in obs.apps)
    d = ctrl.decide(dataclasses.replace(obs, apps=dead))
    assert d.allocation is not None and ctrl.slices == 1


# ---- short runs on SimNodes ---------------------------------------------------------------------------
def test_fig2_scenario_short_run_time_shares_the_closes():
    """CoCo Sec. 3.2 (MQ-WRR): six containers over three LC CLOSes; every container stays in an LC
    partition, and CLOSes are time-shared: a CLOS hosts different workloads over the run (which ones
    rotate follows the profiled slowdowns' weights)."""
    fig2 = load_scenario("coco-fig2")
    caps = SimNode(fig2, seed=0).capabilities()  # starts from the fair split: 6 LC apps share 4 CLOSes
    profiles, cost = profile_scenario(fig2, caps, load_coco_config("coco"))
    assert cost > 3600  # profiling is not free: hours of simulated load tests
    assert len({id(p) for p in profiles.values()}) == 3  # one profile per workload, not per instance
    assert profiles["mongodb-1"] is profiles["mongodb-2"]
    assert cost == pytest.approx(sum(profiles[a].cost_s for a in APPS[::2]))
    # every container at 5% of what it serves alone on its cores: a load every schedule affords
    scn = fig2.with_loads({a: min(0.05 * profiles[a].sl_full, 5.0) for a in APPS})
    node = SimNode(scn, seed=0)
    ctrl = make_controller("coco", ControllerContext(caps, scn, node, 0))
    ctrl.reset(caps, np.random.default_rng(0))
    assert ctrl.profile_cost_s == cost
    visits = {a: set() for a in APPS}
    hosts: dict[int, set[str]] = {}  # CLOS -> workloads it held
    obs = node.observe()
    for _ in range(24):
        d = ctrl.decide(obs)
        assert "admission_reject" not in d.signals
        obs = node.step(d.allocation)
        for a in obs.allocation:
            visits[a.name].add(a.clos)
            hosts.setdefault(a.clos, set()).add(a.name.rsplit("-", 1)[0])
    assert all(v <= {1, 2, 3} for v in visits.values())  # every container always in an LC partition
    assert any(len(w) >= 2 for w in hosts.values())  # a CLOS time-shared between workloads
    assert sum(len(v) >= 2 for v in visits.values()) >= 2  # containers rotate among CLOSes
    assert ctrl.migrations >= 24


def test_runs_through_the_registry_on_the_parties_node():
    """CoCo on the contract tests' node (PARTIES platform, 3 LC apps + BE, no MBA)."""
    scn = simple_scenario({"memcached": 0.2, "xapian": 0.1, "nginx": 0.2})
    for spec in ("coco", "coco-rr", "coco-nopart"):
        node = SimNode(scn, seed=0)
        ctrl = make_controller(spec, ControllerContext(node.capabilities(), scn, node, 0))
        ctrl.reset(node.capabilities(), np.random.default_rng(0))
        obs = node.observe()
        for _ in range(10):
            d = ctrl.decide(obs)
            if d.allocation is not None:
                validate_allocation(d.allocation, node.capabilities())
                assert {a.mba_pct for a in d.allocation} == {100}
            obs = node.step(d.allocation)
        assert obs.allocation["be_parties"].clos == RESERVED_CLOS
