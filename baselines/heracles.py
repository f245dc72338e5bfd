"""Heracles (Lo et al., ISCA'15 / TOCS'16; ../shared/seeds/002_*.txt, Sec. 4.5) as a tick function.

Heracles is a top-level controller (Alg. 1, every 15 s) coordinating three sub-controllers that
run independently: cores & memory (Alg. 2, every 2 s), power (Alg. 3, every 2 s) and network
(Alg. 4, every 1 s). Here each `decide()` call is one node interval; every (sub-)controller keeps
the time of its next cycle and runs when an observation's timestamp reaches it, on the mean of the
observations since its last cycle (the paper's "poll" / "measure"). Several sub-controllers may
change the allocation in the same tick, as in the paper (PARTIES Sec. 5.2.2 criticises exactly that).
Alg. 2's grow-then-measure step is explicit state: a BE cache growth is judged on the next 2 s cycle
(bandwidth derivative and BE benefit) and rolled back there if it did not pay.

Resources (Sec. 4.2): the LC job gets its own cpuset (core group) and an exclusive CAT partition
(one CLOS); all BE tasks share one cpuset and one CLOS ("one partition for the LC workload and a
second partition for all BE tasks", Sec. 4.3). Frequency: the LC cores are not capped (turbo
allowed); the BE cores' cap is set by the power sub-controller (Alg. 3). Network: the LC job is not
limited; the BE side gets Alg. 4's limit. Memory capacity and disk bandwidth are not partitioned by
Heracles (PARTIES Sec. 5.2.2): every app gets the node's whole memory and disk as its limit.

Several LC apps (PARTIES Sec. 5.2.2, "we select the one with the strictest QoS as the LC
application, and treat the others as BE jobs"): the app with the lowest QoS target is Heracles' LC
job; the other LC apps join the BE cpuset and CLOS ("no partitioning between BE jobs"). Disabling BE
pauses BE jobs (Alg. 1, PARTIES Sec. 5.2.2 "it pauses BE jobs on a violation"). In this codebase an
LC app cannot hold 0 cores (`env.types.validate_allocation`), so "disable BE" means: the true BE
jobs get 0 cores (paused, in a core group of their own), the LC-apps-as-BE keep the smallest
possible BE cpuset (one core step) and the BE CLOS shrinks to its minimum ways; the LC job gets
everything else. With no LC-apps-as-BE, the BE cpuset itself drops to 0 cores.

Offline model (Sec. 4.4): Alg. 2 needs the LC job's DRAM bandwidth at a given load, core count and
LLC size, from offline profiling. It is injected as `lc_bw_model(load_frac, cores, llc_ways) ->
GB/s`; the candidate allocation of a growth step is what it is asked about. Without a model the LC
job's *measured* bandwidth (`Usage.mem_bw_gbps`, a per-app counter the paper's hardware lacked) is
used for every allocation, so predictions ignore how the LC job's traffic changes with its cores
and LLC; BE bandwidth is the node total minus the LC estimate, as in the paper.

Choices where the paper is ambiguous:

1. Alg. 1 as printed tests `load < 0.80 -> EnableBE()` before the slack rules, so below 80% load
   the slack rules would never run. The text says the slack rules apply "when these two safeguards
   [negative slack, load > 85%] are not active"; so after the safeguards, BE is re-enabled when load
   < 80% (and no cooldown is running) and then the slack rules (< 10%: no growth; < 5%: remove BE
   cores; else growth allowed) apply to enabled BE.
2. `be_cores.Remove(be_cores.Size() - 2)` (Alg. 1 line 15) is read as "remove 2 BE cores", as the
   calibration summary and the text ("switch cores from BE tasks to the LC workload") suggest,
   not as "keep 2".
3. "Latency" over the 15 s poll is the request-weighted mean of the intervals' p99s (the node
   reports one p99 per interval, not the requests), and "load" the mean load fraction.
4. The first top-level poll happens after the first full 15 s window; until then BE runs at its
   start allocation (1 core, 10% LLC) without growth, since growth needs the top-level signal
   ("When the top-level controller signals BE growth ..."). After a disable, re-enabling restarts BE
   from the same start allocation in GROW_LLC.
5. BeBenefit(): BE performance = the true BE jobs' normalised throughput plus the LC-apps-as-BE's
   served load as fractions of their max loads (throughput metrics, Sec. 4.5 "we can use throughput
   based metrics for F"); a benefit is a rise of more than `be_benefit_min_gain`.
6. When a growth step cannot be taken (LC at its last core or way) the phase switches, as when the
   bandwidth prediction fails; gradient descent has converged when neither can grow (Sec. 4.5).
7. The BE network limit of Alg. 4 is one HTB class for all BE flows; with per-app limits here every
   BE-side app gets that limit as its own ceiling (they then compete within it as flows of one class
   would, but their sum is not capped).
8. Guaranteed frequency (Alg. 3): measured offline with the LC job alone at full load; the default
   (None) is the node's nominal frequency. Power is Observation.power_w (socket RAPL); a node with
   no TDP (NaN) disables the power sub-controller.
9. CanGrowBE() (Alg. 2 line 9) is the top-level growth signal *and* the LC job's slack over the
   2 s cycle being at least the growth margin (10%): Sec. 4.5 grows BE cores "each time checking
   for DRAM bandwidth saturation and SLO violations" and says the sub-controller "estimates whether
   it is close to an SLO violation ... based on the amount of latency slack". Only the top level
   disables BE or removes cores on low slack.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController, ControllerContext
from env.guards import be_frequency_step
from env.types import Allocation, AppAlloc, Decision, Observation

DEFAULT_CONFIG = CONFIGS / "baselines" / "heracles.yaml"
LcBwModel = Callable[[float, float, int], float]  # (load_frac, cores, llc_ways) -> GB/s

BE_GROUP, LC_GROUP, PAUSED_GROUP = 0, 1, 2  # core groups (cpusets)
BE_CLOS, LC_CLOS = 0, 1  # CAT classes: exclusive partitions (Sec. 4.3)
GROW_LLC, GROW_CORES = "GROW_LLC", "GROW_CORES"
_EPS = 1e-6


@dataclass(frozen=True)
class HeraclesConfig:
    """Heracles' constants (Sec. 4.5, Alg. 1-4; ../shared/calibration/heracles.yaml `controller`)."""

    top_poll_s: float = 15.0  # Alg. 1
    disable_be_load_above: float = 0.85  # Alg. 1 line 8
    enable_be_load_below: float = 0.80  # Alg. 1 line 10
    disallow_growth_slack_below: float = 0.10  # Alg. 1 line 12
    remove_cores_slack_below: float = 0.05  # Alg. 1 line 14
    remove_cores_count: int = 2  # Alg. 1 line 15 (choice 2)
    cooldown_s: float = 300.0  # Sec. 4.5 "e.g., 5 minutes"
    core_mem_cycle_s: float = 2.0  # Alg. 2
    dram_limit_frac: float = 0.90  # Alg. 2 DRAM_LIMIT
    dram_peak_gbps: float = 50.0  # peak streaming DRAM bandwidth (PARTIES Table 1 node)
    be_start_cores: float = 1.0  # Sec. 4.5
    be_start_llc_frac: float = 0.10  # Sec. 4.5
    be_benefit_min_gain: float = 0.0  # BeBenefit() (choice 5)
    power_cycle_s: float = 2.0  # Alg. 3
    power_tdp_frac: float = 0.90  # Alg. 3
    guaranteed_freq_mhz: float | None = None  # Alg. 3 (choice 8); None = nominal
    network_cycle_s: float = 1.0  # Alg. 4
    net_headroom_link_frac: float = 0.05  # Alg. 4
    net_headroom_lc_frac: float = 0.10  # Alg. 4

    def __post_init__(self) -> None:
        for name in ("top_poll_s", "core_mem_cycle_s", "power_cycle_s", "network_cycle_s", "dram_peak_gbps"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"heracles.{name} must be > 0")
        if not self.enable_be_load_below <= self.disable_be_load_above:
            raise ConfigError("heracles: enable_be_load_below must be <= disable_be_load_above (hysteresis)")
        if not self.remove_cores_slack_below <= self.disallow_growth_slack_below:
            raise ConfigError("heracles: remove_cores_slack_below must be <= disallow_growth_slack_below")
        if not 0 < self.dram_limit_frac <= 1 or not 0 < self.power_tdp_frac <= 1:
            raise ConfigError("heracles: dram_limit_frac and power_tdp_frac must be in (0, 1]")
        if not 0 <= self.be_start_llc_frac < 1 or self.be_start_cores < 0 or self.remove_cores_count < 0:
            raise ConfigError(
                "heracles: be_start_llc_frac in [0, 1), be_start_cores and remove_cores_count >= 0"
            )


def load_heracles_config(path: str | Path | None = None) -> HeraclesConfig:
    """`configs/baselines/heracles.yaml` (or `path`) as a `HeraclesConfig`; unknown keys are errors."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    data = load_yaml(p)
    return build(HeraclesConfig, {} if data is None else data, where=p.name)


@dataclass(frozen=True)
class _Growth:
    """A BE growth step of Alg. 2, judged on the next 2 s cycle."""

    kind: Literal["llc", "cores"]
    bw_before_gbps: float
    perf_before: float
    amount_after: float  # BE ways / cores right after the step


@dataclass(frozen=True)
class _CoreSample:
    p99_us: float
    requests: int
    total_bw_gbps: float
    lc_bw_gbps: float
    be_perf: float
    load_frac: float


class HeraclesController(BaseController):
    """Heracles' controller (Sec. 4.5, Alg. 1-4); see the module docstring for rules and choices."""

    name = "heracles"

    def __init__(
        self,
        config: HeraclesConfig | str | Path | None = None,
        *,
        lc_bw_model: LcBwModel | None = None,
        guaranteed_freq_mhz: float | None = None,
        dram_peak_gbps: float | None = None,
    ) -> None:
        super().__init__()
        if config is None or isinstance(config, str | Path):
            config = load_heracles_config(config)
        self.cfg: HeraclesConfig = config
        self.lc_bw_model = lc_bw_model
        self._guaranteed_arg = (
            guaranteed_freq_mhz if guaranteed_freq_mhz is not None else config.guaranteed_freq_mhz
        )
        self._dram_peak = dram_peak_gbps if dram_peak_gbps is not None else config.dram_peak_gbps
        self._reset()

    # ---- roles and episode state ----------------------------------------------------------------
    def _reset(self) -> None:
        caps = self.caps
        self._t0: float | None = None
        self._next: dict[str, float] = {}
        self._win_top: list[tuple[float, int, float]] = []  # (p99_us, requests, load_frac)
        self._win_core: list[_CoreSample] = []
        self._win_power: list[tuple[float, float]] = []  # (power_w, LC freq_mhz)
        self._win_net: list[float] = []  # LC tx Gbps
        self._growth_pending: _Growth | None = None
        self._bw_derivative = 0.0
        self._phase = GROW_LLC
        self._growth = False
        self._cooldown_until = -math.inf
        if caps is None:
            return
        lc = caps.lc_apps
        if not lc:
            raise ValueError("heracles manages one latency-critical job; this node runs none")
        if max(caps.clos_count, 1) < 2:
            raise ValueError("heracles needs 2 CAT classes for exclusive LC/BE partitions; this node has 1")
        # PARTIES Sec. 5.2.2: the strictest QoS target is Heracles' LC job; other LC apps are BE.
        self.lc = min(lc, key=lambda a: a.qos_target_us).name
        self.lc_as_be = tuple(a.name for a in lc if a.name != self.lc)
        self.be = tuple(a.name for a in caps.be_apps)
        self._be_side = self.lc_as_be + self.be
        self._guaranteed = (
            float(self._guaranteed_arg) if self._guaranteed_arg is not None else float(caps.nominal_freq_mhz)
        )
        self._be_freq = caps.freq_levels_mhz[-1]
        self._be_net = caps.net_gbps
        self.enabled = False
        self.be_cores = 0.0
        self.be_ways = 0
        if self._be_side:
            self._enable()

    @property
    def dram_limit_gbps(self) -> float:
        return self.cfg.dram_limit_frac * self._dram_peak

    @property
    def growth_allowed(self) -> bool:
        return self._growth

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def be_freq_mhz(self) -> int:
        return self._be_freq

    @property
    def be_net_gbps(self) -> float:
        return self._be_net

    def _min_be_cores(self) -> float:
        """LC apps cannot hold 0 cores; a BE cpuset holding only true BE jobs can."""
        assert self.caps is not None
        return self.caps.core_step if self.lc_as_be else 0.0

    def _max_be_cores(self) -> float:
        assert self.caps is not None
        return self.caps.cores - self.caps.core_step  # the LC job keeps one core step

    def _max_be_ways(self) -> int:
        assert self.caps is not None
        return self.caps.llc_ways - self.caps.min_llc_ways

    def _enable(self) -> None:
        """EnableBE(): BE restarts with 1 core and 10% of the LLC in GROW_LLC (Sec. 4.5; choice 4)."""
        caps = self.caps
        assert caps is not None
        self.enabled = True
        start = math.floor(self.cfg.be_start_cores / caps.core_step + _EPS) * caps.core_step
        self.be_cores = min(max(start, self._min_be_cores()), self._max_be_cores())
        ways = max(caps.min_llc_ways, round(self.cfg.be_start_llc_frac * caps.llc_ways))
        self.be_ways = min(ways, self._max_be_ways())
        self._phase = GROW_LLC
        self._growth = False
        self._growth_pending = None
        self._bw_derivative = 0.0

    def _disable(self) -> None:
        """DisableBE(): pause the BE jobs, give the LC job everything else (Alg. 1; module docstring)."""
        caps = self.caps
        assert caps is not None
        self.enabled = False
        self._growth = False
        self._growth_pending = None
        self.be_cores = self._min_be_cores()
        self.be_ways = caps.min_llc_ways
        self._phase = GROW_LLC

    def _remove_be_cores(self, n: float) -> float:
        """Move up to `n` cores from the BE cpuset to the LC job; returns how many moved."""
        before = self.be_cores
        self.be_cores = max(self.be_cores - n, self._min_be_cores())
        return before - self.be_cores

    # ---- the allocation Heracles' state stands for ---------------------------------------------------
    def allocation(self) -> Allocation:
        """The node partition of the current state (module docstring: resources)."""
        caps = self.caps
        assert caps is not None
        top = caps.freq_levels_mhz[-1]
        mem, disk, link = caps.memory_gb, caps.disk_mbps, caps.net_gbps
        be_ways = self.be_ways if self._be_side else 0
        out: dict[str, AppAlloc] = {
            self.lc: AppAlloc(
                self.lc,
                caps.cores - self.be_cores,
                LC_GROUP,
                caps.llc_ways - be_ways,
                LC_CLOS,
                top,
                mem,
                disk,
                link,
            )
        }
        for n in self.lc_as_be:
            out[n] = AppAlloc(
                n, self.be_cores, BE_GROUP, be_ways, BE_CLOS, self._be_freq, mem, disk, self._be_net
            )
        paused = not self.enabled and bool(self.lc_as_be)
        for n in self.be:
            cores, group = (0.0, PAUSED_GROUP) if paused else (self.be_cores, BE_GROUP)
            out[n] = AppAlloc(n, cores, group, be_ways, BE_CLOS, self._be_freq, mem, disk, self._be_net)
        return Allocation.of([out[a.name] for a in caps.apps], caps)

    # ---- one tick --------------------------------------------------------------------------------------
    def _decide(self, obs: Observation) -> Decision:
        caps = self.caps
        assert caps is not None
        t = obs.time_s
        first = self._t0 is None
        if first:
            self._t0 = t
            self._next = {
                "top": t + self.cfg.top_poll_s,
                "core": t + self.cfg.core_mem_cycle_s,
                "power": t + self.cfg.power_cycle_s,
                "net": t,
            }
        lc = obs.app(self.lc)
        self._win_net.append(lc.usage.net_gbps)
        if not first:  # the first interval ran before Heracles' allocation: no use to Alg. 1-3
            self._win_top.append((lc.p99_us, lc.requests, lc.load_frac))
            self._win_core.append(
                _CoreSample(
                    lc.p99_us,
                    lc.requests,
                    obs.mem_bw_gbps,
                    lc.usage.mem_bw_gbps,
                    self._be_perf(obs),
                    lc.load_frac,
                )
            )
            self._win_power.append((obs.power_w, lc.usage.freq_mhz))

        notes: list[str] = []
        if self._due("top", t, self.cfg.top_poll_s):
            self._top_level(t, lc.target_us, notes)
        if self._due("core", t, self.cfg.core_mem_cycle_s):
            self._core_memory(lc.target_us, notes)
        if self._due("power", t, self.cfg.power_cycle_s):
            self._power(notes)
        if self._due("net", t, self.cfg.network_cycle_s):
            self._network(notes)

        alloc = self.allocation()
        reason = "; ".join(notes) or "heracles: hold"
        if alloc == obs.allocation:
            return Decision(None, reason=reason)
        if first:
            reason = "heracles start: BE with 1 core and 10% of the LLC in GROW_LLC (Sec. 4.5); " + reason
        return Decision(alloc, reason=reason)

    def _due(self, key: str, t: float, cycle: float) -> bool:
        if t < self._next[key] - _EPS:
            return False
        self._next[key] = t + cycle
        return True

    def _be_perf(self, obs: Observation) -> float:
        """BE performance F of Alg. 2 (choice 5): BE throughput + LC-as-BE served load fractions."""
        assert self.caps is not None
        perf = sum(b.throughput for b in obs.be if b.name in self.be)
        for s in obs.apps:
            if s.name in self.lc_as_be:
                max_rps = self.caps.app(s.name).max_load_rps
                if math.isfinite(max_rps) and max_rps > 0:
                    perf += s.served_rps / max_rps
        return perf

    # ---- Alg. 1: top-level controller, every 15 s -----------------------------------------------------
    def _top_level(self, t: float, target_us: float, notes: list[str]) -> None:
        win, self._win_top = self._win_top, []
        if not win or not self._be_side:
            return
        weights = [max(n, 1) for _, n, _ in win]
        latency = sum(p * w for (p, _, _), w in zip(win, weights)) / sum(weights)  # choice 3
        load = sum(x for _, _, x in win) / len(win)
        slack = (target_us - latency) / target_us  # Alg. 1 line 4
        cfg = self.cfg
        head = f"top (Alg. 1): slack {slack:.3f}, load {load:.2f}"
        if slack < 0:  # lines 5-7
            self._disable()
            self._cooldown_until = t + cfg.cooldown_s
            notes.append(f"{head} -> disable BE, cool down {cfg.cooldown_s:.0f} s")
            return
        if load > cfg.disable_be_load_above:  # lines 8-9
            if self.enabled:
                self._disable()
                notes.append(f"{head} > {cfg.disable_be_load_above} -> disable BE")
            return
        if not self.enabled:  # lines 10-11 (choice 1)
            if load < cfg.enable_be_load_below and t >= self._cooldown_until - _EPS:
                self._enable()
                notes.append(f"{head} < {cfg.enable_be_load_below} -> enable BE")
            else:
                return
        if slack < cfg.disallow_growth_slack_below:  # lines 12-15
            self._growth = False
            msg = f"{head} -> disallow BE growth"
            if slack < cfg.remove_cores_slack_below:
                assert self.caps is not None
                moved = self._remove_be_cores(cfg.remove_cores_count * self.caps.core_step)
                msg += f", {moved:g} BE cores to LC"
            notes.append(msg)
        else:
            if not self._growth:
                notes.append(f"{head} -> allow BE growth")
            self._growth = True

    # ---- Alg. 2: core & memory sub-controller, every 2 s ----------------------------------------------
    def _lc_bw(self, load: float, cores: float, ways: int, measured: float) -> float:
        """LcBwModel(): the offline model at (load, cores, ways), else the measured LC bandwidth."""
        if self.lc_bw_model is None:
            return measured
        return float(self.lc_bw_model(load, cores, ways))

    def _core_memory(self, target_us: float, notes: list[str]) -> None:
        caps = self.caps
        assert caps is not None
        win, self._win_core = self._win_core, []
        if not win or not self._be_side:
            return
        k = len(win)
        bw = sum(s.total_bw_gbps for s in win) / k  # MeasureDRAMBw()
        lc_measured = sum(s.lc_bw_gbps for s in win) / k
        perf = sum(s.be_perf for s in win) / k
        load = sum(s.load_frac for s in win) / k
        step = caps.core_step

        # Alg. 2 lines 16-21: judge the previous cycle's growth.
        g, self._growth_pending = self._growth_pending, None
        if g is not None:
            self._bw_derivative = bw - g.bw_before_gbps
            if g.kind == "llc" and self.enabled and self.be_ways == g.amount_after:
                if self._bw_derivative >= 0:
                    self.be_ways -= 1  # Rollback()
                    self._phase = GROW_CORES
                    notes.append(
                        f"core/mem (Alg. 2): BE LLC growth raised DRAM bw by {self._bw_derivative:+.2f} GB/s -> rollback, GROW_CORES"
                    )
                    return
                if not perf > g.perf_before + self.cfg.be_benefit_min_gain:
                    self._phase = GROW_CORES
                    notes.append("core/mem (Alg. 2): no BE benefit from LLC growth -> GROW_CORES")
        if not self.enabled:
            return

        lc_cores = caps.cores - self.be_cores
        lc_ways = caps.llc_ways - self.be_ways
        lc_bw = self._lc_bw(load, lc_cores, lc_ways, lc_measured)
        be_bw = max(bw - lc_bw, 0.0)  # BeBw()
        per_core = be_bw / self.be_cores if self.be_cores > 0 else 0.0  # BeBwPerCore()
        limit = self.dram_limit_gbps
        if bw > limit:  # lines 5-8
            overage = bw - limit
            n = math.ceil(overage / per_core / step - _EPS) * step if per_core > 0 else self.be_cores
            moved = self._remove_be_cores(n)
            notes.append(f"core/mem (Alg. 2): DRAM {bw:.1f} > {limit:.1f} GB/s -> {moved:g} BE cores to LC")
            return
        # lines 9-10: CanGrowBE() = the top-level signal and the cycle's LC slack (choice 9)
        weights = [max(s.requests, 1) for s in win]
        latency = sum(s.p99_us * w for s, w in zip(win, weights)) / sum(weights)
        if not self._growth or (target_us - latency) / target_us < self.cfg.disallow_growth_slack_below:
            return
        if self._phase == GROW_LLC:  # lines 11-21
            predicted = self._lc_bw(load, lc_cores, lc_ways - 1, lc_measured) + be_bw + self._bw_derivative
            if predicted > limit or self.be_ways >= self._max_be_ways():
                self._phase = GROW_CORES
                notes.append(
                    f"core/mem (Alg. 2): predicted DRAM {predicted:.1f} GB/s or LLC exhausted -> GROW_CORES"
                )
            else:
                self.be_ways += 1  # GrowCacheForBE()
                self._growth_pending = _Growth("llc", bw, perf, self.be_ways)
                notes.append(f"core/mem (Alg. 2): GROW_LLC -> BE {self.be_ways} ways")
        else:  # lines 22-27
            needed = self._lc_bw(load, lc_cores - step, lc_ways, lc_measured) + be_bw + per_core
            if needed > limit or self.be_cores + step > self._max_be_cores() + _EPS:
                self._phase = GROW_LLC
                notes.append(
                    f"core/mem (Alg. 2): needed DRAM {needed:.1f} GB/s or cores exhausted -> GROW_LLC"
                )
            else:
                self.be_cores += step  # be_cores.Add(1)
                self._growth_pending = _Growth("cores", bw, perf, self.be_cores)
                notes.append(f"core/mem (Alg. 2): GROW_CORES -> BE {self.be_cores:g} cores")

    # ---- Alg. 3: power sub-controller, every 2 s ------------------------------------------------------
    def _power(self, notes: list[str]) -> None:
        caps = self.caps
        assert caps is not None
        win, self._win_power = self._win_power, []
        if not win or not self._be_side or not math.isfinite(caps.tdp_w):
            return
        power = sum(p for p, _ in win) / len(win)  # PollRAPL()
        lc_freq = sum(f for _, f in win) / len(win)  # PollFrequency(ls_cores)
        budget = self.cfg.power_tdp_frac * caps.tdp_w
        new = be_frequency_step(
            caps.freq_levels_mhz, self._be_freq, power, budget, lc_freq < self._guaranteed
        )
        if new < self._be_freq:
            notes.append(
                f"power (Alg. 3): {power:.0f} W > {budget:.0f} W, LC {lc_freq:.0f} MHz -> BE {new} MHz"
            )
        elif new > self._be_freq:
            notes.append(f"power (Alg. 3): {power:.0f} W <= {budget:.0f} W -> BE {new} MHz")
        self._be_freq = new

    # ---- Alg. 4: network sub-controller, every 1 s ----------------------------------------------------
    def _network(self, notes: list[str]) -> None:
        caps = self.caps
        assert caps is not None
        win, self._win_net = self._win_net, []
        if not win or not self._be_side:
            return
        link = caps.net_gbps
        ls_bw = sum(win) / len(win)  # GetLCTxBandwidth()
        headroom = max(self.cfg.net_headroom_link_frac * link, self.cfg.net_headroom_lc_frac * ls_bw)
        be_bw = round(min(max(link - ls_bw - headroom, 0.0), link), 6)
        if abs(be_bw - self._be_net) > _EPS:
            self._be_net = be_bw  # SetBETxBandwidth()
            notes.append(f"net (Alg. 4): LC {ls_bw:.2f} Gbps -> BE limit {be_bw:.2f} Gbps")


def make(
    context: ControllerContext, arg: str | None = None, *, lc_bw_model: LcBwModel | None = None
) -> HeraclesController:
    """Registry factory (`harness.registry`): spec `heracles` (default config) or `heracles:PATH`.
    `lc_bw_model` is the offline LC bandwidth model (Sec. 4.4); without it the measured LC bandwidth
    is used (module docstring). The registry entry may bind one built from `context.sim`'s profile."""
    return HeraclesController(arg or None, lc_bw_model=lc_bw_model)
