"""Typed configuration of a `LinuxNode` (configs/node/linux-*.yaml), loaded with `env.config.build`.

The YAML says which apps run where (a Docker container by name or label, an existing cgroup, or
processes we put into a cgroup we create), their QoS targets and max loads, which knobs to manage
and how, and where the latency feed is. Every key is declared and documented here; unknown keys,
wrong types and inconsistent values raise `ConfigError` naming the field.

Paths below the kernel roots are checked too, since the node writes there as root: an app's
`cgroup` is a path relative to each hierarchy root (a leading `/` means the same) without `..`;
`cgroup_parent` is a relative path without `..`; an app's `name` and `cache.group_prefix` are
plain names (they become directory names: no `/`, not `.` or `..`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from env.config import ConfigError, build, load_yaml, resolve_config

Knob = Literal["core", "cache", "freq", "mem", "disk", "net"]


def check_name(name: str, where: str) -> None:
    """`ConfigError` unless `name` can be one directory name (module docstring)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"{where} {name!r}: a plain name (no '/', not '.' or '..')")


def check_relative_path(path: str, where: str) -> None:
    """`ConfigError` unless `path` is relative and stays below where it is joined (no `..`)."""
    if path.startswith("/") or "\0" in path or ".." in Path(path).parts:
        raise ConfigError(f"{where} {path!r}: a relative path without '..'")


@dataclass(frozen=True)
class AppTarget:
    """One managed app or BE job and where its processes are. Give exactly one of `container`,
    `label`, `cgroup` or `pids`; with `create: true` the cgroup (default `<cgroup_parent>/<name>`)
    is created and removed again on close, and `pids` are moved into it."""

    name: str
    kind: Literal["lc", "be"]
    qos_target_us: float = math.nan  # p99 target; required for LC apps
    max_load_rps: float = math.nan  # PARTIES "max load": loads are reported as a fraction of it
    container: str | None = None  # Docker container name
    label: str | None = None  # Docker label, "key=value"
    cgroup: str | None = None  # cgroup path relative to each hierarchy root, e.g. "system.slice/x"
    pids: tuple[int, ...] = ()  # plain processes, moved into a created cgroup
    create: bool = False  # create the cgroup (and remove it on close)
    ports: tuple[int, ...] = ()  # local source ports of its traffic (tc `match: port`)
    feed_name: str | None = None  # its name in the latency feed (default: `name`)
    stateless: bool = False
    in_memory: bool | None = None

    def __post_init__(self) -> None:
        check_name(self.name, f"apps.{self.name}.name")
        if self.cgroup is not None:
            check_relative_path(self.cgroup.lstrip("/") or ".", f"apps.{self.name}.cgroup")
        where = [w for w in ("container", "label", "cgroup") if getattr(self, w)]
        if self.pids and not self.create and not self.cgroup:
            object.__setattr__(self, "create", True)
        if len(where) > 1 or (not where and not self.pids and not self.create):
            raise ConfigError(
                f"apps.{self.name}: give exactly one of container, label, cgroup or pids (got {where or 'none'})"
            )
        if self.create and (self.container or self.label):
            raise ConfigError(f"apps.{self.name}: create applies to cgroups, not containers")
        if self.kind == "lc" and not (self.qos_target_us > 0):
            raise ConfigError(f"apps.{self.name}: an LC app needs qos_target_us > 0")
        if self.kind == "lc" and not (self.max_load_rps > 0):
            raise ConfigError(f"apps.{self.name}: an LC app needs max_load_rps > 0")

    @property
    def feed_key(self) -> str:
        return self.feed_name or self.name


@dataclass(frozen=True)
class CoresConfig:
    """CORE knob. `cpuset`: whole physical cores as disjoint (exclusive) cpusets (PARTIES Table 3).
    `quota`: CPU-quota steps of `quota_step_cores` (a machine with few cores, e.g. 0.25 core);
    groups then share the managed CPUs in time."""

    mode: Literal["cpuset", "quota"] = "cpuset"
    cpus: tuple[int, ...] = ()  # managed logical CPUs; empty = every online CPU
    quota_step_cores: float = 0.25
    period_us: int = 100_000

    def __post_init__(self) -> None:
        if self.mode == "quota" and not (0 < self.quota_step_cores <= 64):
            raise ConfigError(f"cores.quota_step_cores: {self.quota_step_cores} outside (0, 64]")
        if not 1000 <= self.period_us <= 1_000_000:
            raise ConfigError(f"cores.period_us: {self.period_us} outside 1000..1000000")


@dataclass(frozen=True)
class MemoryConfig:
    """MEM knob: per-app memory limits. A DOWN move never goes below working set + margin."""

    total_gb: float | None = None  # managed memory; default MemTotal - reserve_gb
    reserve_gb: float = 1.0  # left to the OS when total_gb is not given
    step_gb: float = 1.0
    min_gb: float | None = None  # smallest limit an app may get (default one step)
    margin_frac: float = 0.10  # safety margin over the working set ...
    margin_min_gb: float = 0.0625  # ... and at least this much


@dataclass(frozen=True)
class DiskConfig:
    """DISK knob: blkio/io throttle on one device (read and write bytes/s)."""

    device: str | None = None  # "/dev/vda" or "254:0"
    total_mbps: float = 160.0
    step_mbps: float = 10.0


@dataclass(frozen=True)
class NetConfig:
    """Network limits (adjusted outside the moves, as PARTIES does) with HTB on `device`."""

    device: str | None = None
    netns: str | None = None
    total_gbps: float = 10.0
    step_gbps: float = 0.5
    match: Literal["port", "cgroup"] = "port"
    replace_existing: bool = False  # replace a non-default root qdisc (it cannot be restored)


@dataclass(frozen=True)
class CacheConfig:
    """CACHE knob (CAT through resctrl; MBA where the CPU has it)."""

    resctrl_root: str = "/sys/fs/resctrl"
    group_prefix: str = "coloc_clos"
    restrict_default_group: bool = True
    ways_fallback: int = 0  # LLC ways to report when there is no resctrl (0 = from sysfs cache info)

    def __post_init__(self) -> None:
        check_name(self.group_prefix, "cache.group_prefix")


@dataclass(frozen=True)
class FreqConfig:
    """FREQ knob. Levels are min..nominal in step_mhz plus turbo (cpuinfo_max) where present."""

    mode: Literal["max_freq", "userspace"] = "max_freq"
    step_mhz: int = 100
    nominal_mhz: int | None = None  # default: the driver's base frequency
    fallback_mhz: int = 2000  # the single level reported when there is no cpufreq


@dataclass(frozen=True)
class FeedConfig:
    """Where LC latency comes from (hw.feed): `udp://HOST:PORT` or `file:/PATH`."""

    url: str = "udp://127.0.0.1:9177"
    stale_intervals: float = 2.0  # a reading older than this many intervals is invalid


@dataclass(frozen=True)
class LinuxNodeConfig:
    """A `LinuxNode` (module docstring): the managed apps, the knobs and how each is driven, the kernel
    roots (arguments, so tests run on fake trees), the journal and the latency feed."""

    name: str
    apps: tuple[AppTarget, ...]
    description: str = ""
    interval_s: float = 0.5
    knobs: tuple[Knob, ...] = ("core", "mem")
    require_knobs: bool = True  # a configured knob the host lacks fails start-up (else it is masked)
    cgroup_root: str = "/sys/fs/cgroup"
    cgroup_parent: str = "coloc"  # where created cgroups go
    proc_root: str = "/proc"
    cpu_root: str = "/sys/devices/system/cpu"
    sys_root: str = "/sys"
    state_path: str = "/var/lib/coloc/journal.jsonl"
    docker_url: str | None = None  # default: the environment's (DOCKER_HOST or the local socket)
    cores: CoresConfig = field(default_factory=CoresConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    disk: DiskConfig = field(default_factory=DiskConfig)
    net: NetConfig = field(default_factory=NetConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    freq: FreqConfig = field(default_factory=FreqConfig)
    feed: FeedConfig = field(default_factory=FeedConfig)

    def __post_init__(self) -> None:
        if not self.apps:
            raise ConfigError(f"{self.name}: apps is empty")
        if self.cgroup_parent.startswith("/"):
            raise ConfigError(
                f"{self.name}.cgroup_parent {self.cgroup_parent!r}: a path relative to the cgroup root, "
                "not an absolute one (e.g. coloc)"
            )
        check_relative_path(self.cgroup_parent, f"{self.name}.cgroup_parent")
        names = [a.name for a in self.apps]
        if len(set(names)) != len(names):
            raise ConfigError(f"{self.name}: duplicate app names {names}")
        if not (self.interval_s > 0):
            raise ConfigError(f"{self.name}: interval_s must be positive")
        if len(set(self.knobs)) != len(self.knobs):
            raise ConfigError(f"{self.name}: duplicate knobs {list(self.knobs)}")
        if "disk" in self.knobs and not self.disk.device:
            raise ConfigError(f"{self.name}: knob disk needs disk.device (a block device or MAJ:MIN)")
        if "net" in self.knobs and not self.net.device:
            raise ConfigError(f"{self.name}: knob net needs net.device")

    @property
    def uses_docker(self) -> bool:
        return any(a.container or a.label for a in self.apps)


def load_linux_config(name_or_path: str | Path) -> LinuxNodeConfig:
    """A LinuxNode config by name (configs/node/<name>.yaml) or path."""
    path = resolve_config("node", name_or_path)
    return build(LinuxNodeConfig, load_yaml(path), where=path.name)
