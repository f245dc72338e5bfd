"""Unit tests of the value types: moves, allocations and their validation (DESIGN §3)."""

from __future__ import annotations

import math

import pytest

from env.allocations import fair_allocation, unmanaged_allocation
from env.types import (
    AllocationError,
    Direction,
    Move,
    Resource,
    slack,
    validate_allocation,
)


def test_move_codec_is_hold_then_up_then_down():
    assert len(Move) == 11
    assert Move(0) is Move.HOLD
    assert [m.resource for m in list(Move)[1:6]] == list(Resource)
    assert all(m.direction is Direction.UP for m in list(Move)[1:6])
    assert all(m.direction is Direction.DOWN for m in list(Move)[6:])
    assert Move.of(Direction.DOWN, Resource.MEM) is Move.DOWN_MEM
    assert Move.UP_CACHE.opposite is Move.DOWN_CACHE
    assert str(Move.UP_FREQ) == "<UP,FREQ>"


def test_slack_is_positive_when_qos_met():
    assert slack(100.0, 80.0) == pytest.approx(0.2)
    assert slack(100.0, 130.0) == pytest.approx(-0.3)


def test_fair_allocation_splits_evenly_and_gives_be_the_rest(parties_caps):
    a = fair_allocation(parties_caps)
    validate_allocation(a, parties_caps)
    lc = [a[n] for n in ("memcached", "xapian", "nginx")]
    assert {x.cores for x in lc} == {4.0}
    assert {x.llc_ways for x in lc} == {6}
    assert {x.freq_mhz for x in lc} == {parties_caps.nominal_freq_mhz}
    assert len({x.core_group for x in lc}) == 3 and len({x.clos for x in lc}) == 3
    assert a["be_parties"].cores == 2.0 and a["be_parties"].llc_ways == 2
    assert a.idle_cores == 0 and a.idle_llc_ways == 0


def test_up_move_takes_from_victim_and_down_move_gives_to_recipient(parties_caps):
    a = fair_allocation(parties_caps)
    b = a.with_move("memcached", Move.UP_CORE, parties_caps, counterpart="be_parties")
    assert b["memcached"].cores == 5.0 and b["be_parties"].cores == 1.0
    c = b.with_move("xapian", Move.DOWN_CACHE, parties_caps, counterpart="be_parties")
    assert c["xapian"].llc_ways == 5 and c["be_parties"].llc_ways == 3
    d = c.with_move("nginx", Move.DOWN_MEM, parties_caps)  # to the idle pool
    assert d["nginx"].memory_gb == a["nginx"].memory_gb - 1 and d.idle_memory_gb == a.idle_memory_gb + 1
    validate_allocation(d, parties_caps)
    assert a["memcached"].cores == 4.0  # immutable


def test_frequency_moves_walk_the_levels_up_to_turbo(parties_caps):
    a = fair_allocation(parties_caps)
    b = a.with_move("memcached", Move.UP_FREQ, parties_caps)
    assert b["memcached"].freq_mhz == parties_caps.freq_levels_mhz[-1]  # 2200 -> turbo
    assert not b.move_feasible("memcached", Move.UP_FREQ, parties_caps)
    assert "highest" in b.infeasible_reason("memcached", Move.UP_FREQ, parties_caps)
    with pytest.raises(AllocationError, match="no counterpart"):
        a.with_move("memcached", Move.DOWN_FREQ, parties_caps, counterpart="be_parties")


def test_infeasible_moves_are_refused_with_a_reason(parties_caps):
    a = fair_allocation(parties_caps)
    assert "no idle" in a.infeasible_reason("memcached", Move.UP_CORE, parties_caps)
    x = a
    for _ in range(3):
        x = x.with_move("xapian", Move.DOWN_CORE, parties_caps)
    assert x["xapian"].cores == 1.0
    assert "minimum" in x.infeasible_reason("xapian", Move.DOWN_CORE, parties_caps)
    with pytest.raises(AllocationError):
        x.with_move("xapian", Move.DOWN_CORE, parties_caps)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"cores": -1.0}, "cores"),
        ({"cores": 2.5}, "multiple"),
        ({"llc_ways": 0}, "llc_ways"),
        ({"freq_mhz": 2250}, "freq_mhz"),
        ({"memory_gb": 500.0}, "memory_gb"),
        ({"memory_gb": 0.0}, "memory_gb"),  # a zero limit would kill the app
        ({"mba_pct": 50}, "no MBA"),
        ({"disk_mbps": math.nan}, "finite"),
        ({"cpu_shares": 1}, "cpu_shares"),  # cgroup v1 cpu.shares: 2..262144, 0 = not set
        ({"cpu_shares": 300_000}, "cpu_shares"),
    ],
)
def test_validation_names_the_field(parties_caps, change, match):
    a = fair_allocation(parties_caps)
    bad = a.replace_app("nginx", **change)
    with pytest.raises(AllocationError, match=match):
        validate_allocation(bad, parties_caps)


def test_validation_rejects_overcommitted_cores_and_unknown_apps(parties_caps):
    a = fair_allocation(parties_caps)
    with pytest.raises(AllocationError, match="core groups hold"):
        validate_allocation(a.replace_app("nginx", cores=8.0), parties_caps)
    from env.types import Allocation, AppAlloc

    ghost = Allocation.of((*a.apps, AppAlloc("redis", 1, 9, 1, 9, 2200, 1, 10, 0.5)), parties_caps)
    with pytest.raises(AllocationError, match="unknown app 'redis'"):
        validate_allocation(ghost, parties_caps)


def test_a_fleet_of_allocations_checked_twice_is_validated_once_each(parties_caps, monkeypatch):
    """The vector env checks each of its nodes' allocations twice an interval (a guard, then the
    node) with the other nodes' checks in between: the second check of each is a cache hit, for a
    fleet of 64; a new allocation, or the same one against other capabilities, is checked again."""
    import dataclasses

    import env.types as types

    calls: list[int] = []
    real = types._validate
    monkeypatch.setattr(types, "_validate", lambda alloc, caps: (calls.append(id(alloc)), real(alloc, caps)))
    fair = fair_allocation(parties_caps)
    fleet = [fair.replace_app("nginx", memory_gb=fair["nginx"].memory_gb - k * 0.25) for k in range(64)]
    calls.clear()
    for a in fleet:
        validate_allocation(a, parties_caps)
    for a in fleet:
        validate_allocation(a, parties_caps)
    assert len(calls) == 64
    validate_allocation(fleet[0].replace_app("nginx", memory_gb=1.0), parties_caps)
    validate_allocation(fleet[1], dataclasses.replace(parties_caps))
    assert len(calls) == 66
    bad = fair.replace_app("nginx", cores=8.0)
    for _ in range(2):  # an invalid allocation is never remembered
        with pytest.raises(AllocationError):
            validate_allocation(bad, parties_caps)


def test_unmanaged_shares_everything(parties_caps):
    a = unmanaged_allocation(parties_caps)
    validate_allocation(a, parties_caps)
    assert {x.core_group for x in a} == {0} and {x.clos for x in a} == {0}
    assert all(x.cores == parties_caps.cores for x in a)
    assert a.idle_cores == 0
