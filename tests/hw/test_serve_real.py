"""serve.py on this machine's real cgroups (root, cgroup v1 cpu/memory).

* SIGTERM and kill -9 of a serve.py process managing two sleeping processes: the cgroups it
  created are gone afterwards and the processes are back where they were (after kill -9, the next
  start puts them back before anything else, even when it then fails on bad input);
* the real run (slow): memcached from Debian under the open-loop load generator publishing to a
  latency feed, a stress-ng BE job, both under cgroups, served ~60 s by PARTIES and ~60 s by a
  second controller, compared in one table. The second controller is `rl:$COLOC_SERVE_POLICY`
  when that is set and the registry knows `rl`, else Heracles (printed either way).

Run with `-s` to see the comparison. Nothing here asserts timing or QoS figures (the VM is shared).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CG = Path("/sys/fs/cgroup")


def _real_cgroups() -> bool:
    return os.geteuid() == 0 and (CG / "cpu").is_dir() and (CG / "memory").is_dir()


pytestmark = [
    pytest.mark.linux,
    pytest.mark.skipif(not _real_cgroups(), reason="needs root and cgroup v1 cpu/memory here"),
]


# ---- helpers --------------------------------------------------------------------------------------
def cgroup_of(pid: int) -> dict[str, str]:
    """hierarchy -> path, from /proc/PID/cgroup."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") or [""]:
            out[c] = path
    return out


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(d.name))
    return out


def node_config(tmp: Path, parent: str, apps: list[dict], feed: Path, **over) -> Path:
    data = {
        "name": "real-test",
        "interval_s": 0.5,
        "knobs": ["core", "mem"],
        "cgroup_parent": parent,
        "state_path": str(tmp / "state" / "journal.jsonl"),
        "cores": {"mode": "quota", "quota_step_cores": 0.25},
        "memory": {"total_gb": 4.0, "step_gb": 0.25, "min_gb": 0.25},
        "feed": {"url": f"file:{feed}", "stale_intervals": 2},
        "apps": apps,
    }
    data.update(over)
    p = tmp / "node.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def serve_config(tmp: Path, node: Path, runs: Path, **over) -> Path:
    data = {
        "name": "real-test",
        "linux": {"config": str(node)},
        "output": {"dir": str(runs), "tensorboard": True},
        "metrics": {"port": 0},
    }
    data.update(over)
    p = tmp / "serve.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


class FilePublisherThread:
    """A latency reading every 0.1 s (stand-in for a load generator in the signal tests)."""

    def __init__(self, path: Path, app: str, p99_us: float) -> None:
        self.path, self.app, self.p99_us = path, app, p99_us
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from hw.feed import FilePublisher

        pub = FilePublisher(self.path)
        while not self._stop.is_set():
            pub.publish(self.app, self.p99_us, 1000.0, requests=200)
            self._stop.wait(0.1)
        pub.close()

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def wait_for(pred, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ticks_logged(runs: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in runs.glob("*/decisions.jsonl"))


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def two_sleepers_setup(tmp_path: Path, sleepers):
    parent = f"coloc_serve_test_{uuid.uuid4().hex[:8]}"
    feed = tmp_path / "feed.jsonl"
    feed.touch()
    apps = [
        {
            "name": "mc",
            "kind": "lc",
            "qos_target_us": 500.0,
            "max_load_rps": 1000.0,
            "pids": [sleepers[0].pid],
        },
        {"name": "be", "kind": "be", "pids": [sleepers[1].pid]},
    ]
    node = node_config(tmp_path, parent, apps, feed)
    runs = tmp_path / "runs"
    return parent, feed, serve_config(tmp_path, node, runs), runs, tmp_path / "state" / "journal.jsonl"


def assert_back_as_found(parent: str, pids: list[int], before: dict[int, dict[str, str]]) -> None:
    for h in ("cpu", "cpuacct", "memory", "freezer"):
        assert not (CG / h / parent).exists(), f"{h}/{parent} left behind"
    for pid in pids:
        assert cgroup_of(pid) == before[pid], f"process {pid} not moved back"


# ---- SIGTERM and kill -9 on real cgroups -------------------------------------------------------------------
def test_sigterm_restores_real_cgroups(tmp_path, sleepers):
    parent, feed, cfg, runs, journal = two_sleepers_setup(tmp_path, sleepers)
    pids = [p.pid for p in sleepers]
    before = {pid: cgroup_of(pid) for pid in pids}
    with FilePublisherThread(feed, "mc", 300.0):
        p = subprocess.Popen(
            [PY, str(ROOT / "serve.py"), "--config", str(cfg), "--controller", "parties", "--quiet"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: ticks_logged(runs) >= 3 or p.poll() is not None, 90, "3 ticks")
            assert p.poll() is None, p.communicate()
            assert cgroup_of(pids[0])["cpu"] == f"/{parent}/mc"  # really managed
            q = int((CG / "cpu" / parent / "mc" / "cpu.cfs_quota_us").read_text())
            assert q > 0
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err
    assert_back_as_found(parent, pids, before)
    (run,) = runs.iterdir()
    assert json.loads((run / "summary.json").read_text())["exit_reason"] == "signal SIGTERM"
    assert journal.read_text() == ""


def test_kill_9_then_the_next_start_restores_real_cgroups_first(tmp_path, sleepers):
    parent, feed, cfg, runs, journal = two_sleepers_setup(tmp_path, sleepers)
    pids = [p.pid for p in sleepers]
    before = {pid: cgroup_of(pid) for pid in pids}
    with FilePublisherThread(feed, "mc", 300.0):
        p = subprocess.Popen(
            [PY, str(ROOT / "serve.py"), "--config", str(cfg), "--controller", "parties", "--quiet"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: ticks_logged(runs) >= 3 or p.poll() is not None, 90, "3 ticks")
        finally:
            p.kill()
            p.wait()
    assert (CG / "cpu" / parent / "mc").is_dir() and cgroup_of(pids[0])["cpu"] == f"/{parent}/mc"
    assert journal.read_text().strip()  # a dead controller's changes, journalled
    r = subprocess.run(
        [PY, str(ROOT / "serve.py"), "--config", str(cfg), "--controller", "parties:/no/such.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "restored the node from" in r.stdout, (r.stdout, r.stderr)
    assert_back_as_found(parent, pids, before)
    assert journal.read_text() == ""


# ---- the real run ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _second_controller() -> str:
    from harness import registry

    policy = os.environ.get("COLOC_SERVE_POLICY")
    if policy and "rl" in registry.REGISTRY and Path(policy).exists():
        return f"rl:{policy}"
    return "heracles"


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("memcached") and shutil.which("stress-ng")), reason="needs memcached and stress-ng"
)
def test_real_run_memcached_and_stress_ng_parties_vs_another_controller(tmp_path):
    duration_s, rate, target_us = 60, 2000, 20_000.0
    port = _free_port()
    mc = subprocess.Popen(
        ["memcached", "-u", "nobody", "-l", "127.0.0.1", "-p", str(port), "-t", "2", "-m", "256"]
    )
    be = subprocess.Popen(
        ["stress-ng", "--cpu", "2", "--timeout", "600s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    parent = f"coloc_serve_real_{uuid.uuid4().hex[:8]}"
    controllers = ["parties", _second_controller()]
    rows = []
    try:
        wait_for(lambda: len(children(be.pid)) >= 2, 30, "stress-ng workers")
        time.sleep(0.5)
        be_pids = [be.pid, *children(be.pid)]
        all_pids = [mc.pid, *be_pids]
        before = {pid: cgroup_of(pid) for pid in all_pids}
        for ctl in controllers:
            tag = ctl.split(":")[0]
            feed = tmp_path / f"feed-{tag}.jsonl"
            feed.touch()
            apps = [
                {
                    "name": "memcached",
                    "kind": "lc",
                    "qos_target_us": target_us,
                    "max_load_rps": 2.0 * rate,
                    "pids": [mc.pid],
                },
                {"name": "be", "kind": "be", "pids": be_pids},
            ]
            node = node_config(tmp_path, parent, apps, feed)
            # the default LC floor (2 cores) would be the whole VM: BE would never run
            floor = {"lc_floor": {"min_cores": 0.5, "min_llc_ways": 1}}
            cfg = serve_config(tmp_path, node, tmp_path / "runs", guards=floor)
            out = tmp_path / "runs" / tag
            lg = subprocess.Popen(
                [
                    PY,
                    "-m",
                    "hw.loadgen",
                    "--target",
                    f"memcached://127.0.0.1:{port}",
                    "--rate",
                    str(rate),
                    "--duration-s",
                    str(duration_s + 15),
                    "--app",
                    "memcached",
                    "--publish",
                    f"file:{feed}",
                    "--quiet",
                    "--seed",
                    "1",
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(2.0)  # the generator warms memcached up and starts publishing
                r = subprocess.run(
                    [
                        PY,
                        str(ROOT / "serve.py"),
                        "--config",
                        str(cfg),
                        "--controller",
                        ctl,
                        "--duration-s",
                        str(duration_s),
                        "--out",
                        str(out),
                        "--quiet",
                    ],
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=duration_s + 120,
                )
            finally:
                lg.terminate()
                lg.wait(timeout=30)
            assert r.returncode == 0, r.stderr[-3000:]
            assert_back_as_found(parent, all_pids, before)  # every run leaves the node as it found it
            s = json.loads((out / "summary.json").read_text())
            assert s["ticks"] == duration_s * 2 and s["valid_ticks"] >= duration_s  # the feed really fed it
            rows.append((ctl, s))
    finally:
        for p in (be, mc):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert rows[0][1]["applied"] >= 1  # PARTIES acted on the real node
    head = (
        f"{'controller':<12} {'ticks':>5} {'valid':>5} {'QoS met':>8} {'p99/target':>10} {'BE thr':>7} "
        f"{'applied':>7} {'safe':>5} {'ctl p50 ms':>10} {'ctl p99 ms':>10} {'cpu p99 ms':>10} {'loop %core':>10} "
        f"{'proc %core':>10}"
    )

    def f(x, spec=".3f"):
        return "n/a" if x is None else format(x, spec)

    lines = [
        f"real run on {os.uname().nodename}: memcached {rate} rps (target {target_us:g} us) + stress-ng --cpu 2, "
        f"{duration_s} s each",
        head,
        "-" * len(head),
    ]
    for ctl, s in rows:
        lines.append(
            f"{ctl[:12]:<12} {s['ticks']:>5} {s['valid_ticks']:>5} {f(s['qos_guarantee'], '.1%'):>8} "
            f"{f(s['mean_tardiness']):>10} {f(s['be_throughput']):>7} {s['applied']:>7} {s['safe_mode_ticks']:>5} "
            f"{f(s['control_ms_p50'], '.2f'):>10} {f(s['control_ms_p99'], '.2f'):>10} "
            f"{f(s['control_cpu_ms_p99'], '.2f'):>10} "
            f"{f(s['loop_cpu_pct'], '.2f'):>10} {f(s['process_cpu_pct'], '.2f'):>10}"
        )
    text = "\n".join(lines)
    (tmp_path / "comparison.txt").write_text(text + "\n")
    print("\n" + text)
