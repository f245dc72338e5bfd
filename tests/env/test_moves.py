"""The counterpart rule shared by PARTIES and the Gymnasium codec (PARTIES Sec. 4.2.4)."""

from __future__ import annotations

import dataclasses

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
