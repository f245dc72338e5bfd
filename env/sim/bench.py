"""`evaluate.py bench`: simulator speed, measured on one core (timing goals live here, never in tests).

Writes `DIR/bench.json` with

* `sim_steps_per_s`: one 3-app node (memcached, xapian, nginx + the BE job) through the Python
  API: `SimNode.step()` = one interval of physics plus the `Observation` it returns. Goal >= 20,000.
* `sim_batched_app_steps_per_s`: the batched simulator (`SimBatch.step` with its shared generator:
  arrival and p99 sampling plus the kernel) over `--batch` 3-app nodes, counted in LC
  app-intervals per second. Goal >= 1,000,000.
* `fleet_node_steps_per_s`: the batched mode as the vector env uses it (`SimFleet.step`, which also
  builds one `Observation` per node), for transparency.

Each figure is the median of `--repeats` timed runs after a warm-up (numba compilation excluded).
The process pins itself to one CPU where the OS allows it.

The CLI may add benchmarks defined outside the simulator (`add_cli(..., extra=...)`): `evaluate.py`
adds the serving loop's overhead (decide + guards + apply per tick on a 6-app node, and the loop's
share of a core; goals <= 5 ms p99 and <= 2%), measured by `env.serving.bench_sim`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from env.sim.node import SimFleet, SimNode
from env.sim.scenario import simple_scenario

GOALS = {"sim_steps_per_s": 20_000, "sim_batched_app_steps_per_s": 1_000_000}
MIX = {"memcached": 0.5, "xapian": 0.5, "nginx": 0.5}


def _rate(fn: Callable[[], None], n: int, repeats: int) -> float:
    fn()  # warm-up (compilation, caches)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def run(repeats: int = 5, batch: int = 4096) -> dict:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = True
    except (AttributeError, OSError):
        pinned = False
    scn = simple_scenario(MIX, duration_s=1e6, warmup_s=0)
    node = SimNode(scn, seed=0)
    steps = _rate(node.step, 2000, repeats)

    fleet_small = SimFleet([scn] * 64, seed=0)
    fleet_rate = _rate(lambda: fleet_small.step(), 20, repeats) * 64

    # the batched simulator for large batches: one shared generator, one kernel call per interval
    fleet = SimFleet([scn] * batch, seed=1)
    sim = fleet.batch
    sim.rngs = None  # per-node streams are for small batches (exact agreement with SimNode)
    for nd in fleet.nodes:
        nd._prepare()  # offered loads into the shared batch, as SimFleet.step does
    n_lc = int(sim._lc.sum())
    batched = _rate(lambda: sim.step(empty_u=0.99), 10, repeats) * n_lc
    return {
        "sim_steps_per_s": round(steps),
        "sim_batched_app_steps_per_s": round(batched),
        "fleet_node_steps_per_s": round(fleet_rate),
        "batched_nodes": batch,
        "goals": GOALS,
        "goals_met": {
            "sim_steps_per_s": steps >= GOALS["sim_steps_per_s"],
            "sim_batched_app_steps_per_s": batched >= GOALS["sim_batched_app_steps_per_s"],
        },
        "pinned_to_one_cpu": pinned,
        "repeats": repeats,
        "machine": {
            "python": _platform.python_version(),
            "cpu_count": os.cpu_count(),
            "numpy": np.__version__,
        },
    }


def add_cli(
    subparsers: argparse._SubParsersAction, extra: dict[str, Callable[[], object]] | None = None
) -> None:
    """Register `bench`; `extra` maps result keys to benchmarks run after the simulator's."""
    p = subparsers.add_parser(
        "bench",
        help="simulator speed (steps/s) on one core",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (bench.json)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=4096, help="nodes in the batched measurement")
    p.set_defaults(func=lambda args: _cli(args, extra or {}))


def _cli(args: argparse.Namespace, extra: dict[str, Callable[[], object]]) -> int:
    if args.repeats < 1 or args.batch < 1:
        raise SystemExit("bench: --repeats and --batch must be >= 1")
    res = run(args.repeats, args.batch)
    for key, fn in extra.items():
        print(f"running {key} ...", flush=True)
        res[key] = fn()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(res, indent=2))
    for k in ("sim_steps_per_s", "sim_batched_app_steps_per_s", "fleet_node_steps_per_s"):
        goal = GOALS.get(k)
        met = "" if goal is None else (f"  (goal {goal:,}: {'met' if res[k] >= goal else 'NOT met'})")
        print(f"{k:30s} {res[k]:>12,}{met}")
    for key in extra:
        rows = res[key] if isinstance(res[key], list) else [res[key]]
        for r in rows:
            if isinstance(r, dict) and "control_ms" in r:
                print(
                    f"{key}: {r['label']:<24} decide+guards+apply p99 {r['control_ms']['p99']:.2f} ms "
                    f"(CPU time {r['control_cpu_ms']['p99']:.2f} ms; goal <= 5), loop {r['cpu_pct_of_core']:.2f}% of a core (goal <= 2%)"
                )
    print(f"wrote {args.out / 'bench.json'}")
    return 0
