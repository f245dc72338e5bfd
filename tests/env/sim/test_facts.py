"""PARTIES' qualitative facts hold in the simulator (each one measured exactly as
`evaluate.py calibrate` measures it: sampled 1-minute runs, env.sim.calibration)."""

from __future__ import annotations

import pytest

from env.sim import calibration as C


def _check(fact: dict) -> None:
    assert fact["holds"], f"{fact['name']} ({fact['source']}) does not hold: {fact['detail']}"


def test_fungibility_moses_at_high_load():
    """Sec. 3.4.3: <10 cores, 11 ways, turbo>, <14 cores, 11 ways, 1.8 GHz> and <14 cores, 2 ways,
    2.2 GHz> all meet Moses' QoS at 90% load; a small tuple does not."""
    _check(C.fact_fungibility(seed=0))


def test_mongodb_trades_memory_for_disk_bandwidth():
    """Sec. 3.4.2 / Fig. 3: more memory -> the same latency at lower disk bandwidth; at 90% load
    with less than 60 GB it misses QoS even with unconstrained disk bandwidth."""
    _check(C.fact_mongodb_memory_disk(seed=0))


def test_network_bandwidth_is_a_threshold():
    """Sec. 3.4: QoS holds only with enough bandwidth and does not improve beyond it."""
    _check(C.fact_network_threshold(seed=0))


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known gap of the simulator (measured 80% aggregate, paper ~160%): its disk is an M/M/1 queue "
        "behind the CPU queue, so one MongoDB's knee sits near 94% disk utilisation whatever the "
        "disk's speed (u/(1-u) <= lambda x tail budget), and two instances share that disk at about "
        "half load each. Reaching 160% needs threads blocked on I/O (8 per instance) as the knee, "
        "not the disk; strict, so this test fails once the model reaches the fact"
    ),
)
def test_two_mongodb_instances_are_capped_near_160_percent():
    """Sec. 5.2.1: the MongoDB pair's aggregate load cannot exceed about 160% (I/O contention)."""
    fact = C.fact_mongodb_pair(seed=0)
    _check(fact)
    assert fact["detail"]["max_aggregate_load_pct"] < 200


def test_mongodb_needs_only_one_slow_core():
    """Sec. 3.4.1: MongoDB, I/O dominated, meets QoS at high load on one core at the lowest frequency."""
    _check(C.fact_mongodb_one_core(seed=0))


@pytest.mark.parametrize("app", C.APPS)
def test_each_app_alone_meets_qos_at_max_load_and_misses_at_120_percent(app):
    """PARTIES Table 2 / Sec. 3.2: max load is the knee of the latency-vs-load curve."""
    cell = C._table2_cell(app, seed=0)
    assert cell["meets_at_100"] and cell["misses_at_120"], cell
