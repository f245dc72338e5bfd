"""Workload profiles: physical quantities per app, one set used in every experiment (DESIGN §4).

Two kinds, both from `configs/apps/*.yaml`. A profile may `extends: <app>`: another deployment of
the same software (e.g. the Q-PRM thesis' memcached) inherits the app's physical, fitted parameters
and overrides only what its deployment changes (QoS target, max load, threads, reference).

* `LcProfile`: a latency-critical service (PARTIES Table 2). Its service time per request is
  split into a core part (scales with 1/frequency), an LLC part (scales with uncore contention) and
  a DRAM part (scales with its LLC miss ratio and the loaded memory latency). Requests queue on
  its threads (`queue: per_thread` for event-driven servers whose connections are pinned to
  worker threads, `shared` for a worker pool). Memory beyond what is resident becomes page faults
  served by the disk; responses cross the network link.
* `BatchProfile`: a throughput job made of thread classes (the PARTIES BE job; the Table 3
  antagonists). Antagonists carry a placement relative to the LC app they stress.

*Max load* is the knee of the latency-vs-load curve (PARTIES Sec. 3.2), so one quantity of each
LC app is derived rather than given (`env.sim.engine.reference_knee`): the app alone on its
reference allocation at max load meets its target in 97% of the 500 ms intervals. For a
CPU-bound app (`knee: cpu`) that quantity is its service time per request; for an I/O-bound app
(`knee: disk`, MongoDB) it is the page touches per request that miss to disk, and its service time
comes from its CPU share (`service_us`).
Parameters marked "fitted" come from `python -m env.sim.fit` (they are written into the YAML by
it); all others are from the papers or documented physical estimates. Every parameter is checked
against its physical range when a profile is built (a count is >= 1, a rate or size >= 0, a
fraction in [0, 1]), so that a profile either loads or is a `ConfigError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from env.config import CONFIGS, ConfigError, build, load_yaml, require_in, require_positive, resolve_config

MAX_THREADS = 4096  # threads of one app or thread class: more than any socket runs
MAX_RPS = 1e9  # max load of one app (memcached on PARTIES' Xeon: 1.28M rps)
MAX_LATENCY_US = 1e9  # a QoS target of 1000 s is not a latency-critical service


@dataclass(frozen=True)
class Reference:
    """Where max load was measured (PARTIES Sec. 3.3: 8 threads on 8 physical cores, one per core,
    the whole LLC, the performance governor, no co-runner)."""

    platform: str = "parties"
    cores: int = 8


@dataclass(frozen=True)
class LcProfile:
    """A latency-critical service (module docstring): QoS target and max load from PARTIES Table 2,
    the physical parameters of its service time, and its deployment."""

    name: str
    description: str
    qos_target_us: float  # PARTIES Table 2
    max_load_rps: float  # PARTIES Table 2 (the knee)
    threads: int
    queue: Literal["per_thread", "shared"]
    # service-time composition at nominal frequency, reference occupancy, idle memory (fitted)
    frac_llc: float
    frac_mem: float
    smt_speed: float  # per-thread speed while the sibling hyperthread runs a compute hog (fitted)
    base_latency_us: float  # network round trip and client time, outside the server (fitted)
    # LLC: miss ratio m(x) = miss_min + (1 - miss_min) * (1 + x / llc_kappa_mb)^-llc_alpha at occupancy x
    llc_kappa_mb: float
    llc_miss_min: float
    llc_accesses_per_req: float  # L2 misses per request (LLC accesses)
    dram_bytes_per_req: float  # PARTIES Table 2 memory bandwidth / max load
    # memory: a Zipf-popular data set accessed through memory; non-resident pages fault to disk
    dataset_gb: float
    zipf: float
    pages_per_req: float
    io_kb: float  # KB per disk read
    net_bytes_per_req: float  # PARTIES Table 2 network bandwidth / max load
    ios_per_miss: float = 1.0  # sequential disk reads per page-cache miss event (index + data pages)
    # a B-tree index over hashed keys whose leaf each request reads (model step 4), as bytes per byte
    # of the data set: its leaves are touched about equally, so it stays resident whole or misses on
    # most requests (0: none)
    index_frac: float = 0.0
    # time a request holds its worker thread besides its CPU time and disk reads (synchronous waits in
    # the storage engine and the network stack; fitted where it matters: MongoDB, whose knee is its
    # threads, not its disk, PARTIES Sec. 5.2.1)
    hold_us: float = 0.0
    threads_follow_cores: bool = (
        True  # deployed with one worker thread per managed core (engine.lc_profile_of)
    )
    llc_alpha: float = 1.0
    smt_pressure: float = 0.5  # how much its thread slows its sibling, relative to a compute hog (1)
    service_cv2: float = 1.0  # variability stretching the queueing wait ((1 + cv2)/2, Allen-Cunneen)
    service_det: float = 0.0  # deterministic share of the service time (0 = exponential; cv^2 = (1-det)^2)
    # per_thread: the busiest worker's share of the requests over an even split (1 = even). Worker
    # processes that each accept their own connections do not share them evenly (fitted: NGINX)
    worker_imbalance: float = 1.0
    power_factor: float = 0.8
    net_flows: float = 8.0  # client connections, for the link's per-flow fairness
    timeout_ms: float = (
        0.0  # requests waiting longer are dropped (bounded server-side queues); 0 -> max(50 ms, 10 x target)
    )
    memory_gb: float = 0.0  # resident footprint reported by PARTIES Table 2 (informational)
    knee: Literal["cpu", "disk"] = "cpu"
    knee_load: float = 1.05  # the knee, as a multiple of max load (PARTIES: mid-step above it)
    knee_meet_prob: float = 0.97  # P(the 1-minute p99 meets the target) at the knee
    service_us: float = 0.0  # knee: disk only - CPU time per request at nominal frequency
    stateless: bool = False
    in_memory: bool = False
    reference: Reference = field(default_factory=Reference)
    source: str = ""
    fitted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.qos_target_us <= 0 or self.max_load_rps <= 0 or self.threads < 1:
            raise ConfigError(f"app {self.name}: qos_target_us, max_load_rps and threads must be positive")
        if not (self.frac_llc >= 0 and self.frac_mem >= 0 and self.frac_llc + self.frac_mem < 1):
            raise ConfigError(f"app {self.name}: need frac_llc, frac_mem >= 0 and frac_llc + frac_mem < 1")
        if not 0 < self.smt_speed <= 1:
            raise ConfigError(f"app {self.name}: smt_speed must be in (0, 1]")
        if not 0 <= self.llc_miss_min <= 1:
            raise ConfigError(f"app {self.name}: llc_miss_min must be in [0, 1]")
        if self.knee == "disk" and self.service_us <= 0:
            raise ConfigError(f"app {self.name}: knee: disk needs service_us (its CPU time per request)")
        where = f"app {self.name}"
        require_in(where, 1, MAX_THREADS, threads=self.threads)
        require_in(where, 1e-3, MAX_RPS, max_load_rps=self.max_load_rps)
        require_in(where, 1e-3, MAX_LATENCY_US, qos_target_us=self.qos_target_us)
        require_positive(
            where,
            ios_per_miss=self.ios_per_miss,
            llc_kappa_mb=self.llc_kappa_mb,
            dataset_gb=self.dataset_gb,
            io_kb=self.io_kb,
            net_flows=self.net_flows,
            knee_load=self.knee_load,
        )
        require_in(where, 0.05, 10.0, llc_alpha=self.llc_alpha)  # the miss curve's exponent
        require_in(where, 0.0, 1.0, index_frac=self.index_frac)  # an index no larger than its data
        require_in(where, 1.0, float(self.threads), worker_imbalance=self.worker_imbalance)
        require_in(where, 0.0, 0.999, service_det=self.service_det, knee_meet_prob=self.knee_meet_prob)
        require_in(
            where,
            0.0,
            1e12,
            base_latency_us=self.base_latency_us,
            llc_accesses_per_req=self.llc_accesses_per_req,
            dram_bytes_per_req=self.dram_bytes_per_req,
            zipf=self.zipf,
            pages_per_req=self.pages_per_req,
            net_bytes_per_req=self.net_bytes_per_req,
            smt_pressure=self.smt_pressure,
            service_cv2=self.service_cv2,
            power_factor=self.power_factor,
            timeout_ms=self.timeout_ms,
            memory_gb=self.memory_gb,
            service_us=self.service_us,
        )

    @property
    def kind(self) -> str:
        return "lc"

    @property
    def frac_core(self) -> float:
        return 1.0 - self.frac_llc - self.frac_mem

    @property
    def pages_gb(self) -> float:
        """Everything it can page in: its data set and its index (more is never resident)."""
        return self.dataset_gb + self.index_gb

    @property
    def index_gb(self) -> float:
        return self.dataset_gb * self.index_frac

    @property
    def timeout_s(self) -> float:
        return (self.timeout_ms or max(50.0, 10 * self.qos_target_us / 1000)) / 1000


@dataclass(frozen=True)
class ThreadClass:
    """A group of identical threads of a batch job. Cache and memory rates are per thread at full
    speed (they follow its progress); disk and network demand are per thread while it runs."""

    threads: int
    cpu_util: float = 1.0  # fraction of time each thread is runnable (I/O-bound threads mostly wait)
    frac_llc: float = 0.0
    frac_mem: float = 0.0
    smt_speed: float = 0.6  # speed beside a compute hog on the sibling hyperthread
    smt_pressure: float = 1.0  # how much it slows its sibling (compute hog = 1, memory-bound ~0.3)
    power_factor: float = 1.0
    llc_access_gbps: float = 0.0  # LLC access bandwidth (64 B lines)
    llc_footprint_mb: float = 0.0  # streamed array per thread; its misses go to DRAM
    memory_gb: float = 0.0  # resident data, streamed uniformly
    disk_mbps: float = 0.0  # sequential reads, per thread while the job runs
    net_gbps: float = 0.0  # egress, per thread while the job runs
    net_flows: float = 0.0

    def check(self, where: str) -> None:
        """`ConfigError` naming the first parameter outside its physical range (module docstring)."""
        require_in(where, 1, MAX_THREADS, threads=self.threads)
        require_in(where, 0.01, 1.0, cpu_util=self.cpu_util, smt_speed=self.smt_speed)
        require_in(where, 0.0, 1.0, frac_llc=self.frac_llc, frac_mem=self.frac_mem)
        if not self.frac_llc + self.frac_mem < 1:
            raise ConfigError(f"{where}: need frac_llc + frac_mem < 1 (the rest is core time)")
        require_in(
            where,
            0.0,
            1e12,
            smt_pressure=self.smt_pressure,
            power_factor=self.power_factor,
            llc_access_gbps=self.llc_access_gbps,
            llc_footprint_mb=self.llc_footprint_mb,
            memory_gb=self.memory_gb,
            disk_mbps=self.disk_mbps,
            net_gbps=self.net_gbps,
            net_flows=self.net_flows,
        )


@dataclass(frozen=True)
class BatchProfile:
    """A throughput job made of thread classes: the PARTIES BE job or a Table 3 antagonist."""

    name: str
    description: str
    classes: tuple[ThreadClass, ...]
    # where an antagonist runs relative to the LC app it stresses (PARTIES Table 3)
    placement: Literal["allocated", "same_threads", "sibling_threads", "free_cores"] = "allocated"
    source: str = ""

    def __post_init__(self) -> None:
        if not self.classes:
            raise ConfigError(f"batch job {self.name}: classes is empty; a job has at least one thread class")
        for i, c in enumerate(self.classes):
            c.check(f"batch job {self.name}.classes[{i}]")
        if self.threads > MAX_THREADS:
            raise ConfigError(f"batch job {self.name}: {self.threads} threads; at most {MAX_THREADS}")

    @property
    def kind(self) -> str:
        return "batch"

    @property
    def threads(self) -> int:
        return sum(c.threads for c in self.classes)


Profile = LcProfile | BatchProfile


def _parse(data: dict, where: str) -> Profile:
    if isinstance(data, dict) and "extends" in data:  # another deployment of the same app
        base = data["extends"]
        if not isinstance(base, str):
            raise ConfigError(f"{where}.extends: expected the name of an app profile, got {base!r}")
        try:
            base_data = load_yaml(resolve_config("apps", base))
        except ConfigError as e:
            raise ConfigError(f"{where}.extends: {e}") from None
        if not isinstance(base_data, dict) or "extends" in base_data:
            raise ConfigError(f"{where}.extends: {base!r} must be a plain profile (no chains)")
        data = {**base_data, **{k: v for k, v in data.items() if k != "extends"}}  # fitted values inherited
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"{where}: a profile needs `kind: lc` or `kind: batch`")
    data = dict(data)
    kind = data.pop("kind")
    if kind == "lc":
        return build(LcProfile, data, where)
    if kind == "batch":
        return build(BatchProfile, data, where)
    raise ConfigError(f"{where}.kind: {kind!r} is not allowed; choose one of ['lc', 'batch']")


@cache
def _read_profile(path: str) -> Profile:
    return _parse(load_yaml(path), Path(path).name)


# the loader load_profile() goes through; env.sim.fit swaps it to serve a candidate profile
_load_profile: Callable[[str], Profile] = _read_profile


def load_profile(name_or_path: str | Path) -> Profile:
    """An app or batch profile by name (`configs/apps/<name>.yaml`) or path."""
    return _load_profile(str(resolve_config("apps", name_or_path)))


def load_lc_profile(name_or_path: str | Path) -> LcProfile:
    """An LC app's profile, for callers that need its LC fields (QoS target, max load); a batch
    job is a `ConfigError`."""
    prof = load_profile(name_or_path)
    if not isinstance(prof, LcProfile):
        raise ConfigError(f"{name_or_path}: {prof.name!r} is a batch job, not an LC app")
    return prof


def known_profiles() -> list[str]:
    """The names of every shipped profile (configs/apps/), LC apps and batch jobs."""
    return sorted(p.stem for p in (CONFIGS / "apps").glob("*.yaml"))
