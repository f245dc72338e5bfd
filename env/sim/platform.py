"""Hardware platforms for the simulator, loaded from `configs/node/*.yaml` (DESIGN §4).

A platform is the managed part of one server: physical cores (IRQ cores excluded), hyperthreads,
DVFS levels and turbo under a shared socket power budget, LLC ways and CAT classes of service, MBA
where present, memory capacity and bandwidth, a disk and a network link. The defaults describe
PARTIES Table 1 (one socket of a dual Xeon E5-2699 v4, 8 of its 22 cores reserved for network
interrupts, Sec. 3).

The CORE knob is whole physical cores as cpusets by default (PARTIES Table 3). A small machine
trades cores in CPU-quota steps instead (`core_mode: quota`, as a Linux node does whose cores
are CFS quotas): every app then runs on all cores under a CFS quota of its allocation
(`engine.alloc_rows`), and the kernel models the quota's throttling per CFS period. `knobs` names
the resources a controller may move on this node (the real node masks what it lacks, e.g. CAT on a
VM); empty means all of them.

Every quantity is checked against its physical range when a platform is built (counts >= 1,
capacities and bandwidths > 0, allocation steps > 0 and no larger than what they divide), so a
platform file either loads or is a `ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from env.config import ConfigError, build, load_yaml, require_in, require_positive, resolve_config
from env.types import Capabilities, Resource

MAX_CORES = 1024  # physical cores of one socket
MAX_WAYS = 64  # LLC ways and CAT classes of service
MAX_FREQ_MHZ = 10_000
MAX_FREQ_LEVELS = 1000  # DVFS levels between min and nominal


@dataclass(frozen=True)
class LlcSpec:
    """The last-level cache: ways, size (MB), CAT classes of service and its contention model."""

    ways: int
    mb: float
    clos: int  # CAT classes of service (hardware partitions)
    bandwidth_gbps: float = 400.0  # uncore (ring + LLC) bandwidth before contention builds up
    contention: float = 0.3  # LLC latency growth with uncore utilisation u: 1 + c*u^2/(1-u)
    stream_weight: float = 0.1  # weight of streamed (scan) lines in LLC sharing: adaptive insertion
    min_ways: int = 1


@dataclass(frozen=True)
class MbaSpec:
    """Memory Bandwidth Allocation throttle levels (%) and the latency they add; empty = no MBA."""

    levels_pct: tuple[int, ...] = ()  # empty: no MBA (PARTIES Table 3: "no mechanism available")
    delay: float = 0.0  # latency factor of an off-core access under throttle p%: 1 + delay*(100-p)/100


@dataclass(frozen=True)
class FreqSpec:
    """DVFS: userspace-governor levels from `min_mhz` to `nominal_mhz` in `step_mhz` steps, and turbo."""

    min_mhz: int
    nominal_mhz: int  # highest userspace-governor level; base frequency
    step_mhz: int = 100
    turbo_mhz: int = 0  # max single-core turbo; 0 = no turbo level
    all_core_turbo_mhz: int = 0


@dataclass(frozen=True)
class PowerSpec:
    """The socket power budget (W) and the per-core power model that limits turbo."""

    tdp_w: float
    uncore_w: float
    core_idle_w: float
    core_dynamic_w: float  # one busy core at nominal frequency, power factor 1
    irq_active_cores: float = 0.0  # IRQ cores counted busy for turbo bins and power


@dataclass(frozen=True)
class MemorySpec:
    """DRAM capacity and bandwidth, its loaded latency and how fast a lowered limit is reclaimed."""

    gb: float  # usable by apps (OS reservation excluded)
    bandwidth_gbps: float  # peak streaming DRAM bandwidth
    latency_ns: float = 90.0
    queueing: float = 0.15  # loaded latency: 1 + q*u^2/(1-u) at utilisation u
    reclaim_gbps: float = 2.0  # how fast the kernel reclaims memory after a limit is lowered
    step_gb: float = 1.0


@dataclass(frozen=True)
class DiskSpec:
    """The disk: random IOPS, sequential MB/s, the allocation step and the scheduler's time slice.

    With d random reads outstanding the disk completes iops x min(d, queue_depth)^ncq_exponent reads
    per second: command queueing (NCQ) and the elevator reorder the queue to shorten seeks, so a
    deeper queue is served faster (0 = a FIFO disk, 1 = perfect parallelism)."""

    iops: float  # random reads per second, one outstanding
    seq_mbps: float  # sequential bandwidth
    step_mbps: float
    slice_ms: float = 100.0  # I/O scheduler time slice a competing stream can hold the disk for
    ncq_exponent: float = 0.0
    queue_depth: int = 32  # the device's command queue (NCQ: 32)


@dataclass(frozen=True)
class NetworkSpec:
    """The network link (Gbit/s), its allocation step and the queueing delay once it saturates."""

    gbps: float
    step_gbps: float = 0.5
    congestion_delay_ms: float = 1.0  # standing queue once the link saturates


@dataclass(frozen=True)
class Platform:
    """The managed part of one server (module docstring), as `configs/node/<name>.yaml` describes it."""

    name: str
    description: str
    cores: int  # managed physical cores
    threads_per_core: int
    socket_cores: int  # all cores of the socket (turbo bins count them)
    llc: LlcSpec
    freq: FreqSpec
    power: PowerSpec
    memory: MemorySpec
    disk: DiskSpec
    network: NetworkSpec
    mba: MbaSpec = MbaSpec()
    sched_wakeup_delay_ms: float = 2.0  # CFS wake-up delay behind a CPU hog on the same hyperthread
    sched_slice_ms: float = 4.0  # CFS time slice when threads outnumber hardware threads
    migration_penalty: float = 0.05  # service slowdown during the interval its cores changed
    interval_s: float = 0.5
    core_mode: Literal["cpuset", "quota"] = "cpuset"  # how the CORE knob is actuated (module docstring)
    quota_step_cores: float = 0.25  # one CORE move in quota mode
    cfs_period_ms: float = 100.0  # cpu.cfs_period_us: a CFS quota is granted per period
    # quota left unused on each further CPU a throttled group runs on: per-CPU runtime is handed out
    # in slices (sched_cfs_bandwidth_slice_us, 5 ms) and only partly returned (Linux sched-bwc.rst)
    cfs_stranded_ms: float = 0.0
    # mean wait of a request whose thread a co-runner throttled by its CFS quota preempts when it
    # resumes at the next period (model step 1; 0: not modelled, as on the papers' nodes)
    cfs_resume_wait_ms: float = 0.0
    knobs: tuple[str, ...] = ()  # resources a controller may move here (env.types.Resource); () = all
    source: str = ""
    fitted: tuple[str, ...] = ()  # fields fitted to measurements on the node

    def __post_init__(self) -> None:
        f = self.freq
        if not (0 < f.min_mhz <= f.nominal_mhz):
            raise ConfigError(f"platform {self.name}: need 0 < freq.min_mhz <= freq.nominal_mhz")
        if f.turbo_mhz and f.turbo_mhz <= f.nominal_mhz:
            raise ConfigError(f"platform {self.name}: freq.turbo_mhz must exceed nominal_mhz (or be 0)")
        if self.cores < 1 or self.cores > self.socket_cores:
            raise ConfigError(f"platform {self.name}: cores must be in 1..socket_cores")
        if self.llc.ways < 1 or self.llc.clos < 1:
            raise ConfigError(f"platform {self.name}: llc.ways and llc.clos must be >= 1")
        for p in self.mba.levels_pct:
            if not 0 < p <= 100:
                raise ConfigError(f"platform {self.name}: mba.levels_pct must be in 1..100, got {p}")
        known = [r.value for r in Resource]
        bad = [k for k in self.knobs if k not in known]
        if bad:
            raise ConfigError(f"platform {self.name}.knobs: {bad} unknown; choose from {known}")
        self._check_ranges(f"platform {self.name}")

    def _check_ranges(self, where: str) -> None:
        """The physical ranges of the module docstring; `ConfigError` naming the first field outside."""
        llc, f, pw, mem, disk, net = self.llc, self.freq, self.power, self.memory, self.disk, self.network
        require_in(where, 1, MAX_CORES, socket_cores=self.socket_cores)
        require_in(where, 1, 8, threads_per_core=self.threads_per_core)
        require_in(where, 1, MAX_WAYS, **{"llc.ways": llc.ways, "llc.clos": llc.clos})
        require_in(where, 1, llc.ways, **{"llc.min_ways": llc.min_ways})
        require_in(
            where,
            0.0,
            1.0,
            **{"llc.stream_weight": llc.stream_weight},
            migration_penalty=self.migration_penalty,
        )
        require_in(where, 1, MAX_FREQ_MHZ, **{"freq.nominal_mhz": f.nominal_mhz, "freq.step_mhz": f.step_mhz})
        if (f.nominal_mhz - f.min_mhz) // f.step_mhz > MAX_FREQ_LEVELS:
            raise ConfigError(f"{where}: more than {MAX_FREQ_LEVELS} frequency levels (raise freq.step_mhz)")
        if f.all_core_turbo_mhz and not f.nominal_mhz <= f.all_core_turbo_mhz <= max(
            f.turbo_mhz, f.nominal_mhz
        ):
            raise ConfigError(f"{where}: freq.all_core_turbo_mhz must be in nominal_mhz..turbo_mhz (or 0)")
        require_positive(
            where,
            **{
                "llc.mb": llc.mb,
                "llc.bandwidth_gbps": llc.bandwidth_gbps,
                "power.tdp_w": pw.tdp_w,
                "power.core_dynamic_w": pw.core_dynamic_w,
                "memory.gb": mem.gb,
                "memory.bandwidth_gbps": mem.bandwidth_gbps,
                "memory.latency_ns": mem.latency_ns,
                "memory.reclaim_gbps": mem.reclaim_gbps,
                "disk.iops": disk.iops,
                "disk.seq_mbps": disk.seq_mbps,
                "network.gbps": net.gbps,
                "sched_slice_ms": self.sched_slice_ms,
                "sched_wakeup_delay_ms": self.sched_wakeup_delay_ms,
            },
        )
        require_in(where, 1e-3, 60.0, interval_s=self.interval_s)
        require_in(where, 1.0, 1000.0, cfs_period_ms=self.cfs_period_ms)  # the kernel's 1 ms .. 1 s
        require_in(where, 0.0, self.cfs_period_ms, cfs_stranded_ms=self.cfs_stranded_ms)
        require_in(where, 0.0, self.cfs_period_ms / 2.0, cfs_resume_wait_ms=self.cfs_resume_wait_ms)
        require_in(where, 0.01, float(self.cores), quota_step_cores=self.quota_step_cores)
        require_in(where, 1e-9, mem.gb, **{"memory.step_gb": mem.step_gb})
        require_in(where, 1e-9, disk.seq_mbps, **{"disk.step_mbps": disk.step_mbps})
        require_in(where, 1e-9, net.gbps, **{"network.step_gbps": net.step_gbps})
        require_in(
            where,
            0.0,
            1e12,
            **{
                "llc.contention": llc.contention,
                "mba.delay": self.mba.delay,
                "power.uncore_w": pw.uncore_w,
                "power.core_idle_w": pw.core_idle_w,
                "power.irq_active_cores": pw.irq_active_cores,
                "memory.queueing": mem.queueing,
                "disk.slice_ms": disk.slice_ms,
                "network.congestion_delay_ms": net.congestion_delay_ms,
            },
        )

    @property
    def freq_levels_mhz(self) -> tuple[int, ...]:
        f = self.freq
        levels = tuple(range(f.min_mhz, f.nominal_mhz + 1, f.step_mhz))
        return levels + ((f.turbo_mhz,) if f.turbo_mhz else ())

    @property
    def mb_per_way(self) -> float:
        return self.llc.mb / self.llc.ways

    @property
    def core_step(self) -> float:
        """One CORE move: a physical core, or a CPU-quota step in quota mode."""
        return self.quota_step_cores if self.core_mode == "quota" else 1.0

    def capabilities(self, apps=()) -> Capabilities:
        return Capabilities(
            node_name=self.name,
            interval_s=self.interval_s,
            cores=float(self.cores),
            core_step=self.core_step,
            llc_ways=self.llc.ways,
            clos_count=self.llc.clos,
            freq_levels_mhz=self.freq_levels_mhz,
            nominal_freq_mhz=self.freq.nominal_mhz,
            memory_gb=self.memory.gb,
            memory_step_gb=self.memory.step_gb,
            disk_mbps=self.disk.seq_mbps,
            disk_step_mbps=self.disk.step_mbps,
            net_gbps=self.network.gbps,
            net_step_gbps=self.network.step_gbps,
            mba_levels_pct=tuple(self.mba.levels_pct),
            turbo=bool(self.freq.turbo_mhz),
            knobs=frozenset(Resource(k) for k in self.knobs) if self.knobs else frozenset(Resource),
            apps=tuple(apps),
            min_llc_ways=self.llc.min_ways,
            min_memory_gb=self.memory.step_gb,
            tdp_w=self.power.tdp_w,
            llc_mb=self.llc.mb,
            dram_peak_gbps=self.memory.bandwidth_gbps,
        )


@cache
def _load_platform(path: str) -> Platform:
    return build(Platform, load_yaml(path), where=Path(path).name)


def load_platform(name_or_path: str | Path = "parties") -> Platform:
    """A platform by name (`configs/node/<name>.yaml`) or by path."""
    return _load_platform(str(resolve_config("node", name_or_path)))
