"""`evaluate.py bench`: the simulator's speed (`env.sim.bench`), the training env's speed (the
vector env that RLlib's env runners step), the serving loop's overhead (decide + guards + apply
per tick on the 6-app mix, and the loop's share of a core) for PARTIES, a static controller and a
learned policy of `configs/train/full.yaml`'s shape, and the Oracle's search (seconds per plan and
the allocations it ran, `oracle_plans`), in one run so that figures before and after a change are
compared on the same machine state."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from env.config import ConfigError, resolve_config
from env.controller import ControllerContext
from env.outdir import staged_output
from env.sim import bench
from harness.registry import make_controller

SERVE_SPECS = ("parties", "static")  # PARTIES, and a controller that never changes anything


def serve_loop_overhead() -> list[dict[str, Any]]:
    """serve.py's loop overhead on the 6-app mix (goals: decide + guards + apply <= 5 ms p99, the
    loop <= 2% of a core at 500 ms), for each of `SERVE_SPECS`."""
    from harness.serving import bench_sim  # the serving stack: only when benchmarked

    def factory(spec: str) -> Any:
        return lambda caps, scn, node: make_controller(spec, ControllerContext(caps, scn, node, 0))

    return [bench_sim(factory(s), scenario="mix6-const", label=f"serve loop, {s}") for s in SERVE_SPECS]


def learned_policy_overhead() -> dict[str, Any]:
    """serve.py's loop overhead with a learned policy on the 6-app mix (the network of
    `configs/train/full.yaml`, untrained: its weights do not change what a decision costs; goal:
    decide <= 2 ms p99)."""
    from agents.policy import ColocNet, LoadedPolicy, PolicyMeta, RlController, feature_layout
    from agents.rllib.config import load_train_config
    from harness.serving import bench_sim

    config = load_train_config(resolve_config("train", "full"))
    spec = config.net_spec()
    meta = PolicyMeta(spec, config.env.features, feature_layout())
    policy = LoadedPolicy(meta, ColocNet(spec).eval(), Path("untrained"))
    return bench_sim(
        lambda caps, scn, node: RlController(policy), scenario="mix6-const", label="serve loop, rl"
    )


def training_env_steps(repeats: int, steps: int = 200) -> dict[str, Any]:
    """Env steps per second of the vector env as one RLlib env runner steps it (`full.yaml`'s sampler
    and sub-envs per runner, masked random actions; the network and RLlib's own work excluded): the
    median of `repeats` runs of `steps` vector steps after a warm-up."""
    from agents.rllib.config import load_train_config
    from agents.rllib.envs import make_vector_env, training_env_config

    config = load_train_config(resolve_config("train", "full"))
    n = config.resources.num_envs_per_env_runner
    env = make_vector_env(n, training_env_config(config))
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)

    def run(k: int) -> float:
        nonlocal obs
        t0 = time.perf_counter()
        for _ in range(k):
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs["action_mask"].reshape(n, -1)])
            obs, *_ = env.step(actions)
        return k * n / (time.perf_counter() - t0)

    run(20)  # warm-up: numba kernels, first episodes
    rates = [run(steps) for _ in range(repeats)]
    env.close()
    return {"num_envs": n, "env_steps_per_s": round(float(np.median(rates)))}


ORACLE_POINTS = (  # three apps with (cores, ways) frontiers; four with MongoDB's four-axis one
    {"memcached": 0.3, "xapian": 0.3, "nginx": 0.3},
    {"xapian": 0.1, "moses": 0.4, "mongodb": 0.3, "sphinx": 0.3},
)


def oracle_plans(repeats: int) -> list[dict[str, Any]]:
    """The Oracle's search (`baselines.oracle.Planner.plan`, configs/baselines/oracle.yaml) for each
    of `ORACLE_POINTS`, a fresh planner per plan: seconds per plan (the median of `repeats`, at
    most 3) and the allocations its analytic runs evaluated, per-app (step 1) and joint: the search is
    deterministic, so these counts compare two versions of it without the machine's noise."""
    from baselines.oracle import Planner, load_oracle_config
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    cfg = load_oracle_config()
    out = []
    for loads in ORACLE_POINTS:
        scn = simple_scenario(loads)
        caps = SimNode(scn, seed=0).capabilities()
        seconds, runs = [], {}
        for _ in range(min(repeats, 3)):
            planner = Planner(scn, caps, cfg)
            counted = {"per_app": 0, "joint": 0}
            for name, runner in (("per_app", planner.company), ("joint", planner.batch)):
                runner.run = _counting(runner, counted, name)  # type: ignore[method-assign]
            t0 = time.perf_counter()
            plan = planner.plan(loads)
            seconds.append(time.perf_counter() - t0)
            runs = counted
        out.append(
            {
                "apps": ",".join(loads),
                "plan_s": round(float(np.median(seconds)), 3),
                "verdict": plan.search.verdict,
                "allocations_run": runs,
            }
        )
    return out


def _counting(runner: Any, counted: dict[str, int], name: str) -> Any:
    """`runner.run`, counting the allocations (rows) it is asked to evaluate into `counted[name]`."""
    real = runner.run

    def run(rows: np.ndarray, *args: Any, **kw: Any) -> Any:
        counted[name] += len(rows)
        return real(rows, *args, **kw)

    return run


def run_bench(out: Path, *, repeats: int = 5, batch: int = 4096, overwrite: bool = False) -> int:
    """Measure, print the figures against their goals and write `out/bench.json`."""
    if repeats < 1 or batch < 1:
        raise ConfigError("bench: --repeats and --batch must be >= 1")
    with staged_output(out, overwrite) as tmp:
        res: dict[str, Any] = bench.run(repeats, batch)
        print("running serve_loop_overhead ...", flush=True)
        res["serve_loop_overhead"] = serve_loop_overhead()
        print("running learned_policy_overhead ...", flush=True)
        res["serve_loop_overhead"].append(learned_policy_overhead())
        print("running training_env_steps ...", flush=True)
        res["training_env"] = training_env_steps(repeats)
        print("running oracle_plans ...", flush=True)
        res["oracle_plans"] = oracle_plans(repeats)
        for k in ("sim_steps_per_s", "sim_batched_app_steps_per_s", "fleet_node_steps_per_s"):
            goal = bench.GOALS.get(k)
            met = "" if goal is None else (f"  (goal {goal:,}: {'met' if res[k] >= goal else 'NOT met'})")
            print(f"{k:30s} {res[k]:>12,}{met}")
        for r in res["serve_loop_overhead"]:
            print(
                f"serve_loop_overhead: {r['label']:<24} decide p99 {r['decide_ms']['p99']:.2f} ms, "
                f"decide+guards+apply p99 {r['control_ms']['p99']:.2f} ms "
                f"(CPU time {r['control_cpu_ms']['p99']:.2f} ms; goal <= 5), loop {r['cpu_pct_of_core']:.2f}% of a core (goal <= 2%)"
            )
        t = res["training_env"]
        print(
            f"training_env_steps_per_s       {t['env_steps_per_s']:>12,}  ({t['num_envs']} sub-envs, one env runner)"
        )
        for r in res["oracle_plans"]:
            runs = r["allocations_run"]
            print(
                f"oracle_plan_s {r['apps']:<28} {r['plan_s']:>8.2f}  ({r['verdict']}; allocations run: "
                f"{runs['per_app']:,} per app, {runs['joint']:,} joint)"
            )
        (tmp / "bench.json").write_text(json.dumps(res, indent=2))
    print(f"wrote {out / 'bench.json'}")
    return 0
