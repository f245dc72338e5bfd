"""Output files and worker pools of the evaluation protocols (harness.compare, harness.maxload,
harness.calibrate, harness.bench).

Every protocol checks and stages its `--out` with `env.outdir` (checked before the run starts,
moved into place only when it succeeds). Runs are independent and go to a pool of spawned worker
processes, terminated when the run is interrupted; results do not depend on the number of workers
because each run is seeded by its own identity.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from env.config import plain_data


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
    parent) with a progress bar. Results do not depend on `workers`. Any exception or interruption
    (Ctrl-C, SIGTERM) terminates the workers before it propagates, so none keeps writing after the
    run has stopped."""
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
