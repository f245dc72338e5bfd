"""Evaluation metrics, defined once (DESIGN §5): pure functions over the loop's tick records.

`evaluate.py`, training callbacks and `serve.py` all compute their numbers here. Records are
`env.loop.TickRecord`s; each covers one interval `[time_s - interval_s, time_s]`.

Definitions (PARTIES Sec. 5.1-5.4, Heracles Sec. 5, Q-PRM Sec. 6):

* **Measured intervals**: those starting at or after `warmup_s` (and, with `measure_s`, starting
  before `warmup_s + measure_s`). An invalid interval (a failed latency feed, DESIGN §3) is not a
  measurement: it is left out of every QoS metric and counted in `invalid_intervals`; an app's
  invalid sample is left out of that app's metrics.
* **QoS guarantee**: fraction of measured intervals in which every LC app meets its target
  (p99 <= target); per app, the fraction of that app's measured samples that meet it.
* **Tardiness**: p99 / target (Q-PRM's QoS tardiness), averaged over the measured samples of all
  apps (and per app).
* **Violations**: measured intervals in which at least one LC app misses its target.
* **Sustained** (PARTIES Sec. 5.1): >= 95% of the intervals in the `measure_s` = 60 s after a
  `warmup_s` = 30 s warm-up meet every target. A run shorter than the window is not sustained,
  and an invalid interval in the window counts as a miss (a load point is not declared sustained
  on measurements that were not taken). `unsustained_stop` lets a search stop a run as soon as the
  verdict is known (same verdict, fewer simulated intervals).
* **LC EMU** (PARTIES Sec. 5.2.2): the largest aggregate load, i.e. the sum of each app's load as a
  fraction of its max load, that is sustained. Over a set of load points: `lc_emu(points)`. For
  one constant-load run: its aggregate load if sustained, else 0 (`lc_emu_of_run`; None when the
  load varies, where "the largest sustained load" is not defined by one run).
* **EMU** (Heracles Sec. 5.1): LC load fraction + BE throughput normalised to the BE job alone.
  Per measured interval: the sum of the loads of the LC apps that meet their target in it (a
  request served later than its target is not useful work under the SLO) plus the BE throughput
  (already normalised by the node, `BeSample.throughput`); averaged over measured intervals.
* **BE throughput**: mean normalised BE throughput over measured intervals.
* **Load change** (detected from the records, so that it works for any trace and for real
  nodes): let L_k be the vector of the LC apps' offered loads (fractions of max load) in interval
  k and R a reference, initially L_0. A load change is detected at the first interval k where
  max_i |L_k,i - R_i| >= `load_change_threshold` (default 0.05, half of PARTIES' 10% load step);
  R then becomes L_k. A step change is one event; a ramp is a sequence of events, one per 5% of
  drift, so each is judged on how fast the controller follows the ramp. Traces report offered
  load without noise, so there are no spurious events on constant loads.
* **Convergence time** (PARTIES Sec. 5.4, Fig. 10): from an event (the scenario start at t = 0,
  or a load change at the start of its interval) until all targets are met for
  `converge_intervals` = 5 consecutive intervals: the time from the event to the start of the
  first interval of that run (0 when targets are met from the start). An event whose run does not
  start before the next event (or the end of the records) has not converged: it is counted in
  `unconverged` (its `ConvergenceEvent.convergence_s` is censored at its window, the time to the
  next event or the end). `convergence_s` in summaries is the mean over the converged events (NaN
  when none converged): read it together with `unconverged`.
* **Decision time**: wall time of `decide()` (`TickRecord.decide_ms`), p50 and p99 over all ticks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from env.loop import TickRecord

WARMUP_S = 30.0  # PARTIES Sec. 5.1
MEASURE_S = 60.0
SUSTAIN_FRACTION = 0.95
CONVERGE_INTERVALS = 5
LOAD_CHANGE_THRESHOLD = 0.05
_EPS = 1e-9


def measured(
    records: Sequence[TickRecord], warmup_s: float = 0.0, measure_s: float | None = None
) -> list[TickRecord]:
    """Records of the measured window (module docstring), invalid ones included."""
    hi = math.inf if measure_s is None else warmup_s + measure_s
    return [r for r in records if warmup_s - _EPS <= r.start_s < hi - _EPS]


def _valid(records: Iterable[TickRecord]) -> list[TickRecord]:
    return [r for r in records if r.valid]


def qos_guarantee(records: Sequence[TickRecord], warmup_s: float = 0.0) -> float:
    """Fraction of valid measured intervals in which every LC app meets its target (NaN if none)."""
    rs = _valid(measured(records, warmup_s))
    return sum(r.all_qos_met for r in rs) / len(rs) if rs else math.nan


def qos_guarantee_per_app(records: Sequence[TickRecord], warmup_s: float = 0.0) -> dict[str, float]:
    """Per LC app, the fraction of its valid measured samples that meet its target (NaN when
    it has none; module docstring)."""
    out: dict[str, list[bool]] = {}
    for r in measured(records, warmup_s):
        for a in r.apps:
            if a.valid:
                out.setdefault(a.name, []).append(a.meets_qos)
            else:
                out.setdefault(a.name, [])
    return {k: (sum(v) / len(v) if v else math.nan) for k, v in out.items()}


def mean_tardiness(records: Sequence[TickRecord], warmup_s: float = 0.0) -> float:
    """Mean of p99 / target over the valid measured samples of every LC app (NaN if none)."""
    xs = [a.tardiness for r in measured(records, warmup_s) for a in r.apps if a.valid]
    return float(np.mean(xs)) if xs else math.nan


def mean_tardiness_per_app(records: Sequence[TickRecord], warmup_s: float = 0.0) -> dict[str, float]:
    """Per LC app, the mean p99 / target over its valid measured samples (Q-PRM's tardiness;
    NaN when it has none)."""
    out: dict[str, list[float]] = {}
    for r in measured(records, warmup_s):
        for a in r.apps:
            out.setdefault(a.name, [])
            if a.valid:
                out[a.name].append(a.tardiness)
    return {k: (float(np.mean(v)) if v else math.nan) for k, v in out.items()}


def violations(records: Sequence[TickRecord], warmup_s: float = 0.0) -> int:
    """Valid measured intervals in which at least one LC app misses its target."""
    return sum(not r.all_qos_met for r in _valid(measured(records, warmup_s)))


def violations_per_app(records: Sequence[TickRecord], warmup_s: float = 0.0) -> dict[str, int]:
    """Per LC app, the number of its valid measured samples over its target."""
    out: dict[str, int] = {}
    for r in measured(records, warmup_s):
        for a in r.apps:
            out[a.name] = out.get(a.name, 0) + int(a.valid and not a.meets_qos)
    return out


def invalid_intervals(records: Sequence[TickRecord], warmup_s: float = 0.0) -> int:
    """Measured intervals with a failed latency feed: left out of the QoS metrics, counted here."""
    return sum(not r.valid for r in measured(records, warmup_s))


def intervals_in(interval_s: float, measure_s: float = MEASURE_S) -> int:
    """Number of intervals in a measurement window (120 for PARTIES' 60 s at 500 ms)."""
    return round(measure_s / interval_s)


def max_misses(interval_s: float, measure_s: float = MEASURE_S, fraction: float = SUSTAIN_FRACTION) -> int:
    """Most intervals of the window that may miss a target with the load still sustained
    (6 of 120 for PARTIES' rule). Invalid intervals count as misses here: a point cannot be
    declared sustained on measurements that were not taken."""
    n = intervals_in(interval_s, measure_s)
    return n - math.ceil(fraction * n - 1e-9)


def sustained(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
) -> bool:
    """PARTIES' sustained rule (module docstring). The window must be fully covered."""
    if not records:
        return False
    window = measured(records, warmup_s, measure_s)
    need = intervals_in(records[0].interval_s, measure_s)
    if len(window) < need:
        return False
    met = sum(r.all_qos_met for r in window)
    return met >= math.ceil(fraction * len(window) - 1e-9)


def failed_early(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
) -> bool:
    """True once the window has more misses than `sustained` allows: the verdict can no longer
    change, so a max-load search may stop the run (the verdict is identical)."""
    if not records:
        return False
    window = measured(records, warmup_s, measure_s)
    misses = sum(not r.all_qos_met for r in window)
    return misses > max_misses(records[0].interval_s, measure_s, fraction)


def unsustained_stop(
    warmup_s: float = WARMUP_S, measure_s: float = MEASURE_S, fraction: float = SUSTAIN_FRACTION
) -> Callable[[TickRecord], bool]:
    """An incremental `failed_early` for `run_episode(stop_when=...)`: fed the records in order,
    it turns true at the first record after which the window has more misses than allowed."""
    misses, limit = 0, -1

    def stop(rec: TickRecord) -> bool:
        nonlocal misses, limit
        if limit < 0:
            limit = max_misses(rec.interval_s, measure_s, fraction)
        if warmup_s - _EPS <= rec.start_s < warmup_s + measure_s - _EPS and not rec.all_qos_met:
            misses += 1
        return misses > limit

    return stop


def is_constant_load(records: Sequence[TickRecord]) -> bool:
    """Every LC app's offered load is the same in every record."""
    if not records:
        return True
    first = {a.name: a.load_frac for a in records[0].apps}
    return all(abs(a.load_frac - first.get(a.name, math.nan)) <= 1e-9 for r in records for a in r.apps)


def lc_emu(points: Iterable[tuple[Mapping[str, float], bool]]) -> float:
    """PARTIES' LC EMU over load points: the largest aggregate load (sum of load fractions) among
    the sustained points; 0 when none is sustained."""
    best = 0.0
    for loads, ok in points:
        if ok:
            best = max(best, float(sum(loads.values())))
    return best


def lc_emu_of_run(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float | None = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
) -> float | None:
    """LC EMU of one constant-load run: its aggregate load if sustained, else 0; None if the load
    varies. `measure_s` None measures to the end of the run."""
    if not records or not is_constant_load(records):
        return None
    window_s = measure_s if measure_s is not None else max(r.time_s for r in records) - warmup_s
    ok = sustained(records, warmup_s, window_s, fraction)
    return records[0].aggregate_load if ok else 0.0


def emu(records: Sequence[TickRecord], warmup_s: float = 0.0) -> float:
    """Heracles' EMU (module docstring), mean over valid measured intervals (NaN if none)."""
    rs = _valid(measured(records, warmup_s))
    if not rs:
        return math.nan
    vals = [sum(a.load_frac for a in r.apps if a.meets_qos) + r.be_throughput for r in rs]
    return float(np.mean(vals))


def be_throughput(records: Sequence[TickRecord], warmup_s: float = 0.0) -> float:
    """Mean normalised BE throughput over measured intervals that were observed (NaN if none)."""
    rs = [r for r in measured(records, warmup_s) if r.be or r.apps]
    return float(np.mean([r.be_throughput for r in rs])) if rs else math.nan


def load_changes(records: Sequence[TickRecord], threshold: float = LOAD_CHANGE_THRESHOLD) -> list[float]:
    """Start times of the intervals where a load change is detected (module docstring)."""
    ref: dict[str, float] | None = None
    out: list[float] = []
    for r in records:
        if not r.apps:
            continue
        loads = {a.name: a.load_frac for a in r.apps}
        if ref is None:
            ref = loads
            continue
        if max(abs(v - ref.get(k, 0.0)) for k, v in loads.items()) >= threshold - _EPS:
            out.append(r.start_s)
            ref = loads
    return out


@dataclass(frozen=True)
class ConvergenceEvent:
    """One event: its time, how long until convergence (censored if not converged), whether it
    converged before the next event / the end of the records."""

    event_s: float
    convergence_s: float
    converged: bool


def convergence(
    records: Sequence[TickRecord],
    converge_intervals: int = CONVERGE_INTERVALS,
    threshold: float = LOAD_CHANGE_THRESHOLD,
    start_s: float = 0.0,
) -> list[ConvergenceEvent]:
    """Convergence after the scenario start (`start_s`) and after each detected load change."""
    if not records:
        return []
    events = [start_s, *(t for t in load_changes(records, threshold) if t > start_s + _EPS)]
    end_s = records[-1].time_s
    ok = [r.all_qos_met for r in records]
    # run_start[i]: start time of a run of `converge_intervals` met intervals beginning at i
    out = []
    for j, ev in enumerate(events):
        nxt = events[j + 1] if j + 1 < len(events) else end_s
        first = next((i for i, r in enumerate(records) if r.start_s >= ev - _EPS), len(records))
        found = None
        for i in range(first, len(records)):
            if records[i].start_s >= nxt - _EPS:
                break
            if i + converge_intervals <= len(records) and all(ok[i : i + converge_intervals]):
                found = records[i].start_s
                break
        if found is None:
            out.append(ConvergenceEvent(ev, max(nxt - ev, 0.0), False))
        else:
            out.append(ConvergenceEvent(ev, max(found - ev, 0.0), True))
    return out


def decision_time_ms(records: Sequence[TickRecord]) -> tuple[float, float]:
    """(p50, p99) of decide() wall time in ms over ticks that decided (NaN if none)."""
    xs = [r.decide_ms for r in records if math.isfinite(r.decide_ms)]
    if not xs:
        return math.nan, math.nan
    p50, p99 = np.percentile(xs, [50, 99])
    return float(p50), float(p99)


@dataclass(frozen=True)
class RunSummary:
    """Every metric of one run; `row()` is the `compare` summary.json row (DESIGN §5)."""

    qos_guarantee: float
    mean_tardiness: float
    lc_emu: float | None
    emu: float
    be_throughput: float
    convergence_s: float
    unconverged: int
    violations: int
    invalid_intervals: int
    decide_ms_p50: float
    decide_ms_p99: float
    measured_intervals: int
    qos_guarantee_per_app: dict[str, float]
    mean_tardiness_per_app: dict[str, float]
    violations_per_app: dict[str, int]
    convergence_events: tuple[ConvergenceEvent, ...]

    def row(self) -> dict[str, float | int | None]:
        keys = (
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
        )
        return {k: _json_num(getattr(self, k)) for k in keys}

    def to_dict(self) -> dict:
        d = asdict(self)
        return json_safe(d)


def _json_num(x):
    """NaN/inf -> None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def json_safe(x):
    """`x` with NaN/inf floats replaced by None, tuples by lists (for strict JSON)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return _json_num(x)


def summarize(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    *,
    sustain_measure_s: float | None = None,
    fraction: float = SUSTAIN_FRACTION,
    converge_intervals: int = CONVERGE_INTERVALS,
    load_change_threshold: float = LOAD_CHANGE_THRESHOLD,
) -> RunSummary:
    """All metrics of one run. LC EMU uses the window from `warmup_s` to the end of the run
    (`sustain_measure_s` None) or the given length."""
    events = convergence(records, converge_intervals, load_change_threshold)
    p50, p99 = decision_time_ms(records)
    return RunSummary(
        qos_guarantee=qos_guarantee(records, warmup_s),
        mean_tardiness=mean_tardiness(records, warmup_s),
        lc_emu=lc_emu_of_run(records, warmup_s, sustain_measure_s, fraction),
        emu=emu(records, warmup_s),
        be_throughput=be_throughput(records, warmup_s),
        convergence_s=float(np.mean([e.convergence_s for e in events if e.converged]))
        if any(e.converged for e in events)
        else math.nan,
        unconverged=sum(not e.converged for e in events),
        violations=violations(records, warmup_s),
        invalid_intervals=invalid_intervals(records, warmup_s),
        decide_ms_p50=p50,
        decide_ms_p99=p99,
        measured_intervals=len(measured(records, warmup_s)),
        qos_guarantee_per_app=qos_guarantee_per_app(records, warmup_s),
        mean_tardiness_per_app=mean_tardiness_per_app(records, warmup_s),
        violations_per_app=violations_per_app(records, warmup_s),
        convergence_events=tuple(events),
    )
