"""The serving loop's overhead (`serve.py --bench`, `evaluate.py bench`): the whole stack - supervisor,
guard chain, JSONL and TensorBoard outputs - for N ticks without waiting for the node's interval,
reporting decide + guards + apply per tick and the loop's CPU as a share of one core at the interval.
Goals: <= 5 ms p99 on a 6-app node and <= 2% of a core at 500 ms (timing goals live in benchmarks,
never in timed tests).

`bench_overhead` measures one node and controller; `bench_sim` builds them on a simulated scenario,
`bench_linux` on a LinuxNode fed by a synthetic in-process latency feed, and `run_bench` does a
list of controller specs either way. The controllers are built by an injected factory (the
registry and its checks are the caller's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from env.allocations import fair_allocation
from env.controller import Controller
from env.guards import GuardChain, build_guards
from env.node import Clock, Node, SimClock
from env.sim.scenario import Scenario, load_scenario
from env.types import Allocation, Capabilities, Observation
from harness.serving.config import ServeConfig
from harness.serving.nodes import NodeWrapper, write_errors
from harness.serving.safety import _num
from harness.serving.sinks import JsonlSink, Sink, TensorBoardSink
from harness.serving.supervisor import Supervisor, _pct
from hw.feed import MemoryFeed

if TYPE_CHECKING:
    from hw.linux_node import LinuxNode

CONTROL_P99_GOAL_MS = 5.0
CPU_GOAL_PCT = 2.0


class _HookNode(NodeWrapper):
    """Calls `hook()` before each observe (e.g. a synthetic latency feed for a benchmark)."""

    def __init__(self, inner: Node, hook: Callable[[], None]) -> None:
        super().__init__(inner)
        self.hook = hook

    def observe(self) -> Observation:
        self.hook()
        return self.inner.observe()


def bench_overhead(
    node: Node,
    controller: Controller,
    *,
    ticks: int = 300,
    warmup_ticks: int = 20,
    guards: GuardChain | None = None,
    fallback: Controller | None = None,
    config: ServeConfig | None = None,
    out_dir: str | Path | None = None,
    clock: Clock | None = None,
    before_observe: Callable[[], None] | None = None,
    error_count: Callable[[], int] | None = None,
    label: str = "",
    pace_s: float = 0.0,
    dry_run: bool = False,
    start_allocation: Allocation | None = None,
) -> dict[str, Any]:
    """The serving loop's overhead: `ticks` ticks of the full stack (supervisor, `guards` - build
    the serving chain for a realistic figure - JSONL and TensorBoard to `out_dir` (a temporary
    directory when None), no console) without waiting for the node's interval: back to back, or
    `pace_s` of real time apart (other work runs between ticks, as between real ticks, and caches
    cool down as they do). For a node on a real clock pass `clock` (a clock that does not sleep is
    used by default for anything but a SimClock).

    Returns a JSON-ready dict: per-tick `control_ms` = decide + guards + apply (the tick minus
    observe()), `decide_ms`, `observe_ms`, `sinks_ms` (p50/p99/max), `tick_cpu_ms` (main-thread
    CPU of the whole tick, observe and outputs included) and the loop's share of one core at the
    node's interval, with and without observe() (on a SimNode observe() runs the simulator, which
    is the "hardware", not the loop), and whether the goals (<= 5 ms p99, <= 2% of a core) are met.
    `dry_run` and `start_allocation` are the `Supervisor`'s. The node is closed at the end."""
    cfg = config or ServeConfig()
    cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, enabled=False))
    if clock is None and not isinstance(node.clock, SimClock):
        clock = SimClock()  # speed 0: it never sleeps
        clock.sleep_until(node.clock.now())
    if before_observe is not None:
        node = _HookNode(node, before_observe)
    caps = node.capabilities()
    with contextlib.ExitStack() as stack:
        d = Path(out_dir) if out_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        d.mkdir(parents=True, exist_ok=True)
        sinks: list[Sink] = [JsonlSink(d / "decisions.jsonl"), TensorBoardSink(d / "tb")]
        sup = Supervisor(
            node,
            controller,
            config=cfg,
            guards=guards,
            fallback=fallback,
            clock=clock,
            sinks=sinks,
            error_count=error_count,
            controller_name=label or None,
            dry_run=dry_run,
            start_allocation=start_allocation,
        )
        try:
            sup.manage_gc()
            for _ in range(warmup_ticks):
                sup.tick()
                sup.clock.inner.sleep_until(sup.clock.now() + sup.interval_s)
            st = sup.stats
            rows: list[tuple[float, float, bool]] = []  # control wall ms, control CPU ms, applied
            observe_cpu: list[float] = []
            applied0 = sup.loop.stats.applied
            for _ in range(ticks):
                rec = sup.tick()
                rows.append((rec.serving.control_ms, st.control_cpu_ms[-1], rec.tick.changed))
                observe_cpu.append(st.observe_cpu_ms[-1])
                sup.clock.inner.sleep_until(sup.clock.now() + sup.interval_s)
                if pace_s > 0:
                    time.sleep(pace_s)
            applied = sup.loop.stats.applied - applied0
            n = ticks
            tick_cpu = list(st.tick_cpu_ms)[-n:]
            decide = list(st.decide_ms)[-n:]
            observe = list(st.observe_ms)[-n:]
            sinks_ms = list(st.sinks_ms)[-n:]
            summary = sup.summary()
        finally:
            sup.close()
    interval_ms = caps.interval_s * 1e3

    def stats(xs: Sequence[float]) -> dict[str, float | None]:
        xs = [x for x in xs if math.isfinite(x)]
        return {
            "p50": _num(_pct(xs, 50)),
            "p99": _num(_pct(xs, 99)),
            "max": _num(max(xs) if xs else math.nan),
        }

    mean_cpu = float(np.mean(tick_cpu)) if tick_cpu else math.nan
    mean_obs = float(np.mean(observe_cpu)) if observe_cpu else math.nan
    control = stats([r[0] for r in rows])
    control_cpu = stats([r[1] for r in rows])
    return {
        "label": label or getattr(controller, "name", "controller"),
        "node": caps.node_name,
        "lc_apps": len(caps.lc_apps),
        "be_jobs": len(caps.be_apps),
        "interval_s": caps.interval_s,
        "ticks": ticks,
        "applied": applied,
        "control_ms": control,
        "control_cpu_ms": control_cpu,
        "control_ms_applying_ticks": stats([r[0] for r in rows if r[2]]),
        "control_cpu_ms_applying_ticks": stats([r[1] for r in rows if r[2]]),
        "decide_ms": stats(decide),
        "observe_ms": stats(observe),
        "sinks_ms": stats(sinks_ms),
        "tick_cpu_ms": {"mean": _num(mean_cpu), "p99": _num(_pct(tick_cpu, 99))},
        "cpu_pct_of_core": _num(mean_cpu / interval_ms * 100),
        "cpu_pct_of_core_excl_observe": _num(max(mean_cpu - mean_obs, 0.0) / interval_ms * 100),
        "goals": {"control_p99_ms": CONTROL_P99_GOAL_MS, "cpu_pct_of_core": CPU_GOAL_PCT},
        "meets_control_goal": bool(control["p99"] is not None and control["p99"] <= CONTROL_P99_GOAL_MS),
        "meets_control_goal_cpu_time": bool(
            control_cpu["p99"] is not None and control_cpu["p99"] <= CONTROL_P99_GOAL_MS
        ),
        "safe_mode_ticks": summary.safe_mode_ticks,
        "apply_failures": summary.apply_failures,
    }


def bench_text(results: Sequence[Mapping[str, Any]]) -> str:
    """A table of `bench_overhead` results (ms per tick)."""
    head = (
        f"{'run':<40} {'apps':>4} {'ticks':>5} {'applied':>7} {'ctl p50':>7} {'ctl p99':>7} {'ctl max':>7} "
        f"{'cpu p99':>7} {'appl p99':>8} {'dec p99':>7} {'obs p50':>7} {'out p50':>7} {'%core':>6} {'-obs':>6}"
    )
    lines = [head, "-" * len(head)]

    def f(x: Any, spec: str = ".2f") -> str:
        return "n/a" if x is None else format(x, spec)

    for r in results:
        lines.append(
            f"{r['label'][:40]:<40} {r['lc_apps']:>4} {r['ticks']:>5} {r['applied']:>7} "
            f"{f(r['control_ms']['p50']):>7} {f(r['control_ms']['p99']):>7} {f(r['control_ms']['max']):>7} "
            f"{f(r['control_cpu_ms']['p99']):>7} {f(r['control_ms_applying_ticks']['p99']):>8} "
            f"{f(r['decide_ms']['p99']):>7} {f(r['observe_ms']['p50']):>7} {f(r['sinks_ms']['p50']):>7} "
            f"{f(r['cpu_pct_of_core'], '.3f'):>6} {f(r['cpu_pct_of_core_excl_observe'], '.3f'):>6}"
        )
    lines.append(
        "ctl = decide + guards + apply (wall); cpu = its CPU time; appl = wall on ticks that applied; "
        "obs = observe(); out = JSONL + TensorBoard; %core = the tick's CPU (observe and outputs included) "
        f"per interval, -obs without observe() (on a SimNode that is the simulator). Goals: ctl p99 <= "
        f"{CONTROL_P99_GOAL_MS:g} ms, <= {CPU_GOAL_PCT:g}% of a core."
    )
    return "\n".join(lines)


def bench_sim(
    make_controller: Callable[[Capabilities, Any, Node], Controller],
    *,
    scenario: Scenario | str | Path = "mix6-const",
    ticks: int = 300,
    config: ServeConfig | None = None,
    label: str = "",
    seed: int | None = None,
    pace_s: float = 0.02,
) -> dict[str, Any]:
    """`bench_overhead` on a SimNode of `scenario` (default the 6-app PARTIES mix; `seed` default the
    scenario's) under `config` (default `ServeConfig()`: the serving guard chain);
    `make_controller(caps, scenario, node)` builds the controller."""
    from env.sim.node import SimNode  # the simulator's kernels: only when benchmarked

    scn = load_scenario(scenario) if isinstance(scenario, str | Path) else scenario
    cfg = config or ServeConfig()
    node = SimNode(scn, seed=seed)
    ctl = make_controller(node.capabilities(), scn, node)
    return bench_overhead(
        node,
        ctl,
        ticks=ticks,
        guards=build_guards(cfg.guards),
        config=cfg,
        label=label or f"sim {scn.name} {ctl.name}",
        pace_s=pace_s,
    )


def bench_linux(
    start_node: Callable[[MemoryFeed], LinuxNode],
    make_controller: Callable[[Capabilities, Any, Node | None], Controller],
    *,
    config: ServeConfig,
    ticks: int = 300,
    dry_run: bool = False,
    name: str = "",
    pace_s: float = 0.02,
) -> dict[str, Any]:
    """`bench_overhead` on the LinuxNode `start_node(feed)` starts, fed by an in-process latency feed
    whose synthetic p99 swings between 40% and 160% of each target. It really applies allocations
    (from the node's fair start) unless `dry_run`; the node is restored at the end.
    `make_controller(caps, None, None)` builds the controller (no scenario, no simulator); `name` is
    its name in the result's label (default its own)."""
    feed = MemoryFeed()
    node = start_node(feed)
    try:
        caps = node.capabilities()
        ctl = make_controller(caps, None, None)
        start = fair_allocation(caps) if dry_run else None  # a dry run never resets the node
        if not dry_run:
            node.reset()
        k = 0

        def publish() -> None:
            nonlocal k
            k += 1
            for i, a in enumerate(caps.lc_apps):
                frac = 1.0 + 0.6 * math.sin(k / 6.0 + i)
                feed.publish(a.name, a.qos_target_us * frac, 0.5 * a.max_load_rps, requests=1000)

        return bench_overhead(
            node,
            ctl,
            pace_s=pace_s,
            ticks=ticks,
            guards=build_guards(config.guards),
            config=config,
            before_observe=publish,
            error_count=lambda: write_errors(node.errors),
            label=f"linux {caps.node_name} {name or ctl.name}" + (" (dry run)" if dry_run else ""),
            dry_run=dry_run,
            start_allocation=start,
        )
    finally:
        node.close()


def run_bench(
    specs: Sequence[str],
    make_controller: Callable[[str, Capabilities, Scenario | None, Node | None], Controller],
    *,
    config: ServeConfig,
    scenario: Scenario | None = None,
    start_node: Callable[[MemoryFeed], LinuxNode] | None = None,
    ticks: int = 300,
    dry_run: bool = False,
    pace_s: float = 0.02,
    out: Path | None = None,
) -> list[dict[str, Any]]:
    """`serve.py --bench`: the overhead of each controller spec, on a SimNode of `scenario` or, without
    one, on the LinuxNode `start_node` starts (`bench_linux`). `make_controller(spec, caps,
    scenario, sim node)` builds each controller. Prints the table (`bench_text`) and, with `out`,
    writes out/bench.json."""
    results = []
    for spec in specs:
        build = functools.partial(make_controller, spec)
        if scenario is not None:
            r = bench_sim(
                build,
                scenario=scenario,
                ticks=ticks,
                config=config,
                label=f"sim {scenario.name} {spec}",
                pace_s=pace_s,
            )
        else:
            assert start_node is not None, "run_bench: a scenario or a node to start"
            r = bench_linux(
                start_node,
                build,
                config=config,
                ticks=ticks,
                dry_run=dry_run,
                name=spec,
                pace_s=pace_s,
            )
        results.append(r)
    print(bench_text(results))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out / 'bench.json'}")
    return results
