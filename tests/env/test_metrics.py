"""env.metrics on hand-built records with known answers (DESIGN §5)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from env import metrics as M
from env.histogram import LatencyHistogram
from env.loop import AppTick, BeTick, TickRecord
from env.types import AppAlloc

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


def _held(name: str, cores: float, ways: int, mhz: int) -> AppAlloc:
    return AppAlloc(name, cores, 0, ways, 0, mhz, 8.0, 100.0, 1.0)


def test_mean_allocation_averages_what_each_app_held_over_the_measured_intervals():
    plans = [  # (a, be) per interval; the first is in the warm-up
        (_held("a", 10, 9, 1200), _held("be", 1, 1, 1200)),
        (_held("a", 2, 3, 2200), _held("be", 6, 8, 1200)),
        (_held("a", 4, 5, 3600), _held("be", 4, 6, 1200)),
    ]
    recs = [dataclasses.replace(rec(k, valid=(k != 2)), alloc=plan) for k, plan in enumerate(plans)]
    held = M.mean_allocation(recs, warmup_s=DT)  # interval 2's latency feed failed: its allocation counts
    assert list(held) == ["a", "be"]
    assert held["a"] == {
        "cores": pytest.approx(3.0),
        "llc_ways": pytest.approx(4.0),
        "freq_mhz": pytest.approx(2900.0),
        "memory_gb": pytest.approx(8.0),
        "disk_mbps": pytest.approx(100.0),
    }
    assert held["be"]["cores"] == pytest.approx(5.0) and held["be"]["llc_ways"] == pytest.approx(7.0)
    assert M.mean_allocation(recs)["a"]["cores"] == pytest.approx(16 / 3)
    assert M.mean_allocation(recs, warmup_s=100.0) == {}
    assert M.summarize(recs, warmup_s=DT).mean_allocation == held


def test_a_sample_exactly_at_target_meets_it():
    assert M.qos_guarantee([rec(0, {"a": 1.0, "b": 1.0})]) == 1.0


def test_mean_tardiness_is_p99_over_target_averaged():
    recs = [rec(0, {"a": 2.0, "b": 0.5}), rec(1, {"a": 1.0, "b": 0.5})]
    assert M.mean_tardiness(recs) == pytest.approx((2.0 + 0.5 + 1.0 + 0.5) / 4)
    assert M.mean_tardiness_per_app(recs) == {"a": pytest.approx(1.5), "b": pytest.approx(0.5)}
    assert M.mean_tardiness(recs, warmup_s=0.5) == pytest.approx(0.75)


def test_interval_rule_allows_five_percent_misses_in_the_window():
    warm = 60  # 30 s at 500 ms
    assert M.intervals_in(DT) == 120 and M.max_misses(DT) == 6
    six = set(range(warm, warm + 6))
    iv = {"verdict": "intervals"}
    assert M.sustained(run(180, six), **iv)
    assert not M.sustained(run(180, six | {warm + 50}), **iv)
    # misses during warm-up or after the 60 s window do not count
    assert M.sustained(run(200, set(range(0, warm)) | set(range(180, 200))), **iv)
    # a run that does not cover the window is not sustained
    assert not M.sustained(run(179), **iv)
    # an invalid interval in the window counts as a miss
    recs = run(180, six)
    recs[100] = rec(100, valid=False)
    assert not M.sustained(recs, **iv)
    with pytest.raises(ValueError, match="verdict"):
        M.sustained(recs, verdict="vibes")


def test_unsustained_stop_gives_the_same_verdict_as_the_interval_rule():
    recs = run(180, set(range(70, 80)))  # 10 misses: the 7th (interval 76) decides
    iv = {"verdict": "intervals"}
    stop = M.unsustained_stop(**iv)
    stopped = next(i for i, r in enumerate(recs) if stop(r))
    assert stopped == 76
    assert M.failed_early(recs[: stopped + 1], **iv) and not M.failed_early(recs[:stopped], **iv)
    assert not M.sustained(recs, **iv)
    ok = run(180, set(range(70, 76)))
    stop = M.unsustained_stop(**iv)
    assert not any(stop(r) for r in ok) and M.sustained(ok, **iv)


# ---- the window tail (PARTIES Sec. 5.1: the p99 of every request of the measured minute) -------------
N_REQ = 1000  # requests of app a per interval


def hist_rec(k: int, over: int = 0, requests: int = N_REQ, valid: bool = True) -> TickRecord:
    """Interval k with histograms: app a's `requests` latencies at 50 us except `over` of them at
    300 us (its target is 100 us); app b always at 500 us (target 1000 us)."""
    a = np.concatenate([np.full(requests - over, 50.0), np.full(over, 300.0)])
    hists = {"a": LatencyHistogram.of_values_us(a), "b": LatencyHistogram.of_values_us(np.full(100, 500.0))}
    r = rec(k, {"a": 3.0 if over > 0.01 * requests else 0.5}, valid=valid)
    apps = tuple(  # offered load as the requests seen (the early stop bounds what is to come by it)
        dataclasses.replace(
            t,
            histogram=hists[t.name] if valid else None,
            requests=hists[t.name].count,
            load_rps=hists[t.name].count / DT,
        )
        for t in r.apps
    )
    return dataclasses.replace(r, apps=apps)


def hist_run(
    n: int, over: dict[int, int] | None = None, requests: dict[int, int] | None = None
) -> list[TickRecord]:
    over, requests = over or {}, requests or {}
    return [hist_rec(k, over.get(k, 0), requests.get(k, N_REQ)) for k in range(n)]


def test_one_bad_interval_in_120_is_sustained_when_under_one_percent_of_the_requests_miss():
    warm, bad_k, bad_n = 60, 90, 2000  # the bad interval sees twice the requests
    window = 119 * N_REQ + bad_n
    allowed = window - math.ceil(0.99 * window)  # 1210: the p99 is the value of rank ceil(0.99 n)
    assert allowed == 1210
    ok = hist_run(180, {bad_k: allowed}, {bad_k: bad_n})
    bad = hist_run(180, {bad_k: allowed + 1}, {bad_k: bad_n})
    assert M.sustained(ok) and not M.sustained(bad)
    # the interval rule sees one miss in 120 either way
    assert M.sustained(ok, verdict="intervals") and M.sustained(bad, verdict="intervals")
    assert warm < bad_k < warm + 120
    wt = M.window_tail(bad)
    a = next(x for x in wt.apps if x.name == "a")
    assert a.requests == window and a.over_target == pytest.approx((allowed + 1) / window)
    assert a.p99_us == pytest.approx(300.0, rel=0.004) and a.tail_ratio == pytest.approx(3.0, rel=0.004)
    assert a.goodput_rps == pytest.approx((window - allowed - 1) / 60.0)
    assert wt.tail_ratio == pytest.approx(3.0, rel=0.004) and wt.complete and not wt.sustained
    assert M.window_tail(ok).apps[0].p99_us == pytest.approx(50.0, rel=0.004)


def test_the_window_rule_forgives_many_mild_intervals_the_interval_rule_does_not():
    # 20 intervals whose own p99 misses (2% of their requests late): 400 late requests of 120,000
    recs = hist_run(180, dict.fromkeys(range(70, 90), 20))
    assert M.sustained(recs) and not M.sustained(recs, verdict="intervals")
    assert M.lc_emu_of_run(recs) == pytest.approx(0.5) and M.lc_emu_of_run(recs, verdict="intervals") == 0.0


def test_the_window_must_be_covered_and_measured():
    assert not M.sustained(hist_run(179))
    recs = hist_run(180)
    recs[100] = hist_rec(100, valid=False)
    wt = M.window_tail(recs)
    assert not wt.sustained and not wt.complete and "not measured" in wt.note
    assert M.sustained(hist_run(180))


def test_sustained_per_app_judges_each_app_alone():
    bad = hist_run(180, dict.fromkeys(range(70, 80), 400))  # app a: 4000 late requests
    assert M.sustained_per_app(bad) == {"a": False, "b": True} and not M.sustained(bad)
    assert M.sustained_per_app(hist_run(180)) == {"a": True, "b": True}
    assert M.sustained_per_app(hist_run(179)) == {"a": False, "b": False}  # window not covered
    mild = hist_run(180, dict.fromkeys(range(70, 90), 20))
    assert M.sustained_per_app(mild, verdict="intervals") == {"a": False, "b": True}


def test_window_early_stop_gives_the_same_verdict():
    over = dict.fromkeys(range(70, 80), 400)  # 4000 late requests: the 4th such interval decides
    recs = hist_run(180, over)
    stop = M.unsustained_stop()
    stopped = next(i for i, r in enumerate(recs) if stop(r))
    assert not M.sustained(recs) and 70 <= stopped < 80
    assert not M.sustained(recs[: stopped + 1] + hist_run(180)[stopped + 1 :])  # whatever follows
    ok = hist_run(180, {warm: 100 for warm in range(60, 72)})  # 1200 late: sustained
    stop = M.unsustained_stop()
    assert not any(stop(r) for r in ok) and M.sustained(ok)
    # an unmeasured interval in the window decides at once
    recs = hist_run(180)
    recs[70] = hist_rec(70, valid=False)
    stop = M.unsustained_stop()
    assert next(i for i, r in enumerate(recs) if stop(r)) == 70


def test_intervals_without_histograms_are_approximated_and_said_so():
    recs = run(180)  # p99 = 50 us for a in every interval, no histogram
    wt = M.window_tail(recs)
    a = next(x for x in wt.apps if x.name == "a")
    assert a.approximated == 120 and "approximated" in wt.note and wt.sustained
    # identical exponential intervals: the window's p99 is theirs
    assert a.p99_us == pytest.approx(50.0, rel=1e-4)
    assert a.over_target == pytest.approx(math.exp(-100.0 * M.LN100 / 50.0), rel=1e-6)  # 1e-4
    # one interval at 3x the target among 119 at half of it: its requests are 1/120 of the window
    recs[100] = rec(100, {"a": 3.0})
    late = (math.exp(-100 * M.LN100 / 300) + 119 * math.exp(-100 * M.LN100 / 50)) / 120
    assert M.window_tail(recs).apps[0].over_target == pytest.approx(late, rel=1e-6)
    assert M.sustained(recs)  # 0.2% of the requests over the target


def test_lc_emu_over_points_and_of_one_run():
    pts = [({"a": 0.5, "b": 0.5}, True), ({"a": 0.9, "b": 0.5}, False), ({"a": 0.7, "b": 0.4}, True)]
    assert M.lc_emu(pts) == pytest.approx(1.1)
    assert M.lc_emu([({"a": 1.0}, False)]) == 0.0
    assert M.lc_emu_of_run(run(180)) == pytest.approx(0.5)  # a 20% + b 30%
    assert M.lc_emu_of_run(run(180, set(range(60, 80))), verdict="intervals") == 0.0
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
        "window_sustained",
        "window_tail_ratio",
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
