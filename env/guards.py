"""Safety post-processors between a controller and the node (DESIGN §3, "Guards").

A guard looks at the controller's `Decision` and the observation it was made on, and returns a
possibly changed decision plus a short note of what it changed ("" when nothing). Guards never do
I/O; each has a frozen config and explicit state (a frozen dataclass replaced, never mutated, each
tick), reset per episode. A `GuardChain` runs them in order, appends their notes to the decision's
reason (the tick record also lists them) and finally validates the result: an allocation that still
fails `validate_allocation` is replaced by a hold, so the node only ever sees valid input.

| guard        | what it does                                                                     |
|--------------|----------------------------------------------------------------------------------|
| `clamp`      | repairs an out-of-range target: every field into the node's range, cores to     |
|              | multiples of the step, frequency/MBA to real levels, group/CLOS members agreeing, |
|              | over-subscribed cores/LLC ways taken back from BE first, then the largest holder |
| `lc_floor`   | every LC app keeps at least a floor of cores, LLC ways (and optionally frequency |
|              | and memory), taken from idle resources, then from the BE jobs                    |
| `rate_limit` | per-tick change budget: an LC app loses at most N units of each resource per    |
|              | tick (upsizing an LC app is never limited: it is the safe direction)             |
| `cooldown`   | no reduction of an LC app for `after_violation_s` after it missed its target,    |
|              | nor sooner than `between_downsizes_s` after its previous reduction               |
| `emergency`  | QoS emergency: when an LC app's p99 exceeds `trigger_tardiness` x target for     |
|              | `trigger_ticks` ticks, the BE jobs are paused (cores to 0, LLC to the minimum),  |
|              | what they held goes to the violating apps, which also get the top frequency;     |
|              | no LC app loses anything until all targets are met for `recover_ticks` ticks     |
|              | (Heracles Sec. 4: disable BE on a violation)                                      |
| `be_dvfs`    | the BE jobs' frequency under the socket's power budget (Heracles Sec. 4.5, Alg.  |
|              | 3): every `cycle_s` one level up while the socket draws at most `tdp_frac` of    |
|              | its TDP and the LC apps run at their guaranteed frequency, one level down when   |
|              | it draws more while they do not; the controller's LC decisions pass unchanged   |

`be_dvfs` is the one guard that raises a BE allocation: the ten PARTIES moves never change the BE
jobs' frequency (PARTIES' code sets every core to the nominal 2.2 GHz at start and then moves only
the LC apps'), so under PARTIES or a policy acting through its moves the BE job runs at the nominal
frequency for good, where the Oracle runs it at turbo unless that costs an LC app. It gives way to
the LC apps, which is what makes it a guard: it raises the BE frequency only while they run at their
guaranteed frequency and lowers it when the socket's power cap holds them below it. An LC app's
guaranteed frequency is the nominal one, or what its controller set it to when that is lower
(Heracles' LC job is never capped). It changes nothing on a node without BE jobs, without the FREQ knob or without a TDP
(`Capabilities.tdp_w` NaN: no RAPL). A policy trained with it (`env.guards.be_dvfs`) has seen the
BE frequency move; one trained without it has not.

Each guard's settings are checked against their range when its config is built (floors and budgets
>= 0, an emergency trigger at or above the target, at least one tick), so a typo in a guard file is a
`ConfigError`, not a guard that silently does nothing or everything.

Which chain where: evaluation uses **clamp only** (`clamp_only()`), so that every baseline is
judged as its paper describes it (PARTIES Sec. 5, Heracles Sec. 5) and a learned policy gets no
help the baselines do not get. Serving runs the full chain (a learned policy on a real node must
not starve an LC service or swing allocations wildly); training may use any chain from its config.
The order of `build_guards` is clamp -> be_dvfs -> emergency -> cooldown -> rate_limit -> lc_floor:
clamp first turns any output into a well-formed allocation the others can reason about; be_dvfs
before the emergency, which pauses the BE jobs whatever their frequency; the floor last so that
nothing after it can take an LC app under its floor.

Rate limit, cooldown and emergency hold the allocation when the target regroups apps (changes
core groups or CLOSes): such a restructuring cannot be limited unit by unit, and no learned policy
produces one (the action codec only emits PARTIES moves).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from env.allocations import describe_diff, structure
from env.config import ConfigError, build, require_in
from env.types import (
    Allocation,
    AllocationError,
    AppAlloc,
    Capabilities,
    Decision,
    Observation,
    Resource,
    validate_allocation,
)

_EPS = 1e-6
_POOLED = (Resource.CORE, Resource.CACHE, Resource.MEM, Resource.DISK)


@runtime_checkable
class Guard(Protocol):
    """A safety post-processor (module docstring). `check` returns the decision and a note."""

    name: str

    def reset(self, caps: Capabilities) -> None: ...

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]: ...


# ---- configs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LcFloorConfig:
    """Floors per LC app. `min_freq_mhz` None = no frequency floor (PARTIES lowers LC frequency
    below nominal when it downsizes, Sec. 4.2.3); `min_memory_gb` 0 = no memory floor."""

    min_cores: float = 1.0
    min_llc_ways: int = 2
    min_freq_mhz: int | None = None
    min_memory_gb: float = 0.0

    def __post_init__(self) -> None:
        require_in("lc_floor", 0, 1024, min_cores=self.min_cores)
        require_in("lc_floor", 0, 64, min_llc_ways=self.min_llc_ways)
        require_in("lc_floor", 0, 1e6, min_memory_gb=self.min_memory_gb)
        if self.min_freq_mhz is not None:
            require_in("lc_floor", 1, 10_000, min_freq_mhz=self.min_freq_mhz)


@dataclass(frozen=True)
class RateLimitConfig:
    """Most an LC app may lose in one tick, per resource."""

    max_core_decrease: float = 1.0
    max_llc_way_decrease: int = 1
    max_freq_level_decrease: int = 2  # levels of Capabilities.freq_levels_mhz (100 MHz each on Intel)
    max_memory_decrease_gb: float = 2.0
    max_disk_decrease_mbps: float = 20.0

    def __post_init__(self) -> None:
        require_in("rate_limit", 0, 1e6, **dataclasses.asdict(self))  # 0: never reduced


@dataclass(frozen=True)
class CooldownConfig:
    """Seconds an LC app is protected from reductions after it missed its target
    (`after_violation_s`) and between two of its reductions (`between_downsizes_s`)."""

    after_violation_s: float = 5.0
    between_downsizes_s: float = 2.0

    def __post_init__(self) -> None:
        require_in("cooldown", 0, 86_400, **dataclasses.asdict(self))


@dataclass(frozen=True)
class EmergencyConfig:
    """When the QoS emergency starts (`trigger_ticks` consecutive ticks with some LC app's p99 over
    `trigger_tardiness` x its target) and ends (`recover_ticks` consecutive ticks with every target met)."""

    trigger_tardiness: float = 2.0  # p99 / target
    trigger_ticks: int = 2
    recover_ticks: int = 10

    def __post_init__(self) -> None:
        if not 1.0 <= self.trigger_tardiness <= 1e6:
            raise ConfigError(
                f"emergency.trigger_tardiness must be in [1, 1e6] (p99 / target: 1 = at the target), "
                f"got {self.trigger_tardiness}"
            )
        require_in("emergency", 1, 1e6, trigger_ticks=self.trigger_ticks, recover_ticks=self.recover_ticks)


@dataclass(frozen=True)
class BeDvfsConfig:
    """Heracles' power sub-controller (Sec. 4.5, Alg. 3): one cycle every `cycle_s` seconds on the
    mean socket power since the last, against a budget of `tdp_frac` x the TDP."""

    cycle_s: float = 2.0
    tdp_frac: float = 0.90

    def __post_init__(self) -> None:
        require_in("be_dvfs", 1e-3, 86_400, cycle_s=self.cycle_s)
        if not 0 < self.tdp_frac <= 1:
            raise ConfigError(
                f"be_dvfs.tdp_frac must be in (0, 1] (a fraction of the TDP), got {self.tdp_frac}"
            )


@dataclass(frozen=True)
class GuardsConfig:
    """Which guards run (None = off). The default is the evaluation chain: clamp only. `serving()`
    leaves `be_dvfs` off: it manages the BE jobs' frequency, a policy not trained with it has never
    seen that move (module docstring)."""

    clamp: bool = True
    lc_floor: LcFloorConfig | None = None
    rate_limit: RateLimitConfig | None = None
    cooldown: CooldownConfig | None = None
    emergency: EmergencyConfig | None = None
    be_dvfs: BeDvfsConfig | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "guards") -> GuardsConfig:
        """Strict: unknown keys and wrong types raise `ConfigError` (env.config.build)."""
        return build(cls, data if data is not None else {}, where)

    @classmethod
    def serving(cls) -> GuardsConfig:
        """Every guard with its defaults (what serving starts from)."""
        return cls(True, LcFloorConfig(), RateLimitConfig(), CooldownConfig(), EmergencyConfig())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- the chain -------------------------------------------------------------------------------------
class GuardChain:
    """Guards applied in order, then a final validation (module docstring)."""

    def __init__(self, guards: Sequence[Guard] = ()) -> None:
        self.guards = tuple(guards)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.guards)

    def reset(self, caps: Capabilities) -> None:
        for g in self.guards:
            g.reset(caps)

    def apply(
        self, decision: Decision, obs: Observation, caps: Capabilities
    ) -> tuple[Decision, tuple[str, ...]]:
        notes: list[str] = []
        for g in self.guards:
            decision, note = g.check(decision, obs, caps)
            if note:
                notes.append(f"{g.name}: {note}")
        if decision.allocation is not None:
            try:
                validate_allocation(decision.allocation, caps)
            except AllocationError as e:
                notes.append(f"chain: invalid allocation held ({e})")
                decision = dataclasses.replace(decision, allocation=None)
        if notes:
            decision = dataclasses.replace(decision, reason=f"{decision.reason} [{'; '.join(notes)}]")
        return decision, tuple(notes)


def clamp_only() -> GuardChain:
    """The evaluation chain (module docstring)."""
    return GuardChain([ClampGuard()])


def build_guards(cfg: GuardsConfig) -> GuardChain:
    """The chain `cfg` selects, in the fixed order clamp -> be_dvfs -> emergency -> cooldown ->
    rate_limit -> lc_floor (module docstring: why this order)."""
    guards: list[Guard] = []
    if cfg.clamp:
        guards.append(ClampGuard())
    if cfg.be_dvfs is not None:
        guards.append(BeDvfsGuard(cfg.be_dvfs))
    if cfg.emergency is not None:
        guards.append(EmergencyGuard(cfg.emergency))
    if cfg.cooldown is not None:
        guards.append(CooldownGuard(cfg.cooldown))
    if cfg.rate_limit is not None:
        guards.append(RateLimitGuard(cfg.rate_limit))
    if cfg.lc_floor is not None:
        guards.append(LcFloorGuard(cfg.lc_floor))
    return GuardChain(guards)


# ---- helpers ---------------------------------------------------------------------------------------
def _is_lc(caps: Capabilities, name: str) -> bool:
    return any(a.name == name and a.is_lc for a in caps.apps)


def _unit_key(res: Resource) -> str:
    return {Resource.CORE: "core_group", Resource.CACHE: "clos"}.get(res, "name")


def _field(res: Resource) -> str:
    return {
        Resource.CORE: "cores",
        Resource.CACHE: "llc_ways",
        Resource.MEM: "memory_gb",
        Resource.DISK: "disk_mbps",
    }[res]


def _units(alloc: Allocation, res: Resource) -> dict[Any, tuple[float, list[str]]]:
    """Pool units of `res` (core groups, CLOSes, or single apps): key -> (amount, member names)."""
    key, fld = _unit_key(res), _field(res)
    out: dict[Any, tuple[float, list[str]]] = {}
    for a in alloc.apps:
        k = getattr(a, key)
        if k in out:
            out[k][1].append(a.name)
        else:
            out[k] = (float(getattr(a, fld)), [a.name])
    return out


def _unit_min(res: Resource, caps: Capabilities, members: list[str]) -> float:
    lc = any(_is_lc(caps, m) for m in members)
    if res is Resource.CORE:
        return caps.core_step if lc else 0.0
    if res is Resource.CACHE:
        return float(caps.min_llc_ways)
    return 0.0


def _total(res: Resource, caps: Capabilities) -> float:
    return {
        Resource.CORE: caps.cores,
        Resource.CACHE: float(caps.llc_ways),
        Resource.MEM: caps.memory_gb,
        Resource.DISK: caps.disk_mbps,
    }[res]


def _step(res: Resource, caps: Capabilities) -> float:
    return 1.0 if res is Resource.CACHE else caps.step(res)


def _set(alloc: Allocation, res: Resource, member: str, amount: float) -> Allocation:
    v: float | int = round(amount) if res is Resource.CACHE else amount
    return alloc.replace_app(member, **{_field(res): v})


def _reduce_excess(
    alloc: Allocation, current: Allocation, res: Resource, caps: Capabilities, total: float
) -> Allocation:
    """Take back units that make `res` exceed `total`: from units that grew relative to `current`
    (BE units first, then the LC unit that grew most), never below their `current` amount."""
    step = _step(res, caps)
    units = _units(alloc, res)
    cur = _units(current, res)
    excess = sum(v for v, _ in units.values()) - total
    while excess > _EPS:
        grown = [(k, v, m) for k, (v, m) in units.items() if k in cur and v - cur[k][0] > _EPS]
        if not grown:
            break
        be = [g for g in grown if not any(_is_lc(caps, x) for x in g[2])]
        pool = be or grown
        k, v, members = max(pool, key=lambda g: (g[1] - cur[g[0]][0], str(g[0])))
        new = max(cur[k][0], v - step)
        alloc = _set(alloc, res, members[0], new)
        excess -= v - new
        units[k] = (new, members)
    return alloc


def limit_lc_decreases(
    current: Allocation,
    target: Allocation,
    caps: Capabilities,
    allowed: Callable[[str, Resource], float],
) -> Allocation:
    """`target` with every LC app's loss of each resource capped at `allowed(app, resource)` (cores,
    ways, frequency levels, GB, MB/s) relative to `current`. Units the capped apps keep are taken back
    from the units that grew (BE first), so pooled totals stay within the node. Needs the same
    grouping in `current` and `target`."""
    out = target
    for res in _POOLED:
        cur = _units(current, res)
        tgt = _units(out, res)
        for k, (t, members) in tgt.items():
            lc = [m for m in members if _is_lc(caps, m)]
            if not lc or k not in cur:
                continue
            budget = min(allowed(m, res) for m in lc)
            if res in (Resource.CORE, Resource.CACHE) and math.isfinite(budget):
                step = _step(res, caps)
                budget = math.floor(budget / step + 1e-9) * step  # whole cores (steps) and ways
            floor = cur[k][0] - budget
            if t < floor - _EPS:
                out = _set(out, res, members[0], floor)
        out = _reduce_excess(out, current, res, caps, max(_total(res, caps), sum(v for v, _ in cur.values())))
    levels = caps.freq_levels_mhz
    for a in out.apps:
        if not _is_lc(caps, a.name) or a.name not in current:
            continue
        c, budget = current[a.name].freq_mhz, allowed(a.name, Resource.FREQ)
        if c in levels and a.freq_mhz in levels and math.isfinite(budget):
            lo = max(levels.index(c) - int(budget), 0)
            if levels.index(a.freq_mhz) < lo:
                out = out.replace_app(a.name, freq_mhz=levels[lo])
    return out


def _reductions(before: Allocation, after: Allocation, caps: Capabilities) -> set[str]:
    """LC apps that hold less of some resource in `after` than in `before`."""
    out = set()
    for a in after.apps:
        if not _is_lc(caps, a.name) or a.name not in before:
            continue
        b = before[a.name]
        if (
            a.cores < b.cores - _EPS
            or a.llc_ways < b.llc_ways
            or a.freq_mhz < b.freq_mhz
            or a.memory_gb < b.memory_gb - _EPS
            or a.disk_mbps < b.disk_mbps - _EPS
        ):
            out.add(a.name)
    return out


# ---- clamp -----------------------------------------------------------------------------------------
class ClampGuard:
    """Make any target a valid allocation for this node (module docstring). Stateless. A target that
    is already valid passes untouched (the common case costs one `validate_allocation`)."""

    name = "clamp"

    def reset(self, caps: Capabilities) -> None:
        pass

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        target = decision.allocation
        if target is None:
            return decision, ""
        try:
            validate_allocation(target, caps)
            return decision, ""
        except AllocationError:
            pass
        fixed = clamp_allocation(target, obs.allocation, caps)
        try:
            validate_allocation(fixed, caps)
        except AllocationError as e:
            return dataclasses.replace(decision, allocation=None), f"cannot repair ({e}): held"
        return dataclasses.replace(decision, allocation=fixed), describe_diff(target, fixed) or "repaired"


def _nearest(levels: Sequence[int], x: float) -> int:
    return min(levels, key=lambda v: (abs(v - x), v))


def clamp_allocation(target: Allocation, current: Allocation, caps: Capabilities) -> Allocation:
    """Best-effort repair of `target` into the node's ranges (see `ClampGuard`)."""
    known = [a.name for a in caps.apps]
    by_name = {a.name: a for a in target.apps}
    cur = {a.name: a for a in current.apps}
    apps: list[AppAlloc] = []
    for n in known:
        fallback = cur.get(n)
        a = by_name.get(n) or fallback
        if a is None:
            raise AllocationError(f"no allocation for {n!r}")
        apps.append(_clamp_app(a, fallback or a, caps))
    # members of a core group / CLOS agree with the first LC member (else the first member)
    order = sorted(apps, key=lambda a: (not _is_lc(caps, a.name), known.index(a.name)))
    group_vals: dict[int, tuple[float, int]] = {}
    clos_vals: dict[int, tuple[int, int]] = {}
    for a in order:
        group_vals.setdefault(a.core_group, (a.cores, a.freq_mhz))
        clos_vals.setdefault(a.clos, (a.llc_ways, a.mba_pct))
    apps = [
        dataclasses.replace(
            a,
            cores=group_vals[a.core_group][0],
            freq_mhz=group_vals[a.core_group][1],
            llc_ways=clos_vals[a.clos][0],
            mba_pct=clos_vals[a.clos][1],
        )
        for a in apps
    ]
    out = Allocation.of(apps, caps)
    for res in (Resource.CORE, Resource.CACHE):
        out = _shrink_to_total(out, res, caps)
    return out


def _clamp_app(a: AppAlloc, fallback: AppAlloc, caps: Capabilities) -> AppAlloc:
    def finite(x: float, fb: float) -> float:
        return float(x) if math.isfinite(x) else float(fb)

    lc = _is_lc(caps, a.name)
    step = caps.core_step
    cores = finite(a.cores, fallback.cores)
    cores = math.floor(cores / step + 1e-6) * step
    cores = min(max(cores, step if lc else 0.0), caps.cores)
    ways = min(max(int(a.llc_ways), caps.min_llc_ways), caps.llc_ways)
    clos = min(max(int(a.clos), 0), max(caps.clos_count, 1) - 1)
    freq = _nearest(caps.freq_levels_mhz, finite(a.freq_mhz, fallback.freq_mhz))
    mba = _nearest(caps.mba_levels_pct, a.mba_pct) if caps.mba_levels_pct else 100
    return dataclasses.replace(
        a,
        cores=cores,
        llc_ways=ways,
        clos=clos,
        freq_mhz=freq,
        mba_pct=mba,
        memory_gb=min(max(finite(a.memory_gb, fallback.memory_gb), 0.0), caps.memory_gb),
        disk_mbps=min(max(finite(a.disk_mbps, fallback.disk_mbps), 0.0), caps.disk_mbps),
        net_gbps=min(max(finite(a.net_gbps, fallback.net_gbps), 0.0), caps.net_gbps),
    )


def _shrink_to_total(alloc: Allocation, res: Resource, caps: Capabilities) -> Allocation:
    """Over-subscribed cores / ways: take one step at a time from BE-only units, then from the
    largest unit, never under a unit's minimum."""
    step, total = _step(res, caps), _total(res, caps)
    units = _units(alloc, res)
    excess = sum(v for v, _ in units.values()) - total
    while excess > _EPS:
        cands = [(k, v, m) for k, (v, m) in units.items() if v - step >= _unit_min(res, caps, m) - _EPS]
        if not cands:
            break
        be = [c for c in cands if not any(_is_lc(caps, x) for x in c[2])]
        k, v, members = max(be or cands, key=lambda c: (c[1], str(c[0])))
        alloc = _set(alloc, res, members[0], v - step)
        units[k] = (v - step, members)
        excess -= step
    return alloc


# ---- LC floor --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _NoState:
    pass


class LcFloorGuard:
    """Raise every LC app to its floor from idle resources, then from the BE jobs (never from
    another LC app: each of them has a floor too). Stateless."""

    name = "lc_floor"

    def __init__(self, config: LcFloorConfig) -> None:
        self.config = config
        self.state = _NoState()

    def reset(self, caps: Capabilities) -> None:
        self.state = _NoState()

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        base = decision.allocation if decision.allocation is not None else obs.allocation
        out = base
        cfg = self.config
        floors = {
            Resource.CORE: cfg.min_cores,
            Resource.CACHE: float(cfg.min_llc_ways),
            Resource.MEM: cfg.min_memory_gb,
        }
        for res, floor in floors.items():
            if floor <= 0:
                continue
            out = self._raise_to(out, res, floor, caps)
        if cfg.min_freq_mhz is not None:
            levels = caps.freq_levels_mhz
            ok = [v for v in levels if v >= cfg.min_freq_mhz]
            lvl = ok[0] if ok else levels[-1]
            for a in out.apps:
                if _is_lc(caps, a.name) and a.freq_mhz < lvl:
                    out = out.replace_app(a.name, freq_mhz=lvl)
        if out == base:
            return decision, ""
        return dataclasses.replace(decision, allocation=out), describe_diff(base, out)

    @staticmethod
    def _raise_to(alloc: Allocation, res: Resource, floor: float, caps: Capabilities) -> Allocation:
        step = _step(res, caps)
        for k, (v, members) in _units(alloc, res).items():
            if not any(_is_lc(caps, m) for m in members) or v >= floor - _EPS:
                continue
            need = floor - v
            while need > _EPS:
                units = _units(alloc, res)
                idle = _total(res, caps) - sum(x for x, _ in units.values())
                if idle >= step - _EPS:
                    take = step
                else:
                    donors = [
                        (kk, vv, mm)
                        for kk, (vv, mm) in units.items()
                        if kk != k
                        and not any(_is_lc(caps, x) for x in mm)
                        and vv - step >= _unit_min(res, caps, mm) - _EPS
                    ]
                    if not donors:
                        break
                    _, vv, mm = max(donors, key=lambda d: (d[1], str(d[0])))
                    alloc = _set(alloc, res, mm[0], vv - step)
                    take = step
                cur = _units(alloc, res)[k][0]
                alloc = _set(alloc, res, members[0], cur + take)
                need -= take
        return alloc


# ---- rate limit ------------------------------------------------------------------------------------
class RateLimitGuard:
    """Per-tick change budget on LC reductions (module docstring). Stateless: the budget is
    relative to the allocation in force (`obs.allocation`)."""

    name = "rate_limit"

    def __init__(self, config: RateLimitConfig) -> None:
        self.config = config
        self.state = _NoState()

    def reset(self, caps: Capabilities) -> None:
        self.state = _NoState()

    def _allowed(self, app: str, res: Resource) -> float:
        c = self.config
        return {
            Resource.CORE: c.max_core_decrease,
            Resource.CACHE: float(c.max_llc_way_decrease),
            Resource.FREQ: float(c.max_freq_level_decrease),
            Resource.MEM: c.max_memory_decrease_gb,
            Resource.DISK: c.max_disk_decrease_mbps,
        }[res]

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        target = decision.allocation
        if target is None:
            return decision, ""
        current = obs.allocation
        if structure(target) != structure(current):
            return dataclasses.replace(decision, allocation=None), "regrouping is not rate-limited: held"
        out = limit_lc_decreases(current, target, caps, self._allowed)
        if out == target:
            return decision, ""
        return dataclasses.replace(decision, allocation=out), describe_diff(target, out)


# ---- cooldown --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CooldownState:
    """Per LC app, when it last missed its target and was last reduced (simulated or wall
    seconds, from the observations), and the allocation of the previous tick."""

    last_violation_s: dict[str, float] = field(default_factory=dict)
    last_reduction_s: dict[str, float] = field(default_factory=dict)
    previous: Allocation | None = None


class CooldownGuard:
    """Blocks reductions of an LC app shortly after it missed its target or was last reduced.

    State is advanced from the observations: a violation is a valid sample over its target; a
    reduction is an LC app holding less in this interval's allocation than in the previous one (what
    really happened on the node, whichever guard or controller caused it)."""

    name = "cooldown"

    def __init__(self, config: CooldownConfig) -> None:
        self.config = config
        self.state = CooldownState()

    def reset(self, caps: Capabilities) -> None:
        self.state = CooldownState()

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        s = self.state
        viol = dict(s.last_violation_s)
        red = dict(s.last_reduction_s)
        for a in obs.apps:
            if a.valid and not a.meets_qos:
                viol[a.name] = obs.time_s
        if s.previous is not None:
            for n in _reductions(s.previous, obs.allocation, caps):
                red[n] = obs.time_s - obs.interval_s
        self.state = CooldownState(viol, red, obs.allocation)
        target = decision.allocation
        if target is None:
            return decision, ""
        cfg = self.config
        blocked = {
            n
            for n in {a.name for a in caps.lc_apps}
            if obs.time_s - viol.get(n, -math.inf) < cfg.after_violation_s - _EPS
            or obs.time_s - red.get(n, -math.inf) < cfg.between_downsizes_s - _EPS
        }
        wanted = _reductions(obs.allocation, target, caps) & blocked
        if not wanted:
            return decision, ""
        if structure(target) != structure(obs.allocation):
            return dataclasses.replace(decision, allocation=None), "regrouping during a cooldown: held"
        out = limit_lc_decreases(
            obs.allocation, target, caps, lambda app, res: 0.0 if app in blocked else math.inf
        )
        return dataclasses.replace(decision, allocation=out), f"no reduction of {sorted(wanted)} yet"


# ---- QoS emergency ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmergencyState:
    """Consecutive ticks over the trigger (`bad_ticks`) and with every target met
    (`good_ticks`), and whether the emergency is on."""

    bad_ticks: int = 0
    active: bool = False
    good_ticks: int = 0


class EmergencyGuard:
    """QoS emergency (module docstring; Heracles Sec. 4.1: "if slack < 0, disable BE")."""

    name = "emergency"

    def __init__(self, config: EmergencyConfig) -> None:
        self.config = config
        self.state = EmergencyState()

    def reset(self, caps: Capabilities) -> None:
        self.state = EmergencyState()

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        cfg, s = self.config, self.state
        severe = sorted(
            (a for a in obs.apps if a.valid and a.p99_us > cfg.trigger_tardiness * a.target_us),
            key=lambda a: -a.tardiness,
        )
        bad = s.bad_ticks + 1 if severe else 0
        good = s.good_ticks + 1 if obs.apps and all(a.meets_qos for a in obs.apps) else 0
        if not s.active and bad >= cfg.trigger_ticks:
            self.state = EmergencyState(bad, True, 0)
            out = emergency_allocation(obs.allocation, [a.name for a in severe], caps)
            note = f"p99 > {cfg.trigger_tardiness:g}x target for {[a.name for a in severe]}: BE paused"
            what = describe_diff(obs.allocation, out)
            return (
                dataclasses.replace(decision, allocation=out, move=None, app=None),
                f"{note}; {what}" if what else f"{note}; nothing left to reclaim",
            )
        if s.active and good >= cfg.recover_ticks:
            self.state = EmergencyState(bad, False, good)
            return decision, "recovered"
        self.state = EmergencyState(bad, s.active, good)
        if not s.active or decision.allocation is None:
            return decision, ""
        target = decision.allocation
        if not _reductions(obs.allocation, target, caps):
            return decision, ""
        if structure(target) != structure(obs.allocation):
            return dataclasses.replace(decision, allocation=None), "regrouping during an emergency: held"
        # the apps missing their targets lose nothing; healthy LC apps may still give to them
        # (PARTIES' own remedy, Sec. 4.2.4: the victim is the app with the most slack)
        missing = {a.name for a in obs.apps if not a.meets_qos}
        out = limit_lc_decreases(
            obs.allocation, target, caps, lambda app, res: 0.0 if app in missing else math.inf
        )
        if out == target:
            return decision, ""
        return dataclasses.replace(
            decision, allocation=out
        ), "no reduction of a violating app during an emergency"


def emergency_allocation(current: Allocation, violators: Sequence[str], caps: Capabilities) -> Allocation:
    """`current` with the BE-only core groups at 0 cores and their CLOSes at the minimum ways, the
    freed cores and ways dealt round-robin to the violators' groups / CLOSes (worst first), and
    the violators at the top frequency level."""
    out = current
    for res in (Resource.CORE, Resource.CACHE):
        step = _step(res, caps)
        units = _units(out, res)
        targets = []
        for v in violators:
            k = getattr(out[v], _unit_key(res))
            if k not in targets and any(_is_lc(caps, m) for m in units[k][1]):
                targets.append(k)
        if not targets:
            continue
        freed = 0.0
        for _k, (amount, members) in units.items():
            if any(_is_lc(caps, m) for m in members):
                continue
            lo = 0.0 if res is Resource.CORE else float(caps.min_llc_ways)
            if amount > lo + _EPS:
                out = _set(out, res, members[0], lo)
                freed += amount - lo
        i = 0
        while freed >= step - _EPS:
            k = targets[i % len(targets)]
            amount, members = _units(out, res)[k]
            out = _set(out, res, members[0], amount + step)
            freed -= step
            i += 1
    top = caps.freq_levels_mhz[-1]
    for v in violators:
        if out[v].freq_mhz != top:
            out = out.replace_app(v, freq_mhz=top)
    return out


# ---- BE frequency under the power budget -----------------------------------------------------------
def be_frequency_step(
    levels_mhz: tuple[int, ...], be_freq_mhz: int, power_w: float, budget_w: float, lc_below_guaranteed: bool
) -> int:
    """Heracles' power sub-controller (Alg. 3, Sec. 4.5), one cycle: the BE cores' next frequency.

    One level down (`LowerFrequency(be_cores)`) when the socket draws more than `budget_w` while the
    LC cores run below their guaranteed frequency; one level up (`IncreaseFrequency(be_cores)`) when
    it draws at most `budget_w` and they do not; otherwise, or at the end of `levels_mhz` (ascending,
    the node's DVFS levels), unchanged. A frequency off the levels counts as the top one.
    """
    i = levels_mhz.index(be_freq_mhz) if be_freq_mhz in levels_mhz else len(levels_mhz) - 1
    if power_w > budget_w and lc_below_guaranteed and i > 0:
        return levels_mhz[i - 1]
    if power_w <= budget_w and not lc_below_guaranteed and i + 1 < len(levels_mhz):
        return levels_mhz[i + 1]
    return levels_mhz[i]


LC_SHORT_MHZ = 0.5  # PollFrequency(ls_cores): the LC apps run below their guarantee by more than this


@dataclass(frozen=True)
class BeDvfsState:
    """The BE jobs' frequency this guard sets (None before the first observation), when its next
    cycle is due (observation time, s), and per interval since the last cycle the socket power (W)
    and the slowest LC app's frequency over its guaranteed one (MHz)."""

    freq_mhz: int | None = None
    next_cycle_s: float = math.inf
    window: tuple[tuple[float, float], ...] = ()


class BeDvfsGuard:
    """The BE jobs' frequency by Heracles' Alg. 3 (module docstring). Every decision's allocation (the
    observed one when the controller holds) gets the frequency this guard keeps; it starts at the BE
    jobs' frequency in the first observation."""

    name = "be_dvfs"

    def __init__(self, config: BeDvfsConfig) -> None:
        self.config = config
        self.state = BeDvfsState()
        self._active = False

    def reset(self, caps: Capabilities) -> None:
        self.state = BeDvfsState()
        self._active = bool(caps.be_apps) and Resource.FREQ in caps.knobs and math.isfinite(caps.tdp_w)

    @property
    def be_freq_mhz(self) -> int | None:
        """The BE jobs' frequency this guard sets (None before the first observation)."""
        return self.state.freq_mhz

    def check(self, decision: Decision, obs: Observation, caps: Capabilities) -> tuple[Decision, str]:
        alloc = obs.allocation
        be = [b.name for b in caps.be_apps if b.name in alloc] if self._active else []
        if not be:
            return decision, ""
        note = self._cycle(obs, caps, alloc[be[0]].freq_mhz)
        freq = self.state.freq_mhz
        target = decision.allocation if decision.allocation is not None else alloc
        for b in be:
            if b in target and target[b].freq_mhz != freq:
                target = target.replace_app(b, freq_mhz=freq)
        return dataclasses.replace(decision, allocation=None if target == alloc else target), note

    def _cycle(self, obs: Observation, caps: Capabilities, observed_mhz: int) -> str:
        """Record this interval; run Alg. 3 when its cycle is due. Returns a note when it moved."""
        s, cfg = self.state, self.config
        if s.freq_mhz is None:
            s = BeDvfsState(observed_mhz, obs.time_s + cfg.cycle_s)
        nominal = caps.nominal_freq_mhz
        margins = [  # each LC app's frequency over the one it is guaranteed
            a.usage.freq_mhz - min(obs.allocation[a.name].freq_mhz, nominal)
            for a in obs.apps
            if a.valid and a.name in obs.allocation and math.isfinite(a.usage.freq_mhz)
        ]
        window = (
            (*s.window, (obs.power_w, min(margins, default=0.0))) if math.isfinite(obs.power_w) else s.window
        )
        freq = s.freq_mhz
        assert freq is not None
        if obs.time_s + 1e-9 < s.next_cycle_s or not window:
            self.state = BeDvfsState(freq, s.next_cycle_s, window)
            return ""
        due = s.next_cycle_s + cfg.cycle_s * max(
            1, math.floor((obs.time_s - s.next_cycle_s) / cfg.cycle_s) + 1
        )
        power = sum(p for p, _ in window) / len(window)  # PollRAPL()
        short = sum(m for _, m in window) / len(window) < -LC_SHORT_MHZ  # PollFrequency(ls_cores)
        budget = cfg.tdp_frac * caps.tdp_w
        new = be_frequency_step(caps.freq_levels_mhz, freq, power, budget, short)
        self.state = BeDvfsState(new, due, ())
        if new == freq:
            return ""
        return f"Heracles Alg. 3: {power:.0f} W against {budget:.0f} W -> BE {freq} -> {new} MHz"
