"""The counterpart rule shared by PARTIES and the Gymnasium codec (PARTIES Sec. 4.2.4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from env.moves import move_mask, plan_move
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Move


@pytest.fixture(scope="module")
def obs_caps():
    node = SimNode(simple_scenario({"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}), seed=0)
    return node.observe(), node.capabilities()


def _with_slacks(obs, **p99_frac):
    apps = tuple(dataclasses.replace(s, p99_us=s.target_us * p99_frac.get(s.name, 0.5)) for s in obs.apps)
    return dataclasses.replace(obs, apps=apps)


def test_up_moves_take_from_be_first(obs_caps):
    obs, caps = obs_caps
    p = plan_move(obs, caps, "memcached", Move.UP_CORE)
    assert p.feasible and p.counterpart == "be_parties"
    assert p.allocation["memcached"].cores == obs.allocation["memcached"].cores + 1


def test_without_be_the_victim_is_the_lc_app_with_most_slack(obs_caps):
    obs, caps = obs_caps
    alloc = obs.allocation.replace_app("be_parties", cores=0.0).replace_app(
        "nginx", cores=6.0
    )  # nothing idle
    assert alloc.idle_cores == 0
    obs = _with_slacks(obs, xapian=0.1, nginx=0.6)
    p = plan_move(obs, caps, "memcached", Move.UP_CORE, alloc)
    assert p.counterpart == "xapian"  # slack 0.9 beats nginx's 0.4


def test_memory_victim_is_the_app_with_most_memory_slack(obs_caps):
    obs, caps = obs_caps
    a0 = obs.allocation
    spare = a0["be_parties"].memory_gb - caps.min_memory_gb
    alloc = a0.replace_app("be_parties", memory_gb=caps.min_memory_gb).replace_app(
        "memcached", memory_gb=a0["memcached"].memory_gb + spare
    )  # BE cannot give and nothing is idle
    assert alloc.idle_memory_gb == 0
    obs = _with_slacks(obs, xapian=0.9, nginx=0.1)  # nginx has more latency slack...
    p = plan_move(obs, caps, "memcached", Move.UP_MEM, alloc)
    # ...but xapian uses 0.02 GB of its 39 GB: the most memory slack wins for MEM
    assert p.counterpart == "xapian"


def test_down_moves_give_to_be_and_freq_has_no_counterpart(obs_caps):
    obs, caps = obs_caps
    p = plan_move(obs, caps, "nginx", Move.DOWN_CACHE)
    assert (
        p.counterpart == "be_parties"
        and p.allocation["be_parties"].llc_ways == obs.allocation["be_parties"].llc_ways + 1
    )
    f = plan_move(obs, caps, "nginx", Move.UP_FREQ)
    assert f.feasible and f.counterpart is None


def test_mask_marks_infeasible_moves(obs_caps):
    obs, caps = obs_caps
    alloc = obs.allocation
    for _ in range(3):
        alloc = plan_move(obs, caps, "xapian", Move.DOWN_CORE, alloc).allocation
    mask = move_mask(obs, caps, "xapian", alloc)
    assert mask[Move.HOLD] and not mask[Move.DOWN_CORE] and mask[Move.UP_CORE]


def test_mask_is_plan_moves_feasibility_on_random_allocations():
    """move_mask checks feasibility without building allocations; it must agree with plan_move (the
    rule every controller uses) on every move of every app, shared core groups and CLOSes included."""
    from env.allocations import fair_allocation, unmanaged_allocation
    from env.config import resolve_config
    from env.sim.node import SimNode
    from env.sim.scenario import load_scenario
    from env.types import Move

    rng = np.random.default_rng(7)
    checked = 0
    for name in ("mix6-const", "coco-fig2", "qprm-sinusoid"):
        node = SimNode(load_scenario(resolve_config("scenarios", name)), seed=0, histograms=False)
        caps = node.capabilities()
        obs = node.observe()
        allocs = [fair_allocation(caps), unmanaged_allocation(caps)]
        a = fair_allocation(caps)
        for _ in range(300):  # a random walk of feasible moves reaches mins, maxes and empty pools
            app = caps.apps[rng.integers(len(caps.apps))].name
            p = plan_move(obs, caps, app, Move(int(rng.integers(1, 11))), a)
            if p.feasible and p.allocation is not None:
                a = p.allocation
                allocs.append(a)
        for alloc in allocs:
            for spec in caps.lc_apps:
                want = [True] + [plan_move(obs, caps, spec.name, m, alloc).feasible for m in list(Move)[1:]]
                assert move_mask(obs, caps, spec.name, alloc).tolist() == want, (spec.name, alloc)
                checked += 1
    assert checked > 1000


def _net_obs(obs, caps, use: dict[str, float], limit: dict[str, float]):
    alloc = obs.allocation
    for name, lim in limit.items():
        alloc = alloc.replace_app(name, net_gbps=lim)
    apps = tuple(
        dataclasses.replace(s, usage=dataclasses.replace(s.usage, net_gbps=use.get(s.name, 0.0)))
        for s in obs.apps
    )
    return dataclasses.replace(obs, apps=apps, allocation=alloc)


def test_the_network_partition_follows_use_outside_the_moves(obs_caps):
    """PARTIES Alg. 1 / Sec. 4.2.1: +0.5 Gbps below 0.5 Gbps of slack (idle link first, then BE),
    -0.5 Gbps above 1 Gbps of slack (to BE); the limits never exceed the link."""
    from env.moves import adjust_network

    obs, caps = obs_caps
    lim = {a.name: 2.0 for a in caps.lc_apps}
    o = _net_obs(obs, caps, {"memcached": 1.8, "xapian": 0.1, "nginx": 1.2}, lim)
    out, notes = adjust_network(o, o.allocation, caps)
    assert out["memcached"].net_gbps == pytest.approx(2.5) and out["xapian"].net_gbps == pytest.approx(1.5)
    assert out["nginx"].net_gbps == pytest.approx(2.0)  # 0.8 Gbps of slack: neither rule
    assert sum(a.net_gbps for a in out) <= caps.net_gbps + 1e-9
    assert any("memcached +0.5" in n for n in notes) and any("xapian -0.5" in n for n in notes)
    calm = _net_obs(obs, caps, dict.fromkeys(lim, 1.2), lim)  # 0.8 Gbps of slack each: nothing moves
    assert adjust_network(calm, calm.allocation, caps) == (calm.allocation, [])
