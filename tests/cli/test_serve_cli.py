"""serve.py: a rehearsal on a SimNode, a dry run, bad input (exit 2, nothing written to the node),
and SIGTERM / kill -9 of a real serve.py process managing a LinuxNode over a fake kernel tree
(tests/fakes.py; plain files, so no root needed): the tree must be back as it was. The command line
itself runs as a subprocess; the rest goes through `harness.serving.deploy.main(ServeOptions)`,
which is all serve.py calls."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from env.loop import read_jsonl
from harness.serving import deploy
from hw.procs import find_processes
from hw.runner import HwInputError
from tests import fakes

ROOT = Path(__file__).resolve().parents[2]

PY = sys.executable


# ---- helpers --------------------------------------------------------------------------------------
def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sim_config(tmp_path: Path, **over) -> Path:
    data = {
        "name": "t",
        "sim": {"scenario": "mix3-const", "speed": 0.0},
        "output": {"dir": str(tmp_path / "runs"), "tensorboard": True},
        "metrics": {"port": 0},
    }
    data.update(over)
    return write_yaml(tmp_path / "serve.yaml", data)


def fake_linux(tmp_path: Path, knobs=("core", "mem"), apps=None, **node_over):
    """A fake v1 host and serve + node configs managing it (quota-mode cores, memory limits, a file
    latency feed). Returns (host, serve config path, feed file, journal path)."""
    host = fakes.make_v1_host(tmp_path / "host")
    feed = tmp_path / "feed.jsonl"
    feed.touch()
    journal = tmp_path / "state" / "journal.jsonl"
    node = {
        "name": "fake",
        "interval_s": 0.5,
        "knobs": list(knobs),
        "cgroup_root": str(host.cgroup_root),
        "proc_root": str(host.proc_root),
        "cpu_root": str(host.cpu_root),
        "sys_root": str(tmp_path / "host"),
        "state_path": str(journal),
        "cores": {"mode": "quota", "quota_step_cores": 0.5},
        "memory": {"total_gb": 8.0},
        "cache": {"resctrl_root": str(host.resctrl_root)},
        "feed": {"url": f"file:{feed}", "stale_intervals": 2},
        "apps": apps
        or [
            {"name": "mc", "kind": "lc", "qos_target_us": 500.0, "max_load_rps": 10000.0, "cgroup": "mc"},
            {"name": "be", "kind": "be", "cgroup": "be"},
        ],
    }
    node.update(node_over)
    node_path = write_yaml(tmp_path / "node.yaml", node)
    serve_path = write_yaml(
        tmp_path / "serve.yaml",
        {
            "name": "fake",
            "linux": {"config": str(node_path)},
            "output": {"dir": str(tmp_path / "runs"), "tensorboard": False},
            "metrics": {"port": 0},
        },
    )
    return host, serve_path, feed, journal


def snapshot(host) -> dict[str, str]:
    return {str(p): p.read_text() for p in host.base.rglob("*") if p.is_file()}


def changed_files(host, before: dict[str, str]) -> set[str]:
    now = snapshot(host)
    return {p for p in set(before) | set(now) if before.get(p) != now.get(p)}


class Publisher:
    """Writes a latency reading for `app` to a file feed every 0.1 s (a load generator stand-in)."""

    def __init__(self, path: Path, app: str = "mc", p99_us: float = 300.0) -> None:
        self.path, self.app, self.p99_us = path, app, p99_us
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from hw.feed import FilePublisher

        pub = FilePublisher(self.path)
        while not self._stop.is_set():
            pub.publish(self.app, self.p99_us, 5000.0, requests=500)
            self._stop.wait(0.1)
        pub.close()

    def __enter__(self) -> Publisher:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def wait_for(pred, timeout_s: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def jsonl_lines(runs: Path) -> int:
    files = list(runs.glob("*/decisions.jsonl"))
    return sum(1 for f in files for line in f.read_text().splitlines() if line.strip())


def start_serve(args: list[str], tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, str(ROOT / "serve.py"), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def serve(config: Path, controller: str = "parties", **options) -> int:
    """What `serve.py --config CONFIG --controller SPEC ...` runs (`options`: ServeOptions' fields)."""
    return deploy.main(deploy.ServeOptions(config=str(config), controller=controller, **options))


def saved_policy(path: Path, max_apps: int, guards=None) -> Path:
    import torch

    from agents.policy import ColocNet, NetSpec, PolicyMeta, export_policy, feature_layout
    from env.features import FeatureConfig

    torch.manual_seed(0)
    spec = NetSpec("single", max_apps, 16)
    meta = PolicyMeta(spec, FeatureConfig(), feature_layout(), "ppo", guards=guards)
    return export_policy(path, ColocNet(spec), meta)


# ---- a rehearsal on the simulator ------------------------------------------------------------------------
def test_sim_rehearsal_writes_the_resolved_config_decision_log_and_summary(tmp_path):
    cfg = sim_config(tmp_path)
    out = tmp_path / "run"
    r = subprocess.run(
        [
            PY,
            str(ROOT / "serve.py"),
            "--config",
            str(cfg),
            "--sim",
            "--controller",
            "parties",
            "--duration-s",
            "3",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    printed = r.stdout
    assert "metrics: http://127.0.0.1:" in printed and "t=    3.0s #6" in printed and "QoS met in" in printed
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert (
        resolved["controller"] == "parties"
        and resolved["fallback"] is None
        and resolved["node_kind"] == "sim"
    )
    assert resolved["serve"]["guards"]["emergency"]["trigger_ticks"] == 2  # the serving chain, resolved
    assert resolved["serve"]["duration_s"] == 3.0 and resolved["node"]["scenario"]["name"] == "mix3-const"
    assert resolved["command"][:2] == ["serve.py", "--config"]
    records = read_jsonl(out / "decisions.jsonl")
    assert [r.time_s for r in records] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ticks"] == 6 and summary["exit_reason"] == "duration" and summary["applied"] >= 1
    assert (out / "serve.log").read_text() and any((out / "tb").iterdir())


def test_learned_controllers_run_under_the_parties_fallback(tmp_path, capsys):
    policy = saved_policy(tmp_path / "policy.pt", max_apps=6)
    cfg = sim_config(tmp_path)
    out = tmp_path / "run"
    rc = serve(cfg, f"rl:{policy}", sim=True, duration_s=1.0, out=str(out), quiet=True)
    assert rc == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["fallback"] == "parties"
    assert json.loads((out / "summary.json").read_text())["fallback"] == "parties"
    assert "trained under" not in capsys.readouterr().out  # no guard chain recorded: nothing to say


def test_a_policy_trained_under_another_guard_chain_is_served_with_a_warning(tmp_path, capsys, caplog):
    from env.guards import CooldownConfig, GuardsConfig

    trained = GuardsConfig(cooldown=CooldownConfig(after_violation_s=3.0))  # clamp and cooldown only
    policy = saved_policy(tmp_path / "policy.pt", max_apps=6, guards=trained)
    cfg = sim_config(tmp_path)  # the serving chain: every guard
    rc = serve(cfg, f"rl:{policy}", sim=True, duration_s=1.0, out=str(tmp_path / "run"), quiet=True)
    assert rc == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "trained under" in x]
    assert lines == [
        "warning: the policy was trained under the guard chain [clamp,cooldown] and is served under "
        "[clamp,lc_floor,rate_limit,cooldown,emergency] (they differ in: lc_floor,rate_limit,cooldown,"
        "emergency); it may behave differently (set env.guards in training, or guards: here)"
    ]
    assert any(r.levelname == "WARNING" and "trained under" in r.getMessage() for r in caplog.records)
    # the chain it was trained under: nothing to say
    same = saved_policy(tmp_path / "same.pt", max_apps=6, guards=GuardsConfig.serving())
    rc = serve(cfg, f"rl:{same}", sim=True, duration_s=1.0, out=str(tmp_path / "run2"), quiet=True)
    assert rc == 0 and "trained under" not in capsys.readouterr().out


# ---- the command line ---------------------------------------------------------------------------------------
def test_help_lists_the_controller_specs_and_an_unknown_spec_exits_2(tmp_path):
    r = subprocess.run([PY, str(ROOT / "serve.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--dry-run" in r.stdout and "rl:PATH" in r.stdout, r.stderr
    cfg = sim_config(tmp_path)
    r = subprocess.run(
        [PY, str(ROOT / "serve.py"), "--config", str(cfg), "--sim", "--controller", "nope"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "serve.py: error: unknown controller 'nope'" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


# ---- bad input: exit 2, a clear message, nothing written ----------------------------------------------------
@pytest.mark.parametrize(
    ("over", "options", "needle"),
    [
        ({"bogus": 1}, {}, r"bogus: unknown key"),
        ({"fallback": {"windw_s": 3}}, {}, r"fallback.windw_s: unknown key \(did you mean 'window_s'\?\)"),
        ({}, {"controller": "partis"}, r"unknown controller 'partis' \(did you mean 'parties'\?\)"),
        ({}, {"controller": "rl"}, r"unknown controller|needs an argument"),
        (
            {"fallback": {"controller": "nope", "applies_to": "always"}},
            {},
            r"fallback.controller: unknown controller",
        ),
        ({"sim": None}, {}, r"no `sim` section"),
        ({}, {"interval_ms": 250.0}, r"simulates 500 ms intervals"),
        ({}, {"scenario": "no-such-scenario"}, r"unknown scenarios 'no-such-scenario'"),
        ({"seed": -3}, {}, r"seed: -3 must be >= 0"),
        ({"sim": {"scenario": "mix3-const", "seed": -3}}, {}, r"sim.seed: -3 must be >= 0"),
    ],
)
def test_bad_input_exits_2_with_a_message_and_creates_nothing(tmp_path, capsys, over, options, needle):
    cfg = sim_config(tmp_path, **over)
    rc = serve(cfg, **{"controller": "parties", "sim": True, "duration_s": 1.0, **options})
    err = capsys.readouterr().err
    assert rc == 2, err
    assert re.search(needle, err), err
    assert not (tmp_path / "runs").exists()


def test_missing_corrupt_or_mismatched_checkpoint_exits_2(tmp_path, capsys):
    cfg = sim_config(tmp_path)
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"not a torch file")
    small = saved_policy(tmp_path / "small.pt", max_apps=1)  # mix3-const runs 3 LC apps
    for spec, needle in (
        (f"rl:{tmp_path / 'missing'}", "no trained policy here"),
        (f"rl:{bad}", "not a readable policy file"),
        (f"rl:{small}", "trained for at most max_apps=1"),
    ):
        rc = serve(cfg, spec, sim=True, duration_s=1.0)
        err = capsys.readouterr().err
        assert rc == 2 and needle in err, err
    assert not (tmp_path / "runs").exists()


def test_bad_checkpoint_on_a_linux_node_writes_nothing_to_it(tmp_path, capsys):
    host, cfg, _, journal = fake_linux(tmp_path)
    before = snapshot(host)
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"\x00" * 64)
    rc = serve(cfg, f"rl:{bad}", duration_s=1.0)
    assert rc == 2 and "not a readable policy file" in capsys.readouterr().err
    assert changed_files(host, before) == set() and not (tmp_path / "runs").exists()
    assert not journal.exists() or journal.read_text() == ""


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("capability", "mount -t resctrl"),
        ("cgroup", "cgroup 'nope' of 'be' does not exist"),
        ("dry-run-create", "--dry-run makes no writes, but this node changes the machine at start"),
        ("no-linux", "no `linux` node section"),
    ],
)
def test_bad_node_input_exits_2_and_writes_nothing(tmp_path, capsys, kind, needle):
    options = {}
    if kind == "capability":  # the config asks for CAT; this host has no resctrl mounted
        host, cfg, _, _ = fake_linux(
            tmp_path, knobs=("core", "mem", "cache"), cache={"resctrl_root": str(tmp_path / "none")}
        )
    elif kind == "cgroup":
        apps = [
            {"name": "mc", "kind": "lc", "qos_target_us": 500.0, "max_load_rps": 1e4, "cgroup": "mc"},
            {"name": "be", "kind": "be", "cgroup": "nope"},
        ]
        host, cfg, _, _ = fake_linux(tmp_path, apps=apps)
    elif kind == "dry-run-create":
        apps = [
            {"name": "mc", "kind": "lc", "qos_target_us": 500.0, "max_load_rps": 1e4, "cgroup": "mc"},
            {"name": "be", "kind": "be", "cgroup": "coloc/be", "create": True},
        ]
        host, cfg, _, _ = fake_linux(tmp_path, apps=apps)
        options = {"dry_run": True}
    else:
        host, _, _, _ = fake_linux(tmp_path)
        cfg = sim_config(tmp_path)
    before = snapshot(host)
    rc = serve(cfg, "parties", duration_s=1.0, **options)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err, err
    assert changed_files(host, before) == set() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("damage", ["garbage", "foreign"])
def test_a_damaged_or_foreign_journal_exits_2_and_replays_nothing(tmp_path, capsys, damage):
    from hw.state import JournalEntry

    host, cfg, _, journal = fake_linux(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    journal.parent.mkdir(parents=True)
    quota = host.cgroup_root / "cpu" / "mc" / "cpu.cfs_quota_us"
    mine = JournalEntry("file", str(quota), {"path": str(quota), "values": ["12345"]}).to_json()
    foreign = JournalEntry("file", str(victim), {"path": str(victim), "values": ["owned"]}).to_json()
    journal.write_text(f"{mine}\n{'{garbage' if damage == 'garbage' else foreign}\n")
    before = snapshot(host)
    rc = serve(cfg, "parties", duration_s=1.0)
    err = capsys.readouterr().err
    assert rc == 2 and "Nothing was replayed" in err and f"mv {journal}" in err, err
    assert changed_files(host, before) == set() and victim.read_text() == "mine"
    assert not (tmp_path / "runs").exists()


def test_a_node_that_cannot_be_restored_exits_1_naming_the_knob(tmp_path, capsys, monkeypatch):
    from hw.runner import KnobError
    from hw.state import Journal

    _, cfg, feed, journal = fake_linux(tmp_path)
    real = Journal._restore_file

    def stuck_memory(self, e):
        if e.data["path"].endswith("memory.limit_in_bytes"):
            raise KnobError(f"cannot write {e.data['path']}: EACCES: permission denied")
        real(self, e)

    monkeypatch.setattr(Journal, "_restore_file", stuck_memory)
    with Publisher(feed):
        rc = serve(cfg, "parties", duration_s=1.0, quiet=True)
    err = capsys.readouterr().err
    assert rc == 1 and "the node is NOT fully restored" in err and "memory.limit_in_bytes" in err, err
    assert "memory.limit_in_bytes" in journal.read_text()  # kept for the next start


def test_a_run_directory_that_cannot_be_created_exits_2(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    rc = serve(sim_config(tmp_path), "parties", sim=True, duration_s=1.0, out=str(afile / "run"))
    assert rc == 2 and "cannot create it" in capsys.readouterr().err and afile.read_text() == "mine"
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(bytes(range(256)))
    assert serve(blob, "parties", sim=True) == 2 and "not a text file" in capsys.readouterr().err


# ---- dry run ----------------------------------------------------------------------------------------------
def test_dry_run_logs_the_writes_it_would_make_and_makes_none(tmp_path, capsys):
    host, cfg, feed, journal = fake_linux(tmp_path)
    before = snapshot(host)
    out = tmp_path / "dry"
    with Publisher(feed, p99_us=100.0):  # lots of slack: PARTIES wants to downsize mc
        rc = serve(cfg, "parties", dry_run=True, duration_s=2.5, out=str(out), quiet=True)
    assert rc == 0
    assert changed_files(host, before) == set()  # not one byte written to the node
    lines = [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines()]
    writes = [e["message"] for x in lines for e in x["serving"]["events"] if e["kind"] == "dry_run"]
    pattern = re.compile(r"would write: (mc|be)\.\w+ [\d.]+->[\d.]+(, (mc|be)\.\w+ [\d.]+->[\d.]+)*")
    assert writes and all(pattern.fullmatch(w) for w in writes), writes
    assert all(x["serving"]["dry_run"] for x in lines)
    assert json.loads((out / "summary.json").read_text())["would_apply"] == len(writes)
    assert not journal.exists() or journal.read_text() == ""


# ---- SIGTERM and kill -9 of a real serve.py process -------------------------------------------------------
def test_sigterm_finishes_the_tick_restores_the_node_and_exits_0(tmp_path):
    host, cfg, feed, journal = fake_linux(tmp_path)
    before = snapshot(host)
    with Publisher(feed):
        p = start_serve(["--config", str(cfg), "--controller", "parties", "--quiet"], tmp_path)
        try:
            wait_for(lambda: jsonl_lines(tmp_path / "runs") >= 3 or p.poll() is not None, what="3 ticks")
            assert p.poll() is None, p.communicate()
            assert changed_files(host, before)  # serving: the node is being managed
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err
    assert {f for f in changed_files(host, before) if not f.startswith(str(host.base / "state"))} == set()
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_reason"] == "signal SIGTERM" and summary["ticks"] >= 3
    assert jsonl_lines(tmp_path / "runs") == summary["ticks"]  # every tick finished and logged
    assert journal.read_text() == ""  # nothing left to restore


def test_kill_9_then_the_next_start_restores_the_node_before_anything_else(tmp_path):
    host, cfg, feed, journal = fake_linux(tmp_path)
    before = snapshot(host)
    with Publisher(feed):
        p = start_serve(["--config", str(cfg), "--controller", "parties", "--quiet"], tmp_path)
        try:
            wait_for(lambda: jsonl_lines(tmp_path / "runs") >= 3 or p.poll() is not None, what="3 ticks")
            assert p.poll() is None, p.communicate()
        finally:
            p.kill()  # SIGKILL: no handler runs, nothing is restored
            p.wait()
    left = {f for f in changed_files(host, before) if str(journal) != f}
    assert left and journal.read_text().strip()  # throttled by a dead controller; the journal knows
    # the next start fails on bad input (a PARTIES config that does not exist, found after the node
    # started) - and still puts the node back first
    r = subprocess.run(
        [
            PY,
            str(ROOT / "serve.py"),
            "--config",
            str(cfg),
            "--controller",
            "parties:/no/such.yaml",
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no such file" in r.stderr, r.stderr
    assert "restored the node from" in r.stdout and "a previous run did not finish" in r.stdout
    assert {f for f in changed_files(host, before) if f != str(journal)} == set()
    assert journal.read_text() == ""


# ---- --bench ----------------------------------------------------------------------------------------------
def test_bench_reports_the_overhead_of_each_controller(tmp_path, capsys):
    cfg = sim_config(tmp_path)
    rc = serve(cfg, "parties,static", sim=True, bench=True, ticks=15, out=str(tmp_path / "b"))
    assert rc == 0
    out = capsys.readouterr().out
    assert (
        "sim mix3-const parties" in out
        and "sim mix3-const static" in out
        and "decide + guards + apply" in out
    )
    results = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert [r["ticks"] for r in results] == [15, 15] and results[0]["lc_apps"] == 3


def test_bench_on_a_linux_node_restores_it(tmp_path, capsys):
    host, cfg, _, _ = fake_linux(tmp_path)
    before = snapshot(host)
    rc = serve(cfg, "parties", bench=True, ticks=10)
    assert rc == 0 and "linux fake parties" in capsys.readouterr().out
    assert {f for f in changed_files(host, before) if "/state/" not in f} == set()


def test_a_dry_run_bench_on_a_linux_node_writes_nothing(tmp_path, capsys, monkeypatch):
    from hw.linux_node import LinuxNode

    host, cfg, _, _ = fake_linux(tmp_path)
    before = snapshot(host)
    writes = []
    real_apply = LinuxNode.apply

    def apply(self, allocation):
        writes.append(allocation)
        return real_apply(self, allocation)

    monkeypatch.setattr(LinuxNode, "apply", apply)
    rc = serve(cfg, "parties", bench=True, dry_run=True, ticks=60, pace_ms=0.0, out=str(tmp_path / "b"))
    assert rc == 0 and "linux fake parties (dry run)" in capsys.readouterr().out
    assert writes == [] and changed_files(host, before) == set()
    (r,) = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert r["ticks"] == 60 and r["applied"] == 0


def test_processes_are_found_by_command_line_or_pid_file_with_their_children_never_by_name(tmp_path):
    import shutil

    shell = tmp_path / "coloctstsh"  # a process name (comm) nothing else on the machine has
    shutil.copy("/bin/sh", shell)
    script = "sleep 30 & sleep 30 & wait"
    parent = subprocess.Popen([str(shell), "-c", script])
    impostor = subprocess.Popen([str(shell), "-c", "sleep 30"])  # same name, another command line
    pids: list[int] = []
    try:
        wait_for(
            lambda: len(find_processes(cmdline=f"{shell} -c {script}")) >= 3, timeout_s=20, what="children"
        )
        pids = find_processes(cmdline=f"{shell} -c {script}")
        assert pids[0] == parent.pid and len(pids) == 3 and impostor.pid not in pids
        assert all(Path(f"/proc/{p}/comm").read_text().strip() == "sleep" for p in pids[1:])
        pidfile = tmp_path / "app.pid"
        pidfile.write_text(f"{parent.pid}\n")
        assert find_processes(pidfile=str(pidfile)) == pids
        pidfile.chmod(0o666)  # anyone could point it at their own process
        with pytest.raises(HwInputError, match="other users can write it"):
            find_processes(pidfile=str(pidfile))
        assert find_processes(cmdline="no-such-command --at all") == []
        assert find_processes(pidfile=str(tmp_path / "missing.pid")) == []
    finally:
        for pid in pids[1:]:  # the children this test started, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in (parent, impostor):
            p.kill()
            p.wait()


def test_a_metrics_port_in_use_exits_2_before_the_first_write(tmp_path, capsys):
    import socket

    host, cfg, _, _ = fake_linux(tmp_path)
    before = snapshot(host)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = serve(cfg, "parties", metrics_port=port)
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in err, err
    assert changed_files(host, before) == set() and not (tmp_path / "runs").exists()
