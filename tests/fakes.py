"""Shared test fakes (importable as `tests.fakes`). Fake kernel trees for the hw unit tests: cgroup v1 (+ hybrid unified), cgroup v2, resctrl,
cpufreq and /proc, and a `FakeFs` that behaves like the kernel where it matters (files appear on
mkdir, per-device throttle lines, '-1' meaning unlimited, schemata merging and validation) and
injects errno faults (EBUSY, EACCES, ENOSPC, ENOENT) on chosen paths."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from env.controller import BaseController
from env.histogram import LatencyHistogram
from env.types import Decision, Observation
from hw.config import AppTarget, CacheConfig, DiskConfig, LinuxNodeConfig, MemoryConfig
from hw.feed import LatencyReading
from hw.runner import Sysfs

V1_UNLIMITED = "9223372036854771712"

V1_TEMPLATES = {
    "cpu": {
        "cpu.cfs_quota_us": "-1",
        "cpu.cfs_period_us": "100000",
        "cpu.shares": "1024",
        "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
    },
    "cpuacct": {"cpuacct.usage": "0"},
    "cpuset": {"cpuset.cpus": "", "cpuset.mems": ""},
    "memory": {
        "memory.limit_in_bytes": V1_UNLIMITED,
        "memory.memsw.limit_in_bytes": V1_UNLIMITED,
        "memory.usage_in_bytes": "0",
        "memory.stat": "total_inactive_file 0\n",
    },
    "blkio": {
        "blkio.throttle.read_bps_device": "",
        "blkio.throttle.write_bps_device": "",
        "blkio.throttle.io_service_bytes_recursive": "Total 0\n",
    },
    "freezer": {"freezer.state": "THAWED"},
    "unified": {
        "cgroup.controllers": "",
        "cgroup.subtree_control": "",
        "cgroup.freeze": "0",
        "cgroup.events": "populated 0\nfrozen 0\n",
        "cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        "io.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    },
}

V2_TEMPLATE = {
    "cgroup.controllers": "cpuset cpu io memory",
    "cgroup.subtree_control": "",
    "cgroup.threads": "",
    "cgroup.freeze": "0",
    "cgroup.events": "populated 0\nfrozen 0\n",
    "cpu.max": "max 100000",
    "cpu.weight": "100",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nthrottled_usec 0\n",
    "cpuset.cpus": "",
    "memory.max": "max",
    "memory.high": "max",
    "memory.current": "0",
    "memory.stat": "anon 0\ninactive_file 0\n",
    "io.max": "",
    "io.stat": "",
    "cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "io.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
}


class FakeFs(Sysfs):
    """`Sysfs` over a fake tree, with kernel-like write semantics and errno injection.

    `fail(path_or_suffix, err, op="write")` makes the next operations `op` ("write", "read",
    "mkdir", "rmdir") on a matching path raise OSError(err) (forever, until `clear()`).
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.faults: list[tuple[str, str, int]] = []
        self.writes: list[tuple[str, str]] = []

    def fail(self, path_suffix: str, err: int, op: str = "write") -> None:
        self.faults.append((op, path_suffix, err))

    def clear(self) -> None:
        self.faults.clear()

    def _check(self, op: str, path: Path) -> None:
        for fop, suffix, err in self.faults:
            if fop == op and str(path).endswith(suffix):
                raise self._error(op, path, OSError(err, os.strerror(err)))

    def read(self, path: Path) -> str:
        self._check("read", path)
        return super().read(path)

    def write(self, path: Path, value: str) -> None:
        path = Path(path)
        self._check("write", path)
        if not path.exists():  # the kernel never creates files on write
            raise self._error("open for writing", path, OSError(errno.ENOENT, "No such file"))
        if path.name == "cgroup.procs":
            _leave_other_cgroups(path, value.strip())
        old = path.read_text()
        try:
            new = _kernel_write(path, old, value, self.base)
        except OSError as e:
            raise self._error(f"write {value.strip()!r} to", path, e) from None
        path.write_text(new)
        self.writes.append((str(path), value))

    def mkdir(self, path: Path) -> None:
        path = Path(path)
        self._check("mkdir", path)
        super().mkdir(path)
        for name, text in _template_for(path).items():
            f = path / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)

    def rmdir(self, path: Path) -> None:
        path = Path(path)
        self._check("rmdir", path)
        procs = path / "cgroup.procs"
        if procs.exists() and procs.read_text().split():
            raise self._error("remove directory", path, OSError(errno.EBUSY, "busy"))
        if not path.exists():
            raise self._error("remove directory", path, OSError(errno.ENOENT, "No such file"))
        shutil.rmtree(path)

    def written(self, suffix: str) -> list[str]:
        return [v for p, v in self.writes if p.endswith(suffix)]


def _leave_other_cgroups(procs: Path, pid: str) -> None:
    """A process is in one cgroup per hierarchy: joining one leaves the others (as the kernel does)."""
    root = procs.parent
    while root.parent.name not in ("cg",) and root.name != "cg2" and root.parent != root:
        root = root.parent
    for f in root.rglob("cgroup.procs"):
        if f != procs and pid in f.read_text().split():
            f.write_text("".join(f"{x}\n" for x in f.read_text().split() if x != pid))


def _template_for(path: Path) -> dict[str, str]:
    parts = path.parts
    if "resctrl" in parts:
        root = Path(*parts[: parts.index("resctrl") + 1])
        full = (root / "info" / "L3" / "cbm_mask").read_text().strip()
        return {
            "schemata": f"L3:0={full};1={full}\nMB:0=100;1=100\n",
            "tasks": "",
            "cpus": "0",
            "mon_data/mon_L3_00/llc_occupancy": "1000000",
            "mon_data/mon_L3_00/mbm_total_bytes": "0",
            "mon_data/mon_L3_01/llc_occupancy": "500000",
            "mon_data/mon_L3_01/mbm_total_bytes": "0",
        }
    if "cg2" in parts:
        return {**V2_TEMPLATE, "cgroup.procs": ""}
    for h in V1_TEMPLATES:
        if h in parts:
            return (
                {**V1_TEMPLATES[h], "cgroup.procs": "", "tasks": ""}
                if h != "unified"
                else {
                    **V1_TEMPLATES[h],
                    "cgroup.procs": "",
                }
            )
    return {}


def _kernel_write(path: Path, old: str, value: str, base: Path) -> str:
    name = path.name
    v = value.strip()
    if name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        if v == "-1":
            return V1_UNLIMITED
        if name == "memory.limit_in_bytes":
            sw = path.parent / "memory.memsw.limit_in_bytes"
            if sw.exists() and int(v) > int(sw.read_text()):
                raise OSError(errno.EINVAL, "memory limit above memsw limit")
        return v
    if name in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
        dev, bps = v.split()
        lines = [ln for ln in old.splitlines() if ln.split() and ln.split()[0] != dev]
        if int(bps):
            lines.append(f"{dev} {bps}")
        return "\n".join(lines) + ("\n" if lines else "")
    if name == "io.max":
        dev = v.split()[0]
        kv = dict(p.split("=") for p in v.split()[1:])
        lines = [ln for ln in old.splitlines() if ln.split() and ln.split()[0] != dev]
        if any(x != "max" for x in kv.values()):
            lines.append(
                f"{dev} rbps={kv.get('rbps', 'max')} wbps={kv.get('wbps', 'max')} riops=max wiops=max"
            )
        return "\n".join(lines) + ("\n" if lines else "")
    if name in ("cgroup.procs", "tasks"):
        ids = old.split()
        if v not in ids:
            ids.append(v)
        return "\n".join(ids) + "\n"
    if name == "cgroup.subtree_control":
        have = set(old.split())
        for tok in v.split():
            (have.add if tok[0] == "+" else have.discard)(tok[1:])
        return " ".join(sorted(have))
    if name == "cgroup.freeze":
        ev = path.parent / "cgroup.events"
        ev.write_text(f"populated 0\nfrozen {v}\n")
        return v
    if name == "schemata":
        cur = {}
        for line in old.splitlines():
            if ":" in line:
                res, rest = line.split(":", 1)
                cur[res] = dict(p.split("=") for p in rest.split(";"))
        for line in v.splitlines():
            res, rest = line.split(":", 1)
            doms = dict(p.split("=") for p in rest.split(";"))
            if res == "L3":
                for d in doms.values():
                    m = int(d, 16)
                    low = (m & -m).bit_length() - 1
                    if m == 0 or m != ((1 << bin(m).count("1")) - 1) << low:
                        root = next(p for p in [path.parent, path.parent.parent] if (p / "info").exists())
                        (root / "info" / "last_cmd_status").write_text(f"Mask {d} is not contiguous\n")
                        raise OSError(errno.EINVAL, "bad mask")
            cur.setdefault(res, {}).update(doms)
        return "".join(f"{r}:" + ";".join(f"{k}={x}" for k, x in d.items()) + "\n" for r, d in cur.items())
    if name == "scaling_max_freq":
        lo = int((path.parent / "scaling_min_freq").read_text())
        if int(v) < lo:
            raise OSError(errno.EINVAL, "max below min")
        return v
    return v


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


@dataclass
class FakeHost:
    """Paths of one fake host (cgroups, cpufreq, resctrl, /proc) and its `FakeFs`."""

    base: Path
    fs: FakeFs
    cgroup_root: Path
    cpu_root: Path
    proc_root: Path
    resctrl_root: Path

    def cg(self, hierarchy: str, rel: str = "") -> Path:
        return self.cgroup_root / hierarchy / rel if hierarchy != "" else self.cgroup_root / rel

    def add_pid(
        self, pid: int, rel: str, hierarchies=("cpu", "cpuacct", "cpuset", "memory", "blkio", "freezer")
    ) -> None:
        """A process in cgroup `rel` of every v1 hierarchy (and the unified one)."""
        lines = [f"{i + 1}:{h}:/{rel}" for i, h in enumerate(hierarchies)] + [f"0::/{rel}"]
        _write_tree(self.proc_root, {f"{pid}/cgroup": "\n".join(lines) + "\n"})
        for h in (*hierarchies, "unified"):
            f = self.cgroup_root / h / rel / "cgroup.procs"
            if f.exists():
                f.write_text(f.read_text() + f"{pid}\n")
            t = self.cgroup_root / h / rel / "tasks"
            if t.exists():
                t.write_text(t.read_text() + f"{pid}\n")

    def set_memory_usage(self, rel: str, usage_bytes: int, inactive_file: int = 0) -> None:
        d = self.cgroup_root / "memory" / rel
        (d / "memory.usage_in_bytes").write_text(str(usage_bytes))
        (d / "memory.stat").write_text(f"total_inactive_file {inactive_file}\n")


def make_v1_host(
    base: Path, apps=("mc", "be"), ncpu: int = 4, resctrl: bool = True, cpufreq: bool = True
) -> FakeHost:
    """A hybrid v1 host: v1 controllers + unified (PSI only), `ncpu` CPUs as 2 HT per core."""
    fs = FakeFs(base)
    cg = base / "cg"
    for h, tmpl in V1_TEMPLATES.items():
        files = {**tmpl, "cgroup.procs": "1\n"}
        if h == "cpuset":
            files.update({"cpuset.cpus": f"0-{ncpu - 1}", "cpuset.mems": "0"})
        if h == "unified":
            files["cgroup.controllers"] = ""
        _write_tree(cg / h, files)
    for app in apps:
        for h in V1_TEMPLATES:
            fs.mkdir(cg / h / app)
        _write_tree(cg / "cpuset" / app, {"cpuset.cpus": f"0-{ncpu - 1}", "cpuset.mems": "0"})
    cpu = base / "cpu"
    files = {"online": f"0-{ncpu - 1}"}
    for c in range(ncpu):
        sib = c - c % 2
        files[f"cpu{c}/topology/thread_siblings_list"] = f"{sib},{sib + 1}" if sib + 1 < ncpu else f"{sib}"
        if cpufreq:
            files.update(
                {
                    f"cpu{c}/cpufreq/cpuinfo_min_freq": "1200000",
                    f"cpu{c}/cpufreq/cpuinfo_max_freq": "3600000",
                    f"cpu{c}/cpufreq/base_frequency": "2200000",
                    f"cpu{c}/cpufreq/scaling_min_freq": "1200000",
                    f"cpu{c}/cpufreq/scaling_max_freq": "3600000",
                    f"cpu{c}/cpufreq/scaling_cur_freq": "2000000",
                    f"cpu{c}/cpufreq/scaling_governor": "powersave",
                    f"cpu{c}/cpufreq/scaling_available_governors": "performance powersave userspace",
                    f"cpu{c}/cpufreq/scaling_setspeed": "<unsupported>",
                    f"cpu{c}/cpufreq/scaling_driver": "acpi-cpufreq",
                }
            )
    files["cpu0/cache/index3/level"] = "3"
    files["cpu0/cache/index3/ways_of_associativity"] = "20"
    _write_tree(cpu, files)
    proc = base / "proc"
    _write_tree(proc, {"meminfo": "MemTotal:       33554432 kB\nMemFree: 1 kB\n"})
    rs = base / "resctrl"
    if resctrl:
        _write_tree(
            rs,
            {
                "info/L3/cbm_mask": "fffff",
                "info/L3/min_cbm_bits": "1",
                "info/L3/num_closids": "4",
                "info/MB/min_bandwidth": "10",
                "info/MB/bandwidth_gran": "10",
                "info/L3_MON/mon_features": "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n",
                "info/last_cmd_status": "ok\n",
                "schemata": "L3:0=fffff;1=fffff\nMB:0=100;1=100\n",
                "tasks": "1\n",
            },
        )
    host = FakeHost(base, fs, cg, cpu, proc, rs)
    for i, app in enumerate(apps):
        host.add_pid(1000 + i, app)
    return host


def make_v2_host(base: Path, apps=("mc", "be")) -> FakeHost:
    fs = FakeFs(base)
    cg = base / "cg2"
    _write_tree(cg, {**V2_TEMPLATE, "cgroup.procs": "1\n", "cpuset.cpus": "0-3"})
    for app in apps:
        fs.mkdir(cg / app)
    host = FakeHost(base, fs, cg, base / "cpu", base / "proc", base / "resctrl")
    _write_tree(host.cpu_root, {"online": "0-3"})
    _write_tree(host.proc_root, {"meminfo": "MemTotal:       16777216 kB\n"})
    for i, app in enumerate(apps):
        _write_tree(host.proc_root, {f"{1000 + i}/cgroup": f"0::/{app}\n"})
        (cg / app / "cgroup.procs").write_text(f"{1000 + i}\n")
    return host


class FakeFeed:
    """A `LatencySource`: readings set by the test, stamped with the test's monotonic clock."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.readings: dict[str, LatencyReading] = {}

    def put(
        self,
        app: str,
        p99_us: float,
        rps: float,
        requests: int = 100,
        histogram: LatencyHistogram | None = None,
        sub_p99_us: tuple[float, ...] = (),
    ) -> None:
        self.readings[app] = LatencyReading(
            app, self.clock(), p99_us, rps, requests=requests, histogram=histogram, sub_p99_us=sub_p99_us
        )

    def latest(self, app: str):
        return self.readings.get(app)


class HoldController(BaseController):
    """Keeps whatever allocation is in force (the node's start), every tick."""

    name = "hold"

    def _decide(self, observation: Observation) -> Decision:
        return Decision.hold()


class ManualClock:
    """Monotonic time moved by hand; also a `Clock` (now/sleep_until) that never really sleeps."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t

    def sleep_until(self, t_s: float) -> None:
        self.t = max(self.t, t_s)

    def advance(self, dt: float) -> None:
        self.t += dt


# ---- LinuxNode configs for fake hosts -------------------------------------------------------------------
APPS = (
    AppTarget("mc", "lc", qos_target_us=500.0, max_load_rps=10_000.0, cgroup="mc"),
    AppTarget("be", "be", cgroup="be"),
)


def linux_config(host: FakeHost, tmp_path: Path, **kw: Any) -> LinuxNodeConfig:
    """A LinuxNode config for a fake host: every knob of the v1 host, the journal under `tmp_path`."""
    base = dict(
        name="fake",
        apps=APPS,
        knobs=("core", "cache", "freq", "mem", "disk"),
        cgroup_root=str(host.cgroup_root),
        proc_root=str(host.proc_root),
        cpu_root=str(host.cpu_root),
        sys_root=str(tmp_path),
        state_path=str(tmp_path / "state" / "journal.jsonl"),
        disk=DiskConfig(device="254:0"),
        cache=CacheConfig(resctrl_root=str(host.resctrl_root)),
        memory=MemoryConfig(total_gb=8.0),
    )
    base.update(kw)
    return LinuxNodeConfig(**base)


# ---- controllers ------------------------------------------------------------------------------------
def _forbidden(what: str):
    def f(*a, **k):
        raise AssertionError(f"decide() must not {what}")

    return f


def no_io() -> ExitStack:
    """Patch sleeping, file, process and socket access to raise while decide() runs."""
    stack = ExitStack()
    for target, what in (
        ("time.sleep", "sleep"),
        ("builtins.open", "open files"),
        ("os.open", "open files"),
        ("subprocess.Popen", "start processes"),
        ("socket.socket", "open sockets"),
    ):
        stack.enter_context(mock.patch(target, _forbidden(what)))
    return stack


class SyntheticBench:
    """A deterministic synthetic service for `hw.profile` (its `Bench` protocol): the median of its
    interval p99s at a point is the simulator's for a known profile on a known platform (what a fit
    should recover), each interval's p99 jittered by a seeded lognormal factor, its CPU use the
    rate times its service time. `measured` lists the points it was asked for; `closed` is set by
    `close()`; `fail_after` raises RuntimeError on that call (a service that dies mid-run). Its
    generator publishes a schedule lag p99 of 50 us, or above `generator_max_rps` falls behind:
    `GENERATOR_LAG_US` late, and every latency with it."""

    GENERATOR_LAG_US = 20_000.0

    def __init__(
        self,
        prof,
        platform,
        *,
        jitter: float = 0.05,
        seed: int = 0,
        fail_after: int | None = None,
        generator_max_rps: float = float("inf"),
    ) -> None:
        from env.sim.engine import reference_knee

        self.prof, self.platform, self.jitter, self.seed = prof, platform, jitter, seed
        self.svc_s = reference_knee(prof, platform)[0]
        self.fail_after = fail_after
        self.generator_max_rps = generator_max_rps
        self.measured: list[Any] = []
        self.closed = False

    cores = property(lambda self: float(self.platform.cores))
    cfs_period_ms = property(lambda self: self.platform.cfs_period_ms)
    cfs_slice_ms = property(lambda self: 5.0)

    def memory_gb(self) -> float:
        return 0.05

    def measure(self, point: Any, settle_s: float, measure_s: float) -> Any:
        import numpy as np

        from env.sim.fit import MeasuredPoint, simulate_points
        from hw.profile import Window

        if self.fail_after is not None and len(self.measured) >= self.fail_after:
            raise RuntimeError("the synthetic service died")
        self.measured.append(point)
        mp = MeasuredPoint(point.rate_rps, point.quota_cores, 1.0, point.be_threads, point.be_quota_cores)
        p99 = float(simulate_points(self.prof, self.platform, [mp])[0])
        rng = np.random.default_rng([self.seed, len(self.measured)])
        n = max(1, round(measure_s / self.platform.interval_s))
        p99s = p99 * np.exp(self.jitter * rng.standard_normal(n))
        behind = point.rate_rps > self.generator_max_rps
        lag = self.GENERATOR_LAG_US if behind else 50.0
        if behind:  # every request is that late, its latency with it
            p99s = p99s + lag
        cpu = min(point.rate_rps * self.svc_s, point.quota_cores)
        return Window(
            tuple(float(x) for x in p99s),
            LatencyHistogram.of_values_us(p99s),
            cpu,
            point.rate_rps,
            lag_p99s_us=n * (lag,),
        )

    def close(self) -> None:
        self.closed = True
