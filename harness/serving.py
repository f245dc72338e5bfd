"""Serving: run one controller on one node for as long as the node runs, safely (DESIGN §1 use 3).

`serve.py` is the command line; this module is the machinery, node- and controller-agnostic (the
node - a `LinuxNode` or a `SimNode` - and the controllers are built by the caller and injected). Every tick is one `env.loop.ControlLoop` tick (observe ->
decide -> guards -> apply -> record); the supervisor adds its safety pieces *around* that loop by
composition, so evaluation, training and serving still share one tick:

| piece                 | what it is                          | what it does                                 |
|-----------------------|-------------------------------------|----------------------------------------------|
| `SafeModeGuard`       | the last guard of the chain         | latency feed stale or silent (an invalid     |
|                       |                                     | observation) for `enter_after_ticks` ticks:  |
|                       |                                     | BE growth frozen, every LC app back to at    |
|                       |                                     | least its start allocation, until the feed   |
|                       |                                     | is back for `exit_after_ticks` ticks         |
| `SupervisedController`| a `Controller` over the primary and | QoS violated in >= `min_violation_frac` of   |
|                       | a fallback controller               | the valid intervals over `window_s`, or      |
|                       |                                     | `max_controller_errors` decide() errors in a |
|                       |                                     | row: hand over to the fallback (PARTIES by   |
|                       |                                     | default), say why; hand back after           |
|                       |                                     | `stable_s` of met QoS (or never)             |
| `ResilientNode`       | a `Node` wrapper                    | an actuation error (raised, or a knob the    |
|                       |                                     | node could not write) is counted and retried |
|                       |                                     | with exponential backoff on the clock; any   |
|                       |                                     | exception becomes an `OSError` the loop      |
|                       |                                     | survives; a failed observe() becomes an      |
|                       |                                     | explicit invalid observation (safe mode)     |
| `DryRunNode`          | a `Node` wrapper (`--dry-run`)      | apply() validates, diffs and logs the writes |
|                       |                                     | it would make, writes nothing and returns    |
|                       |                                     | the current allocation                       |
| `StoppableClock`      | the loop's clock                    | SIGTERM/SIGINT (`request_stop`) ends the run |
|                       |                                     | between ticks: a tick in progress finishes,  |
|                       |                                     | no new one starts                            |

Each state machine (safe mode, handover, backoff) is explicit frozen state advanced by the
observations' timestamps or by an injected clock, so it is unit-tested without sleeping.
`Supervisor.run()` drives `ControlLoop.run` in chunks (bounded memory for an endless run) and, on
every exit path, closes the node - which restores what it found (a `LinuxNode` replays its
journal) - and the outputs. `SignalStop` turns SIGTERM/SIGINT into `request_stop()` from the
moment it is installed (serve.py: before the node starts). While serving, Python's garbage
collector runs in the idle gap after each tick instead of at random points inside one
(`ServeConfig.gc_between_ticks`; a full automatic collection costs 80-90 ms here).

Observability, one `ServeRecord` per tick (the loop's `TickRecord` plus a `serving` block: mode,
active controller, the tick's events, timings): a JSONL decision log (`env.loop.read_jsonl` reads
it back, so `env.metrics` applies), TensorBoard scalars in the fixed namespaces (`qos/`, `alloc/`,
`be/`, `loop/`), Prometheus `/metrics` and `/healthz` (bound to 127.0.0.1 unless configured;
port 0 = ephemeral), and one console status line per tick.

Overhead: `bench_overhead` runs the whole stack (sinks included) for N ticks without sleeping and
reports decide + guards + apply per tick and the loop's CPU as a share of one core at the interval
(goal: <= 5 ms p99 on a 6-app node and <= 2% of a core at 500 ms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
import logging
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import yaml

from env.allocations import allocation_diff, describe_diff, structure
from env.config import ConfigError, build, load_yaml, plain_data
from env.controller import Controller
from env.guards import GuardChain, GuardsConfig
from env.loop import ControlLoop, TickRecord
from env.node import Clock, Node, RealClock
from env.types import (
    Allocation,
    AllocationError,
    AppSample,
    BeSample,
    Capabilities,
    Decision,
    Observation,
    Usage,
    validate_allocation,
)
from harness.registry import LEARNED_SPECS

log = logging.getLogger("coloc.serve")

_EPS = 1e-6
CONTROL_P99_GOAL_MS = 5.0
CPU_GOAL_PCT = 2.0


# ======================================================================================================
# Configuration (configs/serve/*.yaml)
# ======================================================================================================
@dataclass(frozen=True)
class SimSection:
    """`--sim`: a SimNode on a scenario, for a rehearsal. `speed` is simulated seconds per real
    second (1 = real time; 0 = as fast as the machine goes)."""

    scenario: str = "mix3-const"  # configs/scenarios/<name>.yaml or a path
    speed: float = 1.0
    seed: int | None = None  # None: the scenario's

    def __post_init__(self) -> None:
        if not (self.speed >= 0):
            raise ConfigError(f"sim.speed: {self.speed} must be >= 0")


@dataclass(frozen=True)
class LinuxSection:
    """The real node: a LinuxNode config (hw/config.py, configs/node/linux-*.yaml).

    `processes` maps an app to a process name: at start-up every process of that name (its
    /proc/PID/comm) and its descendants are moved into the app's cgroup (created by the node and
    removed again on close; the processes go back where they were). `feed` overrides the node
    config's latency feed URL."""

    config: str
    processes: dict[str, str] = field(default_factory=dict)
    feed: str | None = None


@dataclass(frozen=True)
class SafeModeConfig:
    """Safe mode on a stale or silent latency feed (an invalid observation)."""

    enabled: bool = True
    enter_after_ticks: int = 1  # consecutive invalid ticks before entering
    exit_after_ticks: int = 2  # consecutive valid ticks before leaving

    def __post_init__(self) -> None:
        if self.enter_after_ticks < 1 or self.exit_after_ticks < 1:
            raise ConfigError("safe_mode: enter_after_ticks and exit_after_ticks must be >= 1")


@dataclass(frozen=True)
class FallbackConfig:
    """Handing a learned controller over to a rule-based one when it lets QoS violations persist.

    `applies_to`: `auto` supervises learned and BO controllers (specs `rl:*`, `bo`), `always`
    any controller, `never` none. Hand over when, over the trailing `window_s` (the active
    controller having been in charge at least that long), QoS was missed in at least
    `min_violation_frac` of the valid intervals, or after `max_controller_errors` decide() errors in
    a row. `hand_back: after_stable` returns control once the fallback has met every target in
    every valid interval of the last `stable_s`; after `max_handovers` handovers the fallback
    keeps control for good (no flapping). Invalid intervals (a dead feed) count neither way: that
    is safe mode's business."""

    controller: str = "parties"
    applies_to: Literal["auto", "always", "never"] = "auto"
    window_s: float = 10.0
    min_violation_frac: float = 0.8
    max_controller_errors: int = 3
    hand_back: Literal["never", "after_stable"] = "after_stable"
    stable_s: float = 60.0
    max_handovers: int = 3

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not self.stable_s > 0:
            raise ConfigError("fallback: window_s and stable_s must be > 0")
        if not 0 < self.min_violation_frac <= 1:
            raise ConfigError(f"fallback.min_violation_frac: {self.min_violation_frac} outside (0, 1]")
        if self.max_controller_errors < 1 or self.max_handovers < 1:
            raise ConfigError("fallback: max_controller_errors and max_handovers must be >= 1")


@dataclass(frozen=True)
class RetryConfig:
    """Backoff after a failed actuation: the k-th consecutive failure defers the next attempt by
    min(base_s x factor^(k-1), max_s) on the loop's clock (a rollback to the last good allocation
    is never deferred)."""

    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.factor >= 1 and self.max_s >= self.base_s):
            raise ConfigError("retry: need base_s >= 0, factor >= 1 and max_s >= base_s")

    def delay_s(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.base_s * self.factor ** (failures - 1), self.max_s)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus `/metrics` and `/healthz`. `/healthz` answers 503 when the last tick is older
    than `stale_after_intervals` intervals (a hung loop) or the supervisor is not running."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9178  # 0 = any free port (tests)
    stale_after_intervals: float = 4.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"metrics.port: {self.port} outside 0..65535")
        if not self.stale_after_intervals > 0:
            raise ConfigError("metrics.stale_after_intervals must be > 0")


@dataclass(frozen=True)
class OutputConfig:
    """Where a run writes: `dir/<UTC time>-<controller>/` (or serve.py --out) holding config.yaml
    (the resolved config), decisions.jsonl, tb/ (TensorBoard), serve.log and summary.json."""

    dir: str = "runs/serve"
    jsonl: bool = True
    tensorboard: bool = True
    console: bool = True  # one status line per tick on stdout (serve.py --quiet turns it off)


@dataclass(frozen=True)
class ServeConfig:
    """A serving run (configs/serve/*.yaml). Exactly the sections below; unknown keys are errors.

    `linux` is the real node, `sim` the rehearsal node (`serve.py --sim`); a config may have both.
    `interval_s` None keeps the node's interval (serve.py --interval-ms overrides); `duration_s`
    None serves until SIGTERM/SIGINT. `gc_between_ticks`: the heap built at start-up is frozen
    (`gc.freeze`) and automatic collection is replaced by one young collection after every tick's
    outputs (older generations every minute / ten minutes): measured here, automatic collections
    cost 5-10 ms (young) and 80-90 ms (full) at random points inside a tick. `guards` is the chain in front of the node: keys not given
    keep the serving defaults (`GuardsConfig.serving()`: every guard on), null turns a guard off."""

    name: str = "serve"
    description: str = ""
    linux: LinuxSection | None = None
    sim: SimSection | None = None
    interval_s: float | None = None
    duration_s: float | None = None
    seed: int = 0
    gc_between_ticks: bool = True  # Python's GC in the idle gap after each tick, never inside one
    guards: GuardsConfig = field(default_factory=GuardsConfig.serving)
    safe_mode: SafeModeConfig = field(default_factory=SafeModeConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.interval_s is not None and not self.interval_s > 0:
            raise ConfigError(f"interval_s: {self.interval_s} must be > 0")
        if self.duration_s is not None and not self.duration_s >= 0:
            raise ConfigError(f"duration_s: {self.duration_s} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_serve_config(data: Any, where: str) -> ServeConfig:
    """`ServeConfig` from YAML data, strictly (`env.config.build`; guards merged over the serving
    defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of serve settings, got {type(data).__name__}")
    data = dict(data)
    g = data.get("guards")
    if isinstance(g, Mapping):
        data["guards"] = {**GuardsConfig.serving().to_dict(), **g}
    elif "guards" in data and g is None:
        data["guards"] = GuardsConfig.serving().to_dict()
    return build(ServeConfig, data, where)


def load_serve_config(path: str | Path) -> ServeConfig:
    """The serving config at `path` (configs/serve/*.yaml), strictly checked (`parse_serve_config`)."""
    p = Path(path)
    return parse_serve_config(load_yaml(p), p.name)


def wants_fallback(spec: str, cfg: FallbackConfig) -> bool:
    """Whether controller `spec` runs under a fallback (FallbackConfig.applies_to)."""
    if cfg.applies_to == "never" or spec.strip() == cfg.controller.strip():
        return False
    if cfg.applies_to == "always":
        return True
    return spec.strip().partition(":")[0] in LEARNED_SPECS


# ======================================================================================================
# Events: what the supervisor did and why (logged, and in the tick's record)
# ======================================================================================================
@dataclass(frozen=True, slots=True)
class ServeEvent:
    """One thing the supervisor did and why, at observation time `time_s` (logged, and in the tick's record)."""

    time_s: float
    kind: str  # safe_mode_on/off, handover, hand_back, controller_error, apply_failed, apply_partial,
    # apply_deferred, apply_recovered, apply_refused, observe_failed, dry_run, stop
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": _num(self.time_s), "kind": self.kind, "message": self.message}


_EVENT_LEVELS = {
    "safe_mode_on": logging.WARNING,
    "handover": logging.WARNING,
    "controller_error": logging.ERROR,
    "apply_failed": logging.WARNING,
    "apply_partial": logging.WARNING,
    "apply_refused": logging.WARNING,
    "observe_failed": logging.WARNING,
    "apply_deferred": logging.DEBUG,
}


class EventLog:
    """Collects the events of the current tick (drained into its record) and logs each one."""

    def __init__(self) -> None:
        self._pending: list[ServeEvent] = []
        self.counts: dict[str, int] = {}

    def emit(self, time_s: float, kind: str, message: str) -> ServeEvent:
        ev = ServeEvent(time_s, kind, message)
        self._pending.append(ev)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        log.log(_EVENT_LEVELS.get(kind, logging.INFO), "[%s] %s", kind, message)
        return ev

    def drain(self) -> tuple[ServeEvent, ...]:
        out, self._pending = tuple(self._pending), []
        return out


# ======================================================================================================
# Safe mode
# ======================================================================================================
def feed_ok(obs: Observation) -> bool:
    """The observation is a measurement: valid, not stale, every LC sample valid."""
    return obs.valid and not obs.stale_s > 0 and all(s.valid for s in obs.apps)


_RAISE_FIELDS = ("cores", "llc_ways", "freq_mhz", "memory_gb", "disk_mbps", "net_gbps", "mba_pct")


def safe_allocation(
    target: Allocation | None, current: Allocation, start: Allocation, caps: Capabilities
) -> Allocation:
    """The safe-mode version of `target` (None = keep `current`): every LC app holds at least its
    `start` allocation in every resource (cores, LLC ways, frequency, memory, disk, network, MBA; no
    CPU quota if it started without one), and no BE job holds more of anything than it does in
    `current` (BE growth frozen). What the LC apps need beyond the node's totals comes from the BE
    jobs first (down to 0 cores, the minimum LLC ways / memory, 0 disk and network), then from LC
    apps above their start amounts. Needs the start's core groups and CLOSes: a target or current
    allocation grouped otherwise is replaced by the start (an LC app sharing a group cannot be
    "at least" its exclusive start share)."""
    lc = {a.name for a in caps.lc_apps}
    struct = structure(start)
    if target is not None and structure(target) == struct:
        out = target
    elif structure(current) == struct:
        out = current
    else:
        out = start
    for name in (a.name for a in caps.lc_apps):
        b, s = out[name], start[name]
        changes: dict[str, Any] = {f: max(getattr(b, f), getattr(s, f)) for f in _RAISE_FIELDS}
        changes["cpu_quota"] = (
            0.0 if (s.cpu_quota == 0 or b.cpu_quota == 0) else max(b.cpu_quota, s.cpu_quota)
        )
        if any(getattr(b, k) != v for k, v in changes.items()):
            out = out.replace_app(name, **changes)
    cur = {a.name: a for a in current.apps}
    for a in caps.be_apps:
        b = out[a.name]
        c = cur.get(a.name, b)
        c_cores = c.cpu_quota if c.cpu_quota > 0 else c.cores  # CPU it may really use now
        frozen: dict[str, Any] = {
            "cores": min(b.cores, math.floor(c_cores / caps.core_step + 1e-9) * caps.core_step),
            "llc_ways": max(min(b.llc_ways, c.llc_ways), caps.min_llc_ways),
            "freq_mhz": min(b.freq_mhz, c.freq_mhz),
            "memory_gb": min(b.memory_gb, c.memory_gb),
            "disk_mbps": min(b.disk_mbps, c.disk_mbps),
            "net_gbps": min(b.net_gbps, c.net_gbps),
            "mba_pct": min(b.mba_pct, c.mba_pct),
        }
        if any(getattr(b, k) != v for k, v in frozen.items()):
            out = out.replace_app(a.name, **frozen)
    out = _fit_totals(out, start, caps, lc)
    for app in out.apps:  # a quota never exceeds its group's cores
        if app.cpu_quota > app.cores + _EPS:
            out = out.replace_app(app.name, cpu_quota=app.cores)
    return out


def _fit_totals(alloc: Allocation, start: Allocation, caps: Capabilities, lc: set[str]) -> Allocation:
    """Shrink pooled resources back under the node's totals: BE units first (down to their minimum),
    then LC units above their start amounts (largest excess first). Cores and LLC ways go in whole
    steps; memory, disk and network by what is in excess (at most a step at a time)."""
    specs = (  # field, pooling key, total, step, whole steps, BE minimum
        ("cores", "core_group", caps.cores, caps.core_step, True, 0.0),
        ("llc_ways", "clos", float(caps.llc_ways), 1.0, True, float(caps.min_llc_ways)),
        ("memory_gb", "name", caps.memory_gb, caps.memory_step_gb, False, caps.min_memory_gb),
        ("disk_mbps", "name", caps.disk_mbps, caps.disk_step_mbps, False, 0.0),
        ("net_gbps", "name", caps.net_gbps, caps.net_step_gbps, False, 0.0),
    )
    for fld, key, total, step, whole, be_min in specs:
        if step <= 0:
            continue
        while True:
            units: dict[Any, tuple[float, list[str]]] = {}
            for a in alloc.apps:
                k = getattr(a, key)
                if k in units:
                    units[k][1].append(a.name)
                else:
                    units[k] = (float(getattr(a, fld)), [a.name])
            excess = sum(v for v, _ in units.values()) - total
            if excess <= _EPS:
                break
            # (room above the floor, key, members, floor, amount) of every unit that can give
            cands = []
            for k, (v, m) in units.items():
                is_lc = bool(set(m) & lc)
                floor = max(float(getattr(start[x], fld)) for x in m if x in start) if is_lc else be_min
                if v - floor > _EPS:
                    cands.append((not is_lc, v - floor, str(k), m, floor, v))
            if not cands:
                break  # cannot fit (the start allocation itself does not): validation will say so
            _, _, _, members, floor, v = max(cands, key=lambda c: (c[0], c[1], c[2]))
            new = max(floor, v - (step if whole else min(step, excess)))
            alloc = alloc.replace_app(members[0], **{fld: round(new) if fld == "llc_ways" else new})
    return alloc


@dataclass(frozen=True)
class SafeModeState:
    active: bool = False
    bad_ticks: int = 0
    good_ticks: int = 0
    since_s: float | None = None
    entries: int = 0


class SafeModeGuard:
    """The safe-mode guard (module docstring). Runs last in the chain so nothing after it can undo
    it. `start` is the allocation each LC app started from (the node's start allocation)."""

    name = "safe_mode"

    def __init__(
        self,
        config: SafeModeConfig,
        start: Allocation | Callable[[Capabilities], Allocation],
        events: EventLog | None = None,
    ) -> None:
        self.config = config
        self._start_src = start
        self.start: Allocation | None = start if isinstance(start, Allocation) else None
        self.events = events
        self.state = SafeModeState()

    @property
    def active(self) -> bool:
        return self.state.active

    def reset(self, caps: Capabilities) -> None:
        self.state = SafeModeState()
        if not isinstance(self._start_src, Allocation):
            self.start = self._start_src(caps)

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        cfg, s = self.config, self.state
        ok = feed_ok(obs)
        bad = 0 if ok else s.bad_ticks + 1
        good = s.good_ticks + 1 if ok else 0
        active, since, entries = s.active, s.since_s, s.entries
        if not active and bad >= cfg.enter_after_ticks:
            active, since, entries = True, obs.time_s, entries + 1
            self._emit(
                obs.time_s,
                "safe_mode_on",
                f"latency feed lost ({_why_invalid(obs)}): BE growth "
                "frozen, LC apps at least at their start allocation",
            )
        elif active and good >= cfg.exit_after_ticks:
            self._emit(
                obs.time_s,
                "safe_mode_off",
                f"latency feed back for {good} intervals after "
                f"{obs.time_s - (since or obs.time_s):.1f} s in safe mode",
            )
            active, since = False, None
        self.state = SafeModeState(active, bad, good, since, entries)
        if not active:
            return decision, ""
        assert self.start is not None
        base = decision.allocation if decision.allocation is not None else obs.allocation
        safe = safe_allocation(decision.allocation, obs.allocation, self.start, caps)
        if safe == base:
            return decision, ""
        changed = describe_diff(base, safe, limit=4) or "no change"
        return dataclasses.replace(decision, allocation=safe, move=None, app=None), f"safe mode: {changed}"

    def _emit(self, t: float, kind: str, msg: str) -> None:
        if self.events is not None:
            self.events.emit(t, kind, msg)


def _why_invalid(obs: Observation) -> str:
    bad = [s.name for s in obs.apps if not s.valid]
    parts = []
    if bad:
        parts.append(f"no valid latency for {', '.join(bad)}")
    if obs.stale_s >= 0.05:
        parts.append(f"stale for {obs.stale_s:.1f} s")
    if not parts:
        parts.append("invalid observation")
    return "; ".join(parts)


# ======================================================================================================
# Fallback handover
# ======================================================================================================
class Active(enum.Enum):
    PRIMARY = "primary"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class HandoverState:
    """`history`: (time_s, QoS violated) of the valid intervals under the active controller, the
    trailing max(window_s, stable_s) of them."""

    active: Active = Active.PRIMARY
    since_s: float | None = None  # when the active controller took charge (observation time)
    history: tuple[tuple[float, bool], ...] = ()
    consecutive_errors: int = 0
    handovers: int = 0
    hand_backs: int = 0
    final: bool = False  # the fallback keeps control for good


class SupervisedController:
    """A `Controller` that runs `primary` and hands over to `fallback` (module docstring,
    `FallbackConfig`). Without a fallback it is the primary, unchanged (errors propagate to the
    loop, which holds). The controller taking over is reset first, so no stale multi-tick state
    (PARTIES' pending adjustment, a BO search) acts on a node it did not shape."""

    def __init__(
        self,
        primary: Controller,
        fallback: Controller | None = None,
        config: FallbackConfig | None = None,
        *,
        events: EventLog | None = None,
        primary_name: str | None = None,
        fallback_name: str | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.config = config or FallbackConfig()
        self.events = events
        self.primary_name = primary_name or str(getattr(primary, "name", "primary"))
        self.fallback_name = fallback_name or (str(getattr(fallback, "name", "fallback")) if fallback else "")
        self.name = self.primary_name
        self.state = HandoverState()
        self.errors_absorbed = 0  # decide() errors answered by a handover instead of raised to the loop
        self._caps: Capabilities | None = None
        self._rng = np.random.default_rng(0)

    @property
    def active(self) -> Active:
        return self.state.active

    @property
    def active_name(self) -> str:
        return self.primary_name if self.state.active is Active.PRIMARY else self.fallback_name

    @property
    def controller(self) -> Controller:
        if self.state.active is Active.PRIMARY or self.fallback is None:
            return self.primary
        return self.fallback

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None:
        self._caps = capabilities
        self._rng = rng
        self.state = HandoverState()
        self.primary.reset(capabilities, _child(rng))
        if self.fallback is not None:  # validated now (a bad fallback fails at start, before any write)
            self.fallback.reset(capabilities, _child(rng))

    def decide(self, observation: Observation) -> Decision:
        self._advance(observation)
        ctl = self.controller
        try:
            decision = ctl.decide(observation)
        except Exception as e:
            if self.fallback is None or self.state.active is Active.FALLBACK:
                raise
            n = self.state.consecutive_errors + 1
            self.state = dataclasses.replace(self.state, consecutive_errors=n)
            self._emit(
                observation.time_s,
                "controller_error",
                f"{self.primary_name}: decide() raised {type(e).__name__}: {e} ({n} in a row)",
            )
            if n < self.config.max_controller_errors:
                raise
            self.errors_absorbed += 1
            self._switch(
                Active.FALLBACK, observation.time_s, f"{n} decide() errors in a row ({type(e).__name__}: {e})"
            )
            decision = self.fallback.decide(observation)
        else:
            if self.state.consecutive_errors:
                self.state = dataclasses.replace(self.state, consecutive_errors=0)
        if self.state.active is Active.FALLBACK:
            decision = dataclasses.replace(
                decision, reason=f"[fallback {self.fallback_name}] {decision.reason}"
            )
        return decision

    # -- the state machine ------------------------------------------------------------------------
    def _advance(self, obs: Observation) -> None:
        s = self.state
        t = obs.time_s
        since = s.since_s if s.since_s is not None else t - obs.interval_s  # the first interval's start
        history = s.history
        if feed_ok(obs):
            keep = max(self.config.window_s, self.config.stable_s) + _EPS
            history = (*(h for h in history if h[0] > t - keep), (t, not obs.all_qos_met))
        self.state = s = dataclasses.replace(s, since_s=since, history=history)
        if self.fallback is None or s.final:
            return
        cfg = self.config
        if s.active is Active.PRIMARY:
            if t - since < cfg.window_s - _EPS:
                return
            window = [v for (ht, v) in history if ht > t - cfg.window_s + _EPS]
            if not window:
                return
            bad = sum(window)
            if bad / len(window) >= cfg.min_violation_frac - 1e-9:
                self._switch(
                    Active.FALLBACK,
                    t,
                    f"QoS missed in {bad} of {len(window)} valid intervals over the last {cfg.window_s:g} s "
                    f"(>= {cfg.min_violation_frac:.0%})",
                )
        elif cfg.hand_back == "after_stable" and t - since >= cfg.stable_s - _EPS:
            window = [v for (ht, v) in history if ht > t - cfg.stable_s + _EPS]
            if window and not any(window):
                self._switch(
                    Active.PRIMARY,
                    t,
                    f"every target met in all {len(window)} valid intervals of the last {cfg.stable_s:g} s",
                )

    def _switch(self, to: Active, t: float, why: str) -> None:
        s = self.state
        assert self._caps is not None and self.fallback is not None
        if to is Active.FALLBACK:
            handovers = s.handovers + 1
            final = handovers >= self.config.max_handovers or self.config.hand_back == "never"
            self.fallback.reset(self._caps, _child(self._rng))
            self.state = HandoverState(Active.FALLBACK, t, (), 0, handovers, s.hand_backs, final)
            extra = " for good" if final else ""
            self._emit(t, "handover", f"{self.primary_name} -> {self.fallback_name}{extra}: {why}")
        else:
            self.primary.reset(self._caps, _child(self._rng))
            self.state = HandoverState(Active.PRIMARY, t, (), 0, s.handovers, s.hand_backs + 1, False)
            self._emit(t, "hand_back", f"{self.fallback_name} -> {self.primary_name}: {why}")

    def _emit(self, t: float, kind: str, msg: str) -> None:
        if self.events is not None:
            self.events.emit(t, kind, msg)


def _child(rng: np.random.Generator) -> np.random.Generator:
    return np.random.default_rng(rng.integers(2**63))


# ======================================================================================================
# Node wrappers: retries with backoff, fault containment, timing; dry run
# ======================================================================================================
class ActuationError(OSError):
    """A node's apply() failed (any exception but invalid input); the loop keeps the last good
    allocation and the next attempt waits out the backoff."""


class ApplyDeferred(OSError):
    """apply() not attempted: backing off after failed attempts."""


@dataclass
class ActuationStats:
    attempts: int = 0
    failures: int = 0  # raised, or a knob the node reported it could not write
    partial: int = 0  # of which the node applied the rest and kept last good values
    deferred: int = 0
    refused: int = 0  # invalid input (AllocationError): not retried
    recovered: int = 0
    observe_failures: int = 0


class ResilientNode:
    """`Node` wrapper of the supervisor (module docstring).

    `error_count`, when given, returns a running count of write errors the node swallowed (a
    `LinuxNode` keeps a knob's last good value, counts the error and returns the read-back instead
    of raising): an apply() during which it grows is a (partial) failure, backed off like a raised
    one. `observe_ms`/`apply_ms` time the inner calls of the current tick (`take_timings`)."""

    def __init__(
        self,
        inner: Node,
        *,
        clock: Clock,
        retry: RetryConfig | None = None,
        events: EventLog | None = None,
        error_count: Callable[[], int] | None = None,
    ) -> None:
        self.inner = inner
        self._clock_loop = clock
        self.retry = retry or RetryConfig()
        self.events = events
        self.error_count = error_count
        self.stats = ActuationStats()
        self.consecutive_failures = 0
        self.retry_at_s: float | None = None
        self._last_ok: Allocation | None = None
        self._last_obs_s: float | None = None
        self._observe_s = 0.0
        self._observe_cpu_s = 0.0
        self._apply_s = 0.0

    # -- Node protocol ------------------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        return self.inner.clock

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def current_allocation(self) -> Allocation:
        return self.inner.current_allocation()

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation:
        return self.inner.reset(seed, scenario)

    def close(self) -> None:
        self.inner.close()

    def observe(self) -> Observation:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            obs = self.inner.observe()
            self._last_obs_s = obs.time_s if feed_ok(obs) else self._last_obs_s
        except Exception as e:  # a sensor failure is an explicit invalid observation, never a crash
            self.stats.observe_failures += 1
            now = self._clock_loop.now()
            self._emit(now, "observe_failed", f"observe() raised {type(e).__name__}: {e}")
            obs = self._invalid_observation(now)
        self._observe_s += time.perf_counter() - t0
        self._observe_cpu_s += time.thread_time() - c0
        return obs

    def apply(self, allocation: Allocation) -> Allocation:
        t0 = time.perf_counter()
        try:
            return self._apply(allocation)
        finally:
            self._apply_s += time.perf_counter() - t0

    # -- internals ----------------------------------------------------------------------------------
    def _apply(self, allocation: Allocation) -> Allocation:
        now = self._clock_loop.now()
        if self._last_ok is None:
            with contextlib.suppress(Exception):
                self._last_ok = self.inner.current_allocation()
        if self._last_ok is not None and allocation == self._last_ok:
            # a rollback to the last good allocation (env.loop after a failed apply): never deferred,
            # and it leaves the backoff of the failing target alone
            try:
                applied = self.inner.apply(allocation)
            except AllocationError:
                raise
            except Exception as e:
                self.stats.failures += 1
                raise ActuationError(f"rollback: {type(e).__name__}: {e}") from e
            self._last_ok = applied
            return applied
        if self.retry_at_s is not None and now < self.retry_at_s - _EPS:
            self.stats.deferred += 1
            msg = (
                f"backing off after {self.consecutive_failures} failed attempt(s); "
                f"next attempt in {self.retry_at_s - now:.1f} s"
            )
            self._emit(now, "apply_deferred", msg)
            raise ApplyDeferred(msg)
        self.stats.attempts += 1
        before = self.error_count() if self.error_count is not None else 0
        try:
            applied = self.inner.apply(allocation)
        except AllocationError as e:
            self.stats.refused += 1
            self._emit(now, "apply_refused", f"the node refused the allocation: {e}")
            raise
        except Exception as e:
            self._failed(now, f"{type(e).__name__}: {e}")
            raise ActuationError(f"{type(e).__name__}: {e}") from e
        errors = (self.error_count() if self.error_count is not None else 0) - before
        if errors > 0:
            self.stats.partial += 1
            self._failed(now, f"{errors} knob write(s) failed; those knobs keep their last good values")
        else:
            if self.consecutive_failures:
                self.stats.recovered += 1
                self._emit(
                    now, "apply_recovered", f"applied after {self.consecutive_failures} failed attempt(s)"
                )
            self.consecutive_failures = 0
            self.retry_at_s = None
        self._last_ok = applied
        return applied

    def _failed(self, now: float, what: str) -> None:
        self.stats.failures += 1
        self.consecutive_failures += 1
        delay = self.retry.delay_s(self.consecutive_failures)
        self.retry_at_s = now + delay
        kind = "apply_partial" if what[0].isdigit() else "apply_failed"
        self._emit(now, kind, f"{what} (failure {self.consecutive_failures} in a row; retry in {delay:g} s)")

    def _invalid_observation(self, now: float) -> Observation:
        caps = self.inner.capabilities()
        alloc: Allocation | None
        try:
            alloc = self.inner.current_allocation()
        except Exception:
            alloc = self._last_ok
        if alloc is None:
            raise RuntimeError("the node has neither an observation nor an allocation")  # before reset
        nan = math.nan
        usage = Usage(nan, nan, nan, nan, nan, nan, nan)
        stale = now - self._last_obs_s if self._last_obs_s is not None else caps.interval_s
        return Observation(
            time_s=now,
            interval_s=caps.interval_s,
            apps=tuple(
                AppSample(a.name, nan, a.qos_target_us, nan, nan, nan, nan, 0, usage, valid=False)
                for a in caps.lc_apps
            ),
            be=tuple(BeSample(a.name, nan, usage) for a in caps.be_apps),
            allocation=alloc,
            mem_bw_gbps=nan,
            power_w=nan,
            valid=False,
            stale_s=max(stale, caps.interval_s),
        )

    def take_timings(self) -> tuple[float, float, float]:
        """(observe_ms, apply_ms, observe CPU ms) of the inner node since the last call."""
        out = (self._observe_s * 1e3, self._apply_s * 1e3, self._observe_cpu_s * 1e3)
        self._observe_s = self._apply_s = self._observe_cpu_s = 0.0
        return out

    @property
    def backoff_s(self) -> float:
        if self.retry_at_s is None:
            return 0.0
        return max(0.0, self.retry_at_s - self._clock_loop.now())

    def _emit(self, t: float, kind: str, msg: str) -> None:
        if self.events is not None:
            self.events.emit(t, kind, msg)


class DryRunNode:
    """`--dry-run`: apply() validates the allocation, diffs it against the one in force, logs the
    writes it would make and returns the allocation in force; nothing reaches the node. The
    observations are the node's, reported with the allocation in force (`assumed`: what to take
    as in force when the node has applied nothing, e.g. a LinuxNode that was not reset)."""

    def __init__(
        self, inner: Node, *, events: EventLog | None = None, assumed: Allocation | None = None
    ) -> None:
        self.inner = inner
        self.events = events
        self._alloc = assumed if assumed is not None else inner.current_allocation()
        self.would_apply = 0
        self.last_writes: tuple[str, ...] = ()

    @property
    def clock(self) -> Clock:
        return self.inner.clock

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def current_allocation(self) -> Allocation:
        return self._alloc

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation:
        raise RuntimeError("a dry run never resets the node (reset applies the start allocation)")

    def close(self) -> None:
        self.inner.close()

    def observe(self) -> Observation:
        obs = self.inner.observe()
        return obs if obs.allocation == self._alloc else dataclasses.replace(obs, allocation=self._alloc)

    def apply(self, allocation: Allocation) -> Allocation:
        validate_allocation(allocation, self.capabilities())
        writes = tuple(allocation_diff(self._alloc, allocation))
        self.last_writes = writes
        if writes:
            self.would_apply += 1
            if self.events is not None:
                self.events.emit(self.clock.now(), "dry_run", "would write: " + ", ".join(writes))
        return self._alloc


# ======================================================================================================
# Stopping between ticks
# ======================================================================================================
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


# ======================================================================================================
# Records
# ======================================================================================================
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


def _num(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ======================================================================================================
# Sinks: JSONL, TensorBoard, console; Prometheus is served from the supervisor's state
# ======================================================================================================
class Sink(Protocol):
    def write(self, rec: ServeRecord) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """The decision log: one line per tick, flushed at once (a killed run leaves whole lines)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def write(self, rec: ServeRecord) -> None:
        self._f.write(rec.to_json() + "\n")

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class TensorBoardSink:
    """TensorBoard scalars (`ServeRecord.scalars`): one event per tick holding every scalar, step =
    tick. Written by TensorBoard's own event writer (a background thread), no torch needed."""

    def __init__(self, logdir: str | Path, flush_secs: float = 5.0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._Event, self._Summary = Event, Summary
        self._w = EventFileWriter(str(logdir), flush_secs=flush_secs)

    def write(self, rec: ServeRecord) -> None:
        S = self._Summary
        values = [S.Value(tag=k, simple_value=v) for k, v in rec.scalars().items() if math.isfinite(v)]
        self._w.add_event(self._Event(wall_time=time.time(), step=rec.serving.tick, summary=S(value=values)))

    def close(self) -> None:
        self._w.close()


class ConsoleSink:
    """The live view: one compact status line per tick (`format_status`)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    def write(self, rec: ServeRecord) -> None:
        print(format_status(rec), file=self.stream, flush=True)

    def close(self) -> None:
        pass


def _lat(us: float) -> str:
    if not math.isfinite(us):
        return "--"
    return f"{us / 1000:.1f}ms" if us >= 10_000 else f"{us:.0f}us"


def format_status(rec: ServeRecord) -> str:
    """`t=  12.0s #24 normal parties  QoS ok   memcached 412us/600us 50%  | BE 0.42 | <UP,CORE> memcached | 0.4 ms`"""
    t, s = rec.tick, rec.serving
    if not t.apps:
        qos = "NO DATA"
    elif not t.valid:
        qos = "FEED?  "
    else:
        qos = "QoS ok " if t.all_qos_met else "QoS MISS"
    apps = "  ".join(
        f"{a.name} {_lat(a.p99_us)}/{_lat(a.target_us)}"
        + (f" {a.load_frac:.0%}" if math.isfinite(a.load_frac) else "")
        for a in t.apps
    )
    mode = "SAFE  " if s.mode == "safe" else "normal"
    ctl = f"{s.controller}{'*' if s.fallback_active else ''}"
    if t.move and t.move != "HOLD":
        what = f"{t.move} {t.app or ''}".strip()
    elif t.changed:
        what = "would apply" if s.dry_run else "applied"
    else:
        what = "hold"
    be = f"BE {t.be_throughput:.2f}" if t.be and math.isfinite(t.be_throughput) else "BE --"
    ev = f" ! {s.events[-1].kind}" if s.events else ""
    return f"t={t.time_s:7.1f}s #{s.tick:<5d} {mode} {ctl:<10} {qos} {apps} | {be} | {what} | {s.control_ms:.1f} ms{ev}"


# ======================================================================================================
# The supervisor
# ======================================================================================================
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


def _pct(xs: Sequence[float], q: float) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.percentile(xs, q)) if xs else math.nan


class Supervisor:
    """Runs `controller` on `node` through `env.loop.ControlLoop`, with the safety pieces of the
    module docstring, until the duration is over or `request_stop()`; then restores the node.

    The caller builds and injects the node (started; a LinuxNode reset to its start allocation,
    unless `dry_run`), the controllers (the fallback is None when none applies) and the guard
    chain; `start_allocation` is each LC app's start allocation (what safe mode returns them to).
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
        self.stats = ServeStats()
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

    def summary(self) -> ServeSummary:
        st, ls, ns = self.stats, self.loop.stats, self.node.stats
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
    """What a serving run did (summary.json; printed at exit). `loop_cpu_pct` is the main thread's
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


# ======================================================================================================
# Prometheus /metrics and /healthz
# ======================================================================================================
class _Collector:
    """Reads the supervisor's state at scrape time (nothing is updated per tick)."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sup = self.server.sup
        if sup is None:  # bound before the node's first write; the supervisor comes later
            return
        st, ls, ns = sup.stats, sup.loop.stats, sup.node.stats
        counters = {
            "ticks": ("control ticks run", st.ticks),
            "applied": ("allocations applied", ls.applied),
            "apply_errors": ("apply() calls that failed or were deferred (env.loop)", ls.apply_errors),
            "actuation_failures": ("failed actuations (raised or a knob not written)", ns.failures),
            "actuation_deferred": ("apply() calls deferred by the retry backoff", ns.deferred),
            "actuation_refused": ("allocations the node refused as invalid", ns.refused),
            "observe_errors": ("observations that failed", ls.observe_errors + ns.observe_failures),
            "controller_errors": ("decide() errors", ls.controller_errors + sup.controller.errors_absorbed),
            "restore_errors": ("failed rollbacks to the last good allocation", ls.restore_errors),
            "safe_mode_entries": (
                "times safe mode was entered",
                sup.safe_guard.state.entries if sup.safe_guard else 0,
            ),
            "handovers": ("handovers to the fallback controller", sup.controller.state.handovers),
            "hand_backs": ("hand-backs to the primary controller", sup.controller.state.hand_backs),
            "qos_met_intervals": ("valid intervals in which every LC app met its target", st.qos_met_ticks),
            "valid_intervals": ("intervals with a valid observation", st.valid_ticks),
            "output_errors": ("failed writes to the decision log / TensorBoard / console", st.sink_errors),
        }
        for name, (doc, v) in counters.items():
            yield CounterMetricFamily(f"coloc_serve_{name}", doc, value=v)
        safe = sup.safe_guard is not None and sup.safe_guard.active
        yield GaugeMetricFamily("coloc_serve_safe_mode", "1 while in safe mode", value=float(safe))
        fb = sup.controller.active is Active.FALLBACK
        yield GaugeMetricFamily(
            "coloc_serve_fallback_active", "1 while the fallback controller acts", value=float(fb)
        )
        g = GaugeMetricFamily(
            "coloc_serve_active_controller", "the controller in charge", labels=["controller"]
        )
        g.add_metric([sup.controller.active_name], 1.0)
        yield g
        yield GaugeMetricFamily(
            "coloc_serve_backoff_seconds", "time until the next actuation attempt", value=sup.node.backoff_s
        )
        yield GaugeMetricFamily("coloc_serve_dry_run", "1 in a dry run (no writes)", value=float(sup.dry_run))
        rec = sup.last
        if rec is None:
            return
        yield GaugeMetricFamily(
            "coloc_serve_last_tick_time_seconds", "node time of the last tick", value=rec.tick.time_s
        )
        yield GaugeMetricFamily(
            "coloc_serve_control_ms", "decide + guards + apply of the last tick", value=rec.serving.control_ms
        )
        yield GaugeMetricFamily(
            "coloc_serve_decide_ms", "decide() of the last tick", value=rec.tick.decide_ms
        )
        yield GaugeMetricFamily(
            "coloc_serve_qos_met", "1 when every LC app met its target", value=float(rec.tick.all_qos_met)
        )
        yield GaugeMetricFamily(
            "coloc_serve_be_throughput", "BE throughput (normalised)", value=rec.tick.be_throughput
        )
        p99 = GaugeMetricFamily("coloc_serve_p99_us", "p99 latency of the last interval", labels=["app"])
        tgt = GaugeMetricFamily("coloc_serve_target_us", "QoS target", labels=["app"])
        slack = GaugeMetricFamily("coloc_serve_slack", "(target - p99) / target", labels=["app"])
        load = GaugeMetricFamily("coloc_serve_load_frac", "offered load / max load", labels=["app"])
        for a in rec.tick.apps:
            p99.add_metric([a.name], a.p99_us)
            tgt.add_metric([a.name], a.target_us)
            slack.add_metric([a.name], a.slack)
            load.add_metric([a.name], a.load_frac)
        yield from (p99, tgt, slack, load)
        alloc = GaugeMetricFamily("coloc_serve_allocation", "allocation in force", labels=["app", "resource"])
        for al in rec.tick.alloc:
            for res in ("cores", "llc_ways", "freq_mhz", "memory_gb", "disk_mbps", "net_gbps", "cpu_quota"):
                alloc.add_metric([al.name, res], float(getattr(al, res)))
        yield alloc


class MetricsServer:
    """`/metrics` (Prometheus text format, `prometheus_client`) and `/healthz` (JSON; 200 when
    healthy, 503 otherwise) on `host:port` in a daemon thread. Port 0 picks a free port (`port`).
    It can be started before the supervisor exists (serve.py binds it before the node's first
    write, so a port in use is bad input that changed nothing) and `attach`ed to it later."""

    def __init__(self, config: MetricsConfig, sup: Supervisor | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.sup = sup
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = config.port

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        import socket
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict, start_response: Callable) -> list[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                if self.sup is None:
                    ok, details = True, {"status": "starting", "ticks": 0}
                else:
                    ok, details = self.sup.health()
                body = json.dumps(details).encode()
                start_response(
                    "200 OK" if ok else "503 Service Unavailable",
                    [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
                )
                return [body]
            if path == "/metrics":
                return metrics_app(environ, start_response)
            body = b"coloc serve: see /metrics and /healthz\n"
            start_response(
                "404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
            )
            return [body]

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        server_cls: type[ThreadingWSGIServer] = ThreadingWSGIServer
        if ":" in self.config.host:

            class V6Server(ThreadingWSGIServer):
                address_family = socket.AF_INET6

            server_cls = V6Server
        try:
            self._server = make_server(
                self.config.host, self.config.port, app, server_cls, handler_class=Quiet
            )
        except OSError as e:
            raise OSError(
                e.errno, f"cannot serve metrics on {self.config.host}:{self.config.port}: {e.strerror}"
            ) from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="coloc-metrics", daemon=True)
        self._thread.start()

    def attach(self, sup: Supervisor) -> None:
        self.sup = sup

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# ======================================================================================================
# Signals
# ======================================================================================================
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


# ======================================================================================================
# Run directory
# ======================================================================================================
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
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_sinks(run_dir: Path, output: OutputConfig, console: bool) -> list[Sink]:
    sinks: list[Sink] = []
    if output.jsonl:
        sinks.append(JsonlSink(run_dir / "decisions.jsonl"))
    if output.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if console and output.console:
        sinks.append(ConsoleSink())
    return sinks


# ======================================================================================================
# Overhead benchmark
# ======================================================================================================
class _VirtualClock:
    """A clock that never sleeps: `sleep_until` jumps (benchmarks of nodes on a real clock)."""

    def __init__(self, t0: float = 0.0) -> None:
        self.t = t0

    def now(self) -> float:
        return self.t

    def sleep_until(self, t_s: float) -> None:
        self.t = max(self.t, t_s)


class _HookNode:
    """Calls `hook()` before each observe (e.g. a synthetic latency feed for a benchmark)."""

    def __init__(self, inner: Node, hook: Callable[[], None]) -> None:
        self.inner, self.hook = inner, hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def clock(self) -> Clock:
        return self.inner.clock

    def observe(self) -> Observation:
        self.hook()
        return self.inner.observe()


def bench_overhead(
    node: Node,
    controller: Controller,
    *,
    ticks: int = 300,
    warmup_ticks: int = 20,
    guards: GuardChain | None = None,
    fallback: Controller | None = None,
    config: ServeConfig | None = None,
    out_dir: str | Path | None = None,
    clock: Clock | None = None,
    before_observe: Callable[[], None] | None = None,
    error_count: Callable[[], int] | None = None,
    label: str = "",
    pace_s: float = 0.0,
) -> dict[str, Any]:
    """The serving loop's overhead: `ticks` ticks of the full stack (supervisor, `guards` - build
    the serving chain for a realistic figure - JSONL and TensorBoard to `out_dir` (a temporary
    directory when None), no console) without waiting for the node's interval: back to back, or
    `pace_s` of real time apart (other work runs between ticks, as between real ticks, and caches
    cool down as they do). For a node on a real clock pass `clock` (a clock that does not sleep is
    used by default for anything but a SimClock).

    Returns a JSON-ready dict: per-tick `control_ms` = decide + guards + apply (the tick minus
    observe()), `decide_ms`, `observe_ms`, `sinks_ms` (p50/p99/max), `tick_cpu_ms` (main-thread
    CPU of the whole tick, observe and outputs included) and the loop's share of one core at the
    node's interval, with and without observe() (on a SimNode observe() runs the simulator, which
    is the "hardware", not the loop), and whether the goals (<= 5 ms p99, <= 2% of a core) are met.
    The node is closed at the end."""
    import tempfile

    from env.node import SimClock

    cfg = config or ServeConfig()
    cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, enabled=False))
    if clock is None and not isinstance(node.clock, SimClock):
        clock = _VirtualClock(node.clock.now())
    if before_observe is not None:
        node = _HookNode(node, before_observe)
    caps = node.capabilities()
    with contextlib.ExitStack() as stack:
        d = Path(out_dir) if out_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        d.mkdir(parents=True, exist_ok=True)
        sinks: list[Sink] = [JsonlSink(d / "decisions.jsonl"), TensorBoardSink(d / "tb")]
        sup = Supervisor(
            node,
            controller,
            config=cfg,
            guards=guards,
            fallback=fallback,
            clock=clock,
            sinks=sinks,
            error_count=error_count,
            controller_name=label or None,
        )
        try:
            sup.manage_gc()
            for _ in range(warmup_ticks):
                sup.tick()
                sup.clock.inner.sleep_until(sup.clock.now() + sup.interval_s)
            st = sup.stats
            rows: list[tuple[float, float, bool]] = []  # control wall ms, control CPU ms, applied
            observe_cpu: list[float] = []
            applied0 = sup.loop.stats.applied
            for _ in range(ticks):
                rec = sup.tick()
                rows.append((rec.serving.control_ms, st.control_cpu_ms[-1], rec.tick.changed))
                observe_cpu.append(st.observe_cpu_ms[-1])
                sup.clock.inner.sleep_until(sup.clock.now() + sup.interval_s)
                if pace_s > 0:
                    time.sleep(pace_s)
            applied = sup.loop.stats.applied - applied0
            n = ticks
            tick_cpu = list(st.tick_cpu_ms)[-n:]
            decide = list(st.decide_ms)[-n:]
            observe = list(st.observe_ms)[-n:]
            sinks_ms = list(st.sinks_ms)[-n:]
            summary = sup.summary()
        finally:
            sup.close()
    interval_ms = caps.interval_s * 1e3

    def stats(xs: Sequence[float]) -> dict[str, float | None]:
        xs = [x for x in xs if math.isfinite(x)]
        return {
            "p50": _num(_pct(xs, 50)),
            "p99": _num(_pct(xs, 99)),
            "max": _num(max(xs) if xs else math.nan),
        }

    mean_cpu = float(np.mean(tick_cpu)) if tick_cpu else math.nan
    mean_obs = float(np.mean(observe_cpu)) if observe_cpu else math.nan
    control = stats([r[0] for r in rows])
    control_cpu = stats([r[1] for r in rows])
    return {
        "label": label or getattr(controller, "name", "controller"),
        "node": caps.node_name,
        "lc_apps": len(caps.lc_apps),
        "be_jobs": len(caps.be_apps),
        "interval_s": caps.interval_s,
        "ticks": ticks,
        "applied": applied,
        "control_ms": control,
        "control_cpu_ms": control_cpu,
        "control_ms_applying_ticks": stats([r[0] for r in rows if r[2]]),
        "control_cpu_ms_applying_ticks": stats([r[1] for r in rows if r[2]]),
        "decide_ms": stats(decide),
        "observe_ms": stats(observe),
        "sinks_ms": stats(sinks_ms),
        "tick_cpu_ms": {"mean": _num(mean_cpu), "p99": _num(_pct(tick_cpu, 99))},
        "cpu_pct_of_core": _num(mean_cpu / interval_ms * 100),
        "cpu_pct_of_core_excl_observe": _num(max(mean_cpu - mean_obs, 0.0) / interval_ms * 100),
        "goals": {"control_p99_ms": CONTROL_P99_GOAL_MS, "cpu_pct_of_core": CPU_GOAL_PCT},
        "meets_control_goal": bool(control["p99"] is not None and control["p99"] <= CONTROL_P99_GOAL_MS),
        "meets_control_goal_cpu_time": bool(
            control_cpu["p99"] is not None and control_cpu["p99"] <= CONTROL_P99_GOAL_MS
        ),
        "safe_mode_ticks": summary.safe_mode_ticks,
        "apply_failures": summary.apply_failures,
    }


def bench_text(results: Sequence[Mapping[str, Any]]) -> str:
    """A table of `bench_overhead` results (ms per tick)."""
    head = (
        f"{'run':<40} {'apps':>4} {'ticks':>5} {'applied':>7} {'ctl p50':>7} {'ctl p99':>7} {'ctl max':>7} "
        f"{'cpu p99':>7} {'appl p99':>8} {'dec p99':>7} {'obs p50':>7} {'out p50':>7} {'%core':>6} {'-obs':>6}"
    )
    lines = [head, "-" * len(head)]

    def f(x: Any, spec: str = ".2f") -> str:
        return "n/a" if x is None else format(x, spec)

    for r in results:
        lines.append(
            f"{r['label'][:40]:<40} {r['lc_apps']:>4} {r['ticks']:>5} {r['applied']:>7} "
            f"{f(r['control_ms']['p50']):>7} {f(r['control_ms']['p99']):>7} {f(r['control_ms']['max']):>7} "
            f"{f(r['control_cpu_ms']['p99']):>7} {f(r['control_ms_applying_ticks']['p99']):>8} "
            f"{f(r['decide_ms']['p99']):>7} {f(r['observe_ms']['p50']):>7} {f(r['sinks_ms']['p50']):>7} "
            f"{f(r['cpu_pct_of_core'], '.3f'):>6} {f(r['cpu_pct_of_core_excl_observe'], '.3f'):>6}"
        )
    lines.append(
        "ctl = decide + guards + apply (wall); cpu = its CPU time; appl = wall on ticks that applied; "
        "obs = observe(); out = JSONL + TensorBoard; %core = the tick's CPU (observe and outputs included) "
        f"per interval, -obs without observe() (on a SimNode that is the simulator). Goals: ctl p99 <= "
        f"{CONTROL_P99_GOAL_MS:g} ms, <= {CPU_GOAL_PCT:g}% of a core."
    )
    return "\n".join(lines)


def bench_sim(
    make_controller: Callable[[Capabilities, Any, Node], Controller],
    *,
    scenario: Any = "mix6-const",
    ticks: int = 300,
    guards_config: GuardsConfig | None = None,
    label: str = "",
    seed: int | None = None,
    pace_s: float = 0.02,
) -> dict[str, Any]:
    """`bench_overhead` on a SimNode of `scenario` (default the 6-app PARTIES mix) with the serving
    guard chain; `make_controller(caps, scenario, node)` builds the controller (the registry is
    injected by the caller). For `evaluate.py bench`."""
    from env.guards import build_guards
    from env.sim.node import SimNode
    from env.sim.scenario import load_scenario

    scn = load_scenario(scenario) if isinstance(scenario, str | Path) else scenario
    node = SimNode(scn, seed=seed)
    ctl = make_controller(node.capabilities(), scn, node)
    chain = build_guards(guards_config or GuardsConfig.serving())
    return bench_overhead(
        node, ctl, ticks=ticks, guards=chain, label=label or f"sim {scn.name} {ctl.name}", pace_s=pace_s
    )


__all__ = [
    "ActuationError",
    "ApplyDeferred",
    "DryRunNode",
    "EventLog",
    "FallbackConfig",
    "MetricsConfig",
    "MetricsServer",
    "OutputConfig",
    "ResilientNode",
    "RetryConfig",
    "SafeModeConfig",
    "SafeModeGuard",
    "ServeConfig",
    "ServeEvent",
    "ServeRecord",
    "ServeSummary",
    "SignalStop",
    "StopServing",
    "StoppableClock",
    "SupervisedController",
    "Supervisor",
    "bench_overhead",
    "bench_sim",
    "bench_text",
    "feed_ok",
    "format_status",
    "load_serve_config",
    "parse_serve_config",
    "safe_allocation",
    "save_resolved_config",
    "wants_fallback",
]
