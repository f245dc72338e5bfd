"""Write-ahead journal of the state `LinuxNode` found, so that it can always be put back.

Before the first write to any knob (a cgroup file, a resctrl schemata, a cpufreq limit, a tc root
qdisc, a Docker container's limits) the actuator records how to restore the original value, and
the record is on disk (flushed and fsynced) before the write happens. `close()` replays the
journal in reverse order and deletes it. If the controller dies (crash, `kill -9`), the journal
stays; the next `LinuxNode` start replays it before doing anything else (`Journal.open` returns
the pending entries), so a node is never left throttled by a dead controller.

The file is JSON lines, append-only: a crash can only tear the last line, and a torn last line
(no newline) is an entry whose write never happened (the record precedes the write), so it is
skipped. Any other line that is not an entry means the journal is damaged: `JournalError`, which
says what to do, and nothing is replayed. An exclusive `flock` keeps two live controllers off the
same journal; the kernel drops it when a process dies.

Replaying a journal writes to the paths it names, as root, so a journal names only what its node
may touch (`JournalScope`): knob files of the kinds the actuators write (`KNOB_FILES`), under the
node's cgroup roots, resctrl and cpufreq directories; directories below those roots; the node's tc
device; containers only when the node manages containers. `Journal.open` checks every entry before
anything is replayed, and an entry outside the scope (a journal written for another config, or
edited) is a `JournalError`. The journal is created 0600 and stays so: it is opened without
following a symlink, and rewritten through a unique temporary file (mode 0600) renamed over it.

Entry kinds restored here: `file` (write the recorded values back, in order), `mkdir` (remove a
directory we created), `procs` (move a process back to the cgroups it came from). Other kinds
(`tc_root`, `docker`) are restored by handlers the actuators provide (`hw.tc`, `hw.containers`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw.runner import HwError, HwInputError, Sysfs, TargetGone

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JournalEntry:
    """How to restore one thing. `key` identifies it within `kind` (a path, a container id...)."""

    kind: str
    key: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "key": self.key, "data": dict(self.data)}, sort_keys=True)


@dataclass(frozen=True)
class RestoreReport:
    """The outcome of replaying the journal: entries restored, skipped (their target is gone) and the
    messages of those that failed (they stay in the journal for the next start)."""

    restored: int
    skipped: int  # the thing no longer exists: nothing to restore
    failed: tuple[str, ...]  # messages; the failed entries stay in the journal

    @property
    def ok(self) -> bool:
        return not self.failed


Handler = Callable[[JournalEntry], None]


class JournalBusy(HwError):
    """Another live controller holds this journal."""


class JournalError(HwInputError):
    """The journal is damaged, or names something outside its node (module docstring): nothing was
    replayed; the message says what to do."""


# the files the actuators journal (hw.cgroups, hw.resctrl, hw.cpufreq): the only ones a replay writes
KNOB_FILES = frozenset(
    {
        "cpuset.cpus",
        "cpuset.mems",
        "cgroup.subtree_control",
        "cpu.max",
        "cpu.cfs_quota_us",
        "cpu.cfs_period_us",
        "memory.max",
        "memory.high",
        "memory.limit_in_bytes",
        "memory.memsw.limit_in_bytes",
        "io.max",
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
        "freezer.state",
        "cgroup.freeze",
        "net_cls.classid",
        "schemata",
        "scaling_governor",
        "scaling_setspeed",
        "scaling_min_freq",
        "scaling_max_freq",
    }
)
PROCS_FILES = frozenset({"cgroup.procs"})


@dataclass(frozen=True)
class JournalScope:
    """What one node's journal may name (module docstring): `roots` are its cgroup hierarchy root,
    resctrl and cpufreq directories, `net_devices` its tc (device, netns), `containers` whether it
    manages Docker containers."""

    roots: tuple[str, ...]
    net_devices: tuple[tuple[str, str | None], ...] = ()
    containers: bool = False

    def check(self, e: JournalEntry) -> None:
        """`ValueError` saying why `e` is outside this node."""
        d = e.data
        if e.kind == "file":
            self._path(d.get("path", e.key), KNOB_FILES)
            if not isinstance(d.get("values"), list) or not all(isinstance(v, str) for v in d["values"]):
                raise ValueError("its values are not a list of strings")
        elif e.kind == "mkdir":
            self._path(e.key, None)
        elif e.kind == "procs":
            if (
                not isinstance(d.get("pid"), int)
                or d["pid"] < 1
                or not isinstance(d.get("procs_files"), list)
            ):
                raise ValueError("not a process and its cgroup.procs files")
            for f in d["procs_files"]:
                self._path(f, PROCS_FILES)
        elif e.kind == "tc_root":
            if (d.get("dev"), d.get("netns")) not in self.net_devices:
                raise ValueError(
                    f"tc device {d.get('dev')!r} is not this node's ({self.net_devices or 'none'})"
                )
        elif e.kind == "docker":
            if not self.containers:
                raise ValueError("this node manages no containers")
            if d.get("memory_file"):
                self._path(d["memory_file"], KNOB_FILES)
        else:
            raise ValueError(f"unknown kind {e.kind!r}")

    def _path(self, path: Any, names: frozenset[str] | None) -> None:
        if not isinstance(path, str) or not os.path.isabs(path) or os.path.normpath(path) != path:
            raise ValueError(f"{path!r} is not a plain absolute path")
        if names is not None and os.path.basename(path) not in names:
            raise ValueError(f"{path} is not a knob file the node writes")
        real = os.path.realpath(path)  # a symlink below a root may not lead out of it
        if any(real.startswith(os.path.realpath(root).rstrip("/") + "/") for root in self.roots):
            return
        raise ValueError(f"{path} is not under this node's {', '.join(self.roots)}")


class Journal:
    """The on-disk journal at `path` (one per managed node)."""

    def __init__(self, path: str | Path, fs: Sysfs | None = None, scope: JournalScope | None = None) -> None:
        self.path = Path(path)
        self.fs = fs or Sysfs()
        self.scope = scope  # None: any entry (unit tests of the journal itself)
        self._entries: list[JournalEntry] = []
        self._keys: set[tuple[str, str]] = set()
        self._fd: int | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def open(self) -> list[JournalEntry]:
        """Lock the journal and return the entries a previous, unfinished run left (oldest first);
        `JournalError` when it is damaged or names something outside `scope` (nothing replayed)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = self._open_fd(os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise JournalBusy(
                    f"journal {self.path} is held by another running controller; stop it first"
                ) from None
            raise
        self._fd = fd
        try:
            self._entries = self._load(fd)
        except JournalError:
            self.close()
            raise
        self._keys = {(e.kind, e.key) for e in self._entries}
        return list(self._entries)

    def _open_fd(self, create: int) -> int:
        """The journal opened for appending, never through a symlink, a regular file of mode 0600."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | create, 0o600)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise JournalError(
                    f"journal {self.path} is a symlink; a journal is a plain file (remove the link)"
                ) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise JournalError(f"journal {self.path} is not a regular file")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        return fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def entries(self) -> tuple[JournalEntry, ...]:
        return tuple(self._entries)

    def _load(self, fd: int) -> list[JournalEntry]:
        data = b""
        while chunk := os.pread(fd, 1 << 20, len(data)):
            data += chunk
        lines = data.split(b"\n")
        out = []
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                d = json.loads(raw)
                if not (isinstance(d["kind"], str) and isinstance(d["key"], str)):
                    raise TypeError("kind and key must be strings")
                entry = JournalEntry(d["kind"], d["key"], d.get("data", {}))
                if not isinstance(entry.data, dict):
                    raise TypeError("data must be a mapping")
            except (ValueError, KeyError, TypeError) as e:
                if i == len(lines) - 1:  # no newline after it: an append a crash cut short
                    log.warning("journal %s: skipping the torn last line %d", self.path, i + 1)
                    continue
                raise self._damaged(i + 1, f"not a journal entry ({type(e).__name__}: {e})") from None
            if self.scope is not None:
                try:
                    self.scope.check(entry)
                except ValueError as e:
                    raise self._damaged(i + 1, f"{entry.kind} entry outside this node: {e}") from None
            out.append(entry)
        return out

    def _damaged(self, line: int, why: str) -> JournalError:
        return JournalError(
            f"journal {self.path} line {line}: {why}. Nothing was replayed: a journal this node did not "
            "write (another config, or an edited or damaged file) is not trusted to write to the machine. "
            "Check the knobs it lists by hand (cgroups, resctrl, cpufreq, tc; `cat` it), restore what is "
            f"yours, then move it away (mv {self.path} {self.path}.bad) and start again"
        )

    # ---- recording ---------------------------------------------------------------------------------
    def recorded(self, kind: str, key: str) -> bool:
        return (kind, key) in self._keys

    def record(self, entry: JournalEntry) -> None:
        """Append `entry` durably, unless (kind, key) is already recorded: the first record holds
        the *original* state and must never be overwritten by a later one."""
        if self._fd is None:
            raise RuntimeError("journal is not open")
        if (entry.kind, entry.key) in self._keys:
            return
        os.write(self._fd, (entry.to_json() + "\n").encode())
        os.fsync(self._fd)
        self._entries.append(entry)
        self._keys.add((entry.kind, entry.key))

    def record_file(self, path: Path, values: list[str], key: str | None = None) -> None:
        """Restore `path` by writing `values` in order (unless `key`, default the path, is recorded)."""
        self.record(JournalEntry("file", key or str(path), {"path": str(path), "values": list(values)}))

    # ---- restoring ----------------------------------------------------------------------------------
    def restore(self, handlers: Mapping[str, Handler] | None = None) -> RestoreReport:
        """Replay every entry, newest first. Entries that fail stay in the journal for a later
        try; on full success the journal is emptied."""
        table: dict[str, Handler] = {
            "file": self._restore_file,
            "mkdir": self._restore_mkdir,
            "procs": self._restore_procs,
        }
        table.update(handlers or {})
        restored = skipped = 0
        failed: list[str] = []
        keep: list[JournalEntry] = []
        for e in reversed(self._entries):
            h = table.get(e.kind)
            if h is None:
                failed.append(f"{e.kind} {e.key}: no restore handler for this kind")
                keep.append(e)
                continue
            try:
                h(e)
                restored += 1
            except TargetGone as err:
                log.info("restore %s %s: gone, nothing to restore (%s)", e.kind, e.key, err)
                skipped += 1
            except Exception as err:  # restore everything else even when one fails
                log.error("restore %s %s failed: %s", e.kind, e.key, err)
                failed.append(f"{e.kind} {e.key}: {err}")
                keep.append(e)
        keep.reverse()
        self._rewrite(keep)
        return RestoreReport(restored, skipped, tuple(failed))

    def _rewrite(self, entries: list[JournalEntry]) -> None:
        """Replace the journal by `entries` through a unique temporary file (0600, O_EXCL: never a
        file someone else prepared) renamed over it; the lock moves to the new file."""
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                for e in entries:
                    f.write(e.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self._fd is not None:
            # keep the lock on the new inode
            os.close(self._fd)
            self._fd = None
            fd = self._open_fd(0)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fd = fd
        self._entries = list(entries)
        self._keys = {(e.kind, e.key) for e in entries}

    def _restore_file(self, e: JournalEntry) -> None:
        path = Path(e.data.get("path", e.key))
        if not self.fs.exists(path):
            raise TargetGone(f"{path} no longer exists", path, errno.ENOENT)
        for v in e.data.get("values", []):
            self.fs.write(path, v)

    def _restore_mkdir(self, e: JournalEntry) -> None:
        path = Path(e.key)
        if not self.fs.exists(path):
            raise TargetGone(f"{path} no longer exists", path, errno.ENOENT)
        self.fs.rmdir(path)

    def _restore_procs(self, e: JournalEntry) -> None:
        pid = int(e.data["pid"])
        moved = 0
        for procs in e.data.get("procs_files", []):
            try:
                self.fs.write(Path(procs), f"{pid}\n")
                moved += 1
            except TargetGone:
                continue
        if not moved:
            raise TargetGone(f"process {pid} or its original cgroups are gone", Path(e.key), errno.ESRCH)
