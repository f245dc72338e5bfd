"""`evaluate.py bench`: the simulator's speed (`env.sim.bench`) and the serving loop's overhead
(decide + guards + apply per tick on the 6-app mix, and the loop's share of a core), in one run so
that figures before and after a change are compared on the same machine state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from env.config import ConfigError
from env.controller import ControllerContext
from env.sim import bench
from harness.output import staged_output
from harness.registry import make_controller

SERVE_SPECS = ("parties", "static")  # PARTIES, and a controller that never changes anything


def serve_loop_overhead() -> list[dict[str, Any]]:
    """serve.py's loop overhead on the 6-app mix (goals: decide + guards + apply <= 5 ms p99, the
    loop <= 2% of a core at 500 ms), for each of `SERVE_SPECS`."""
    from harness.serving import bench_sim  # the serving stack: only when benchmarked

    def factory(spec: str) -> Any:
        return lambda caps, scn, node: make_controller(spec, ControllerContext(caps, scn, node, 0))

    return [bench_sim(factory(s), scenario="mix6-const", label=f"serve loop, {s}") for s in SERVE_SPECS]


def run_bench(out: Path, *, repeats: int = 5, batch: int = 4096, overwrite: bool = False) -> int:
    """Measure, print the figures against their goals and write `out/bench.json`."""
    if repeats < 1 or batch < 1:
        raise ConfigError("bench: --repeats and --batch must be >= 1")
    with staged_output(out, overwrite) as tmp:
        res: dict[str, Any] = bench.run(repeats, batch)
        print("running serve_loop_overhead ...", flush=True)
        res["serve_loop_overhead"] = serve_loop_overhead()
        for k in ("sim_steps_per_s", "sim_batched_app_steps_per_s", "fleet_node_steps_per_s"):
            goal = bench.GOALS.get(k)
            met = "" if goal is None else (f"  (goal {goal:,}: {'met' if res[k] >= goal else 'NOT met'})")
            print(f"{k:30s} {res[k]:>12,}{met}")
        for r in res["serve_loop_overhead"]:
            print(
                f"serve_loop_overhead: {r['label']:<24} decide+guards+apply p99 {r['control_ms']['p99']:.2f} ms "
                f"(CPU time {r['control_cpu_ms']['p99']:.2f} ms; goal <= 5), loop {r['cpu_pct_of_core']:.2f}% of a core (goal <= 2%)"
            )
        (tmp / "bench.json").write_text(json.dumps(res, indent=2))
    print(f"wrote {out / 'bench.json'}")
    return 0
