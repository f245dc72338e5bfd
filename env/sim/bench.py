"""Simulator speed, measured on one core (timing goals live here, never in tests).

Writes `DIR/bench.json` with

* `sim_steps_per_s`: one 3-app node (memcached, xapian, nginx + the BE job) through the Python
  API: `SimNode.step()` = one interval of physics plus the `Observation` it returns, as the Gym
  env steps it (no latency histograms). Goal >= 20,000.
* `sim_steps_with_histograms_per_s`: the same with each app's latency histogram drawn, as
  evaluation runs it (`env.sim.engine.interval_histogram`), for transparency.
* `sim_batched_app_steps_per_s`: the batched simulator (`SimBatch.step` with its shared generator:
  arrival and p99 sampling plus the kernel) over `--batch` 3-app nodes, counted in LC
  app-intervals per second. Goal >= 1,000,000.
* `fleet_node_steps_per_s`: the batched mode as the vector env uses it (`SimFleet.step`, which also
  builds one `Observation` per node), for transparency.

Each figure is the median of `--repeats` timed runs after a warm-up (numba compilation excluded).
The process pins itself to one CPU where the OS allows it.

The layers above the simulator add their own benchmarks beside these (the serving loop's overhead).
"""

from __future__ import annotations

import os
import platform as _platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from env.sim.node import SimFleet, SimNode
from env.sim.scenario import simple_scenario
from env.sim.traces import MAX_HORIZON_S

GOALS = {"sim_steps_per_s": 20_000, "sim_batched_app_steps_per_s": 1_000_000}
MIX = {"memcached": 0.5, "xapian": 0.5, "nginx": 0.5}


def _rate(fn: Callable[[], object], n: int, repeats: int) -> float:
    fn()  # warm-up (compilation, caches)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def run(repeats: int = 5, batch: int = 4096) -> dict:
    """Measure the simulator's speed (module docstring: the figures and their goals), pinned to one CPU
    where allowed; the dict becomes `bench.json`."""
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = True
    except (AttributeError, OSError):
        pinned = False
    scn = simple_scenario(MIX, duration_s=MAX_HORIZON_S, warmup_s=0)  # the longest scenario: never ends here
    node = SimNode(scn, seed=0, histograms=False)
    steps = _rate(node.step, 2000, repeats)
    hist_node = SimNode(scn, seed=0)
    hist_steps = _rate(hist_node.step, 1000, repeats)

    fleet_small = SimFleet([scn] * 64, seed=0, histograms=False)
    fleet_rate = _rate(lambda: fleet_small.step(), 20, repeats) * 64

    # the batched simulator for large batches: one shared generator, one kernel call per interval
    fleet = SimFleet([scn] * batch, seed=1, histograms=False)
    sim = fleet.batch
    sim.rngs = None  # per-node streams are for small batches (exact agreement with SimNode)
    for nd in fleet.nodes:
        nd._prepare()  # offered loads into the shared batch, as SimFleet.step does
    n_lc = int(sim._lc.sum())
    batched = _rate(lambda: sim.step(empty_u=0.99), 10, repeats) * n_lc
    return {
        "sim_steps_per_s": round(steps),
        "sim_steps_with_histograms_per_s": round(hist_steps),
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
