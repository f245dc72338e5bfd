"""Scaling out: train.py joins an existing Ray cluster through --ray-address.

The test starts a local head with `ray start --head --block` on a free port in a private temp dir,
runs `train.py ... --ray-address 127.0.0.1:PORT` for one iteration with one remote env runner,
and stops the head. It stops only what it started: SIGTERM to its own `ray start --block` process,
which shuts down the processes of that node (a plain `ray stop` would kill every Ray session of
the user on this machine, e.g. a test session's). Skipped, with the reason, when the head cannot
start here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "iterations=1",
    "model.hidden_units=32",
    "env.sampler.duration_s=[10, 20]",
    "ppo.train_batch_size=128",
    "ppo.minibatch_size=64",
    "ppo.num_epochs=1",
    "resources.num_envs_per_env_runner=2",
    "eval.enabled=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """(address, temp dir) of a one-node Ray cluster started for this test."""
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="rayc-", dir="/tmp"))  # short: Ray puts unix sockets in it
    log = (tmp / "head.log").open("w")
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={tmp}",
        "--block",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (tmp / "head.log").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "head.log").read_text()[-800:]
                pytest.skip(f"`ray start --head` did not come up here (exit {proc.poll()}): {tail}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", tmp
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def train_through(address: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`train.py --config ppo-single --out OUT --ray-address ADDRESS ARGS...`, run to its end."""
    cmd = [sys.executable, "train.py", "--config", "ppo-single", "--out", str(out), "--ray-address", address]
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.ray
@pytest.mark.slow
def test_train_runs_one_iteration_through_a_ray_cluster_address(ray_head, tmp_path):
    address, ray_tmp = ray_head
    out = tmp_path / "run"
    done = train_through(address, out, "--num-env-runners", "1", *[a for o in TINY for a in ("--set", o)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "iter 1/1" in done.stdout
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["ray_address"] == address and run_info["resources"]["num_env_runners"] == 1
    assert (out / "policy.pt").is_file() and (out / "checkpoints" / "iter_000001").is_dir()
    # the job ran on that cluster: its env runner is a worker of the head started above
    logs = list(ray_tmp.glob("session_*/logs/worker-*"))
    assert logs, "no worker of the test cluster ran the job"
    assert any(
        "SingleAgentEnvRunner" in p.read_text(errors="replace") for p in logs if p.suffix in (".out", ".err")
    )


def test_an_unreachable_cluster_address_exits_2(tmp_path):
    out = tmp_path / "run"
    done = train_through(f"127.0.0.1:{free_port()}", out, "--set", "iterations=1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "nothing answers there" in done.stderr and not out.exists()
