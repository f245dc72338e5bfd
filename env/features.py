"""Observation -> fixed-size feature vector: the one featurisation of the project (DESIGN §6.2).

The scalar env (`env.gym_env.NodeEnv`), the vector env (`env.vector_env.NodeVectorEnv`) and, at
serving time, the RL controller all turn an `Observation` into the policy's input with
`ObservationEncoder.encode`, so a policy sees the same numbers in training and in production.

History: `encode(obs, caps, previous=...)` also takes the observation before (the one the last
action was decided on) and reports, per app, what changed since: the sign of the change of each
of its resources (`d_cores` ...: +1 it got more, -1 less, 0 unchanged, whether its own move or
another app's took it) and the change of its log-tardiness (`d_log_tardiness`: < 0 the latency
fell). This is the one step of memory PARTIES' rule needs (Sec. 4.2.3: "if the upsize did not
help, try the next resource"): without it, a policy cannot tell a move that helped from one that
did not, and repeats the useless one. Without a previous observation (the first of an episode)
these are 0.

Layout: `max_apps` blocks of `APP_FEATURES` (one per LC app, in the order of
`Capabilities.lc_apps`, zero-padded with `present = 0` for missing apps), then one block of
`NODE_FEATURES`. Every feature is clipped to its `[low, high]`; a quantity that cannot be measured
(a failed latency feed, a NaN usage, a node without a known TDP) is 0 and, for latency, flagged by
`latency_valid = 0` rather than passed off as a measurement (DESIGN §3).

Two node scales are not in `Capabilities` yet (LLC size in MB and peak memory bandwidth); they
come from `FeatureConfig` and default to the PARTIES platform (Table 1).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from env.types import Allocation, AppAlloc, AppSample, Capabilities, Observation

LOG_TARDINESS_SPAN = 2.0  # log10(p99 / target) in [-2, 2] (1/100x .. 100x the target) maps to [-1, 1]
TARGET_LOG10_SPAN = 7.0  # log10(QoS target in us) in [0, 7] (1 us .. 10 s) maps to [0, 1]


@dataclass(frozen=True)
class FeatureConfig:
    """Node scales that `Capabilities` does not carry (yet), and the sensors the node lacks.

    `llc_mb_total` turns an app's LLC occupancy into a fraction of its partition; `mem_bw_peak_gbps`
    turns memory bandwidth into a fraction of the node's peak. Defaults: PARTIES Table 1 (55 MB
    LLC, ~50 GB/s measured DRAM bandwidth, configs/node/parties.yaml). `unmeasured` names features
    (of `APP_FEATURES` or `NODE_FEATURES`) that are always 0, as a node that cannot measure them
    reports them: a policy trained in simulation for a node without resctrl, cpufreq or RAPL (a VM)
    must not learn from quantities it will never see there.
    """

    llc_mb_total: float = 55.0
    mem_bw_peak_gbps: float = 50.0
    unmeasured: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.llc_mb_total > 0 and self.mem_bw_peak_gbps > 0):
            raise ValueError("features: llc_mb_total and mem_bw_peak_gbps must be positive")
        object.__setattr__(self, "unmeasured", tuple(self.unmeasured))
        known = {f.name for f in (*APP_FEATURES, *NODE_FEATURES)}
        bad = [n for n in self.unmeasured if n not in known]
        if bad:
            raise ValueError(f"features.unmeasured: {bad} are not features; choose from {sorted(known)}")


@dataclass(frozen=True)
class Feature:
    """One entry of the observation vector: its name, bounds and meaning (the docs table)."""

    name: str
    low: float
    high: float
    description: str


APP_FEATURES: tuple[Feature, ...] = (
    Feature("present", 0, 1, "1 if this slot holds an LC app, 0 for padding"),
    Feature("latency_valid", 0, 1, "1 if the p99 sample is a measurement (feed alive), else 0"),
    Feature("slack", -1, 1, "(target - p99) / target, clipped; > 0 means QoS met"),
    Feature("log_tardiness", -1, 1, "log10(p99 / target) / 2, clipped: 0 at the target, 1 at 100x"),
    Feature("load", 0, 2, "offered load / max load (PARTIES Table 2), clipped"),
    Feature("drop_frac", 0, 1, "dropped / offered requests"),
    Feature("cpu_util", 0, 1, "busy fraction of the app's cores"),
    Feature("llc_occupancy", 0, 1, "LLC MB used / MB of the app's ways"),
    Feature("mem_bw", 0, 1, "memory bandwidth used / node peak"),
    Feature("memory_used", 0, 1.5, "resident memory / memory limit"),
    Feature("disk_used", 0, 1.5, "disk bandwidth used / disk limit"),
    Feature("net_used", 0, 1.5, "network bandwidth used / network limit"),
    Feature("freq_achieved", 0, 1, "achieved core frequency / highest level (turbo)"),
    Feature("cores", 0, 1, "allocated cores / node cores"),
    Feature("llc_ways", 0, 1, "allocated LLC ways / node ways"),
    Feature("freq_level", 0, 1, "index of the frequency cap in the node's levels / (levels - 1)"),
    Feature("memory", 0, 1, "memory limit / node memory"),
    Feature("disk", 0, 1, "disk limit / node disk bandwidth"),
    Feature("net", 0, 1, "network limit / node network bandwidth"),
    Feature(
        "d_log_tardiness", -1, 1, "log_tardiness minus the previous observation's (0 if either is invalid)"
    ),
    Feature("d_cores", -1, 1, "sign of the change of cores since the previous observation"),
    Feature("d_llc_ways", -1, 1, "sign of the change of LLC ways since the previous observation"),
    Feature("d_freq_level", -1, 1, "sign of the change of the frequency cap since the previous observation"),
    Feature("d_memory", -1, 1, "sign of the change of the memory limit since the previous observation"),
    Feature("d_disk", -1, 1, "sign of the change of the disk limit since the previous observation"),
    Feature(
        "qos_target",
        0,
        1,
        "log10(QoS target in us) / 7, clipped: which kind of service the slot holds (0.40 at 600 us, 0.91 at 2.5 s)",
    ),
)

NODE_FEATURES: tuple[Feature, ...] = (
    Feature("obs_valid", 0, 1, "1 if the whole observation is valid and fresh (stale_s = 0)"),
    Feature("mem_bw", 0, 1, "node memory bandwidth / node peak"),
    Feature("power", 0, 1.5, "socket power / TDP (0 if the TDP is unknown)"),
    Feature("be_throughput", 0, 1.5, "BE throughput, normalised to the BE job alone on the node"),
    Feature("be_present", 0, 1, "1 if the node runs a BE job"),
    Feature("be_cores", 0, 1, "cores of the BE jobs' core groups / node cores"),
    Feature("be_llc_ways", 0, 1, "LLC ways of the BE jobs' CLOSes / node ways"),
    Feature("be_freq_level", 0, 1, "BE frequency level index / (levels - 1)"),
    Feature("be_memory", 0, 1, "BE memory limits / node memory"),
    Feature("be_disk", 0, 1, "BE disk limits / node disk bandwidth"),
    Feature("idle_cores", 0, 1, "cores held by nobody / node cores"),
    Feature("idle_llc_ways", 0, 1, "LLC ways in no CLOS / node ways"),
    Feature("idle_memory", 0, 1, "memory under no limit / node memory"),
    Feature("idle_disk", 0, 1, "disk bandwidth under no limit / node disk bandwidth"),
)

N_APP_FEATURES = len(APP_FEATURES)
N_NODE_FEATURES = len(NODE_FEATURES)
_A = {f.name: i for i, f in enumerate(APP_FEATURES)}
_N = {f.name: i for i, f in enumerate(NODE_FEATURES)}


def feature_table() -> str:
    """The Markdown table of every feature (the env docstring carries the same table)."""
    rows = ["| index | feature | range | meaning |", "|---|---|---|---|"]
    for i, f in enumerate(APP_FEATURES):
        rows.append(
            f"| {i} + {N_APP_FEATURES} * k | app[k].{f.name} | [{f.low:g}, {f.high:g}] | {f.description} |"
        )
    for i, f in enumerate(NODE_FEATURES):
        rows.append(
            f"| {N_APP_FEATURES} * max_apps + {i} | node.{f.name} | [{f.low:g}, {f.high:g}] | {f.description} |"
        )
    return "\n".join(rows)


def _ratio(num: float, den: float) -> float:
    """num / den for usage ratios; an empty allocation that is used counts as saturated."""
    if den > 0:
        return num / den
    return 1.0 if num > 0 else 0.0


def _freq_level(caps: Capabilities, freq_mhz: int) -> float:
    levels = caps.freq_levels_mhz
    if len(levels) < 2:
        return 1.0
    i = bisect.bisect_left(levels, freq_mhz)  # levels ascend (Capabilities)
    return min(i, len(levels) - 1) / (len(levels) - 1)


def _sign(after: float, before: float) -> float:
    return float(after > before) - float(after < before)


def _log_tardiness(s: AppSample | None) -> float | None:
    """log10(p99 / target) / LOG_TARDINESS_SPAN of a measured sample, else None."""
    if s is not None and s.valid and math.isfinite(s.p99_us) and s.p99_us > 0 and s.target_us > 0:
        return math.log10(s.p99_us / s.target_us) / LOG_TARDINESS_SPAN
    return None


def _log_target(target_us: float) -> float:
    """The QoS target on a log scale (1 us .. 10 s -> 0 .. 1): the one thing PARTIES knows of an app
    beforehand (Sec. 4.3), and enough to tell the kinds of service apart (their targets span 600 us
    to 2.5 s, Table 2); 0 when the target is unknown."""
    if math.isfinite(target_us) and target_us > 1.0:
        return math.log10(target_us) / TARGET_LOG10_SPAN
    return 0.0


def _be_allocs(alloc: Allocation, caps: Capabilities) -> list[AppAlloc]:
    return [alloc[b.name] for b in caps.be_apps if b.name in alloc]


class ObservationEncoder:
    """Encodes `Observation`s of a node with up to `max_apps` LC apps into float32 vectors.

    `encode(obs, caps, out, previous)` returns (or fills `out` with) a vector of `size` features
    laid out as in the module docstring (`previous`: the observation before, for the history
    features; None at the start of an episode); `space` is the matching `gymnasium.spaces.Box`. `names` labels each
    entry (`app3.slack`, `node.power`) for logging and tests.
    """

    def __init__(self, max_apps: int, config: FeatureConfig | None = None) -> None:
        if max_apps < 1:
            raise ValueError(f"max_apps must be >= 1, got {max_apps}")
        self.max_apps = max_apps
        self.config = config or FeatureConfig()
        self.size = N_APP_FEATURES * max_apps + N_NODE_FEATURES
        app_low = np.array([f.low for f in APP_FEATURES], dtype=np.float32)
        app_high = np.array([f.high for f in APP_FEATURES], dtype=np.float32)
        node_low = np.array([f.low for f in NODE_FEATURES], dtype=np.float32)
        node_high = np.array([f.high for f in NODE_FEATURES], dtype=np.float32)
        self.low = np.concatenate([np.tile(app_low, max_apps), node_low])
        self.high = np.concatenate([np.tile(app_high, max_apps), node_high])
        self.names = tuple(f"app{k}.{f.name}" for k in range(max_apps) for f in APP_FEATURES) + tuple(
            f"node.{f.name}" for f in NODE_FEATURES
        )
        gone = set(self.config.unmeasured)
        self._measured = np.array([n.split(".", 1)[1] not in gone for n in self.names])

    @property
    def space(self) -> spaces.Box:
        return spaces.Box(self.low, self.high, shape=(self.size,), dtype=np.float32)

    def index(self, name: str) -> int:
        """Position of a named feature, e.g. `index("app0.slack")`."""
        return self.names.index(name)

    def split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(per-app block of shape (..., max_apps, N_APP_FEATURES), node block (..., N_NODE_FEATURES))."""
        cut = N_APP_FEATURES * self.max_apps
        apps = x[..., :cut].reshape(*x.shape[:-1], self.max_apps, N_APP_FEATURES)
        return apps, x[..., cut:]

    def encode(
        self,
        obs: Observation,
        caps: Capabilities,
        out: np.ndarray | None = None,
        previous: Observation | None = None,
    ) -> np.ndarray:
        lc = caps.lc_apps
        if len(lc) > self.max_apps:
            raise ValueError(
                f"the node runs {len(lc)} LC apps but the features hold max_apps={self.max_apps}; raise max_apps"
            )
        x = np.zeros(self.size, dtype=np.float64)
        apps, node = self.split(x)
        alloc = obs.allocation
        samples = {s.name: s for s in obs.apps}
        before = {s.name: s for s in previous.apps} if previous is not None else {}
        top_mhz = caps.freq_levels_mhz[-1]
        mb_per_way = self.config.llc_mb_total / caps.llc_ways
        peak_bw = self.config.mem_bw_peak_gbps
        rows: list[list[float]] = []  # filled as lists, written into `apps` at once: faster than per item
        for spec in lc:
            row = [0.0] * N_APP_FEATURES
            rows.append(row)
            a = alloc[spec.name]
            row[_A["present"]] = 1.0
            row[_A["cores"]] = a.cores / caps.cores
            row[_A["llc_ways"]] = a.llc_ways / caps.llc_ways
            row[_A["freq_level"]] = _freq_level(caps, a.freq_mhz)
            row[_A["memory"]] = a.memory_gb / caps.memory_gb
            row[_A["disk"]] = a.disk_mbps / caps.disk_mbps
            row[_A["net"]] = a.net_gbps / caps.net_gbps
            row[_A["qos_target"]] = _log_target(spec.qos_target_us)
            if previous is not None and spec.name in previous.allocation:
                b = previous.allocation[spec.name]
                row[_A["d_cores"]] = _sign(a.cores, b.cores)
                row[_A["d_llc_ways"]] = _sign(a.llc_ways, b.llc_ways)
                row[_A["d_freq_level"]] = _sign(a.freq_mhz, b.freq_mhz)
                row[_A["d_memory"]] = _sign(a.memory_gb, b.memory_gb)
                row[_A["d_disk"]] = _sign(a.disk_mbps, b.disk_mbps)
            s = samples.get(spec.name)
            if s is None:
                continue
            tardiness = _log_tardiness(s)
            if tardiness is not None:
                row[_A["latency_valid"]] = 1.0
                row[_A["slack"]] = s.slack
                row[_A["log_tardiness"]] = tardiness
                earlier = _log_tardiness(before.get(spec.name))
                if earlier is not None:
                    row[_A["d_log_tardiness"]] = tardiness - earlier
            row[_A["load"]] = s.load_frac
            row[_A["drop_frac"]] = _ratio(s.dropped_rps, s.load_rps) if s.load_rps > 0 else 0.0
            u = s.usage
            row[_A["cpu_util"]] = u.cpu_util
            row[_A["llc_occupancy"]] = _ratio(u.llc_mb, a.llc_ways * mb_per_way)
            row[_A["mem_bw"]] = u.mem_bw_gbps / peak_bw
            row[_A["memory_used"]] = _ratio(u.memory_gb, a.memory_gb)
            row[_A["disk_used"]] = _ratio(u.disk_mbps, a.disk_mbps)
            row[_A["net_used"]] = _ratio(u.net_gbps, a.net_gbps)
            row[_A["freq_achieved"]] = u.freq_mhz / top_mhz
        if rows:
            apps[: len(rows)] = rows
        node[_N["obs_valid"]] = float(obs.valid and obs.stale_s == 0)
        node[_N["mem_bw"]] = obs.mem_bw_gbps / peak_bw
        node[_N["power"]] = obs.power_w / caps.tdp_w if math.isfinite(caps.tdp_w) and caps.tdp_w > 0 else 0.0
        node[_N["be_throughput"]] = obs.be_throughput
        be = _be_allocs(alloc, caps)
        if be:
            node[_N["be_present"]] = 1.0
            node[_N["be_cores"]] = sum({b.core_group: b.cores for b in be}.values()) / caps.cores
            node[_N["be_llc_ways"]] = sum({b.clos: b.llc_ways for b in be}.values()) / caps.llc_ways
            node[_N["be_freq_level"]] = _freq_level(caps, be[0].freq_mhz)
            node[_N["be_memory"]] = sum(b.memory_gb for b in be) / caps.memory_gb
            node[_N["be_disk"]] = sum(b.disk_mbps for b in be) / caps.disk_mbps
        node[_N["idle_cores"]] = alloc.idle_cores / caps.cores
        node[_N["idle_llc_ways"]] = alloc.idle_llc_ways / caps.llc_ways
        node[_N["idle_memory"]] = alloc.idle_memory_gb / caps.memory_gb
        node[_N["idle_disk"]] = alloc.idle_disk_mbps / caps.disk_mbps
        np.nan_to_num(
            x,
            copy=False,
            nan=0.0,
            posinf=float(np.finfo(np.float32).max),
            neginf=float(np.finfo(np.float32).min),
        )
        np.clip(x, self.low, self.high, out=x)
        x *= self._measured
        if out is None:
            return x.astype(np.float32)
        out[:] = x
        return out
