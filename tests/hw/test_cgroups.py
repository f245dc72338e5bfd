"""cgroup actuators and sensors on fake v1/v2 trees (error paths included) and on the real kernel."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hw.cgroups import (
    Cgroups,
    detect_layout,
    device_number,
    format_cpu_list,
    parse_cpu_list,
    shares_to_weight,
    weight_to_shares,
)
from hw.runner import HwInputError, KnobError, Sysfs, TargetGone
from hw.state import Journal

GIB = 2**30


def cgroups(host, tmp_path, journal=True):
    j = None
    if journal:
        j = Journal(tmp_path / "journal.jsonl", host.fs)
        j.open()
    return Cgroups(host.cgroup_root, fs=host.fs, journal=j, proc_root=host.proc_root), j


def test_cpu_list_round_trip():
    assert parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert format_cpu_list([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert parse_cpu_list("") == ()


def test_detects_hybrid_v1_and_v2_and_nothing(v1_host, v2_host, tmp_path):
    lay = detect_layout(v1_host.cgroup_root, v1_host.fs)
    assert lay.version == 1 and lay.hybrid
    assert {"cpu", "cpuacct", "cpuset", "memory", "io", "freezer"} <= set(lay.v1)
    assert lay.has("psi") and not lay.has("net_cls")
    lay2 = detect_layout(v2_host.cgroup_root, v2_host.fs)
    assert lay2.version == 2 and lay2.v2_controllers == {"cpuset", "cpu", "io", "memory"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(HwInputError, match="no cgroup hierarchy"):
        detect_layout(tmp_path / "empty")


def test_ref_for_missing_cgroup_and_process_name_them(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path, journal=False)
    with pytest.raises(HwInputError, match="cgroup 'nope' of 'x' does not exist"):
        cg.ref_for_path("x", "nope")
    with pytest.raises(HwInputError, match="process 4242 does not exist"):
        cg.ref_for_pid("x", 4242)


def test_ref_for_pid_maps_every_hierarchy(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path, journal=False)
    ref = cg.ref_for_pid("mc", 1000)
    assert ref.dir("cpu") == v1_host.cgroup_root / "cpu" / "mc"
    assert ref.dir("io") == v1_host.cgroup_root / "blkio" / "mc"
    assert ref.dir("psi") == v1_host.cgroup_root / "unified" / "mc"
    assert cg.procs(ref) == (1000,)


def test_set_cpus_diffs_reads_back_and_rejects_unmanaged(v1_host, tmp_path):
    cg, j = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    assert cg.set_cpus(ref, [1, 0], allowed=range(4)) == (0, 1)
    n = len(v1_host.fs.written("cpuset.cpus"))
    assert cg.set_cpus(ref, [0, 1], allowed=range(4)) == (0, 1)
    assert len(v1_host.fs.written("cpuset.cpus")) == n  # no change, no write
    with pytest.raises(HwInputError, match=r"CPUs \[7\] are not managed"):
        cg.set_cpus(ref, [0, 7], allowed=range(4))
    with pytest.raises(HwInputError, match="at least one CPU"):
        cg.set_cpus(ref, [])
    assert cg.cpus(ref) == (0, 1)
    # the original value was journalled before the first write
    e = next(e for e in j.entries if e.key.endswith("mc/cpuset.cpus"))
    assert e.data["values"] == ["0-3"]


def test_cpu_quota_v1_and_v2(v1_host, v2_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path / "a")
    ref = cg.ref_for_path("mc", "mc")
    assert cg.cpu_quota(ref) is None
    assert cg.set_cpu_quota(ref, 0.25) == pytest.approx(0.25)
    assert (ref.dir("cpu") / "cpu.cfs_quota_us").read_text() == "25000"
    assert cg.set_cpu_quota(ref, 1.5, period_us=50_000) == pytest.approx(1.5)
    assert (ref.dir("cpu") / "cpu.cfs_period_us").read_text() == "50000"
    assert cg.set_cpu_quota(ref, None, period_us=50_000) is None
    with pytest.raises(HwInputError, match="positive number of cores"):
        cg.set_cpu_quota(ref, 0.0)
    cg2, _ = cgroups(v2_host, tmp_path / "b")
    ref2 = cg2.ref_for_path("mc", "mc")
    assert cg2.set_cpu_quota(ref2, 0.75) == pytest.approx(0.75)
    assert (ref2.dir("cpu") / "cpu.max").read_text() == "75000 100000"


def test_cpu_shares_v1_and_v2(v1_host, v2_host, tmp_path):
    """Intel PRM's CFS weights (eris/cpuquota.py:35-36, :91-99): cpu.shares on v1, cpu.weight on v2."""
    cg, _ = cgroups(v1_host, tmp_path / "a")
    ref = cg.ref_for_path("mc", "mc")
    assert cg.cpu_shares(ref) == 1024
    assert cg.set_cpu_shares(ref, 200_000) == 200_000
    assert (ref.dir("cpu") / "cpu.shares").read_text() == "200000"
    with pytest.raises(HwInputError, match=r"cpu\.shares"):
        cg.set_cpu_shares(ref, 1)
    cg2, _ = cgroups(v2_host, tmp_path / "b")
    ref2 = cg2.ref_for_path("be", "be")
    assert cg2.cpu_shares(ref2) == weight_to_shares(100)
    assert cg2.set_cpu_shares(ref2, 2) == 2 and (ref2.dir("cpu") / "cpu.weight").read_text() == "1"
    got = cg2.set_cpu_shares(ref2, 200_000)
    assert (ref2.dir("cpu") / "cpu.weight").read_text() == str(shares_to_weight(200_000))
    assert shares_to_weight(got) == shares_to_weight(200_000) and abs(got - 200_000) < 262144 / 9999
    assert shares_to_weight(262_144) == 10_000 and shares_to_weight(1024) == 39  # runc's conversion


def test_memory_down_move_is_clamped_above_working_set(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    v1_host.set_memory_usage("mc", 3 * GIB, inactive_file=1 * GIB)  # working set 2 GiB
    res = cg.set_memory_limit(ref, 1 * GIB, margin_frac=0.1, margin_min_bytes=64 << 20)
    assert res.clamped
    assert res.applied_bytes == res.floor_bytes == pytest.approx(2.2 * GIB, rel=1e-3)
    ok = cg.set_memory_limit(ref, 4 * GIB)
    assert not ok.clamped and ok.applied_bytes == 4 * GIB
    assert cg.set_memory_limit(ref, None).applied_bytes is None


def test_v1_memory_raises_memsw_first(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    (ref.dir("memory") / "memory.memsw.limit_in_bytes").write_text(str(2 * GIB))
    (ref.dir("memory") / "memory.limit_in_bytes").write_text(str(1 * GIB))
    assert cg.set_memory_limit(ref, 3 * GIB).applied_bytes == 3 * GIB
    assert int((ref.dir("memory") / "memory.memsw.limit_in_bytes").read_text()) == 3 * GIB


def test_v2_memory_writes_high_then_max_when_lowering(v2_host, tmp_path):
    cg, _ = cgroups(v2_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    cg.set_memory_limit(ref, 4 * GIB)
    v2_host.fs.writes.clear()
    cg.set_memory_limit(ref, 2 * GIB)
    assert [Path(p).name for p, _ in v2_host.fs.writes] == ["memory.high", "memory.max"]
    v2_host.fs.writes.clear()
    cg.set_memory_limit(ref, 3 * GIB)
    assert [Path(p).name for p, _ in v2_host.fs.writes] == ["memory.max", "memory.high"]
    assert cg.memory_limit(ref) == 3 * GIB


def test_io_limits_v1_and_v2(v1_host, v2_host, tmp_path):
    cg, j = cgroups(v1_host, tmp_path / "a")
    ref = cg.ref_for_path("mc", "mc")
    assert cg.set_io_limit(ref, "254:0", 10_000_000, 20_000_000) == (10_000_000, 20_000_000)
    assert cg.set_io_limit(ref, "8:0", 5_000_000, None) == (5_000_000, None)
    assert cg.io_limit(ref, "254:0") == (10_000_000, 20_000_000)  # other device untouched
    assert cg.set_io_limit(ref, "254:0", None, None) == (None, None)
    with pytest.raises(HwInputError, match="MAJ:MIN"):
        cg.set_io_limit(ref, "/dev/vda", 1, 1)
    j.restore()
    assert (ref.dir("io") / "blkio.throttle.read_bps_device").read_text() == ""
    cg2, _ = cgroups(v2_host, tmp_path / "b")
    ref2 = cg2.ref_for_path("mc", "mc")
    assert cg2.set_io_limit(ref2, "254:0", 10_000_000, None) == (10_000_000, None)
    assert "254:0 rbps=10000000 wbps=max" in (ref2.dir("io") / "io.max").read_text()


def test_device_number_needs_a_block_device(tmp_path):
    assert device_number("254:0") == "254:0"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(HwInputError, match="has no major:minor"):
        device_number(str(f))
    with pytest.raises(HwInputError, match="does not exist"):
        device_number(str(tmp_path / "missing"))
    with pytest.raises(HwInputError, match="has no major:minor"):
        device_number("/dev/null")  # a character device


def test_create_v1_cpuset_copies_mems_and_restore_removes(v1_host, tmp_path):
    cg, j = cgroups(v1_host, tmp_path)
    ref = cg.create("job", "coloc/job")
    d = ref.dir("cpuset")
    assert (d / "cpuset.mems").read_text() == "0" and (d / "cpuset.cpus").read_text() == "0-3"
    assert ref.dir("psi") == v1_host.cgroup_root / "unified" / "coloc" / "job"  # hybrid: PSI group too
    v1_host.add_pid(4321, "")
    cg.move_pid(ref, 4321)
    assert "4321" in (ref.dir("cpu") / "cgroup.procs").read_text().split()
    cg.set_cpu_quota(ref, 0.5)
    report = j.restore()
    assert report.ok, report.failed
    assert not (v1_host.cgroup_root / "cpu" / "coloc").exists()
    assert not (v1_host.cgroup_root / "unified" / "coloc").exists()
    assert "4321" in (v1_host.cgroup_root / "cpu" / "cgroup.procs").read_text().split()


def test_v2_create_enables_controllers_in_parent(v2_host, tmp_path):
    cg, j = cgroups(v2_host, tmp_path)
    ref = cg.create("job", "coloc/job")
    assert set((v2_host.cgroup_root / "cgroup.subtree_control").read_text().split()) == {
        "cpu",
        "cpuset",
        "io",
        "memory",
    }
    assert cg.set_cpus(ref, [2]) == (2,)
    assert j.restore().ok
    assert (v2_host.cgroup_root / "cgroup.subtree_control").read_text() == ""
    assert not (v2_host.cgroup_root / "coloc").exists()


@pytest.mark.parametrize(
    ("err", "match"),
    [(errno.EBUSY, "EBUSY"), (errno.EACCES, "EACCES"), (errno.ENOSPC, "ENOSPC")],
)
def test_write_errors_name_the_file_and_errno(v1_host, tmp_path, err, match):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    v1_host.fs.fail("mc/cpuset.cpus", err)
    with pytest.raises(KnobError, match=match) as ei:
        cg.set_cpus(ref, [0])
    assert ei.value.errno == err and "cpuset.cpus" in str(ei.value)
    assert cg.cpus(ref) == (0, 1, 2, 3)  # nothing changed


def test_enospc_when_task_joins_cpuset_without_mems(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.create("job", "coloc/job")
    v1_host.fs.fail("coloc/job/cgroup.procs", errno.ENOSPC)
    with pytest.raises(KnobError, match=r"ENOSPC.*cpuset without cpus/mems"):
        cg.move_pid(ref, 1000)


def test_vanished_cgroup_is_target_gone(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    assert cg.exists(ref)
    shutil.rmtree(v1_host.cgroup_root / "cpu" / "mc")
    assert not cg.exists(ref)
    with pytest.raises(TargetGone):
        cg.set_cpu_quota(ref, 0.5)
    with pytest.raises(TargetGone):
        cg.usage(ref)


def test_usage_v1_with_psi_from_unified(v1_host, tmp_path):
    cg, _ = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    (ref.dir("cpuacct") / "cpuacct.usage").write_text("2500000000")
    (ref.dir("io") / "blkio.throttle.io_service_bytes_recursive").write_text(
        "254:0 Read 4096\n254:0 Write 8192\n254:0 Total 12288\nTotal 12288\n"
    )
    v1_host.set_memory_usage("mc", 300 << 20, inactive_file=100 << 20)
    (ref.dir("psi") / "cpu.pressure").write_text("some avg10=12.50 avg60=1.00 avg300=0.00 total=777\n")
    u = cg.usage(ref)
    assert u.cpu_usage_s == pytest.approx(2.5)
    assert (u.io_read_bytes, u.io_write_bytes) == (4096, 8192)
    assert u.memory_bytes == 300 << 20 and u.working_set_bytes == 200 << 20
    assert (
        u.cpu_pressure is not None
        and u.cpu_pressure.some_avg10_pct == 12.5
        and u.cpu_pressure.some_total_us == 777
    )


def test_usage_v2(v2_host, tmp_path):
    cg, _ = cgroups(v2_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    (ref.dir("cpu") / "cpu.stat").write_text("usage_usec 1500000\nthrottled_usec 250000\n")
    (ref.dir("io") / "io.stat").write_text("254:0 rbytes=100 wbytes=200 rios=1 wios=2\n")
    (ref.dir("memory") / "memory.current").write_text(str(GIB))
    u = cg.usage(ref)
    assert (u.cpu_usage_s, u.cpu_throttled_s) == (1.5, 0.25)
    assert (u.io_read_bytes, u.io_write_bytes, u.memory_bytes) == (100, 200, GIB)


def test_freeze_v1_freezer_and_v2(v1_host, v2_host, tmp_path):
    cg, j = cgroups(v1_host, tmp_path / "a")
    ref = cg.ref_for_path("be", "be")
    assert cg.set_frozen(ref, True) is True
    assert (ref.dir("freezer") / "freezer.state").read_text() == "FROZEN"
    j.restore()
    assert (ref.dir("freezer") / "freezer.state").read_text() == "THAWED"
    cg2, _ = cgroups(v2_host, tmp_path / "b")
    ref2 = cg2.ref_for_path("be", "be")
    assert cg2.set_frozen(ref2, True) is True and cg2.frozen(ref2)
    assert cg2.set_frozen(ref2, False) is False


def test_journal_keeps_the_first_original(v1_host, tmp_path):
    cg, j = cgroups(v1_host, tmp_path)
    ref = cg.ref_for_path("mc", "mc")
    cg.set_cpu_quota(ref, 0.5)
    cg.set_cpu_quota(ref, 0.25)
    entries = [e for e in j.entries if e.key.endswith("mc/cpu.cfs_quota_us")]
    assert len(entries) == 1 and entries[0].data["values"] == ["-1"]
    assert j.restore().ok
    assert cg.cpu_quota(ref) is None


# ---- the real kernel ------------------------------------------------------------------------------


def _real_v1() -> bool:
    try:
        lay = detect_layout("/sys/fs/cgroup")
    except Exception:
        return False
    return (
        lay.version == 1 and {"cpu", "cpuacct", "cpuset", "memory", "io"} <= set(lay.v1) and os.geteuid() == 0
    )


@pytest.mark.linux
@pytest.mark.skipif(not _real_v1(), reason="needs root and cgroup v1 cpu/cpuacct/cpuset/memory/blkio")
def test_real_cgroups_actuate_read_back_and_restore(tmp_path):
    j = Journal(tmp_path / "journal.jsonl")
    j.open()
    cg = Cgroups("/sys/fs/cgroup", journal=j)
    rel = f"coloc_test_{uuid.uuid4().hex[:8]}/app"
    child = "import sys, time\nsys.stdin.readline()\nx = bytearray(48 << 20)\nprint('ok', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        ref = cg.create("app", rel)
        cg.move_pid(ref, proc.pid)
        assert proc.pid in cg.procs(ref)
        proc.stdin.write("go\n")  # allocate and run inside the cgroup
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok"
        assert cg.set_cpus(ref, [0]) == (0,)
        assert cg.set_cpu_quota(ref, 0.25) == pytest.approx(0.25)
        res = cg.set_memory_limit(ref, 256 << 20)
        assert res.applied_bytes == 256 << 20 and not res.clamped
        low = cg.set_memory_limit(ref, 1 << 20)  # a DOWN move below the working set is clamped
        assert low.clamped and low.applied_bytes == low.floor_bytes > 48 << 20
        dev = "/dev/vda"
        if os.path.exists(dev) and stat.S_ISBLK(os.stat(dev).st_mode):
            num = device_number(dev)
            assert cg.set_io_limit(ref, num, 50_000_000, 40_000_000) == (50_000_000, 40_000_000)
        u = cg.usage(ref)
        assert u.memory_bytes >= 48 << 20 and u.cpu_usage_s > 0
        if ref.has("psi"):
            assert u.cpu_pressure is not None
        assert cg.set_frozen(ref, True) is True
        assert cg.set_frozen(ref, False) is False
    finally:
        report = j.restore()
        after = Sysfs().read(Path(f"/proc/{proc.pid}/cgroup"))
        proc.kill()
        proc.wait()
    assert report.ok, report.failed
    assert rel not in after  # the process was moved back where it came from
    top = rel.split("/")[0]
    assert not any(
        (Path("/sys/fs/cgroup") / h / top).exists() for h in ("cpu", "cpuset", "memory", "blkio", "unified")
    )
