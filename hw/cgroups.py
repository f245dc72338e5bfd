"""cgroup actuators and sensors, v1 and v2 (PARTIES Table 3: cpuset, memory and blkio cgroups).

The hierarchy is detected at start (`detect_layout`):

* **v2** (unified): `<root>/cgroup.controllers` exists; every knob lives in one directory per
  cgroup (`cpuset.cpus`, `cpu.max`, `memory.high`/`memory.max`, `io.max`, `cgroup.freeze`, PSI).
* **v1**: one hierarchy per controller under `<root>/<controller>` (`cpu`, `cpuacct`, `cpuset`,
  `memory`, `blkio`, `freezer`; co-mounts such as `cpu,cpuacct` are reached through the usual
  symlinks). A *hybrid* host also mounts v2 at `<root>/unified`; it carries no controllers but has
  PSI (`*.pressure`) and freeze, so cgroups we create get a directory there too.

A managed cgroup is a `CgroupRef`: its directory for each logical controller (`cpu`, `cpuacct`,
`cpuset`, `memory`, `io`, `freezer`, `psi`). Every setter is validate -> diff -> write -> read back
and returns the value really in force; every first write of a file is journalled (hw.state)
before it happens. Bad input (a cgroup that does not exist, a knob outside its range, a device
with no major:minor) raises `HwInputError` before anything is written; run-time failures raise
`KnobError`/`TargetGone` (hw.runner) for the caller to count and degrade on.

Memory DOWN moves never OOM-kill (the PARTIES README's warning): a limit below the cgroup's working
set plus a safety margin is clamped to that floor and reported as clamped.
"""

from __future__ import annotations

import logging
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from env.types import MAX_CPU_SHARES, MIN_CPU_SHARES
from hw.runner import HwInputError, KnobError, Sysfs
from hw.state import Journal, JournalEntry

log = logging.getLogger(__name__)

V1_CONTROLLERS = {
    "cpu": "cpu",
    "cpuacct": "cpuacct",
    "cpuset": "cpuset",
    "memory": "memory",
    "io": "blkio",
    "freezer": "freezer",
    "net_cls": "net_cls",
}
V2_CONTROLLERS = ("cpu", "cpuset", "memory", "io")
V1_UNLIMITED_BYTES = 1 << 62  # v1 reports "no limit" as a page-aligned LONG_MAX
PAGE_BYTES = 4096
MIN_QUOTA_US = 1000  # the kernel's lower bound for cfs_quota_us / cpu.max
DEFAULT_CPU_SHARES = 1024  # the kernel's cpu.shares (cpu.weight 100 on v2) of a new cgroup


@dataclass(frozen=True)
class CgroupLayout:
    """What the host mounts. `v1` maps logical controller -> hierarchy mount (v1 and hybrid)."""

    version: Literal[1, 2]
    root: Path
    v1: Mapping[str, Path] = field(default_factory=dict)
    unified: Path | None = None
    v2_controllers: frozenset[str] = frozenset()

    @property
    def hybrid(self) -> bool:
        return self.version == 1 and self.unified is not None

    def has(self, controller: str) -> bool:
        """Whether `controller` (logical name) can be used for knobs on this host."""
        if self.version == 2:
            if controller in ("cpuacct", "psi", "freezer"):
                return True
            return controller in self.v2_controllers
        if controller == "psi":
            return self.unified is not None
        return controller in self.v1


def detect_layout(root: str | Path = "/sys/fs/cgroup", fs: Sysfs | None = None) -> CgroupLayout:
    """Detect cgroup v2, v1 or hybrid under `root`; raise `HwInputError` when there is neither."""
    fs = fs or Sysfs()
    root = Path(root)
    if fs.exists(root / "cgroup.controllers"):
        ctrls = frozenset(fs.read(root / "cgroup.controllers").split())
        return CgroupLayout(2, root, {}, root, ctrls)
    v1 = {
        logical: root / name
        for logical, name in V1_CONTROLLERS.items()
        if fs.exists(root / name / "cgroup.procs")
    }
    hybrid = root / "unified"
    unified = hybrid if fs.exists(hybrid / "cgroup.controllers") else None
    if not v1:
        raise HwInputError(
            f"no cgroup hierarchy under {root}: mount cgroup2 there (mount -t cgroup2 none {root}) "
            "or the v1 controllers (cpu, cpuacct, cpuset, memory, blkio)"
        )
    ctrls = frozenset(fs.read(unified / "cgroup.controllers").split()) if unified else frozenset()
    return CgroupLayout(1, root, v1, unified, ctrls)


@dataclass(frozen=True)
class CgroupRef:
    """One managed cgroup: its directory per logical controller (`cpu`, `cpuset`, `memory`, ...)."""

    name: str
    dirs: Mapping[str, Path]

    def dir(self, controller: str) -> Path:
        try:
            return self.dirs[controller]
        except KeyError:
            raise HwInputError(
                f"cgroup of {self.name!r} has no {controller} controller here; have {sorted(self.dirs)}"
            ) from None

    def has(self, controller: str) -> bool:
        return controller in self.dirs


@dataclass(frozen=True)
class Pressure:
    """One PSI file (cgroup v2 `*.pressure`): share of time stalled over the last 10 s, and totals."""

    some_avg10_pct: float
    full_avg10_pct: float
    some_total_us: int


@dataclass(frozen=True)
class CgroupUsage:
    """Counters of one cgroup. Cumulative counters (`*_s`, `*_bytes` of I/O) are turned into rates
    by the caller from two reads."""

    cpu_usage_s: float
    cpu_throttled_s: float
    memory_bytes: int
    working_set_bytes: int  # usage minus inactive page cache: what a limit must not go below
    io_read_bytes: int
    io_write_bytes: int
    cpu_pressure: Pressure | None = None
    memory_pressure: Pressure | None = None
    io_pressure: Pressure | None = None


@dataclass(frozen=True)
class MemorySet:
    """Outcome of `set_memory_limit`: the limit in force and whether the request was clamped."""

    requested_bytes: int | None
    applied_bytes: int | None
    clamped: bool
    floor_bytes: int


# ---- cpu list helpers ------------------------------------------------------------------------------


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-2,5' -> (0, 1, 2, 5)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    s = sorted(set(cpus))
    parts = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def device_number(spec: str, sys_root: str | Path = "/sys") -> str:
    """The whole-disk 'MAJ:MIN' of a block device given as 'MAJ:MIN' or a path (/dev/vda1).

    blkio/io throttles apply to whole disks, so a partition resolves to its disk. Raises
    `HwInputError` when `spec` does not exist or has no major:minor (not a block device).
    """
    if re.fullmatch(r"\d+:\d+", spec.strip()):
        return spec.strip()
    try:
        st = os.stat(spec)
    except OSError as e:
        raise HwInputError(f"disk device {spec!r} does not exist: {e.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise HwInputError(f"disk device {spec!r} has no major:minor: it is not a block device")
    num = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    sysdev = Path(sys_root) / "dev" / "block" / num
    if (sysdev / "partition").exists():
        parent_dev = sysdev.resolve().parent / "dev"
        if parent_dev.exists():
            num = parent_dev.read_text().strip()
    return num


def _read_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = parts[1]
    return out


def parse_pressure(text: str) -> Pressure:
    vals: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        vals[parts[0]] = {k: float(v) for k, v in (p.split("=", 1) for p in parts[1:])}
    some, full = vals.get("some", {}), vals.get("full", {})
    return Pressure(some.get("avg10", math.nan), full.get("avg10", math.nan), int(some.get("total", 0)))


# ---- the driver ------------------------------------------------------------------------------------


class Cgroups:
    """cgroup actuators and sensors over the hierarchy at `root` (v1, v2 or hybrid)."""

    def __init__(
        self,
        root: str | Path = "/sys/fs/cgroup",
        *,
        fs: Sysfs | None = None,
        journal: Journal | None = None,
        proc_root: str | Path = "/proc",
    ) -> None:
        self.fs = fs or Sysfs()
        self.root = Path(root)
        self.proc_root = Path(proc_root)
        self.journal = journal
        self.layout = detect_layout(self.root, self.fs)
        self._created: set[Path] = set()

    # ---- finding cgroups ----------------------------------------------------------------------------
    def _mounts(self) -> dict[str, Path]:
        """Logical controller -> hierarchy root where its files live."""
        lay = self.layout
        if lay.version == 2:
            return {c: lay.root for c in ("cpu", "cpuacct", "cpuset", "memory", "io", "freezer", "psi")}
        out = dict(lay.v1)
        if lay.unified is not None:
            out["psi"] = lay.unified
            if "freezer" not in out:
                out["freezer"] = lay.unified
        return out

    def ref_for_path(self, name: str, rel: str) -> CgroupRef:
        """The existing cgroup at relative path `rel` (same path in every v1 hierarchy that has it)."""
        rel = rel.strip("/")
        dirs = {}
        for ctrl, mount in self._mounts().items():
            d = mount / rel if rel else mount
            if self.fs.is_dir(d):
                dirs[ctrl] = d
        if not any(c in dirs for c in ("cpu", "cpuset", "memory")):
            raise HwInputError(f"cgroup {rel!r} of {name!r} does not exist under {self.root}")
        return CgroupRef(name, dirs)

    def ref_for_pid(self, name: str, pid: int) -> CgroupRef:
        """The cgroups process `pid` is in (from /proc/<pid>/cgroup)."""
        paths = self.pid_cgroup_paths(pid)
        dirs = {}
        for ctrl, mount in self._mounts().items():
            key = self._proc_key(ctrl, mount)
            rel = paths.get(key)
            if rel is None:
                continue
            if ctrl == "psi" and rel.strip("/") == "" and self.layout.version == 1:
                continue  # the unified root is the whole host, not this app
            d = mount / rel.strip("/") if rel.strip("/") else mount
            if self.fs.is_dir(d):
                dirs[ctrl] = d
        if not dirs:
            raise HwInputError(f"process {pid} of {name!r}: none of its cgroups exist under {self.root}")
        return CgroupRef(name, dirs)

    def _proc_key(self, ctrl: str, mount: Path) -> str:
        """The /proc/<pid>/cgroup key of a hierarchy: '' for v2 (and hybrid's unified), else its name."""
        if self.layout.version == 2 or mount == self.layout.unified:
            return ""
        return V1_CONTROLLERS.get(ctrl, ctrl)

    def pid_cgroup_paths(self, pid: int) -> dict[str, str]:
        """v1 controller name (or '' for v2) -> path, from /proc/<pid>/cgroup."""
        f = self.proc_root / str(pid) / "cgroup"
        if not self.fs.exists(f):
            raise HwInputError(f"process {pid} does not exist (no {f})")
        out: dict[str, str] = {}
        for line in self.fs.read(f).splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, ctrls, path = parts
            if ctrls == "":
                out[""] = path
            for c in ctrls.split(","):
                if c:
                    out[c] = path
        return out

    def create(self, name: str, rel: str) -> CgroupRef:
        """Create (or adopt) the cgroup `rel` in every hierarchy we manage; journalled for removal.

        v1 cpuset: a new group starts with empty `cpuset.cpus`/`cpuset.mems`, and a task cannot
        join it (ENOSPC) until both are set, so they are copied from the parent. v2: the parent's
        `cgroup.subtree_control` must enable the controllers we use.
        """
        rel = rel.strip("/")
        if not rel:
            raise HwInputError(f"cgroup path for {name!r} is empty")
        mounts = self._mounts()
        dirs: dict[str, Path] = {}
        made: set[Path] = set()
        for ctrl, mount in mounts.items():
            d = mount / rel
            if d in made or self.fs.is_dir(d):
                dirs[ctrl] = d
                continue
            self._mkdirs(mount, rel)
            made.add(d)
            dirs[ctrl] = d
        if self.layout.version == 1 and "cpuset" in dirs:
            self._init_v1_cpuset(mounts["cpuset"], rel)
        return CgroupRef(name, dirs)

    def _mkdirs(self, mount: Path, rel: str) -> None:
        d = mount
        for part in Path(rel).parts:
            if self.layout.version == 2:
                self._enable_v2_controllers(d)
            d = d / part
            if self.fs.is_dir(d):
                continue
            if self.journal is not None:
                self.journal.record(JournalEntry("mkdir", str(d)))
            self.fs.mkdir(d)
            self._created.add(d)

    def _init_v1_cpuset(self, mount: Path, rel: str) -> None:
        d = mount
        for part in Path(rel).parts:
            parent, d = d, d / part
            for knob in ("cpuset.mems", "cpuset.cpus"):
                if not self.fs.read(d / knob).strip():
                    self._write(d / knob, self.fs.read(parent / knob).strip())

    def _enable_v2_controllers(self, d: Path) -> None:
        """Enable the controllers we use for the children of `d` (journalled: disabled again)."""
        offered = set(self.fs.read(d / "cgroup.controllers").split())
        have = set(self.fs.read(d / "cgroup.subtree_control").split())
        want = sorted(c for c in V2_CONTROLLERS if c in offered and c not in have)
        if want:
            self._write(
                d / "cgroup.subtree_control",
                " ".join(f"+{c}" for c in want),
                restore=[" ".join(f"-{c}" for c in want)],
            )

    def remove(self, ref: CgroupRef) -> None:
        for d in sorted(set(ref.dirs.values()), key=lambda p: -len(p.parts)):
            if self.fs.is_dir(d):
                self.fs.rmdir(d)

    def move_pid(self, ref: CgroupRef, pid: int) -> None:
        """Move process `pid` (all its threads) into `ref`; journalled so close() moves it back."""
        if self.journal is not None:
            orig = self.pid_cgroup_paths(pid)
            files = []
            for ctrl, mount in self._mounts().items():
                key = self._proc_key(ctrl, mount)
                if key in orig and ctrl in ref.dirs:
                    files.append(str((mount / orig[key].strip("/")) / "cgroup.procs"))
            self.journal.record(
                JournalEntry("procs", f"{pid}", {"pid": pid, "procs_files": sorted(set(files))})
            )
        for d in sorted(set(ref.dirs.values())):
            self.fs.write(d / "cgroup.procs", f"{pid}\n")

    def procs(self, ref: CgroupRef) -> tuple[int, ...]:
        for ctrl in ("cpu", "memory", "cpuset", "psi"):
            if ref.has(ctrl):
                text = self.fs.read(ref.dir(ctrl) / "cgroup.procs")
                return tuple(int(x) for x in text.split())
        return ()

    def threads(self, ref: CgroupRef) -> tuple[int, ...]:
        """Thread ids in the cgroup (resctrl groups are assigned per thread)."""
        for ctrl in ("cpu", "memory", "cpuset"):
            if ref.has(ctrl):
                name = "tasks" if self.layout.version == 1 else "cgroup.threads"
                return tuple(int(x) for x in self.fs.read(ref.dir(ctrl) / name).split())
        return ()

    def exists(self, ref: CgroupRef) -> bool:
        return all(self.fs.is_dir(d) for d in ref.dirs.values())

    # ---- writes ----------------------------------------------------------------------------------------
    def _write(self, path: Path, value: str, restore: list[str] | None = None) -> None:
        """Journal the original (once) then write. `restore` overrides the values replayed.

        Files of cgroups we created are not journalled: the cgroup itself is removed on restore.
        """
        self._journal_file(path, str(path), restore)
        self.fs.write(path, value)

    def _journal_file(self, path: Path, key: str, restore: list[str] | None) -> None:
        if self.journal is None or path.parent in self._created or self.journal.recorded("file", key):
            return
        if restore is None:
            restore = [self.fs.read(path).strip()]
        self.journal.record(JournalEntry("file", key, {"path": str(path), "values": restore}))

    # ---- cores: cpuset -----------------------------------------------------------------------------------
    def cpus(self, ref: CgroupRef) -> tuple[int, ...]:
        return parse_cpu_list(self.fs.read(ref.dir("cpuset") / "cpuset.cpus"))

    def set_cpus(
        self, ref: CgroupRef, cpus: Iterable[int], allowed: Iterable[int] | None = None
    ) -> tuple[int, ...]:
        want = tuple(sorted(set(cpus)))
        if not want:
            raise HwInputError(f"{ref.name}: a cpuset needs at least one CPU (pause or freeze instead)")
        if allowed is not None:
            bad = sorted(set(want) - set(allowed))
            if bad:
                raise HwInputError(f"{ref.name}: CPUs {bad} are not managed; allowed {sorted(set(allowed))}")
        path = ref.dir("cpuset") / "cpuset.cpus"
        if self.cpus(ref) != want:
            self._write(path, format_cpu_list(want))
        return self.cpus(ref)

    # ---- cores: CPU quota -------------------------------------------------------------------------------
    def cpu_quota(self, ref: CgroupRef) -> float | None:
        """The CPU limit in cores (quota / period), None when unlimited."""
        d = ref.dir("cpu")
        if self.layout.version == 2:
            q, p = self.fs.read(d / "cpu.max").split()
            return None if q == "max" else int(q) / int(p)
        quota_us = int(self.fs.read(d / "cpu.cfs_quota_us"))
        period_us = int(self.fs.read(d / "cpu.cfs_period_us"))
        return None if quota_us < 0 else quota_us / period_us

    def set_cpu_quota(self, ref: CgroupRef, cores: float | None, period_us: int = 100_000) -> float | None:
        if cores is not None and (not math.isfinite(cores) or cores <= 0):
            raise HwInputError(f"{ref.name}: CPU quota must be a positive number of cores, got {cores}")
        if not 1000 <= period_us <= 1_000_000:
            raise HwInputError(f"{ref.name}: period_us {period_us} outside 1000..1000000")
        quota = None if cores is None else max(MIN_QUOTA_US, round(cores * period_us))
        cur = self.cpu_quota(ref)
        now = None if cur is None else round(cur * self._period(ref))
        if now == quota and (quota is None or self._period(ref) == period_us):
            return cur
        d = ref.dir("cpu")
        if self.layout.version == 2:
            self._write(d / "cpu.max", f"{'max' if quota is None else quota} {period_us}")
        else:
            if self._period(ref) != period_us:
                # quota first to unlimited so that period and quota can change in any order
                self._write(d / "cpu.cfs_quota_us", "-1")
                self._write(d / "cpu.cfs_period_us", str(period_us))
            self._write(d / "cpu.cfs_quota_us", str(-1 if quota is None else quota))
        return self.cpu_quota(ref)

    # ---- cores: CFS shares ------------------------------------------------------------------------------
    def cpu_shares(self, ref: CgroupRef) -> int:
        """The CFS weight as cgroup v1 `cpu.shares` (2..262144; v2 `cpu.weight` converted back)."""
        d = ref.dir("cpu")
        if self.layout.version == 2:
            return weight_to_shares(int(self.fs.read(d / "cpu.weight")))
        return int(self.fs.read(d / "cpu.shares"))

    def set_cpu_shares(self, ref: CgroupRef, shares: int) -> int:
        """Write the CFS weight (v1 `cpu.shares`; v2 `cpu.weight` = the kernel's conversion of it,
        1 + (shares - 2) x 9999 / 262142); returns what reads back, as shares."""
        if not MIN_CPU_SHARES <= shares <= MAX_CPU_SHARES:
            raise HwInputError(
                f"{ref.name}: cpu.shares must be in {MIN_CPU_SHARES}..{MAX_CPU_SHARES}, got {shares}"
            )
        d = ref.dir("cpu")
        if self.layout.version == 2:
            weight = shares_to_weight(shares)
            if int(self.fs.read(d / "cpu.weight")) != weight:
                self._write(d / "cpu.weight", str(weight))
        elif self.cpu_shares(ref) != shares:
            self._write(d / "cpu.shares", str(shares))
        return self.cpu_shares(ref)

    def _period(self, ref: CgroupRef) -> int:
        d = ref.dir("cpu")
        if self.layout.version == 2:
            return int(self.fs.read(d / "cpu.max").split()[1])
        return int(self.fs.read(d / "cpu.cfs_period_us"))

    # ---- memory ----------------------------------------------------------------------------------------
    def memory_limit(self, ref: CgroupRef) -> int | None:
        d = ref.dir("memory")
        if self.layout.version == 2:
            v = self.fs.read(d / "memory.max").strip()
            return None if v == "max" else int(v)
        limit = int(self.fs.read(d / "memory.limit_in_bytes"))
        return None if limit >= V1_UNLIMITED_BYTES else limit

    def memory_usage(self, ref: CgroupRef) -> tuple[int, int]:
        """(usage, working set) in bytes; working set = usage - inactive page cache."""
        d = ref.dir("memory")
        st = _read_kv(self.fs.read(d / "memory.stat"))
        if self.layout.version == 2:
            usage = int(self.fs.read(d / "memory.current"))
            inactive = int(st.get("inactive_file", 0))
        else:
            usage = int(self.fs.read(d / "memory.usage_in_bytes"))
            inactive = int(st.get("total_inactive_file", st.get("inactive_file", 0)))
        return usage, max(0, usage - inactive)

    def set_memory_limit(
        self,
        ref: CgroupRef,
        limit_bytes: int | None,
        *,
        margin_frac: float = 0.10,
        margin_min_bytes: int = 64 << 20,
    ) -> MemorySet:
        """Set the memory limit (None = unlimited), never below working set + margin.

        v2 writes `memory.high` then `memory.max` when lowering (the kernel throttles and reclaims
        before the hard limit bites) and the reverse when raising. v1 writes
        `memory.limit_in_bytes`, raising `memory.memsw.limit_in_bytes` first where it would
        otherwise be below the new limit (the kernel rejects that with EINVAL).
        """
        if limit_bytes is not None and limit_bytes <= 0:
            raise HwInputError(f"{ref.name}: memory limit must be positive, got {limit_bytes} bytes")
        _, ws = self.memory_usage(ref)
        floor = _page_up(ws + max(int(ws * margin_frac), margin_min_bytes))
        want = None if limit_bytes is None else _page_up(limit_bytes)
        clamped = False
        if want is not None and want < floor:
            log.warning(
                "%s: memory limit %d MiB is below the working set %d MiB + margin; clamped to %d MiB "
                "(a lower limit would OOM-kill)",
                ref.name,
                want >> 20,
                ws >> 20,
                floor >> 20,
            )
            want, clamped = floor, True
        cur = self.memory_limit(ref)
        if cur != want:
            d = ref.dir("memory")
            if self.layout.version == 2:
                v = "max" if want is None else str(want)
                lowering = want is not None and (cur is None or want < cur)
                order = ("memory.high", "memory.max") if lowering else ("memory.max", "memory.high")
                for knob in order:
                    self._write(d / knob, v)
            else:
                memsw = d / "memory.memsw.limit_in_bytes"
                if self.fs.exists(memsw):
                    sw = int(self.fs.read(memsw))
                    target = V1_UNLIMITED_BYTES if want is None else want
                    if sw < V1_UNLIMITED_BYTES and sw < target:
                        self._write(memsw, "-1" if want is None else str(want))
                self._write(d / "memory.limit_in_bytes", "-1" if want is None else str(want))
        return MemorySet(limit_bytes, self.memory_limit(ref), clamped, floor)

    # ---- disk ----------------------------------------------------------------------------------------------
    def io_limit(self, ref: CgroupRef, dev: str) -> tuple[int | None, int | None]:
        """(read, write) bytes/s limits on device 'MAJ:MIN'; None = unlimited."""
        d = ref.dir("io")
        if self.layout.version == 2:
            for line in self.fs.read(d / "io.max").splitlines():
                parts = line.split()
                if parts and parts[0] == dev:
                    kv = dict(p.split("=", 1) for p in parts[1:])
                    return _opt_int(kv.get("rbps", "max")), _opt_int(kv.get("wbps", "max"))
            return None, None
        out: list[int | None] = []
        for knob in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            val = None
            for line in self.fs.read(d / knob).splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == dev:
                    val = int(parts[1]) or None
            out.append(val)
        return out[0], out[1]

    def set_io_limit(
        self, ref: CgroupRef, dev: str, read_bps: int | None, write_bps: int | None
    ) -> tuple[int | None, int | None]:
        if not re.fullmatch(r"\d+:\d+", dev):
            raise HwInputError(f"{ref.name}: disk device must be 'MAJ:MIN', got {dev!r} (see device_number)")
        for v in (read_bps, write_bps):
            if v is not None and v <= 0:
                raise HwInputError(f"{ref.name}: disk limit must be a positive bytes/s, got {v}")
        cur = self.io_limit(ref, dev)
        if cur == (read_bps, write_bps):
            return cur
        d = ref.dir("io")
        if self.layout.version == 2:
            r0, w0 = cur
            path = d / "io.max"
            self._journal_file(path, f"{path}#{dev}", [f"{dev} rbps={r0 or 'max'} wbps={w0 or 'max'}"])
            self.fs.write(path, f"{dev} rbps={read_bps or 'max'} wbps={write_bps or 'max'}")
        else:
            for knob, v, old in (
                ("blkio.throttle.read_bps_device", read_bps, cur[0]),
                ("blkio.throttle.write_bps_device", write_bps, cur[1]),
            ):
                path = d / knob
                self._journal_file(path, f"{path}#{dev}", [f"{dev} {old or 0}"])
                self.fs.write(path, f"{dev} {v or 0}")
        return self.io_limit(ref, dev)

    # ---- freeze --------------------------------------------------------------------------------------------
    def frozen(self, ref: CgroupRef) -> bool:
        d = ref.dir("freezer")
        if self.fs.exists(d / "freezer.state"):
            return self.fs.read(d / "freezer.state").strip() in ("FROZEN", "FREEZING")
        return _read_kv(self.fs.read(d / "cgroup.events")).get("frozen") == "1" or (
            self.fs.read(d / "cgroup.freeze").strip() == "1"
        )

    def set_frozen(self, ref: CgroupRef, frozen: bool) -> bool:
        """Freeze or thaw every task of the cgroup (a BE job given zero cores)."""
        if self.frozen(ref) == frozen:
            return frozen
        d = ref.dir("freezer")
        if self.fs.exists(d / "freezer.state"):
            self._write(d / "freezer.state", "FROZEN" if frozen else "THAWED", restore=["THAWED"])
        else:
            self._write(d / "cgroup.freeze", "1" if frozen else "0", restore=["0"])
        return self.frozen(ref)

    # ---- usage ----------------------------------------------------------------------------------------------
    def usage(self, ref: CgroupRef) -> CgroupUsage:
        if self.layout.version == 2:
            d = ref.dir("cpu")
            st = _read_kv(self.fs.read(d / "cpu.stat"))
            cpu_s = int(st.get("usage_usec", 0)) / 1e6
            thr_s = int(st.get("throttled_usec", 0)) / 1e6
            rd = wr = 0
            if ref.has("io") and self.fs.exists(ref.dir("io") / "io.stat"):
                for line in self.fs.read(ref.dir("io") / "io.stat").splitlines():
                    kv = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                    rd += int(kv.get("rbytes", 0))
                    wr += int(kv.get("wbytes", 0))
        else:
            cpu_s = (
                int(self.fs.read(ref.dir("cpuacct") / "cpuacct.usage")) / 1e9
                if ref.has("cpuacct")
                else math.nan
            )
            thr_s = math.nan
            if ref.has("cpu"):
                st = _read_kv(self.fs.read(ref.dir("cpu") / "cpu.stat"))
                thr_s = int(st.get("throttled_time", 0)) / 1e9
            rd = wr = 0
            if ref.has("io"):
                f = ref.dir("io") / "blkio.throttle.io_service_bytes_recursive"
                for line in self.fs.read(f).splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] == "Read":
                        rd += int(parts[2])
                    elif len(parts) == 3 and parts[1] == "Write":
                        wr += int(parts[2])
        mem, ws = self.memory_usage(ref) if ref.has("memory") else (0, 0)
        psi: dict[str, Pressure | None] = {"cpu": None, "memory": None, "io": None}
        if ref.has("psi"):
            for k in psi:
                f = ref.dir("psi") / f"{k}.pressure"
                if self.fs.exists(f):
                    psi[k] = parse_pressure(self.fs.read(f))
        return CgroupUsage(cpu_s, thr_s, mem, ws, rd, wr, psi["cpu"], psi["memory"], psi["io"])


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares -> v2 cpu.weight (1..10000), the conversion runc and systemd use."""
    return 1 + ((shares - MIN_CPU_SHARES) * 9999) // (MAX_CPU_SHARES - MIN_CPU_SHARES)


def weight_to_shares(weight: int) -> int:
    """cgroup v2 cpu.weight -> the v1 cpu.shares it stands for (inverse of `shares_to_weight`)."""
    return MIN_CPU_SHARES + ((weight - 1) * (MAX_CPU_SHARES - MIN_CPU_SHARES) + 9998) // 9999


def _page_up(n: int) -> int:
    return -(-n // PAGE_BYTES) * PAGE_BYTES


def _opt_int(v: str) -> int | None:
    return None if v == "max" else int(v)


__all__ = [
    "CgroupLayout",
    "CgroupRef",
    "CgroupUsage",
    "Cgroups",
    "KnobError",
    "MemorySet",
    "Pressure",
    "detect_layout",
    "device_number",
    "format_cpu_list",
    "parse_cpu_list",
]
