"""Write-ahead journal of the state `LinuxNode` found, so that it can always be put back.

Before the first write to any knob (a cgroup file, a resctrl schemata, a cpufreq limit, a tc root
qdisc, a Docker container's limits) the actuator records how to restore the original value, and
the record is on disk (flushed and fsynced) before the write happens. `close()` replays the
journal in reverse order and deletes it. If the controller dies (crash, `kill -9`), the journal
stays; the next `LinuxNode` start replays it before doing anything else (`Journal.open` returns
the pending entries), so a node is never left throttled by a dead controller.

The file is JSON lines, append-only: a crash can only tear the last line, and a torn line is an
entry whose write never happened (the record precedes the write), so it is skipped. An exclusive
`flock` keeps two live controllers off the same journal; the kernel drops it when a process dies.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw.runner import HwError, Sysfs, TargetGone

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


class Journal:
    """The on-disk journal at `path` (one per managed node)."""

    def __init__(self, path: str | Path, fs: Sysfs | None = None) -> None:
        self.path = Path(path)
        self.fs = fs or Sysfs()
        self._entries: list[JournalEntry] = []
        self._keys: set[tuple[str, str]] = set()
        self._fd: int | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def open(self) -> list[JournalEntry]:
        """Lock the journal and return the entries a previous, unfinished run left (oldest first)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
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
        self._entries = self._load()
        self._keys = {(e.kind, e.key) for e in self._entries}
        return list(self._entries)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def entries(self) -> tuple[JournalEntry, ...]:
        return tuple(self._entries)

    def _load(self) -> list[JournalEntry]:
        out = []
        with open(self.path) as f:
            for i, line in enumerate(f):
                line = line.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line)
                    out.append(JournalEntry(d["kind"], d["key"], d.get("data", {})))
                except (ValueError, KeyError, TypeError):
                    log.warning("journal %s: skipping torn or unreadable line %d", self.path, i + 1)
        return out

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
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            for e in entries:
                f.write(e.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._fd is not None:
            # keep the lock on the new inode
            os.close(self._fd)
            self._fd = None
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
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
