"""CoCo (SLO beyond the hardware isolation limits; ../shared/seeds/004_*.txt, Sec. 3) as a tick function,
with the two references of its Fig. 2: round-robin CLOS time-sharing and no partitioning.

CoCo lets more LC containers than the hardware has CLOSes (classes of service, Intel CAT/MBA) share
the partitions by *time-sharing* them. Three specs, built by the factories at the end:

* ``coco``        profiled slowdowns, multi-level-queue weighted round-robin (MQ-WRR), admission control;
* ``coco-rr``     the same CLOSes time-shared by plain round-robin (CoCo's reference [30]; no profile);
* ``coco-nopart`` the same core pinning, no CAT/MBA partitioning at all (every app in one CLOS holding
                  all ways at 100% MBA). This is not `unmanaged`, which also shares the cores and runs
                  the governor: CoCo's Fig. 2 varies only the LLC/MBA partitioning (Sec. 4.1 pins each
                  container to its own cores in every experiment).

and two of Fig. 2's ablations of CoCo itself (its profile, MQ-WRR and admission control kept):

* ``coco-cat``      CAT only: the same CLOS ways, no MBA throttle;
* ``coco-conflict`` CAT and MBA in conflict (Sec. 3.3): the same ways and MBA levels paired the other way
                    round, the most ways with the least bandwidth (the paper does not give its
                    conflicting configuration).

Rules and where they come from:

1. **Slowdown profile** (Sec. 3.1, Eq. 1): each workload runs alone with a resource limiter from full
   LLC and MBA (L ways, 100%) down step by step (one way, one MBA level: "the minimum adjustment
   configuration defined by CAT/MBA"), i.e. every state S = (l, m) of the grid; at each state the
   client load is raised until the SLO is violated, giving SL_S, and slowdown_S = SL_full / SL_S.
   The profile is measured in the simulator on the workload's own deployment (the scenario's
   profile, overrides and platform; the cores CoCo pins it to) with the analytic (noise-free)
   evaluation of `env.sim.experiments`, at the calibration's 1-minute-p99 criterion (CoCo Sec. 4.1
   measures Table 1 the same way: `measure_retention` run on `env.sim.fit.coco_setups` gives the
   profile exactly). Its precision (not its cost): SL_full is located on a geometric load grid and
   refined inside the crossing cell (`full_refine_points`), then each state's SL_S on a grid of 1% of
   SL_full, so a retention is within 1 point of the model's continuous value (plus SL_full's refined
   cell, ~0.1%). Its cost is counted as the profiling runs a lab would make
   (`ProfilingConfig`): a doubling-then-bisection search for SL_full, then per state a walk up in
   steps of `load_step_pct` of SL_full until the first violation, each point a warm-up plus a measured
   window. The cost is in `SlowdownProfile.cost_s`, `CocoController.profile_cost_s` and the first
   decision's reason. Two instances of one workload (same app, deployment and cores) share one profile.
2. **CLOS configuration** (Sec. 3.2, Fig. 1, Sec. 4.2): one CLOS is reserved for CoCo's own process and
   background (BE) jobs; the others have increasing ways and MBA. The default is the Fig. 2 setup: the
   reserved CLOS 2 ways / 10%, LC CLOSes 3/10%, 6/30%, 9/50% (the 3-6-9 bits of Fig. 1). CLOS 0 is the
   reserved one, LC CLOSes are 1..K in increasing capacity.
3. **MQ-WRR** (Sec. 3.2, Eq. 2): each LC CLOS is a queue with a wait queue and a working set.
   CoCo time-shares each CLOS among the N admitted workloads with weight_i = slowdown_i(S) / sum_k
   slowdown_k(S) at that CLOS's member state S (choice a). Slices are scheduled by smooth weighted
   round-robin, one queue level at a time from the largest CLOS down ("preference to workloads with
   high slowdown values"): in each slice every workload not yet placed accrues its weight as credit,
   the highest credits win the working set's places and pay the credit accrued in that round (so no
   workload starves), among the workloads that rule 6 lets run there.
4. **CAT and MBA move together** (Sec. 3.3): the CLOS configuration must be monotone, never more
   ways with less MBA (`coordinate_cat_mba`; a conflicting configuration is refused at load time),
   and a workload always moves with both of its CLOS's settings (a CLOS is the unit of migration).
5. **Cache flush after a CLOS migration** (Sec. 3.3): CoCo flushes the original partition after each
   change; the simulator flushes an app's LLC occupancy whenever its CLOS changes (env.sim.model
   A_FLUSH), so the app warms up again. The controller counts migrations (`migrations`, in reasons).
6. **Admission control** (Sec. 3.2): CoCo schedules "without violating SLOs in the runtime" and "if
   no schedule can meet all SLOs, admission control will kick in to keep only affordable workloads".
   A slice lasts 500 ms or more while the SLOs are sub-millisecond to 300 ms p99s, so a slice in a
   CLOS whose state cannot serve a workload's load is a violation: capacity does not average over
   slices (a backlog built in one slice delays nearly every request of it). So at each slice a
   workload is eligible for the LC CLOSes whose member state sustains its offered load (observed
   rps <= SL_S by its profile), MQ-WRR places it only there, and while the admitted workloads cannot
   all be placed in eligible CLOSes the one whose load exceeds most what the largest CLOS sustains is
   rejected. A rejected workload cannot be removed from a node by its manager: it runs in the
   reserved CLOS, unscheduled, and is named in `Decision.signals["admission_reject"]` (as PARTIES
   signals a migration); it is re-admitted when it fits again.

Ambiguities resolved (each also noted at the code):

a. Where containers run. Sec. 3.2 reserves one CLOS for CoCo and background jobs and keeps "all
   other CLOSs ... for scheduling of co-located LC workloads"; the authors' prototype
   (github.com/James-QiuHaoran/CoCo, scheduler/scheduler.c: "clos0 is the common pool, clos1 clos2
   clos3 are clos to be scheduled on") never puts a container in the pool. LC services cannot stop
   serving, so every admitted container is in some LC CLOS's working set in every slice: singletons
   when N <= K, else working sets of N // K or N // K + 1 ("usually singleton ... but it can also
   serve two containers"), the larger CLOSes taking the extra. Its state S_i = (l_i, m_i) of Eq. 1
   ("the LLC ways and MBA levels allocated to the workload") is then the CLOS's MBA level and its
   ways split among the working set (`member_state`). Only rejected workloads (rule 6) run in the
   reserved CLOS. Moving between working sets is a CLOS migration.
b. Slice length. The simulator applies allocations per 500 ms interval, so a slice is
   `slice_intervals` intervals (default 1, the finest possible); the paper gives no slice length (the
   authors' prototype sleeps a whole number of seconds per slice). Since the window p99 counts every
   request, an interval spent in a CLOS where the workload cannot meet its SLO shows in it: rule 6
   keeps workloads out of such CLOSes.
c. Cores, frequency, memory, disk, network: CoCo manages LLC and MBA only. Each LC app is pinned to its
   own cores (Sec. 4.1: "we pin each co-located workload to a set of cores"), `cores_per_app` each
   (default: an equal split); BE jobs get the rest. Frequency is left to the governor (the top level)
   and memory, disk and network are not limited, as `env.sim.experiments.pinned` does.
d. CLOS configuration is static (from the YAML): the paper gives no rule mapping sensitivities to a
   configuration beyond Fig. 1/Fig. 2, so Sec. 3.3 is enforced on the configuration (rule 4). On a
   platform without MBA every CLOS has 100% (CAT only); with fewer CLOSes than configured, the largest
   LC CLOSes that fit are used.
e. A state where the workload cannot meet its SLO at any load has an infinite slowdown; it is capped at
   `max_slowdown` so that Eq. 2 stays defined.
f. Round-robin ([30]) fills the same working-set places from the admitted-order list rotated by one
   working set per slice, so every container moves to the next LC CLOS each slice with the same
   companions (the authors' prototype rotates every container's CLOS id by one per slice) and
   visits every LC CLOS; no profile, no admission control.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController
from env.types import Allocation, AppAlloc, Capabilities, Decision, Observation

if TYPE_CHECKING:
    from env.sim.experiments import Setup
    from env.sim.scenario import Scenario

DEFAULT_CONFIG = CONFIGS / "baselines" / "coco.yaml"
RESERVED_CLOS = 0  # CLOS of CoCo's process and the background (BE) jobs (Sec. 3.2)
BE_GROUP = 0  # core group of the BE jobs
Scheduler = Literal["mq-wrr", "rr", "none"]
VARIANTS = ("coco", "coco-rr", "coco-nopart", "coco-cat", "coco-conflict")
_EPS = 1e-9


# ==================================================================================================
# configuration
# ==================================================================================================
@dataclass(frozen=True)
class ClosConfig:
    """One CLOS: its capacity bitmask length (ways) and its MBA throttle (Sec. 2, 3.2)."""

    ways: int
    mba_pct: int = 100


@dataclass(frozen=True)
class ProfilingConfig:
    """How the slowdown profile is measured and what it costs (Sec. 3.1, 4.1).

    `meet_threshold` on P(the 1-minute p99 meets the SLO) decides a load point, as the calibration
    does (env.sim.experiments); `warmup_s + measure_s` is one profiling run; the cost model is in the
    module docstring (rule 1)."""

    load_step_pct: float = 5.0  # walk-up step per state, % of SL_full
    full_search_start: float = 0.05  # SL_full search starts here (fraction of the app's max load)
    full_search_precision: float = 0.01  # bisection stops at this relative width
    warmup_s: float = 30.0
    measure_s: float = 60.0
    meet_threshold: float = 0.5
    full_grid_points: int = 320  # analytic grid for SL_full (geometric, fractions of max load)
    full_grid_lo: float = 0.002
    full_grid_hi: float = 2000.0
    full_refine_points: int = 41  # SL_full: the crossing cell of that grid re-evaluated at this many points
    state_grid_points: int = 110  # analytic grid per state: SL_full x (1..110)% in 1% steps

    def __post_init__(self) -> None:
        for k in ("load_step_pct", "full_search_start", "full_search_precision", "measure_s"):
            if not getattr(self, k) > 0:
                raise ConfigError(f"coco.profiling.{k} must be > 0")
        if self.warmup_s < 0:
            raise ConfigError("coco.profiling.warmup_s must be >= 0")
        if not 0 < self.meet_threshold < 1:
            raise ConfigError("coco.profiling.meet_threshold must be in (0, 1)")
        if not 0 < self.full_grid_lo < self.full_grid_hi:
            raise ConfigError("coco.profiling: need 0 < full_grid_lo < full_grid_hi")
        if self.full_grid_points < 10 or self.state_grid_points < 10:
            raise ConfigError("coco.profiling: the analytic grids need at least 10 points")
        if self.full_refine_points < 2:
            raise ConfigError("coco.profiling.full_refine_points must be >= 2 (the crossing cell's ends)")


@dataclass(frozen=True)
class CocoConfig:
    """CoCo's constants (Sec. 3-4; configs/baselines/coco.yaml). See the module docstring."""

    scheduler: Scheduler = "mq-wrr"
    reserved_clos: ClosConfig = ClosConfig(2, 10)
    lc_clos: tuple[ClosConfig, ...] = (ClosConfig(3, 10), ClosConfig(6, 30), ClosConfig(9, 50))
    coordinate_cat_mba: bool = True
    slice_intervals: int = 1
    admission_control: bool = True
    cores_per_app: float | None = None
    max_slowdown: float = 100.0
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)

    def __post_init__(self) -> None:
        if self.slice_intervals < 1:
            raise ConfigError("coco.slice_intervals must be >= 1")
        if not self.max_slowdown > 1:
            raise ConfigError("coco.max_slowdown must be > 1")
        if self.cores_per_app is not None and not self.cores_per_app > 0:
            raise ConfigError("coco.cores_per_app must be > 0 (or null: an equal split)")
        if self.admission_control and self.scheduler != "mq-wrr":
            raise ConfigError("coco: admission control needs the profile, i.e. scheduler mq-wrr")
        if self.scheduler != "none" and not self.lc_clos:
            raise ConfigError("coco.lc_clos: at least one LC CLOS is needed to time-share")
        for i, c in enumerate((self.reserved_clos, *self.lc_clos)):
            if c.ways < 1 or not 0 < c.mba_pct <= 100:
                raise ConfigError(f"coco CLOS {i}: need ways >= 1 and 0 < mba_pct <= 100, got {c}")
        if self.coordinate_cat_mba:
            check_monotone((self.reserved_clos, *self.lc_clos))

    @property
    def needs_profile(self) -> bool:
        return self.scheduler == "mq-wrr"


def check_monotone(closes: tuple[ClosConfig, ...]) -> None:
    """Sec. 3.3: CAT and MBA always move together, so a CLOS with more ways never has less memory
    bandwidth than one with fewer ("never reduces the LLC partition when increasing the memory
    partition"). Raises ConfigError on a conflicting pair."""
    for a in closes:
        for b in closes:
            if a.ways > b.ways and a.mba_pct < b.mba_pct:
                raise ConfigError(
                    f"coco: CLOS {a.ways} ways / {a.mba_pct}% MBA conflicts with {b.ways} ways / "
                    f"{b.mba_pct}% (Sec. 3.3: more ways must not have less MBA; set coordinate_cat_mba: "
                    "false to allow it)"
                )


@dataclass(frozen=True)
class _CocoFile:
    """configs/baselines/coco.yaml: the `coco` config and per-variant overrides of its keys."""

    coco: dict[str, Any]
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_coco_config(variant: str = "coco", path: str | Path | None = None) -> CocoConfig:
    """The config of `variant` (`VARIANTS`) from `path` (default
    configs/baselines/coco.yaml): the `coco` mapping with the variant's overrides, built strictly."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown CoCo variant {variant!r}; known: {list(VARIANTS)}")
    p = Path(path) if path is not None else DEFAULT_CONFIG
    raw = build(_CocoFile, load_yaml(p), p.name)
    unknown = sorted(set(raw.variants) - set(VARIANTS[1:]))
    if unknown:
        raise ConfigError(f"{p.name}.variants: unknown {unknown}; allowed: {list(VARIANTS[1:])}")
    data = dict(raw.coco)
    if variant != "coco":
        data.update(raw.variants.get(variant, {}))
    return build(CocoConfig, data, f"{p.name}:{variant}")


# ==================================================================================================
# rule 1: the slowdown profile (Sec. 3.1, Eq. 1)
# ==================================================================================================
@dataclass(frozen=True)
class SlowdownProfile:
    """A workload's load retention SL_S / SL_full at each (ways, MBA %) state, and SL_full."""

    workload: str  # profile name and deployment
    cores: float
    max_load_rps: float  # the deployment's max load (loads are fractions of it)
    sl_full: float  # SL_full, fraction of max_load_rps
    retention: dict[tuple[int, int], float]  # (ways, mba_pct) -> SL_S / SL_full in [0, 1]
    points: int  # profiling load points run
    cost_s: float  # simulated seconds of profiling

    @property
    def sl_full_rps(self) -> float:
        return self.sl_full * self.max_load_rps

    def slowdown(self, ways: int, mba_pct: int, cap: float) -> float:
        """Eq. 1: SL_full / SL_S, capped at `cap` (docstring choice e)."""
        r = self.retention[(ways, mba_pct)]
        return cap if r <= 1.0 / cap else min(cap, 1.0 / r)


_PROFILES: dict[tuple, SlowdownProfile] = {}


def _workload_key(scenario: Scenario, instance: str, cores: float, cfg: ProfilingConfig) -> tuple:
    entry = next(e for e in scenario.apps if e.instance == instance)
    return (
        scenario.platform,
        entry.app,
        tuple(sorted(entry.overrides.items())),
        tuple(sorted(entry.perturb.items())),
        float(cores),
        cfg,
    )


def walk_points(retention: float, step_pct: float) -> int:
    """Load points of a walk up in steps of `step_pct` % of SL_full until the first violation."""
    return math.floor(max(retention, 0.0) * 100.0 / step_pct + 1e-9) + 1


def full_search_points(sl_full: float, cfg: ProfilingConfig) -> int:
    """Load points of the SL_full search: double from `full_search_start` until the first violation,
    then bisect the last bracket to `full_search_precision` relative width."""
    if sl_full <= cfg.full_search_start:
        return 1
    doublings = math.ceil(math.log2(sl_full / cfg.full_search_start) + 1e-12) + 1
    bisections = math.ceil(math.log2(1.0 / cfg.full_search_precision))
    return doublings + bisections


def first_crossing(setup: Setup, grid: np.ndarray, cfg: ProfilingConfig) -> float:
    """The largest load (fraction of the app's max load) before P(meet) first drops below
    `meet_threshold` walking up `grid` (`env.sim.experiments.analytic_max_load`), refined by
    re-evaluating the crossing cell at `full_refine_points` evenly spaced loads."""
    from env.sim.experiments import analytic_max_load, analytic_meet

    pm = analytic_meet([setup], grid, window_s=cfg.measure_s)
    x = float(analytic_max_load(pm, grid, cfg.meet_threshold)[0])
    fail = np.nonzero(pm[0] < cfg.meet_threshold)[0]
    if len(fail) and fail[0] > 0:
        fine = np.linspace(grid[fail[0] - 1], grid[fail[0]], cfg.full_refine_points)
        pm = analytic_meet([setup], fine, window_s=cfg.measure_s)
        x = float(analytic_max_load(pm, fine, cfg.meet_threshold)[0])
    return x


def measure_retention(
    full: Setup, states: list[Setup], cfg: ProfilingConfig = ProfilingConfig()
) -> tuple[float, list[float]]:
    """Rule 1's measurement: SL_full of the `full` set-up (its first LC app's load, a fraction of its
    max load) and SL_S / SL_full in [0, 1] for each of `states`, by the analytic (noise-free)
    evaluation of `env.sim.experiments` at the 1-minute-p99 criterion (`measure_s`, `meet_threshold`).
    SL_full: `first_crossing` on the geometric grid; SL_S: the crossing on SL_full x 1%..N%."""
    from env.sim.experiments import analytic_max_load, analytic_meet

    grid = np.geomspace(cfg.full_grid_lo, cfg.full_grid_hi, cfg.full_grid_points)
    sl_full = first_crossing(full, grid, cfg)
    if sl_full <= 0:
        return 0.0, [0.0] * len(states)
    loads = sl_full * np.arange(1, cfg.state_grid_points + 1) / 100.0
    pm = analytic_meet(states, loads, window_s=cfg.measure_s)
    found = analytic_max_load(pm, loads, cfg.meet_threshold) / sl_full
    return sl_full, [float(min(1.0, v)) for v in found]


def profile_workload(
    scenario: Scenario, instance: str, cores: float, cfg: ProfilingConfig = ProfilingConfig()
) -> SlowdownProfile:
    """Rule 1 for one workload of `scenario`: alone on a node of the same platform (no BE job),
    pinned to `cores`, at every (ways, MBA) state of the platform's CAT/MBA grid. Analytic
    evaluation (env.sim.experiments), so nothing is stepped; cached per workload."""
    key = _workload_key(scenario, instance, cores, cfg)
    if key in _PROFILES:
        return _PROFILES[key]
    from env.sim.engine import lc_profile_of
    from env.sim.experiments import Setup, pinned

    entry = next(e for e in scenario.apps if e.instance == instance)
    solo = dataclasses.replace(
        scenario, name=f"coco-profile-{instance}", apps=(entry,), be=(), antagonists=()
    )
    pl = solo.platform_spec
    ways = list(range(pl.llc.ways, pl.llc.min_ways - 1, -1))
    mbas = sorted(pl.mba.levels_pct, reverse=True) or [100]
    if 100 not in mbas:
        mbas = [100, *mbas]

    def setup(w: int, m: int) -> Setup:
        return Setup(solo, pinned({instance: cores}, ways={instance: w}, mba={instance: m}))

    states = [(w, m) for w in ways for m in mbas]
    sl_full, found = measure_retention(setup(pl.llc.ways, 100), [setup(w, m) for w, m in states], cfg)
    retention = dict(zip(states, found))
    retention[(pl.llc.ways, 100)] = 1.0 if sl_full > 0 else 0.0
    points = full_search_points(sl_full, cfg) + sum(
        walk_points(r, cfg.load_step_pct) for s, r in retention.items() if s != (pl.llc.ways, 100)
    )
    max_rps = lc_profile_of(solo, 0).max_load_rps
    out = SlowdownProfile(
        workload=f"{entry.app}{dict(entry.overrides) or ''}",
        cores=float(cores),
        max_load_rps=float(max_rps),
        sl_full=sl_full,
        retention=retention,
        points=points,
        cost_s=points * (cfg.warmup_s + cfg.measure_s),
    )
    _PROFILES[key] = out
    return out


def profile_scenario(
    scenario: Scenario, caps: Capabilities, cfg: CocoConfig
) -> tuple[dict[str, SlowdownProfile], float]:
    """Profiles of every LC app of `scenario` (instances of one workload share one profile) and the
    total profiling cost in simulated seconds (each distinct workload counted once)."""
    cores = lc_cores(caps, cfg)
    out: dict[str, SlowdownProfile] = {}
    seen: dict[tuple, SlowdownProfile] = {}
    for e in scenario.apps:
        k = _workload_key(scenario, e.instance, cores, cfg.profiling)
        if k not in seen:
            seen[k] = profile_workload(scenario, e.instance, cores, cfg.profiling)
        out[e.instance] = seen[k]
    return out, sum(p.cost_s for p in seen.values())


# ==================================================================================================
# rules 2 and (c): CLOSes and cores on a node
# ==================================================================================================
def lc_cores(caps: Capabilities, cfg: CocoConfig) -> float:
    """Cores pinned to each LC app (choice c): `cores_per_app` or an equal split in core steps."""
    n = max(len(caps.lc_apps), 1)
    step = caps.core_step
    if cfg.cores_per_app is not None:
        c = math.floor(cfg.cores_per_app / step + 1e-9) * step
    else:
        c = math.floor(caps.cores / n / step + 1e-9) * step
    if c < step - _EPS or c * n > caps.cores + _EPS:
        raise ConfigError(
            f"coco: {n} LC apps x {c:g} cores do not fit on {caps.cores:g} cores (cores_per_app)"
        )
    return float(c)


@dataclass(frozen=True)
class ClosPlan:
    """The CLOS configuration on a node: the reserved CLOS and the LC CLOSes (id, ways, MBA %)."""

    reserved: ClosConfig
    lc: tuple[ClosConfig, ...]  # CLOS ids 1..K, increasing capacity

    def state(self, clos: int) -> ClosConfig:
        return self.reserved if clos == RESERVED_CLOS else self.lc[clos - 1]


def clos_plan(caps: Capabilities, cfg: CocoConfig) -> ClosPlan:
    """Rule 2 on this node (choice d): MBA levels dropped where the node has no MBA, the largest LC
    CLOSes that fit the node's CLOS count; the ways must fit the LLC."""

    def fit(c: ClosConfig) -> ClosConfig:
        if not caps.mba:
            return ClosConfig(c.ways, 100)
        if c.mba_pct not in caps.mba_levels_pct:
            raise ConfigError(
                f"coco: MBA {c.mba_pct}% is not a level of this node {list(caps.mba_levels_pct)}"
            )
        return c

    lc = sorted((fit(c) for c in cfg.lc_clos), key=lambda c: (c.ways, c.mba_pct))
    lc = lc[max(0, len(lc) - (max(caps.clos_count, 1) - 1)) :]
    reserved = fit(cfg.reserved_clos)
    ways = reserved.ways + sum(c.ways for c in lc)
    if ways > caps.llc_ways:
        raise ConfigError(f"coco: the CLOSes hold {ways} ways; this node's LLC has {caps.llc_ways}")
    if min(c.ways for c in (reserved, *lc)) < caps.min_llc_ways:
        raise ConfigError(f"coco: every CLOS needs at least {caps.min_llc_ways} ways on this node")
    return ClosPlan(reserved, tuple(lc))


def build_allocation(
    caps: Capabilities, placement: dict[str, int], plan: ClosPlan, cores: float
) -> Allocation:
    """LC app i on its own core group i+1 with `cores`, in CLOS `placement[app]`; BE jobs in the
    reserved CLOS on the remaining cores (choice c). Unlimited memory, disk and network; top frequency."""
    top = caps.freq_levels_mhz[-1]
    apps = []
    for i, a in enumerate(caps.lc_apps, start=1):
        c = plan.state(placement[a.name])
        apps.append(
            AppAlloc(
                a.name,
                cores,
                i,
                c.ways,
                placement[a.name],
                top,
                caps.memory_gb,
                caps.disk_mbps,
                caps.net_gbps,
                mba_pct=c.mba_pct,
            )
        )
    rest = max(0.0, caps.cores - cores * len(caps.lc_apps))
    for b in caps.be_apps:
        r = plan.reserved
        apps.append(
            AppAlloc(
                b.name,
                rest,
                BE_GROUP,
                r.ways,
                RESERVED_CLOS,
                top,
                caps.memory_gb,
                caps.disk_mbps,
                caps.net_gbps,
                mba_pct=r.mba_pct,
            )
        )
    return Allocation.of(apps, caps)


def nopart_allocation(caps: Capabilities, cores: float) -> Allocation:
    """No partitioning (Fig. 2 reference): CoCo's core pinning, one CLOS with every way at 100% MBA."""
    plan = ClosPlan(ClosConfig(caps.llc_ways, 100), ())
    return build_allocation(caps, {a.name: RESERVED_CLOS for a in caps.lc_apps}, plan, cores)


# ==================================================================================================
# rule 3: MQ-WRR and round-robin
# ==================================================================================================
def eq2_weights(slowdowns: dict[str, float]) -> dict[str, float]:
    """Eq. 2: weight_i = slowdown_i / sum_k slowdown_k over the workloads sharing a CLOS."""
    total = sum(slowdowns.values())
    return {k: v / total for k, v in slowdowns.items()} if total > 0 else {}


def working_set_sizes(n_apps: int, n_closes: int) -> dict[int, int]:
    """Working-set size of each LC CLOS 1..K (choice a): every admitted workload is in one LC CLOS's
    working set in every slice, so with N <= K they are singletons in the N largest CLOSes, and with
    N > K each holds N // K or N // K + 1 (the larger ones the extra: Sec. 3.2 "usually singleton ...
    but it can also serve two containers")."""
    if n_closes < 1:
        return {}
    base, extra = divmod(n_apps, n_closes)
    return {c: base + (1 if c > n_closes - extra else 0) for c in range(1, n_closes + 1)}


def assignable(apps: list[str], eligible: dict[str, set[int]], slots: dict[int, int]) -> bool:
    """Can every app of `apps` be put in a CLOS it is eligible for without exceeding `slots`? (A
    bipartite matching of apps to working-set places, by augmenting paths.)"""
    places = [c for c, n in sorted(slots.items()) for _ in range(n)]
    owner: list[str | None] = [None] * len(places)

    def augment(a: str, seen: set[int]) -> bool:
        for j, c in enumerate(places):
            if c in eligible.get(a, set()) and j not in seen:
                seen.add(j)
                o = owner[j]
                if o is None or augment(o, seen):
                    owner[j] = a
                    return True
        return False

    return all(augment(a, set()) for a in apps)


@dataclass
class Mqwrr:
    """Smooth weighted round-robin over several queue levels (rule 3). `weights[c][app]` is the
    Eq. 2 weight of `app` on LC CLOS c; `credits` is the explicit state carried between slices."""

    weights: dict[int, dict[str, float]]
    credits: dict[int, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c, w in self.weights.items():
            self.credits.setdefault(c, dict.fromkeys(w, 0.0))

    def next_slice(self, apps: list[str], eligible: dict[str, set[int]] | None = None) -> dict[str, int]:
        """Working sets of the next slice: {app: LC CLOS}, every app of `apps` in exactly one CLOS
        (sizes from `working_set_sizes`), filled largest CLOS first. In each CLOS every candidate
        accrues its weight as credit, the highest credits win its places and together pay the credit
        accrued in that round (so no workload starves); ties go to the app listed first.
        `eligible[app]` restricts an app to the CLOSes whose state sustains its load (rule 6); a
        candidate is taken only if the others can still all be placed where they are eligible."""
        closes = sorted(self.weights, reverse=True)
        slots = working_set_sizes(len(apps), len(closes))
        elig = eligible if eligible is not None else {a: set(closes) for a in apps}
        out: dict[str, int] = {}
        for c in closes:
            cand = [a for a in apps if a not in out and c in elig[a] and a in self.weights[c]]
            if not cand:
                continue
            cr = self.credits[c]
            accrued = 0.0
            for a in cand:
                cr[a] = cr.get(a, 0.0) + self.weights[c][a]
                accrued += self.weights[c][a]
            taken: list[str] = []
            while len(taken) < slots[c]:
                left = {
                    d: (n if d < c else slots[c] - len(taken) - 1 if d == c else 0) for d, n in slots.items()
                }
                ok = [
                    a
                    for a in cand
                    if a not in taken
                    and assignable(
                        [x for x in apps if x not in out and x not in taken and x != a], elig, left
                    )
                ]
                if not ok:
                    break
                taken.append(max(ok, key=lambda x: cr[x]))  # first max: listed order breaks ties
            if len(taken) < slots[c]:  # no feasible completion: fill by credit alone
                taken += [a for a in sorted(cand, key=lambda x: -cr[x]) if a not in taken][
                    : slots[c] - len(taken)
                ]
            for a in taken:
                cr[a] -= accrued / len(taken)
                out[a] = c
        for a in apps:  # none eligible anywhere left (only without a feasible schedule): smallest CLOS
            out.setdefault(a, min(closes))
        return out

    def shares(self, apps: list[str], slices: int) -> dict[str, dict[int, float]]:
        """Long-run time share of each app in each LC CLOS, by running a copy of the scheduler for
        `slices` slices."""
        twin = Mqwrr(self.weights, {c: dict(v) for c, v in self.credits.items()})
        count = {a: dict.fromkeys(self.weights, 0) for a in apps}
        for _ in range(slices):
            for a, c in twin.next_slice(apps).items():
                count[a][c] += 1
        return {a: {c: n / slices for c, n in v.items()} for a, v in count.items()}


def round_robin(apps: list[str], n_closes: int, pointer: int) -> dict[str, int]:
    """Choice f: the working-set places, largest CLOS first (`working_set_sizes`), are filled by
    `apps` rotated by `pointer` places; the controller advances the pointer by one working set per
    slice, so every app moves to the next LC CLOS each slice with the same companions (the authors'
    prototype: every container's CLOS id + 1, cyclically) and over K slices visits every LC CLOS."""
    sizes = working_set_sizes(len(apps), n_closes)
    places = [c for c in sorted(sizes, reverse=True) for _ in range(sizes[c])]
    n = len(apps)
    return {apps[(pointer + j) % n]: c for j, c in enumerate(places)}


# ==================================================================================================
# the controller
# ==================================================================================================
class CocoController(BaseController):
    """CoCo (scheduler mq-wrr), round-robin (rr) or no partitioning (none); see the module docstring."""

    def __init__(
        self,
        config: CocoConfig,
        profiles: dict[str, SlowdownProfile] | None = None,
        profile_cost_s: float = 0.0,
        name: str = "coco",
    ) -> None:
        super().__init__()
        if config.needs_profile and profiles is None:
            raise ConfigError(f"{name}: the MQ-WRR scheduler needs a slowdown profile of every LC app")
        self.cfg = config
        self.name = name
        self.profiles = profiles or {}
        self.profile_cost_s = profile_cost_s

    # ---- episode state ------------------------------------------------------------------------
    def _reset(self) -> None:
        caps = self.caps
        assert caps is not None
        self._lc = [a.name for a in caps.lc_apps]
        missing = [a for a in self._lc if self.cfg.needs_profile and a not in self.profiles]
        if missing:
            raise ConfigError(f"{self.name}: no slowdown profile for {missing}")
        self._cores = lc_cores(caps, self.cfg)
        self._plan = clos_plan(caps, self.cfg)
        self._next_slice_s = -math.inf
        self._placement: dict[str, int] = {}
        self._admitted = list(self._lc)
        self._rejected: list[str] = []
        self._eligible: dict[str, set[int]] | None = None
        self._rr_pointer = 0
        self._wrr: Mqwrr | None = Mqwrr(self.weights(self._lc)) if self.cfg.needs_profile else None
        self._loads: dict[str, float] = {}
        self.migrations = 0
        self.slices = 0
        self._announced = False
        if self.cfg.scheduler == "none":
            self._fixed = nopart_allocation(caps, self._cores)

    def member_state(self, clos: int, n_apps: int) -> tuple[int, int]:
        """The state S_i = (l_i, m_i) of a workload in LC CLOS `clos` when `n_apps` workloads are
        scheduled (Eq. 1: "the LLC ways and MBA levels allocated to the workload"): the CLOS's MBA
        level (per core) and its ways split among the working set (`working_set_sizes`), at least
        the platform's minimum."""
        caps = self.caps
        assert caps is not None
        c = self._plan.state(clos)
        size = max(1, working_set_sizes(n_apps, len(self._plan.lc)).get(clos, 1))
        return max(caps.min_llc_ways, c.ways // size), c.mba_pct

    def slowdown(self, app: str, clos: int, n_apps: int = 1) -> float:
        """Eq. 1 for `app` in `clos`'s member state with `n_apps` workloads scheduled."""
        w, m = self.member_state(clos, n_apps)
        return self.profiles[app].slowdown(w, m, self.cfg.max_slowdown)

    def weights(self, apps: list[str]) -> dict[int, dict[str, float]]:
        """Eq. 2 per LC CLOS over `apps` (rule 3), at each CLOS's member state."""
        n = len(apps)
        return {
            c: eq2_weights({a: self.slowdown(a, c, n) for a in apps})
            for c in range(1, len(self._plan.lc) + 1)
        }

    def sl_rps(self, app: str, clos: int, n_apps: int = 1) -> float:
        """SL_S of `app` (rps) in `clos`'s member state with `n_apps` workloads scheduled: the load
        its profile sustains there (Eq. 1)."""
        p = self.profiles[app]
        return p.retention[self.member_state(clos, n_apps)] * p.sl_full_rps

    # ---- one tick -----------------------------------------------------------------------------
    def _decide(self, obs: Observation) -> Decision:
        return self._tick(obs)

    def _on_invalid(self, obs: Observation) -> Decision:
        """A failed latency feed does not stop the schedule (CoCo needs loads, not latencies)."""
        return self._tick(obs)

    def _observed_loads(self, obs: Observation) -> dict[str, float]:
        """Offered load per LC app (rps); an invalid or missing sample keeps the last known load."""
        for s in obs.apps:
            if s.valid and math.isfinite(s.load_rps):
                self._loads[s.name] = s.load_rps
        return dict(self._loads)

    def _tick(self, obs: Observation) -> Decision:
        caps = self.caps
        assert caps is not None
        loads = self._observed_loads(obs)
        if self.cfg.scheduler == "none":
            if obs.allocation == self._fixed:
                return Decision.hold("coco-nopart: no CAT/MBA partitioning, allocation unchanged")
            return Decision(
                self._fixed, reason="coco-nopart: CoCo's core pinning, one CLOS of all ways, 100% MBA"
            )
        t = obs.time_s
        if t < self._next_slice_s - 1e-6:
            return Decision.hold(f"{self.name}: inside a {self.cfg.slice_intervals}-interval slice")
        self._next_slice_s = t + self.cfg.slice_intervals * obs.interval_s
        notes: list[str] = []
        signals: dict[str, str] = {}
        if self.cfg.scheduler == "mq-wrr":
            if self.cfg.admission_control:
                notes += self._admission(loads)
                if self._rejected:
                    signals["admission_reject"] = ",".join(self._rejected)
            assert self._wrr is not None
            working = self._wrr.next_slice(self._admitted, self._eligible)
        else:
            k = len(self._plan.lc)
            working = round_robin(self._admitted, k, self._rr_pointer)
            step = max(1, len(self._admitted) // k)  # one working set per slice
            self._rr_pointer = (self._rr_pointer + step) % max(len(self._admitted), 1)
        placement = {a: working.get(a, RESERVED_CLOS) for a in self._lc}
        moved = [a for a in self._lc if a in self._placement and self._placement[a] != placement[a]]
        self.migrations += len(moved)
        self.slices += 1
        self._placement = placement
        alloc = build_allocation(caps, placement, self._plan, self._cores)
        ws = ", ".join(
            f"CLOS{c}({self._plan.state(c).ways}w/{self._plan.state(c).mba_pct}%): "
            + "+".join(a for a in self._lc if working.get(a) == c)
            for c in sorted(set(working.values()), reverse=True)
        )
        reason = f"{self.name} slice {self.slices} (Sec. 3.2 {'MQ-WRR' if self.cfg.scheduler == 'mq-wrr' else 'RR'}): {ws}"
        if moved:
            reason += f"; {len(moved)} CLOS migrations, caches flushed (Sec. 3.3)"
        if notes:
            reason += "; " + "; ".join(notes)
        if not self._announced:
            self._announced = True
            if self.cfg.needs_profile:
                reason += f"; slowdown profiling cost {self.profile_cost_s / 3600:.1f} simulated h (Sec. 3.1)"
        if alloc == obs.allocation:
            return Decision(None, reason=reason, signals=signals)
        return Decision(alloc, reason=reason, signals=signals)

    # ---- rule 6: admission control ------------------------------------------------------------
    def eligible(self, apps: list[str], loads: dict[str, float]) -> dict[str, set[int]]:
        """Rule 6: the LC CLOSes whose state sustains each app's offered load by its profile
        (load <= SL_S): a slice there does not violate its SLO (Sec. 3.2)."""
        k, n = len(self._plan.lc), len(apps)
        return {a: {c for c in range(1, k + 1) if loads.get(a, 0.0) <= self.sl_rps(a, c, n)} for a in apps}

    def _admission(self, loads: dict[str, float]) -> list[str]:
        """Rule 6: while the admitted workloads cannot all be placed in CLOSes that sustain their
        loads, reject the one whose load exceeds most what the largest CLOS sustains; re-admit those
        that fit again (the check starts from every workload each slice)."""
        before = set(self._rejected)
        admitted = list(self._lc)
        n = len(self._plan.lc)
        while admitted:
            elig = self.eligible(admitted, loads)
            if assignable(admitted, elig, working_set_sizes(len(admitted), n)):
                break

            def excess(a: str, m: int = len(admitted)) -> float:
                best = self.sl_rps(a, n, m)
                load = loads.get(a, 0.0)
                return math.inf if best <= 0 and load > 0 else (load / best if best > 0 else 0.0)

            admitted.remove(max(admitted, key=excess))
        self._eligible = self.eligible(admitted, loads)
        keep = [a for a in self._lc if a in admitted]
        if keep != self._admitted:
            old = self._wrr
            self._wrr = Mqwrr(self.weights(keep))
            if old is not None:  # the workloads that stay keep their credits
                for c, cr in self._wrr.credits.items():
                    for a in cr:
                        cr[a] = old.credits.get(c, {}).get(a, 0.0)
        self._admitted = keep
        self._rejected = [a for a in self._lc if a not in admitted]
        notes = []
        new = [a for a in self._rejected if a not in before]
        back = [a for a in before if a not in self._rejected]
        if new:
            notes.append(f"admission control rejects {','.join(new)}: no schedule meets its SLO (Sec. 3.2)")
        if back:
            notes.append(f"admission control re-admits {','.join(sorted(back))}")
        return notes


# ==================================================================================================
# the factory of the registry's CoCo specs
# ==================================================================================================
def build_coco(
    variant: str,
    caps: Capabilities,
    scenario: Scenario | None,
    path: str | Path | None = None,
) -> CocoController:
    """The controller of `variant` for a node with `caps`; CoCo itself profiles `scenario`'s apps."""
    cfg = load_coco_config(variant, path)
    if not cfg.needs_profile:
        return CocoController(cfg, name=variant)
    if scenario is None:
        raise ConfigError(f"{variant}: the slowdown profile is measured in the simulator; no scenario given")
    profiles, cost = profile_scenario(scenario, caps, cfg)
    return CocoController(cfg, profiles, cost, name=variant)
