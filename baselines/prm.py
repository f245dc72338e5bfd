"""Intel PRM's NaiveController and the Q-PRM controllers (Sandberg & Allport, NTNU 2021).

Source: ../shared/seeds/003_dcecb9c58c61a3e7.txt (the "Q-PRM" thesis), Sections 4.1 (Intel
Platform Resource Manager), 4.2 (QoS-aware PRM) and 5.5 (how the PRM was run). Constants are in
`configs/baselines/prm.yaml`. Six specs (five algorithms), built by `build_controller(spec)` or,
for the controller registry, by `make(spec, context)`:

* ``prm``        NaiveController with CPU quota and CAT (the PRM's default, "PRM w/ CAT", Table 6.1)
* ``prm-nocat``  NaiveController with CPU quota only ("PRM", run with --disable-cat, Table 6.1)
* ``qprm-step``  Q-PRM Step (Sec. 4.2.2)
* ``qprm-prop``  Q-PRM Proportional (Sec. 4.2.2)
* ``qprm-prop2`` Q-PRM Proportional v2 (Sec. 4.2.2)
* ``qprm-basic`` Q-PRM Basic (Sec. 4.2.2)

They manage one LC app beside BE jobs (Sec. 5.2) and only throttle the BE jobs, which share one
resource level (Sec. 4.1.1: "regulated together as a group").

Resource levels -> Allocation (Sec. 4.1.2; the mapping is this module's, documented here):

* Pool. At the first observation the controller takes the managed LC app's core group and CLOS,
  the BE jobs' and the idle pool as its pool; every other LC app keeps its allocation untouched.
  With several LC apps the managed one is the strictest (smallest QoS target), as PARTIES
  Sec. 5.2.2 does for Heracles; the thesis only ever runs one LC app.
* CPU, `cpu_mode: quota` (the shipped configuration): as in the thesis, the BE jobs run in the LC
  app's cpuset under a CFS quota (`AppAlloc.cpu_quota`): level 0 = 1% of a CPU (Sec. 7.1.1), levels
  1..19 = level/20 of the pool (Sec. 4.1.2, 5.2), the top level unlimited; quota the BE jobs leave
  unused stays with the LC app.
* CPU, `cpu_mode: cores` (for nodes without CFS quotas): the BE jobs share one core group of
  ``n * core_step`` cores and the LC app gets the rest of the pool. Level 0 is the PRM's minimum
  quota, 1% of a CPU (Sec. 7.1.1), rounded *up* to one core step: the BE job is never stopped,
  which is what the thesis observes at level 0 (Sec. 7.1.1). Levels 1..19 are ``level/20`` of the
  pool (the thesis sets the PRM's CPU count to the server node's 9 CPUs, Sec. 5.2, and the quota
  range has 20 levels, Sec. 4.1.2), rounded to the nearest core step; level 20 is "full", an unlimited quota: all of the pool but one core step,
  the least the LC app may hold. Proportional v2 maps low levels exponentially (`quota_exp_base`).
* LLC, with CAT (``prm`` only): BE ways = 2 + level (level 0 = 2 ways, Sec. 4.1.2), up to the pool
  minus ``llc_lc_min_ways`` (18 of 20 ways, Sec. 4.1.2); the LC app's CLOS holds the rest. The PRM
  lets the LC app use the whole cache (non-exclusive CAT); this codebase's CLOS partitions are
  exclusive, so this is the PRM's ``--exclusive-cat`` variant (Sec. 4.1.2 footnote).
* LLC, without CAT (``prm-nocat`` and the Q-PRM, Sec. 4.2 / Table 6.1): the BE jobs join the LC
  app's CLOS and both share all the pooled ways, as an unpartitioned cache would.

Frequency. The PRM and the Q-PRM do not manage frequency; the thesis' node ran the "performance"
governor (Table 5.1), so the managed pool is kept at the top frequency level.

Timing. Controllers are tick functions: every rule runs on samples built from the observations'
timestamps (`_Window`), never on wall time. The Q-PRM reads the p99 once per second (Sec. 4.2,
5.3); with 500 ms ticks one sample is the request-weighted mean of the p99s of its ticks. The
PRM's CPU cycle is 2 s and its LLC cycle 20 s (Sec. 5.5).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController
from env.types import Allocation, AppAlloc, Capabilities, Decision, Observation

if TYPE_CHECKING:
    from env.controller import ControllerContext
    from env.sim.scenario import Scenario

DEFAULT_CONFIG = CONFIGS / "baselines" / "prm.yaml"
_EPS = 1e-9


# ---- configuration ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LevelMap:
    """Resource levels (Sec. 4.1.2): CPU-quota levels 0..max_level and LLC levels for BE."""

    max_level: int = 20  # levels 0..20; the top one is "full" (unlimited quota)
    min_quota_cores: float = 0.01  # level 0: 1% of one CPU (Sec. 7.1.1)
    # "quota": the BE jobs share the LC app's cores under a CFS quota (the thesis' mechanism; unused
    # quota stays with the LC app); "cores": the BE jobs get exclusive cores in core steps instead
    cpu_mode: Literal["quota", "cores"] = "cores"
    llc_min_ways: int = 2  # LLC level 0 (Sec. 4.1.2)
    llc_lc_min_ways: int = 2  # never given to BE: max LLC level = 18 of 20 ways (Sec. 4.1.2)

    def __post_init__(self) -> None:
        if self.max_level < 1:
            raise ConfigError(f"levels.max_level = {self.max_level}: must be >= 1")
        if not self.min_quota_cores > 0:
            raise ConfigError(f"levels.min_quota_cores = {self.min_quota_cores}: must be > 0")
        if self.llc_min_ways < 1 or self.llc_lc_min_ways < 1:
            raise ConfigError("levels.llc_min_ways and levels.llc_lc_min_ways must be >= 1")


@dataclass(frozen=True)
class LlcBin:
    """LC-alone fences for one band of LC CPU utilisation (the PRM Analyzer's utilisation bins).

    The PRM flags LLC contention when the LC app's CPI and its L3 misses per kilo-instruction both
    exceed the profiled fence of the current utilisation bin (Sec. 4.1.3). Observations carry no
    CPI or MPKI, so the same test uses their per-request analogues: CPU time per request (CPI grows
    when cache misses stall the core) and memory traffic per request (LLC misses per unit work).
    """

    util_start_cores: float
    util_end_cores: float
    cpu_us_per_req: float
    mem_kb_per_req: float


@dataclass(frozen=True)
class PrmProfile:
    """What the PRM learns in its profiling run with the LC app alone (Sec. 4.1.1, 5.5).

    `lc_max_util_cores` is the CPU threshold: the LC app's maximal utilisation (cores). None means
    no profile: like the PRM without a model file, the threshold starts at all pooled cores; in
    either case it is raised at run time whenever the LC app uses more (Sec. 4.1.2). Without
    `llc_bins` LLC contention is never detected (the PRM detects nothing without thresholds).
    """

    lc_max_util_cores: float | None = None
    llc_bins: tuple[LlcBin, ...] = ()

    def bin_for(self, util_cores: float) -> LlcBin | None:
        """The fence for `util_cores`: the bin holding it, else the nearest bin below it (a gap or
        above the last bin, as the PRM does), none below the first bin."""
        bins = sorted(self.llc_bins, key=lambda b: b.util_start_cores)
        if not bins or util_cores < bins[0].util_start_cores:
            return None
        for b in bins:
            if b.util_start_cores <= util_cores < b.util_end_cores:
                return b
        below = [b for b in bins if b.util_start_cores <= util_cores]
        return below[-1]


@dataclass(frozen=True)
class NaiveConfig:
    """Intel PRM NaiveController (Sec. 4.1.1, 4.1.3, 5.5)."""

    cat: bool = True  # regulate LLC ways (False = --disable-cat: BE shares the LC app's ways)
    cpu_cycle_s: float = 2.0
    cpu_quiet_cycles: int = 7
    cpu_margin_cores: float = 0.5
    hold: bool = True
    llc_cycle_s: float = 20.0
    llc_quiet_cycles: int = 6
    profile: PrmProfile = field(default_factory=PrmProfile)
    profile_run_s: float | None = 1800.0  # simulated profiling run when `profile` is empty (Sec. 5.5)

    def __post_init__(self) -> None:
        _positive(cpu_cycle_s=self.cpu_cycle_s, llc_cycle_s=self.llc_cycle_s)
        _positive(cpu_quiet_cycles=self.cpu_quiet_cycles, llc_quiet_cycles=self.llc_quiet_cycles)
        if self.profile_run_s is not None:
            _positive(profile_run_s=self.profile_run_s)


@dataclass(frozen=True)
class StepConfig:
    """Q-PRM Step (Sec. 4.2.2)."""

    sample_s: float = 1.0
    up_after_samples: int = 3

    def __post_init__(self) -> None:
        _positive(sample_s=self.sample_s, up_after_samples=self.up_after_samples)


@dataclass(frozen=True)
class PropConfig:
    """Q-PRM Proportional and Proportional v2 (Sec. 4.2.2)."""

    sample_s: float = 1.0
    gain_levels: float = 8.0
    up_after_samples: int = 3
    quota_exp_base: float | None = None  # None: linear map (Proportional); > 1: v2

    def __post_init__(self) -> None:
        _positive(
            sample_s=self.sample_s, gain_levels=self.gain_levels, up_after_samples=self.up_after_samples
        )
        if self.quota_exp_base is not None and not self.quota_exp_base > 1:
            raise ConfigError(f"quota_exp_base = {self.quota_exp_base}: must be > 1 (or null)")


@dataclass(frozen=True)
class BasicConfig:
    """Q-PRM Basic (Sec. 4.2.2)."""

    sample_s: float = 1.0
    buffer_len: int = 10
    slack_target: float = 0.2
    violation_samples: int = 3
    violation_slack: float = 0.05
    recovery_slack: float = 0.3
    step_gain_levels: float = 8.0

    def __post_init__(self) -> None:
        _positive(sample_s=self.sample_s, buffer_len=self.buffer_len, step_gain_levels=self.step_gain_levels)
        if not 1 <= self.violation_samples <= self.buffer_len:
            raise ConfigError(f"violation_samples = {self.violation_samples}: must be in 1..buffer_len")


@dataclass(frozen=True)
class PrmConfigs:
    """The whole of `configs/baselines/prm.yaml`."""

    levels: LevelMap
    prm: NaiveConfig
    prm_nocat: NaiveConfig
    qprm_step: StepConfig
    qprm_prop: PropConfig
    qprm_prop2: PropConfig
    qprm_basic: BasicConfig


def _positive(**values: float) -> None:
    for k, v in values.items():
        if not v > 0:
            raise ConfigError(f"{k} = {v}: must be > 0")


def load_configs(path: str | Path | None = None) -> PrmConfigs:
    """Load and check `configs/baselines/prm.yaml` (or `path`); raises ConfigError."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    return build(PrmConfigs, load_yaml(p), p.name)


SPECS = ("prm", "prm-nocat", "qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic")


def build_controller(
    spec: str, path: str | Path | None = None, *, profile: PrmProfile | None = None
) -> BaseController:
    """The controller for a spec string (see the module docstring), configured from YAML.

    `profile` replaces the YAML profile of the NaiveController specs (see `profile_lc`).
    """
    cfgs = load_configs(path)
    lv = cfgs.levels
    if spec in ("prm", "prm-nocat"):
        cfg = cfgs.prm if spec == "prm" else cfgs.prm_nocat
        if profile is not None:
            cfg = replace(cfg, profile=profile)
        return NaiveController(cfg, lv, name=spec)
    if spec == "qprm-step":
        return StepController(cfgs.qprm_step, lv, name=spec)
    if spec == "qprm-prop":
        return ProportionalController(cfgs.qprm_prop, lv, name=spec)
    if spec == "qprm-prop2":
        return ProportionalController(cfgs.qprm_prop2, lv, name=spec)
    if spec == "qprm-basic":
        return BasicController(cfgs.qprm_basic, lv, name=spec)
    raise ConfigError(f"unknown PRM controller {spec!r}; known: {list(SPECS)}")


# The factory of the registry's PRM and Q-PRM specs.
def make(spec: str, context: ControllerContext) -> BaseController:
    """The controller of `spec` (`prm`, `prm-nocat`, `qprm-step`, `qprm-prop`, `qprm-prop2`,
    `qprm-basic`) for a run. The PRM is deployed after a profiling run of the LC app alone (Sec.
    4.1.1, 5.5). In simulation, when the YAML holds no profile, that run is made here on a fresh
    SimNode of the same scenario without BE jobs, for `profile_run_s` (30 min in Sec. 5.5); on a real
    node the YAML profile is used. The Q-PRM controllers need no profile."""
    if spec not in ("prm", "prm-nocat"):
        return build_controller(spec)
    cfgs = load_configs()
    cfg = cfgs.prm if spec == "prm" else cfgs.prm_nocat
    unprofiled = cfg.profile.lc_max_util_cores is None and not cfg.profile.llc_bins
    if context.scenario is None or cfg.profile_run_s is None or not unprofiled:
        return build_controller(spec)
    lc = strictest_lc(context.capabilities)
    prof = profile_in_sim(context.scenario, lc, cfg.profile_run_s, seed=context.seed, cfg=cfg)
    return build_controller(spec, profile=prof)


def strictest_lc(caps: Capabilities) -> str:
    """The LC app these controllers manage: the smallest QoS target (PARTIES Sec. 5.2.2), the first
    listed on a tie."""
    lcs = caps.lc_apps
    if not lcs:
        raise ValueError("the node runs no LC app to protect")
    return min(lcs, key=lambda a: a.qos_target_us if math.isfinite(a.qos_target_us) else math.inf).name


# ---- sampling ----------------------------------------------------------------------------------------
class _Window:
    """Groups tick observations into periods of `period_s` on the observations' own clock.

    An observation covers (time_s - interval_s, time_s]. A period closes at the first tick whose end
    reaches the period's end; the period grid stays anchored at the first tick's start, so 0.5 s
    ticks make exact 1 s, 2 s or 20 s periods. Ticks longer than the period close one period each.
    """

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.start: float | None = None
        self.ticks: list[Observation] = []

    def add(self, obs: Observation) -> list[Observation] | None:
        if self.start is None:
            self.start = obs.time_s - obs.interval_s
        self.ticks.append(obs)
        elapsed = obs.time_s - self.start
        if elapsed < self.period_s - _EPS:
            return None
        self.start += self.period_s * math.floor(elapsed / self.period_s + _EPS)
        out, self.ticks = self.ticks, []
        return out


def _p99_us(ticks: Sequence[Observation], app: str) -> float:
    """One p99 for several ticks: the request-weighted mean of their p99s (the p99 of the merged
    requests lies between the ticks' p99s); the plain mean when no request was seen."""
    samples = [o.app(app) for o in ticks]
    reqs = sum(s.requests for s in samples)
    if reqs > 0:
        return sum(s.p99_us * s.requests for s in samples) / reqs
    return sum(s.p99_us for s in samples) / len(samples)


def _slack(ticks: Sequence[Observation], app: str) -> float:
    """QoS slack of one sample, (target - QoS) / target (Sec. 4.2.2)."""
    target = ticks[-1].app(app).target_us
    return (target - _p99_us(ticks, app)) / target


def _busy_cores(obs: Observation, lc: str, bes: Sequence[str]) -> tuple[float, float]:
    """(LC, BE) CPU utilisation in cores over one tick (what the PRM reads from cgroups, Sec. 4.1.3)."""
    lc_busy = obs.app(lc).usage.cpu_util * obs.allocation[lc].cores
    be_busy = 0.0
    groups: dict[int, float] = {}
    for b in obs.be:
        if b.name in bes:
            a = obs.allocation[b.name]
            groups[a.core_group] = groups.get(a.core_group, 0.0) + b.usage.cpu_util * a.cores
    for g, busy in groups.items():
        be_busy += min(busy, obs.allocation.groups()[g])
    return lc_busy, be_busy


def _cycle_metrics(ticks: Sequence[Observation], lc: str) -> tuple[float, float, float]:
    """LC utilisation (cores), CPU us per request and memory KB per request over one LLC cycle."""
    dt = sum(o.interval_s for o in ticks)
    busy_s = sum(o.app(lc).usage.cpu_util * o.allocation[lc].cores * o.interval_s for o in ticks)
    reqs = sum(o.app(lc).served_rps * o.interval_s for o in ticks)
    mem_gb = sum(o.app(lc).usage.mem_bw_gbps * o.interval_s for o in ticks)
    if reqs <= 0:
        return busy_s / dt, 0.0, 0.0
    return busy_s / dt, busy_s * 1e6 / reqs, mem_gb * 1e6 / reqs


class LayoutError(ValueError):
    """The current allocation cannot be turned into a PRM pool (the controller holds and retries)."""


# ---- the level -> allocation map ----------------------------------------------------------------------
class LevelLayout:
    """Maps (CPU level, LLC level) to an Allocation over the controller's pool (module docstring)."""

    def __init__(
        self,
        caps: Capabilities,
        current: Allocation,
        lc: str,
        bes: Sequence[str],
        levels: LevelMap,
        *,
        cat: bool,
        quota_exp_base: float | None = None,
    ) -> None:
        self.caps, self.lc, self.bes, self.levels, self.cat = caps, lc, tuple(bes), levels, cat
        self.quota_exp_base = quota_exp_base
        others = [a for a in current if a.name != lc and a.name not in self.bes]
        me = current[lc]
        other_groups = {a.core_group for a in others}
        other_clos = {a.clos for a in others}
        if me.core_group in other_groups or me.clos in other_clos:
            raise LayoutError(
                f"{lc!r} shares its core group or CLOS with another LC app; the PRM controllers need it "
                "partitioned from the other LC apps (start from env.allocations.fair_allocation)"
            )
        groups, closes = current.groups(), current.closes()
        step = caps.core_step
        self.step = step
        self.pool_units = round((caps.cores - sum(groups[g] for g in other_groups)) / step)
        self.pool_ways = caps.llc_ways - sum(closes[c][0] for c in other_clos)
        self.level0_units = max(1, math.ceil(levels.min_quota_cores / step - 1e-6))
        if self.pool_units < self.level0_units + 1:
            raise LayoutError(f"{lc!r} and the BE jobs hold {self.pool_units * step} cores: too few to share")
        self.lc_group, self.lc_clos = me.core_group, me.clos
        be0 = current[self.bes[0]]
        used_groups = other_groups | {me.core_group}
        be_groups = {current[b].core_group for b in self.bes}
        if len(be_groups) == 1 and be0.core_group not in used_groups:
            self.be_group = be0.core_group
        else:
            self.be_group = min(set(range(len(current) + 1)) - used_groups)
        self.be_freq = be0.freq_mhz
        self.be_mba = be0.mba_pct
        used_clos = other_clos | {me.clos}
        if not cat:
            self.be_clos = me.clos
        elif len({current[b].clos for b in self.bes}) == 1 and be0.clos not in used_clos:
            self.be_clos = be0.clos
        else:
            free = set(range(max(caps.clos_count, 1))) - used_clos
            if not free:
                raise LayoutError(f"no free CLOS for the BE jobs on {caps.clos_count} CLOSes")
            self.be_clos = min(free)
        lc_min_ways = max(levels.llc_lc_min_ways, caps.min_llc_ways)
        self.llc_be_min = min(levels.llc_min_ways, self.pool_ways - lc_min_ways)
        if cat and self.llc_be_min < caps.min_llc_ways:
            raise LayoutError(f"{lc!r} and the BE jobs hold {self.pool_ways} LLC ways: too few to partition")
        self.llc_max_level = max(0, self.pool_ways - lc_min_ways - self.llc_be_min)

    @property
    def pool_cores(self) -> float:
        return self.pool_units * self.step

    @property
    def quota(self) -> bool:
        return self.levels.cpu_mode == "quota"

    def be_quota_cores(self, level: int) -> float:
        """Quota mode: the BE jobs' CFS quota at a CPU level, in cores (Sec. 4.1.2, 7.1.1): level 0
        is 1% of a CPU, levels 1..19 are level/20 of the pool, the top level is the whole pool
        (unlimited)."""
        lv = self.levels
        if level <= 0:
            return lv.min_quota_cores
        if level >= lv.max_level:
            return self.pool_cores
        quota = level / lv.max_level * self.pool_cores
        if self.quota_exp_base is not None:  # Proportional v2: exponential at low levels (Sec. 4.2.2)
            quota = min(quota, lv.min_quota_cores * self.quota_exp_base**level)
        return max(quota, lv.min_quota_cores)

    def be_units(self, level: int) -> int:
        """Cores mode: BE cores at a CPU level, in core steps (Sec. 4.1.2; module docstring)."""
        lv = self.levels
        top = self.pool_units - 1  # "full": the LC app keeps one core step
        if level <= 0:
            return self.level0_units
        if level >= lv.max_level:
            return top
        quota = level / lv.max_level * self.pool_cores
        if self.quota_exp_base is not None:  # Proportional v2: exponential at low levels (Sec. 4.2.2)
            quota = min(quota, lv.min_quota_cores * self.quota_exp_base**level)
        return min(max(round(quota / self.step), self.level0_units), top)

    def be_cores(self, level: int) -> float:
        """CPU the BE jobs may use at a level, in cores (quota or exclusive cores)."""
        return self.be_quota_cores(level) if self.quota else self.be_units(level) * self.step

    def be_ways(self, llc_level: int) -> int:
        return self.llc_be_min + min(max(llc_level, 0), self.llc_max_level)

    def allocation(self, current: Allocation, cpu_level: int, llc_level: int) -> Allocation:
        """`current` with the LC app and the BE jobs set to the levels; other apps unchanged."""
        turbo = self.caps.freq_levels_mhz[-1]  # the thesis' "performance" governor (Table 5.1)
        if self.quota:  # BE jobs in the LC app's cpuset under a CFS quota (0 = unlimited at the top)
            lc_cores = be_cores = self.pool_cores
            be_group, be_freq = self.lc_group, turbo
            q = self.be_quota_cores(cpu_level)
            be_quota = 0.0 if cpu_level >= self.levels.max_level else q
        else:
            be_units = self.be_units(cpu_level)
            lc_cores = (self.pool_units - be_units) * self.step
            be_cores = be_units * self.step
            be_group, be_freq, be_quota = self.be_group, self.be_freq, 0.0
        if self.cat:
            be_ways = self.be_ways(llc_level)
            lc_ways, be_mba = self.pool_ways - be_ways, self.be_mba
        else:
            be_ways = lc_ways = self.pool_ways
            be_mba = current[self.lc].mba_pct
        apps: list[AppAlloc] = []
        for a in current:
            if a.name == self.lc:
                a = replace(a, cores=lc_cores, llc_ways=lc_ways, cpu_quota=0.0, freq_mhz=turbo)
            elif a.name in self.bes:
                a = replace(
                    a,
                    cores=be_cores,
                    core_group=be_group,
                    freq_mhz=be_freq,
                    llc_ways=be_ways,
                    clos=self.be_clos,
                    mba_pct=be_mba,
                    cpu_quota=be_quota,
                )
            apps.append(a)
        return Allocation.of(apps, self.caps)


# ---- shared controller plumbing ------------------------------------------------------------------------
class _LevelController(BaseController):
    """Holds the managed LC app, the BE jobs, the current levels and the level -> allocation map.

    Subclasses advance their state machine in `_rules(observation)` and return a reason when a
    level changed. The first decision applies the initial levels (level 0: "In its initial state,
    the Intel PRM strips best-effort jobs of all resources", Sec. 4.1.3; the Q-PRM keeps it).
    """

    cat = False
    quota_exp_base: float | None = None

    def __init__(self, levels: LevelMap, name: str) -> None:
        super().__init__()
        self.levels = levels
        self.name = name
        self.lc = ""
        self.bes: tuple[str, ...] = ()
        self.layout: LevelLayout | None = None
        self.cpu_level = 0
        self.llc_level = 0

    def _reset(self) -> None:
        assert self.caps is not None
        self.lc = strictest_lc(self.caps)
        self.bes = tuple(a.name for a in self.caps.be_apps)
        self.layout = None
        self.cpu_level = 0
        self.llc_level = 0
        self._reset_rules()

    def _reset_rules(self) -> None:
        """Clear the subclass's state machine."""

    @abstractmethod
    def _rules(self, obs: Observation) -> str:
        """Advance the state machine by one tick; return why a level changed ("" if none did)."""

    def _decide(self, obs: Observation) -> Decision:
        assert self.caps is not None
        if not self.bes:
            return Decision.hold("no BE job to throttle")
        first = self.layout is None
        if self.layout is None:
            try:
                self.layout = LevelLayout(
                    self.caps,
                    obs.allocation,
                    self.lc,
                    self.bes,
                    self.levels,
                    cat=self.cat,
                    quota_exp_base=self.quota_exp_base,
                )
            except LayoutError as e:  # degrade safely: keep the allocation, retry next tick
                return Decision.hold(f"{self.name}: {e}")
        reason = self._rules(obs)
        target = self.layout.allocation(obs.allocation, self.cpu_level, self.llc_level)
        if target == obs.allocation:
            return Decision.hold(reason or "hold")
        if not reason:
            reason = "initial levels" if first else "re-apply the levels"
        return Decision(allocation=target, reason=f"{reason}; {self._levels_text()}")

    def _levels_text(self) -> str:
        text = f"BE CPU level {self.cpu_level}"
        if self.cat:
            text += f", LLC level {self.llc_level}"
        return text

    def _set_cpu(self, level: int) -> int:
        self.cpu_level = min(max(level, 0), self.levels.max_level)
        return self.cpu_level


# ---- Intel PRM ----------------------------------------------------------------------------------------
class NaiveController(_LevelController):
    """Intel PRM's NaiveController (Sec. 4.1.1, 4.1.3; run as in Sec. 5.5).

    CPU, every `cpu_cycle_s` (2 s): contention when the LC and BE utilisation plus a margin of half
    a CPU exceeds the CPU threshold, the LC app's recorded maximal utilisation (Sec. 4.1.3: "checks
    if the current CPU utilization, latency-critical and best-effort, is higher than the recorded CPU
    utilization for the LC job"). Contention -> level 0 (Sec. 4.1.1). With --enable-hold (Sec. 5.5),
    a quiet cycle in which one more level would reach the threshold holds the level and does not
    count (Sec. 4.1.3). Otherwise +1 level after `cpu_quiet_cycles` quiet cycles: 7 x 2 s = 14 s
    (Sec. 4.1.1). The threshold is raised whenever the LC app uses more (Sec. 4.1.2, "recorded
    during run-time").

    LLC (with CAT), every `llc_cycle_s` (20 s): contention when the LC app's per-request CPU time and
    memory traffic both exceed its profile's fences for the current utilisation (Sec. 4.1.3; see
    `LlcBin`). Contention -> level 0; +1 level after 6 quiet cycles = 2 min (Sec. 4.1.1, 7.2.1).
    """

    def __init__(self, config: NaiveConfig, levels: LevelMap, name: str = "prm") -> None:
        super().__init__(levels, name)
        self.config = config
        self.cat = config.cat

    def _reset_rules(self) -> None:
        cfg = self.config
        self._cpu_window = _Window(cfg.cpu_cycle_s)
        self._llc_window = _Window(cfg.llc_cycle_s)
        self.cpu_quiet = 0
        self.llc_quiet = 0
        self.cpu_threshold_cores = math.nan  # set from the pool at the first observation
        self.cpu_contention = False
        self.llc_contention = False
        self.cpu_hold = False

    def _rules(self, obs: Observation) -> str:
        assert self.layout is not None
        if math.isnan(self.cpu_threshold_cores):
            prof = self.config.profile.lc_max_util_cores
            self.cpu_threshold_cores = self.layout.pool_cores if prof is None else prof
        reasons = []
        ticks = self._cpu_window.add(obs)
        if ticks is not None:
            reasons.append(self._cpu_cycle(ticks))
        if self.cat:
            ticks = self._llc_window.add(obs)
            if ticks is not None:
                reasons.append(self._llc_cycle(ticks))
        return "; ".join(r for r in reasons if r)

    def _cpu_cycle(self, ticks: Sequence[Observation]) -> str:
        assert self.layout is not None
        cfg = self.config
        dt = sum(o.interval_s for o in ticks)
        lc_busy = be_busy = 0.0
        for o in ticks:
            lc_b, be_b = _busy_cores(o, self.lc, self.bes)
            lc_busy += lc_b * o.interval_s / dt
            be_busy += be_b * o.interval_s / dt
        # Sec. 4.1.2: the maximal LC utilisation is "recorded during run-time of the PRM".
        self.cpu_threshold_cores = max(self.cpu_threshold_cores, lc_busy)
        load = lc_busy + be_busy + cfg.cpu_margin_cores
        self.cpu_contention = load > self.cpu_threshold_cores
        self.cpu_hold = False
        if self.cpu_contention:  # Sec. 4.1.1: "the CPU quota level is set to zero"
            self.cpu_quiet = 0
            before = self.cpu_level
            self._set_cpu(0)
            return f"CPU contention ({load:.2f} > {self.cpu_threshold_cores:.2f} cores): level {before} -> 0"
        if self.cpu_level >= self.levels.max_level:
            return ""
        grow = self.layout.be_cores(self.cpu_level + 1) - self.layout.be_cores(self.cpu_level)
        if cfg.hold and load + grow >= self.cpu_threshold_cores:  # Sec. 4.1.3, --enable-hold
            self.cpu_hold = True
            return ""
        self.cpu_quiet += 1
        if self.cpu_quiet >= cfg.cpu_quiet_cycles:  # Sec. 4.1.1: +1 after 14 s without contention
            self.cpu_quiet = 0
            self._set_cpu(self.cpu_level + 1)
            return f"no CPU contention for {cfg.cpu_quiet_cycles} cycles: CPU level +1"
        return ""

    def _llc_cycle(self, ticks: Sequence[Observation]) -> str:
        assert self.layout is not None
        cfg = self.config
        util, cpu_us, mem_kb = _cycle_metrics(ticks, self.lc)
        fence = cfg.profile.bin_for(util)
        self.llc_contention = (
            fence is not None and cpu_us > fence.cpu_us_per_req and mem_kb > fence.mem_kb_per_req
        )
        if self.llc_contention:  # Sec. 4.1.1: "the LLC level is set to zero"
            self.llc_quiet = 0
            before, self.llc_level = self.llc_level, 0
            return f"LLC contention: LLC level {before} -> 0"
        if self.llc_level >= self.layout.llc_max_level:
            return ""
        self.llc_quiet += 1
        if self.llc_quiet >= cfg.llc_quiet_cycles:  # Sec. 4.1.1 / 7.2.1: +1 every 2 min
            self.llc_quiet = 0
            self.llc_level += 1
            return f"no LLC contention for {cfg.llc_quiet_cycles} cycles: LLC level +1"
        return ""


def profile_lc(
    observations: Iterable[Observation],
    app: str,
    *,
    cpu_cycle_s: float = 2.0,
    llc_cycle_s: float = 20.0,
    bin_cores: float = 0.5,
    span: float = 4.0,
) -> PrmProfile:
    """The PRM's profile from a run of the LC app alone (Sec. 4.1.1 step 1-2, Sec. 5.5).

    The CPU threshold is the maximal LC utilisation over the CPU cycles. LLC fences come per LC
    utilisation bin of half a CPU (the PRM Analyzer's bin width) as mean + `span` standard
    deviations (the Analyzer's default span is 4; it fits a Gaussian mixture where this fits one
    Gaussian) of the per-request CPU time and memory traffic over the LLC cycles. A pure function
    of the observations: the caller runs the profiling episode.
    """
    cpu_w, llc_w = _Window(cpu_cycle_s), _Window(llc_cycle_s)
    max_util = 0.0
    cycles: list[tuple[float, float, float]] = []
    for o in observations:
        if not o.valid or not o.app(app).valid:
            continue
        ticks = cpu_w.add(o)
        if ticks is not None:
            dt = sum(t.interval_s for t in ticks)
            busy = sum(t.app(app).usage.cpu_util * t.allocation[app].cores * t.interval_s for t in ticks)
            max_util = max(max_util, busy / dt)
        ticks = llc_w.add(o)
        if ticks is not None:
            m = _cycle_metrics(ticks, app)
            if m[1] > 0:
                cycles.append(m)
    by_bin: dict[int, list[tuple[float, float, float]]] = {}
    for m in cycles:
        by_bin.setdefault(math.floor(m[0] / bin_cores), []).append(m)
    bins = []
    for k in sorted(by_bin):
        ms = by_bin[k]
        bins.append(
            LlcBin(
                util_start_cores=k * bin_cores,
                util_end_cores=(k + 1) * bin_cores,
                cpu_us_per_req=_fence([m[1] for m in ms], span),
                mem_kb_per_req=_fence([m[2] for m in ms], span),
            )
        )
    return PrmProfile(lc_max_util_cores=max_util if max_util > 0 else None, llc_bins=tuple(bins))


def _fence(xs: Sequence[float], span: float) -> float:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return mean + span * std


def profile_in_sim(
    scenario: Scenario, app: str, duration_s: float, *, seed: int = 0, cfg: NaiveConfig | None = None
) -> PrmProfile:
    """The PRM's profiling run in simulation (Sec. 4.1.1, 5.5): the scenario's LC apps alone (no BE
    job) under their own load traces for `duration_s`, each holding its fair share (one LC app: the
    whole node), then `profile_lc` over the observations. Runs on a fresh SimNode."""
    from env.sim.node import SimNode  # the simulator is only needed here

    cfg = cfg or NaiveConfig()
    alone = replace(scenario, be=(), antagonists=(), duration_s=duration_s, warmup_s=0.0)
    node = SimNode(alone, seed=seed)
    steps = max(1, round(duration_s / node.capabilities().interval_s))
    observations = [node.step() for _ in range(steps)]
    return profile_lc(observations, app, cpu_cycle_s=cfg.cpu_cycle_s, llc_cycle_s=cfg.llc_cycle_s)


# ---- Q-PRM --------------------------------------------------------------------------------------------
class _QosController(_LevelController):
    """Q-PRM plumbing: one QoS slack sample per `sample_s` (Sec. 4.2: read once per second)."""

    sample_s = 1.0

    def _reset_rules(self) -> None:
        self._window = _Window(self.sample_s)
        self.last_slack = math.nan
        self._reset_qos()

    def _reset_qos(self) -> None:
        """Clear the controller's state machine."""

    def _rules(self, obs: Observation) -> str:
        ticks = self._window.add(obs)
        if ticks is None:
            return ""
        self.last_slack = _slack(ticks, self.lc)
        return self._on_slack(self.last_slack)

    @abstractmethod
    def _on_slack(self, slack: float) -> str:
        """Advance the state machine by one QoS sample; return why the level changed ("" if not)."""


class StepController(_QosController):
    """Q-PRM Step (Sec. 4.2.2): on a QoS violation (negative slack) the CPU quota drops one level
    (not to level 0 as the NaiveController does); for every 3 s without a violation it rises one
    level."""

    def __init__(self, config: StepConfig, levels: LevelMap, name: str = "qprm-step") -> None:
        super().__init__(levels, name)
        self.config = config
        self.sample_s = config.sample_s

    def _reset_qos(self) -> None:
        self.quiet = 0

    def _on_slack(self, slack: float) -> str:
        if slack < 0:  # violation: "merely reduces the level by one step"
            self.quiet = 0
            before = self.cpu_level
            if self._set_cpu(before - 1) != before:
                return f"QoS violation (slack {slack:.3f}): level -1"
            return ""
        self.quiet += 1
        if self.quiet >= self.config.up_after_samples:  # "For every 3 seconds ... increased by one"
            self.quiet = 0
            before = self.cpu_level
            if self._set_cpu(before + 1) != before:
                return f"{self.config.up_after_samples} samples without violation: level +1"
        return ""


class ProportionalController(_QosController):
    """Q-PRM Proportional and Proportional v2 (Sec. 4.2.2).

    The change in CPU-quota level is proportional to the slack: floor(gain * slack) levels, so a
    large slack or a large violation moves the quota more (Sec. 4.2.2). The thesis gives no gain;
    8 levels per unit of slack, decreases applied at once and increases after 3 samples in a row
    that call for one (as Step) are from the authors' code. Proportional v2 is the same rule over an
    exponential level -> quota map at low levels, for finer steps near the minimum (Sec. 4.2.2,
    7.2.2): min_quota * base^level until it meets the linear map.
    """

    def __init__(self, config: PropConfig, levels: LevelMap, name: str = "qprm-prop") -> None:
        super().__init__(levels, name)
        self.config = config
        self.sample_s = config.sample_s
        self.quota_exp_base = config.quota_exp_base

    def _reset_qos(self) -> None:
        self.up_count = 0

    def _on_slack(self, slack: float) -> str:
        delta = math.floor(self.config.gain_levels * slack)
        before = self.cpu_level
        if delta < 0:
            self.up_count = 0
            self._set_cpu(before + delta)
        elif delta > 0:
            self.up_count += 1
            if self.up_count >= self.config.up_after_samples:
                self.up_count = 0
                self._set_cpu(before + delta)
        if self.cpu_level != before:
            return f"slack {slack:.3f}: level {before} -> {self.cpu_level}"
        return ""


class BasicController(_QosController):
    """Q-PRM Basic (Sec. 4.2.2).

    A ring buffer holds the 10 latest slacks. Without a violation, every 10 samples (10 s) the
    controller averages the buffer, computes loss = |average - 0.2| and reverses the direction of
    regulation when the loss grew since the last decision; it then moves one step in that
    direction. The step grows with the slack: max(1, floor(8 * |average|)) levels, single steps
    under 25% slack (the thesis: "if there is less than 25% slack, only single steps are used"; the
    gain 8 is the Proportional controllers' one, "similar to the Proportional controllers").

    A violation is a 3-sample (3 s) average slack under 5%, checked every sample: the level drops
    to 0 and the controller recovers; every 10 samples of recovery it checks the 10-s average,
    and once it is at least 30% it restores half the level at which the violation happened.

    Choices where the thesis is silent: the first decision goes up (the BE job starts at level 0);
    a violation forgets the last loss (it measured a different regime), keeps the direction and
    restarts the 10-s count, so recovery is judged on 10 post-violation samples.
    """

    def __init__(self, config: BasicConfig, levels: LevelMap, name: str = "qprm-basic") -> None:
        super().__init__(levels, name)
        self.config = config
        self.sample_s = config.sample_s

    def _reset_qos(self) -> None:
        self.buffer: deque[float] = deque(maxlen=self.config.buffer_len)
        self.count = 0
        self.recovery = False
        self.restore_level = 0
        self.prev_loss: float | None = None
        self.direction = 1

    def _on_slack(self, slack: float) -> str:
        cfg = self.config
        self.buffer.append(slack)
        if self.recovery:
            self.count += 1
            if self.count < cfg.buffer_len:
                return ""
            self.count = 0
            avg = sum(self.buffer) / len(self.buffer)
            if avg < cfg.recovery_slack:
                return ""
            self.recovery = False
            self._set_cpu(self.restore_level)
            return f"recovered (10-s slack {avg:.3f}): restore level {self.restore_level}"
        recent = list(self.buffer)[-cfg.violation_samples :]
        avg3 = sum(recent) / len(recent)
        if avg3 < cfg.violation_slack:
            before = self.cpu_level
            self.restore_level = before // 2
            self._set_cpu(0)
            self.recovery = True
            self.count = 0
            self.prev_loss = None
            return f"violation (3-s slack {avg3:.3f}): level {before} -> 0, recovery"
        self.count += 1
        if self.count < cfg.buffer_len:
            return ""
        self.count = 0
        avg = sum(self.buffer) / len(self.buffer)
        loss = abs(avg - cfg.slack_target)
        if self.prev_loss is not None and loss > self.prev_loss:
            self.direction = -self.direction
        self.prev_loss = loss
        step = max(1, math.floor(cfg.step_gain_levels * abs(avg)))
        before = self.cpu_level
        self._set_cpu(before + self.direction * step)
        return f"10-s slack {avg:.3f}, loss {loss:.3f}: level {before} -> {self.cpu_level}"
