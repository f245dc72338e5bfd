"""Capability probe: which knobs this host really has, their ranges, and the `Capabilities` a
controller sees (DESIGN §3, §6.5: fail fast at start-up with a message that says what to enable).

Each configured knob is checked against the host:

* core  - cpuset (cpuset mode) or CPU bandwidth control (quota mode) cgroup controller
* cache - resctrl mounted with L3 CAT (`info/L3`)
* freq  - cpufreq on every managed CPU (and the userspace governor in userspace mode); cpuset mode
          only, since in quota mode core groups share CPUs and a per-core cap would hit them all
* mem   - memory cgroup controller
* disk  - blkio (v1) / io (v2) controller and a block device with a major:minor
* net   - the `tc` binary and the device

A missing knob is masked in `Capabilities.knobs` (its moves become infeasible) or, with
`require_knobs`, stops start-up with `CapabilityError` listing every missing knob and what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from env.types import AppSpec, Capabilities, Resource
from hw.cgroups import CgroupLayout, detect_layout, device_number, parse_cpu_list
from hw.config import Knob, LinuxNodeConfig
from hw.cpufreq import CpuFreqInfo
from hw.cpufreq import read_info as read_cpufreq
from hw.resctrl import ResctrlInfo
from hw.resctrl import read_info as read_resctrl
from hw.runner import HwError, HwInputError, Runner, Sysfs

KNOB_RESOURCE: dict[Knob, Resource] = {
    "core": Resource.CORE,
    "cache": Resource.CACHE,
    "freq": Resource.FREQ,
    "mem": Resource.MEM,
    "disk": Resource.DISK,
}


class CapabilityError(HwError):
    """A configured knob is missing on this host (the message says what to enable)."""


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found on this host (module docstring): CPUs and physical cores, memory, LLC, RDT,
    cpufreq and the disk, which configured knobs are available and, for each missing one, what to enable."""

    cgroups: CgroupLayout
    cpus: tuple[int, ...]  # managed logical CPUs
    cores: tuple[tuple[int, ...], ...]  # physical cores: hyperthread siblings among `cpus`
    mem_total_gb: float
    llc_ways_sysfs: int
    resctrl: ResctrlInfo | None
    cpufreq: CpuFreqInfo | None
    disk_device: str | None  # MAJ:MIN
    available: frozenset[Knob]  # knobs usable here (among the configured ones)
    missing: dict[Knob, str] = field(default_factory=dict)  # knob -> what to enable

    def summary(self) -> str:
        lines = [
            f"cgroup v{self.cgroups.version}{' (hybrid: v2 for PSI)' if self.cgroups.hybrid else ''}",
            f"cpus {list(self.cpus)} = {len(self.cores)} physical cores",
            f"memory {self.mem_total_gb:.1f} GB",
            f"knobs available: {sorted(self.available)}",
        ]
        lines += [f"missing {k}: {why}" for k, why in sorted(self.missing.items())]
        return "\n".join(lines)


def online_cpus(cpu_root: Path, fs: Sysfs) -> tuple[int, ...]:
    """The online logical CPUs (`cpu/online`; every `cpuN` directory where that file is missing)."""
    f = cpu_root / "online"
    if fs.exists(f):
        return parse_cpu_list(fs.read(f))
    return tuple(range(len([n for n in fs.listdir(cpu_root) if n[3:].isdigit() and n.startswith("cpu")])))


def physical_cores(cpu_root: Path, cpus: tuple[int, ...], fs: Sysfs) -> tuple[tuple[int, ...], ...]:
    """Group logical CPUs into physical cores by `topology/thread_siblings_list` (each CPU is its
    own core where topology is unreadable). Only siblings that are all managed form a core."""
    seen: set[int] = set()
    out = []
    for c in cpus:
        if c in seen:
            continue
        f = cpu_root / f"cpu{c}" / "topology" / "thread_siblings_list"
        sib = parse_cpu_list(fs.read(f)) if fs.exists(f) else (c,)
        group = tuple(x for x in sib if x in cpus) or (c,)
        seen.update(group)
        out.append(group)
    return tuple(out)


def _meminfo_gb(proc_root: Path, fs: Sysfs) -> float:
    for line in fs.read(proc_root / "meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024 / 2**30
    return math.nan


def _llc_ways(cpu_root: Path, fs: Sysfs) -> int:
    d = cpu_root / "cpu0" / "cache"
    if not fs.is_dir(d):
        return 0
    for idx in fs.listdir(d):
        if fs.exists(d / idx / "level") and fs.read(d / idx / "level").strip() == "3":
            return int(fs.read(d / idx / "ways_of_associativity"))
    return 0


def probe(cfg: LinuxNodeConfig, *, fs: Sysfs | None = None, runner: Runner | None = None) -> ProbeResult:
    """Check every configured knob against the host (module docstring); an unusable `cores.cpus` is a
    `HwInputError`, a missing knob is listed in `missing` (`check` decides whether that is fatal)."""
    fs = fs or Sysfs()
    runner = runner or Runner()
    cpu_root = Path(cfg.cpu_root)
    layout = detect_layout(cfg.cgroup_root, fs)
    online = online_cpus(cpu_root, fs)
    cpus = tuple(sorted(cfg.cores.cpus)) if cfg.cores.cpus else online
    bad = sorted(set(cpus) - set(online))
    if bad:
        raise HwInputError(f"cores.cpus: CPUs {bad} are not online (online: {list(online)})")
    missing: dict[Knob, str] = {}
    avail: set[Knob] = set()
    want = set(cfg.knobs)

    if "core" in want:
        ctrl = "cpuset" if cfg.cores.mode == "cpuset" else "cpu"
        if layout.has(ctrl):
            avail.add("core")
        else:
            missing["core"] = f"the {ctrl} cgroup controller is not available: " + (
                f"enable it in {layout.root}/cgroup.subtree_control"
                if layout.version == 2
                else f"mount it (mount -t cgroup -o {ctrl} none {layout.root}/{ctrl})"
            )
    if "mem" in want:
        if layout.has("memory"):
            avail.add("mem")
        else:
            missing["mem"] = "the memory cgroup controller is not available (boot with cgroup_enable=memory)"
    disk_dev = None
    if "disk" in want:
        try:
            disk_dev = device_number(cfg.disk.device or "", cfg.sys_root)
        except HwInputError as e:
            raise HwInputError(f"disk.device: {e}") from None
        if layout.has("io"):
            avail.add("disk")
        else:
            missing["disk"] = "the blkio (v1) / io (v2) cgroup controller is not available"
    rinfo = read_resctrl(cfg.cache.resctrl_root, fs) if "cache" in want else None
    if "cache" in want:
        if rinfo is not None:
            avail.add("cache")
        else:
            missing["cache"] = (
                f"resctrl is not mounted at {cfg.cache.resctrl_root}: mount -t resctrl resctrl "
                f"{cfg.cache.resctrl_root} (needs Intel RDT CAT: 'cat_l3' in /proc/cpuinfo)"
            )
    finfo = read_cpufreq(cpu_root, cpus, fs)
    if "freq" in want:
        if cfg.cores.mode == "quota":
            missing["freq"] = "per-core frequency needs cores.mode: cpuset (quota-mode groups share CPUs)"
        elif finfo is None:
            missing["freq"] = f"no cpufreq driver for CPUs {list(cpus)} under {cpu_root} (load acpi-cpufreq)"
        elif cfg.freq.mode == "userspace" and "userspace" not in finfo.governors:
            missing["freq"] = (
                f"the userspace governor is missing (have {list(finfo.governors)}); use freq.mode: max_freq"
            )
        else:
            avail.add("freq")
    if "net" in want:
        if runner.which("tc") is None:
            missing["net"] = "the tc binary is missing (apt-get install iproute2)"
        else:
            avail.add("net")
    return ProbeResult(
        cgroups=layout,
        cpus=cpus,
        cores=physical_cores(cpu_root, cpus, fs),
        mem_total_gb=_meminfo_gb(Path(cfg.proc_root), fs),
        llc_ways_sysfs=_llc_ways(cpu_root, fs),
        resctrl=rinfo,
        cpufreq=finfo,
        disk_device=disk_dev,
        available=frozenset(avail),
        missing=missing,
    )


def check(cfg: LinuxNodeConfig, result: ProbeResult) -> None:
    """Fail fast when a configured knob is missing and `require_knobs` is set."""
    if cfg.require_knobs and result.missing:
        lines = "\n".join(f"  - {k}: {why}" for k, why in sorted(result.missing.items()))
        raise CapabilityError(
            f"node {cfg.name}: configured knobs missing on this host:\n{lines}\n"
            "Enable them, drop them from `knobs`, or set require_knobs: false to mask them."
        )


def capabilities(cfg: LinuxNodeConfig, result: ProbeResult) -> Capabilities:
    """The node's `Capabilities`: ranges from the probe, knobs masked to what is available."""
    apps = tuple(
        AppSpec(a.name, a.kind, a.qos_target_us, a.max_load_rps, a.stateless, a.in_memory) for a in cfg.apps
    )
    n_apps = len(apps)
    if cfg.cores.mode == "cpuset":
        cores, core_step = float(len(result.cores)), 1.0
    else:
        cores, core_step = float(len(result.cpus)), cfg.cores.quota_step_cores
        if abs(cores / core_step - round(cores / core_step)) > 1e-9:
            raise HwInputError(f"cores.quota_step_cores {core_step} does not divide {cores} CPUs")
    if result.resctrl is not None and "cache" in result.available:
        ways, clos = result.resctrl.ways, result.resctrl.clos_available
        min_ways = result.resctrl.min_cbm_bits
        mba = result.resctrl.mba_levels_pct
    else:  # no CAT: ways are nominal (the CACHE knob is masked), one CLOS per app
        ways = max(cfg.cache.ways_fallback or result.llc_ways_sysfs, n_apps)
        clos, min_ways, mba = n_apps, 1, ()
    if result.cpufreq is not None and "freq" in result.available:
        levels = result.cpufreq.levels_mhz(cfg.freq.step_mhz, cfg.freq.nominal_mhz)
        nominal = min(cfg.freq.nominal_mhz or result.cpufreq.base_mhz, levels[-1])
        nominal = (
            max(lv for lv in levels if lv <= nominal) if any(lv <= nominal for lv in levels) else levels[0]
        )
        turbo = result.cpufreq.max_mhz > nominal
    else:
        levels, nominal, turbo = (cfg.freq.fallback_mhz,), cfg.freq.fallback_mhz, False
    mem_total = (
        cfg.memory.total_gb
        if cfg.memory.total_gb is not None
        else result.mem_total_gb - cfg.memory.reserve_gb
    )
    if not mem_total > 0:
        raise HwInputError(f"memory: {mem_total:.2f} GB to manage; lower memory.reserve_gb or set total_gb")
    return Capabilities(
        node_name=cfg.name,
        interval_s=cfg.interval_s,
        cores=cores,
        core_step=core_step,
        llc_ways=ways,
        clos_count=clos,
        freq_levels_mhz=tuple(levels),
        nominal_freq_mhz=nominal,
        memory_gb=float(mem_total),
        memory_step_gb=cfg.memory.step_gb,
        disk_mbps=cfg.disk.total_mbps,
        disk_step_mbps=cfg.disk.step_mbps,
        net_gbps=cfg.net.total_gbps,
        net_step_gbps=cfg.net.step_gbps,
        mba_levels_pct=tuple(mba),
        turbo=turbo,
        knobs=frozenset(KNOB_RESOURCE[k] for k in result.available if k in KNOB_RESOURCE),
        apps=apps,
        min_llc_ways=min_ways,
        min_memory_gb=cfg.memory.min_gb if cfg.memory.min_gb is not None else cfg.memory.step_gb,
    )


def knob_of(resource: Resource) -> Knob:
    """The config knob that drives `resource` (the inverse of `KNOB_RESOURCE`)."""
    return {v: k for k, v in KNOB_RESOURCE.items()}[resource]
