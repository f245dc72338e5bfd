"""Output directories and worker pools of the evaluation protocols (harness.compare, harness.maxload).

Every protocol writes into a temporary directory beside `--out` and moves it into place at the end,
so a failed or interrupted run leaves no partial directory; an existing non-empty `--out` is refused
unless `overwrite`. Runs are independent and go to a pool of spawned worker processes; results do
not depend on the number of workers because each run is seeded by its own identity.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from env.config import ConfigError, plain_data


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an `--out` that is a file, or a non-empty directory without `overwrite` (`ConfigError`)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out}: exists and is not empty; pass --overwrite to replace it")


@contextmanager
def staged_output(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out`, on any failure it
    is removed (with any parent directories this created), so nothing partial is left behind."""
    check_out(out, overwrite)
    created: list[Path] = []
    p = out.parent.resolve()
    while not p.exists():
        created.append(p)
        p = p.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        raise
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def safe_name(name: str) -> str:
    """`name` as a file name: every run of other characters than letters, digits, `_.-` becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON; NaN and infinities are refused (`plain_data` turns them into null)."""
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def write_config(path: Path, data: dict) -> None:
    """Write the resolved config of a run as YAML (DESIGN §6.6), dataclasses as plain data."""
    path.write_text(yaml.safe_dump(plain_data(data), sort_keys=False))


# ======================================================================================================
# Parallel map
# ======================================================================================================
def pmap(fn: Callable[[Any], Any], items: Sequence[Any], workers: int, desc: str) -> list[Any]:
    """`[fn(x) for x in items]` in order, on `workers` processes (spawned: no state leaks from the
    parent) with a progress bar. Results do not depend on `workers`."""
    from tqdm import tqdm

    bar = tqdm(total=len(items), desc=desc, unit="run", disable=None, leave=False)
    try:
        if workers <= 1 or len(items) <= 1:
            out = []
            for x in items:
                out.append(fn(x))
                bar.update(1)
            return out
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(workers, len(items))) as pool:
            out = []
            for r in pool.imap(fn, items):
                out.append(r)
                bar.update(1)
            return out
    finally:
        bar.close()
