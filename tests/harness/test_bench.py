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
