"""Output directories of the command-line tools, checked before any work and written all at once.

A tool checks its `--out` before it starts (`check_out`: not a file, not a non-empty directory
without `overwrite`, and somewhere a directory can be created: not under a file, not on a read-only
file system or in /proc), writes into a temporary directory beside `--out` and moves it into place
at the end (`staged_output`), so a failed or interrupted run (Ctrl-C, SIGTERM: `env.config.run_cli`)
leaves no partial directory and deletes nothing it did not create; `overwrite` replaces a previous
`--out` only when the run succeeds, and never the working directory, one of its parents or the home
directory (`refuse_to_replace`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from env.config import ConfigError


def check_out(out: Path, overwrite: bool) -> None:
    """`ConfigError` unless `out` can become this run's output directory (module docstring)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"--out {out}: exists and is not empty; pass --overwrite to replace it")
        refuse_to_replace(out)
    check_creatable(out)


def refuse_to_replace(out: Path) -> None:
    """`ConfigError` when replacing `out` would delete the working directory, one of its parents or
    the home directory (an `--out .` or `--out ~` with `--overwrite` is a slip, not a request)."""
    target = out.resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if target in (home, cwd) or target in cwd.parents:
        raise ConfigError(
            f"--out {out}: replacing it would delete {'your home directory' if target == home else 'the directory you are in'}; "
            "choose a new directory for the output"
        )


def check_creatable(out: Path) -> None:
    """`ConfigError` unless a directory can be created beside `out` (tried, then removed): its nearest
    existing parent must be a writable directory (not a file, a read-only file system or /proc)."""
    parent = Path(os.path.abspath(out)).parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: {parent} is a file, not a directory")
    try:
        Path(tempfile.mkdtemp(prefix=".coloc-probe-", dir=parent)).rmdir()
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create a directory in {parent} ({e.strerror})") from None


@contextmanager
def staged_output(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out`, on any failure or
    interruption it is removed (with any parent directories this created), so nothing partial is
    left behind. Enter it before the work starts: it checks `out` first (`check_out`)."""
    check_out(out, overwrite)
    created: list[Path] = []
    p = out.parent.resolve()
    while not p.exists():
        created.append(p)
        p = p.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        _remove_empty(created)
        raise ConfigError(f"--out {out}: cannot create it ({e.strerror})") from None
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _remove_empty(dirs: list[Path]) -> None:
    """Remove the directories this run created (innermost first), stopping at one that is not empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break
