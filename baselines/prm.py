"""Intel PRM's NaiveController and the Q-PRM controllers (Sandberg & Allport, NTNU 2021).

Sources: ../shared/seeds/003_dcecb9c58c61a3e7.txt (the "Q-PRM" thesis), Sections 4.1 (Intel
Platform Resource Manager), 4.2 (QoS-aware PRM) and 5.5 (how the PRM was run); where the thesis is
silent, the authors' code: intel/platform-resource-manager `eris/` (the PRM) and the Q-PRM fork
jonassa/platform-resource-manager, branch `latency_controller`, `eris/controller.py` and
`eris/cpuquota.py` (cited as `qprm:eris/...`). Constants are in `configs/baselines/prm.yaml`. Seven
specs (five algorithms), built by `build_controller(spec)` or, for the controller registry, by
`make(spec, context)`:

* ``prm``                 NaiveController, CPU quota and non-exclusive CAT (the PRM's default, "PRM w/ CAT", Table 6.1)
* ``prm:exclusive-cat``   the same with `--exclusive-cat` (eris/eris.py:426-427)
* ``prm-nocat``           NaiveController with CPU quota only ("PRM", run with --disable-cat, Table 6.1)
* ``qprm-step``           Q-PRM Step (Sec. 4.2.2)
* ``qprm-prop``           Q-PRM Proportional (Sec. 4.2.2)
* ``qprm-prop2``          Q-PRM Proportional v2 (Sec. 4.2.2)
* ``qprm-basic``          Q-PRM Basic (Sec. 4.2.2)

They manage one LC app beside BE jobs (Sec. 5.2) and only throttle the BE jobs, which share one
resource level (Sec. 4.1.1: "regulated together as a group").

Resource levels -> Allocation:

* Pool. At the first observation the controller takes the managed LC app's core group and CLOS,
  the BE jobs' and the idle pool as its pool; every other LC app keeps its allocation untouched.
  With several LC apps the managed one is the strictest (smallest QoS target), as PARTIES
  Sec. 5.2.2 does for Heracles; the thesis only ever runs one LC app.
* CPU quota (eris/cpuquota.py:46-61, :104-110; qprm:eris/cpuquota.py:39-61, :103-109): level k of
  N (20 for the PRM, eris/mresource.py:24; 100 for the Q-PRM, qprm:eris/cpuquota.py:40) is
  k/N x `sysmax`, the LC app's maximal CPU utilisation (from the profile, else all pooled CPUs,
  eris/eris.py:374-381; raised whenever the LC app uses more, eris/eris.py:274-278), split evenly
  over the BE jobs; level 0 is 1% of a CPU for each BE job (CPU_QUOTA_MIN, not split); level N is
  "full", no quota (eris/mresource.py:43-48: the level after N - 1). The quota is computed when the
  level is set (`budgeting`), so a later rise of sysmax shows at the next level change.
  `cpu_mode: quota` (the shipped configuration): as in the thesis, the BE jobs run in the LC app's
  cpuset under a CFS quota (`AppAlloc.cpu_quota`); quota the BE jobs leave unused stays with the LC
  app. `cpu_mode: cores` (for nodes without CFS quotas): the BE jobs share one core group of the
  quota's cores rounded to core steps, at least one step (the BE job is never stopped, as at the
  PRM's 1%), at most the pool but one step.
* CFS shares: BE jobs 2, the LC app 200000 (eris/cpuquota.py:35-36, set on every container the PRM
  finds, eris/eris.py:248-253; the Q-PRM keeps it, qprm:eris/eris.py:268-273): the LC app's threads
  win the CPU they share with the BE jobs.
* LLC, with CAT (``prm``): the BE jobs' CLOS gets level + 2 ways (eris/llcoccup.py:30-40: level 0 =
  2 ways, up to every way; `--exclusive-cat`: 2..11 ways of 20, with the LC app in its own CLOS of
  18..9 ways). By default the LC app keeps the whole cache (its containers get no CLOS,
  eris/eris.py:153-155, 322-324): CAT masks overlap. This codebase's CLOSes own their ways
  exclusively, so the overlap is modelled as the LC app holding the pooled ways the BE jobs' mask
  leaves (a BE job that misses all the time fills its ways and evicts the LC app's lines from
  them, so the LC app holds about those ways anyway); a mask covering every way puts the BE jobs
  in the LC app's CLOS (nothing partitioned).
* LLC, without CAT (``prm-nocat`` and the Q-PRM, Sec. 4.2 / Table 6.1): the BE jobs join the LC
  app's CLOS and both share all the pooled ways, as an unpartitioned cache would.

Frequency. The PRM and the Q-PRM do not manage frequency; the thesis' node ran the "performance"
governor (Table 5.1), so the managed pool is kept at the top frequency level.

Timing. Controllers are tick functions: every rule runs on samples built from the observations'
timestamps (`_Window`), never on wall time. The Q-PRM reads the p99 once per second (Sec. 4.2,
5.3; qprm:eris/eris.py:476-477); with ticks shorter than a second one sample is the
request-weighted mean of the p99s of its ticks. The PRM's CPU cycle is 2 s and its LLC cycle 20 s
(Sec. 5.5; eris/eris.py:430-434).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from baselines.prm_analyzer import upper_fence, utilization_bins
from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController
from env.types import Allocation, AppAlloc, Capabilities, Decision, Observation

if TYPE_CHECKING:
    from env.controller import ControllerContext
    from env.sim.scenario import Scenario

DEFAULT_CONFIG = CONFIGS / "baselines" / "prm.yaml"
_EPS = 1e-9
CACHE_LINE_BYTES = 64


# ---- configuration ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LevelMap:
    """What the resource levels map to, shared by the five controllers (module docstring)."""

    min_quota_cores: float = 0.01  # level 0: 1% of one CPU per BE job (eris/cpuquota.py:31 CPU_QUOTA_MIN)
    # "quota": the BE jobs share the LC app's cores under a CFS quota (the thesis' mechanism; unused
    # quota stays with the LC app); "cores": the BE jobs get exclusive cores in core steps instead
    cpu_mode: Literal["quota", "cores"] = "cores"
    llc_min_ways: int = 2  # LLC level 0 (eris/llcoccup.py:32: level i -> i + 2 ways)
    lc_cpu_shares: int = 200_000  # eris/cpuquota.py:36 CPU_SHARE_LC
    be_cpu_shares: int = 2  # eris/cpuquota.py:35 CPU_SHARE_BE

    def __post_init__(self) -> None:
        if not self.min_quota_cores > 0:
            raise ConfigError(f"levels.min_quota_cores = {self.min_quota_cores}: must be > 0")
        if self.llc_min_ways < 1:
            raise ConfigError("levels.llc_min_ways must be >= 1")
        for name in ("lc_cpu_shares", "be_cpu_shares"):
            if not 2 <= getattr(self, name) <= 262_144:
                raise ConfigError(f"levels.{name} must be a cgroup cpu.shares value, 2..262144")


@dataclass(frozen=True)
class LlcBin:
    """The Analyzer's LC-alone fences for one band of LC CPU utilisation (prm_analyzer).

    The PRM flags LLC contention when the LC app's CPI and its L3 misses per kilo-instruction both
    exceed the fences of the current utilisation bin (eris/container.py:209-223, :260-276).
    Observations carry no performance counters, so both are derived from the simulator's (or the
    node's) own quantities per request served: cycles per request = busy core-seconds x achieved
    frequency / requests (CPI x the app's instructions per request, which a request mix fixes), and
    L3 misses per request = the app's DRAM traffic / 64-byte lines / requests (MPKI x the same
    constant / 1000). Fences are learned and applied on the same quantities, so the constant cancels.
    """

    util_start_cores: float
    util_end_cores: float
    cycles_per_req: float
    misses_per_req: float


@dataclass(frozen=True)
class PrmProfile:
    """What the PRM learns in its profiling run with the LC app alone (Sec. 4.1.1, 5.5).

    `lc_max_util_cores` is `sysmax`, the LC app's maximal utilisation (cores). None means no
    profile: like the PRM without a model file, it starts at all pooled CPUs (eris/eris.py:374-381);
    in either case it is raised at run time whenever the LC app uses more. Without `llc_bins` LLC
    contention is never detected (the PRM detects nothing without thresholds).
    """

    lc_max_util_cores: float | None = None
    llc_bins: tuple[LlcBin, ...] = ()

    def bin_for(self, util_cores: float) -> LlcBin | None:
        """The fence for `util_cores` as eris/container.py:260-276 finds it: the bin holding it,
        else the nearest bin below it (a gap, or above the last bin), none below the first bin."""
        bins = sorted(self.llc_bins, key=lambda b: b.util_start_cores)
        if not bins or util_cores < bins[0].util_start_cores:
            return None
        for b in bins:
            if b.util_start_cores <= util_cores < b.util_end_cores:
                return b
        return [b for b in bins if b.util_start_cores <= util_cores][-1]


@dataclass(frozen=True)
class NaiveConfig:
    """Intel PRM NaiveController, as run in the thesis (Sec. 5.5: --collect-metrics --detect
    --control --enable-hold, default intervals)."""

    cat: bool = True  # regulate LLC ways (False = --disable-cat: BE shares the LC app's ways)
    exclusive_cat: bool = False  # --exclusive-cat: BE 2..11 ways, LC 18..9 (eris/llcoccup.py:36-40)
    cpu_levels: int = 20  # eris/mresource.py:24 BUGET_LEV_MAX
    cpu_cycle_s: float = 2.0  # eris/eris.py:430-431 --util-interval
    cpu_quiet_cycles: int = 7  # eris/eris.py:437-438 --quota-cycles
    cpu_margin_cores: float = 0.5  # eris/eris.py:439-441 --margin-ratio of one CPU
    hold: bool = True  # --enable-hold
    llc_cycle_s: float = 20.0  # eris/eris.py:432-434 --metric-interval
    llc_quiet_cycles: int = 6  # eris/eris.py:435-436 --llc-cycles
    profile: PrmProfile = field(default_factory=PrmProfile)
    profile_run_s: float | None = 1800.0  # simulated profiling run when `profile` is empty (Sec. 5.5)

    def __post_init__(self) -> None:
        _positive(cpu_cycle_s=self.cpu_cycle_s, llc_cycle_s=self.llc_cycle_s, cpu_levels=self.cpu_levels)
        _positive(cpu_quiet_cycles=self.cpu_quiet_cycles, llc_quiet_cycles=self.llc_quiet_cycles)
        if self.profile_run_s is not None:
            _positive(profile_run_s=self.profile_run_s)


@dataclass(frozen=True)
class StepConfig:
    """Q-PRM Step and Proportional (Sec. 4.2.2; qprm:eris/controller.py:403-460)."""

    sample_s: float = 1.0  # qprm:eris/eris.py:476-477 --latency-interval
    cpu_levels: int = 100  # qprm:eris/cpuquota.py:40
    target_margin: float = (
        0.9  # the controllers aim at 0.9 x the QoS target (qprm:eris/eris.py:471-473, controller.py:410)
    )
    gain_levels: float = 8.0  # level change = floor(8 x slack') (qprm:eris/controller.py:415, :445)
    up_after_samples: int = 3  # CYCLE_THRESHOLD (qprm:eris/controller.py:406, :436)
    quota_exp_base: float | None = None  # Proportional v2 only: our reading of Sec. 4.2.2 (None: linear)

    def __post_init__(self) -> None:
        _positive(
            sample_s=self.sample_s,
            cpu_levels=self.cpu_levels,
            target_margin=self.target_margin,
            gain_levels=self.gain_levels,
            up_after_samples=self.up_after_samples,
        )
        if self.quota_exp_base is not None and not self.quota_exp_base > 1:
            raise ConfigError(f"quota_exp_base = {self.quota_exp_base}: must be > 1 (or null)")


@dataclass(frozen=True)
class BasicConfig:
    """Q-PRM Basic (Sec. 4.2.2; qprm:eris/controller.py:76-166)."""

    sample_s: float = 1.0
    cpu_levels: int = 100
    buffer_len: int = 10  # BUFFER_SIZE: 10 slacks, a decision every 10 samples
    slack_target: float = 0.2  # SLACK_TARGET: loss = |0.2 - 10-s average|
    violation_samples: int = 3  # _running_avg(3)
    violation_slack: float = 0.05  # MARGIN: violation when the 3-s average <= 0.05
    recovery_slack: float = 0.3  # RECOVERY_THRESHOLD: recovered when the 3-s average > 0.3
    step_slack_above: tuple[float, ...] = (0.75, 0.5, 0.25)  # _step_from_slack (controller.py:127-135)
    step_levels: tuple[int, ...] = (5, 3, 2, 1)  # ... and the steps, the last for any other slack

    def __post_init__(self) -> None:
        _positive(sample_s=self.sample_s, buffer_len=self.buffer_len, cpu_levels=self.cpu_levels)
        if not 1 <= self.violation_samples <= self.buffer_len:
            raise ConfigError(f"violation_samples = {self.violation_samples}: must be in 1..buffer_len")
        if len(self.step_levels) != len(self.step_slack_above) + 1:
            raise ConfigError("step_levels needs one step more than step_slack_above has thresholds")

    def step(self, avg_slack: float) -> int:
        """The step for a 10-s average slack: the first threshold it is above picks it."""
        for above, levels in zip(self.step_slack_above, self.step_levels):
            if avg_slack > above:
                return levels
        return self.step_levels[-1]


@dataclass(frozen=True)
class PrmConfigs:
    """The whole of `configs/baselines/prm.yaml`."""

    levels: LevelMap
    prm: NaiveConfig
    prm_nocat: NaiveConfig
    qprm_step: StepConfig
    qprm_prop: StepConfig
    qprm_prop2: StepConfig
    qprm_basic: BasicConfig


def _positive(**values: float) -> None:
    for k, v in values.items():
        if not v > 0:
            raise ConfigError(f"{k} = {v}: must be > 0")


def load_configs(path: str | Path | None = None) -> PrmConfigs:
    """Load and check `configs/baselines/prm.yaml` (or `path`); raises ConfigError."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    return build(PrmConfigs, load_yaml(p), p.name)


SPECS = ("prm", "prm:exclusive-cat", "prm-nocat", "qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic")


def build_controller(
    spec: str, path: str | Path | None = None, *, profile: PrmProfile | None = None
) -> BaseController:
    """The controller for a spec string (see the module docstring), configured from YAML.

    `profile` replaces the YAML profile of the NaiveController specs (see `profile_lc`).
    """
    cfgs = load_configs(path)
    lv = cfgs.levels
    if spec in ("prm", "prm:exclusive-cat", "prm-nocat"):
        cfg = cfgs.prm_nocat if spec == "prm-nocat" else cfgs.prm
        if spec == "prm:exclusive-cat":
            cfg = replace(cfg, exclusive_cat=True)
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
    """The controller of `spec` (module docstring) for a run. The PRM is deployed after a profiling
    run of the LC app alone (Sec. 4.1.1, 5.5). In simulation, when the YAML holds no profile, that
    run is made here on a fresh SimNode of the same scenario without BE jobs, for `profile_run_s`
    (30 min in Sec. 5.5); on a real node the YAML profile is used. The Q-PRM needs no profile."""
    if not spec.startswith("prm"):
        return build_controller(spec)
    cfgs = load_configs()
    cfg = cfgs.prm_nocat if spec == "prm-nocat" else cfgs.prm
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


def _busy_cores(obs: Observation, lc: str, bes: Sequence[str]) -> tuple[float, float]:
    """(LC, BE) CPU utilisation in cores over one tick (what the PRM reads from cgroups, eris/
    container.py:168-198)."""
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
    """LC utilisation (cores), cycles per request and L3 misses per request over one LLC cycle (the
    counter analogues of `LlcBin`); (util, 0, 0) when no request was served."""
    dt = sum(o.interval_s for o in ticks)
    busy_s = cycles = misses = reqs = 0.0
    for o in ticks:
        s = o.app(lc)
        busy = s.usage.cpu_util * o.allocation[lc].cores * o.interval_s
        busy_s += busy
        cycles += busy * s.usage.freq_mhz * 1e6
        misses += s.usage.mem_bw_gbps * 1e9 / CACHE_LINE_BYTES * o.interval_s
        reqs += s.served_rps * o.interval_s
    if reqs <= 0:
        return busy_s / dt, 0.0, 0.0
    return busy_s / dt, cycles / reqs, misses / reqs


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
        cpu_levels: int,
        cat: bool,
        exclusive_cat: bool = False,
        quota_exp_base: float | None = None,
    ) -> None:
        self.caps, self.lc, self.bes, self.levels = caps, lc, tuple(bes), levels
        self.cpu_levels, self.cat, self.exclusive_cat = cpu_levels, cat, exclusive_cat
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
        self.level0_units = max(1, math.ceil(len(self.bes) * levels.min_quota_cores / step - 1e-6))
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
        if cat and self.pool_ways < levels.llc_min_ways + caps.min_llc_ways:
            raise LayoutError(f"{lc!r} and the BE jobs hold {self.pool_ways} LLC ways: too few to partition")

    @property
    def pool_cores(self) -> float:
        return self.pool_units * self.step

    @property
    def quota(self) -> bool:
        return self.levels.cpu_mode == "quota"

    @property
    def llc_max_level(self) -> int:
        """The top LLC level: every pooled way (eris/llcoccup.py:39-40: bitcnt - 1 levels, the last
        two masks equal) or, with --exclusive-cat, half of them plus one for the BE jobs."""
        w, lo = self.pool_ways, self.levels.llc_min_ways
        return max(0, (w // 2 + 1 if self.exclusive_cat else w) - lo)

    def be_quota_cores(self, level: int, sysmax_cores: float) -> float | None:
        """Each BE job's CFS quota at a CPU level, in cores; None = no quota (module docstring)."""
        lv, n = self.levels, len(self.bes)
        if level <= 0:
            return lv.min_quota_cores
        if level >= self.cpu_levels:
            return None
        total = level / self.cpu_levels * min(sysmax_cores, self.pool_cores)
        if self.quota_exp_base is not None:  # Proportional v2: exponential at low levels (Sec. 4.2.2)
            total = min(total, lv.min_quota_cores * self.quota_exp_base**level)
        return max(total / n, lv.min_quota_cores)

    def be_cores(self, level: int, sysmax_cores: float) -> float:
        """CPU the BE jobs may use together at a level, in cores (the quota, or exclusive cores)."""
        each = self.be_quota_cores(level, sysmax_cores)
        if self.quota:
            return self.pool_cores if each is None else each * len(self.bes)
        top = self.pool_units - 1  # the LC app keeps at least one core step
        units = top if each is None else round(each * len(self.bes) / self.step)
        return min(max(units, self.level0_units), top) * self.step

    def be_ways(self, llc_level: int) -> int:
        return self.levels.llc_min_ways + min(max(llc_level, 0), self.llc_max_level)

    def allocation(
        self, current: Allocation, cpu_level: int, llc_level: int, sysmax_cores: float
    ) -> Allocation:
        """`current` with the LC app and the BE jobs set to the levels; other apps unchanged."""
        lv = self.levels
        turbo = self.caps.freq_levels_mhz[-1]  # the thesis' "performance" governor (Table 5.1)
        be_cores = self.be_cores(cpu_level, sysmax_cores)
        if self.quota:  # BE jobs in the LC app's cpuset under a CFS quota (0 = none at the top)
            lc_cores, be_cores = self.pool_cores, self.pool_cores
            be_group, be_freq = self.lc_group, turbo
            be_quota = self.be_quota_cores(cpu_level, sysmax_cores) or 0.0
        else:
            lc_cores = self.pool_cores - be_cores
            be_group, be_freq, be_quota = self.be_group, self.be_freq, 0.0
        be_ways = self.be_ways(llc_level) if self.cat else self.pool_ways
        if be_ways >= self.pool_ways:  # no CAT, or a mask over every way: one shared CLOS
            be_clos, lc_ways, be_ways, be_mba = (
                self.lc_clos,
                self.pool_ways,
                self.pool_ways,
                current[self.lc].mba_pct,
            )
        else:
            be_clos, lc_ways, be_mba = self.be_clos, self.pool_ways - be_ways, self.be_mba
        apps: list[AppAlloc] = []
        for a in current:
            if a.name == self.lc:
                a = replace(
                    a,
                    cores=lc_cores,
                    llc_ways=lc_ways,
                    cpu_quota=0.0,
                    freq_mhz=turbo,
                    cpu_shares=lv.lc_cpu_shares,
                )
            elif a.name in self.bes:
                a = replace(
                    a,
                    cores=be_cores,
                    core_group=be_group,
                    freq_mhz=be_freq,
                    llc_ways=be_ways,
                    clos=be_clos,
                    mba_pct=be_mba,
                    cpu_quota=be_quota,
                    cpu_shares=lv.be_cpu_shares,
                )
            apps.append(a)
        return Allocation.of(apps, self.caps)


# ---- shared controller plumbing ------------------------------------------------------------------------
class _LevelController(BaseController):
    """Holds the managed LC app, the BE jobs, the current levels, sysmax and the level -> allocation map.

    Subclasses advance their state machine in `_rules(observation)` and return a reason when a
    level changed. The first decision applies the initial levels (level 0: "In its initial state,
    the Intel PRM strips best-effort jobs of all resources", Sec. 4.1.3; eris/eris.py:280-281; the
    Q-PRM keeps it, qprm:eris/eris.py:302-303).
    """

    cat = False
    exclusive_cat = False
    quota_exp_base: float | None = None

    def __init__(self, levels: LevelMap, cpu_levels: int, name: str) -> None:
        super().__init__()
        self.levels = levels
        self.cpu_levels = cpu_levels
        self.name = name
        self.lc = ""
        self.bes: tuple[str, ...] = ()
        self.layout: LevelLayout | None = None
        self.cpu_level = 0
        self.llc_level = 0
        self.sysmax_cores = math.nan
        self._quota_sysmax_cores = math.nan

    def _reset(self) -> None:
        assert self.caps is not None
        self.lc = strictest_lc(self.caps)
        self.bes = tuple(a.name for a in self.caps.be_apps)
        self.layout = None
        self.cpu_level = 0
        self.llc_level = 0
        self.sysmax_cores = math.nan
        self._quota_sysmax_cores = math.nan
        self._reset_rules()

    def _reset_rules(self) -> None:
        """Clear the subclass's state machine."""

    def _initial_sysmax_cores(self) -> float | None:
        """sysmax before any observation (None: all pooled CPUs, eris/eris.py:380-381)."""
        return None

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
                    cpu_levels=self.cpu_levels,
                    cat=self.cat,
                    exclusive_cat=self.exclusive_cat,
                    quota_exp_base=self.quota_exp_base,
                )
            except LayoutError as e:  # degrade safely: keep the allocation, retry next tick
                return Decision.hold(f"{self.name}: {e}")
            initial = self._initial_sysmax_cores()
            self.sysmax_cores = self.layout.pool_cores if initial is None else initial
            self._quota_sysmax_cores = self.sysmax_cores
        reason = self._rules(obs)
        target = self.layout.allocation(
            obs.allocation, self.cpu_level, self.llc_level, self._quota_sysmax_cores
        )
        if target == obs.allocation:
            return Decision.hold(reason or "hold")
        if not reason:
            reason = "initial levels" if first else "re-apply the levels"
        return Decision(allocation=target, reason=f"{reason}; {self._levels_text()}")

    def _levels_text(self) -> str:
        text = f"BE CPU level {self.cpu_level}/{self.cpu_levels}"
        if self.cat:
            text += f", LLC level {self.llc_level}"
        return text

    def _record_lc_util(self, lc_busy_cores: float) -> None:
        """sysmax rises whenever the LC app uses more (eris/eris.py:274-278; qprm:eris/eris.py:296-300)."""
        self.sysmax_cores = max(self.sysmax_cores, lc_busy_cores)

    def _set_cpu(self, level: int) -> int:
        """Set the CPU level; the quota follows sysmax as it is now (`budgeting`, module docstring)."""
        self.cpu_level = min(max(level, 0), self.cpu_levels)
        self._quota_sysmax_cores = self.sysmax_cores
        return self.cpu_level


# ---- Intel PRM ----------------------------------------------------------------------------------------
class NaiveController(_LevelController):
    """Intel PRM's NaiveController (eris/naivectrl.py:24-56; Sec. 4.1.1, 4.1.3; run as in Sec. 5.5).

    CPU, every `cpu_cycle_s` (2 s): contention when the LC app is idle or the LC and BE utilisation
    plus a margin of half a CPU exceeds sysmax (eris/cpuquota.py:112-131 detect_margin_exceed;
    Sec. 4.1.3). Contention -> level 0 (Sec. 4.1.1). With --enable-hold (Sec. 5.5), a quiet cycle in
    which one more quota step (sysmax / 20) would reach sysmax holds the level and does not count.
    Otherwise +1 level after `cpu_quiet_cycles` quiet cycles: 7 x 2 s = 14 s (Sec. 4.1.1); the level
    after 19 is "full".

    LLC (with CAT), every `llc_cycle_s` (20 s): contention when the LC app's cycles and L3 misses per
    request both exceed its profile's fences for the current utilisation bin (eris/container.py:
    209-223, 260-276; see `LlcBin`). Contention -> level 0; +1 level after 6 quiet cycles = 2 min
    (Sec. 4.1.1, 7.2.1). Memory-bandwidth and TDP contention are detected by the PRM but no
    controller acts on them (eris/eris.py:485-486), so they are left out.
    """

    def __init__(self, config: NaiveConfig, levels: LevelMap, name: str = "prm") -> None:
        super().__init__(levels, config.cpu_levels, name)
        self.config = config
        self.cat = config.cat
        self.exclusive_cat = config.exclusive_cat

    def _reset_rules(self) -> None:
        cfg = self.config
        self._cpu_window = _Window(cfg.cpu_cycle_s)
        self._llc_window = _Window(cfg.llc_cycle_s)
        self.cpu_quiet = 0
        self.llc_quiet = 0
        self.cpu_contention = False
        self.llc_contention = False
        self.cpu_hold = False

    def _initial_sysmax_cores(self) -> float | None:
        return self.config.profile.lc_max_util_cores

    @property
    def cpu_threshold_cores(self) -> float:
        """sysmax, the CPU threshold of the contention test."""
        return self.sysmax_cores

    def _rules(self, obs: Observation) -> str:
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
        cfg = self.config
        dt = sum(o.interval_s for o in ticks)
        lc_busy = be_busy = 0.0
        for o in ticks:
            lc_b, be_b = _busy_cores(o, self.lc, self.bes)
            lc_busy += lc_b * o.interval_s / dt
            be_busy += be_b * o.interval_s / dt
        self._record_lc_util(lc_busy)
        sysmax = self.sysmax_cores
        load = lc_busy + be_busy + cfg.cpu_margin_cores
        self.cpu_contention = lc_busy <= 0.0 or load > sysmax
        self.cpu_hold = False
        if self.cpu_contention:  # Sec. 4.1.1: "the CPU quota level is set to zero"
            self.cpu_quiet = 0
            before = self.cpu_level
            self._set_cpu(0)
            return f"CPU contention ({load:.2f} > {sysmax:.2f} cores): level {before} -> 0"
        if self.cpu_level >= self.cpu_levels:
            return ""
        if cfg.hold and load + sysmax / self.cpu_levels >= sysmax:  # eris/cpuquota.py:128-129
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
        util, cycles, misses = _cycle_metrics(ticks, self.lc)
        fence = cfg.profile.bin_for(util)
        self.llc_contention = (
            fence is not None and cycles > fence.cycles_per_req and misses > fence.misses_per_req
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
    requested_cores: float,
    cpu_cycle_s: float = 2.0,
    llc_cycle_s: float = 20.0,
) -> PrmProfile:
    """The PRM's profile from a run of the LC app alone (Sec. 4.1.1 step 1-2, Sec. 5.5).

    sysmax is the maximal LC utilisation over the CPU cycles (analyzer.py:188-194). The LLC fences
    come per utilisation bin of the Analyzer (`prm_analyzer.utilization_bins`, from half of
    `requested_cores`), each the GMM upper fence of the cycles and the L3 misses per request of the
    LLC cycles in that bin (`prm_analyzer.upper_fence`); a bin without data gets none. A pure
    function of the observations: the caller runs the profiling episode.
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
    bins = []
    for lo, hi in utilization_bins(requested_cores):
        inside = [m for m in cycles if lo <= m[0] <= hi]  # both ends, as analyzer.py:150-151
        if inside:
            bins.append(
                LlcBin(
                    util_start_cores=lo,
                    util_end_cores=hi,
                    cycles_per_req=upper_fence([m[1] for m in inside]),
                    misses_per_req=upper_fence([m[2] for m in inside]),
                )
            )
    return PrmProfile(lc_max_util_cores=max_util if max_util > 0 else None, llc_bins=tuple(bins))


def profile_in_sim(
    scenario: Scenario, app: str, duration_s: float, *, seed: int = 0, cfg: NaiveConfig | None = None
) -> PrmProfile:
    """The PRM's profiling run in simulation (Sec. 4.1.1, 5.5): the scenario's LC apps alone (no BE
    job) under their own load traces for `duration_s`, each holding its fair share (one LC app: the
    whole node, which it then requests), then `profile_lc` over the observations. Runs on a fresh
    SimNode."""
    from env.sim.node import SimNode  # the simulator is only needed here

    cfg = cfg or NaiveConfig()
    alone = replace(scenario, be=(), antagonists=(), duration_s=duration_s, warmup_s=0.0)
    node = SimNode(alone, seed=seed)
    requested = node.current_allocation()[app].cores
    steps = max(1, round(duration_s / node.capabilities().interval_s))
    observations = [node.step() for _ in range(steps)]
    return profile_lc(
        observations, app, requested_cores=requested, cpu_cycle_s=cfg.cpu_cycle_s, llc_cycle_s=cfg.llc_cycle_s
    )


# ---- Q-PRM --------------------------------------------------------------------------------------------
class _QosController(_LevelController):
    """Q-PRM plumbing: one QoS sample per `sample_s` (Sec. 4.2: read once per second), and the
    level moves of qprm:eris/controller.py:34-72 (`step_by` clamps at level 0 and at full). Full is
    level 100 here; in the code it is a level of its own above 100, where sysmax's whole quota
    (level 100) and no quota coincide on a node whose sysmax is all its CPUs, so a step down from
    full lands one level lower here than there."""

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
        dt = sum(o.interval_s for o in ticks)
        self._record_lc_util(sum(_busy_cores(o, self.lc, self.bes)[0] * o.interval_s for o in ticks) / dt)
        return self._on_p99(_p99_us(ticks, self.lc), ticks[-1].app(self.lc).target_us)

    @abstractmethod
    def _on_p99(self, p99_us: float, target_us: float) -> str:
        """Advance the state machine by one QoS sample; return why the level changed ("" if not)."""

    def _move(self, delta: int, why: str) -> str:
        before = self.cpu_level
        if delta and self._set_cpu(before + delta) != before:
            return f"{why}: level {before} -> {self.cpu_level}"
        return ""


class StepController(_QosController):
    """Q-PRM Step (Sec. 4.2.2; qprm:eris/controller.py:433-460).

    Every sample: level change = floor(8 x slack'), slack' = (0.9 x target - p99) / (0.9 x target).
    Below 0 (p99 over 0.9 x target): one level down at once and the count of good samples restarts;
    above 0 (slack' >= 0.125): the count grows and every 3rd such sample moves one level up; 0
    (0 <= slack' < 0.125, the dead band) does nothing, not even to the count. The thesis: "merely
    reduces the level by one step. For every 3 seconds that no contention has been detected, the
    level is increased by one"; its code adds the 0.9 margin and the dead band.
    """

    single_step = True

    def __init__(self, config: StepConfig, levels: LevelMap, name: str = "qprm-step") -> None:
        super().__init__(levels, config.cpu_levels, name)
        self.config = config
        self.sample_s = config.sample_s
        self.quota_exp_base = config.quota_exp_base

    def _reset_qos(self) -> None:
        self.up_count = 0

    def _on_p99(self, p99_us: float, target_us: float) -> str:
        cfg = self.config
        aim = cfg.target_margin * target_us
        self.last_slack = (aim - p99_us) / aim
        change = math.floor(cfg.gain_levels * self.last_slack)
        if change < 0:
            self.up_count = 0
            return self._move(-1 if self.single_step else change, f"slack' {self.last_slack:.3f}")
        if change > 0:
            self.up_count += 1
            if self.up_count >= cfg.up_after_samples:
                self.up_count = 0
                return self._move(1 if self.single_step else change, f"slack' {self.last_slack:.3f}")
        return ""


class ProportionalController(StepController):
    """Q-PRM Proportional and Proportional v2 (Sec. 4.2.2; qprm:eris/controller.py:403-430).

    Step's rule with the level moved by the whole change, floor(8 x slack'), in either direction:
    "when the latency is either much higher or much lower than the threshold, this controller
    increases and decreases the CPU quota more aggressively".

    Proportional v2 is the same rule over an exponential level -> quota map at low levels ("for
    finer steps near the minimum", Sec. 4.2.2, 7.2.2): min_quota x base^level until it meets the
    linear map. The authors' public code has no such map; this one is our reading of the thesis.
    """

    single_step = False

    def __init__(self, config: StepConfig, levels: LevelMap, name: str = "qprm-prop") -> None:
        super().__init__(config, levels, name)


class BasicController(_QosController):
    """Q-PRM Basic (Sec. 4.2.2; qprm:eris/controller.py:76-166).

    A ring buffer holds the 10 latest slacks (against the QoS target itself). Outside recovery,
    every sample: a violation when the average of the 3 latest (their sum / 3) is <= 0.05, else the
    count grows and every 10th sample the controller decides on the buffer's average: loss =
    |0.2 - average|; when the loss grew since the last decision (a last loss of 0 counts as none)
    the direction reverses; it then moves 5, 3, 2 or 1 levels for an average above 0.75, 0.5, 0.25
    or else. The first direction is up.

    A violation sets the level to 0, remembers half the level it had, restarts the count and starts
    recovery; the last loss and the direction are kept. In recovery the count grows every sample
    and every 10th the 3-sample average decides: above 0.3 restores the remembered level and ends
    recovery.
    """

    def __init__(self, config: BasicConfig, levels: LevelMap, name: str = "qprm-basic") -> None:
        super().__init__(levels, config.cpu_levels, name)
        self.config = config
        self.sample_s = config.sample_s

    def _reset_qos(self) -> None:
        self.buffer: deque[float] = deque(maxlen=self.config.buffer_len)
        self.count = 0
        self.recovery = False
        self.restore_level = 0
        self.prev_loss: float | None = None
        self.direction = 1

    def _recent(self) -> float:
        """The average of the latest samples, as qprm:eris/controller.py:116-117 (sum / n)."""
        n = self.config.violation_samples
        return sum(list(self.buffer)[-n:]) / n

    def _tenth(self) -> bool:
        self.count += 1
        if self.count >= self.config.buffer_len:
            self.count = 0
            return True
        return False

    def _on_p99(self, p99_us: float, target_us: float) -> str:
        cfg = self.config
        self.last_slack = (target_us - p99_us) / target_us
        self.buffer.append(self.last_slack)
        if self.recovery:
            if not self._tenth():
                return ""
            recent = self._recent()
            if recent <= cfg.recovery_slack:
                return ""
            self.recovery = False
            self._set_cpu(self.restore_level)
            return f"recovered (3-s slack {recent:.3f}): restore level {self.restore_level}"
        recent = self._recent()
        if recent <= cfg.violation_slack:
            before = self.cpu_level
            self.restore_level = before // 2
            self._set_cpu(0)
            self.recovery = True
            self.count = 0
            return f"violation (3-s slack {recent:.3f}): level {before} -> 0, recovery"
        if not self._tenth():
            return ""
        avg = sum(self.buffer) / len(self.buffer)
        loss = abs(cfg.slack_target - avg)
        if self.prev_loss and loss > self.prev_loss:
            self.direction = -self.direction
        self.prev_loss = loss
        return self._move(self.direction * cfg.step(avg), f"10-s slack {avg:.3f}, loss {loss:.3f}")
