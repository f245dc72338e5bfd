"""The supervisor (DESIGN §1 use 3): one controller on one node for as long as the node runs, safely.

`Supervisor` is node- and controller-agnostic: the node (a `LinuxNode` or a `SimNode`) and the
controllers are built by the caller and injected. Every tick is one `env.loop.ControlLoop` tick
(observe -> decide -> guards -> apply -> record); the safety pieces sit *around* that loop by
composition - `SafeModeGuard` last in the guard chain, `SupervisedController` over the primary and
the fallback (harness.serving.safety), `ResilientNode` (and `DryRunNode`) over the node
(harness.serving.nodes), `StoppableClock` as the loop's clock - so evaluation, training and
serving share one tick.

`Supervisor.run()` drives `ControlLoop.run` in chunks (bounded memory for an endless run) and, on
every exit path, closes the node - which restores what it found (a `LinuxNode` replays its
journal) - and the outputs. SIGTERM/SIGINT (`SignalStop`, installed before the node starts) asks
for a stop: the tick in progress finishes, no new one starts. While serving, Python's garbage
collector runs in the idle gap after each tick instead of at random points inside one
(`ServeConfig.gc_between_ticks`; a full automatic collection costs 80-90 ms here).

One `ServeRecord` per tick (the loop's `TickRecord` plus a `serving` block: mode, active
controller, the tick's events, timings) goes to the sinks (harness.serving.sinks); `ServeSummary`
is what the run did (summary.json).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from env import metrics as M
from env.config import ConfigError, plain_data
from env.controller import Controller
from env.guards import GuardChain
from env.loop import ControlLoop, TickRecord
from env.node import Clock, Node, RealClock
from env.types import Allocation
from harness.serving.config import MetricsConfig, ServeConfig
from harness.serving.nodes import DryRunNode, ResilientNode
from harness.serving.safety import Active, EventLog, SafeModeGuard, ServeEvent, SupervisedController, _num
from harness.serving.sinks import MetricsServer, Sink

log = logging.getLogger("coloc.serve")


# ---- stopping between ticks ----------------------------------------------------------------------------------
class StopServing(BaseException):
    """Raised by `StoppableClock.sleep_until` once a stop was requested: the run ends between two
    ticks (BaseException: no `except Exception` on the way may swallow it)."""


class StoppableClock:
    """The loop's clock: `request_stop()` (signal-safe) ends the current or next wait at once with
    `StopServing`. A `RealClock` waits on an event (a signal wakes it); other clocks (a paced
    `SimClock`, test clocks) sleep their own way and the stop is taken after the wait.
    `woke_perf`/`woke_cpu` mark when the last wait ended (the start of the next tick)."""

    def __init__(self, inner: Clock) -> None:
        self.inner = inner
        self._stop = threading.Event()
        self.woke_perf = time.perf_counter()
        self.woke_cpu = time.thread_time()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    def now(self) -> float:
        return self.inner.now()

    def sleep_until(self, t_s: float) -> None:
        if self._stop.is_set():
            raise StopServing
        if isinstance(self.inner, RealClock):
            delay = t_s - self.inner.now()
            if delay > 0 and self._stop.wait(delay):
                raise StopServing
        else:
            self.inner.sleep_until(t_s)
            if self._stop.is_set():
                raise StopServing
        self.mark()

    def mark(self) -> None:
        self.woke_perf = time.perf_counter()
        self.woke_cpu = time.thread_time()


# ---- records -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ServingInfo:
    """The supervisor's part of one tick's record."""

    tick: int
    mode: Literal["normal", "safe"]
    controller: str  # the active controller's spec
    fallback_active: bool
    events: tuple[ServeEvent, ...]
    observe_ms: float
    control_ms: float  # decide + guards + apply (+ building the record): the tick minus observe()
    apply_ms: float
    backoff_s: float
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "tick": self.tick,
            "mode": self.mode,
            "controller": self.controller,
            "fallback_active": self.fallback_active,
            "events": [e.to_dict() for e in self.events],
            "observe_ms": _num(self.observe_ms),
            "control_ms": _num(self.control_ms),
            "apply_ms": _num(self.apply_ms),
            "backoff_s": _num(self.backoff_s),
            "dry_run": self.dry_run,
        }


@dataclass(frozen=True, slots=True)
class ServeRecord:
    """One tick of a serving run: the loop's record plus the supervisor's (one JSONL line)."""

    tick: TickRecord
    serving: ServingInfo

    def to_dict(self) -> dict[str, Any]:
        return {**self.tick.to_dict(), "serving": self.serving.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    def scalars(self) -> dict[str, float]:
        """The loop's TensorBoard scalars plus the supervisor's, all under the fixed namespaces."""
        out = self.tick.scalars()
        s = self.serving
        out["loop/safe_mode"] = float(s.mode == "safe")
        out["loop/fallback_active"] = float(s.fallback_active)
        out["loop/observe_ms"] = s.observe_ms
        out["loop/control_ms"] = s.control_ms
        out["loop/apply_ms"] = s.apply_ms
        out["loop/backoff_s"] = s.backoff_s
        return out


# ---- the supervisor ------------------------------------------------------------------------------------------
@dataclass
class ServeStats:
    """Counters over a serving run (also exported to Prometheus)."""

    ticks: int = 0
    valid_ticks: int = 0
    qos_met_ticks: int = 0
    tardiness_sum: float = 0.0
    tardiness_n: int = 0
    be_throughput_sum: float = 0.0
    be_n: int = 0
    safe_mode_ticks: int = 0
    fallback_ticks: int = 0
    sink_errors: int = 0
    control_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    decide_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    observe_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    sinks_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    tick_cpu_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    observe_cpu_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    control_cpu_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    recent: deque = field(default_factory=deque)  # the records of the last minute (window tail)


def _pct(xs: Sequence[float], q: float) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.percentile(xs, q)) if xs else math.nan


class Supervisor:
    """Runs `controller` on `node` through `env.loop.ControlLoop`, with the safety pieces of the
    module docstring, until the duration is over or `request_stop()`; then restores the node.

    The caller builds and injects the node (started; a LinuxNode reset to its start allocation,
    unless `dry_run`), the controllers (the fallback is None when none applies) and the guard
    chain; `start_allocation` is each LC app's start allocation (what safe mode returns them to;
    in a dry run, the allocation taken as in force: `DryRunNode`), default the node's in force.
    `clock` defaults to the node's. `error_count`: see `ResilientNode`. `sinks` receive every
    record; `metrics` (a `MetricsConfig`) starts the Prometheus/health endpoint in `start()`, or
    `metrics_server` is one already started (and stopped by `close`)."""

    CHUNK_TICKS = 240  # records held in memory at a time (ControlLoop.run returns its records)

    def __init__(
        self,
        node: Node,
        controller: Controller,
        *,
        config: ServeConfig | None = None,
        guards: GuardChain | None = None,
        fallback: Controller | None = None,
        controller_name: str | None = None,
        fallback_name: str | None = None,
        start_allocation: Allocation | None = None,
        clock: Clock | None = None,
        sinks: Sequence[Sink] = (),
        rng: np.random.Generator | None = None,
        error_count: Callable[[], int] | None = None,
        dry_run: bool = False,
        metrics: MetricsConfig | None = None,
        metrics_server: MetricsServer | None = None,
    ) -> None:
        self.config = cfg = config or ServeConfig()
        self.raw_node = node
        self.events = EventLog()
        self.clock = StoppableClock(clock if clock is not None else node.clock)
        self.dry_run = dry_run
        caps = node.capabilities()
        inner: Node = DryRunNode(node, events=self.events, assumed=start_allocation) if dry_run else node
        self.dry_node = inner if dry_run else None
        self.node = ResilientNode(
            inner, clock=self.clock, retry=cfg.retry, events=self.events, error_count=error_count
        )
        start = start_allocation if start_allocation is not None else node.current_allocation()
        self.start_allocation = start
        base = guards if guards is not None else GuardChain()
        self.safe_guard = SafeModeGuard(cfg.safe_mode, start, self.events) if cfg.safe_mode.enabled else None
        self.guards = GuardChain([*base.guards, self.safe_guard]) if self.safe_guard else base
        self.controller = SupervisedController(
            controller,
            fallback,
            cfg.fallback,
            events=self.events,
            primary_name=controller_name,
            fallback_name=fallback_name or (cfg.fallback.controller if fallback is not None else None),
        )
        self.sinks = list(sinks)
        self.stats = ServeStats(recent=deque(maxlen=M.intervals_in(caps.interval_s, M.MEASURE_S)))
        self.metrics_config = metrics if metrics_server is None else metrics_server.config
        self.http: MetricsServer | None = metrics_server
        if metrics_server is not None:
            metrics_server.attach(self)
        self.last: ServeRecord | None = None
        self.last_tick_wall: float | None = None
        self.exit_reason = ""
        self.stop_reason = ""
        self.closed = False
        self._started = False
        self._wall0 = time.monotonic()
        self._cpu0 = time.process_time()
        self._bad_sinks: set[int] = set()
        self._gc_managed = False
        self._gc_was_enabled = True
        self.controller.reset(caps, rng if rng is not None else np.random.default_rng(cfg.seed))
        self.guards.reset(caps)
        self.loop = self._make_loop()
        self.interval_s = caps.interval_s

    def _make_loop(self) -> ControlLoop:
        return ControlLoop(
            self.node, self.controller, self.guards, clock=self.clock, hold_on_controller_error=True
        )

    # -- control --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the metrics endpoint (idempotent; `run` calls it)."""
        if self._started:
            return
        self._started = True
        if self.http is None and self.metrics_config is not None and self.metrics_config.enabled:
            self.http = MetricsServer(self.metrics_config, self)
            self.http.start()
            log.info("metrics: %s/metrics, health: %s/healthz", self.http.url, self.http.url)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Signal-safe: the tick in progress finishes, no new one starts, then the node is restored."""
        if not self.stop_reason:
            self.stop_reason = reason
        self.clock.request_stop()

    @property
    def stopping(self) -> bool:
        return self.clock.stopping

    def run(self, duration_s: float | None = None) -> ServeSummary:
        """Serve for `duration_s` (None: until stopped); closes the node on every exit path."""
        self.start()
        total = None if duration_s is None else max(1, round(duration_s / self.interval_s))
        self.exit_reason = "duration" if total is not None else "stopped"
        self._wall0, self._cpu0 = time.monotonic(), time.process_time()
        self.manage_gc()
        if self.stats.ticks == 0:  # the schedule starts now, not when the supervisor was built
            self.loop = self._make_loop()
        self.clock.mark()

        def stop_when(rec: TickRecord) -> bool:
            return self.stopping or (total is not None and self.stats.ticks >= total)

        try:
            while not self.stopping and (total is None or self.stats.ticks < total):
                n = self.CHUNK_TICKS if total is None else min(self.CHUNK_TICKS, total - self.stats.ticks)
                self.loop.run(n, on_tick=self._on_tick, stop_when=stop_when)
            if self.stopping:
                self.exit_reason = self.stop_reason or "stopped"
        except StopServing:
            self.exit_reason = self.stop_reason or "stopped"
        except BaseException as e:
            self.exit_reason = f"crashed: {type(e).__name__}: {e}"
            log.exception("serving stopped by an unexpected error; restoring the node")
            raise
        finally:
            self.close()
        return self.summary()

    def tick(self) -> ServeRecord:
        """One tick without waiting (tests, benchmarks): the loop's tick plus the bookkeeping."""
        self.clock.mark()
        rec = self.loop.tick()
        self._on_tick(rec)
        assert self.last is not None
        return self.last

    def close(self) -> None:
        """Restore the node (close() replays what it changed), stop the endpoint, close the sinks.
        Idempotent; every step is attempted even when one fails."""
        if self.closed:
            return
        self.closed = True
        self._gc_end()
        self.clock.request_stop()
        log.info("%s: restoring the node", self.stop_reason or self.exit_reason or "closing")
        try:
            self.raw_node.close()
            log.info("node closed: what it changed is restored")
        except Exception:
            log.exception("closing (restoring) the node failed")
        if self.http is not None:
            with contextlib.suppress(Exception):
                self.http.stop()
        for s in self.sinks:
            try:
                s.close()
            except Exception:
                log.exception("closing %s failed", type(s).__name__)

    # -- per tick -----------------------------------------------------------------------------------
    def _on_tick(self, rec: TickRecord) -> None:
        perf_end, cpu_end = time.perf_counter(), time.thread_time()
        tick_ms = (perf_end - self.clock.woke_perf) * 1e3
        tick_cpu_ms = (cpu_end - self.clock.woke_cpu) * 1e3
        observe_ms, apply_ms, observe_cpu_ms = self.node.take_timings()
        st = self.stats
        st.ticks += 1
        safe = self.safe_guard is not None and self.safe_guard.active
        fb = self.controller.active is Active.FALLBACK
        info = ServingInfo(
            tick=st.ticks,
            mode="safe" if safe else "normal",
            controller=self.controller.active_name,
            fallback_active=fb,
            events=self.events.drain(),
            observe_ms=observe_ms,
            control_ms=max(tick_ms - observe_ms, 0.0),
            apply_ms=apply_ms,
            backoff_s=self.node.backoff_s,
            dry_run=self.dry_run,
        )
        srec = ServeRecord(rec, info)
        st.recent.append(rec)
        if rec.valid and rec.apps:
            st.valid_ticks += 1
            st.qos_met_ticks += rec.all_qos_met
            for a in rec.apps:
                if math.isfinite(a.tardiness):
                    st.tardiness_sum += a.tardiness
                    st.tardiness_n += 1
        if rec.be and math.isfinite(rec.be_throughput):
            st.be_throughput_sum += rec.be_throughput
            st.be_n += 1
        st.safe_mode_ticks += safe
        st.fallback_ticks += fb
        st.control_ms.append(info.control_ms)
        st.decide_ms.append(rec.decide_ms)
        st.observe_ms.append(observe_ms)
        st.observe_cpu_ms.append(observe_cpu_ms)
        st.control_cpu_ms.append(max(tick_cpu_ms - observe_cpu_ms, 0.0))
        self.last = srec
        self.last_tick_wall = time.monotonic()
        t0 = time.perf_counter()
        for i, sink in enumerate(self.sinks):
            try:
                sink.write(srec)
            except Exception:
                st.sink_errors += 1
                if i not in self._bad_sinks:  # observability never stops control; say it once
                    self._bad_sinks.add(i)
                    log.exception(
                        "output %s failed (counted; further failures are not logged)", type(sink).__name__
                    )
        st.sinks_ms.append((time.perf_counter() - t0) * 1e3)
        if self._gc_managed:  # the idle gap: after the outputs, before the wait
            k = st.ticks
            gc.collect(2 if k % 1200 == 0 else 1 if k % 120 == 0 else 0)
        st.tick_cpu_ms.append(tick_cpu_ms + (time.thread_time() - cpu_end) * 1e3)

    def manage_gc(self) -> None:
        """Collect garbage between ticks only (`ServeConfig.gc_between_ticks`): `run` does this;
        `close` gives the process its automatic collection back."""
        if self._gc_managed or not self.config.gc_between_ticks:
            return
        self._gc_managed = True
        self._gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()  # start-up's heap (imports, models, the node) is never scanned again
        gc.disable()

    def _gc_end(self) -> None:
        if not self._gc_managed:
            return
        self._gc_managed = False
        gc.unfreeze()
        if self._gc_was_enabled:
            gc.enable()

    # -- health and summary -------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, details) for /healthz: running and the last tick recent."""
        now = time.monotonic()
        age = None if self.last_tick_wall is None else now - self.last_tick_wall
        limit = (self.metrics_config.stale_after_intervals if self.metrics_config else 4.0) * self.interval_s
        if self.closed or self.stopping:
            status = "stopping"
        elif age is None:
            status = "starting" if now - self._wall0 < limit else "stale"
        else:
            status = "ok" if age <= limit else "stale"
        safe = self.safe_guard is not None and self.safe_guard.active
        d = {
            "status": status,
            "mode": "safe" if safe else "normal",
            "controller": self.controller.active_name,
            "fallback_active": self.controller.active is Active.FALLBACK,
            "ticks": self.stats.ticks,
            "last_tick_age_s": age,
            "dry_run": self.dry_run,
        }
        return status in ("ok", "starting"), d

    def last_minute(self) -> M.WindowTail:
        """The window tail over the last minute of ticks (env.metrics: p99 of all requests)."""
        recent = list(self.stats.recent)
        return M.window_tail(recent, recent[0].start_s if recent else 0.0, None)

    def summary(self) -> ServeSummary:
        st, ls, ns = self.stats, self.loop.stats, self.node.stats
        wt = self.last_minute()
        wall = max(time.monotonic() - self._wall0, 1e-9)
        cpu_ms = list(st.tick_cpu_ms)
        return ServeSummary(
            controller=self.controller.primary_name,
            fallback=self.controller.fallback_name if self.controller.fallback is not None else None,
            exit_reason=self.exit_reason,
            ticks=st.ticks,
            wall_s=wall,
            interval_s=self.interval_s,
            qos_guarantee=st.qos_met_ticks / st.valid_ticks if st.valid_ticks else math.nan,
            mean_tardiness=st.tardiness_sum / st.tardiness_n if st.tardiness_n else math.nan,
            be_throughput=st.be_throughput_sum / st.be_n if st.be_n else math.nan,
            window_sustained=wt.sustained,
            window_tail_ratio=wt.tail_ratio,
            window_p99_us={a.name: _num(a.p99_us) for a in wt.apps},
            window_note=wt.note,
            valid_ticks=st.valid_ticks,
            safe_mode_ticks=st.safe_mode_ticks,
            safe_mode_entries=self.safe_guard.state.entries if self.safe_guard else 0,
            fallback_ticks=st.fallback_ticks,
            handovers=self.controller.state.handovers,
            hand_backs=self.controller.state.hand_backs,
            applied=ls.applied,
            apply_errors=ls.apply_errors,
            apply_failures=ns.failures,
            apply_deferred=ns.deferred,
            apply_refused=ns.refused,
            observe_errors=ls.observe_errors + ns.observe_failures,
            controller_errors=ls.controller_errors + self.controller.errors_absorbed,
            restore_errors=ls.restore_errors,
            sink_errors=st.sink_errors,
            would_apply=self.dry_node.would_apply if isinstance(self.dry_node, DryRunNode) else 0,
            control_ms_p50=_pct(st.control_ms, 50),
            control_ms_p99=_pct(st.control_ms, 99),
            control_cpu_ms_p99=_pct(st.control_cpu_ms, 99),
            decide_ms_p50=_pct(st.decide_ms, 50),
            decide_ms_p99=_pct(st.decide_ms, 99),
            sinks_ms_p99=_pct(st.sinks_ms, 99),
            loop_cpu_pct=(float(np.mean(cpu_ms)) / (self.interval_s * 1e3) * 100) if cpu_ms else math.nan,
            process_cpu_pct=(time.process_time() - self._cpu0) / wall * 100,
        )


@dataclass(frozen=True)
class ServeSummary:
    """What a serving run did (summary.json; printed at exit). The window figures are over the last
    minute of the run (env.metrics' window tail: the p99 of all requests, from the intervals' latency
    histograms, approximated where the feed sent none). `loop_cpu_pct` is the main thread's
    CPU per tick (observe to outputs) as a share of one core at the interval; `process_cpu_pct` the
    whole process over the run's wall time (with --sim it includes the simulator)."""

    controller: str
    fallback: str | None
    exit_reason: str
    ticks: int
    wall_s: float
    interval_s: float
    qos_guarantee: float
    mean_tardiness: float
    be_throughput: float
    window_sustained: bool  # over the last minute: every app's p99 of all its requests met its target
    window_tail_ratio: float  # over the last minute: the largest p99 / target
    window_p99_us: dict[str, float | None]  # over the last minute, per LC app
    window_note: str
    valid_ticks: int
    safe_mode_ticks: int
    safe_mode_entries: int
    fallback_ticks: int
    handovers: int
    hand_backs: int
    applied: int
    apply_errors: int
    apply_failures: int
    apply_deferred: int
    apply_refused: int
    observe_errors: int
    controller_errors: int
    restore_errors: int
    sink_errors: int
    would_apply: int
    control_ms_p50: float
    control_ms_p99: float
    control_cpu_ms_p99: float  # CPU time of decide + guards + apply (immune to preemption by others)
    decide_ms_p50: float
    decide_ms_p99: float
    sinks_ms_p99: float
    loop_cpu_pct: float
    process_cpu_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (_num(v) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}

    def text(self) -> str:
        def f(x: float, spec: str = ".3f") -> str:
            return "n/a" if not math.isfinite(x) else format(x, spec)

        lines = [
            f"serve: {self.controller}"
            + (f" (fallback {self.fallback})" if self.fallback else "")
            + f", {self.ticks} ticks in {self.wall_s:.1f} s, ended: {self.exit_reason}",
            f"  QoS met in {f(self.qos_guarantee, '.1%')} of {self.valid_ticks} valid intervals, mean p99/target "
            f"{f(self.mean_tardiness)}, BE throughput {f(self.be_throughput)}",
            f"  last minute: p99 of all requests {'meets' if self.window_sustained else 'misses'} the targets "
            f"(largest p99/target {f(self.window_tail_ratio)}; "
            + ", ".join(f"{k} {'n/a' if v is None else f'{v:.0f} us'}" for k, v in self.window_p99_us.items())
            + ")"
            + (f"; {self.window_note}" if self.window_note else ""),
            f"  safe mode {self.safe_mode_ticks} ticks ({self.safe_mode_entries} entries), fallback "
            f"{self.fallback_ticks} ticks ({self.handovers} handovers, {self.hand_backs} hand-backs)",
            f"  applied {self.applied}, actuation failures {self.apply_failures} (deferred {self.apply_deferred}, "
            f"refused {self.apply_refused}), observe errors {self.observe_errors}, controller errors "
            f"{self.controller_errors}"
            + (f", dry-run writes {self.would_apply}" if self.would_apply else ""),
            f"  decide+guards+apply p50 {f(self.control_ms_p50, '.2f')} ms, p99 {f(self.control_ms_p99, '.2f')} ms "
            f"(CPU time p99 {f(self.control_cpu_ms_p99, '.2f')} ms); "
            f"loop CPU {f(self.loop_cpu_pct, '.2f')}% of a core, process {f(self.process_cpu_pct, '.1f')}%",
        ]
        return "\n".join(lines)


# ---- signals -------------------------------------------------------------------------------------------------
class SignalStop:
    """SIGTERM/SIGINT handlers for a whole serving run (a context manager; main thread only).

    Installed before the node starts: a signal that comes before the supervisor exists is
    remembered, and the run then ends before its first tick; once `attach`ed, a signal asks the
    supervisor to stop (the tick in progress finishes, no new one starts, the node is restored).
    A second signal while stopping is only logged: restoring the node is never cut short. The
    previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: str | None = None
        self.sup: Supervisor | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalStop:
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            log.warning("%s again: already stopping (the node is being restored)", name)
            return
        self.requested = f"signal {name}"
        log.info("%s: finishing the tick, then restoring the node", name)
        if self.sup is not None:
            self.sup.request_stop(self.requested)

    def attach(self, sup: Supervisor) -> None:
        self.sup = sup
        if self.requested is not None:
            sup.request_stop(self.requested)


# ---- the run directory ---------------------------------------------------------------------------------------
def save_resolved_config(run_dir: Path, resolved: Mapping[str, Any]) -> Path:
    """Write the resolved config (serve config after CLI overrides, the node's config, the
    controller specs, the command line) as `config.yaml` in the run directory."""
    p = run_dir / "config.yaml"
    p.write_text(yaml.safe_dump(plain_data(resolved), sort_keys=False))
    return p


def make_run_dir(base: str | Path, label: str, out: str | Path | None = None) -> Path:
    """`out` if given (created; must be empty), else `base/<UTC yyyymmdd-HHMMSS>-<label>`."""
    if out is not None:
        p = Path(out)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise ConfigError(f"--out {p}: exists and is not an empty directory")
    else:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:60]
        p = Path(base) / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{safe}"
        stem, i = p.name, 1
        while p.exists():
            p = p.with_name(f"{stem}-{i}")
            i += 1
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # under a file, read-only, /proc, ...
        raise ConfigError(f"run directory {p}: cannot create it ({e.strerror})") from None
    return p
