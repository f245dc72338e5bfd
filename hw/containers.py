"""Docker containers as managed apps (Docker SDK 7.2), and the minimal memcached image for tests.

`Docker` finds a container by name or by label, resolves its main PID (and from it, with
`hw.cgroups`, its cgroup directories), pauses and unpauses BE containers (PARTIES squeezes a BE job
to zero cores; Heracles disables BE jobs), and updates CPU and memory limits through the engine's
own API (`container.update`), so that `docker inspect` stays true; the node reads every value back
from the cgroup files. Before its first change to a container, the container's original limits and
paused state are journalled (`docker` entry; restored by `restore_handler`).

Plain processes and cgroups we create need none of this: `hw.cgroups` handles them directly.

`build_memcached_image` makes an image without a registry: a root filesystem tarball holding
Debian's memcached binary, the shared libraries `ldd` lists for it and a passwd file, fed to
`docker import`.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw.runner import HwError, HwInputError, Runner, TargetGone
from hw.state import Journal, JournalEntry

log = logging.getLogger(__name__)

MEMCACHED_IMAGE = "coloc-memcached:test"


class DockerUnavailable(HwError):
    """No Docker engine answers (or the SDK is missing)."""


@dataclass(frozen=True)
class ContainerInfo:
    """What the Docker engine says about one container: id, name, main PID (0 when not running),
    status and labels."""

    id: str
    name: str
    pid: int  # main process (0 when not running)
    status: str  # running, paused, exited, ...
    labels: Mapping[str, str] = field(default_factory=dict)


def connect(base_url: str | None = None, timeout_s: float = 10.0) -> Any:
    """A Docker SDK client that answered a ping; `DockerUnavailable` otherwise (says what to start)."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker is a declared dependency
        raise DockerUnavailable(f"the docker SDK is not installed: {e}") from None
    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=int(timeout_s))
            if base_url
            else docker.from_env(timeout=int(timeout_s))
        )
        client.ping()
        return client
    except Exception as e:
        raise DockerUnavailable(
            f"no Docker engine answers at {base_url or 'the default socket'} ({e}); install docker.io and "
            "start dockerd"
        ) from None


class Docker:
    """Container lookup, pause/unpause and limit updates through one SDK client."""

    def __init__(self, client: Any, journal: Journal | None = None) -> None:
        self.client = client
        self.journal = journal

    # ---- lookup -----------------------------------------------------------------------------------
    def find(self, name: str | None = None, label: str | None = None) -> ContainerInfo:
        """The one container called `name`, or carrying label `label` ('key=value' or 'key').
        Raises `HwInputError` naming what is running when there is none or several."""
        import docker

        if (name is None) == (label is None):
            raise HwInputError("give exactly one of a container name or a label")
        if name is not None:
            try:
                c = self.client.containers.get(name)
            except docker.errors.NotFound:
                raise HwInputError(f"container {name!r} does not exist; running: {self._names()}") from None
            return self._info(c)
        found = self.client.containers.list(filters={"label": label})
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise HwInputError(
                f"{what} running containers carry label {label!r} (need exactly one): "
                f"{[c.name for c in found] or self._names()}"
            )
        return self._info(found[0])

    def _names(self) -> list[str]:
        return sorted(c.name for c in self.client.containers.list())

    def _get(self, cid: str) -> Any:
        import docker

        try:
            return self.client.containers.get(cid)
        except docker.errors.NotFound:
            raise TargetGone(f"container {cid[:12]} no longer exists", None, errno.ENOENT) from None

    @staticmethod
    def _info(c: Any) -> ContainerInfo:
        st = c.attrs.get("State", {})
        return ContainerInfo(c.id, c.name, int(st.get("Pid") or 0), c.status, dict(c.labels or {}))

    def info(self, cid: str) -> ContainerInfo:
        return self._info(self._get(cid))

    # ---- journal --------------------------------------------------------------------------------
    def _record(self, c: Any, cpuset_now: str, memory_file: str) -> None:
        if self.journal is None or self.journal.recorded("docker", c.id):
            return
        hc = c.attrs.get("HostConfig", {})
        self.journal.record(
            JournalEntry(
                "docker",
                c.id,
                {
                    "paused": c.status == "paused",
                    "cpu_period": int(hc.get("CpuPeriod") or 0),
                    "cpu_quota": int(hc.get("CpuQuota") or 0),
                    "cpuset_cpus": hc.get("CpusetCpus") or cpuset_now,
                    "memory": int(hc.get("Memory") or 0),
                    "memory_swap": int(hc.get("MemorySwap") or 0),
                    "memory_file": memory_file,
                },
            )
        )

    # ---- actuation -----------------------------------------------------------------------------------
    def set_paused(self, cid: str, paused: bool, cpuset_now: str = "", memory_file: str = "") -> bool:
        """Pause (freeze) or unpause a container; returns the read-back state.

        `cpuset_now` and `memory_file` (the container's cpuset.cpus value and its memory limit
        file) are journalled with the original limits: Docker cannot set "no cpuset" or "no memory
        limit" back through its API, so the restore writes those directly."""
        c = self._get(cid)
        if (c.status == "paused") != paused:
            self._record(c, cpuset_now, memory_file)
            c.pause() if paused else c.unpause()
            c.reload()
        return c.status == "paused"

    def update(
        self,
        cid: str,
        *,
        cpuset_cpus: str | None = None,
        cpu_quota_us: int | None = None,
        cpu_period_us: int | None = None,
        memory_bytes: int | None = None,
        cpuset_now: str = "",
        memory_file: str = "",
    ) -> None:
        """`docker update` of the given limits (None = leave alone). cpu_quota_us -1 = unlimited.
        Swap is set unlimited with every memory change so that it never blocks one (Docker
        rejects a memory limit above the swap limit). Docker cannot remove a memory limit
        (`memory_bytes` must be >= 6 MB); the caller writes the cgroup file for that."""
        c = self._get(cid)
        kw: dict[str, Any] = {}
        if cpuset_cpus is not None:
            kw["cpuset_cpus"] = cpuset_cpus
        if cpu_quota_us is not None:
            kw["cpu_quota"] = cpu_quota_us
            kw["cpu_period"] = cpu_period_us or 100_000
        if memory_bytes is not None:
            if memory_bytes < 6 << 20:
                raise HwInputError(f"docker memory limit {memory_bytes} bytes is below Docker's 6 MB minimum")
            kw["mem_limit"] = memory_bytes
            kw["memswap_limit"] = -1
        if not kw:
            return
        self._record(c, cpuset_now, memory_file)
        import docker

        try:
            c.update(**kw)
        except docker.errors.NotFound:
            raise TargetGone(f"container {cid[:12]} vanished", None, errno.ENOENT) from None
        except docker.errors.APIError as e:
            raise HwError(f"docker update {c.name} {kw} failed: {e.explanation or e}") from None


def restore_handler(client: Any, fs: Any = None):
    """Journal handler for `docker` entries: unpause, original CPU limits and cpuset, original
    memory limit (written to the cgroup file when the original was "none"), original paused state."""
    from hw.runner import Sysfs

    fs = fs or Sysfs()

    def _restore(entry: JournalEntry) -> None:
        import docker

        d = entry.data
        try:
            c = client.containers.get(entry.key)
        except docker.errors.NotFound:
            raise TargetGone(f"container {entry.key[:12]} is gone", None, errno.ENOENT) from None
        if c.status not in ("running", "paused"):
            raise TargetGone(
                f"container {entry.key[:12]} is {c.status}: nothing to restore", None, errno.ESRCH
            )
        if c.status == "paused":
            c.unpause()
        kw: dict[str, Any] = {"cpu_period": d["cpu_period"] or 100_000, "cpu_quota": d["cpu_quota"] or -1}
        if d.get("cpuset_cpus"):
            kw["cpuset_cpus"] = d["cpuset_cpus"]
        if d["memory"]:
            kw["mem_limit"] = d["memory"]
            kw["memswap_limit"] = d["memory_swap"] or -1
        c.update(**kw)
        if not d["memory"] and d.get("memory_file"):
            fs.write(Path(d["memory_file"]), "max" if d["memory_file"].endswith("memory.max") else "-1")
        if d.get("paused"):
            c.pause()

    return _restore


# ---- the test image ----------------------------------------------------------------------------------


def library_paths(binary: str, runner: Runner | None = None) -> list[str]:
    """The shared libraries (and loader) `ldd` lists for `binary`."""
    out = (runner or Runner()).run(["ldd", binary]).stdout
    paths = []
    for line in out.splitlines():
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            paths.append(m.group(1))
    return paths


def rootfs_tarball(dest: Path, binary: str, runner: Runner | None = None) -> Path:
    """Write a minimal root filesystem for `binary` (+ its libraries, /etc/passwd, /tmp) to `dest`."""
    if not os.access(binary, os.X_OK):
        raise HwInputError(f"{binary} is not an executable file (apt-get install memcached)")
    with tarfile.open(dest, "w") as tar:
        for p in [binary, *library_paths(binary, runner)]:
            tar.add(os.path.realpath(p), arcname=p.lstrip("/"))
        for name, text in (
            (
                "etc/passwd",
                "root:x:0:0:root:/root:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            ),
            ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        tmp = tarfile.TarInfo("tmp")
        tmp.type = tarfile.DIRTYPE
        tmp.mode = 0o1777
        tar.addfile(tmp)
    return dest


def build_memcached_image(
    client: Any, tag: str = MEMCACHED_IMAGE, binary: str = "/usr/bin/memcached", runner: Runner | None = None
) -> str:
    """`docker import` a minimal memcached image (no registry needed); reuses an existing one."""
    import docker

    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    repo, _, version = tag.partition(":")
    with tempfile.TemporaryDirectory(prefix="coloc-rootfs-") as tmp:
        tarball = rootfs_tarball(Path(tmp) / "rootfs.tar", binary, runner)
        client.api.import_image_from_file(
            str(tarball),
            repository=repo,
            tag=version or "latest",
            changes=[f'ENTRYPOINT ["{binary}"]', "USER 65534"],
        )
    client.images.get(tag)
    return tag
