"""Docker containers: lookup errors, the rootfs tarball, and (with an engine) a LinuxNode managing
memcached containers through the SDK, values read back from their cgroups."""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path

import pytest

from hw.containers import Docker, DockerUnavailable, build_memcached_image, connect, rootfs_tarball
from hw.runner import HwInputError


class _Containers:
    def __init__(self, items):
        self.items = items

    def get(self, name):
        import docker

        for c in self.items:
            if c.name == name:
                return c
        raise docker.errors.NotFound(f"No such container: {name}")

    def list(self, filters=None):
        want = (filters or {}).get("label")
        return [c for c in self.items if want is None or want in [f"{k}={v}" for k, v in c.labels.items()]]


class _C:
    def __init__(self, name, labels):
        self.id, self.name, self.labels, self.status = uuid.uuid4().hex, name, labels, "running"
        self.attrs = {"State": {"Pid": 4242}, "HostConfig": {}}


class _Client:
    def __init__(self, items):
        self.containers = _Containers(items)


def test_find_by_name_and_label_and_errors_name_what_runs():
    d = Docker(
        _Client(
            [
                _C("mc1", {"coloc.role": "lc"}),
                _C("be1", {"coloc.role": "be"}),
                _C("be2", {"coloc.role": "be"}),
            ]
        )
    )
    assert d.find(name="mc1").pid == 4242
    assert d.find(label="coloc.role=lc").name == "mc1"
    with pytest.raises(
        HwInputError, match=r"container 'nope' does not exist; running: \['be1', 'be2', 'mc1'\]"
    ):
        d.find(name="nope")
    with pytest.raises(HwInputError, match=r"2 running containers carry label 'coloc.role=be'"):
        d.find(label="coloc.role=be")
    with pytest.raises(HwInputError, match="exactly one"):
        d.find()


def test_rootfs_tarball_holds_binary_libraries_and_passwd(tmp_path):
    tar = rootfs_tarball(tmp_path / "r.tar", "/bin/true")
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert "bin/true" in names and "etc/passwd" in names
    assert any("libc.so" in n for n in names) and any("ld-linux" in n for n in names)
    with pytest.raises(HwInputError, match="not an executable"):
        rootfs_tarball(tmp_path / "x.tar", str(tmp_path / "missing"))


def test_no_engine_says_what_to_start():
    with pytest.raises(DockerUnavailable, match="start dockerd"):
        connect("unix:///nonexistent/docker.sock", timeout_s=2)


def _engine():
    try:
        return connect(timeout_s=5)
    except DockerUnavailable:
        return None


@pytest.mark.docker
@pytest.mark.skipif(not Path("/usr/bin/memcached").exists(), reason="needs Debian's memcached binary")
def test_linux_node_manages_memcached_containers(tmp_path, clock, feed):
    client = _engine()
    if client is None:
        pytest.skip("no Docker engine answers")
    from hw.config import AppTarget, CoresConfig, LinuxNodeConfig, MemoryConfig
    from hw.linux_node import LinuxNode

    tag = build_memcached_image(client)
    tok = uuid.uuid4().hex[:8]
    kw = dict(detach=True, cpu_period=100_000, cpu_quota=100_000, network_mode="none")
    lc = client.containers.run(tag, ["-m", "64", "-t", "2"], name=f"coloc_mc_{tok}", **kw)
    be = client.containers.run(tag, ["-m", "64"], name=f"coloc_be_{tok}", labels={"coloc.test": tok}, **kw)
    try:
        cfg = LinuxNodeConfig(
            name="docker",
            apps=(
                AppTarget("mc", "lc", qos_target_us=600.0, max_load_rps=1e4, container=lc.name),
                AppTarget("be", "be", label=f"coloc.test={tok}"),
            ),
            knobs=("core", "mem"),
            state_path=str(tmp_path / "j.jsonl"),
            cores=CoresConfig(mode="quota", quota_step_cores=0.25),
            memory=MemoryConfig(total_gb=2.0, step_gb=0.25, min_gb=0.25),
        )
        node = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, docker_client=client)
        try:
            node.reset()
            a = node.current_allocation().replace_app("mc", cores=1.25, memory_gb=0.5)
            got = node.apply(a.replace_app("be", cores=0.75, memory_gb=0.5))
            assert got["mc"].cores == 1.25 and got["be"].cores == 0.75 and got["mc"].memory_gb == 0.5
            cpu = Path(node.target_ref("mc").dir("cpu"))
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "125000"
            mem = Path(node.target_ref("mc").dir("memory"))
            assert int((mem / "memory.limit_in_bytes").read_text()) == 512 << 20
            lc.reload()
            assert lc.attrs["HostConfig"]["CpuQuota"] == 125000  # docker's own view agrees
            got = node.apply(got.replace_app("be", cores=0.0))
            be.reload()
            assert got["be"].cores == 0.0 and be.status == "paused"
        finally:
            node.close()
        lc.reload()
        be.reload()
        assert be.status == "running"
        assert lc.attrs["HostConfig"]["CpuQuota"] == 100_000
        assert int((mem / "memory.limit_in_bytes").read_text()) > 1 << 40  # unlimited again
    finally:
        for c in (lc, be):
            c.remove(force=True)
