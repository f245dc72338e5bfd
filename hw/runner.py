"""The two ways `hw/` touches the outside world: tool calls and kernel files (DESIGN §6.4).

* `Runner` runs an external tool (`tc`, `ldd`, ...) with an argument list and a timeout, never
  through a shell, and turns every failure (missing binary, non-zero exit, time-out) into a
  `CommandError` that names the command and quotes its stderr.
* `Sysfs` reads and writes kernel files (cgroupfs, resctrl, cpufreq) and creates/removes their
  directories. Every `OSError` becomes a `KnobError` naming the file and the errno in words, or a
  `TargetGone` when the file's directory disappeared (a cgroup or container that vanished). Tests
  inject a subclass that raises `EBUSY`, `EACCES`, `ENOSPC`, ... on chosen paths.

Every `hw` class takes its root path (and a `Sysfs`, and a `Runner` where it calls tools) as
arguments, so the unit tests run the real code on fake trees.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class HwError(RuntimeError):
    """A kernel interface or tool failed at run time (the caller degrades safely)."""


class KnobError(HwError):
    """Reading or writing one kernel file failed; `errno` says why (EBUSY, EACCES, ENOSPC, ...)."""

    def __init__(self, message: str, path: Path | None = None, err: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = err


class TargetGone(KnobError):
    """The cgroup, resctrl group or process behind a file no longer exists (ENOENT/ESRCH)."""


class CommandError(HwError):
    """An external tool failed, timed out or is not installed."""

    def __init__(self, message: str, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


class HwInputError(ValueError):
    """Bad input to an actuator (unknown device, knob value outside its range): nothing was written."""


_ERRNO_HINTS = {
    errno.EBUSY: "busy (a cpuset still in use by tasks or another exclusive cpuset, or a group with tasks)",
    errno.EACCES: "permission denied (run as root, or delegate the cgroup to this user)",
    errno.EPERM: "operation not permitted (run as root)",
    errno.ENOSPC: "no space (cpuset without cpus/mems, or no free resctrl CLOS left)",
    errno.EINVAL: "invalid value for this knob",
    errno.ENOENT: "no such file (the group vanished, or the controller is not enabled)",
    errno.ESRCH: "no such process",
    errno.ENODEV: "no such device",
}


def describe_errno(err: int | None) -> str:
    """An errno in words for error messages: its name and what it usually means for a kernel knob
    (e.g. EBUSY on a cpuset: still in use by tasks)."""
    if err is None:
        return "unknown error"
    name = errno.errorcode.get(err, str(err))
    return f"{name}: {_ERRNO_HINTS.get(err, os.strerror(err))}"


class Sysfs:
    """Reads and writes kernel files; one instance is shared by every actuator of a node.

    Writes are single `write()` calls of the whole value (the kernel parses each write on its own),
    so a value is either applied or rejected with an errno.
    """

    def read(self, path: Path) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            raise self._error("read", path, e) from None

    def write(self, path: Path, value: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except OSError as e:
            raise self._error("open for writing", path, e) from None
        try:
            os.write(fd, value.encode())
        except OSError as e:
            raise self._error(f"write {value.strip()!r} to", path, e) from None
        finally:
            os.close(fd)

    def exists(self, path: Path) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: Path) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError as e:
            raise self._error("list", path, e) from None

    def mkdir(self, path: Path) -> None:
        try:
            os.mkdir(path)
        except OSError as e:
            raise self._error("create directory", path, e) from None

    def rmdir(self, path: Path) -> None:
        try:
            os.rmdir(path)
        except OSError as e:
            raise self._error("remove directory", path, e) from None

    @staticmethod
    def _error(what: str, path: Path, e: OSError) -> KnobError:
        msg = f"cannot {what} {path}: {describe_errno(e.errno)}"
        if e.errno in (errno.ENOENT, errno.ESRCH, errno.ENODEV):
            return TargetGone(msg, Path(path), e.errno)
        return KnobError(msg, Path(path), e.errno)


@dataclass(frozen=True)
class RunResult:
    """A finished tool call: its argument list, exit status and decoded output."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner:
    """Runs external tools: argument lists only (never `shell=True`), always with a timeout."""

    def __init__(self, timeout_s: float = 10.0, env: Mapping[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self._env = dict(env) if env is not None else None

    def which(self, tool: str) -> str | None:
        return shutil.which(tool)

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout_s: float | None = None,
        input_text: str | None = None,
    ) -> RunResult:
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise ValueError("empty command")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            p = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=limit,
                input=input_text,
                env=self._env,
                check=False,
            )
        except FileNotFoundError:
            raise CommandError(f"{argv[0]!r} is not installed (not on PATH)", argv, None, "") from None
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise CommandError(f"{' '.join(argv)} timed out after {limit} s", argv, None, err) from None
        result = RunResult(argv, p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise CommandError(
                f"{' '.join(argv)} failed (exit {p.returncode}): {p.stderr.strip() or p.stdout.strip()}",
                argv,
                p.returncode,
                p.stderr,
            )
        log.debug("ran %s -> %d", argv, p.returncode)
        return result
