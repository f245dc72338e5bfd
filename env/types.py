"""Frozen value types that cross module boundaries (DESIGN §3).

Everything a controller sees or produces is one of these: the node's `Capabilities`, an
`Observation` per interval (built from `AppSample` and `BeSample`), an `Allocation` (one `AppAlloc`
per app or BE job), a `Move` and a `Decision`. They are immutable; changing an allocation makes a
new one (`Allocation.with_move`, `Allocation.replace_app`).

Units are in the names (`_us`, `_s`, `_mhz`, `_gb`, `_gbps`, `_mbps`, `_pct`, `_ways`). Slack is
defined once, in `slack()`: positive means the QoS target is met.

Resource model (shared by the simulator and the real node):

* cores: each app belongs to a *core group* (`core_group`); apps in the same group share the
  group's physical cores (time-sharing, as the OS would); groups are disjoint. An app with a group
  of its own has exclusive cores, as in PARTIES (which never shares a physical core, Sec. 3.3.1).
* LLC: each app belongs to a CLOS (`clos`); a CLOS owns `llc_ways` exclusive ways (CAT
  capacity mask) and an MBA throttle (`mba_pct`, 100 = unthrottled). Apps in one CLOS compete
  for its ways.
* CPU quota: optionally, `cpu_quota` caps the CPU time an app may use within its core group, in
  cores (CFS quota / period; 0 = no quota). Unused quota stays with the group's other apps, as
  Intel PRM throttles BE jobs inside a shared cpuset (Q-PRM thesis Sec. 4.1).
* CPU shares: optionally, `cpu_shares` weighs an app's CPU time against the other apps of its core
  group when they want more than the group's cores (CFS `cpu.shares`, `cpu.weight` on cgroup v2;
  0 = not set: the OS default). Intel PRM gives LC apps 200000 and BE jobs 2 (`eris/cpuquota.py`).
* frequency: a per-core cap (`freq_mhz`) on the app's cores; the highest level of
  `Capabilities.freq_levels_mhz` means turbo (the "performance" governor of PARTIES Table 3).
* memory, disk and network are per-app limits (cgroup memory limit, blkio throttle, HTB ceil);
  limits may over-commit the node, in which case the apps compete for the real capacity.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from env.histogram import LatencyHistogram

AppKind = Literal["lc", "be"]


def slack(target: float, latency: float) -> float:
    """Tail-latency slack, (target - latency) / target: positive when QoS is met (PARTIES Alg. 1)."""
    return (target - latency) / target


# PARTIES Alg. 1 (Sec. 4.2): an app whose slack is below 0.05 is upsized, one above 0.2 may be
# downsized; Alg. 3: a downsize is reverted when the app's slack falls below 0.05 afterwards.
UPSIZE_SLACK_BELOW = 0.05
DOWNSIZE_SLACK_ABOVE = 0.20


class Resource(enum.Enum):
    """The five tradeable resources of PARTIES Sec. 4.2.3 (network is adjusted outside the moves)."""

    CORE = "core"
    CACHE = "cache"
    FREQ = "freq"
    MEM = "mem"
    DISK = "disk"


_RESOURCE_ORDER: tuple[Resource, ...] = tuple(Resource)


class Direction(enum.Enum):
    """The direction of a PARTIES move: UP gives the app one unit more, DOWN one unit less."""

    UP = "up"
    DOWN = "down"


class Move(enum.IntEnum):
    """HOLD plus the ten PARTIES moves <UP|DOWN, CORE|CACHE|FREQ|MEM|DISK> (Sec. 4.2.3).

    The integer values are the action codec's per-app indices: 0 is HOLD, 1..5 the UP moves and
    6..10 the DOWN moves, each in `Resource` order.
    """

    HOLD = 0
    UP_CORE = 1
    UP_CACHE = 2
    UP_FREQ = 3
    UP_MEM = 4
    UP_DISK = 5
    DOWN_CORE = 6
    DOWN_CACHE = 7
    DOWN_FREQ = 8
    DOWN_MEM = 9
    DOWN_DISK = 10

    @property
    def direction(self) -> Direction | None:
        if self is Move.HOLD:
            return None
        return Direction.UP if self.value <= 5 else Direction.DOWN

    @property
    def resource(self) -> Resource | None:
        if self is Move.HOLD:
            return None
        return _RESOURCE_ORDER[(self.value - 1) % 5]

    @classmethod
    def of(cls, direction: Direction, resource: Resource) -> Move:
        offset = 1 if direction is Direction.UP else 6
        return cls(offset + _RESOURCE_ORDER.index(resource))

    @property
    def opposite(self) -> Move:
        if self is Move.HOLD:
            return self
        assert self.direction is not None and self.resource is not None
        other = Direction.DOWN if self.direction is Direction.UP else Direction.UP
        return Move.of(other, self.resource)

    def __str__(self) -> str:
        if self is Move.HOLD:
            return "HOLD"
        assert self.direction is not None and self.resource is not None
        return f"<{self.direction.name},{self.resource.name}>"


N_MOVES = len(Move)  # 11: HOLD + the ten PARTIES moves
DOWN_MOVES = tuple(m for m in Move if m.direction is Direction.DOWN)  # the five that take a unit


class AllocationError(ValueError):
    """An allocation that the node cannot apply: raised before anything is written."""


@dataclass(frozen=True, slots=True)
class AppSpec:
    """What a controller may know about an app: its name, kind and, for LC apps, the QoS target.

    `max_load_rps` is the app's *max load* (PARTIES Table 2: the knee of its latency-vs-load
    curve); loads are reported as a fraction of it. `in_memory` and `stateless` are optional hints
    (PARTIES Sec. 4.3 detects in-memory apps online; stateless apps migrate cheaply, Sec. 4.2.1).
    """

    name: str
    kind: AppKind
    qos_target_us: float = math.nan
    max_load_rps: float = math.nan
    stateless: bool = False
    in_memory: bool | None = None

    @property
    def is_lc(self) -> bool:
        return self.kind == "lc"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The node's knobs, their ranges and the apps it runs (after `Node.reset`).

    Ranges are totals for the managed part of the node. `knobs` lists the resources that can be
    actuated here; moves on other resources are masked. `freq_levels_mhz` is ascending; its last
    entry is turbo when `turbo` is true. `core_step` is one CORE move (1 physical core, or a
    CPU-quota step on machines with few cores).
    """

    node_name: str
    interval_s: float
    cores: float
    core_step: float
    llc_ways: int
    clos_count: int
    freq_levels_mhz: tuple[int, ...]
    nominal_freq_mhz: int
    memory_gb: float
    memory_step_gb: float
    disk_mbps: float
    disk_step_mbps: float
    net_gbps: float
    net_step_gbps: float
    mba_levels_pct: tuple[int, ...] = ()
    turbo: bool = True
    knobs: frozenset[Resource] = frozenset(Resource)
    apps: tuple[AppSpec, ...] = ()
    min_llc_ways: int = 1
    min_memory_gb: float = 1.0
    tdp_w: float = math.nan  # socket power budget (RAPL), for Heracles' power sub-controller
    llc_mb: float = math.nan  # LLC capacity (for normalising occupancy)
    dram_peak_gbps: float = math.nan  # peak streaming DRAM bandwidth (Heracles' DRAM limit)
    # derived from `apps` once (read on every interval by features, masks and controllers)
    _lc_apps: tuple[AppSpec, ...] = field(init=False, repr=False, compare=False)
    _be_apps: tuple[AppSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lc_apps", tuple(a for a in self.apps if a.is_lc))
        object.__setattr__(self, "_be_apps", tuple(a for a in self.apps if not a.is_lc))

    @property
    def lc_apps(self) -> tuple[AppSpec, ...]:
        return self._lc_apps

    @property
    def be_apps(self) -> tuple[AppSpec, ...]:
        return self._be_apps

    @property
    def mba(self) -> bool:
        return bool(self.mba_levels_pct)

    def app(self, name: str) -> AppSpec:
        for a in self.apps:
            if a.name == name:
                return a
        raise KeyError(f"unknown app {name!r}; this node runs {[a.name for a in self.apps]}")

    def step(self, resource: Resource) -> float:
        """The size of one move of `resource` (PARTIES Sec. 4.2.4 granularity)."""
        return {
            Resource.CORE: self.core_step,
            Resource.CACHE: 1.0,
            Resource.FREQ: 1.0,  # one level of freq_levels_mhz (100 MHz on Intel)
            Resource.MEM: self.memory_step_gb,
            Resource.DISK: self.disk_step_mbps,
        }[resource]


@dataclass(frozen=True, slots=True)
class AppAlloc:
    """One app's (or BE job's) share of the node. See the module docstring for the semantics."""

    name: str
    cores: float
    core_group: int
    llc_ways: int
    clos: int
    freq_mhz: int
    memory_gb: float
    disk_mbps: float
    net_gbps: float
    mba_pct: int = 100
    cpu_quota: float = 0.0  # cores of CPU time within the core group; 0 = no quota
    cpu_shares: int = 0  # CFS weight within the core group (cgroup v1 cpu.shares, 2..262144); 0 = not set

    def amount(self, resource: Resource) -> float:
        return {
            Resource.CORE: self.cores,
            Resource.CACHE: float(self.llc_ways),
            Resource.FREQ: float(self.freq_mhz),
            Resource.MEM: self.memory_gb,
            Resource.DISK: self.disk_mbps,
        }[resource]


EPS = 1e-6  # tolerance of allocation arithmetic (quantities on a grid of steps)
_EPS = EPS
MIN_CPU_SHARES, MAX_CPU_SHARES = 2, 262144  # cgroup v1 cpu.shares range


@dataclass(frozen=True, slots=True)
class Allocation:
    """The whole node's partition: one `AppAlloc` per app and BE job, plus the idle pool.

    Resources not held by any core group / CLOS / limit form the idle pool (`idle_*`). Build one
    with `Allocation.of(...)`; derive new ones with `with_move` and `replace_app`.
    """

    apps: tuple[AppAlloc, ...]
    total_cores: float
    total_llc_ways: int
    total_memory_gb: float
    total_disk_mbps: float
    total_net_gbps: float
    _index: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, apps: Iterable[AppAlloc], caps: Capabilities) -> Allocation:
        apps = tuple(apps)
        return cls(
            apps=apps,
            total_cores=caps.cores,
            total_llc_ways=caps.llc_ways,
            total_memory_gb=caps.memory_gb,
            total_disk_mbps=caps.disk_mbps,
            total_net_gbps=caps.net_gbps,
            _index={a.name: i for i, a in enumerate(apps)},
        )

    def __post_init__(self) -> None:
        if not self._index:
            object.__setattr__(self, "_index", {a.name: i for i, a in enumerate(self.apps)})

    def __getitem__(self, name: str) -> AppAlloc:
        try:
            return self.apps[self._index[name]]
        except KeyError:
            raise KeyError(f"no allocation for app {name!r}; have {list(self._index)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[AppAlloc]:
        return iter(self.apps)

    def __len__(self) -> int:
        return len(self.apps)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.apps)

    def groups(self) -> dict[int, float]:
        """Core group id -> its cores."""
        return {a.core_group: a.cores for a in self.apps}

    def closes(self) -> dict[int, tuple[int, int]]:
        """CLOS id -> (ways, MBA %)."""
        return {a.clos: (a.llc_ways, a.mba_pct) for a in self.apps}

    @property
    def idle_cores(self) -> float:
        return self.total_cores - sum(self.groups().values())

    @property
    def idle_llc_ways(self) -> int:
        return self.total_llc_ways - sum(w for w, _ in self.closes().values())

    @property
    def idle_memory_gb(self) -> float:
        return self.total_memory_gb - sum(a.memory_gb for a in self.apps)

    @property
    def idle_disk_mbps(self) -> float:
        return self.total_disk_mbps - sum(a.disk_mbps for a in self.apps)

    def replace_app(self, name: str, **changes: Any) -> Allocation:
        """A copy with `changes` applied to app `name` (and to every app sharing its core group or
        CLOS for the shared fields, so that group and CLOS stay consistent)."""
        me = self[name]
        group_fields = {"cores", "freq_mhz"} & changes.keys()
        clos_fields = {"llc_ways", "mba_pct"} & changes.keys()
        out = []
        for a in self.apps:
            if a.name == name:
                out.append(replace(a, **changes))
                continue
            upd: dict[str, Any] = {}
            if a.core_group == me.core_group and "core_group" not in changes:
                upd.update({k: changes[k] for k in group_fields})
            if a.clos == me.clos and "clos" not in changes:
                upd.update({k: changes[k] for k in clos_fields})
            out.append(replace(a, **upd) if upd else a)
        return Allocation(
            apps=tuple(out),
            total_cores=self.total_cores,
            total_llc_ways=self.total_llc_ways,
            total_memory_gb=self.total_memory_gb,
            total_disk_mbps=self.total_disk_mbps,
            total_net_gbps=self.total_net_gbps,
            _index=self._index,
        )

    def with_move(
        self, app: str, move: Move, caps: Capabilities, counterpart: str | None = None
    ) -> Allocation:
        """Apply one PARTIES move to `app` (DESIGN §3).

        An UP move takes one unit from `counterpart` (the victim chosen by the caller: BE first,
        else the LC app with the most slack; PARTIES Alg. 4) or, when `counterpart` is None, from
        the idle pool. A DOWN move gives the unit to `counterpart` (the recipient, usually the BE
        job) or to the idle pool. FREQ is a per-core setting, not a pool: it never has a
        counterpart. Raises `AllocationError` when the move is infeasible (see `move_feasible`).
        """
        if move is Move.HOLD:
            return self
        reason = self.infeasible_reason(app, move, caps, counterpart)
        if reason:
            raise AllocationError(f"{move} for {app!r}: {reason}")
        res, up = move.resource, move.direction is Direction.UP
        assert res is not None
        me = self[app]
        if res is Resource.FREQ:
            levels = caps.freq_levels_mhz
            i = levels.index(me.freq_mhz) + (1 if up else -1)
            return self.replace_app(app, freq_mhz=levels[i])
        field_name, step = _POOL_FIELD[res], caps.step(res)
        if res is Resource.CACHE:
            step = 1
        delta = step if up else -step
        out = self.replace_app(app, **{field_name: getattr(me, field_name) + delta})
        if counterpart is not None:
            other = out[counterpart]
            out = out.replace_app(counterpart, **{field_name: getattr(other, field_name) - delta})
        return out

    def move_feasible(self, app: str, move: Move, caps: Capabilities, counterpart: str | None = None) -> bool:
        return not self.infeasible_reason(app, move, caps, counterpart)

    def infeasible_reason(
        self, app: str, move: Move, caps: Capabilities, counterpart: str | None = None
    ) -> str:
        """Why `move` cannot be applied to `app`, or "" when it can (PARTIES' skipped states,
        Sec. 4.2.3: at the min/max of a resource, or a knob the node does not have)."""
        if move is Move.HOLD:
            return ""
        res, up = move.resource, move.direction is Direction.UP
        assert res is not None
        if res not in caps.knobs:
            return f"the node has no {res.value} knob"
        me = self[app]
        if counterpart is not None:
            if counterpart == app:
                return "counterpart is the app itself"
            if counterpart not in self:
                return f"unknown counterpart {counterpart!r}"
        if res is Resource.FREQ:
            if counterpart is not None:
                return "frequency has no counterpart"
            if me.freq_mhz not in caps.freq_levels_mhz:
                return f"frequency {me.freq_mhz} MHz is not a level of this node"
            i = caps.freq_levels_mhz.index(me.freq_mhz)
            if up and i + 1 >= len(caps.freq_levels_mhz):
                return "already at the highest frequency"
            if not up and i == 0:
                return "already at the lowest frequency"
            return ""
        step = 1.0 if res is Resource.CACHE else caps.step(res)
        field_name = _POOL_FIELD[res]
        mine = getattr(me, field_name)
        minimum = _minimum(res, caps)
        if res is Resource.CORE or res is Resource.CACHE:
            key = "core_group" if res is Resource.CORE else "clos"
            if counterpart is not None and getattr(self[counterpart], key) == getattr(me, key):
                return f"{counterpart!r} shares {app!r}'s {'core group' if res is Resource.CORE else 'CLOS'}"
        if up:
            if counterpart is None:
                pool = {
                    Resource.CORE: self.idle_cores,
                    Resource.CACHE: float(self.idle_llc_ways),
                    Resource.MEM: self.idle_memory_gb,
                    Resource.DISK: self.idle_disk_mbps,
                }[res]
                if pool + _EPS < step:
                    return f"no idle {res.value} to take"
            else:
                theirs = getattr(self[counterpart], field_name)
                if theirs - step < _minimum(res, caps, self[counterpart]) - _EPS:
                    return f"{counterpart!r} is at its minimum {res.value}"
        else:
            if mine - step < minimum - _EPS:
                return f"already at the minimum {res.value}"
        return ""


POOL_FIELD = {  # the allocation field each pooled resource is held in
    Resource.CORE: "cores",
    Resource.CACHE: "llc_ways",
    Resource.MEM: "memory_gb",
    Resource.DISK: "disk_mbps",
}
_POOL_FIELD = POOL_FIELD


def min_amount(res: Resource, caps: Capabilities, is_be: bool = False) -> float:
    """Smallest amount of a resource an app may hold. A BE job may be squeezed to zero cores
    (it is then paused); LC apps keep one step of everything."""
    if res is Resource.CORE:
        return 0.0 if is_be else caps.core_step
    if res is Resource.CACHE:
        return float(caps.min_llc_ways)
    if res is Resource.MEM:
        return caps.min_memory_gb
    if res is Resource.DISK:
        return caps.disk_step_mbps
    return 0.0


def _minimum(res: Resource, caps: Capabilities, app: AppAlloc | None = None) -> float:
    return min_amount(res, caps, app is not None and _is_be(caps, app.name))


def _is_be(caps: Capabilities, name: str) -> bool:
    return any(a.name == name and not a.is_lc for a in caps.apps)


# The allocations found valid most recently, by identity: id -> (allocation, capabilities). Holding
# the objects keeps their ids from being reused while they are here. Sized for the vector env, which
# checks each of its nodes' allocations twice an interval (a guard, then the node) with every other
# node's in between: with room for only a few, a fleet of 16 checked every one again.
_VALIDATED: dict[int, tuple[Allocation, Capabilities]] = {}
_VALIDATED_MAX = 256


def validate_allocation(alloc: Allocation, caps: Capabilities) -> None:
    """Raise `AllocationError` naming the field and what is allowed, before any write (DESIGN §3).
    Both are immutable, so the same pair checked again (a guard, then the node) is not re-checked."""
    hit = _VALIDATED.get(id(alloc))
    if hit is not None and hit[0] is alloc and hit[1] is caps:
        return
    _validate(alloc, caps)
    _VALIDATED[id(alloc)] = (alloc, caps)
    if len(_VALIDATED) > _VALIDATED_MAX:
        del _VALIDATED[next(iter(_VALIDATED))]


_FLOAT_FIELDS = ("cores", "memory_gb", "disk_mbps", "net_gbps", "cpu_quota")


def _validate(alloc: Allocation, caps: Capabilities) -> None:
    names = [a.name for a in alloc.apps]
    known = {a.name for a in caps.apps}
    for n in names:
        if n not in known:
            raise AllocationError(f"unknown app {n!r}; this node runs {sorted(known)}")
    if len(set(names)) != len(names):
        raise AllocationError(f"duplicate apps in allocation: {names}")
    missing = known - set(names)
    if missing:
        raise AllocationError(f"allocation has no entry for {sorted(missing)}")
    groups: dict[int, tuple[float, int]] = {}
    closes: dict[int, tuple[int, int]] = {}
    be = {b.name for b in caps.apps if not b.is_lc}
    for a in alloc.apps:
        for f in _FLOAT_FIELDS:
            v = getattr(a, f)
            if isinstance(v, float) and not math.isfinite(v):
                raise AllocationError(f"{a.name}.{f} = {v} is not a finite number")
        lo_cores = 0.0 if a.name in be else caps.core_step
        if not (lo_cores - _EPS <= a.cores <= caps.cores + _EPS):
            raise AllocationError(f"{a.name}.cores = {a.cores}: allowed {lo_cores}..{caps.cores}")
        if abs(a.cores / caps.core_step - round(a.cores / caps.core_step)) > 1e-6:
            raise AllocationError(f"{a.name}.cores = {a.cores}: must be a multiple of {caps.core_step}")
        if a.cpu_shares != 0 and not (MIN_CPU_SHARES <= a.cpu_shares <= MAX_CPU_SHARES):
            raise AllocationError(
                f"{a.name}.cpu_shares = {a.cpu_shares}: allowed 0 (not set) or {MIN_CPU_SHARES}..{MAX_CPU_SHARES}"
            )
        if not (0.0 <= a.cpu_quota <= a.cores + _EPS):
            raise AllocationError(
                f"{a.name}.cpu_quota = {a.cpu_quota}: allowed 0 (none)..{a.cores} (its group's cores)"
            )
        if a.core_group in groups and groups[a.core_group] != (a.cores, a.freq_mhz):
            raise AllocationError(
                f"{a.name}: apps of core group {a.core_group} must agree on cores and freq_mhz"
            )
        groups[a.core_group] = (a.cores, a.freq_mhz)
        if not (caps.min_llc_ways <= a.llc_ways <= caps.llc_ways):
            raise AllocationError(
                f"{a.name}.llc_ways = {a.llc_ways}: allowed {caps.min_llc_ways}..{caps.llc_ways}"
            )
        if not (0 <= a.clos < max(caps.clos_count, 1)):
            raise AllocationError(f"{a.name}.clos = {a.clos}: allowed 0..{max(caps.clos_count, 1) - 1}")
        if a.clos in closes and closes[a.clos] != (a.llc_ways, a.mba_pct):
            raise AllocationError(f"{a.name}: apps of CLOS {a.clos} must agree on llc_ways and mba_pct")
        closes[a.clos] = (a.llc_ways, a.mba_pct)
        if a.freq_mhz not in caps.freq_levels_mhz:
            raise AllocationError(f"{a.name}.freq_mhz = {a.freq_mhz}: allowed {list(caps.freq_levels_mhz)}")
        if caps.mba_levels_pct:
            if a.mba_pct not in caps.mba_levels_pct:
                raise AllocationError(f"{a.name}.mba_pct = {a.mba_pct}: allowed {list(caps.mba_levels_pct)}")
        elif a.mba_pct != 100:
            raise AllocationError(f"{a.name}.mba_pct = {a.mba_pct}: this node has no MBA (only 100)")
        for name, value, lo, hi in (
            ("memory_gb", a.memory_gb, caps.min_memory_gb, caps.memory_gb),  # a limit of 0 kills the app
            ("disk_mbps", a.disk_mbps, 0.0, caps.disk_mbps),
            ("net_gbps", a.net_gbps, 0.0, caps.net_gbps),
        ):
            if not (lo - _EPS <= value <= hi + _EPS):
                raise AllocationError(f"{a.name}.{name} = {value}: allowed {lo}..{hi}")
    used_cores = sum(c for c, _ in groups.values())
    if used_cores > caps.cores + _EPS:
        raise AllocationError(f"core groups hold {used_cores} cores; the node has {caps.cores}")
    used_ways = sum(w for w, _ in closes.values())
    if used_ways > caps.llc_ways:
        raise AllocationError(f"CLOSes hold {used_ways} LLC ways; the node has {caps.llc_ways}")
    if len(closes) > max(caps.clos_count, 1):
        raise AllocationError(f"{len(closes)} CLOSes used; the node has {caps.clos_count}")


@dataclass(frozen=True, slots=True)
class Usage:
    """Measured use of each resource by one app over the last interval."""

    cpu_util: float  # busy fraction of the app's cores (0..1; >1 never)
    llc_mb: float  # LLC occupancy
    mem_bw_gbps: float
    memory_gb: float  # resident memory
    disk_mbps: float
    net_gbps: float
    freq_mhz: float  # achieved frequency of the app's cores (turbo and power limits included)


class QosVerdict:
    """A p99 judged against its QoS target (mixin of `AppSample` and the loop's records; expects
    `p99_us`, `target_us` and `valid`). Slack is defined once, in `slack()`."""

    __slots__ = ()

    if TYPE_CHECKING:  # fields of the dataclasses that mix this in
        p99_us: float
        target_us: float
        valid: bool

    @property
    def slack(self) -> float:
        """(target - p99) / target, positive when QoS is met; NaN for an invalid sample."""
        return slack(self.target_us, self.p99_us) if self.valid else math.nan

    @property
    def tardiness(self) -> float:
        """p99 / target (Q-PRM's QoS tardiness; > 1 is a violation); NaN for an invalid sample."""
        return self.p99_us / self.target_us if self.valid else math.nan

    @property
    def meets_qos(self) -> bool:
        return self.valid and self.p99_us <= self.target_us


@dataclass(frozen=True, slots=True)
class AppSample(QosVerdict):
    """One LC app over one interval: its p99 against its target, its load and its usage.

    `valid` is false when the latency feed failed (stale or silent): then `p99_us` is NaN and a
    controller must not treat it as a measurement (DESIGN §3: never a zero). `histogram` holds the
    latencies of the interval's requests (`env.histogram`; a window's tail is read off the sum of
    its intervals', DESIGN §5); None where the node has no histogram (a feed that sends only p99).
    `sub_p99_us` is the p99 of each equal sub-interval of the interval, in order (the 100 ms samples
    PARTIES' own code reads, `manager/PARTIES.py` INTERVAL = 0.1), NaN for a sub-interval in which
    no request completed; empty where the node reports none.
    """

    name: str
    p99_us: float
    target_us: float
    load_rps: float
    load_frac: float  # offered load / max load
    served_rps: float
    dropped_rps: float
    requests: int
    usage: Usage
    valid: bool = True
    histogram: LatencyHistogram | None = None  # the interval's requests; None: the node has none
    sub_p99_us: tuple[float, ...] = ()  # p99 of each sub-interval (NaN: no request); (): none reported


@dataclass(frozen=True, slots=True)
class BeSample:
    """One best-effort job over one interval. `throughput` is normalised to the job running alone
    on the whole node (PARTIES Sec. 5.1; Heracles' EMU normalisation)."""

    name: str
    throughput: float
    usage: Usage


@dataclass(frozen=True, slots=True)
class Observation:
    """What the node reports each interval (DESIGN §3)."""

    time_s: float
    interval_s: float
    apps: tuple[AppSample, ...]
    be: tuple[BeSample, ...]
    allocation: Allocation
    mem_bw_gbps: float
    power_w: float
    valid: bool = True
    stale_s: float = 0.0

    def app(self, name: str) -> AppSample:
        for s in self.apps:
            if s.name == name:
                return s
        raise KeyError(f"no sample for app {name!r}")

    @property
    def be_throughput(self) -> float:
        return sum(b.throughput for b in self.be)

    @property
    def all_qos_met(self) -> bool:
        return all(s.meets_qos for s in self.apps)


@dataclass(frozen=True, slots=True)
class Decision:
    """A controller's output for one tick.

    `allocation` is the target allocation (None keeps the current one). `move`/`app` describe it
    when it is a single PARTIES move; `moves` when it is several apps' moves of one interval, at
    most one each, as the `per_app` action mode applies them (`env.moves.plan_moves`). `signals`
    carries requests the node cannot act on by itself, e.g. {"migrate": "xapian"} (PARTIES Sec. 4.2.1).
    """

    allocation: Allocation | None
    reason: str = ""
    move: Move | None = None
    app: str | None = None
    signals: Mapping[str, Any] = field(default_factory=dict)
    moves: tuple[tuple[str, Move], ...] = ()

    @classmethod
    def hold(cls, reason: str = "hold") -> Decision:
        return cls(allocation=None, reason=reason, move=Move.HOLD)
