"""The journal: write-ahead records, restore order, torn lines, locking, and recovery after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hw.runner import Sysfs
from hw.state import Journal, JournalBusy, JournalEntry, JournalError, JournalScope

REPO = Path(__file__).resolve().parents[2]


def test_record_is_on_disk_before_returning_and_keeps_first_original(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    assert j.open() == []
    f = tmp_path / "knob"
    f.write_text("orig")
    j.record_file(f, ["orig"])
    j.record_file(f, ["second"])  # ignored: the first record holds the original
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["data"]["values"] == ["orig"]
    f.write_text("changed")
    assert j.restore().ok
    assert f.read_text() == "orig" and (tmp_path / "j.jsonl").read_text() == ""


def test_restore_runs_newest_first_and_keeps_failures(tmp_path):
    d = tmp_path / "made"
    j = Journal(tmp_path / "j.jsonl")
    j.open()
    j.record(JournalEntry("mkdir", str(d)))
    d.mkdir()
    (d / "file").write_text("x")  # rmdir will fail: the entry must stay for a later try
    j.record(JournalEntry("custom", "k", {"v": 1}))
    seen = []
    report = j.restore({"custom": lambda e: seen.append(e.key)})
    assert seen == ["k"] and report.restored == 1 and len(report.failed) == 1
    assert [e.kind for e in j.entries] == ["mkdir"]
    (d / "file").unlink()
    assert j.restore().ok and not d.exists()


def test_torn_last_line_is_skipped_and_gone_targets_are_not_failures(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_text(
        JournalEntry("file", str(tmp_path / "gone"), {"values": ["1"]}).to_json() + "\n" + '{"kind": "fi'
    )
    j = Journal(p)
    pending = j.open()
    assert len(pending) == 1
    report = j.restore()
    assert report.ok and report.skipped == 1


def test_second_live_controller_is_refused(tmp_path):
    a = Journal(tmp_path / "j.jsonl")
    a.open()
    with pytest.raises(JournalBusy, match="another running controller"):
        Journal(tmp_path / "j.jsonl").open()
    a.close()
    Journal(tmp_path / "j.jsonl").open()


CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from hw.config import AppTarget, CoresConfig, LinuxNodeConfig, MemoryConfig
from hw.linux_node import LinuxNode
from env.allocations import fair_allocation

class Feed:
    def latest(self, app):
        return None

cfg = LinuxNodeConfig(
    name="crash", apps=(AppTarget("mc", "lc", qos_target_us=500.0, max_load_rps=1000.0, {where}),
                        AppTarget("be", "be", {where_be})),
    knobs=("core", "mem"), cgroup_root={cg!r}, proc_root={proc!r}, cpu_root={cpu!r},
    state_path={state!r}, cores=CoresConfig(mode="quota", quota_step_cores=0.5),
    memory=MemoryConfig(total_gb=4.0),
)
node = LinuxNode(cfg, feed=Feed())
a = fair_allocation(node.capabilities()).replace_app("mc", cores=1.0, memory_gb=1.0)
node.apply(a.replace_app("be", cores=node.capabilities().cores - 1.0))
print("applied", flush=True)
time.sleep(120)
"""


def _crash(script: str) -> None:
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        assert line == "applied", f"child did not apply (rc={p.poll()})"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL


def test_kill_9_then_next_start_restores_first(v1_host, tmp_path, clock, feed):
    from hw.config import AppTarget, CoresConfig, LinuxNodeConfig, MemoryConfig
    from hw.linux_node import LinuxNode

    state = tmp_path / "state" / "j.jsonl"
    quota = v1_host.cgroup_root / "cpu" / "mc" / "cpu.cfs_quota_us"
    limit = v1_host.cgroup_root / "memory" / "mc" / "memory.limit_in_bytes"
    before = (quota.read_text(), limit.read_text())
    _crash(
        CHILD.format(
            repo=str(REPO), where='cgroup="mc"', where_be='cgroup="be"', cg=str(v1_host.cgroup_root),
            proc=str(v1_host.proc_root), cpu=str(v1_host.cpu_root), state=str(state),
        )
    )  # fmt: skip
    assert quota.read_text() == "100000" and limit.read_text() == str(2**30)  # left throttled
    assert state.read_text().strip()
    cfg = LinuxNodeConfig(
        name="crash",
        apps=(
            AppTarget("mc", "lc", qos_target_us=500.0, max_load_rps=1000.0, cgroup="mc"),
            AppTarget("be", "be", cgroup="be"),
        ),
        knobs=("core",),
        cgroup_root=str(v1_host.cgroup_root),
        proc_root=str(v1_host.proc_root),
        cpu_root=str(v1_host.cpu_root),
        state_path=str(state),
        cores=CoresConfig(mode="quota", quota_step_cores=0.5),
        memory=MemoryConfig(total_gb=4.0),
    )
    node = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=v1_host.fs)
    try:
        assert node.restored_at_start is not None and node.restored_at_start.restored >= 2
        assert (quota.read_text(), limit.read_text()) == before
    finally:
        node.close()


def _real_v1() -> bool:
    return (
        os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup/cpu") and os.path.isdir("/sys/fs/cgroup/memory")
    )


@pytest.mark.linux
@pytest.mark.skipif(not _real_v1(), reason="needs root and cgroup v1 cpu/memory")
def test_kill_9_on_the_real_kernel_removes_the_cgroups_at_next_start(tmp_path, clock, feed):
    from hw.config import AppTarget, LinuxNodeConfig
    from hw.linux_node import LinuxNode

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    parent = f"coloc_test_{uuid.uuid4().hex[:8]}"
    state = tmp_path / "j.jsonl"
    script = CHILD.format(
        repo=str(REPO), where=f"pids=({sleeper.pid},)", where_be="create=True", cg="/sys/fs/cgroup",
        proc="/proc", cpu="/sys/devices/system/cpu", state=str(state),
    ).replace('name="crash",', f'name="crash", cgroup_parent={parent!r},')  # fmt: skip
    try:
        _crash(script)
        assert Path(f"/sys/fs/cgroup/cpu/{parent}/mc").is_dir()
        assert parent in Sysfs().read(Path(f"/proc/{sleeper.pid}/cgroup"))
        cfg = LinuxNodeConfig(
            name="after", apps=(AppTarget("be", "be", cgroup="/"),), knobs=(), state_path=str(state)
        )
        node = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock)
        node.close()
        assert node.restored_at_start is not None and node.restored_at_start.ok
        assert not Path(f"/sys/fs/cgroup/cpu/{parent}").exists()
        assert parent not in Sysfs().read(Path(f"/proc/{sleeper.pid}/cgroup"))
    finally:
        sleeper.kill()
        sleeper.wait()
        for h in ("cpu", "cpuacct", "cpuset", "memory", "blkio", "freezer", "unified"):
            for d in sorted(Path(f"/sys/fs/cgroup/{h}").glob(f"{parent}/**/"), key=lambda p: -len(p.parts)):
                if d.is_dir():
                    d.rmdir()


# ---- what a journal may name, and a damaged journal -------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """A node's roots with one journalled knob changed from 50000 to 20000, and a file outside them."""
    knob = tmp_path / "cg" / "cpu" / "mc" / "cpu.cfs_quota_us"
    knob.parent.mkdir(parents=True)
    knob.write_text("20000")
    (tmp_path / "rs").mkdir()
    (tmp_path / "cpu").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("mine")
    scope = JournalScope(
        roots=(str(tmp_path / "cg"), str(tmp_path / "rs"), str(tmp_path / "cpu")),
        net_devices=(("eth9", None),),
    )
    return knob, victim, scope


def _journal(path: Path, *entries: JournalEntry) -> Path:
    path.write_text("".join(e.to_json() + "\n" for e in entries))
    return path


@pytest.mark.parametrize(
    "bad",
    [
        "outside",
        "dotdot",
        "release_agent",
        "symlink_out",
        "mkdir_outside",
        "procs_outside",
        "other_tc_device",
        "docker",
        "not_a_path",
    ],
)
def test_a_journal_naming_anything_outside_its_node_replays_nothing(tmp_path, tree, bad):
    knob, victim, scope = tree
    cg = tmp_path / "cg"
    if bad == "symlink_out":
        (cg / "cpu" / "mc" / "cpu.max").symlink_to(victim)
    entry = {
        "outside": JournalEntry("file", str(victim), {"path": str(victim), "values": ["owned"]}),
        "dotdot": JournalEntry("file", "k", {"path": f"{cg}/cpu/../../victim", "values": ["owned"]}),
        "release_agent": JournalEntry("file", "k", {"path": f"{cg}/cpu/release_agent", "values": ["/x"]}),
        "symlink_out": JournalEntry("file", "k", {"path": f"{cg}/cpu/mc/cpu.max", "values": ["owned"]}),
        "mkdir_outside": JournalEntry("mkdir", str(tmp_path / "rs2")),
        "procs_outside": JournalEntry("procs", "1", {"pid": 1, "procs_files": [str(victim)]}),
        "other_tc_device": JournalEntry("tc_root", "eth0", {"dev": "eth0", "netns": None}),
        "docker": JournalEntry("docker", "abc", {"memory": 0}),
        "not_a_path": JournalEntry("file", "k", {"path": ["x"], "values": ["1"]}),
    }[bad]
    good = JournalEntry("file", str(knob), {"path": str(knob), "values": ["50000"]})
    j = Journal(_journal(tmp_path / "j.jsonl", good, entry), scope=scope)
    with pytest.raises(JournalError, match=r"line 2: .*outside this node.*Nothing was replayed.*mv "):
        j.open()
    assert knob.read_text() == "20000" and victim.read_text() == "mine"
    Journal(_journal(tmp_path / "ok.jsonl", good), scope=scope).open()  # the good entry alone is fine


def test_a_damaged_journal_is_an_error_that_says_what_to_do(tmp_path, tree):
    knob, _, scope = tree
    good = JournalEntry("file", str(knob), {"path": str(knob), "values": ["50000"]})
    p = tmp_path / "j.jsonl"
    p.write_text("not json\n" + good.to_json() + "\n")
    with pytest.raises(JournalError, match=r"line 1: not a journal entry.*mv .*j.jsonl"):
        Journal(p, scope=scope).open()
    p.write_text('{"kind": 1, "key": "k"}\n')
    with pytest.raises(JournalError, match="line 1"):
        Journal(p, scope=scope).open()
    assert knob.read_text() == "20000"


def test_the_journal_stays_private_and_is_never_written_through_a_symlink(tmp_path, tree):
    knob, victim, scope = tree
    p = tmp_path / "j.jsonl"
    p.write_text("")
    p.chmod(0o644)
    (tmp_path / "j.jsonl.tmp").symlink_to(victim)  # the old fixed temporary name, prepared by someone
    j = Journal(p, scope=scope)
    j.open()
    assert p.stat().st_mode & 0o777 == 0o600
    j.record_file(knob, ["20000"])
    knob.write_text("30000")
    assert j.restore().ok and knob.read_text() == "20000"  # restore rewrites the journal
    assert p.stat().st_mode & 0o777 == 0o600 and not p.is_symlink() and victim.read_text() == "mine"
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".j.jsonl")) == []
    j.close()
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    with pytest.raises(JournalError, match="is a symlink"):
        Journal(link, scope=scope).open()
    assert victim.read_text() == "mine"
