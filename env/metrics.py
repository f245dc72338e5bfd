"""Evaluation metrics, defined once (DESIGN §5): pure functions over the loop's tick records.

Evaluation, training callbacks and serving all compute their numbers here. Records are
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
* **Window tail** (what the papers' load generators report: PARTIES Sec. 3.2 and 5.1 run the
  clients for one minute and take the p99 of every request): per LC app, the p99 and p99.9 of all
  requests of the measured window, read off the sum of the intervals' latency histograms
  (`env.histogram`; exact but for the bucket error, <= 0.39%), the fraction of those requests
  over the target (`over_target`: requests whose bucket lies above it, the count that decides
  whether the p99 does) and the goodput (requests within target per second of the window).
  An interval whose node reports no histogram (a latency feed that sends only a p99) is
  *approximated*: its latencies are taken as exponential with that p99 (the M/M/1 sojourn time,
  whose p99 is ln(100) x its mean: Heracles Eq. (1)), weighted by its requests (else its offered
  load x the interval); `AppWindow.approximated` counts such intervals and `WindowTail.note` says
  so. An app with no request in the window has no tail (NaN) and misses nothing.
* **Sustained** (PARTIES Sec. 5.1; `verdict="window"`, the default): after the `warmup_s` = 30 s
  warm-up, every LC app's p99 over the `measure_s` = 60 s window meets its target (PARTIES: "if a
  satisfactory allocation in which all apps meet their QoS cannot be found after 1 min", the point
  fails). The window must be fully covered and every interval in it valid (a load point is not
  declared sustained on measurements that were not taken). The stricter per-interval rule
  (`verdict="intervals"`): >= 95% of the window's intervals meet every target, an invalid one
  counting as a miss. `unsustained_stop` lets a max-load search stop a run as soon as the verdict
  is known (the same verdict, fewer simulated intervals).
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
* **Resources held**: per app and BE job, the mean of each resource of its allocation in force
  (`HELD_RESOURCES`, `AppAlloc`'s fields and units) over the measured intervals, invalid ones
  included (an allocation is in force whether or not its latency was measured). Where EMU differs
  between controllers, this says which app kept the cores or ways the BE job did not get (the
  comparison behind PARTIES Fig. 9's allocation panels). Apps sharing a core group each count its
  cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from env.histogram import LatencyHistogram, merge, quantile_rank
from env.loop import AppTick, TickRecord
from env.types import AppAlloc

WARMUP_S = 30.0  # PARTIES Sec. 5.1
MEASURE_S = 60.0
SUSTAIN_FRACTION = 0.95
VERDICTS = ("window", "intervals")  # sustained: the window's p99 (PARTIES Sec. 5.1) / >= 95% of intervals
TAIL_Q = 0.99
LN100 = math.log(100.0)
APPROXIMATION = (
    "an interval without a histogram is taken as exponential latencies with its p99 "
    "(M/M/1 sojourn, Heracles Eq. 1), weighted by its requests"
)
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


HELD_RESOURCES = ("cores", "llc_ways", "freq_mhz", "memory_gb", "disk_mbps")


def mean_allocation(records: Sequence[TickRecord], warmup_s: float = 0.0) -> dict[str, dict[str, float]]:
    """Per app and BE job (in the records' order), the mean of each of `HELD_RESOURCES` over the
    measured intervals that allocate it (module docstring, "Resources held"); {} without any."""
    held: dict[str, list[AppAlloc]] = {}
    for r in measured(records, warmup_s):
        for al in r.alloc:
            held.setdefault(al.name, []).append(al)
    return {
        name: {field: float(np.mean([getattr(al, field) for al in allocs])) for field in HELD_RESOURCES}
        for name, allocs in held.items()
    }


def invalid_intervals(records: Sequence[TickRecord], warmup_s: float = 0.0) -> int:
    """Measured intervals with a failed latency feed: left out of the QoS metrics, counted here."""
    return sum(not r.valid for r in measured(records, warmup_s))


def intervals_in(interval_s: float, measure_s: float = MEASURE_S) -> int:
    """Number of intervals in a measurement window (120 for PARTIES' 60 s at 500 ms)."""
    return round(measure_s / interval_s)


def max_misses(interval_s: float, measure_s: float = MEASURE_S, fraction: float = SUSTAIN_FRACTION) -> int:
    """Most intervals of the window that may miss a target with the load still sustained under the
    per-interval rule (6 of 120 at 500 ms). Invalid intervals count as misses here: a point cannot
    be declared sustained on measurements that were not taken."""
    n = intervals_in(interval_s, measure_s)
    return n - math.ceil(fraction * n - 1e-9)


def _check_verdict(verdict: str) -> None:
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}; one of {VERDICTS}")


# ---- the window tail ------------------------------------------------------------------------------
@dataclass(frozen=True)
class AppWindow:
    """One LC app over the measured window (module docstring: window tail)."""

    name: str
    target_us: float
    requests: float  # requests of the window (approximated intervals: their requests or offered load)
    p99_us: float  # NaN when the window holds no request
    p999_us: float
    over_target: float  # fraction of the window's requests over the target
    goodput_rps: float  # requests within target per second of the window
    approximated: int = 0  # intervals whose tail is approximated (no histogram)

    @property
    def tail_ratio(self) -> float:
        """Window p99 / target (NaN without requests)."""
        return self.p99_us / self.target_us

    @property
    def meets_qos(self) -> bool:
        """The window p99 meets the target; an app with no request misses nothing."""
        return not (self.p99_us > self.target_us)


@dataclass(frozen=True)
class WindowTail:
    """Every LC app's tail over one measured window, and the window verdict.

    `complete` is false when the run does not cover the window or an interval in it is invalid;
    `sustained` = complete and every app meets its target over the window (PARTIES Sec. 5.1);
    `tail_ratio` the largest window p99 / target over the apps (NaN when none has requests);
    `note` says why the window is incomplete and how it was approximated, if it was."""

    apps: tuple[AppWindow, ...]
    complete: bool
    sustained: bool
    tail_ratio: float
    intervals: int
    note: str = ""


def _app_window(ticks: Sequence[AppTick], interval_s: float, window_s: float) -> AppWindow:
    """One app's window tail from its valid ticks of the window (module docstring)."""
    name, target = ticks[0].name, ticks[0].target_us
    hist = merge(t.histogram for t in ticks if t.histogram is not None)
    approx = [t for t in ticks if t.histogram is None]
    # approximated intervals: exponential latencies with the interval's p99 (mean p99 / ln 100)
    n_ap = np.array([_approx_requests(t, interval_s) for t in approx])
    mean_ap = np.array([t.p99_us / LN100 for t in approx])
    total = hist.count + float(n_ap.sum())
    if total <= 0:
        return AppWindow(name, target, 0.0, math.nan, math.nan, 0.0, 0.0, len(approx))

    def above(x_us: float) -> float:  # requests over x
        return hist.count_above_us(x_us) + float(np.dot(n_ap, np.exp(-x_us / mean_ap)))

    if approx:
        p99, p999 = (_solve_quantile(above, total, q, hist, mean_ap) for q in (TAIL_Q, 0.999))
    else:
        p99, p999 = (float(x) for x in hist.quantiles_us([TAIL_Q, 0.999]))
    over = above(target)
    return AppWindow(
        name=name,
        target_us=target,
        requests=total,
        p99_us=p99,
        p999_us=p999,
        over_target=over / total,
        goodput_rps=(total - over) / window_s if window_s > 0 else math.nan,
        approximated=len(approx),
    )


def _approx_requests(t: AppTick, interval_s: float) -> float:
    """The weight of an approximated interval: its requests, else its offered load x interval."""
    if t.requests > 0:
        return float(t.requests)
    return t.load_rps * interval_s if math.isfinite(t.load_rps) and t.load_rps > 0 else 1.0


def _solve_quantile(
    above: Callable[[float], float], total: float, q: float, hist: LatencyHistogram, mean_us: np.ndarray
) -> float:
    """Smallest x (us) with at most (1 - q) x total requests above it, by bisection (relative 1e-6)."""
    allowed = (1.0 - q) * total
    hi = max(
        float(mean_us.max() * math.log(total / max(allowed, 1e-300) + 1.0)) if mean_us.size else 0.0, 1.0
    )
    if hist.count:
        hi = max(hi, hist.max_ns / 1000.0 * 1.01)
    while above(hi) > allowed:
        hi *= 2.0
    lo = 0.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if above(mid) > allowed:
            lo = mid
        else:
            hi = mid
    return hi


def window_tail(
    records: Sequence[TickRecord], warmup_s: float = WARMUP_S, measure_s: float | None = MEASURE_S
) -> WindowTail:
    """The window tail of every LC app over `[warmup_s, warmup_s + measure_s)` (to the end of the
    run when `measure_s` is None) and the window verdict (module docstring)."""
    window = measured(records, warmup_s, measure_s)
    notes = []
    complete = bool(window)
    if not window:
        notes.append("no interval in the window")
    elif measure_s is not None and len(window) < intervals_in(records[0].interval_s, measure_s):
        complete = False
        notes.append(
            f"the run covers {len(window)} of the window's {intervals_in(records[0].interval_s, measure_s)} intervals"
        )
    bad = sum(not r.valid for r in window)
    if bad:
        complete = False
        notes.append(f"{bad} interval(s) of the window were not measured")
    window_s = sum(r.interval_s for r in window)
    per_app: dict[str, list[AppTick]] = {}
    for r in window:
        for a in r.apps:
            per_app.setdefault(a.name, [])
            if a.valid:
                per_app[a.name].append(a)
    dt = window[0].interval_s if window else 0.0
    apps = tuple(_app_window(ts, dt, window_s) for ts in per_app.values() if ts)
    approx = sum(a.approximated for a in apps)
    if approx:
        notes.append(f"{approx} app-interval(s) approximated: {APPROXIMATION}")
    ratios = [a.tail_ratio for a in apps if math.isfinite(a.tail_ratio)]
    return WindowTail(
        apps=apps,
        complete=complete,
        sustained=complete and all(a.meets_qos for a in apps),
        tail_ratio=max(ratios) if ratios else math.nan,
        intervals=len(window),
        note="; ".join(notes),
    )


# ---- sustained ------------------------------------------------------------------------------------
def sustained(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
    verdict: str = "window",
) -> bool:
    """PARTIES' sustained rule (module docstring), by the window tail or by intervals. The window
    must be fully covered."""
    _check_verdict(verdict)
    if not records:
        return False
    if verdict == "window":
        return window_tail(records, warmup_s, measure_s).sustained
    window = measured(records, warmup_s, measure_s)
    need = intervals_in(records[0].interval_s, measure_s)
    if len(window) < need:
        return False
    met = sum(r.all_qos_met for r in window)
    return met >= math.ceil(fraction * len(window) - 1e-9)


def sustained_per_app(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
    verdict: str = "window",
) -> dict[str, bool]:
    """`sustained` for each LC app alone: its p99 over the measured window meets its target
    ("window"), or >= `fraction` of the measured intervals meet it ("intervals"). An app is never
    sustained over a window the run does not fully cover (or with an invalid interval)."""
    _check_verdict(verdict)
    if not records:
        return {}
    names = [a.name for a in records[0].apps]
    if verdict == "window":
        w = window_tail(records, warmup_s, measure_s)
        met = {a.name: w.complete and a.meets_qos for a in w.apps}
        return {n: met.get(n, w.complete) for n in names}
    window = measured(records, warmup_s, measure_s)
    need = intervals_in(records[0].interval_s, measure_s)
    if len(window) < need or not all(r.valid for r in window):
        return dict.fromkeys(names, False)
    out = {}
    for n in names:
        ok = sum(a.meets_qos for r in window for a in r.apps if a.name == n and a.valid)
        out[n] = ok >= math.ceil(fraction * len(window) - 1e-9)
    return out


def failed_early(
    records: Sequence[TickRecord],
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
    verdict: str = "window",
) -> bool:
    """True once the verdict is "not sustained" whatever the rest of the window brings, so that a
    max-load search may stop the run (the verdict is identical; `unsustained_stop`)."""
    stop = unsustained_stop(warmup_s, measure_s, fraction, verdict)
    return any([stop(r) for r in records])


def allowed_over(n: float) -> float:
    """Requests of n (whole: the floor of a bound) that may lie above the target with the p99 still
    meeting it: n - quantile_rank(0.99, n) (the p99 is the value of that rank, env.histogram)."""
    whole = math.floor(n)
    return max(whole - float(quantile_rank(TAIL_Q, whole)), 0.0)


def unsustained_stop(
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    fraction: float = SUSTAIN_FRACTION,
    verdict: str = "window",
) -> Callable[[TickRecord], bool]:
    """An incremental early "not sustained" for `run_episode(stop_when=...)`: fed the records in
    order, it turns true at the first record after which the verdict can only be "not sustained".

    Intervals: the window has more misses than allowed. Window: an interval of the window was not
    measured, or some app already has more requests over its target than the window may hold,
    bounding the requests still to come by Poisson arrivals at the current offered load (expected
    m, at most m + 6 sqrt(m) + 10: exceeded with probability < 1e-9). For constant-load points (the
    max-load protocol); an interval without a histogram ends the early verdict (never stops)."""
    _check_verdict(verdict)
    misses, limit = 0, -1
    seen: dict[str, int] = {}
    over: dict[str, int] = {}
    blind = False
    lo, hi = warmup_s - _EPS, warmup_s + measure_s - _EPS

    def stop_intervals(rec: TickRecord) -> bool:
        nonlocal misses, limit
        if limit < 0:
            limit = max_misses(rec.interval_s, measure_s, fraction)
        if lo <= rec.start_s < hi and not rec.all_qos_met:
            misses += 1
        return misses > limit

    def stop_window(rec: TickRecord) -> bool:
        nonlocal blind
        if not (lo <= rec.start_s < hi) or blind:
            return False
        if not rec.valid:
            return True
        left_s = max(warmup_s + measure_s - rec.time_s, 0.0)
        for a in rec.apps:
            if a.histogram is None:
                blind = True
                return False
            seen[a.name] = seen.get(a.name, 0) + a.histogram.count
            over[a.name] = over.get(a.name, 0) + a.histogram.count_above_us(a.target_us)
            m = max(a.load_rps, 0.0) * left_s if math.isfinite(a.load_rps) else math.inf
            bound = seen[a.name] + m + 6.0 * math.sqrt(m) + 10.0
            if math.isfinite(bound) and over[a.name] > allowed_over(bound):
                return True
        return False

    return stop_window if verdict == "window" else stop_intervals


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
    verdict: str = "window",
) -> float | None:
    """LC EMU of one constant-load run: its aggregate load if sustained, else 0; None if the load
    varies. `measure_s` None measures to the end of the run."""
    if not records or not is_constant_load(records):
        return None
    window_s = measure_s if measure_s is not None else max(r.time_s for r in records) - warmup_s
    ok = sustained(records, warmup_s, window_s, fraction, verdict)
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
    mean_allocation: dict[str, dict[str, float]]  # per app and BE job: resource -> mean held
    convergence_events: tuple[ConvergenceEvent, ...]
    window: WindowTail  # from warmup_s to the end of the run (or sustain_measure_s long)
    verdict: str = "window"  # the sustained rule of lc_emu

    @property
    def window_sustained(self) -> bool:
        return self.window.sustained

    @property
    def window_tail_ratio(self) -> float:
        return self.window.tail_ratio

    def row(self) -> dict[str, float | int | bool | None]:
        keys = (
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
        )
        return {k: _json_num(getattr(self, k)) for k in keys}

    def window_per_app(self) -> dict[str, dict[str, float | None]]:
        """Per app: window p99 and p99.9 (us), fraction of requests over target, goodput (rps),
        requests, approximated intervals."""
        return {
            a.name: json_safe(
                {
                    "p99_us": a.p99_us,
                    "p999_us": a.p999_us,
                    "over_target": a.over_target,
                    "goodput_rps": a.goodput_rps,
                    "requests": a.requests,
                    "approximated": a.approximated,
                }
            )
            for a in self.window.apps
        }

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
    verdict: str = "window",
) -> RunSummary:
    """All metrics of one run. The window tail and LC EMU use the window from `warmup_s` to the end
    of the run (`sustain_measure_s` None) or the given length; LC EMU by `verdict`."""
    _check_verdict(verdict)
    events = convergence(records, converge_intervals, load_change_threshold)
    p50, p99 = decision_time_ms(records)
    wt = window_tail(records, warmup_s, sustain_measure_s)
    if not records or not is_constant_load(records):
        emu_run: float | None = None
    elif verdict == "window":
        emu_run = records[0].aggregate_load if wt.sustained else 0.0
    else:
        emu_run = lc_emu_of_run(records, warmup_s, sustain_measure_s, fraction, verdict)
    return RunSummary(
        qos_guarantee=qos_guarantee(records, warmup_s),
        mean_tardiness=mean_tardiness(records, warmup_s),
        lc_emu=emu_run,
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
        mean_allocation=mean_allocation(records, warmup_s),
        convergence_events=tuple(events),
        window=wt,
        verdict=verdict,
    )
