"""env.metrics on hand-built records with known answers (DESIGN §5)."""

from __future__ import annotations

import math

import pytest

from env import metrics as M
from env.loop import AppTick, BeTick, TickRecord

DT = 0.5
TARGETS = {"a": 100.0, "b": 1000.0}


def rec(
    k: int,
    tard: dict[str, float] | None = None,
    loads: dict[str, float] | None = None,
    be: float = 0.5,
    valid: bool = True,
    decide_ms: float = 0.1,
) -> TickRecord:
    """Interval k covers [k*DT, (k+1)*DT]; `tard` = p99/target per app (default 0.5: met)."""
    tard = tard or {}
    loads = loads or {"a": 0.2, "b": 0.3}
    apps = tuple(
        AppTick(
            name=n,
            p99_us=TARGETS[n] * tard.get(n, 0.5) if valid else math.nan,
            target_us=TARGETS[n],
            load_frac=loads[n],
            load_rps=1000 * loads[n],
            served_rps=1000 * loads[n],
            dropped_rps=0.0,
            valid=valid,
        )
        for n in ("a", "b")
    )
    return TickRecord(
        time_s=(k + 1) * DT,
        interval_s=DT,
        apps=apps,
        alloc=(),
        be=(BeTick("be", be),),
        power_w=100.0,
        mem_bw_gbps=10.0,
        valid=valid,
        move=None,
        app=None,
        reason="",
        changed=False,
        decide_ms=decide_ms,
    )


def run(n: int, miss_at: set[int] = frozenset(), **kw) -> list[TickRecord]:
    return [rec(k, {"a": 1.5} if k in miss_at else None, **kw) for k in range(n)]


def test_qos_guarantee_counts_only_measured_valid_intervals():
    recs = [rec(0, {"a": 2.0}), rec(1, {"a": 2.0}), rec(2), rec(3, {"b": 1.1}), rec(4), rec(5, valid=False)]
    # warm-up 1 s excludes intervals 0 and 1; the invalid interval 5 is not a measurement
    assert M.qos_guarantee(recs, warmup_s=1.0) == pytest.approx(2 / 3)
    assert M.qos_guarantee(recs) == pytest.approx(2 / 5)
    assert M.qos_guarantee_per_app(recs, warmup_s=1.0) == {"a": 1.0, "b": pytest.approx(2 / 3)}
    assert M.violations(recs, warmup_s=1.0) == 1
    assert M.violations_per_app(recs) == {"a": 2, "b": 1}
    assert M.invalid_intervals(recs, warmup_s=1.0) == 1
    assert math.isnan(M.qos_guarantee(recs, warmup_s=100.0))


def test_a_sample_exactly_at_target_meets_it():
    assert M.qos_guarantee([rec(0, {"a": 1.0, "b": 1.0})]) == 1.0


def test_mean_tardiness_is_p99_over_target_averaged():
    recs = [rec(0, {"a": 2.0, "b": 0.5}), rec(1, {"a": 1.0, "b": 0.5})]
    assert M.mean_tardiness(recs) == pytest.approx((2.0 + 0.5 + 1.0 + 0.5) / 4)
    assert M.mean_tardiness_per_app(recs) == {"a": pytest.approx(1.5), "b": pytest.approx(0.5)}
    assert M.mean_tardiness(recs, warmup_s=0.5) == pytest.approx(0.75)


def test_sustained_rule_allows_five_percent_misses_in_the_window():
    warm = 60  # 30 s at 500 ms
    assert M.intervals_in(DT) == 120 and M.max_misses(DT) == 6
    six = set(range(warm, warm + 6))
    assert M.sustained(run(180, six))
    assert not M.sustained(run(180, six | {warm + 50}))
    # misses during warm-up or after the 60 s window do not count
    assert M.sustained(run(200, set(range(0, warm)) | set(range(180, 200))))
    # a run that does not cover the window is not sustained
    assert not M.sustained(run(179))
    # an invalid interval in the window counts as a miss
    recs = run(180, six)
    recs[100] = rec(100, valid=False)
    assert not M.sustained(recs)


def test_unsustained_stop_gives_the_same_verdict_as_sustained():
    recs = run(180, set(range(70, 80)))  # 10 misses: the 7th (interval 76) decides
    stop = M.unsustained_stop()
    stopped = next(i for i, r in enumerate(recs) if stop(r))
    assert stopped == 76
    assert M.failed_early(recs[: stopped + 1]) and not M.failed_early(recs[:stopped])
    assert not M.sustained(recs)
    ok = run(180, set(range(70, 76)))
    stop = M.unsustained_stop()
    assert not any(stop(r) for r in ok) and M.sustained(ok)


def test_lc_emu_over_points_and_of_one_run():
    pts = [({"a": 0.5, "b": 0.5}, True), ({"a": 0.9, "b": 0.5}, False), ({"a": 0.7, "b": 0.4}, True)]
    assert M.lc_emu(pts) == pytest.approx(1.1)
    assert M.lc_emu([({"a": 1.0}, False)]) == 0.0
    assert M.lc_emu_of_run(run(180)) == pytest.approx(0.5)  # a 20% + b 30%
    assert M.lc_emu_of_run(run(180, set(range(60, 80)))) == 0.0
    varying = run(180)
    varying[90] = rec(90, loads={"a": 0.4, "b": 0.3})
    assert M.lc_emu_of_run(varying) is None
    # measure to the end of the run
    assert M.lc_emu_of_run(run(100), warmup_s=10, measure_s=None) == pytest.approx(0.5)


def test_emu_counts_load_of_apps_meeting_qos_plus_be():
    recs = [rec(0, be=0.4), rec(1, {"a": 3.0}, be=0.6)]
    # interval 0: 0.2 + 0.3 + 0.4; interval 1: only b's 0.3 counts, + 0.6
    assert M.emu(recs) == pytest.approx((0.9 + 0.9) / 2)
    assert M.be_throughput(recs) == pytest.approx(0.5)


def test_load_changes_step_ramp_and_constant():
    step = [rec(k, loads={"a": 0.2 if k < 10 else 0.5, "b": 0.3}) for k in range(20)]
    assert M.load_changes(step) == [pytest.approx(10 * DT)]
    assert M.load_changes(run(50)) == []
    # a ramp of 1% per interval from 10% to 40%: an event every 5% of drift
    ramp = [rec(k, loads={"a": 0.1 + 0.01 * min(k, 30), "b": 0.3}) for k in range(40)]
    events = M.load_changes(ramp)
    assert events == [pytest.approx(k * DT) for k in (5, 10, 15, 20, 25, 30)]
    # small wiggles below the threshold are not changes
    wiggle = [rec(k, loads={"a": 0.2 + (0.02 if k % 2 else 0.0), "b": 0.3}) for k in range(20)]
    assert M.load_changes(wiggle) == []


def test_convergence_from_start_and_after_a_load_change():
    loads = [{"a": 0.2 if k < 20 else 0.6, "b": 0.3} for k in range(40)]
    miss = set(range(0, 4)) | set(range(20, 27))
    recs = [rec(k, {"a": 2.0} if k in miss else None, loads=loads[k]) for k in range(40)]
    ev = M.convergence(recs)
    assert [e.event_s for e in ev] == [0.0, pytest.approx(10.0)]
    assert ev[0].converged and ev[0].convergence_s == pytest.approx(4 * DT)
    assert ev[1].converged and ev[1].convergence_s == pytest.approx(7 * DT)
    s = M.summarize(recs, warmup_s=0.0)
    assert s.convergence_s == pytest.approx((2.0 + 3.5) / 2) and s.unconverged == 0


def test_convergence_needs_five_consecutive_met_intervals_before_the_next_event():
    recs = [rec(k, {"a": 2.0} if k % 4 == 3 else None) for k in range(40)]  # never 5 in a row
    (ev,) = M.convergence(recs)
    assert not ev.converged and ev.convergence_s == pytest.approx(recs[-1].time_s)
    assert math.isnan(M.summarize(recs, 0.0).convergence_s)
    assert M.summarize(recs, 0.0).unconverged == 1
    # met from the very start: 0
    assert M.convergence(run(10))[0].convergence_s == 0.0
    # a met run that starts only after the next load change does not count for the first event
    loads = [{"a": 0.2 if k < 8 else 0.5, "b": 0.3} for k in range(30)]
    recs = [rec(k, {"a": 2.0} if k < 10 else None, loads=loads[k]) for k in range(30)]
    first, second = M.convergence(recs)
    assert not first.converged and first.convergence_s == pytest.approx(8 * DT)
    assert second.converged and second.convergence_s == pytest.approx(2 * DT)


def test_decision_time_percentiles_skip_ticks_without_a_decision():
    recs = [rec(k, decide_ms=float(k + 1)) for k in range(100)] + [rec(100, decide_ms=math.nan)]
    p50, p99 = M.decision_time_ms(recs)
    assert p50 == pytest.approx(50.5) and p99 == pytest.approx(99.01)
    assert all(math.isnan(x) for x in M.decision_time_ms([]))


def test_summary_row_has_the_compare_keys_and_is_json_safe():
    s = M.summarize(run(180, {65}), warmup_s=30.0)
    row = s.row()
    assert list(row) == [
        "qos_guarantee",
        "mean_tardiness",
        "lc_emu",
        "emu",
        "be_throughput",
        "convergence_s",
        "unconverged",
        "violations",
        "decide_ms_p50",
        "decide_ms_p99",
    ]
    assert row["violations"] == 1 and row["qos_guarantee"] == pytest.approx(119 / 120)
    assert row["lc_emu"] == pytest.approx(0.5)
    empty = M.summarize([], warmup_s=30.0).row()
    assert empty["qos_guarantee"] is None and empty["lc_emu"] is None
