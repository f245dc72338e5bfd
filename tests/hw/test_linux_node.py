"""LinuxNode on fake hosts (apply/observe/close contracts, error paths) and on the real kernel."""

from __future__ import annotations

import errno
import math
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from env.allocations import fair_allocation, unmanaged_allocation
from env.node import Node
from env.types import Allocation, AllocationError, Move, Resource
from hw.config import AppTarget, CoresConfig, LinuxNodeConfig, MemoryConfig
from hw.linux_node import LinuxNode, RestoreError, assign_cores
from hw.probe import CapabilityError
from hw.runner import HwInputError
from tests.fakes import APPS, linux_config

GIB = 2**30


@pytest.fixture
def node(v1_host, tmp_path, clock, feed):
    n = LinuxNode(linux_config(v1_host, tmp_path), feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs)
    yield n
    n.close()


def split(node: LinuxNode, lc_cores: float = 1.0, lc_mem_gb: float = 3.0) -> Allocation:
    caps = node.capabilities()
    a = fair_allocation(caps)
    a = a.replace_app("mc", cores=lc_cores, memory_gb=lc_mem_gb, llc_ways=12, freq_mhz=2000)
    return a.replace_app("be", cores=caps.cores - lc_cores, memory_gb=2.0, llc_ways=4, freq_mhz=1200)


def test_capabilities_come_from_the_probe(node):
    caps = node.capabilities()
    assert isinstance(node, Node)
    assert caps.cores == 2.0 and caps.core_step == 1.0  # 4 CPUs = 2 physical cores (HT pairs)
    assert caps.llc_ways == 20 and caps.clos_count == 3
    assert caps.freq_levels_mhz[0] == 1200 and caps.freq_levels_mhz[-1] == 3600 and caps.turbo
    assert caps.knobs == frozenset(Resource)
    assert [a.name for a in caps.lc_apps] == ["mc"] and caps.app("mc").qos_target_us == 500.0


def test_apply_writes_disjoint_cpusets_limits_cat_and_reads_back(node, v1_host):
    with pytest.raises(RuntimeError, match="reset"):
        node.current_allocation()
    a = split(node)
    got = node.apply(a)
    assert got == a and node.current_allocation() == got
    cg = v1_host.cgroup_root
    mc_cpus = (cg / "cpuset" / "mc" / "cpuset.cpus").read_text()
    be_cpus = (cg / "cpuset" / "be" / "cpuset.cpus").read_text()
    assert {mc_cpus, be_cpus} == {"0-1", "2-3"}  # whole physical cores, disjoint
    assert int((cg / "memory" / "mc" / "memory.limit_in_bytes").read_text()) == 3 * GIB
    assert (cg / "blkio" / "mc" / "blkio.throttle.read_bps_device").read_text().split() == [
        "254:0",
        str(int(a["mc"].disk_mbps * 1e6)),
    ]
    clos = a["mc"].clos
    sch = (v1_host.resctrl_root / f"coloc_clos{clos}" / "schemata").read_text()
    assert bin(int(sch.split("=")[1].split(";")[0], 16)).count("1") == 12
    assert "1000" in (v1_host.resctrl_root / f"coloc_clos{clos}" / "tasks").read_text().split()
    mc_cpu = int(mc_cpus[0])
    assert (v1_host.cpu_root / f"cpu{mc_cpu}" / "cpufreq" / "scaling_max_freq").read_text() == "2000000"
    # diff: the same allocation again writes nothing
    n = len(v1_host.fs.writes)
    node.apply(a)
    assert len(v1_host.fs.writes) == n
    # one move writes only what changed
    b = a.replace_app("mc", memory_gb=4.0)
    node.apply(b)
    assert [Path(p).name for p, _ in v1_host.fs.writes[n:]] == ["memory.limit_in_bytes"]


def test_invalid_allocation_raises_before_any_write(node, v1_host):
    a = split(node)
    bad = a.replace_app("mc", cores=5.0)
    with pytest.raises(AllocationError, match=r"mc.cores"):
        node.apply(bad)
    with pytest.raises(AllocationError, match="freq_mhz"):
        node.apply(a.replace_app("mc", freq_mhz=1250))
    assert v1_host.fs.writes == []


def test_be_with_zero_cores_is_frozen_and_thawed(node, v1_host):
    a = split(node, lc_cores=2.0)
    got = node.apply(a)
    assert got["be"].cores == 0.0
    assert (v1_host.cgroup_root / "freezer" / "be" / "freezer.state").read_text() == "FROZEN"
    node.apply(split(node, lc_cores=1.0))
    assert (v1_host.cgroup_root / "freezer" / "be" / "freezer.state").read_text() == "THAWED"


def test_memory_down_move_is_clamped_and_reported(node, v1_host):
    node.apply(split(node))
    v1_host.set_memory_usage("mc", int(2.5 * GIB))
    got = node.apply(split(node, lc_mem_gb=1.0))
    assert got["mc"].memory_gb > 2.5  # never below the working set: clamped, and said so
    assert int((v1_host.cgroup_root / "memory" / "mc" / "memory.limit_in_bytes").read_text()) == round(
        got["mc"].memory_gb * GIB
    )


def test_observe_fresh_stale_and_silent_feed(node, v1_host, clock, feed):
    obs = node.reset()
    s = obs.app("mc")
    assert not s.valid and math.isnan(s.p99_us) and math.isnan(s.load_rps) and not obs.valid
    assert obs.stale_s > 0
    (v1_host.cgroup_root / "cpuacct" / "mc" / "cpuacct.usage").write_text(str(int(0.25e9)))
    feed.put("mc", p99_us=400.0, rps=5000.0)
    clock.advance(0.5)
    obs = node.observe()
    s = obs.app("mc")
    assert s.valid and obs.valid and obs.stale_s == 0.0
    assert s.p99_us == 400.0 and s.slack == pytest.approx(0.2) and s.load_frac == pytest.approx(0.5)
    assert s.usage.cpu_util == pytest.approx(0.25 / 0.5 / node.current_allocation()["mc"].cores)
    assert s.usage.freq_mhz == pytest.approx(2000.0) and s.usage.llc_mb == pytest.approx(1.5)
    clock.advance(1.2)  # older than 2 intervals
    obs = node.observe()
    assert not obs.app("mc").valid and math.isnan(obs.app("mc").p99_us)
    assert obs.stale_s == pytest.approx(1.7)  # the reading came 0.5 s + 1.2 s ago
    assert obs.allocation == node.current_allocation()


def test_be_throughput_is_its_cpu_time_over_the_nodes_even_above_its_cores(node, v1_host, clock):
    """BE throughput is the CPU time the job got over the node's. Under a CFS period longer than the
    interval a throttled job spends a period's quota in a burst, above its cores for an interval:
    its throughput counts all of it, while its utilisation (of its cores) stays at most 1."""
    caps = node.capabilities()
    node.reset()
    node.apply(split(node, lc_cores=caps.cores - 1.0))  # the BE job on one core
    node.observe()
    usage = v1_host.cgroup_root / "cpuacct" / "be" / "cpuacct.usage"
    usage.write_text(str(int(usage.read_text()) + int(0.75e9)))  # 1.5 cores for 0.5 s
    clock.advance(0.5)
    be = node.observe().be[0]
    assert be.throughput == pytest.approx(1.5 / caps.cores)
    assert be.usage.cpu_util == 1.0


def test_a_readings_histogram_and_sub_interval_p99s_enter_one_sample_only(node, clock, feed):
    from env.histogram import LatencyHistogram

    node.reset()
    h = LatencyHistogram.of_values_us([100.0, 200.0, 400.0])
    feed.put("mc", p99_us=400.0, rps=6.0, requests=3, histogram=h, sub_p99_us=(100.0, 400.0))
    clock.advance(0.5)
    first = node.observe().app("mc")
    assert first.valid and first.histogram == h and first.requests == 3
    assert first.sub_p99_us == (100.0, 400.0)  # the sub-interval p99s ride with the histogram
    clock.advance(0.5)  # no newer reading: the same one again, still fresh
    again = node.observe().app("mc")
    assert again.valid and again.p99_us == 400.0 and again.histogram is None  # not counted twice
    assert again.sub_p99_us == ()
    feed.put("mc", p99_us=300.0, rps=6.0, requests=3, histogram=h)
    clock.advance(0.5)
    assert node.observe().app("mc").histogram == h


def test_cpu_shares_are_written_read_back_and_restored(node, v1_host):
    """Intel PRM sets cpu.shares 200000 for LC and 2 for BE containers (eris/eris.py:249-253)."""
    node.reset()
    a = split(node).replace_app("mc", cpu_shares=200_000).replace_app("be", cpu_shares=2)
    got = node.apply(a)
    assert (got["mc"].cpu_shares, got["be"].cpu_shares) == (200_000, 2)
    shares = {app: (v1_host.cgroup_root / "cpu" / app / "cpu.shares") for app in ("mc", "be")}
    assert shares["mc"].read_text() == "200000" and shares["be"].read_text() == "2"
    got = node.apply(got.replace_app("be", cpu_shares=0))  # not set again: the kernel's default
    assert got["be"].cpu_shares == 0 and shares["be"].read_text() == "1024"
    node.close()
    assert shares["mc"].read_text() == "1024"  # as found


def test_runtime_write_error_keeps_last_good_value_and_counts(node, v1_host):
    a = split(node)
    node.apply(a)
    v1_host.fs.fail("cg/memory/mc/memory.limit_in_bytes", errno.EBUSY)
    got = node.apply(a.replace_app("mc", memory_gb=5.0))
    assert got["mc"].memory_gb == 3.0  # the last good value
    assert node.errors["mem"] == 1 and "EBUSY" in node.last_error
    v1_host.fs.clear()
    v1_host.fs.fail("cg/memory/mc/memory.limit_in_bytes", errno.EACCES)
    got = node.apply(a.replace_app("mc", memory_gb=4.0))
    assert got["mc"].memory_gb == 3.0 and node.errors["mem"] == 2 and "EACCES" in node.last_error
    v1_host.fs.clear()  # else close() cannot restore the limit either (and says so)


def test_close_that_cannot_restore_a_knob_says_so_and_the_next_start_retries_it(
    v1_host, tmp_path, clock, feed
):
    limit = v1_host.cgroup_root / "memory" / "mc" / "memory.limit_in_bytes"
    before = limit.read_text()
    cfg = linux_config(v1_host, tmp_path)
    n = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs)
    n.apply(split(n))
    v1_host.fs.fail("cg/memory/mc/memory.limit_in_bytes", errno.EACCES)
    with pytest.raises(RestoreError, match=r"memory.limit_in_bytes.*EACCES.*stay in the journal") as e:
        n.close()
    assert e.value.failed == n.unrestored and len(n.unrestored) == 1 and limit.read_text() != before
    n.close()  # idempotent: reported once
    v1_host.fs.clear()
    again = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs)
    assert again.restored_at_start is not None and again.restored_at_start.ok and limit.read_text() == before
    again.close()


def test_cgroup_vanishing_mid_run_degrades(node, v1_host, clock, feed):
    node.reset()
    feed.put("mc", 300.0, 1000.0)
    for h in ("cpu", "cpuacct", "memory", "cpuset", "blkio", "freezer", "unified"):
        shutil.rmtree(v1_host.cgroup_root / h / "mc")
    clock.advance(0.5)
    obs = node.observe()
    assert not obs.app("mc").valid and not obs.valid  # the feed is fresh but the usage is gone
    assert node.errors["usage"] >= 1
    before = node.current_allocation()
    got = node.apply(before.replace_app("mc", memory_gb=before["mc"].memory_gb + 1))
    assert got["mc"].memory_gb == before["mc"].memory_gb and node.errors["mem"] == 1


def test_close_restores_everything_and_is_idempotent(v1_host, tmp_path, clock, feed):
    cg = v1_host.cgroup_root
    orig = {p: p.read_text() for p in cg.rglob("*") if p.is_file()}
    orig_rs = (v1_host.resctrl_root / "schemata").read_text()
    n = LinuxNode(linux_config(v1_host, tmp_path), feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs)
    n.reset()
    n.apply(split(n, lc_cores=2.0))
    n.close()
    n.close()
    now = {p: p.read_text() for p in cg.rglob("*") if p.is_file()}
    changed = {str(p) for p in orig if orig[p] != now.get(p) and not p.name.startswith("tasks")}
    assert changed == set()
    assert (v1_host.resctrl_root / "schemata").read_text() == orig_rs
    assert not any(v1_host.resctrl_root.glob("coloc_clos*"))
    with pytest.raises(RuntimeError, match="closed"):
        n.apply(split(n))


def test_missing_cgroup_fails_fast_and_writes_nothing(v1_host, tmp_path, clock, feed):
    apps = (APPS[0], AppTarget("be", "be", cgroup="nope"))
    with pytest.raises(HwInputError, match="cgroup 'nope' of 'be' does not exist"):
        LinuxNode(
            linux_config(v1_host, tmp_path, apps=apps), feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs
        )
    assert v1_host.fs.writes == []
    with pytest.raises(HwInputError, match="process 999999 does not exist"):
        LinuxNode(
            linux_config(v1_host, tmp_path, apps=(APPS[0], AppTarget("be", "be", pids=(999999,)))),
            feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs,
        )  # fmt: skip
    assert v1_host.fs.writes == [] and not (v1_host.cgroup_root / "cpu" / "coloc").exists()


def test_missing_knob_fails_fast_or_is_masked(tmp_path, clock, feed, host_factory):
    host = host_factory["v1"](tmp_path, resctrl=False)
    with pytest.raises(CapabilityError, match="mount -t resctrl"):
        LinuxNode(linux_config(host, tmp_path), feed=feed, clock=clock, monotonic=clock, fs=host.fs)
    n = LinuxNode(
        linux_config(host, tmp_path, require_knobs=False), feed=feed, clock=clock, monotonic=clock, fs=host.fs
    )
    try:
        caps = n.capabilities()
        assert Resource.CACHE not in caps.knobs and Resource.CORE in caps.knobs
        a = fair_allocation(caps)
        assert "no cache knob" in a.infeasible_reason("mc", Move.UP_CACHE, caps)
        n.apply(a)
    finally:
        n.close()


def test_quota_mode_on_cgroup_v2(v2_host, tmp_path, clock, feed):
    cfg = linux_config(
        v2_host,
        tmp_path,
        knobs=("core", "mem", "disk"),
        cores=CoresConfig(mode="quota", quota_step_cores=0.25),
    )
    n = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=v2_host.fs)
    try:
        caps = n.capabilities()
        assert (caps.cores, caps.core_step) == (4.0, 0.25)
        a = fair_allocation(caps).replace_app("mc", cores=1.25).replace_app("be", cores=2.75)
        got = n.apply(a)
        assert got["mc"].cores == 1.25 and got["be"].cores == 2.75
        assert (v2_host.cgroup_root / "mc" / "cpu.max").read_text() == "125000 100000"
        got = n.apply(got.replace_app("be", cores=0.0))
        assert got["be"].cores == 0.0 and (v2_host.cgroup_root / "be" / "cgroup.freeze").read_text() == "1"
    finally:
        n.close()
    assert (v2_host.cgroup_root / "mc" / "cpu.max").read_text() == "max 100000"
    assert (v2_host.cgroup_root / "be" / "cgroup.freeze").read_text() == "0"


def test_assign_cores_moves_as_little_as_possible():
    assert assign_cores({}, {1: 2, 0: 1}, 4) == {0: (0,), 1: (1, 2)}
    cur = {0: (0,), 1: (1, 2)}
    assert assign_cores(cur, {0: 2, 1: 1}, 4) == {0: (0, 2), 1: (1,)}
    assert assign_cores(cur, {0: 0, 1: 3}, 4) == {0: (), 1: (0, 1, 2)}
    with pytest.raises(AllocationError):
        assign_cores(cur, {0: 3, 1: 2}, 4)


# ---- the real kernel ------------------------------------------------------------------------------


def _real_cgroups() -> bool:
    return (
        os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup/cpu") and os.path.isdir("/sys/fs/cgroup/memory")
    )


@pytest.mark.linux
@pytest.mark.skipif(not _real_cgroups(), reason="needs root and cgroup v1 cpu/memory here")
def test_quota_mode_unmanaged_gives_every_member_the_whole_node(v2_host, tmp_path, clock, feed):
    """A core group holding every managed core is not split (no isolation, env/types.py); a group
    that holds part of the node still is, so its members never exceed its share."""
    cfg = linux_config(
        v2_host,
        tmp_path,
        knobs=("core", "mem", "disk"),
        cores=CoresConfig(mode="quota", quota_step_cores=0.25),
    )
    n = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=v2_host.fs)
    try:
        n.apply(unmanaged_allocation(n.capabilities()))
        for app in ("mc", "be"):
            assert (v2_host.cgroup_root / app / "cpu.max").read_text() == "400000 100000"
        got = n.apply(
            fair_allocation(n.capabilities()).replace_app("mc", cores=1.5).replace_app("be", cores=2.5)
        )
        assert (
            got["mc"].cores == 1.5 and (v2_host.cgroup_root / "mc" / "cpu.max").read_text() == "150000 100000"
        )
    finally:
        n.close()


def test_real_node_quota_mode_with_created_cgroups(tmp_path, clock, feed):
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    parent = f"coloc_test_{uuid.uuid4().hex[:8]}"
    cfg = LinuxNodeConfig(
        name="real",
        apps=(
            AppTarget("mc", "lc", qos_target_us=500.0, max_load_rps=1000.0, pids=(procs[0].pid,)),
            AppTarget("be", "be", pids=(procs[1].pid,)),
        ),
        knobs=("core", "mem"),
        cgroup_parent=parent,
        state_path=str(tmp_path / "journal.jsonl"),
        cores=CoresConfig(mode="quota", quota_step_cores=0.25),
        memory=MemoryConfig(total_gb=4.0, step_gb=0.5),
    )
    try:
        n = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock)
        try:
            obs = n.reset()
            assert obs.allocation == n.current_allocation()
            a = n.current_allocation().replace_app("mc", cores=1.5).replace_app("be", cores=0.5)
            got = n.apply(a)
            assert got["mc"].cores == 1.5 and got["be"].cores == 0.5
            q = Path(f"/sys/fs/cgroup/cpu/{parent}/mc/cpu.cfs_quota_us").read_text().strip()
            assert q == "150000"
            feed.put("mc", 250.0, 500.0)
            clock.advance(0.5)
            o = n.observe()
            assert o.app("mc").valid and o.app("mc").usage.memory_gb >= 0.0
        finally:
            n.close()
        assert not Path(f"/sys/fs/cgroup/cpu/{parent}").exists()
        assert f"{parent}" not in Path(f"/proc/{procs[0].pid}/cgroup").read_text()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_gym_env_steps_on_a_linux_node(v1_host, tmp_path, clock, feed):
    from hw.gym import make_linux_env

    env = make_linux_env(
        linux_config(v1_host, tmp_path),
        feed=feed,
        node_kwargs={"clock": clock, "monotonic": clock, "fs": v1_host.fs},
    )
    try:
        x, info = env.reset(seed=0)
        assert env.observation_space.contains(x) and info["action_mask"][0]
        feed.put("mc", 450.0, 2000.0)
        x, reward, _, _, info = env.step(0)
        assert env.observation_space.contains(x) and math.isfinite(reward)
        assert env.unwrapped.observation.app("mc").valid
    finally:
        env.close()
    assert not any(v1_host.resctrl_root.glob("coloc_clos*"))
