"""`LinuxNode`: the `Node` protocol over a real server (DESIGN §3) - cgroups, resctrl, cpufreq, tc
and Docker, with latency from a feed (hw.feed).

Start-up, in this order (fail fast, DESIGN §6.5):

1. open the journal (hw.state) and, if a previous controller died without closing, restore what it
   had changed *before anything else*;
2. probe the host (hw.probe) and stop with `CapabilityError` when a configured knob is missing;
3. resolve every app to its cgroups (a container by name/label, an existing cgroup, or processes
   moved into a cgroup we create): a missing container, cgroup or process raises `HwInputError`
   naming it, and nothing is written.

`apply(allocation)`: `validate_allocation` and the hardware's own limits (CAT masks, MBA levels,
frequency range) are checked first, so invalid input raises before any write; then only the knobs
whose value differs from the allocation in force are written; every value is read back, and the
returned allocation is what is really in force (e.g. a memory limit clamped above the working set,
a frequency the driver rounded). A write that fails at run time (EBUSY, EACCES, a cgroup or
container that vanished) keeps that knob's last good value, is counted in `errors` and logged.

`observe()`: each LC app's sample comes from the feed's latest reading; a reading older than
`feed.stale_intervals` intervals, or none, makes the sample invalid (p99 and load NaN, never zero)
and sets `Observation.stale_s`. The reading's latency histogram, when the writer sent one (the
load generator does), goes into the sample once: a reading observed again (the writer has not
reported a newer interval) keeps its p99 but no histogram, so its requests are not counted twice
in a window's tail. Usage comes from the apps' cgroups (CPU time, memory, I/O; PSI is
kept in `usage_of`), resctrl monitoring (LLC occupancy, memory bandwidth), cpufreq (achieved
frequency) and tc (bytes sent). BE throughput is the CPU time the BE job got, as a fraction of the
whole managed node's CPU time (a proxy for "progress normalised to the job alone").

`close()` replays the journal (everything back as found) and is idempotent; a knob it cannot put
back raises `RestoreError` naming it (it stays in the journal, and `unrestored` lists it), so no
caller reports a node restored that is not. The journal replays only what this node may touch
(`hw.state.JournalScope`: its cgroup root, resctrl and cpufreq directories, tc device, containers).

Units: `memory_gb` is GiB (2^30 bytes, as the kernel counts); disk MB/s are 10^6 bytes/s; network
Gbit/s are 10^9 bit/s.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from env.allocations import fair_allocation
from env.node import Clock, RealClock
from env.types import (
    Allocation,
    AllocationError,
    AppAlloc,
    AppSample,
    BeSample,
    Capabilities,
    Observation,
    Usage,
    validate_allocation,
)
from hw.cgroups import DEFAULT_CPU_SHARES, CgroupRef, Cgroups, CgroupUsage, format_cpu_list
from hw.config import AppTarget, LinuxNodeConfig, load_linux_config
from hw.containers import ContainerInfo, Docker, connect
from hw.containers import restore_handler as docker_restore
from hw.cpufreq import CpuFreq
from hw.feed import LatencyReading, LatencySource
from hw.probe import ProbeResult, capabilities, check, probe
from hw.resctrl import Resctrl
from hw.runner import CommandError, HwError, HwInputError, KnobError, Runner, Sysfs
from hw.state import Journal, JournalScope, RestoreReport
from hw.tc import FIRST_APP_MINOR, Tc, net_cls_classid
from hw.tc import restore_handler as tc_restore

log = logging.getLogger(__name__)

GIB = 2**30
RUNTIME_ERRORS = (KnobError, CommandError, HwError, OSError)


class RestoreError(HwError):
    """`close()` could not put some knobs back; `failed` names them (they stay in the journal, and
    the next start retries them)."""

    def __init__(self, message: str, failed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.failed = failed


@dataclass
class _Target:
    spec: AppTarget
    ref: CgroupRef
    container: ContainerInfo | None
    minor: int  # tc class minor


class LinuxNode:
    """The real node. See the module docstring for the start-up, apply and observe contracts."""

    def __init__(
        self,
        config: LinuxNodeConfig | str | Path,
        *,
        feed: LatencySource | None = None,
        clock: Clock | None = None,
        fs: Sysfs | None = None,
        runner: Runner | None = None,
        docker_client: Any = None,
        monotonic: Callable[[], float] = time.monotonic,
        initial: Callable[[Capabilities], Allocation] = fair_allocation,
    ) -> None:
        self.config = cfg = config if isinstance(config, LinuxNodeConfig) else load_linux_config(config)
        self._fs = fs or Sysfs()
        self._runner = runner or Runner()
        self._clock: Clock = clock or RealClock()
        self._mono = monotonic
        self._initial = initial
        self._docker_client = docker_client
        self._closed = False
        self.errors: Counter[str] = Counter()
        self.last_error: str = ""
        self.restored_at_start: RestoreReport | None = None
        self.unrestored: tuple[str, ...] = ()  # what close() could not put back

        # 1. the journal first: a dead controller's changes are undone before anything else
        self._journal = Journal(cfg.state_path, self._fs, journal_scope(cfg))
        pending = self._journal.open()
        if pending:
            log.warning(
                "journal %s has %d entries from an unfinished run: restoring", cfg.state_path, len(pending)
            )
            report = self._journal.restore(self._handlers(pending))
            self.restored_at_start = report
            if not report.ok:
                self._journal.close()
                raise HwError(
                    f"could not restore the state a previous run left ({cfg.state_path}): "
                    + "; ".join(report.failed)
                )
        try:
            self._start(feed)
        except BaseException:
            self._journal.restore(self._handlers(self._journal.entries))
            self._journal.close()
            raise

    def _start(self, feed: LatencySource | None) -> None:
        cfg = self.config
        # 2. probe and fail fast
        self.probe: ProbeResult = probe(cfg, fs=self._fs, runner=self._runner)
        check(cfg, self.probe)
        for knob, why in self.probe.missing.items():
            log.warning("knob %s masked: %s", knob, why)
        self._caps = capabilities(cfg, self.probe)
        knobs = self.probe.available
        self._cg = Cgroups(cfg.cgroup_root, fs=self._fs, journal=self._journal, proc_root=cfg.proc_root)
        self._rdt = (
            Resctrl(
                cfg.cache.resctrl_root,
                fs=self._fs,
                journal=self._journal,
                prefix=cfg.cache.group_prefix,
                restrict_default_group=cfg.cache.restrict_default_group,
            )
            if "cache" in knobs
            else None
        )
        self._freq = (
            CpuFreq(cfg.cpu_root, self.probe.cpus, mode=cfg.freq.mode, fs=self._fs, journal=self._journal)
            if "freq" in knobs
            else None
        )
        # cpufreq also serves the achieved-frequency sensor when present
        self._freq_sensor = self._freq
        if self._freq_sensor is None and self.probe.cpufreq is not None:
            self._freq_sensor = CpuFreq(cfg.cpu_root, self.probe.cpus, fs=self._fs)
        self._tc = (
            Tc(
                cfg.net.device or "",
                link_gbps=cfg.net.total_gbps,
                runner=self._runner,
                journal=self._journal,
                netns=cfg.net.netns,
                replace_existing=cfg.net.replace_existing,
            )
            if "net" in knobs
            else None
        )
        self._docker = (
            Docker(self._docker_client or connect(cfg.docker_url), self._journal) if cfg.uses_docker else None
        )
        # 3. resolve every app (validation pass first: nothing is created if one is missing)
        self._targets = self._resolve()
        if self._tc is not None:
            self._tc.setup()
            for t in self._targets.values():
                if cfg.net.match == "port" and t.spec.ports:
                    self._tc.add_port_filters(t.minor, t.spec.ports)
            if cfg.net.match == "cgroup":
                self._tc.add_cgroup_filter()
                for t in self._targets.values():
                    self._cg._write(t.ref.dir("net_cls") / "net_cls.classid", str(net_cls_classid(t.minor)))
        self._owned_feed = feed is None
        self._feed: LatencySource = (
            feed
            if feed is not None
            else _open_feed(cfg.feed.url, [a.feed_key for a in cfg.apps if a.kind == "lc"])
        )
        self._alloc: Allocation | None = None
        self._assumed: Allocation | None = None  # taken as in force until something is applied (assume)
        self._group_cores: dict[int, tuple[int, ...]] = {}  # core group -> physical core indices
        self._prev: dict[str, tuple[float, CgroupUsage | None, float, float]] = {}
        self._last_reading: dict[str, LatencyReading] = {}  # per LC app: the reading last observed
        self._last_usage: dict[str, CgroupUsage] = {}
        self._t_start = self._mono()
        self._last_obs_mono: float | None = None

    # ---- Node protocol ----------------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        return self._clock

    def capabilities(self) -> Capabilities:
        return self._caps

    def current_allocation(self) -> Allocation:
        if self._alloc is not None:
            return self._alloc
        if self._assumed is not None:
            return self._assumed
        raise RuntimeError("LinuxNode: nothing applied yet; call reset() first")

    def assume(self, allocation: Allocation) -> None:
        """Take `allocation` as in force until something is applied, without writing it: a dry run
        never resets the node (reset applies the start allocation), yet its observations need an
        allocation to be measured against. An apply() after it still writes every knob."""
        self._check_open()
        validate_allocation(allocation, self._caps)
        self._assumed = allocation

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation:
        """Apply the initial allocation (PARTIES' fair start by default), let one interval pass and
        observe it. `seed` and `scenario` do not apply to a real node (its load is what it is)."""
        self._check_open()
        if scenario is not None:
            log.warning(
                "LinuxNode.reset: a real node ignores scenario %r", getattr(scenario, "name", scenario)
            )
        self.apply(self._initial(self._caps))
        self._baseline()
        self._clock.sleep_until(self._clock.now() + self._caps.interval_s)
        return self.observe()

    def close(self) -> None:
        """Restore everything as found (journal replay); idempotent. `RestoreError` when some knob
        could not be restored (module docstring)."""
        if self._closed:
            return
        self._closed = True
        try:
            report = self._journal.restore(self._handlers(self._journal.entries))
        finally:
            self._journal.close()
            if getattr(self, "_owned_feed", False) and hasattr(self._feed, "close"):
                self._feed.close()
        if not report.ok:
            self.unrestored = report.failed
            raise RestoreError(
                f"could not restore {len(report.failed)} of the node's knobs: {'; '.join(report.failed)}. "
                f"They stay in the journal {self.config.state_path}: the next start retries them, or "
                "restore them by hand",
                report.failed,
            )

    def __enter__(self) -> LinuxNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- apply ---------------------------------------------------------------------------------------
    def apply(self, allocation: Allocation) -> Allocation:
        self._check_open()
        validate_allocation(allocation, self._caps)
        self._check_hardware(allocation)
        old = self._alloc
        out = {a.name: a for a in allocation}
        if self._knob("core"):
            self._apply_cores(allocation, old, out)
            self._apply_shares(allocation, old, out)
        if self._freq is not None:
            self._apply_freq(allocation, old, out)
        if self._rdt is not None:
            self._apply_cache(allocation, old, out)
        for a in allocation:
            prev = old[a.name] if old is not None else None
            if self._knob("mem") and (prev is None or prev.memory_gb != a.memory_gb):
                self._apply_memory(a, prev, out)
            if self._knob("disk") and (prev is None or prev.disk_mbps != a.disk_mbps):
                self._apply_disk(a, prev, out)
            if self._tc is not None and (prev is None or prev.net_gbps != a.net_gbps):
                self._apply_net(a, prev, out)
        applied = Allocation.of([out[a.name] for a in allocation], self._caps)
        self._alloc = applied
        return applied

    def _knob(self, name: str) -> bool:
        return name in self.probe.available

    def _check_hardware(self, alloc: Allocation) -> None:
        """Hardware limits `validate_allocation` does not know; raise before any write."""
        if self._rdt is not None:
            try:
                self._rdt.plan({c: w for c, (w, _) in alloc.closes().items()})
            except HwInputError as e:
                raise AllocationError(str(e)) from None
        if self._freq is not None:
            info = self._freq.info
            for a in alloc:
                if not info.min_mhz <= a.freq_mhz <= info.max_mhz:
                    raise AllocationError(
                        f"{a.name}.freq_mhz = {a.freq_mhz}: outside {info.min_mhz}..{info.max_mhz}"
                    )

    def _fail(self, knob: str, app: str, err: Exception) -> None:
        self.errors[knob] += 1
        self.last_error = f"{knob} {app}: {err}"
        log.error("apply %s for %s failed, keeping the last good value: %s", knob, app, err)

    # cores ---------------------------------------------------------------------------------------------
    def _apply_cores(self, alloc: Allocation, old: Allocation | None, out: dict[str, AppAlloc]) -> None:
        groups = alloc.groups()
        step = self._caps.core_step
        if self.config.cores.mode == "cpuset":
            want = {g: round(c) for g, c in groups.items()}
            plan = assign_cores(self._group_cores, want, len(self.probe.cores))
            for a in alloc:
                prev = old[a.name] if old is not None else None
                cores = plan[a.core_group]
                if (
                    prev is not None
                    and prev.cores == a.cores
                    and self._group_cores.get(a.core_group) == cores
                ):
                    continue
                try:
                    if cores:
                        cpus = self._cpus_of(cores)
                        got = self._set_cpuset(self._targets[a.name], cpus)
                        n = sum(1 for c in self.probe.cores if set(c) <= set(got))
                        self._set_paused(self._targets[a.name], False)
                    else:
                        paused = self._set_paused(self._targets[a.name], True)
                        n = 0 if paused else int(prev.cores if prev else 0)
                    out[a.name] = replace(out[a.name], cores=float(n))
                except RUNTIME_ERRORS as e:
                    self._fail("core", a.name, e)
                    out[a.name] = replace(out[a.name], cores=prev.cores if prev else a.cores)
                    plan[a.core_group] = self._group_cores.get(a.core_group, cores)
            self._group_cores = dict(plan)
            return
        # quota mode: a group's quota is split evenly among its apps, so that together they never
        # exceed it; a group holding every managed core is not split: each member may use the whole
        # node and the OS time-shares it, which is what `unmanaged` means (PARTIES Sec. 5.2.3)
        members = Counter(a.core_group for a in alloc)
        for a in alloc:
            prev = old[a.name] if old is not None else None
            if (
                prev is not None
                and prev.cores == a.cores
                and members[a.core_group] == _members(old, a.core_group)
            ):
                continue
            t = self._targets[a.name]
            sharers = 1 if a.cores >= self._caps.cores - 1e-9 else members[a.core_group]
            try:
                if a.cores <= 0:
                    got_cores = 0.0 if self._set_paused(t, True) else a.cores
                else:
                    q = self._set_quota(t, a.cores / sharers)
                    self._set_paused(t, False)
                    got_cores = round((q or self._caps.cores) * sharers / step) * step
                out[a.name] = replace(out[a.name], cores=float(got_cores))
            except RUNTIME_ERRORS as e:
                self._fail("core", a.name, e)
                out[a.name] = replace(out[a.name], cores=prev.cores if prev else a.cores)

    def _apply_shares(self, alloc: Allocation, old: Allocation | None, out: dict[str, AppAlloc]) -> None:
        """CFS weights (`AppAlloc.cpu_shares`: cgroup v1 cpu.shares, v2 cpu.weight), written to the
        app's cgroup (a container's too: Docker leaves the file alone); 0 after a value restores the
        kernel's default (1024), 0 from the start writes nothing."""
        for a in alloc:
            prev = old[a.name] if old is not None else None
            before = prev.cpu_shares if prev is not None else 0
            if a.cpu_shares == before or (a.cpu_shares == 0 and prev is None):
                continue
            try:
                got = self._cg.set_cpu_shares(self._targets[a.name].ref, a.cpu_shares or DEFAULT_CPU_SHARES)
                out[a.name] = replace(out[a.name], cpu_shares=got if a.cpu_shares else 0)
            except RUNTIME_ERRORS as e:
                self._fail("core", a.name, e)
                out[a.name] = replace(out[a.name], cpu_shares=before)

    def _cpus_of(self, cores: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(c for i in cores for c in self.probe.cores[i]))

    def _set_cpuset(self, t: _Target, cpus: tuple[int, ...]) -> tuple[int, ...]:
        if t.container is not None and self._docker is not None:
            if self._cg.cpus(t.ref) != cpus:
                self._docker.update(
                    t.container.id, cpuset_cpus=format_cpu_list(cpus), cpuset_now=format_cpu_list(self._cg.cpus(t.ref)),
                    memory_file=self._memory_file(t),
                )  # fmt: skip
            return self._cg.cpus(t.ref)
        return self._cg.set_cpus(t.ref, cpus, allowed=self.probe.cpus)

    def _set_quota(self, t: _Target, cores: float) -> float | None:
        period = self.config.cores.period_us
        if t.container is not None and self._docker is not None:
            cur = self._cg.cpu_quota(t.ref)
            if cur is None or abs(cur - cores) > 1e-6:
                self._docker.update(
                    t.container.id, cpu_quota_us=max(1000, round(cores * period)), cpu_period_us=period,
                    cpuset_now=format_cpu_list(self._cg.cpus(t.ref)), memory_file=self._memory_file(t),
                )  # fmt: skip
            return self._cg.cpu_quota(t.ref)
        return self._cg.set_cpu_quota(t.ref, cores, period)

    def _memory_file(self, t: _Target) -> str:
        if not t.ref.has("memory"):
            return ""
        name = "memory.max" if self._cg.layout.version == 2 else "memory.limit_in_bytes"
        return str(t.ref.dir("memory") / name)

    def _set_paused(self, t: _Target, paused: bool) -> bool:
        """Pause a BE job given zero cores (Docker pause, or the cgroup freezer); True if paused."""
        if t.container is not None and self._docker is not None:
            cpuset = format_cpu_list(self._cg.cpus(t.ref)) if t.ref.has("cpuset") else ""
            return self._docker.set_paused(t.container.id, paused, cpuset, self._memory_file(t))
        if not t.ref.has("freezer"):
            if paused:
                raise HwError(f"{t.spec.name}: no freezer for this cgroup; cannot pause it")
            return False
        return self._cg.set_frozen(t.ref, paused)

    # frequency --------------------------------------------------------------------------------------------
    def _apply_freq(self, alloc: Allocation, old: Allocation | None, out: dict[str, AppAlloc]) -> None:
        assert self._freq is not None
        done: dict[int, int] = {}
        for a in alloc:
            prev = old[a.name] if old is not None else None
            cores = self._group_cores.get(a.core_group, ())
            if not cores:
                continue
            if a.core_group not in done:
                try:
                    got = self._freq.set({c: a.freq_mhz for c in self._cpus_of(cores)})
                    done[a.core_group] = min(got.values())
                except RUNTIME_ERRORS as e:
                    self._fail("freq", a.name, e)
                    done[a.core_group] = prev.freq_mhz if prev else a.freq_mhz
            got_mhz = done[a.core_group]
            if got_mhz != a.freq_mhz and got_mhz not in self._caps.freq_levels_mhz:
                # the driver rounded: report the nearest level that is not above what is in force
                levels = [lv for lv in self._caps.freq_levels_mhz if lv <= got_mhz] or [
                    self._caps.freq_levels_mhz[0]
                ]
                got_mhz = levels[-1]
            out[a.name] = replace(out[a.name], freq_mhz=got_mhz)

    # cache ---------------------------------------------------------------------------------------------------
    def _apply_cache(self, alloc: Allocation, old: Allocation | None, out: dict[str, AppAlloc]) -> None:
        assert self._rdt is not None
        closes = alloc.closes()
        if old is None or old.closes() != closes or any(old[a.name].clos != a.clos for a in alloc):
            try:
                got = self._rdt.apply(
                    {c: w for c, (w, _) in closes.items()},
                    {c: m for c, (_, m) in closes.items()} if self._rdt.info.mba else None,
                )
            except RUNTIME_ERRORS as e:
                for a in alloc:
                    self._fail("cache", a.name, e)
                    if old is not None:
                        out[a.name] = replace(
                            out[a.name],
                            llc_ways=old[a.name].llc_ways,
                            mba_pct=old[a.name].mba_pct,
                            clos=old[a.name].clos,
                        )
                return
            for a in alloc:
                w, m = got[a.clos]
                out[a.name] = replace(out[a.name], llc_ways=w, mba_pct=m if self._rdt.info.mba else a.mba_pct)
        for a in alloc:
            try:
                self._rdt.assign(a.clos, self._cg.threads(self._targets[a.name].ref))
            except RUNTIME_ERRORS as e:
                self._fail("cache", a.name, e)

    # memory, disk, network ------------------------------------------------------------------------------
    def _apply_memory(self, a: AppAlloc, prev: AppAlloc | None, out: dict[str, AppAlloc]) -> None:
        t = self._targets[a.name]
        mc = self.config.memory
        want = round(a.memory_gb * GIB)
        try:
            if t.container is not None and self._docker is not None:
                floor = self._memory_floor(t)
                target = max(want, floor)
                if target != want:
                    log.warning(
                        "%s: memory %.2f GiB clamped to %.2f GiB (working set + margin)",
                        a.name,
                        a.memory_gb,
                        target / GIB,
                    )
                if self._cg.memory_limit(t.ref) != target:
                    self._docker.update(
                        t.container.id, memory_bytes=target, cpuset_now=format_cpu_list(self._cg.cpus(t.ref)),
                        memory_file=self._memory_file(t),
                    )  # fmt: skip
                got = self._cg.memory_limit(t.ref)
            else:
                res = self._cg.set_memory_limit(
                    t.ref, want, margin_frac=mc.margin_frac, margin_min_bytes=round(mc.margin_min_gb * GIB)
                )
                got = res.applied_bytes
            out[a.name] = replace(out[a.name], memory_gb=self._caps.memory_gb if got is None else got / GIB)
        except RUNTIME_ERRORS as e:
            self._fail("mem", a.name, e)
            out[a.name] = replace(out[a.name], memory_gb=prev.memory_gb if prev else a.memory_gb)

    def _memory_floor(self, t: _Target) -> int:
        mc = self.config.memory
        _, ws = self._cg.memory_usage(t.ref)
        floor = ws + max(int(ws * mc.margin_frac), round(mc.margin_min_gb * GIB))
        return -(-floor // 4096) * 4096

    def _apply_disk(self, a: AppAlloc, prev: AppAlloc | None, out: dict[str, AppAlloc]) -> None:
        t = self._targets[a.name]
        dev = self.probe.disk_device or ""
        bps = round(a.disk_mbps * 1e6) if a.disk_mbps > 0 else None
        try:
            r, _ = self._cg.set_io_limit(t.ref, dev, bps, bps)
            out[a.name] = replace(out[a.name], disk_mbps=self._caps.disk_mbps if r is None else r / 1e6)
        except RUNTIME_ERRORS as e:
            self._fail("disk", a.name, e)
            out[a.name] = replace(out[a.name], disk_mbps=prev.disk_mbps if prev else a.disk_mbps)

    def _apply_net(self, a: AppAlloc, prev: AppAlloc | None, out: dict[str, AppAlloc]) -> None:
        assert self._tc is not None
        try:
            gbps = max(a.net_gbps, 1e-6)
            got = self._tc.set_limit(self._targets[a.name].minor, gbps)
            out[a.name] = replace(out[a.name], net_gbps=a.net_gbps if abs(got - gbps) <= gbps * 1e-3 else got)
        except RUNTIME_ERRORS as e:
            self._fail("net", a.name, e)
            out[a.name] = replace(out[a.name], net_gbps=prev.net_gbps if prev else a.net_gbps)

    # ---- observe ------------------------------------------------------------------------------------
    def _baseline(self) -> None:
        now = self._mono()
        self._last_obs_mono = now
        for name, t in self._targets.items():
            self._prev[name] = (now, self._read_usage(t), self._net_bytes(t), self._mbm_bytes(t))

    def _read_usage(self, t: _Target) -> CgroupUsage | None:
        try:
            u = self._cg.usage(t.ref)
            self._last_usage[t.spec.name] = u
            return u
        except RUNTIME_ERRORS as e:
            self.errors["usage"] += 1
            self.last_error = f"usage {t.spec.name}: {e}"
            log.error("reading the usage of %s failed: %s", t.spec.name, e)
            return None

    def _net_bytes(self, t: _Target) -> float:
        if self._tc is None:
            return math.nan
        try:
            v = self._tc.sent_bytes(t.minor)
        except RUNTIME_ERRORS:
            self.errors["usage"] += 1
            return math.nan
        return math.nan if v is None else float(v)

    def _mbm_bytes(self, t: _Target) -> float:
        if self._rdt is None or self._alloc is None:
            return math.nan
        try:
            return self._rdt.monitor(self._alloc[t.spec.name].clos)[1]
        except RUNTIME_ERRORS:
            return math.nan

    def usage_of(self, app: str) -> CgroupUsage | None:
        """The last raw cgroup counters of `app`, PSI included (for logging)."""
        return self._last_usage.get(app)

    def observe(self) -> Observation:
        self._check_open()
        alloc = self.current_allocation()
        now = self._mono()
        if self._last_obs_mono is None:
            self._baseline()
        interval = max(now - (self._last_obs_mono or now), 1e-9)
        self._last_obs_mono = now
        usages: dict[str, Usage] = {}
        ok: dict[str, bool] = {}
        cpu_cores: dict[str, float] = {}  # CPU time per second of the interval, unclipped
        node_mbw = 0.0
        have_mbw = False
        for name, t in self._targets.items():
            t0, u0, net0, mbm0 = self._prev.get(name, (now, None, math.nan, math.nan))
            u1, net1, mbm1 = self._read_usage(t), self._net_bytes(t), self._mbm_bytes(t)
            self._prev[name] = (now, u1, net1, mbm1)
            dt = max(now - t0, 1e-9)
            a = alloc[name]
            cpu_cores[name] = (
                (u1.cpu_usage_s - u0.cpu_usage_s) / dt if u0 is not None and u1 is not None else math.nan
            )
            usage, valid = self._usage(t, a, u0, u1, dt, cpu_cores[name], net1 - net0, mbm1 - mbm0)
            usages[name], ok[name] = usage, valid
            if math.isfinite(usage.mem_bw_gbps):
                node_mbw += usage.mem_bw_gbps
                have_mbw = True
        samples = []
        stale = 0.0
        max_age = self.config.feed.stale_intervals * self._caps.interval_s
        for spec in self._caps.lc_apps:
            t = self._targets[spec.name]
            r = self._feed.latest(t.spec.feed_key)
            age = (now - r.t_s) if r is not None else (now - self._t_start)
            fresh = r is not None and age <= max_age and math.isfinite(r.p99_us)
            if not fresh:
                stale = max(stale, age)
            valid = fresh and ok[spec.name]
            rps = r.rps if fresh and r is not None else math.nan
            new = r is not None and self._last_reading.get(spec.name) is not r
            if r is not None:
                self._last_reading[spec.name] = r
            samples.append(
                AppSample(
                    name=spec.name,
                    p99_us=r.p99_us if fresh and r is not None else math.nan,
                    target_us=spec.qos_target_us,
                    load_rps=rps,
                    load_frac=rps / spec.max_load_rps if fresh else math.nan,
                    served_rps=rps,
                    dropped_rps=0.0 if fresh else math.nan,  # the feed reports served load only
                    requests=r.requests if fresh and r is not None else 0,
                    usage=usages[spec.name],
                    valid=valid,
                    histogram=r.histogram if fresh and new and r is not None else None,
                    sub_p99_us=r.sub_p99_us if fresh and new and r is not None else (),
                )
            )
        bes = []
        for spec in self._caps.be_apps:
            # its CPU time over the node's, not its clipped utilisation: under a CFS period longer
            # than the interval a throttled job spends a period's quota in a burst, above its cores
            used = cpu_cores[spec.name]
            share = min(1.0, max(0.0, used / self._caps.cores)) if alloc[spec.name].cores > 0 else 0.0
            valid = ok[spec.name] and (math.isfinite(used) or alloc[spec.name].cores <= 0)
            bes.append(BeSample(spec.name, share if valid else math.nan, usages[spec.name]))
        return Observation(
            time_s=self._clock.now(),
            interval_s=interval,
            apps=tuple(samples),
            be=tuple(bes),
            allocation=alloc,
            mem_bw_gbps=node_mbw if have_mbw else math.nan,
            power_w=math.nan,  # RAPL is not read yet
            valid=all(s.valid for s in samples) and all(ok.values()),
            stale_s=stale,
        )

    def _usage(
        self,
        t: _Target,
        a: AppAlloc,
        u0: CgroupUsage | None,
        u1: CgroupUsage | None,
        dt: float,
        cpu_cores: float,
        dnet: float,
        dmbm: float,
    ) -> tuple[Usage, bool]:
        nan = math.nan
        llc_mb = nan
        if self._rdt is not None:
            try:
                llc_mb = self._rdt.monitor(a.clos)[0] / 1e6
            except RUNTIME_ERRORS:
                llc_mb = nan
        freq = nan
        if self._freq_sensor is not None:
            cpus = self._cpus_of(self._group_cores.get(a.core_group, ())) or self.probe.cpus
            freq = self._freq_sensor.cur_mhz(cpus)
        if u1 is None:
            return Usage(nan, llc_mb, nan, nan, nan, nan, freq), False
        if u0 is None:
            cpu = disk = nan
        else:
            cpu = min(1.0, max(0.0, cpu_cores / a.cores)) if a.cores > 0 else 0.0
            disk = (
                ((u1.io_read_bytes + u1.io_write_bytes) - (u0.io_read_bytes + u0.io_write_bytes)) / dt / 1e6
            )
        return (
            Usage(
                cpu_util=cpu,
                llc_mb=llc_mb,
                mem_bw_gbps=dmbm / dt / 1e9 if math.isfinite(dmbm) else nan,
                memory_gb=u1.memory_bytes / GIB,
                disk_mbps=disk,
                net_gbps=dnet * 8 / dt / 1e9 if math.isfinite(dnet) else nan,
                freq_mhz=freq,
            ),
            True,
        )

    # ---- targets ---------------------------------------------------------------------------------------
    def _resolve(self) -> dict[str, _Target]:
        cfg = self.config
        # validation pass: every container, cgroup and process must exist before anything is created
        containers: dict[str, ContainerInfo] = {}
        for spec in cfg.apps:
            if spec.container or spec.label:
                assert self._docker is not None
                info = self._docker.find(name=spec.container, label=spec.label)
                if info.pid <= 0:
                    raise HwInputError(
                        f"app {spec.name}: container {info.name} is {info.status}, not running"
                    )
                containers[spec.name] = info
            elif spec.cgroup and not spec.create:
                self._cg.ref_for_path(spec.name, spec.cgroup)
            for pid in spec.pids:
                self._cg.pid_cgroup_paths(pid)  # raises HwInputError naming a missing process
        out = {}
        for i, spec in enumerate(cfg.apps):
            minor = FIRST_APP_MINOR + i
            if spec.name in containers:
                info = containers[spec.name]
                ref = self._cg.ref_for_pid(spec.name, info.pid)
                out[spec.name] = _Target(spec, ref, info, minor)
                continue
            if spec.create:
                ref = self._cg.create(spec.name, spec.cgroup or f"{cfg.cgroup_parent}/{spec.name}")
                for pid in spec.pids:
                    self._cg.move_pid(ref, pid)
            else:
                ref = self._cg.ref_for_path(spec.name, spec.cgroup or "")
            out[spec.name] = _Target(spec, ref, None, minor)
        return out

    def target_ref(self, app: str) -> CgroupRef:
        """The cgroup directories of `app` (to start processes in a created cgroup)."""
        return self._targets[app].ref

    def add_pid(self, app: str, pid: int) -> None:
        """Move a process into `app`'s cgroup (journalled; moved back on close)."""
        self._check_open()
        self._cg.move_pid(self._targets[app].ref, pid)

    # ---- misc ----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LinuxNode is closed")

    def _handlers(self, entries: Any) -> dict[str, Callable]:
        handlers: dict[str, Callable] = {"tc_root": tc_restore(self._runner)}
        if any(e.kind == "docker" for e in entries):
            client = self._docker_client or connect(self.config.docker_url)
            handlers["docker"] = docker_restore(client, self._fs)
        return handlers


def journal_scope(cfg: LinuxNodeConfig) -> JournalScope:
    """What the journal of a node with config `cfg` may name (hw.state): its cgroup root, resctrl and
    cpufreq directories, its tc device and, when it manages containers, those."""
    return JournalScope(
        roots=(cfg.cgroup_root, cfg.cache.resctrl_root, cfg.cpu_root),
        net_devices=((cfg.net.device, cfg.net.netns),) if cfg.net.device else (),
        containers=cfg.uses_docker,
    )


def _members(alloc: Allocation | None, group: int) -> int:
    return 0 if alloc is None else sum(1 for a in alloc if a.core_group == group)


def assign_cores(
    current: Mapping[int, tuple[int, ...]], want: Mapping[int, int], n_cores: int
) -> dict[int, tuple[int, ...]]:
    """Disjoint physical cores per core group, moving as few as possible: each group keeps the
    lowest of its current cores that it still may hold, and growing groups take the lowest free
    ones. Raises `AllocationError` when the groups ask for more than `n_cores`."""
    if sum(want.values()) > n_cores:
        raise AllocationError(f"core groups ask for {sum(want.values())} cores; {n_cores} are managed")
    used: set[int] = set()
    out: dict[int, list[int]] = {}
    for g in sorted(want):
        keep = [c for c in sorted(current.get(g, ())) if c not in used and c < n_cores][: want[g]]
        out[g] = keep
        used.update(keep)
    free = [c for c in range(n_cores) if c not in used]
    for g in sorted(want):
        need = want[g] - len(out[g])
        out[g] += free[:need]
        free = free[need:]
    return {g: tuple(sorted(v)) for g, v in out.items()}


def _open_feed(url: str, apps: list[str]) -> LatencySource:
    from hw.feed import source_from_url

    return source_from_url(url, apps=apps)  # the node's LC apps only: other names are dropped
