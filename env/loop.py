"""The control loop: one tick = observe -> decide -> guards -> apply -> record (DESIGN §2, §3).

The same code runs evaluation (a `SimNode` on a `SimClock`), training callbacks and serving (a
real node on a `RealClock`), so a controller is judged exactly as it will run. One tick:

1. `node.observe()`: the interval that just ended. An `OSError` here (a sensor feed died) is
   counted and logged; the tick then records an invalid interval and decides nothing.
2. `controller.decide(observation)`, timed with `time.perf_counter` (the decision time of
   DESIGN §5). Controllers never sleep or do I/O, so this is pure compute.
3. the guard chain (`env.guards`) post-processes the decision (default: clamp to capabilities).
4. `node.apply(allocation)` when the guarded target differs from the allocation in force. An
   `AllocationError` or `OSError` is counted and logged, the last good allocation is kept (and
   re-applied if the node's read-back shows a partial write), and the loop carries on: it never
   dies of an actuation failure (DESIGN §6.5, "degrade safely at run time").
5. a `TickRecord` (frozen, one JSONL line via `to_json()`) goes to `on_tick` and to the result.

The record holds the interval's measurements with the allocation that was *in force during that
interval* (`Observation.allocation`), so latency and allocation line up in plots; the decision
taken at the end of the interval is what the next record's allocation shows.

`TickRecord.scalars()` maps a record to the fixed TensorBoard tag namespaces of DESIGN §6.7
(`qos/`, `alloc/`, `be/`, `loop/`); training adds `train/`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env.controller import Controller
from env.guards import GuardChain, clamp_only
from env.histogram import LatencyHistogram
from env.node import Clock, Node
from env.types import AllocationError, AppAlloc, Decision, Observation, QosVerdict

log = logging.getLogger("coloc.loop")


# ---- records --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AppTick(QosVerdict):
    """One LC app over one interval, as recorded (a JSON-friendly `AppSample`)."""

    name: str
    p99_us: float
    target_us: float
    load_frac: float  # offered load / max load
    load_rps: float
    served_rps: float
    dropped_rps: float
    valid: bool = True
    requests: int = 0  # latency samples of the interval
    histogram: LatencyHistogram | None = None  # their latencies (None: the node reports none)


@dataclass(frozen=True, slots=True)
class BeTick:
    """One BE job over one interval: throughput normalised to the job alone on the node."""

    name: str
    throughput: float


@dataclass(frozen=True, slots=True)
class TickRecord:
    """Everything one tick saw and did (one JSONL line; DESIGN §6.7).

    `time_s` is the end of the observed interval and `interval_s` its length. `alloc` is the
    allocation in force during it (LC apps and BE jobs). `move`/`app`/`reason` describe the
    controller's decision after the guards; `guards` lists what each guard changed; `changed` is
    true when a new allocation was applied at the end of this tick. `decide_ms` is the wall time of
    `decide()`; `errors` lists observe/apply failures of this tick. `valid` is false when the
    observation was invalid (a failed sensor) or could not be taken at all.
    """

    time_s: float
    interval_s: float
    apps: tuple[AppTick, ...]
    alloc: tuple[AppAlloc, ...]
    be: tuple[BeTick, ...]
    power_w: float
    mem_bw_gbps: float
    valid: bool
    move: str | None
    app: str | None
    reason: str
    changed: bool
    decide_ms: float
    guards: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    signals: tuple[tuple[str, str], ...] = ()  # requests the node cannot act on, e.g. ("migrate", "xapian")

    # -- derived ------------------------------------------------------------------------------
    @property
    def start_s(self) -> float:
        """Start of the observed interval."""
        return self.time_s - self.interval_s

    @property
    def be_throughput(self) -> float:
        return sum(b.throughput for b in self.be)

    @property
    def all_qos_met(self) -> bool:
        """Every LC app met its target (an invalid interval never counts as met)."""
        return self.valid and all(a.meets_qos for a in self.apps)

    @property
    def aggregate_load(self) -> float:
        """Sum of the LC apps' offered loads as fractions of their max loads (PARTIES' EMU unit)."""
        return sum(a.load_frac for a in self.apps)

    def app_tick(self, name: str) -> AppTick:
        for a in self.apps:
            if a.name == name:
                return a
        raise KeyError(f"no app {name!r} in this record")

    def alloc_of(self, name: str) -> AppAlloc:
        for a in self.alloc:
            if a.name == name:
                return a
        raise KeyError(f"no allocation for {name!r} in this record")

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN and infinities become null)."""
        return {
            "time_s": self.time_s,
            "interval_s": self.interval_s,
            "valid": self.valid,
            "apps": [
                {
                    "name": a.name,
                    "p99_us": _num(a.p99_us),
                    "target_us": _num(a.target_us),
                    "slack": _num(a.slack),
                    "load_frac": _num(a.load_frac),
                    "load_rps": _num(a.load_rps),
                    "served_rps": _num(a.served_rps),
                    "dropped_rps": _num(a.dropped_rps),
                    "valid": a.valid,
                    "requests": a.requests,
                    "histogram": None if a.histogram is None else a.histogram.encode(),
                }
                for a in self.apps
            ],
            "alloc": [
                {f.name: _field_json(getattr(a, f.name)) for f in dataclasses.fields(a)} for a in self.alloc
            ],
            "be": [{"name": b.name, "throughput": _num(b.throughput)} for b in self.be],
            "be_throughput": _num(self.be_throughput),
            "power_w": _num(self.power_w),
            "mem_bw_gbps": _num(self.mem_bw_gbps),
            "decision": {"move": self.move, "app": self.app, "reason": self.reason, "changed": self.changed},
            "guards": list(self.guards),
            "decide_ms": _num(self.decide_ms),
            "errors": list(self.errors),
            "signals": dict(self.signals),
        }

    def to_json(self) -> str:
        """One JSONL line (no trailing newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TickRecord:
        """Inverse of `to_dict` (null numbers come back as NaN)."""
        dec = d["decision"]
        return cls(
            time_s=float(d["time_s"]),
            interval_s=float(d["interval_s"]),
            apps=tuple(
                AppTick(
                    name=a["name"],
                    p99_us=_unnum(a["p99_us"]),
                    target_us=_unnum(a["target_us"]),
                    load_frac=_unnum(a["load_frac"]),
                    load_rps=_unnum(a["load_rps"]),
                    served_rps=_unnum(a["served_rps"]),
                    dropped_rps=_unnum(a["dropped_rps"]),
                    valid=bool(a["valid"]),
                    requests=int(a.get("requests", 0)),
                    histogram=None if a.get("histogram") is None else LatencyHistogram.decode(a["histogram"]),
                )
                for a in d["apps"]
            ),
            alloc=tuple(AppAlloc(**a) for a in d["alloc"]),
            be=tuple(BeTick(b["name"], _unnum(b["throughput"])) for b in d["be"]),
            power_w=_unnum(d["power_w"]),
            mem_bw_gbps=_unnum(d["mem_bw_gbps"]),
            valid=bool(d["valid"]),
            move=dec["move"],
            app=dec["app"],
            reason=dec["reason"],
            changed=bool(dec["changed"]),
            decide_ms=_unnum(d["decide_ms"]),
            guards=tuple(d.get("guards", ())),
            errors=tuple(d.get("errors", ())),
            signals=tuple((str(k), str(v)) for k, v in d.get("signals", {}).items()),
        )

    @classmethod
    def from_json(cls, line: str) -> TickRecord:
        return cls.from_dict(json.loads(line))

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars under the fixed namespaces of DESIGN §6.7."""
        out: dict[str, float] = {}
        for a in self.apps:
            out[f"qos/{a.name}/p99_over_target"] = a.tardiness
            out[f"qos/{a.name}/slack"] = a.slack
            out[f"qos/{a.name}/load_frac"] = a.load_frac
        out["qos/all_met"] = float(self.all_qos_met)
        for al in self.alloc:
            out[f"alloc/{al.name}/cores"] = al.cores
            out[f"alloc/{al.name}/llc_ways"] = float(al.llc_ways)
            out[f"alloc/{al.name}/freq_mhz"] = float(al.freq_mhz)
            out[f"alloc/{al.name}/memory_gb"] = al.memory_gb
        for b in self.be:
            out[f"be/{b.name}/throughput"] = b.throughput
        out["be/throughput"] = self.be_throughput
        out["loop/decide_ms"] = self.decide_ms
        out["loop/errors"] = float(len(self.errors))
        out["loop/changed"] = float(self.changed)
        out["loop/power_w"] = self.power_w
        return out


def _num(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _field_json(x: Any) -> Any:
    return _num(x) if isinstance(x, float) else x


def _unnum(x: float | None) -> float:
    return math.nan if x is None else float(x)


def record_of(
    obs: Observation,
    decision: Decision,
    *,
    changed: bool,
    decide_ms: float,
    guards: Sequence[str] = (),
    errors: Sequence[str] = (),
) -> TickRecord:
    """The record of one tick from its observation and (guarded) decision. Training callbacks build
    records with this too, so that `env.metrics` is the one place metrics are computed."""
    return TickRecord(
        time_s=obs.time_s,
        interval_s=obs.interval_s,
        apps=tuple(
            AppTick(
                name=s.name,
                p99_us=s.p99_us if s.valid else math.nan,
                target_us=s.target_us,
                load_frac=s.load_frac,
                load_rps=s.load_rps,
                served_rps=s.served_rps,
                dropped_rps=s.dropped_rps,
                valid=s.valid,
                requests=s.requests,
                histogram=s.histogram if s.valid else None,
            )
            for s in obs.apps
        ),
        alloc=obs.allocation.apps,
        be=tuple(BeTick(b.name, b.throughput) for b in obs.be),
        power_w=obs.power_w,
        mem_bw_gbps=obs.mem_bw_gbps,
        valid=obs.valid and all(s.valid for s in obs.apps),
        move=None if decision.move is None else str(decision.move),
        app=decision.app,
        reason=decision.reason,
        changed=changed,
        decide_ms=decide_ms,
        guards=tuple(guards),
        errors=tuple(errors),
        signals=tuple((str(k), str(v)) for k, v in decision.signals.items()),
    )


def read_jsonl(path: Any) -> list[TickRecord]:
    """Records back from a JSONL file written by the loop (for re-analysis and plots)."""
    with open(path) as f:
        return [TickRecord.from_json(line) for line in f if line.strip()]


# ---- the loop -------------------------------------------------------------------------------------
@dataclass
class LoopStats:
    """Counters over the loop's life (serving exports them as Prometheus counters)."""

    ticks: int = 0
    applied: int = 0
    observe_errors: int = 0
    apply_errors: int = 0
    controller_errors: int = 0
    restore_errors: int = 0
    last_errors: list[str] = field(default_factory=list)


class ControlLoop:
    """Drives one controller on one node, tick by tick (module docstring).

    `tick()` runs one tick and returns its record; `run(n_ticks)` runs several on the clock's
    schedule. The controller and guards must have been reset for this node (`run_episode` does it).
    `hold_on_controller_error`: serving sets it so that a controller bug holds the allocation
    (counted and logged) instead of killing the loop; evaluation leaves it off so bugs surface.
    """

    def __init__(
        self,
        node: Node,
        controller: Controller,
        guards: GuardChain | None = None,
        *,
        clock: Clock | None = None,
        hold_on_controller_error: bool = False,
    ) -> None:
        self.node = node
        self.controller = controller
        self.guards = guards if guards is not None else clamp_only()
        self.clock = clock if clock is not None else node.clock
        self.hold_on_controller_error = hold_on_controller_error
        self.stats = LoopStats()
        self._last_good = node.current_allocation()
        self._interval_s = node.capabilities().interval_s
        self._next_s = self.clock.now()

    def tick(self) -> TickRecord:
        caps = self.node.capabilities()
        errors: list[str] = []
        self.stats.ticks += 1
        try:
            obs = self.node.observe()
        except OSError as e:
            self.stats.observe_errors += 1
            msg = f"observe: {e}"
            log.warning("tick %d: %s", self.stats.ticks, msg)
            return TickRecord(
                time_s=self.clock.now(),
                interval_s=self._interval_s,
                apps=(),
                alloc=self._last_good.apps,
                be=(),
                power_w=math.nan,
                mem_bw_gbps=math.nan,
                valid=False,
                move=None,
                app=None,
                reason="no observation",
                changed=False,
                decide_ms=math.nan,
                errors=(msg,),
            )
        t0 = time.perf_counter()
        try:
            decision = self.controller.decide(obs)
        except Exception as e:
            if not self.hold_on_controller_error:
                raise
            self.stats.controller_errors += 1
            msg = f"decide: {type(e).__name__}: {e}"
            log.exception("tick %d: %s", self.stats.ticks, msg)
            errors.append(msg)
            decision = Decision.hold("controller error: holding")
        decide_ms = (time.perf_counter() - t0) * 1e3
        decision, notes = self.guards.apply(decision, obs, caps)
        changed = False
        target = decision.allocation
        current = self.node.current_allocation()
        if target is not None and target != current:
            try:
                applied = self.node.apply(target)
                self._last_good = self.node.current_allocation()
                changed = applied != current  # what the node really did (a dry run changes nothing)
                self.stats.applied += int(changed)
            except (AllocationError, OSError) as e:
                self.stats.apply_errors += 1
                msg = f"apply: {type(e).__name__}: {e}"
                log.warning("tick %d: %s; keeping the last good allocation", self.stats.ticks, msg)
                errors.append(msg)
                self._restore()
        else:
            self._last_good = current
        if errors:
            self.stats.last_errors = errors
        return record_of(obs, decision, changed=changed, decide_ms=decide_ms, guards=notes, errors=errors)

    def _restore(self) -> None:
        """After a failed apply: if the node's read-back differs from the last good allocation (a
        partial write), put the last good one back. A failure here is counted, never raised."""
        try:
            if self.node.current_allocation() != self._last_good:
                self.node.apply(self._last_good)
        except (AllocationError, OSError) as e:
            self.stats.restore_errors += 1
            log.error("could not restore the last good allocation: %s", e)

    def run(
        self,
        n_ticks: int,
        on_tick: Callable[[TickRecord], Any] | None = None,
        stop_when: Callable[[TickRecord], bool] | None = None,
        progress: Any = None,
    ) -> list[TickRecord]:
        """`n_ticks` ticks, one per interval on the clock (a `SimClock` jumps; a `RealClock`
        sleeps). `stop_when(record)` true ends the run early after that record."""
        out: list[TickRecord] = []
        for _ in range(n_ticks):
            rec = self.tick()
            out.append(rec)
            if on_tick is not None:
                on_tick(rec)
            if progress is not None:
                progress.update(1)
            if stop_when is not None and stop_when(rec):
                break
            self._next_s += self._interval_s
            self.clock.sleep_until(self._next_s)
        return out


def run_episode(
    node: Node,
    controller: Controller,
    duration_s: float,
    *,
    guards: GuardChain | None = None,
    clock: Clock | None = None,
    on_tick: Callable[[TickRecord], Any] | None = None,
    rng: np.random.Generator | None = None,
    stop_when: Callable[[TickRecord], bool] | None = None,
    hold_on_controller_error: bool = False,
) -> list[TickRecord]:
    """Run `controller` on `node` for `duration_s` of (node) time and return one record per tick.

    The node must have been reset (a fresh `SimNode` is; it has already simulated its first
    interval, which is the first tick's observation). With `rng`, the controller is reset with
    the node's capabilities and that generator; without, the caller has reset it. The guard chain
    (default: clamp only, DESIGN §3) is reset here. With a `SimNode` whose clock stands at the end
    of its first interval, the records cover intervals ending at dt, 2dt, ..., `duration_s`.
    """
    caps = node.capabilities()
    if rng is not None:
        controller.reset(caps, rng)
    chain = guards if guards is not None else clamp_only()
    chain.reset(caps)
    loop = ControlLoop(
        node, controller, chain, clock=clock, hold_on_controller_error=hold_on_controller_error
    )
    n_ticks = max(1, round(duration_s / caps.interval_s))
    return loop.run(n_ticks, on_tick=on_tick, stop_when=stop_when)
