"""Running processes, from /proc: what `serve.py` moves into an app's cgroup (`linux.processes`).

A process is found by its pid file or by its exact command line, never by its name alone:
`/proc/PID/comm` is chosen by the process itself, so any user can start a process called
`memcached` and have the node move it into memcached's cgroup (and its allocation). A pid file is
trusted only when no other user can write it (owned by root or by this user, not group- or
world-writable). A command line can still be copied by another user of the machine; where that
matters, use a pid file written by the service manager, or point the app at its cgroup in the
node config (`cgroup:`). Either way, every descendant of a matched process is taken too (a
server's workers).
"""

from __future__ import annotations

import os
from pathlib import Path

from hw.runner import HwInputError


def find_processes(
    *, pidfile: str | None = None, cmdline: str | None = None, proc_root: str | Path = "/proc"
) -> list[int]:
    """Pids of the process named by `pidfile`, or of every process whose command line is exactly
    `cmdline` (arguments joined by single spaces, as `ps -o args` shows them), with all their
    descendants; [] when none runs. `HwInputError` for a pid file others can write or that holds
    no pid."""
    if (pidfile is None) == (cmdline is None):
        raise ValueError("give exactly one of pidfile and cmdline")
    table = _process_table(Path(proc_root))
    if pidfile is not None:
        pid = _pid_from_file(Path(pidfile))
        found = {pid} if pid in table else set()
    else:
        found = {p for p, (_, args) in table.items() if args == cmdline and p != os.getpid()}
    return _with_descendants(found, table)


def _pid_from_file(path: Path) -> int | None:
    try:
        st = path.stat()
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise HwInputError(f"pid file {path}: cannot read it ({e})") from None
    if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
        raise HwInputError(
            f"pid file {path}: other users can write it (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}), "
            "so anyone could point it at their process; use one only root (or this user) can write"
        )
    try:
        return int(text.strip())
    except ValueError:
        raise HwInputError(f"pid file {path}: does not hold a pid ({text.strip()[:40]!r})") from None


def _process_table(root: Path) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process under `root` (a /proc)."""
    table: dict[int, tuple[int, str]] = {}
    for d in root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            args = (d / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        table[int(d.name)] = (parent, " ".join(a.decode(errors="replace") for a in args))
    return table


def _with_descendants(found: set[int], table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    out, todo = set(found), list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return sorted(out)
