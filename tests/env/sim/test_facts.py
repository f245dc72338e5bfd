"""PARTIES' qualitative facts hold in the simulator (each one measured exactly as
`evaluate.py calibrate` measures it: sampled 1-minute runs, env.sim.calibration)."""

from __future__ import annotations

import math

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
    with less than 60 GB it misses QoS even with unconstrained disk bandwidth (model step 4: below
    its _id index and the data pages hotter than its leaves, most lookups read a leaf from disk)."""
    f3 = C.parties_fig3(seed=0, workers=1)
    assert f3["holds"], f3
    assert f3["least_memory_meeting_gb"] == 60


@pytest.mark.slow
def test_cores_first_then_ways_and_frequency():
    """Sec. 3.4.1 / Fig. 2a-b: every app but MongoDB violates QoS when cores are insufficient, and
    with enough cores ways and frequency can be reduced; MongoDB needs one core at the lowest
    frequency at high load."""
    f2 = C.parties_fig2(seed=0, workers=2)
    assert f2["holds"], [
        c for c in f2["checks"] if not all(v for k, v in c.items() if k not in ("app", "load_pct"))
    ]


def test_network_bandwidth_is_a_threshold():
    """Sec. 3.4: QoS holds only with enough bandwidth and does not improve beyond it."""
    _check(C.fact_network_threshold(seed=0))


def test_two_mongodb_instances_are_capped_near_160_percent():
    """Sec. 5.2.1: the MongoDB pair's aggregate load cannot exceed about 160% (I/O contention): each
    instance's knee is its threads blocked on reads, so two of them share the disk's deeper queue."""
    fact = C.fact_mongodb_pair(seed=0)
    _check(fact)
    assert fact["detail"]["max_aggregate_load_pct"] < 200


def test_each_knee_sits_well_below_the_max_rps():
    """Sec. 3.2 / Fig. 1: tail latency rises rapidly past a threshold, typically 60-80% of the max
    RPS (where requests start to drop); that knee is max load."""
    _check(C.fact_knee_below_drops(seed=0))


def test_mongodb_needs_only_one_slow_core():
    """Sec. 3.4.1: MongoDB, I/O dominated, meets QoS at high load on one core at the lowest frequency."""
    assert C._fig2_meets("mongodb", 0.9, 1, C.FIG2_TOP_WAYS, 1200, seed=0)


@pytest.mark.parametrize("app", C.APPS)
def test_each_app_alone_meets_qos_at_max_load_and_misses_at_120_percent(app):
    """PARTIES Table 2 / Sec. 3.2: max load is the knee of the latency-vs-load curve."""
    cell = C._table2_cell(app, seed=0)
    assert cell["meets_at_100"] and cell["misses_at_120"], cell


@pytest.mark.parametrize(
    ("app", "row"), [("sphinx", "llc_capacity"), ("sphinx", "memory_capacity"), ("moses", "cpu")]
)
def test_the_fit_judges_table4_cells_as_the_report_walks_them(app, row):
    """The fit's analytic Table 4 cell (env.sim.fit) and the report's sampled walk (10% steps from 10%
    of max load, as PARTIES Table 4 reports them) agree within one step. Sphinx beside the LLC
    antagonist misses only below 10% (a window of ~20 requests, whose p99 is nearly their maximum):
    a walk from 2.5% called that cell 0% while the report measured 100%, so the fit could not see it."""
    from env.sim import fit as F

    analytic = F.table4_sim(app)[row]  # continuous: the fit wants it in [v, v + 10) for a cell v
    step = 10.0 * math.floor(min(analytic, 100.0) / 10.0 + 1e-9)  # the cell it implies
    sampled = C._table4_cell(app, row, seed=0)
    assert abs(step - sampled) <= 10.0 + 1e-9, (analytic, sampled)


@pytest.mark.parametrize("app", ["mongodb", "memcached"])
def test_the_fit_and_the_report_agree_on_coco_retention(app):
    """CoCo Table 1: the fit's analytic retention (env.sim.fit.coco_sim, on its geometric grid of
    4.2%-wide cells) and the report's (bisection on sampled 1-minute runs) agree within 8 points per
    cell. CoCo's in-memory MongoDB serves ~150x its disk-bound max load with every resource; a report
    whose bisection stopped at 100x divided each cell by a capped baseline and overstated MongoDB's
    retention by 20-25 points."""
    from env.sim import fit as F

    analytic = F.coco_sim(app)
    cells = [C._coco_cell(app, i, seed=0) for i in range(1 + len(analytic))]
    assert cells[0] < F.COCO_LOADS[-1] * 0.9, cells[0]  # the baseline is found, not the bound
    sampled = {k: 100 * v / cells[0] for k, v in zip(analytic, cells[1:])}
    off = {k: round(sampled[k] - analytic[k], 1) for k in analytic}
    assert all(abs(d) <= 8.0 for d in off.values()), off


@pytest.mark.parametrize("app", [a for a in C.APPS if a != "mongodb"])
def test_one_core_misses_at_30_percent_load(app):
    """Sec. 3.4.1 / Fig. 2a: every app but MongoDB violates QoS when cores are insufficient: on one
    core, with every LLC way at turbo, 30% of its max load misses (the fit weighs this fact too)."""
    assert not C._fig2_meets(app, 0.3, 1, C.FIG2_TOP_WAYS, None, seed=0)


def test_fig9_apps_start_with_a_large_slack():
    """Sec. 5.3 / Fig. 9: on PARTIES' fair start (memcached 10%, xapian 20%, moses 10% and the BE
    job) "PARTIES detects a large slack in the tail latency of all services ... and decreases their
    core and cache allocations": each app's median interval p99 is below 0.8 of its target (slack
    above the downsize threshold), and the fit's analytic steady state agrees."""
    fact = C.fact_fig9_start_slack(seed=0)
    _check(fact)
    assert all(r < 0.8 for r in fact["detail"]["analytic_p99_over_target"].values()), fact["detail"]


def test_the_p99_at_max_load_is_read_over_the_minute_as_table_2_judges_it():
    """The measurement behind `fact_target_at_knee`: every app meets its target at 100% of max load
    (Table 2), so its window p99 there is at most the target, and it is higher than at 90%."""
    detail = C.fact_target_at_knee(seed=0)["detail"]
    at_max, at_90 = detail["window_p99_over_target_at_max_load"], detail["window_p99_over_target_at_90pct"]
    assert set(at_max) == set(C.APPS)
    assert all(0 < at_90[a] < at_max[a] <= 1.0 for a in C.APPS), (at_90, at_max)


def test_each_qos_target_is_the_p99_at_the_knee():
    """Sec. 3.2 / Fig. 1: the QoS target is the p99 at the knee and max load the RPS there, so alone
    at max load every app's window p99 is near its target (at least half of it)."""
    _check(C.fact_target_at_knee(seed=0))


@pytest.mark.parametrize(("max_err", "met"), [(20.0, True), (29.9, True), (30.0, False), (40.0, False)])
def test_table4_goal_needs_every_cell_under_30_points(max_err, met):
    """The report's Table 4 verdict: MAE <= 10 and the largest cell under 30 points (30 itself, three
    10% steps off, misses); CoCo Table 1's: every cell within 10."""
    report = {
        "parties_table2": {"qos": {"memcached": {"meets_at_100": True, "misses_at_120": True}}},
        "parties_table4": {"mae_pts": 5.9, "max_abs_err_pts": max_err},
        "coco_table1": {"mae_pts": 4.7, "max_abs_err_pts": 10.0},
        "facts": [],
    }
    g = C.goals_met(report)
    assert g["parties_table4"] is met
    assert g["coco_table1"] is True
    mae_over = {**report, "parties_table4": {"mae_pts": 10.1, "max_abs_err_pts": 20.0}}
    assert C.goals_met(mae_over)["parties_table4"] is False
