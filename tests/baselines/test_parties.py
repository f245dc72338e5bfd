"""PARTIES' state machine (Sec. 4, Alg. 1-4) on hand-built observations.

Observations start from a real SimNode observation (memcached + xapian + nginx + the BE job, in
PARTIES' fair allocation) whose p99s, usages, allocation and time are then replaced, so each test
states exactly what the controller sees.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from baselines.parties import PartiesConfig, PartiesController, load_parties_config
from env.allocations import fair_allocation
from env.config import ConfigError, build
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import (
    Allocation,
    Decision,
    Direction,
    Move,
    Observation,
    Resource,
    validate_allocation,
)

LC = ("memcached", "xapian", "nginx")
BE = "be_parties"
COMPUTE = (Resource.CORE, Resource.CACHE, Resource.FREQ)
STORAGE = (Resource.MEM, Resource.DISK)
INBAND = 0.1  # a slack between the upsize (0.05) and downsize (0.2) thresholds


@pytest.fixture(scope="module")
def base():
    node = SimNode(simple_scenario({"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}), seed=0)
    obs = node.observe()
    assert obs.allocation == fair_allocation(node.capabilities())
    return obs, node.capabilities()


def make_obs(
    base_obs: Observation,
    t: float,
    alloc: Allocation | None = None,
    slacks: dict[str, float] | None = None,
    mem_used: dict[str, float] | None = None,
    disk_used: dict[str, float] | None = None,
    net_used: dict[str, float] | None = None,
    interval_s: float = 0.5,
    subs: dict[str, list[float]] | None = None,
) -> Observation:
    """`base_obs` at time `t` with `alloc`, the given slacks (default in band) and usages. Network
    use defaults to 0.75 Gbps under each app's limit: inside PARTIES' [0.5, 1] Gbps dead band.
    `subs` gives an app's five 100 ms sub-interval slacks (NaN: no request); by default every
    sub-interval has the interval's slack."""
    alloc = alloc or base_obs.allocation
    slacks = slacks or {}
    apps = []
    for s in base_obs.apps:
        u = s.usage
        u = dataclasses.replace(
            u,
            memory_gb=(mem_used or {}).get(s.name, u.memory_gb),
            disk_mbps=(disk_used or {}).get(s.name, 0.0),
            net_gbps=(net_used or {}).get(s.name, max(alloc[s.name].net_gbps - 0.75, 0.0)),
        )
        p99 = s.target_us * (1.0 - slacks.get(s.name, INBAND))
        sub = [s.target_us * (1.0 - x) for x in (subs or {}).get(s.name, [slacks.get(s.name, INBAND)] * 5)]
        apps.append(dataclasses.replace(s, p99_us=p99, usage=u, sub_p99_us=tuple(sub)))
    return dataclasses.replace(base_obs, time_s=t, interval_s=interval_s, apps=tuple(apps), allocation=alloc)


def make_ctrl(caps, seed: int = 0, variant: str | None = None, **cfg) -> PartiesController:
    ctrl = PartiesController(dataclasses.replace(load_parties_config(variant), **cfg))
    ctrl.reset(caps, np.random.default_rng(seed))
    return ctrl


def applied(decision: Decision, alloc: Allocation) -> Allocation:
    return alloc if decision.allocation is None else decision.allocation


def moved(before: Allocation, after: Allocation) -> set[tuple[str, Resource]]:
    """(app, resource) pairs whose amount differs (the ten-move resources only)."""
    return {(a.name, r) for a in before for r in Resource if a.amount(r) != after[a.name].amount(r)}


def successor(res: Resource) -> Resource:
    wheel = COMPUTE if res in COMPUTE else STORAGE
    return wheel[(wheel.index(res) + 1) % len(wheel)]


# ---- configuration ---------------------------------------------------------------------------------
def test_yaml_config_is_the_papers_constants_and_strict():
    cfg = load_parties_config()
    assert cfg == PartiesConfig()
    assert (cfg.upsize_slack_below, cfg.downsize_slack_above, cfg.downsize_ban_s, cfg.migration_after_s) == (
        0.05,
        0.2,
        30.0,
        60.0,
    )
    with pytest.raises(ConfigError, match="unknown key"):
        build(PartiesConfig, {"upsize_slack": 0.1}, "parties.yaml")
    for wheels in ({"storage_wheel": ["mem", "core"]}, {"compute_wheel": []}):
        with pytest.raises(ConfigError, match="distinct resources"):
            build(PartiesConfig, wheels, "parties.yaml")


# ---- Alg. 1 --------------------------------------------------------------------------------------------
def test_first_decision_moves_the_node_to_the_fair_allocation(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    skewed = obs.allocation.replace_app("memcached", cores=6.0).replace_app(BE, cores=0.0)
    d = ctrl.decide(make_obs(obs, 0.5, skewed))
    assert d.allocation == fair_allocation(caps)
    # already fair: no initialization step, the first decision is a PARTIES interval (all in band)
    ctrl2 = make_ctrl(caps)
    d2 = ctrl2.decide(make_obs(obs, 0.5))
    assert d2.allocation is None and d2.move is Move.HOLD


def test_upsizes_the_app_with_the_smallest_slack_below_005(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    d = ctrl.decide(make_obs(obs, 0.5, slacks={"memcached": 0.03, "xapian": -0.4, "nginx": 0.6}))
    assert d.app == "xapian" and d.move.direction is Direction.UP
    changed = moved(obs.allocation, d.allocation)
    assert ("xapian", d.move.resource) in changed
    if d.move.resource is not Resource.FREQ:
        # Alg. 4: from the BE job first; where it is at its minimum, from the LC app with most slack
        victim = BE if obs.allocation.move_feasible("xapian", d.move, caps, BE) else "nginx"
        assert changed == {("xapian", d.move.resource), (victim, d.move.resource)}


def test_downsizes_the_app_with_the_largest_slack_above_02(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    d = ctrl.decide(make_obs(obs, 0.5, slacks={"memcached": 0.3, "xapian": INBAND, "nginx": 0.7}))
    assert d.app == "nginx" and d.move.direction is Direction.DOWN
    assert ("nginx", d.move.resource) in moved(obs.allocation, d.allocation)


def test_holds_when_every_slack_is_in_band(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    for k in range(1, 5):
        d = ctrl.decide(make_obs(obs, 0.5 * k, slacks={"memcached": 0.06, "xapian": 0.19, "nginx": INBAND}))
        assert d.allocation is None and d.move is Move.HOLD


# ---- Alg. 3: revert + 30 s ban ------------------------------------------------------------------------
def test_reverts_a_downsize_that_drops_slack_under_005_and_bans_the_app_for_30s(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    a0 = obs.allocation
    d1 = ctrl.decide(make_obs(obs, 0.5, a0, slacks={"nginx": 0.6}))
    assert d1.app == "nginx" and d1.move.direction is Direction.DOWN
    down = d1.move
    a1 = d1.allocation
    # the next interval: nginx's slack fell to 0.02 -> revert (this interval's one adjustment)
    d2 = ctrl.decide(make_obs(obs, 1.0, a1, slacks={"nginx": 0.02}))
    assert d2.app == "nginx" and d2.move is down.opposite
    assert d2.allocation["nginx"].amount(down.resource) == a0["nginx"].amount(down.resource)
    assert "revert" in d2.reason
    a2 = d2.allocation
    # nginx has lots of slack again, but it may not be downsized for 30 s
    t = 1.5
    while t < 1.0 + 30.0 - 1e-9:
        d = ctrl.decide(make_obs(obs, t, a2, slacks={"nginx": 0.6}))
        assert d.allocation is None and d.move is Move.HOLD, t
        t += 0.5
    d = ctrl.decide(make_obs(obs, 31.0, a2, slacks={"nginx": 0.6}))
    assert d.app == "nginx" and d.move.direction is Direction.DOWN
    # after the revert the DOWN action moved on to the next resource of its wheel (Alg. 3)
    assert d.move.resource is successor(down.resource)


def test_a_banned_app_leaves_downsizing_to_the_next_largest_slack(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.0}))
    assert d2.move is d1.move.opposite
    d3 = ctrl.decide(make_obs(obs, 1.5, d2.allocation, slacks={"nginx": 0.6, "xapian": 0.3}))
    assert d3.app == "xapian" and d3.move.direction is Direction.DOWN


def test_a_downsize_that_keeps_slack_is_kept_and_repeated(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.4}))
    assert d2.app == "nginx" and d2.move is d1.move  # same resource again (Alg. 3: no revert)


def test_an_adjustment_the_node_did_not_apply_is_not_judged(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    assert d1.move.direction is Direction.DOWN
    # a guard dropped the change: nginx's low slack is not blamed on it, so no ban follows
    d2 = ctrl.decide(make_obs(obs, 1.0, obs.allocation, slacks={"nginx": 0.02}))
    assert "revert" not in d2.reason and d2.move.direction is Direction.UP
    d3 = ctrl.decide(make_obs(obs, 1.5, obs.allocation, slacks={"nginx": 0.6}))
    assert d3.app == "nginx" and d3.move.direction is Direction.DOWN


# ---- Alg. 2 and the wheels ------------------------------------------------------------------------
def test_upsize_keeps_a_resource_that_lowered_latency_and_moves_on_when_it_did_not(base):
    obs, caps = base
    ctrl = make_ctrl(caps, seed=3)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"xapian": -0.5}))
    r1 = d1.move.resource
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"xapian": -0.3}))  # p99 fell
    assert d2.app == "xapian" and d2.move is d1.move
    d3 = ctrl.decide(make_obs(obs, 1.5, d2.allocation, slacks={"xapian": -0.3}))  # p99 did not fall
    assert d3.app == "xapian" and d3.move is Move.of(Direction.UP, successor(r1))


def _first_up_resource(obs, caps, seed: int) -> Resource:
    ctrl = make_ctrl(caps, seed=seed)
    return ctrl.decide(make_obs(obs, 0.5, slacks={"xapian": -0.5})).move.resource


def test_random_entry_comes_from_the_reset_rng_and_picks_a_wheel_then_a_state(base):
    obs, caps = base
    firsts = [_first_up_resource(obs, caps, s) for s in range(300)]
    assert firsts[:20] == [_first_up_resource(obs, caps, s) for s in range(20)]  # seeded
    counts = {r: firsts.count(r) for r in Resource}
    assert all(c > 0 for c in counts.values())
    storage = (counts[Resource.MEM] + counts[Resource.DISK]) / len(firsts)
    # a random wheel first: storage's two states get half the entries, not 2/5 of them
    assert 0.42 < storage < 0.58


def _seed_entering(obs, caps, wheel) -> int:
    return next(s for s in range(100) if _first_up_resource(obs, caps, s) in wheel)


def _failing_upsizes(ctrl, obs, n: int, mem_used: dict[str, float] | None = None) -> list[Move]:
    """n upsizes of xapian whose latency never improves; returns the moves taken."""
    alloc, out = obs.allocation, []
    for k in range(n):
        used = {"xapian": alloc["xapian"].memory_gb - mem_used["xapian"]} if mem_used else None
        d = ctrl.decide(make_obs(obs, 0.5 * (k + 1), alloc, slacks={"xapian": -0.5}, mem_used=used))
        assert d.app == "xapian"
        out.append(d.move)
        alloc = d.allocation
    return out


@pytest.mark.parametrize(("mem_slack_gb", "expect_storage"), [(20.0, False), (0.5, True)])
def test_after_a_compute_turn_memory_slack_picks_another_round_or_the_storage_wheel(
    base, mem_slack_gb, expect_storage
):
    obs, caps = base
    ctrl = make_ctrl(caps, seed=_seed_entering(obs, caps, COMPUTE))
    moves = _failing_upsizes(ctrl, obs, 4, mem_used={"xapian": mem_slack_gb})
    turn = [m.resource for m in moves[:3]]
    assert sorted(turn, key=COMPUTE.index) == list(COMPUTE)  # one full turn of the compute wheel
    assert all(b is successor(a) for a, b in itertools.pairwise(turn))
    if expect_storage:  # memory almost saturated: jump to the storage wheel (Sec. 4.2.3)
        assert moves[3] is Move.UP_MEM
    else:  # memory slack is large: another compute round
        assert moves[3] is Move.of(Direction.UP, successor(turn[2]))


def test_after_a_storage_turn_upsizing_moves_to_the_compute_wheel(base):
    obs, caps = base
    ctrl = make_ctrl(caps, seed=_seed_entering(obs, caps, STORAGE))
    moves = _failing_upsizes(ctrl, obs, 3)
    assert {moves[0].resource, moves[1].resource} == set(STORAGE)
    assert moves[2].resource in COMPUTE


def test_direction_change_enters_the_up_wheels_afresh(base):
    obs, caps = base
    ctrl = make_ctrl(caps, seed=5)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"xapian": 0.6}))
    assert d1.move.direction is Direction.DOWN
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"xapian": -0.2}))
    assert d2.app == "xapian" and d2.move.direction is Direction.UP


# ---- skipped states (Sec. 4.2.3) ----------------------------------------------------------------------
def test_a_state_at_the_max_of_its_resource_is_skipped(base):
    obs, caps = base
    ctrl = make_ctrl(caps, fair_start=False)
    turbo = obs.allocation.replace_app("xapian", freq_mhz=caps.freq_levels_mhz[-1])
    ctrl._state["xapian"].action, ctrl._state["xapian"].turn = Move.UP_FREQ, 1
    d = ctrl.decide(make_obs(obs, 0.5, turbo, slacks={"xapian": -0.5}))
    assert d.move is Move.UP_CORE  # FREQ is at turbo: next_action is called again


def test_a_state_at_the_min_of_its_resource_is_skipped(base):
    obs, caps = base
    ctrl = make_ctrl(caps, fair_start=False)
    one_core = obs.allocation.replace_app("nginx", cores=caps.core_step)
    ctrl._state["nginx"].action, ctrl._state["nginx"].turn = Move.DOWN_CORE, 1
    d = ctrl.decide(make_obs(obs, 0.5, one_core, slacks={"nginx": 0.6}))
    assert d.move is Move.DOWN_CACHE


@pytest.mark.parametrize(
    ("app", "mem_slack_gb", "expected"),
    [
        ("memcached", 0.5, Move.DOWN_DISK),  # in-memory, < 1 GB memory slack: <DOWN,MEM> skipped
        ("memcached", 5.0, Move.DOWN_MEM),  # in-memory with room to spare
        ("nginx", 0.5, Move.DOWN_MEM),  # does disk I/O: not in-memory, the exception does not apply
    ],
)
def test_in_memory_apps_skip_mem_down_under_1gb_memory_slack(base, app, mem_slack_gb, expected):
    obs, caps = base
    ctrl = make_ctrl(caps)
    disk = {"nginx": 5.0}
    ctrl.decide(make_obs(obs, 0.5, disk_used=disk))
    ctrl.decide(make_obs(obs, 1.0, disk_used=disk))  # the first second: nginx did I/O, memcached did not
    ctrl._state[app].action, ctrl._state[app].turn = Move.DOWN_MEM, 1
    used = {app: obs.allocation[app].memory_gb - mem_slack_gb}
    d = ctrl.decide(make_obs(obs, 1.5, slacks={app: 0.6}, mem_used=used, disk_used=disk))
    assert d.app == app and d.move is expected


@pytest.mark.parametrize("hint", [None, False])
def test_in_memory_apps_are_detected_online_from_disk_io_in_the_first_second(base, hint):
    obs, caps = base
    hinted = dataclasses.replace(caps, apps=tuple(dataclasses.replace(a, in_memory=hint) for a in caps.apps))
    ctrl = PartiesController(PartiesConfig())
    ctrl.reset(hinted, np.random.default_rng(0))
    disk = {"nginx": 5.0}  # nginx touches the disk in its first second, xapian does not
    ctrl.decide(make_obs(obs, 0.5, disk_used=disk))
    assert ctrl._state["xapian"].in_memory is None  # still probing
    ctrl.decide(make_obs(obs, 1.0, disk_used=disk))
    # the online test decides, whatever the (absent or False) hint says
    assert ctrl._state["xapian"].in_memory is True and ctrl._state["nginx"].in_memory is False
    ctrl.decide(make_obs(obs, 1.5, disk_used={"xapian": 30.0}))  # later I/O does not reclassify
    assert ctrl._state["xapian"].in_memory is True
    results = {}
    for app in ("xapian", "nginx"):
        ctrl._state[app].action, ctrl._state[app].turn = Move.DOWN_MEM, 1
        used = {app: obs.allocation[app].memory_gb - 0.5}
        d = ctrl.decide(make_obs(obs, 2.0 if app == "xapian" else 3.0, slacks={app: 0.6}, mem_used=used))
        results[app] = d.move
        ctrl._pending = None
    assert results == {"xapian": Move.DOWN_DISK, "nginx": Move.DOWN_MEM}


# ---- Alg. 4: victims and anti-ping-pong -------------------------------------------------------------------
def _no_be_room(obs, caps) -> Allocation:
    """Nothing idle and the BE job at zero cores: a CORE UP move must take from an LC app."""
    a = obs.allocation
    return a.replace_app(BE, cores=0.0).replace_app("nginx", cores=a["nginx"].cores + a[BE].cores)


def test_the_victim_is_the_lc_app_with_most_slack_and_its_same_action_advances(base):
    obs, caps = base
    ctrl = make_ctrl(caps, fair_start=False)
    alloc = _no_be_room(obs, caps)
    ctrl._state["xapian"].action, ctrl._state["xapian"].turn = Move.UP_CORE, 1
    ctrl._state["nginx"].action, ctrl._state["nginx"].turn = Move.UP_CORE, 1
    d = ctrl.decide(make_obs(obs, 0.5, alloc, slacks={"xapian": -0.5, "memcached": 0.12, "nginx": 0.15}))
    assert d.app == "xapian" and d.move is Move.UP_CORE
    assert moved(alloc, d.allocation) == {("xapian", Resource.CORE), ("nginx", Resource.CORE)}
    assert ctrl._state["nginx"].action is Move.UP_CACHE  # ping-pong broken (Alg. 4)
    assert ctrl._state["memcached"].action is None  # not the victim: untouched


def test_a_victim_with_another_action_keeps_it(base):
    obs, caps = base
    ctrl = make_ctrl(caps, fair_start=False)
    alloc = _no_be_room(obs, caps)
    ctrl._state["xapian"].action, ctrl._state["xapian"].turn = Move.UP_CORE, 1
    ctrl._state["nginx"].action, ctrl._state["nginx"].turn = Move.UP_FREQ, 1
    d = ctrl.decide(make_obs(obs, 0.5, alloc, slacks={"xapian": -0.5, "nginx": 0.15}))
    assert d.app == "xapian" and moved(alloc, d.allocation) == {
        ("xapian", Resource.CORE),
        ("nginx", Resource.CORE),
    }
    assert ctrl._state["nginx"].action is Move.UP_FREQ


# ---- migration (Alg. 1, Sec. 4.2.1) -----------------------------------------------------------------------
def _violate(ctrl, obs, t0: float, seconds: float, slacks) -> list[tuple[float, dict]]:
    signals, alloc, t = [], obs.allocation, t0
    while t < t0 + seconds - 1e-9:
        t += 0.5
        d = ctrl.decide(make_obs(obs, t, alloc, slacks=slacks))
        alloc = applied(d, alloc)
        if d.signals:
            signals.append((t, dict(d.signals)))
    return signals


def test_migration_is_requested_after_60s_of_unmet_qos_for_a_stateless_app(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    sig = _violate(ctrl, obs, 0.0, 75.0, {"memcached": -0.3})
    # xapian (5 ms) and nginx (10 ms) are stateless; nginx has the more relaxed target
    assert sig == [(60.0, {"migrate": "nginx"})]


def test_migration_picks_the_most_relaxed_target_when_all_apps_are_stateful(base):
    obs, caps = base
    stateful = dataclasses.replace(
        caps, apps=tuple(dataclasses.replace(a, stateless=False) for a in caps.apps)
    )
    ctrl = PartiesController(PartiesConfig())
    ctrl.reset(stateful, np.random.default_rng(0))
    sig = _violate(ctrl, obs, 0.0, 60.0, {"xapian": -0.3})
    assert sig == [(60.0, {"migrate": "nginx"})]


def test_the_migration_timer_resets_when_qos_is_met(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    assert _violate(ctrl, obs, 0.0, 50.0, {"memcached": -0.3}) == []
    assert _violate(ctrl, obs, 50.0, 0.5, {}) == []  # one interval with every target met
    assert _violate(ctrl, obs, 50.5, 50.0, {"memcached": -0.3}) == []


# ---- network (Sec. 4.2.1) -----------------------------------------------------------------------------
def test_network_bandwidth_is_adjusted_every_interval_beside_the_move(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    a0 = obs.allocation
    net = {"memcached": a0["memcached"].net_gbps - 1.5, "xapian": a0["xapian"].net_gbps - 0.2}
    d = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}, net_used=net))
    a1 = d.allocation
    assert a1["memcached"].net_gbps == pytest.approx(a0["memcached"].net_gbps - 0.5)  # slack > 1 Gbps
    assert a1["xapian"].net_gbps == pytest.approx(a0["xapian"].net_gbps + 0.5)  # slack < 0.5 Gbps
    assert a1["nginx"].net_gbps == a0["nginx"].net_gbps  # 0.75 Gbps slack: dead band
    assert sum(a.net_gbps for a in a1) <= caps.net_gbps + 1e-9
    assert d.app == "nginx" and d.move.direction is Direction.DOWN  # the move is still made
    # and again on the next interval
    net2 = {"xapian": a1["xapian"].net_gbps - 0.1, "memcached": a1["memcached"].net_gbps - 0.75}
    d2 = ctrl.decide(make_obs(obs, 1.0, a1, slacks={"nginx": 0.4}, net_used=net2))
    assert d2.allocation["xapian"].net_gbps == pytest.approx(a1["xapian"].net_gbps + 0.5)


def test_network_increase_takes_from_the_be_job_when_the_link_is_fully_partitioned(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    a0 = obs.allocation
    assert sum(a.net_gbps for a in a0) == pytest.approx(caps.net_gbps)
    d = ctrl.decide(make_obs(obs, 0.5, net_used={"nginx": a0["nginx"].net_gbps}))
    assert d.allocation["nginx"].net_gbps == pytest.approx(a0["nginx"].net_gbps + 0.5)
    assert d.allocation[BE].net_gbps == pytest.approx(a0[BE].net_gbps - 0.5)
    assert d.move is Move.HOLD


# ---- cadence and closed loop ------------------------------------------------------------------------
def test_decides_once_per_500ms_when_the_loop_ticks_faster(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    moves = []
    for k in range(1, 9):
        d = ctrl.decide(make_obs(obs, 0.25 * k, slacks={"xapian": -0.5}, interval_s=0.25))
        moves.append(d.move is not Move.HOLD)
    assert moves == [True, False, True, False, True, False, True, False]


def test_on_the_simulator_every_decision_is_valid_and_adjusts_one_resource(base):
    node = SimNode(simple_scenario({"memcached": 0.3, "xapian": 0.1, "nginx": 0.3}), seed=1)
    caps = node.capabilities()
    ctrl = make_ctrl(caps, seed=1)
    obs = node.observe()
    n_moves = 0
    for _ in range(120):
        d = ctrl.decide(obs)
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
            changed = moved(obs.allocation, d.allocation)
            assert len({r for _, r in changed}) <= 1 and len(changed) <= 2  # app + counterpart
            if changed:
                n_moves += 1
                assert d.app in LC and d.move is not Move.HOLD
        obs = node.step(d.allocation)
    assert n_moves > 0


def test_an_app_still_being_probed_counts_as_in_memory(base):
    obs, caps = base
    ctrl = make_ctrl(caps)
    ctrl._state["nginx"].action, ctrl._state["nginx"].turn = Move.DOWN_MEM, 1
    used = {"nginx": obs.allocation["nginx"].memory_gb - 0.5}
    d = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}, mem_used=used))  # first second: class unknown
    assert ctrl._state["nginx"].in_memory is None and d.move is Move.DOWN_DISK


def test_a_real_clocks_jitter_does_not_skip_intervals(base):
    """On a real node the loop's ticks come 0.497-0.499 s apart; PARTIES must act on each of them."""
    obs, caps = base
    ctrl = make_ctrl(caps)
    t, acted = 0.0, []
    for k in range(8):
        t += 0.497 + 0.001 * (k % 3)
        d = ctrl.decide(make_obs(obs, t, slacks={"xapian": -0.5}, interval_s=0.498))
        acted.append(d.move is not Move.HOLD)
    assert all(acted)


# ---- the NaN guard ----------------------------------------------------------------------------------------
def test_an_app_without_a_valid_slack_neither_wins_nor_hides_an_upsize(base):
    """min() over slacks with a NaN listed first returned the NaN (every comparison with it is
    false), and NaN < 0.05 is false: the violating app was never upsized."""
    obs, caps = base
    ctrl = make_ctrl(caps)
    o = make_obs(obs, 0.5, slacks={"xapian": -0.5})
    nan_first = dataclasses.replace(
        o, apps=(dataclasses.replace(o.apps[0], p99_us=float("nan")), *o.apps[1:])
    )
    assert nan_first.apps[0].name == "memcached" and nan_first.apps[0].valid
    d = ctrl.decide(nan_first)
    assert d.app == "xapian" and d.move.direction is Direction.UP


# ---- the authors' code (sc2682cornell/PARTIES, manager/PARTIES.py): parties:code, parties:code-stats -------
def test_the_code_variants_load_the_codes_constants():
    code, stats, paper = load_parties_config("code"), load_parties_config("code-stats"), load_parties_config()
    # PARTIES.py:20 INTERVAL = 0.1, :22 REST = 100 (10 s), :53 TOLERANCE = 5, :78 MLat of 1 s
    assert (code.samples, code.judge_samples, code.moving_average_s, code.downsize_ban_s) == (
        "sub_interval",
        5,
        1.0,
        10.0,
    )
    assert code.revert_scope == "any" and code.settle_after_revert  # PARTIES.py:131-157
    assert code.wheels == ((Resource.CORE, Resource.CACHE, Resource.FREQ),)  # PARTIES.py:191-211, no storage
    # code-stats: the code's statistics, the paper's ban and wheels
    assert stats == dataclasses.replace(code, downsize_ban_s=30.0, storage_wheel=("mem", "disk"))
    assert (
        dataclasses.replace(
            stats,
            samples="interval",
            judge_samples=1,
            moving_average_s=0.0,
            revert_scope="app",
            settle_after_revert=False,
        )
        == paper
    )


def _code_ctrl(caps, variant: str = "code", **cfg) -> PartiesController:
    return make_ctrl(caps, variant=variant, fair_start=False, **cfg)


def test_code_acts_only_when_the_1s_average_agrees_with_the_latest_sample(base):
    """PARTIES.py:168: upsize needs Slack < 0.05 and LSlack < 0.05 (LSlack = 1 - mean of the last
    10 samples of 100 ms / QoS, :78, 293), the smallest LSlack first."""
    obs, caps = base
    ctrl = _code_ctrl(caps)
    ctrl.decide(make_obs(obs, 0.5))  # 5 in-band samples of 0.1 slack fill half the window
    # xapian's last sample violates but its 1 s average does not: no upsize
    d = ctrl.decide(make_obs(obs, 1.0, subs={"xapian": [INBAND] * 4 + [0.0]}))
    assert d.move is Move.HOLD
    # nginx's average is now under 0.05 as well as its latest sample, xapian's latest is lower but
    # its average is not the smallest: nginx goes first
    ctrl2 = _code_ctrl(caps)
    ctrl2.decide(make_obs(obs, 0.5, subs={"nginx": [-0.2] * 5, "xapian": [0.03] * 5}))
    d = ctrl2.decide(make_obs(obs, 1.0, subs={"nginx": [-0.1] * 5, "xapian": [0.03] * 4 + [-0.5]}))
    assert d.app == "nginx" and d.move.direction is Direction.UP


def test_code_downsizes_only_when_both_slacks_exceed_02_the_largest_latest_first(base):
    """PARTIES.py:171: LDOWN == 0 and Slack > 0.2 and LSlack > 0.2, the largest Slack first."""
    obs, caps = base
    ctrl = _code_ctrl(caps)
    ctrl.decide(make_obs(obs, 0.5, subs={"nginx": [0.6] * 5, "xapian": [0.1] * 5}))
    d = ctrl.decide(make_obs(obs, 1.0, subs={"nginx": [0.6] * 5, "xapian": [0.1] * 4 + [0.9]}))
    assert d.app == "nginx" and d.move.direction is Direction.DOWN  # xapian's average is 0.18


def test_code_judges_an_upsize_by_the_majority_of_five_samples(base):
    """PARTIES.py:107-117: +1 for each of the next TOLERANCE = 5 samples with Lat < cur, else -1;
    cnt <= 0 -> the next state."""
    obs, caps = base
    for lower, kept in ((3, True), (2, False)):
        ctrl = _code_ctrl(caps)
        ctrl._state["xapian"].action, ctrl._state["xapian"].turn = Move.UP_CORE, 1
        d1 = ctrl.decide(make_obs(obs, 0.5, subs={"xapian": [-0.5] * 5}))
        assert d1.app == "xapian" and d1.move is Move.UP_CORE
        judged = [-0.3] * lower + [-0.6] * (5 - lower)  # a lower latency = a higher slack
        d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, subs={"xapian": judged[::-1]}))
        assert d2.app == "xapian"
        assert d2.move is (Move.UP_CORE if kept else Move.UP_CACHE), (lower, d2.reason)


def test_code_reverts_a_downsize_when_any_app_dips_in_the_majority(base):
    """PARTIES.py:128-141: -1 for a sample in which any LC app has Slack < 0.05; cnt <= 0 ->
    revert the downsized app's move and ban it. The paper judges the downsized app only."""
    obs, caps = base
    cases = [("code", [0.0, 0.0, 0.0, 0.1, 0.1], True), ("code", [0.0, 0.0, 0.1, 0.1, 0.1], False)]
    cases.append((None, [0.0] * 5, False))
    for variant, xapian, reverted in cases:
        ctrl = make_ctrl(caps, variant=variant, fair_start=False)
        d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
        assert d1.app == "nginx" and d1.move.direction is Direction.DOWN
        d2 = ctrl.decide(
            make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.6, "xapian": 0.1}, subs={"xapian": xapian})
        )
        assert ("revert nginx" in d2.reason) is reverted, (variant, xapian, d2.reason)
        if reverted:
            assert d2.move is d1.move.opposite and ctrl._state["nginx"].ban_until_s == pytest.approx(11.0)


def test_code_settles_after_a_revert_while_the_majority_still_violates(base):
    """PARTIES.py:143-157: after a revert wait 5 samples; if the majority still violates, 5 more;
    then decide."""
    obs, caps = base
    violating = {"xapian": [-0.5] * 5}
    ctrl = _code_ctrl(caps)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.0}))
    assert "revert" in d2.reason
    d3 = ctrl.decide(make_obs(obs, 1.5, d2.allocation, subs=violating))
    assert d3.move is Move.HOLD and "settling" in d3.reason
    d4 = ctrl.decide(make_obs(obs, 2.0, d2.allocation, subs=violating))
    assert d4.app == "xapian" and d4.move.direction is Direction.UP  # then it decides again
    # when the samples after the revert are fine it decides at once
    ctrl = _code_ctrl(caps)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    d2 = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.0}))
    d3 = ctrl.decide(make_obs(obs, 1.5, d2.allocation, subs={"memcached": [0.6] * 5}))
    assert d3.app == "memcached" and d3.move.direction is Direction.DOWN


def test_code_bans_downsizing_for_10s_after_a_revert(base):
    """PARTIES.py:22 REST = 100, :226 LDOWN = REST, :268-270 one off per 100 ms sample: 10 s."""
    obs, caps = base
    ctrl = _code_ctrl(caps, settle_after_revert=False)
    d1 = ctrl.decide(make_obs(obs, 0.5, slacks={"nginx": 0.6}))
    a = ctrl.decide(make_obs(obs, 1.0, d1.allocation, slacks={"nginx": 0.0})).allocation
    held = [ctrl.decide(make_obs(obs, 1.0 + 0.5 * k, a, slacks={"nginx": 0.6})).move for k in range(1, 20)]
    assert all(m is Move.HOLD for m in held)
    assert ctrl.decide(make_obs(obs, 11.0, a, slacks={"nginx": 0.6})).move.direction is Direction.DOWN


def test_code_turns_the_compute_wheel_only(base):
    """PARTIES.py:191-211: states core (1) -> cache (3) -> freq (2) -> core; no storage wheel
    (manager/README.md advises removing it), whatever memory slack says after a turn."""
    obs, caps = base
    for seed in range(6):
        ctrl = _code_ctrl(caps, seed=seed)
        moves = _failing_upsizes(ctrl, obs, 7, mem_used={"xapian": 0.5})
        turn = [m.resource for m in moves]
        assert all(r in COMPUTE for r in turn)  # memory almost saturated, still no storage wheel
        assert all(b is successor(a) for a, b in itertools.pairwise(turn[:3]))


def test_code_repeats_the_last_sample_for_a_sub_interval_without_requests(base):
    """PARTIES.py:290-295: a reading that fails keeps Lat (and Slack) at its last value."""
    obs, caps = base
    ctrl = _code_ctrl(caps)
    ctrl.decide(make_obs(obs, 0.5, subs={"xapian": [0.0] * 5}))  # holds: the average is not yet < 0.05
    nan = float("nan")
    ctrl.decide(make_obs(obs, 1.0, subs={"xapian": [0.0, nan, nan, nan, nan]}))
    assert ctrl._samples["xapian"].p99_us == (obs.app("xapian").target_us,) * 5


def test_the_code_variants_run_on_the_simulator_with_sub_interval_samples(base):
    node = SimNode(
        simple_scenario({"memcached": 0.3, "xapian": 0.1, "nginx": 0.3}), seed=1, sub_interval_s=0.1
    )
    caps = node.capabilities()
    ctrl = make_ctrl(caps, seed=1, variant="code")
    obs = node.observe()
    reasons = []
    for _ in range(60):
        assert len(obs.app("xapian").sub_p99_us) == 5
        d = ctrl.decide(obs)
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
            assert len({r for _, r in moved(obs.allocation, d.allocation)}) <= 1
            assert all(r in COMPUTE for _, r in moved(obs.allocation, d.allocation))
        reasons.append(d.reason)
        obs = node.step(d.allocation)
    assert any(r.startswith(("upsize", "downsize")) for r in reasons)
