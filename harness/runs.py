"""One evaluation run: a controller on a `SimNode` for one scenario and seed (DESIGN §5).

Every run is one `env.loop.run_episode` of a controller (a spec of `harness.registry`) with the
run's guard chain (clamp only unless said otherwise, `env.guards`); every number comes from
`env.metrics`. Every controller starts from PARTIES' fair allocation (the node's initial state).
Seeds: run i of a scenario uses seed `scenario.seed + i` for the node; the controller's generator
is `default_rng([seed, 1])`. Inputs are validated here before any output is created.

The node reports the p99 of every 100 ms sub-interval beside each interval's p99 (`SimNode`
`sub_interval_s`; the sampling period of PARTIES' own code, which `parties:code` reads); they come
from a generator of their own, so no other controller's run changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from env import metrics as M
from env.config import load_yaml, resolve_config
from env.controller import Controller, ControllerContext
from env.guards import GuardsConfig, build_guards
from env.loop import TickRecord, run_episode
from env.sim.node import SimNode
from env.sim.profiles import LcProfile, known_profiles, load_profile
from env.sim.scenario import Scenario, load_scenario
from harness.registry import make_controller


@dataclass(frozen=True)
class RunJob:
    """One controller on one scenario with one seed (picklable: it crosses to worker processes)."""

    controller: str
    scenario: Scenario
    seed: int
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    jsonl: str | None = None  # write every tick here
    duration_s: float | None = None  # default: the scenario's
    stop_when_unsustained: bool = False  # max-load search: stop once the verdict is known
    warmup_s: float = M.WARMUP_S
    measure_s: float = M.MEASURE_S
    verdict: str = "window"  # env.metrics.VERDICTS: the sustained rule


SUB_INTERVAL_S = 0.1  # PARTIES' code samples latency every 100 ms (manager/PARTIES.py INTERVAL)


def sub_interval_s(scenario: Scenario) -> float | None:
    """`SUB_INTERVAL_S` when it divides the scenario's node interval evenly, else None (no sub-intervals)."""
    n = scenario.platform_spec.interval_s / SUB_INTERVAL_S
    return SUB_INTERVAL_S if n >= 1 and abs(n - round(n)) < 1e-9 else None


def controller_rng(seed: int) -> np.random.Generator:
    """The controller's generator in a run seeded `seed` (the node's seed is `seed` itself)."""
    return np.random.default_rng([seed, 1])


def build_run(job: RunJob) -> tuple[SimNode, Controller]:
    """The run's node and its controller (not yet reset: `run_episode` resets it)."""
    node = SimNode(job.scenario, seed=job.seed, sub_interval_s=sub_interval_s(job.scenario))
    ctx = ControllerContext(node.capabilities(), job.scenario, node, job.seed)
    return node, make_controller(job.controller, ctx)


def execute(job: RunJob) -> list[TickRecord]:
    """Run the job; the records (also written to `job.jsonl` line by line when set)."""
    return execute_with_stats(job)[0]


def execute_with_stats(job: RunJob) -> tuple[list[TickRecord], dict[str, Any]]:
    """`execute`, plus what the controller reports about the run (`BaseController.run_stats`)."""
    node, ctrl = build_run(job)
    duration = job.duration_s if job.duration_s is not None else job.scenario.duration_s
    stop = (
        M.unsustained_stop(job.warmup_s, job.measure_s, verdict=job.verdict)
        if job.stop_when_unsustained
        else None
    )
    with open(job.jsonl, "w") if job.jsonl else nullcontext() as f:
        recs = run_episode(
            node,
            ctrl,
            duration,
            guards=build_guards(job.guards),
            rng=controller_rng(job.seed),
            on_tick=None if f is None else (lambda rec: f.write(rec.to_json() + "\n")),
            stop_when=stop,
        )
    report = getattr(ctrl, "run_stats", None)  # optional: not part of the Controller protocol
    return recs, (report() if callable(report) else {})


def run_summary(job: RunJob) -> dict[str, Any]:
    """Worker of compare/timeline: run and summarise (the compare row plus details)."""
    recs, stats = execute_with_stats(job)
    s = M.summarize(recs, job.scenario.warmup_s, verdict=job.verdict)
    row: dict[str, Any] = {"controller": job.controller, "seed": job.seed, **s.row()}
    if stats:
        row["controller_stats"] = M.json_safe(stats)
    row["invalid_intervals"] = s.invalid_intervals
    row["qos_guarantee_per_app"] = M.json_safe(s.qos_guarantee_per_app)
    row["window_per_app"] = s.window_per_app()
    row["window_note"] = s.window.note
    row["mean_allocation"] = M.json_safe(s.mean_allocation)
    return row


# ======================================================================================================
# Input validation (everything before any output is created)
# ======================================================================================================
def lc_app_names() -> list[str]:
    """The shipped LC app profiles (configs/apps/), batch jobs left out."""
    return [p for p in known_profiles() if isinstance(load_profile(p), LcProfile)]


def load_scenario_arg(text: str) -> tuple[Scenario, str]:
    """The scenario of a `--scenario` argument (a name in configs/scenarios/ or a path) and its file."""
    path = resolve_config("scenarios", text)
    return load_scenario(path), str(path)


def load_guards_arg(path: str | None) -> GuardsConfig:
    """The guard chain of a `--guards FILE` argument; clamp only without one (evaluation, env.guards)."""
    if path is None:
        return GuardsConfig()
    return GuardsConfig.from_dict(load_yaml(path), Path(path).name)


def probe(scenario: Scenario, specs: Sequence[str], seed: int) -> None:
    """Build the node (which reads trace files) and every controller once, so that bad input
    fails here with a clear message and not in a worker after the output dir exists."""
    node = SimNode(scenario, seed=seed)
    caps = node.capabilities()
    for s in specs:
        make_controller(s, ControllerContext(caps, scenario, node, seed)).reset(caps, controller_rng(seed))
