"""The supervisor's safety pieces that decide (DESIGN §1 use 3), and the events they report.

* `SafeModeGuard`, the last guard of the chain: when the latency feed is stale or silent (an
  invalid observation) for `enter_after_ticks` ticks, BE growth is frozen and every LC app gets back
  at least its start allocation (`safe_allocation`), until the feed is back for `exit_after_ticks`
  ticks. Running last, nothing after it can undo it.
* `SupervisedController`, a `Controller` over the primary and a fallback controller: when QoS is
  violated in >= `min_violation_frac` of the valid intervals over `window_s`, or after
  `max_controller_errors` decide() errors in a row, it hands over to the fallback (PARTIES by
  default) and says why; it hands back after `stable_s` of met QoS (or never).

Each state machine is explicit frozen state (`SafeModeState`, `HandoverState`) advanced by the
observations' timestamps, so it is unit-tested without sleeping. What the pieces do is an
`ServeEvent` in the `EventLog`: logged at once, and drained into the tick's record.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from env.allocations import describe_diff, structure
from env.controller import Controller
from env.types import Allocation, Capabilities, Decision, Observation
from harness.serving.config import FallbackConfig, SafeModeConfig

log = logging.getLogger("coloc.serve")

_EPS = 1e-6


def _num(x: float) -> float | None:
    """`x` for JSON: None where it is not finite."""
    x = float(x)
    return x if math.isfinite(x) else None


# ---- events: what the supervisor did and why (logged, and in the tick's record) -------------------------
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


# ---- safe mode ---------------------------------------------------------------------------------------------
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
    """Safe mode's state: on or off, the invalid and valid ticks in a row, since when, how often entered."""

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


# ---- fallback handover -------------------------------------------------------------------------------------
class Active(enum.Enum):
    """Which controller of a `SupervisedController` is in charge."""

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
