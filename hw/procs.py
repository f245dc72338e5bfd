"""Processes by name, from /proc: what `serve.py` moves into an app's cgroup (`linux.processes`).

A name matches `/proc/PID/comm` exactly; the match takes every descendant of a matched process too
(a server's workers). `comm` is chosen by the process itself, so a name is only as trustworthy as
the machine's users: name cgroups, containers or pid files where that matters.
"""

from __future__ import annotations

import os
from pathlib import Path


def find_processes(name: str, proc_root: str | Path = "/proc") -> list[int]:
    """Pids of the processes called `name` (/proc/PID/comm) and of all their descendants."""
    root = Path(proc_root)
    comm: dict[int, str] = {}
    parent: dict[int, int] = {}
    for d in root.iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        try:
            comm[pid] = (d / "comm").read_text().strip()
            stat = (d / "stat").read_text()
            parent[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found = {p for p, c in comm.items() if c == name and p != os.getpid()}
    children: dict[int, list[int]] = {}
    for p, pp in parent.items():
        children.setdefault(pp, []).append(p)
    out, todo = set(found), list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return sorted(out)
