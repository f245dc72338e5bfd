"""Bring your own service: profile an app on a real node into the simulator (`python -m hw.profile`).

The simulator's six app profiles are fitted to the papers' tables on their Xeon. This module makes
a profile (and a node file) for *your* service on *your* node, from measurements, with the same
fitting code the calibration uses (`env.sim.fit.fit_measured`: differential evolution, analytic
steady states of the same kernel).

1. **Probe.** The service alone on the whole node at a light load (`probe_rps`), then at a tenth
   of the capacity that suggests: its CPU time per request (the cgroup's CPU time over the requests
   sent), hence its capacity on the node (cores / CPU time per request) and its service time in
   the simulator (not fitted: measured); its resident memory.
2. **Plan.** `n_rates` request rates, geometrically spaced over `load_range` (fractions of that
   capacity; at most what the load generator sustains), times CPU quotas (cores), as two
   interleaved sub-grids: even-indexed rates x even-indexed quotas are fitted, odd x odd are held
   out, so that neither the rate nor the quota of a held-out point is used by the fit (with odd
   counts the fit spans both ends, and every held-out point lies between fitted ones). A point whose CPU demand (rate x CPU time per request)
   exceeds `max_quota_load` of its quota is left out: an overloaded service's p99 is the load
   generator's timeout, not a property of the service. With `be_threads`, every planned rate also
   runs beside `stress-ng --cpu N` in a BE cgroup holding the cores the service's quota leaves (and
   beside it unmanaged), which fits the node's scheduling wake-up delay. Every point is measured
   `passes` times, passes and rates in a seeded shuffled order, so that a burst of the machine's
   other work lands in few of a point's intervals; a point's p99 is the median of all its 500 ms
   interval p99s (with the quartiles). The QoS target, unless given, is `TARGET_X` times that p99
   at the lightest rate on the whole node, and at least `TARGET_MIN_US` (the rule of the real-node
   experiments, tests/hw/test_real_experiments.py).
3. **Measure** (`LinuxBench`): a `LinuxNode` in CPU-quota mode holds the service's processes (or
   cgroup) and the BE job and sets each quota (read back from `cpu.cfs_quota_us`); the open-loop
   load generator (`hw.loadgen` under SCHED_FIFO, `--target`) or your own (`--load-cmd`, publishing
   to the latency feed file it is given, `hw.feed`) drives it; every interval's latency histogram
   is kept (merged per point: the window p99 beside the median interval p99). A generator that
   publishes its own schedule lag (`hw.loadgen` does) marks a point whose median lag p99 is over
   5 ms and a quarter of its p99 generator-bound (`hw.sweep.generator_bound`): its latency is the generator's
   lateness (a rate this machine's generator does not keep, or a busy machine), so it is left out of
   the fit and of the error summaries and listed in the report.
4. **Fit** (`FITTED_APP`, `node_params`): the profile's max load (its service time: the knee of
   PARTIES Sec. 3.2 on the whole node), fixed latency (loopback, client), service variability, and
   the node's stranded CFS runtime (plus its wake-up delay with a co-runner) to the fitted half.
   Not fitted: the wait behind a co-runner resuming from CFS throttling (`cfs_resume_wait_ms`,
   `env.sim.model` step 1), half Linux's default slice for the node's CPUs (`linux_base_slice_ms`)
   unless the platform file it starts from gives one.
   The service is modelled as CPU-bound: memory, LLC and DRAM are not in the plan (this node has no
   CAT/MBA, and a few-MB service does not notice a memory limit), its resident memory is its data set.
5. **Write.** `configs/apps/NAME.yaml` and `configs/node/NAME.yaml` (the platform it was measured
   on, in quota mode, with the node's knobs and fitted fields), both checked by loading them back
   and written together at the end, never half; and the report in `--out DIR` (staged, moved into
   place when complete): `profile.json` (plan, machine, every point measured and simulated, the
   merged histograms), `report.md` (the table, fit and held-out errors) and `profile.png`.

    python -m hw.profile --service memcached --name memcached-vm --out /tmp/profile-mc
    python -m hw.profile --pid 1234 --target http://127.0.0.1:8080/ --threads 4 --name web --out out/web
    python -m hw.profile --from-measurements /tmp/profile-mc/profile.json --name memcached-vm --out /tmp/refit

Exit status: 0 done, 1 the node failed (not root, a cgroup, the service or the generator failed),
2 bad input (arguments, names, existing files, a budget the plan does not fit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import yaml

from env.allocations import unmanaged_allocation
from env.config import CONFIGS, ConfigError, build, plain_data, run_cli
from env.histogram import LatencyHistogram, merge
from env.outdir import check_out, staged_output
from env.sim.fit import MeasuredPoint, Param, fit_measured, simulate_points
from env.sim.platform import Platform, load_platform
from env.sim.profiles import LcProfile, Reference
from hw.sweep import (
    GENERATOR_BOUND_FRAC,
    GENERATOR_BOUND_MIN_LAG_US,
    LoadgenProcess,
    floats_arg,
    free_port,
    generator_bound,
    median_lag_us,
    read_readings,
    start_be_in,
    start_memcached,
    start_nginx,
    stop_be,
    stop_process,
)

TARGET_X = 3.0  # QoS target = TARGET_X x the p99 alone at the probe's light load ...
TARGET_MIN_US = 1000.0  # ... and at least this (tests/hw/test_real_experiments.py)
MARKER = "written by `python -m hw.profile`"  # a file without it is never overwritten
QUOTA_RESOLUTION_CORES = 0.01  # quotas are set in hundredths of a core
GENERATOR_START_S = 3.0  # a generator's start and warm-up, for the time estimate
FIT_ESTIMATE_S = 60.0  # the fit's share of the time estimate (its budget is what is left)
BUSY_LOAD_PER_CPU = 0.5  # 1-minute load average per CPU before measuring above which the node is busy
MIN_POINTS_PER_HALF = 3  # measured points alone in each half (fitted, held out), at least
Progress = Callable[[str], None]
Role = Literal["fit", "heldout"]


# ---- the plan ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanConfig:
    """The measurement plan (module docstring, step 2). Rates span `load_range` of the probed
    capacity in `n_rates` steps unless `rates_rps` are given; quotas in cores (multiples of 0.01);
    times in s."""

    load_range: tuple[float, float] = (0.02, 0.45)
    n_rates: int = 9
    rates_rps: tuple[float, ...] = ()
    quotas_cores: tuple[float, ...] = (0.1, 0.15, 0.21, 0.31, 0.45, 0.65, 0.95, 1.38, 2.0)
    # hw.loadgen sustains 30k rps on the project's VM, but under SCHED_FIFO its own CPU time (~25 us
    # per request) then takes a core from the service it measures: at most this much keeps it small
    max_rate_rps: float = 12_000.0
    max_quota_load: float = 0.9
    be_threads: int = 0
    measure_s: float = 5.0
    settle_s: float = 1.5
    passes: int = 2
    probe_rps: float = 200.0
    probe_s: float = 6.0
    seed: int = 0

    def __post_init__(self) -> None:
        where = "profile plan"
        lo, hi = self.load_range
        if not (0 < lo < hi <= 1.0):
            raise ConfigError(
                f"{where}: load_range must be two fractions of the capacity, 0 < low < high <= 1"
            )
        if len(self.rates_rps or range(self.n_rates)) < 2 or len(self.quotas_cores) < 2:
            raise ConfigError(f"{where}: needs at least 2 rates and 2 quotas (one of each half)")
        if any(not (x > 0 and math.isfinite(x)) for x in (*self.rates_rps, *self.quotas_cores)):
            raise ConfigError(f"{where}: rates and quotas must be positive numbers")
        for q in self.quotas_cores:
            if abs(q / QUOTA_RESOLUTION_CORES - round(q / QUOTA_RESOLUTION_CORES)) > 1e-6:
                raise ConfigError(f"{where}: quota {q:g} is not a multiple of {QUOTA_RESOLUTION_CORES} core")
        if not (0 < self.max_quota_load <= 1.0):
            raise ConfigError(f"{where}: max_quota_load must be in (0, 1]")
        if not (self.measure_s >= 1.0 and self.settle_s >= 0.0 and self.probe_s >= 1.0):
            raise ConfigError(f"{where}: measure_s and probe_s must be >= 1 s, settle_s >= 0")
        if not (1 <= self.passes <= 20 and 0 <= self.be_threads <= 256):
            raise ConfigError(f"{where}: passes must be in 1..20, be_threads in 0..256")
        if not (self.probe_rps > 0 and self.max_rate_rps > 0):
            raise ConfigError(f"{where}: probe_rps and max_rate_rps must be positive")


@dataclass(frozen=True)
class PlannedPoint:
    """One operating point to measure: rate, the service's quota (cores; the whole node = none),
    the co-runner's threads and quota (0 threads: none), and which half it belongs to."""

    rate_rps: float
    quota_cores: float
    role: Role
    be_threads: int = 0
    be_quota_cores: float = 0.0

    @property
    def key(self) -> tuple[float, float, int, float]:
        return (self.rate_rps, self.quota_cores, self.be_threads, self.be_quota_cores)

    def label(self) -> str:
        be = f" + {self.be_threads} BE threads @ {self.be_quota_cores:g}" if self.be_threads else ""
        return f"{self.rate_rps:8.0f} rps  quota {self.quota_cores:5.2f}{be}"


@dataclass(frozen=True)
class Probe:
    """The service alone on the whole node at a light load (module docstring, step 1)."""

    cores: float
    rate_rps: float
    cpu_s_per_request: float
    p99_us: float
    memory_gb: float

    @property
    def capacity_rps(self) -> float:
        """Requests per second its CPU time per request allows on the whole node."""
        return self.cores / self.cpu_s_per_request


def plan_points(cfg: PlanConfig, probe: Probe) -> tuple[list[PlannedPoint], list[str]]:
    """The points to measure (module docstring, step 2) and a note per point left out."""
    lo, hi = (f * probe.capacity_rps for f in cfg.load_range)
    hi = min(hi, cfg.max_rate_rps)
    spread = tuple(round(float(r), 1) for r in np.geomspace(min(lo, hi / 2), hi, cfg.n_rates))
    rates = tuple(sorted(set(cfg.rates_rps or spread)))
    quotas = tuple(sorted({round(min(q, probe.cores), 2) for q in cfg.quotas_cores}))
    if len(rates) < 2 or len(quotas) < 2:
        raise ConfigError(
            f"profile plan: {len(rates)} distinct rates and {len(quotas)} quotas within the node's "
            f"{probe.cores:g} cores and the generator's {cfg.max_rate_rps:g} rps; need 2 of each"
        )
    points: list[PlannedPoint] = []
    skipped: list[str] = []
    for parity, role in ((0, "fit"), (1, "heldout")):
        sub_rates, sub_quotas = rates[parity::2], quotas[parity::2]
        for rate in sub_rates:
            demand = rate * probe.cpu_s_per_request
            for q in sub_quotas:
                if demand > cfg.max_quota_load * q:
                    skipped.append(f"{rate:g} rps at quota {q:g}: demand {demand:.2f} cores")
                    continue
                points.append(PlannedPoint(rate, q, role))  # type: ignore[arg-type]
            if cfg.be_threads:
                mid = [q for q in sub_quotas if demand <= cfg.max_quota_load * q and q < probe.cores]
                for q in ([mid[len(mid) // 2]] if mid else []) + [probe.cores]:
                    rest = 0.0 if q >= probe.cores else round(probe.cores - q, 2)
                    points.append(PlannedPoint(rate, q, role, cfg.be_threads, rest))  # type: ignore[arg-type]
    for role in ("fit", "heldout"):
        n = sum(p.role == role and not p.be_threads for p in points)
        if n < MIN_POINTS_PER_HALF:
            raise ConfigError(
                f"profile plan: {n} {role} points where the service is not overloaded (at least "
                f"{MIN_POINTS_PER_HALF}; left out: {'; '.join(skipped) or 'none'}): give a lower --load-range, "
                "larger --quotas, or more of them"
            )
    return points, skipped


def schedule(points: Sequence[PlannedPoint], passes: int, seed: int) -> list[list[PlannedPoint]]:
    """Runs of points sharing one rate (one generator each), `passes` times over, in a seeded
    shuffled order of rates and of points within a rate (module docstring, step 2)."""
    rng = np.random.default_rng(seed)
    runs: list[list[PlannedPoint]] = []
    rates = sorted({p.rate_rps for p in points})
    for _ in range(passes):
        for i in rng.permutation(len(rates)):
            run = [p for p in points if p.rate_rps == rates[i]]
            runs.append([run[j] for j in rng.permutation(len(run))])
    return runs


def estimate_s(cfg: PlanConfig, runs: Sequence[Sequence[PlannedPoint]]) -> float:
    """Seconds the measurements take (generators' start-up included) plus the fit's share."""
    n = sum(len(r) for r in runs)
    return len(runs) * GENERATOR_START_S + n * (cfg.settle_s + cfg.measure_s) + FIT_ESTIMATE_S


def fit_budget(cfg: PlanConfig, n_points: int, n_rates: int, budget_s: float | None) -> PlanConfig:
    """The plan with as many passes as fit in `budget_s` (at least 1), or a ConfigError saying what
    the plan needs when one pass does not fit."""
    if budget_s is None:
        return cfg
    probe = 2 * (cfg.probe_s + GENERATOR_START_S)
    one = n_rates * GENERATOR_START_S + n_points * (cfg.settle_s + cfg.measure_s)
    passes = min(cfg.passes, int((budget_s - probe - FIT_ESTIMATE_S) // one))
    if passes < 1:
        raise ConfigError(
            f"--budget {budget_s / 60:.1f} min: one pass of the plan ({n_points} points) needs about "
            f"{(probe + one + FIT_ESTIMATE_S) / 60:.1f} min; raise --budget, or give fewer --n-rates/--quotas "
            "or a shorter --measure-s"
        )
    return dataclasses.replace(cfg, passes=passes)


# ---- measurements -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One measured window: the interval p99s (us), their histograms merged, the service's CPU use
    (cores), the requests sent (per second), the machine's other work meanwhile (cores: CPU
    time at normal priority neither the service nor the BE job used - the load generator, other
    tenants - and the vCPUs' steal time), and the generator's schedule lag p99 of each interval
    (us; () when the generator does not publish it)."""

    p99s_us: tuple[float, ...]
    histogram: LatencyHistogram
    cpu_cores: float
    sent_rps: float
    background_cores: float = 0.0
    lag_p99s_us: tuple[float, ...] = ()


class Bench(Protocol):
    """Where a service is measured: `hw.profile.LinuxBench` on this machine, a synthetic service in
    the tests (tests/fakes.py)."""

    @property
    def cores(self) -> float: ...  # the node's CPUs

    @property
    def cfs_period_ms(self) -> float: ...

    @property
    def cfs_slice_ms(self) -> float: ...  # the kernel's CFS bandwidth slice

    def memory_gb(self) -> float: ...  # the service's resident memory

    def measure(self, point: PlannedPoint, settle_s: float, measure_s: float) -> Window: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Measured:
    """A planned point and what its windows measured, pooled over the passes."""

    point: PlannedPoint
    p99s_us: tuple[float, ...]
    histogram: LatencyHistogram
    cpu_cores: tuple[float, ...]
    background_cores: tuple[float, ...] = ()
    lag_p99s_us: tuple[float, ...] = ()

    @property
    def lag_p99_us(self) -> float:
        """The generator's schedule lag, median of its interval p99s (us); NaN when not published."""
        return median_lag_us(self.lag_p99s_us)

    @property
    def generator_bound(self) -> bool:
        """The generator's lateness is a large part of the p99 (module docstring, step 3)."""
        return generator_bound(self.lag_p99_us, self.p99_us)

    @property
    def background(self) -> float:
        """The machine's other work during the point's windows, median (cores); NaN when it was not
        measured (a profile.json of an earlier version)."""
        return float(np.median(self.background_cores)) if self.background_cores else math.nan

    @property
    def p99_us(self) -> float:
        """The median interval p99 (module docstring, step 2)."""
        return float(np.median(self.p99s_us)) if self.p99s_us else math.nan

    def quartiles_us(self) -> tuple[float, float]:
        if not self.p99s_us:
            return math.nan, math.nan
        q25, q75 = np.percentile(self.p99s_us, [25, 75])
        return float(q25), float(q75)

    def as_point(self) -> MeasuredPoint:
        p = self.point
        return MeasuredPoint(p.rate_rps, p.quota_cores, self.p99_us, p.be_threads, p.be_quota_cores)


def measure_plan(
    bench: Bench, cfg: PlanConfig, runs: Sequence[Sequence[PlannedPoint]], progress: Progress
) -> list[Measured]:
    """Every run of the schedule on `bench`, pooled per point; a progress line per window with the
    time left."""
    pooled: dict[tuple, list[Window]] = {}
    total = sum(len(r) for r in runs)
    t0 = time.monotonic()
    for run in runs:
        for point in run:
            w = bench.measure(point, cfg.settle_s, cfg.measure_s)
            pooled.setdefault(point.key, []).append(w)
            done = sum(len(ws) for ws in pooled.values())
            p99 = statistics.median(w.p99s_us) if w.p99s_us else math.nan
            lag_us = median_lag_us(w.lag_p99s_us)
            lag = "" if math.isnan(lag_us) else f", generator lag p99 {lag_us:.0f} us"
            if generator_bound(lag_us, p99):
                lag += " GENERATOR-BOUND"
            left = (time.monotonic() - t0) / done * (total - done)
            progress(
                f"[{done:3d}/{total}] {point.label()}: p99 {p99:9.0f} us ({len(w.p99s_us)} intervals, "
                f"{w.cpu_cores:.2f} cores, other work {w.background_cores:.2f}{lag})  {_duration(left)} left"
            )
    points = {p.key: p for run in runs for p in run}
    out = [
        Measured(
            points[k],
            tuple(x for w in ws for x in w.p99s_us),
            merge(w.histogram for w in ws),
            tuple(w.cpu_cores for w in ws),
            tuple(w.background_cores for w in ws),
            tuple(x for w in ws for x in w.lag_p99s_us),
        )
        for k, ws in pooled.items()
    ]
    return sorted(out, key=_order)


def _order(m: Measured) -> tuple:
    p = m.point
    return (p.role != "fit", p.be_threads, p.rate_rps, p.quota_cores, p.be_quota_cores)


def probe_service(bench: Bench, cfg: PlanConfig, progress: Progress) -> Probe:
    """Step 1 of the module docstring: the p99 at `probe_rps`, and the CPU time per request at
    `PROBE_BUSY_FRAC` of the capacity that suggests (a service's CPU time per request falls as
    its load grows and it batches its work: memcached's by half from 200 to 4000 rps here)."""
    light = _probe_window(bench, cfg.probe_rps, cfg, progress)
    cpu = light.cpu_cores / light.sent_rps
    busy_rps = round(min(PROBE_BUSY_FRAC * bench.cores / cpu, cfg.max_rate_rps), 1)
    if busy_rps > 2 * cfg.probe_rps:
        busy = _probe_window(bench, busy_rps, cfg, progress)
        cpu = busy.cpu_cores / busy.sent_rps
    probe = Probe(bench.cores, cfg.probe_rps, cpu, statistics.median(light.p99s_us), bench.memory_gb())
    progress(
        f"probe: {probe.cpu_s_per_request * 1e6:.1f} us of CPU per request (capacity ~{probe.capacity_rps:.0f} rps "
        f"on {probe.cores:g} cores), p99 {probe.p99_us:.0f} us at {cfg.probe_rps:g} rps, "
        f"{probe.memory_gb * 1024:.0f} MB resident"
    )
    return probe


PROBE_BUSY_FRAC = 0.1


def _probe_window(bench: Bench, rate: float, cfg: PlanConfig, progress: Progress) -> Window:
    progress(f"probe: {rate:g} rps on the whole node for {cfg.probe_s:g} s")
    w = bench.measure(PlannedPoint(rate, bench.cores, "fit"), cfg.settle_s, cfg.probe_s)
    if not w.p99s_us:
        raise RuntimeError("the probe measured no interval: the service answered no request (is it up?)")
    if not (w.sent_rps > 0 and w.cpu_cores > 0):
        raise RuntimeError(
            f"the probe saw {w.sent_rps:.0f} rps sent and {w.cpu_cores:.3f} cores used: the load did not "
            "reach the service's processes"
        )
    return w


# ---- the fit ----------------------------------------------------------------------------------------
FITTED_APP = ("base_latency_us", "service_cv2", "service_det")


def app_params(probe: Probe, target_us: float) -> tuple[Param, ...]:
    """Search ranges of the profile's fitted fields (`FITTED_APP`): fixed latency below the target
    (the knee must be reachable), variability. Its service time is not fitted: it is the CPU time
    per request the probe measured, and its max load the knee that gives (`fit_measured`)."""
    return (
        Param("base_latency_us", 5.0, 0.8 * target_us, log=True),
        Param("service_cv2", 0.2, 30.0, log=True),
        Param("service_det", 0.0, 0.95),
    )


def node_params(with_be: bool, cfs_slice_ms: float) -> tuple[Param, ...]:
    """The node's fitted fields: the quota stranded per further CPU (at most one CFS runtime slice)
    and, with co-runner points, the scheduler's wake-up delay behind a CPU hog."""
    out: tuple[Param, ...] = (Param("cfs_stranded_ms", 0.0, cfs_slice_ms, on="node"),)
    if with_be:
        out += (Param("sched_wakeup_delay_ms", 0.05, 20.0, log=True, on="node"),)
    return out


@dataclass(frozen=True)
class ServiceInfo:
    """What the user says about the service: its deployment (worker threads, queue discipline) and
    a description."""

    threads: int
    queue: Literal["per_thread", "shared"]
    description: str

    def __post_init__(self) -> None:
        if not 1 <= self.threads <= 4096:
            raise ConfigError(f"--threads {self.threads}: must be in 1..4096")


def base_profile(name: str, info: ServiceInfo, probe: Probe, target_us: float, reference: str) -> LcProfile:
    """The profile before the fit: deployment from `info`, QoS target, modelled as CPU-bound with its
    resident memory as its data set (module docstring, step 4); its knee is on `reference`."""
    gb = max(probe.memory_gb, 1e-3)
    return LcProfile(
        name=name, description=info.description, qos_target_us=round(target_us, 1),
        max_load_rps=probe.capacity_rps, threads=info.threads, queue=info.queue, frac_llc=0.0,
        frac_mem=0.0, smt_speed=1.0, base_latency_us=probe.p99_us / 2, llc_kappa_mb=1.0,
        llc_miss_min=0.0, llc_accesses_per_req=0.0, dram_bytes_per_req=0.0, dataset_gb=round(gb, 4),
        zipf=0.9, pages_per_req=0.0, io_kb=4.0, net_bytes_per_req=0.0, memory_gb=round(gb, 4),
        in_memory=True, threads_follow_cores=False, reference=Reference(reference, int(probe.cores)),
        source=f"{MARKER} on {os.uname().nodename}",
    )  # fmt: skip


def base_platform(
    base: Platform, name: str, bench_cores: float, knobs: tuple[str, ...], quota_step: float, period_ms: float
) -> Platform:
    """The node file before the fit: `base` (the platform this machine is) in CPU-quota mode."""
    if abs(base.cores - bench_cores) > 1e-9:
        raise ConfigError(
            f"--platform {base.name} describes {base.cores} cores, this node has {bench_cores:g}: give the "
            "platform file of this machine (configs/node/*.yaml)"
        )
    return dataclasses.replace(
        base, name=name, description=f"{base.description}; CPU-quota mode, fitted to measurements",
        core_mode="quota", quota_step_cores=quota_step, cfs_period_ms=period_ms, knobs=knobs,
        cfs_resume_wait_ms=base.cfs_resume_wait_ms or linux_base_slice_ms(bench_cores) / 2.0,
        source=f"{MARKER} from {base.name} ({base.source})", fitted=(),
    )  # fmt: skip


def linux_base_slice_ms(cpus: float) -> float:
    """Linux's default scheduler slice on `cpus` CPUs: 0.75 ms x (1 + log2 min(cpus, 8))
    (`sysctl_sched_base_slice` scaled by SCHED_TUNABLESCALING_LOG; before Linux 6.6, CFS's minimum
    granularity, the same). A co-runner resuming from CFS throttling holds a CPU about that long,
    and a request arriving there meanwhile waits half of it on average: the node's
    `cfs_resume_wait_ms` unless its platform file gives one."""
    return 0.75 * (1 + math.floor(math.log2(max(1, min(int(cpus), 8)))))


def rounded(prof: LcProfile, platform: Platform) -> tuple[LcProfile, Platform]:
    """The fitted fields to 4 significant digits, as the YAML files hold them (the report simulates
    what is written)."""
    app: dict[str, Any] = {k: _sig(getattr(prof, k)) for k in prof.fitted}  # float fields
    app["max_load_rps"] = float(f"{prof.max_load_rps:.5g}")  # derived from the measured service time
    node: dict[str, Any] = {k: _sig(getattr(platform, k)) for k in platform.fitted}
    return dataclasses.replace(prof, **app), dataclasses.replace(platform, **node)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


@dataclass(frozen=True)
class Errors:
    """|simulated / measured - 1| over a set of points: median and worst, and where the worst is."""

    points: int
    median: float
    worst: float
    worst_at: str

    @classmethod
    def of(cls, rows: Sequence[dict]) -> Errors:
        if not rows:
            return cls(0, math.nan, math.nan, "")
        errs = [abs(r["error"]) for r in rows]
        i = int(np.argmax(errs))
        r = rows[i]
        be = f" with {r['be_threads']} BE threads" if r["be_threads"] else ""
        return cls(
            len(rows),
            float(np.median(errs)),
            errs[i],
            f"{r['rate_rps']:g} rps, quota {r['quota_cores']:g}{be}",
        )


def compare_rows(prof: LcProfile, platform: Platform, measured: Sequence[Measured]) -> list[dict]:
    """Real against simulated at every point (the report's table)."""
    sim = simulate_points(prof, platform, [m.as_point() for m in measured])
    rows = []
    for m, s in zip(measured, sim.tolist()):
        p = m.point
        q25, q75 = m.quartiles_us()
        rows.append(
            {
                "role": p.role, "rate_rps": p.rate_rps, "quota_cores": p.quota_cores,
                "be_threads": p.be_threads, "be_quota_cores": p.be_quota_cores, "p99_us": m.p99_us,
                "p99_q25_us": q25, "p99_q75_us": q75, "intervals": len(m.p99s_us),
                "window_p99_us": m.histogram.quantile_us(0.99) if m.histogram else math.nan,
                "cpu_cores": float(np.median(m.cpu_cores)) if m.cpu_cores else math.nan,
                "background_cores": m.background, "generator_lag_p99_us": m.lag_p99_us,
                "generator_bound": m.generator_bound, "sim_p99_us": s, "error": s / m.p99_us - 1.0 if m.p99_us > 0 else math.nan,
            }
        )  # fmt: skip
    return rows


# ---- outputs ----------------------------------------------------------------------------------------
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Outputs:
    """Where the run writes: the report directory and the two config files."""

    out: Path
    app_file: Path
    node_file: Path
    overwrite: bool

    @classmethod
    def check(cls, name: str, out: Path, configs: Path, overwrite: bool) -> Outputs:
        """Every output checked before any work (exit 2, nothing written): a plain NAME, config
        directories that exist and are writable, no file or report in the way unless --overwrite,
        and never a file this tool did not write (a shipped profile)."""
        if not NAME_RE.match(name):
            raise ConfigError(f"--name {name!r}: letters, digits, '_', '-' and '.', at most 64, no '/'")
        o = cls(out, configs / "apps" / f"{name}.yaml", configs / "node" / f"{name}.yaml", overwrite)
        for f in (o.app_file, o.node_file):
            if not f.parent.is_dir() or not os.access(f.parent, os.W_OK):
                raise ConfigError(f"{f.parent}: not a writable directory (--configs gives where configs/ is)")
            if f.exists() and not overwrite:
                raise ConfigError(f"{f} exists; --overwrite replaces it")
            if f.exists() and MARKER not in f.read_text(errors="replace"):
                raise ConfigError(f"{f} was not {MARKER}: it is never overwritten (choose another --name)")
        if out.exists() and not overwrite:
            raise ConfigError(f"--out {out} exists; --overwrite replaces it")
        check_out(out, overwrite)  # a directory that can be made, never the one you are in
        return o

    def reference(self, name: str) -> str:
        """How the profile names its node file: by name when it is in the project's configs/, else
        by path (load_platform takes both)."""
        return (
            name
            if self.node_file.parent.resolve() == (CONFIGS / "node").resolve()
            else str(self.node_file.resolve())
        )


def profile_yaml(prof: LcProfile, header: Sequence[str]) -> str:
    """The profile as `configs/apps/NAME.yaml` text (loaded back to check it)."""
    data = {"kind": "lc", **plain_data(prof)}
    _check(build(LcProfile, {k: v for k, v in data.items() if k != "kind"}, prof.name), prof)
    return _yaml(data, header)


def platform_yaml(pl: Platform, header: Sequence[str]) -> str:
    """The platform as `configs/node/NAME.yaml` text (loaded back to check it)."""
    data = plain_data(pl)
    _check(build(Platform, data, pl.name), pl)
    return _yaml(data, header)


def _check(loaded: Any, written: Any) -> None:
    if loaded != written:
        raise RuntimeError(f"{written.name}: the YAML does not load back to what was fitted (a bug)")


def _yaml(data: dict, header: Sequence[str]) -> str:
    return "".join(f"# {h}\n" for h in header) + yaml.safe_dump(data, sort_keys=False, width=110)


def write_configs(files: dict[Path, str]) -> None:
    """Write every file or none: each to a temporary file beside it, then all renamed into place (a
    rename that fails puts back what the earlier ones replaced)."""
    tmps: dict[Path, Path] = {}
    try:
        for path, text in files.items():
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(name, 0o644)
            tmps[path] = Path(name)
        old = {p: p.read_bytes() for p in files if p.exists()}
        done: list[Path] = []
        try:
            for path, staged_file in tmps.items():
                os.replace(staged_file, path)
                done.append(path)
        except OSError:
            for path in done:
                if path in old:
                    path.write_bytes(old[path])
                else:
                    path.unlink(missing_ok=True)
            raise
    finally:
        for staged_file in tmps.values():
            staged_file.unlink(missing_ok=True)


def _machine_lines(machine: dict) -> list[str]:
    """The node's load average before measuring, with `busy_warning` when it was busy ([] when an
    earlier profile.json did not record it)."""
    start = machine.get("loadavg_start")
    if not start:
        return []
    line = f"Node {machine.get('node', '?')}: load average {start[0]:.2f} before measuring."
    busy = busy_warning(float(start[0]), int(machine.get("cpus") or 1))
    return [line + (f" **Busy: {busy}.**" if busy else ""), ""]


def report_md(data: dict) -> str:
    """report.md: what was measured and fitted, the held-out errors, the table."""
    s = data["summary"]
    lines = [
        f"# Profile of {data['name']}: this node against the simulator",
        "",
        f"{data['service']['description']}; {data['node']['cores']:g} cores, CFS period {data['node']['cfs_period_ms']:g} ms; "
        f"QoS target {data['qos_target_us']:.0f} us; probe: {data['probe']['cpu_s_per_request'] * 1e6:.1f} us of CPU per "
        f"request at {data['probe']['rate_rps']:g} rps.",
        "",
        *_machine_lines(data.get("machine", {})),
        f"Fit: loss {data['fit']['loss']:.3f} (mean |ln sim/real|) after {data['fit']['evaluations']} evaluations "
        f"({data['fit']['seconds']:.0f} s); "
        + ", ".join(f"{k} = {v:.4g}" for k, v in data["fit"]["values"].items()),
        "",
        "| points | n | median error | worst error | worst at |",
        "|---|---|---|---|---|",
    ]
    for k in ("fit", "heldout"):
        e = s[k]
        lines.append(f"| {k} | {e['points']} | {e['median']:.1%} | {e['worst']:.1%} | {e['worst_at']} |")
    lines += [
        "",
        "error = simulated / measured median interval p99 - 1.",
        "",
        "| half | rate rps | quota | BE threads @ cores | other work (cores) | real p99 us | IQR | window p99 us | "
        "sim p99 us | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["points"]:
        be = f"{r['be_threads']} @ {r['be_quota_cores']:g}" if r["be_threads"] else "-"
        lines.append(
            f"| {r['role']} | {r['rate_rps']:.0f} | {r['quota_cores']:g} | {be} | {_cores(r['background_cores'])} | "
            f"{r['p99_us']:.0f} | "
            f"{r['p99_q25_us']:.0f}-{r['p99_q75_us']:.0f} | {r['window_p99_us']:.0f} | {r['sim_p99_us']:.0f} | "
            f"{r['error']:+.0%} |"
        )
    if data.get("skipped"):
        lines += ["", "Left out (demand above the quota's limit): " + "; ".join(data["skipped"])]
    bound = [r for r in data["points"] if r.get("generator_bound")]
    if bound:
        lines += [
            "",
            f"Generator-bound, left out of the fit and the errors (the generator's lag p99 over "
            f"{GENERATOR_BOUND_MIN_LAG_US / 1000:g} ms and {GENERATOR_BOUND_FRAC:.0%} of the p99: its latency "
            "is the generator's): "
            + "; ".join(
                f"{r['role']} {r['rate_rps']:.0f} rps at {r['quota_cores']:g} cores (lag p99 "
                f"{r['generator_lag_p99_us']:.0f} us of {r['p99_us']:.0f})"
                for r in bound
            ),
        ]
    return "\n".join(lines) + "\n"


def _cores(x: float | None) -> str:
    """Cores to 2 decimals; "n/a" for what was not measured (NaN, None in the JSON)."""
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}"


def plot(rows: Sequence[dict], path: Path, title: str) -> None:
    """p99 against quota, one colour per rate: measured (markers with quartiles; filled = fitted,
    open = held out) and simulated (lines); the co-runner points in a second panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("alone", [r for r in rows if not r["be_threads"]])]
    if any(r["be_threads"] for r in rows):
        panels.append(("beside the CPU-bound BE job", [r for r in rows if r["be_threads"]]))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rates = sorted({r["rate_rps"] for r in rows})
    for ax, (label, rs) in zip(axes[0], panels):
        for i, rate in enumerate(rates):
            c = colors[i % len(colors)]
            pts = sorted((r for r in rs if r["rate_rps"] == rate), key=lambda r: r["quota_cores"])
            if not pts:
                continue
            x = [r["quota_cores"] for r in pts]
            ax.plot(x, [r["sim_p99_us"] for r in pts], "-", color=c, alpha=0.7)
            for r in pts:
                err = [[r["p99_us"] - r["p99_q25_us"]], [r["p99_q75_us"] - r["p99_us"]]]
                ax.errorbar(
                    [r["quota_cores"]], [r["p99_us"]], yerr=err, fmt="o", color=c, capsize=3,
                    mfc=c if r["role"] == "fit" else "white",
                )  # fmt: skip
            ax.plot([], [], "o-", color=c, label=f"{rate:g} rps")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("CPU quota of the service (cores)")
        ax.set_ylabel("p99 per 500 ms interval, median (us)")
        ax.set_title(f"{label}: markers real (filled fitted, open held out), lines simulated", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _duration(s: float) -> str:
    s = max(0.0, s)
    return f"{int(s // 60)}m{int(s % 60):02d}s"


# ---- the whole run -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunConfig:
    """One profiling run (the command line, checked)."""

    name: str
    info: ServiceInfo
    plan: PlanConfig
    platform: str = "vm2"
    knobs: tuple[str, ...] = ("core",)
    quota_step_cores: float = 0.25
    qos_target_us: float | None = None
    budget_min: float | None = None
    fit_maxiter: int = 60
    fit_popsize: int = 10


@dataclass(frozen=True)
class NodeFacts:
    """What the fit needs to know of the node the measurements come from."""

    cores: float
    cfs_period_ms: float
    cfs_slice_ms: float


@dataclass
class Measurements:
    """Everything measured (kept to refit with --from-measurements)."""

    node: NodeFacts
    probe: Probe
    qos_target_us: float
    measured: list[Measured]
    skipped: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=dict)


def busy_warning(loadavg_1min: float, cpus: int) -> str | None:
    """What to warn about when the node was busy before anything was started (1-minute load average above
    `BUSY_LOAD_PER_CPU` per CPU), else None. Other work shares the cores with the service and the
    load generator and spreads a point's interval p99s: this project's 2-core VM gave memcached a
    held-out median error of 36% under a load average of 4-8 and 15% when quiet (README)."""
    if loadavg_1min <= BUSY_LOAD_PER_CPU * cpus:
        return None
    return (
        f"load average {loadavg_1min:.1f} on {cpus} CPUs before measuring: other work spreads the p99s "
        "and inflates the fit's errors; profile on a quiet node"
    )


def measure(bench: Bench, cfg: RunConfig, progress: Progress) -> Measurements:
    """Steps 1-3 of the module docstring on `bench`."""
    facts = NodeFacts(bench.cores, bench.cfs_period_ms, bench.cfs_slice_ms)
    loadavg, cpus = os.getloadavg(), os.cpu_count()
    machine = {"node": os.uname().nodename, "cpus": cpus, "loadavg_start": loadavg}
    busy = busy_warning(loadavg[0], cpus or 1)
    if busy:
        progress(f"warning: {busy}")
    plan = cfg.plan
    t0 = time.monotonic()
    probe = probe_service(bench, plan, progress)
    points, skipped = plan_points(plan, probe)
    n_rates = len({p.rate_rps for p in points})
    if cfg.budget_min is not None:
        left_s = cfg.budget_min * 60 - (time.monotonic() - t0) + 2 * (plan.probe_s + GENERATOR_START_S)
        plan = fit_budget(plan, len(points), n_rates, left_s)
    runs = schedule(points, plan.passes, plan.seed)
    n_fit = sum(p.role == "fit" for p in points)
    progress(
        f"plan: {len(points)} points ({n_fit} fitted, {len(points) - n_fit} held out; {len(skipped)} left out "
        f"as overloaded) x {plan.passes} passes, {n_rates} rates; about {_duration(estimate_s(plan, runs))} to go"
    )
    measured = measure_plan(bench, plan, runs, progress)
    machine["loadavg_end"] = os.getloadavg()
    return Measurements(
        facts, probe, qos_target(cfg.qos_target_us, probe, measured), measured, skipped, machine
    )


def qos_target(given: float | None, probe: Probe, measured: Sequence[Measured]) -> float:
    """The QoS target (module docstring, step 2): `given`, else `TARGET_X` x the median interval p99
    at the lightest rate alone on the whole node (the probe's when that was not measured), at least
    `TARGET_MIN_US`."""
    if given:
        return given
    alone = [
        m for m in measured if not m.point.be_threads and m.point.quota_cores >= probe.cores and m.p99s_us
    ]
    p99 = min(alone, key=lambda m: m.point.rate_rps).p99_us if alone else probe.p99_us
    return round(max(TARGET_X * p99, TARGET_MIN_US), 1)


def fit_and_report(
    cfg: RunConfig, m: Measurements, outputs: Outputs, progress: Progress, fit_budget_s: float | None
) -> dict:
    """Steps 4-5 of the module docstring: fit, compare every point, write the report and the configs."""
    base = load_platform(cfg.platform)
    pl0 = base_platform(base, cfg.name, m.node.cores, cfg.knobs, cfg.quota_step_cores, m.node.cfs_period_ms)
    target = qos_target(cfg.qos_target_us, m.probe, m.measured)
    prof0 = base_profile(cfg.name, cfg.info, m.probe, target, outputs.reference(cfg.name))
    fit_points = [x for x in m.measured if x.point.role == "fit" and x.p99s_us and not x.generator_bound]
    bound = [x for x in m.measured if x.p99s_us and x.generator_bound]
    if bound:
        progress(
            f"warning: {len(bound)} point(s) generator-bound, left out of the fit and the errors "
            f"({', '.join(x.point.label() for x in bound)}): lower --max-rate or --load-range, or measure on a quieter machine"
        )
    if len(fit_points) < 3:
        more = sum(x.point.role == "fit" for x in bound)
        raise RuntimeError(
            f"only {len(fit_points)} fitted points were measured"
            + (f" ({more} more were generator-bound)" if more else "")
            + ": too few to fit"
        )
    params = app_params(m.probe, target) + node_params(
        any(x.point.be_threads for x in fit_points), m.node.cfs_slice_ms
    )
    progress(f"fit: {len(params)} parameters to {len(fit_points)} points (differential evolution)")

    def on_gen(gen: int, loss: float, elapsed: float) -> None:
        if gen % 10 == 0:
            progress(f"fit: generation {gen}/{cfg.fit_maxiter}, loss {loss:.3f}, {elapsed:.0f} s")

    prof, pl, got = fit_measured(
        prof0, pl0, [x.as_point() for x in fit_points], params, maxiter=cfg.fit_maxiter,
        popsize=cfg.fit_popsize, seed=cfg.plan.seed, budget_s=fit_budget_s, on_generation=on_gen,
        service_s=m.probe.cpu_s_per_request,
    )  # fmt: skip
    prof, pl = rounded(prof, pl)
    valid = [x for x in m.measured if x.p99s_us]
    rows = compare_rows(prof, pl, valid)
    summary = {
        k: dataclasses.asdict(Errors.of([r for r in rows if r["role"] == k and not r["generator_bound"]]))
        for k in ("fit", "heldout")
    }
    data = {
        "name": cfg.name,
        "service": dataclasses.asdict(cfg.info),
        "node": dataclasses.asdict(m.node),
        "machine": m.machine,
        "plan": dataclasses.asdict(cfg.plan),
        "probe": {**dataclasses.asdict(m.probe), "capacity_rps": m.probe.capacity_rps},
        "qos_target_us": target,
        "skipped": m.skipped,
        "fit": {
            "params": [dataclasses.asdict(p) for p in params],
            "values": {p.name: getattr(prof if p.on == "app" else pl, p.name) for p in params},
            "loss": got.loss,
            "evaluations": got.evaluations,
            "generations": got.generations,
            "seconds": got.seconds,
            "stopped_by_budget": got.stopped_by_budget,
        },
        "summary": summary,
        "points": rows,
        "measurements": [_measured_json(x) for x in m.measured],
        "files": {"app": str(outputs.app_file), "node": str(outputs.node_file)},
    }
    header = [
        f"{cfg.name}: {cfg.info.description}. {MARKER} on {m.machine.get('node', '?')}",
        f"(report: {outputs.out}); fitted to {len(fit_points)} measured points, held-out median error "
        f"{summary['heldout']['median']:.0%} (worst {summary['heldout']['worst']:.0%}).",
        f"Service time: the CPU time per request measured ({m.probe.cpu_s_per_request * 1e6:.4g} us); max_load_rps "
        "is the knee it gives at the QoS target on the whole node (PARTIES Sec. 3.2).",
    ]
    app_text = profile_yaml(prof, header)
    node_text = platform_yaml(pl, [f"{cfg.name}: this node as a simulator platform, {MARKER}", *header[1:]])
    with staged_output(outputs.out, outputs.overwrite) as stage:
        (stage / "profile.json").write_text(json.dumps(plain_data(data), indent=1) + "\n")
        (stage / "report.md").write_text(report_md(plain_data(data)))
        plot(rows, stage / "profile.png", f"{cfg.name}: this node (markers) against the simulator (lines)")
        write_configs({outputs.app_file: app_text, outputs.node_file: node_text})
    return data


def _measured_json(m: Measured) -> dict:
    return {
        "point": dataclasses.asdict(m.point),
        "p99s_us": list(m.p99s_us),
        "histogram": m.histogram.encode() if m.histogram else None,
        "cpu_cores": list(m.cpu_cores),
        "background_cores": list(m.background_cores),
        "lag_p99s_us": [x if math.isfinite(x) else None for x in m.lag_p99s_us],
    }


def load_measurements(path: Path) -> tuple[Measurements, PlanConfig, ServiceInfo]:
    """The measurements of an earlier run's profile.json (--from-measurements), its plan and the
    service. The plan is a record (each point carries its half): fields this version does not know
    are left out, and an earlier run's list of load fractions (`load_fracs`) becomes its range."""
    try:
        data = json.loads(path.read_text())
        info = ServiceInfo(**data["service"])
        plan_kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data["plan"].items()}
        fracs = plan_kw.pop("load_fracs", None)
        if fracs:
            plan_kw.update(load_range=(min(fracs), max(fracs)), n_rates=len(fracs))
        known = {f.name for f in dataclasses.fields(PlanConfig)}
        plan = PlanConfig(**{k: v for k, v in plan_kw.items() if k in known})
        node = NodeFacts(**data["node"])
        probe = Probe(**{k: v for k, v in data["probe"].items() if k != "capacity_rps"})
        measured = [
            Measured(
                PlannedPoint(**x["point"]),
                tuple(float(v) for v in x["p99s_us"]),
                LatencyHistogram.decode(x["histogram"]) if x["histogram"] else LatencyHistogram.empty(),
                tuple(float(v) for v in x["cpu_cores"]),
                tuple(float(v) for v in x.get("background_cores", ())),
                tuple(math.nan if v is None else float(v) for v in x.get("lag_p99s_us", ())),
            )
            for x in data["measurements"]
        ]
        m = Measurements(
            node,
            probe,
            float(data["qos_target_us"]),
            measured,
            list(data.get("skipped", ())),
            data.get("machine", {}),
        )
        return m, plan, info
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--from-measurements {path}: not a profile.json of hw.profile ({e})") from None


# ---- this machine ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadSpec:
    """How the service is loaded: `hw.loadgen` at `target`, or the user's generator `command` (a
    template: {rate} requests/s, {feed} the file to publish its intervals to, {app} the name to
    publish under), started once per rate and stopped after it."""

    app: str
    target: str | None = None
    command: str | None = None
    rt: bool = True

    def __post_init__(self) -> None:
        if (self.target is None) == (self.command is None):
            raise ConfigError("give exactly one of --target (hw.loadgen) and --load-cmd (your own generator)")
        if self.target is not None:
            from hw.loadgen import Target

            Target.parse(self.target)  # a ConfigError for a bad URL
        if self.command is not None:
            try:
                args = [a.format(rate=1.0, feed="f", app="a") for a in shlex.split(self.command)]
            except (ValueError, KeyError, IndexError) as e:
                raise ConfigError(
                    f"--load-cmd: {e}; placeholders are {{rate}}, {{feed}} and {{app}}"
                ) from None
            if "{feed}" not in self.command or "{rate}" not in self.command:
                raise ConfigError("--load-cmd must contain {rate} and {feed} (where it publishes)")
            if not args or not shutil.which(args[0]):
                raise ConfigError(f"--load-cmd: {args[0] if args else '(empty)'} is not a program on PATH")


class LinuxBench:
    """The service on this machine (module docstring, step 3): a `LinuxNode` in CPU-quota mode with
    the service's processes (or its cgroup) and, with co-runner points, a BE cgroup for
    `stress-ng --cpu N`; the load from `load`. Restores every cgroup on `close()`."""

    def __init__(
        self,
        name: str,
        load: LoadSpec,
        workdir: Path,
        *,
        pids: tuple[int, ...] = (),
        cgroup: str | None = None,
        be: bool = False,
        period_us: int = 100_000,
    ) -> None:
        from hw.config import AppTarget, CoresConfig, FeedConfig, LinuxNodeConfig
        from hw.linux_node import LinuxNode

        self.name, self._load, self._dir = name, load, workdir
        self._pids = pids
        apps = [AppTarget(name, "lc", qos_target_us=1e6, max_load_rps=1e9, pids=pids, cgroup=cgroup)]
        if be:
            apps.append(AppTarget("be", "be", create=True))
        cfg = LinuxNodeConfig(
            name=f"profile-{name}", apps=tuple(apps), knobs=("core",),
            cgroup_parent=f"coloc_profile_{uuid.uuid4().hex[:8]}", state_path=str(workdir / "journal.jsonl"),
            cores=CoresConfig(mode="quota", quota_step_cores=QUOTA_RESOLUTION_CORES, period_us=period_us),
            feed=FeedConfig(url=f"file:{workdir / 'node-feed.jsonl'}"),
        )  # fmt: skip
        self._period_us = period_us
        self.node = LinuxNode(cfg, initial=unmanaged_allocation)
        self._gen: Any = None
        self._gen_rate = math.nan
        self._feed = workdir / "feed.jsonl"
        self._be: subprocess.Popen | None = None
        self._be_threads = 0
        self.node.reset()

    @property
    def cores(self) -> float:
        return self.node.capabilities().cores

    @property
    def cfs_period_ms(self) -> float:
        return self._period_us / 1000

    @property
    def cfs_slice_ms(self) -> float:
        """The kernel's CFS bandwidth slice (sched_cfs_bandwidth_slice_us; 5 ms by default)."""
        try:
            return int(Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us").read_text()) / 1000
        except (OSError, ValueError):
            return 5.0

    def memory_gb(self) -> float:
        """The service's resident memory: its processes' RSS, or its cgroup's memory."""
        if self._pids:
            kb = 0
            for pid in self._pids:
                with contextlib.suppress(OSError, ValueError):
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            kb += int(line.split()[1])
            return kb / 2**20
        self.node.observe()
        u = self.node.usage_of(self.name)
        return u.memory_bytes / 2**30 if u is not None else 0.0

    def measure(self, point: PlannedPoint, settle_s: float, measure_s: float) -> Window:
        self._generator(point.rate_rps)
        self._co_runner(point.be_threads)
        self.node.apply(self._allocation(point))
        time.sleep(settle_s)
        self.node.observe()
        c0, b0, m0, t0 = self._cpu_s(), self._be_cpu_s(), _machine_busy_s(), time.time()
        time.sleep(measure_s)
        self.node.observe()
        c1, b1, m1, t1 = self._cpu_s(), self._be_cpu_s(), _machine_busy_s(), time.time()
        if self._gen is not None and self._gen.proc.poll() is not None:
            raise RuntimeError(f"the load generator exited with status {self._gen.proc.returncode}")
        got = read_readings(self._feed, self._load.app, t0 + 0.25, t1 + 0.25)  # intervals ending inside
        hists = [r.histogram for r in got if r.histogram is not None]
        return Window(
            tuple(r.p99_us for r in got),
            merge(hists) if hists else LatencyHistogram.empty(),
            (c1 - c0) / max(t1 - t0, 1e-9),
            float(np.mean([r.rps for r in got])) if got else 0.0,
            max(0.0, ((m1 - m0) - (c1 - c0) - (b1 - b0)) / max(t1 - t0, 1e-9)),
            tuple(r.lag_p99_us for r in got),
        )

    def _be_cpu_s(self) -> float:
        u = self.node.usage_of("be") if self._be_threads else None
        return u.cpu_usage_s if u is not None else 0.0

    def _cpu_s(self) -> float:
        u = self.node.usage_of(self.name)
        if u is None:
            raise RuntimeError(f"cannot read the CPU time of {self.name}'s cgroup")
        return u.cpu_usage_s

    def _allocation(self, point: PlannedPoint) -> Any:
        """The service under its quota (core group 1), the BE job holding the cores it leaves (group
        0); the whole node: every app unmanaged (no quota at all)."""
        caps = self.node.capabilities()
        alloc = unmanaged_allocation(caps)
        if point.quota_cores >= caps.cores - 1e-9:
            return alloc
        alloc = alloc.replace_app(self.name, cores=point.quota_cores, core_group=1)
        if any(a.name == "be" for a in caps.be_apps):
            alloc = alloc.replace_app("be", cores=round(caps.cores - point.quota_cores, 2), core_group=0)
        return alloc

    def _generator(self, rate: float) -> None:
        if rate == self._gen_rate and self._gen is not None:
            return
        self._stop_generator()
        self._feed = self._dir / f"feed-{len(list(self._dir.glob('feed-*.jsonl')))}.jsonl"
        if self._load.target is not None:
            self._gen = LoadgenProcess(self._load.target, rate, self._load.app, self._feed, rt=self._load.rt)
            self._gen.wait_ready()
        else:
            assert self._load.command is not None
            self._feed.touch()
            args = [
                a.format(rate=f"{rate:g}", feed=str(self._feed), app=self._load.app)
                for a in shlex.split(self._load.command)
            ]
            log = open(self._dir / "load-cmd.log", "a")  # noqa: SIM115 - closed with the process
            self._gen = _UserGenerator(
                subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True), log
            )
            end = time.monotonic() + 30
            while not read_readings(self._feed, self._load.app):
                if self._gen.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(
                        f"--load-cmd published nothing for {self._load.app!r} to {self._feed} within 30 s"
                    )
                time.sleep(0.1)
        self._gen_rate = rate

    def _stop_generator(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    def _co_runner(self, threads: int) -> None:
        if threads == self._be_threads:
            return
        if self._be is not None:
            stop_be(self.node, self._be)
            self._be = None
        if threads:
            self._be = start_be_in(self.node, "be", threads)
        self._be_threads = threads

    def close(self) -> None:
        try:
            self._stop_generator()
            self._co_runner(0)
        finally:
            self.node.close()


class _UserGenerator:
    """The user's load generator process (its own session: stopped whole)."""

    def __init__(self, proc: subprocess.Popen, log: Any) -> None:
        self.proc, self._log = proc, log

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        stop_process(self.proc)
        self._log.close()


def _machine_busy_s() -> float:
    """CPU seconds the machine's CPUs have been busy at normal priority (or stolen by the host)
    since boot (/proc/stat: user, system, irq, softirq, steal). Niced work is left out: CFS weighs a
    nice-5 task at a third of the service's, so it yields to it (and is most of what else runs on a
    shared development VM)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    user, _nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def why_not_here() -> str | None:
    """Why this machine cannot be profiled (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (it creates cgroups and sets CPU quotas)"
    if not Path("/sys/fs/cgroup/cpu").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "needs the cgroup cpu controller"
    return None


@contextlib.contextmanager
def debian_service(kind: str, workdir: Path) -> Iterator[tuple[tuple[int, ...], str, ServiceInfo]]:
    """Start Debian's memcached (`-t 2`) or nginx (2 workers, the CPU-heavy server-side-include page
    of the real-node experiments) here: (pids, load target URL, deployment)."""
    if not shutil.which(kind):
        raise ConfigError(f"--service {kind}: {kind} is not installed (apt install {kind})")
    port = free_port()
    if kind == "memcached":
        proc = start_memcached(port, threads=2)
        pids: tuple[int, ...] = (proc.pid,)
        url = f"memcached://127.0.0.1:{port}"
        info = ServiceInfo(
            2,
            "per_thread",
            "Debian's memcached, 2 worker threads, 64 MB (hw.loadgen: 10% sets, Zipf 0.99 keys)",
        )
    else:
        proc, all_pids = start_nginx(workdir, port)
        pids = tuple(all_pids)
        url = f"http://127.0.0.1:{port}/index.html"
        info = ServiceInfo(
            2, "per_thread", "Debian's nginx, 2 workers, a page of 4000 server-side-include directives"
        )
    try:
        yield pids, url, info
    finally:
        stop_process(proc)


# ---- command line ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m hw.profile` (its --help)."""
    d = PlanConfig()
    ap = argparse.ArgumentParser(
        prog="python -m hw.profile",
        description=(
            "Profile a service on this node into the simulator: measure its p99 under a plan of request rates and "
            "CPU quotas (and beside a CPU-bound BE job), fit an app profile and a node file with the simulator's "
            "calibration fit (env/sim/fit.py), and report real against simulated at every point, half of them held "
            "out of the fit. Writes configs/apps/NAME.yaml, configs/node/NAME.yaml and DIR/{profile.json,report.md,"
            "profile.png}. Needs root (cgroups). Exit status: 0 done, 1 the node failed, 2 bad input, 130 interrupted."
        ),
        epilog=(
            "The service: --service memcached|nginx starts Debian's here (as the real-node experiments run them); "
            "or give a running one with --pid (repeatable) or --cgroup, and its load with --target (hw.loadgen: "
            "memcached://HOST:PORT or http://HOST:PORT/PATH) or --load-cmd (your generator, started per rate; "
            "{rate}, {feed} and {app} are filled in; it must publish each interval to the feed file: hw/feed.py).\n"
            "The plan: --n-rates rates over --load-range x the capacity the probe measures (at most --max-rate), "
            "quotas = --quotas; "
            "even-indexed rates x even-indexed quotas are fitted, odd x odd held out. Time: about (settle + measure) "
            "x points x passes, printed before it starts; --budget fits the passes to a time limit.\n"
            "Example: python -m hw.profile --service memcached --name memcached-vm --out /tmp/profile-mc --budget 15"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--name",
        required=True,
        help="profile and node file name (configs/apps/NAME.yaml, configs/node/NAME.yaml)",
    )
    ap.add_argument(
        "--out", required=True, type=Path, help="report directory (must not exist, unless --overwrite)"
    )
    src = ap.add_argument_group("the service")
    src.add_argument(
        "--service", choices=("memcached", "nginx"), help="start Debian's memcached or nginx here"
    )
    src.add_argument(
        "--pid", type=int, action="append", default=[], help="a process of a running service (repeatable)"
    )
    src.add_argument("--cgroup", help="the running service's cgroup (relative to the cgroup root)")
    src.add_argument("--target", help="hw.loadgen target: memcached://HOST:PORT or http://HOST:PORT/PATH")
    src.add_argument("--load-cmd", help="your load generator: a command with {rate}, {feed} (and {app})")
    src.add_argument("--threads", type=int, help="the service's worker threads (default: the node's cores)")
    src.add_argument("--queue", choices=("per_thread", "shared"), default="per_thread",
                     help="per_thread: connections pinned to event-loop workers (memcached, nginx); shared: a pool")  # fmt: skip
    src.add_argument("--description", default="", help="one line for the profile")
    plan = ap.add_argument_group("the plan")
    plan.add_argument(
        "--load-range",
        type=floats_arg,
        default=d.load_range,
        help=f"rates from LOW to HIGH x the probed capacity ({d.load_range[0]:g},{d.load_range[1]:g})",
    )
    plan.add_argument("--n-rates", type=int, default=d.n_rates, help=f"how many rates ({d.n_rates})")
    plan.add_argument(
        "--rates", type=floats_arg, default=(), help="absolute rates (requests/s) instead of --load-range"
    )
    plan.add_argument(
        "--quotas", type=floats_arg, default=d.quotas_cores, help="CPU quotas (cores, multiples of 0.01)"
    )
    plan.add_argument(
        "--max-rate",
        type=float,
        default=d.max_rate_rps,
        help=f"the generator's limit ({d.max_rate_rps:g} rps)",
    )
    plan.add_argument(
        "--be-threads", type=int, default=d.be_threads, help="also measure beside stress-ng --cpu N (0: no)"
    )
    plan.add_argument(
        "--measure-s", type=float, default=d.measure_s, help=f"seconds per window ({d.measure_s:g})"
    )
    plan.add_argument(
        "--settle-s", type=float, default=d.settle_s, help=f"seconds after each change ({d.settle_s:g})"
    )
    plan.add_argument("--passes", type=int, default=d.passes, help=f"measurements of each point ({d.passes})")
    plan.add_argument(
        "--probe-rps", type=float, default=d.probe_rps, help=f"the probe's light load ({d.probe_rps:g})"
    )
    plan.add_argument(
        "--budget", type=float, metavar="MIN", help="time limit in minutes: fewer passes to fit it"
    )
    plan.add_argument("--seed", type=int, default=d.seed, help="order of the points and the fit's seed (0)")
    fit = ap.add_argument_group("the fit and the files")
    fit.add_argument(
        "--qos-target-us",
        type=float,
        help=f"the QoS target (default: {TARGET_X:g} x the probe's p99, >= {TARGET_MIN_US:g})",
    )
    fit.add_argument(
        "--platform", default="vm2", help="the node file this machine starts from (configs/node/, vm2)"
    )
    fit.add_argument(
        "--knobs", default="core", help="resources a controller may move on the node (core,mem,...; core)"
    )
    fit.add_argument(
        "--quota-step", type=float, default=0.25, help="one CORE move in the node file (0.25 cores)"
    )
    fit.add_argument(
        "--configs", type=Path, default=CONFIGS, help="where configs/ is (default: the project's)"
    )
    fit.add_argument(
        "--from-measurements", type=Path, help="refit an earlier run's DIR/profile.json (no measuring)"
    )
    fit.add_argument(
        "--overwrite", action="store_true", help="replace files this tool wrote before, and --out"
    )
    fit.add_argument("--no-rt", action="store_true", help="do not run the load generator under SCHED_FIFO")
    return ap


def run(argv: Sequence[str] | None = None, bench_factory: Callable[..., Any] | None = None) -> int:
    """`python -m hw.profile` (module docstring). `bench_factory(name, info)` replaces this machine
    (the tests' synthetic service): a context manager yielding a `Bench`."""
    ap = build_parser()
    args = ap.parse_args(argv)
    plan = PlanConfig(
        load_range=_pair(args.load_range, "--load-range"), n_rates=args.n_rates, rates_rps=args.rates, quotas_cores=args.quotas, max_rate_rps=args.max_rate,
        be_threads=args.be_threads, measure_s=args.measure_s, settle_s=args.settle_s, passes=args.passes,
        probe_rps=args.probe_rps, seed=args.seed,
    )  # fmt: skip
    if args.budget is not None and not (args.budget > 0):
        raise ConfigError(f"--budget {args.budget}: minutes, > 0")
    if args.qos_target_us is not None and not (0 < args.qos_target_us < 1e9):
        raise ConfigError(f"--qos-target-us {args.qos_target_us}: > 0")
    knobs = tuple(k.strip() for k in args.knobs.split(",") if k.strip())
    outputs = Outputs.check(args.name, args.out, args.configs, args.overwrite)
    base = load_platform(args.platform)
    dataclasses.replace(base, core_mode="quota", quota_step_cores=args.quota_step, knobs=knobs)  # checks them
    progress: Progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()

    def config(info: ServiceInfo) -> RunConfig:
        return RunConfig(
            args.name, info, plan, args.platform, knobs, args.quota_step, args.qos_target_us, args.budget
        )

    if args.from_measurements is not None:
        m, recorded, info = load_measurements(args.from_measurements)
        cfg = dataclasses.replace(config(info), plan=recorded)
        data = fit_and_report(cfg, m, outputs, progress, _fit_budget(args.budget, started))
        return _done(data)
    sources = [x for x in (args.service, args.pid or None, args.cgroup) if x]
    if len(sources) != 1:
        raise ConfigError(
            "give the service with exactly one of --service, --pid or --cgroup (or --from-measurements)"
        )
    if args.service is None:
        LoadSpec(args.name, args.target, args.load_cmd)  # checked before any work
    elif args.target or args.load_cmd:
        raise ConfigError(
            "--service brings its own load (hw.loadgen); --target and --load-cmd are for --pid/--cgroup"
        )
    if bench_factory is None:
        why = why_not_here()
        if why:
            print(f"{ap.prog}: error: this machine {why}", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="coloc-profile-") as tmp:
        try:
            with _bench(args, Path(tmp), bench_factory) as (bench, info):
                cfg = config(info)
                base_platform(
                    base, args.name, bench.cores, knobs, args.quota_step, bench.cfs_period_ms
                )  # checks it
                m = measure(bench, cfg, progress)
        except (RuntimeError, OSError, TimeoutError) as e:
            print(f"{ap.prog}: error: the measurements failed: {e}", file=sys.stderr)
            return 1
        kept = Path(tempfile.mkstemp(prefix=f"coloc-profile-{args.name}-", suffix=".json")[1])
        try:
            data = fit_and_report(cfg, m, outputs, progress, _fit_budget(args.budget, started))
        except BaseException as e:
            _keep(kept, cfg, m)
            print(
                f"{ap.prog}: the measurements are kept in {kept} (--from-measurements refits them)",
                file=sys.stderr,
            )
            if isinstance(e, RuntimeError):
                print(f"{ap.prog}: error: {e}", file=sys.stderr)
                return 1
            raise
        kept.unlink(missing_ok=True)
    return _done(data)


def _pair(values: tuple[float, ...], flag: str) -> tuple[float, float]:
    if len(values) != 2:
        raise ConfigError(f"{flag}: two numbers, LOW,HIGH")
    return values[0], values[1]


def _fit_budget(budget_min: float | None, started: float) -> float | None:
    if budget_min is None:
        return None
    return max(10.0, budget_min * 60 - (time.monotonic() - started))


def _keep(path: Path, cfg: RunConfig, m: Measurements) -> None:
    data = {
        "name": cfg.name, "service": dataclasses.asdict(cfg.info), "node": dataclasses.asdict(m.node),
        "machine": m.machine, "plan": dataclasses.asdict(cfg.plan),
        "probe": dataclasses.asdict(m.probe), "qos_target_us": m.qos_target_us, "skipped": m.skipped,
        "measurements": [_measured_json(x) for x in m.measured],
    }  # fmt: skip
    path.write_text(json.dumps(plain_data(data)) + "\n")


@contextlib.contextmanager
def _bench(
    args: argparse.Namespace, tmp: Path, factory: Callable[..., Any] | None
) -> Iterator[tuple[Any, ServiceInfo]]:
    """The bench the arguments describe, closed (the node restored) whatever happens."""
    threads = args.threads
    if args.service is not None:
        with debian_service(args.service, tmp) as (pids, url, info):
            if threads:
                info = dataclasses.replace(info, threads=threads)
            if args.description:
                info = dataclasses.replace(info, description=args.description)
            load = LoadSpec(args.name, url, None, rt=not args.no_rt)
            with contextlib.closing(
                factory(args.name, info)
                if factory
                else LinuxBench(args.name, load, tmp, pids=pids, be=args.be_threads > 0)
            ) as b:
                yield b, info
        return
    load = LoadSpec(args.name, args.target, args.load_cmd, rt=not args.no_rt)
    info = ServiceInfo(
        threads or int(os.cpu_count() or 1),
        args.queue,
        args.description or f"{args.name} (profiled by hw.profile)",
    )
    bench = factory(args.name, info) if factory else LinuxBench(
        args.name, load, tmp, pids=tuple(args.pid), cgroup=args.cgroup, be=args.be_threads > 0
    )  # fmt: skip
    with contextlib.closing(bench) as b:
        if args.threads is None:
            info = dataclasses.replace(info, threads=int(b.cores))
        yield b, info


def _done(data: dict) -> int:
    s = data["summary"]
    for k in ("fit", "heldout"):
        e = s[k]
        print(
            f"{data['name']} {k:8s}: {e['points']:2d} points, median error {e['median']:.1%}, worst {e['worst']:.1%} "
            f"({e['worst_at']})"
        )
    print(f"wrote {data['files']['app']}, {data['files']['node']} and the report")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: module docstring."""
    return run_cli("python -m hw.profile", lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
