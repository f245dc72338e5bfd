"""harness.bench: the training-env and learned-policy figures of `evaluate.py bench` are measured on
the objects training and serving use (the figures themselves are checked by running the bench, never
by timed tests)."""

from __future__ import annotations

import math

import pytest

from harness import bench


def test_training_env_bench_steps_the_runners_vector_env():
    res = bench.training_env_steps(repeats=1, steps=3)
    assert res["num_envs"] == 16  # configs/train/full.yaml: num_envs_per_env_runner
    assert res["env_steps_per_s"] > 0


@pytest.mark.slow  # 300 paced ticks of the serving loop
def test_learned_policy_bench_serves_full_yamls_network_on_six_apps():
    res = bench.learned_policy_overhead()
    assert res["label"] == "serve loop, rl"
    assert res["ticks"] > 0 and math.isfinite(res["decide_ms"]["p99"])


def test_oracle_bench_counts_the_allocations_the_search_runs(monkeypatch):
    """The counts are the plan's own: per app, at most the questions step 1 asked (a floor or a
    ceiling answers some without a run); jointly, every joint evaluation the search reports."""
    from baselines.oracle import Planner, load_oracle_config
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    loads = {"memcached": 0.3, "nginx": 0.3}
    monkeypatch.setattr(bench, "ORACLE_POINTS", (loads,))
    (res,) = bench.oracle_plans(repeats=1)
    scn = simple_scenario(loads)
    plan = Planner(scn, SimNode(scn, seed=0).capabilities(), load_oracle_config()).plan(loads)
    assert res["apps"] == "memcached,nginx" and res["verdict"] == plan.search.verdict == "viable"
    runs = res["allocations_run"]
    assert 0 < runs["per_app"] <= plan.search.frontier_evaluations
    assert runs["joint"] >= plan.search.joint_evaluations > 0
    assert res["plan_s"] > 0
