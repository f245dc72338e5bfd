"""NodeVectorEnv (env.vector_env): one kernel call per step, the scalar env's semantics, autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import env.gym_env  # noqa: F401 - registers the ids
from env.allocations import fair_allocation
from env.config import ConfigError
from env.gym_env import EnvConfig, NodeEnv
from env.sim.engine import SimBatch
from env.sim.scenario import simple_scenario
from env.types import Move
from env.vector_env import NodeVectorEnv, VectorActionMaskObs

THREE = simple_scenario(
    {"memcached": 0.3, "xapian": 0.2, "nginx": 0.2}, duration_s=60.0, warmup_s=0.0, name="three"
)
DETERMINISTIC = ("present", "load", "cores", "llc_ways", "freq_level", "memory", "disk", "net")


def test_make_vec_builds_the_native_env_that_steps_all_nodes_in_one_kernel_call(monkeypatch):
    vec = gym.make_vec("ColocSim-v0", num_envs=3, episode_intervals=50)
    assert isinstance(vec, NodeVectorEnv) and vec.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    vec.reset(seed=0)
    calls = []
    original = SimBatch.step
    monkeypatch.setattr(
        SimBatch, "step", lambda self, *a, **k: (calls.append(k.get("index")), original(self, *a, **k))[1]
    )
    x, r, term, trunc, info = vec.step(np.zeros(3, dtype=np.int64))
    assert calls == [None]  # one call, for the whole batch
    assert x.shape == (3, vec.single_observation_space.shape[0]) and x in vec.observation_space
    assert r.shape == term.shape == trunc.shape == (3,) and info["action_mask"].shape == (3, 61)


def test_sub_env_i_follows_the_scalar_env_seeded_with_seed_plus_i():
    """Same scenario draws, same action semantics: the allocation, load and mask features agree
    exactly; latency differs only by the simulator's sampling noise, so its mean agrees."""
    cfg = EnvConfig(max_apps=4, episode_intervals=200)
    vec = NodeVectorEnv(2, cfg)
    X, vinfo = vec.reset(seed=20)
    scalar = NodeEnv(cfg)
    x, info = scalar.reset(seed=21)
    assert vinfo["scenario"][1] == info["scenario"]
    cols = [scalar.encoder.index(f"app{k}.{f}") for k in range(4) for f in DETERMINISTIC]
    n_apps = len(scalar.capabilities.lc_apps)
    plan = [
        scalar.codec.single_index(k % n_apps, m)
        for k, m in enumerate([Move.UP_CORE, Move.DOWN_CACHE, Move.UP_FREQ] * 2)
    ]
    xs, Xs = [], []
    for t in range(40):
        a = plan[t] if t < len(plan) else 0
        assert vinfo["action_mask"][1][a] == info["action_mask"][a]
        x, _, _, _, info = scalar.step(a)
        X, _, _, _, vinfo = vec.step(np.array([0, a]))
        np.testing.assert_array_equal(X[1][cols], x[cols])
        np.testing.assert_array_equal(vinfo["action_mask"][1], info["action_mask"])
        xs.append(x)
        Xs.append(X[1])
    tardy = [scalar.encoder.index(f"app{k}.log_tardiness") for k in range(n_apps)]
    np.testing.assert_allclose(np.mean(Xs, axis=0)[tardy], np.mean(xs, axis=0)[tardy], atol=0.05)
    assert vinfo["moves"][1] == info["moves"] == "HOLD"


def test_each_transition_is_the_scalar_code_on_that_sub_env():
    vec = NodeVectorEnv(3, EnvConfig(scenario=THREE, action_mode="per_app", max_apps=4))
    vec.reset(seed=5)
    vec.action_space.seed(5)
    for _ in range(6):
        before = vec.observations()
        actions = vec.action_space.sample()
        X, r, _, _, info = vec.step(actions)
        after = vec.observations()
        for i in range(3):
            caps = vec.capabilities(i)
            decoded = vec.codec.decode(actions[i], before[i], caps)
            assert after[i].allocation == decoded.allocation
            assert after[i].time_s == pytest.approx(before[i].time_s + caps.interval_s)
            np.testing.assert_array_equal(X[i], vec.encoder.encode(after[i], caps, previous=before[i]))
            np.testing.assert_array_equal(info["action_mask"][i], vec.codec.mask(after[i], caps))
            assert r[i] == vec.reward_fn(after[i], caps, vec.fleet.nodes[i].tail_at_target()).reward


def test_seeded_vector_rollouts_are_identical():
    def rollout():
        vec = NodeVectorEnv(2, EnvConfig(max_apps=6, episode_intervals=4))
        xs = [vec.reset(seed=9)[0]]
        rs = []
        for t in range(10):  # crosses two autoresets
            x, r, *_ = vec.step(np.array([t % 7, (3 * t) % 11]))
            xs.append(x)
            rs.append(r)
        return np.array(xs), np.array(rs)

    (xa, ra), (xb, rb) = rollout(), rollout()
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ra, rb)
    assert not np.array_equal(xa[:, 0], xa[:, 1])  # the sub-envs are different episodes


def test_next_step_autoreset_starts_the_next_episode_of_that_sub_env():
    cfg = EnvConfig(max_apps=6, episode_intervals=3)
    vec = NodeVectorEnv(2, cfg)
    _, info0 = vec.reset(seed=40)
    scalar = NodeEnv(cfg)
    scalar.reset(seed=41)
    for _ in range(3):
        scalar.step(0)
    x_next, next_info = scalar.reset()  # the scalar env's second episode
    for t in range(3):
        _, r, term, trunc, info = vec.step(np.zeros(2, dtype=np.int64))
        assert not term.any() and trunc.tolist() == [t == 2, t == 2]
    x, r, term, trunc, info = vec.step(np.array([5, 5]))  # ignored: this step resets
    assert r.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
    assert info["interval"].tolist() == [0, 0] and "qos_met" not in info
    assert info["scenario"][1] == next_info["scenario"]
    present = [vec.encoder.index(f"app{k}.present") for k in range(6)]
    np.testing.assert_array_equal(x[1][present], x_next[present])
    _, _, _, _, info = vec.step(np.zeros(2, dtype=np.int64))
    assert info["interval"].tolist() == [1, 1]
    assert info0["scenario"].tolist() != info["scenario"].tolist()  # new episodes, new sampled mixes


def test_same_step_autoreset_reports_the_final_observation():
    vec = NodeVectorEnv(2, EnvConfig(scenario=THREE, episode_intervals=2), autoreset_mode="SameStep")
    vec.reset(seed=1)
    vec.step(np.zeros(2, dtype=np.int64))
    x, r, term, trunc, info = vec.step(np.zeros(2, dtype=np.int64))
    assert trunc.all() and not term.any() and info["_final_obs"].all()
    np.testing.assert_array_equal(r, info["final_info"]["reward_terms"]["reward"])  # the final step's reward
    assert info["interval"].tolist() == [0, 0]  # already the next episode
    assert info["final_info"]["interval"].tolist() == [2, 2] and info["final_info"]["_qos_met"].all()
    assert not np.array_equal(info["final_obs"][0], x[0])
    _, _, _, trunc, info = vec.step(np.zeros(2, dtype=np.int64))
    assert not trunc.any() and info["interval"].tolist() == [1, 1]


def test_disabled_autoreset_resets_only_the_masked_sub_envs():
    vec = NodeVectorEnv(
        2, EnvConfig(scenario=THREE, episode_intervals=1), autoreset_mode=AutoresetMode.DISABLED
    )
    vec.reset(seed=2)
    _, _, _, trunc, _ = vec.step(np.zeros(2, dtype=np.int64))
    assert trunc.all()
    with pytest.raises(RuntimeError, match="reset_mask"):
        vec.step(np.zeros(2, dtype=np.int64))
    _, info = vec.reset(options={"reset_mask": np.array([True, False])})
    assert info["_interval"].tolist() == [True, False]
    with pytest.raises(RuntimeError):  # sub-env 1 is still done
        vec.step(np.zeros(2, dtype=np.int64))
    vec.reset(options={"reset_mask": np.array([False, True])})
    _, _, _, _, info = vec.step(np.zeros(2, dtype=np.int64))
    assert info["interval"].tolist() == [1, 1]


def test_vector_action_mask_wrapper_batches_dict_observations():
    vec = VectorActionMaskObs(NodeVectorEnv(2, EnvConfig(scenario=THREE, action_mode="per_app", max_apps=4)))
    obs, info = vec.reset(seed=0)
    assert obs in vec.observation_space and obs["action_mask"].shape == (2, 44)
    np.testing.assert_array_equal(obs["action_mask"], info["action_mask"].reshape(2, -1).astype(np.float32))
    obs, *_ = vec.step(vec.action_space.sample())
    assert obs in vec.observation_space


def test_one_batch_steps_nodes_of_different_platforms_and_intervals():
    from env.scenario_sampler import AlsoDraw, SamplerConfig

    qprm = SamplerConfig(apps=("memcached_qprm",), be_jobs=("be_fotonik",), platform="qprm")
    vec = NodeVectorEnv(6, EnvConfig(max_apps=6, sampler=SamplerConfig(also=(AlsoDraw(0.5, qprm),))))
    _, info = vec.reset(seed=2)
    kinds = ["qprm" if "memcached_qprm" in name else "parties" for name in info["scenario"]]
    assert set(kinds) == {"qprm", "parties"}
    cores = {"qprm": 9, "parties": 14}
    for _ in range(10):
        x, r, _, _, info = vec.step(np.zeros(6, dtype=np.int64))
        assert x in vec.observation_space and np.all(np.isfinite(r))
    for i, kind in enumerate(kinds):
        caps = vec.capabilities(i)
        assert caps is not None and caps.cores == cores[kind]
        assert vec.observations()[i].time_s == pytest.approx(11 * caps.interval_s)  # 1 s vs 500 ms intervals


def test_lean_start_sub_env_i_starts_where_the_scalar_env_seeded_seed_plus_i_starts():
    """`lean_start_moves`: each episode starts from `env.allocations.lean_start` drawn from the
    sub-env's generator, after its scenario, as the scalar env draws it."""
    cfg = EnvConfig(scenario=THREE, max_apps=4, lean_start_moves=10)
    vec = NodeVectorEnv(4, cfg)
    vec.reset(seed=30)
    fair = fair_allocation(vec.capabilities(0))
    starts = [obs.allocation for obs in vec.observations()]
    assert sum(a != fair for a in starts) >= 2  # most draws move some units
    for i, a in enumerate(starts):
        scalar = NodeEnv(cfg)
        scalar.reset(seed=30 + i)
        assert scalar.node.current_allocation() == a
    later = []  # later episodes of the same env (its SimNode reset, not rebuilt) start lean too
    for _ in range(5):
        scalar.reset()
        later.append(scalar.node.current_allocation())
    assert any(a != fair for a in later) and len({repr(a) for a in later}) > 1
    plain = NodeVectorEnv(2, EnvConfig(scenario=THREE, max_apps=4))
    plain.reset(seed=30)
    assert all(obs.allocation == fair for obs in plain.observations())


def test_lean_start_moves_must_not_be_negative():
    with pytest.raises(ConfigError, match="lean_start_moves"):
        EnvConfig(lean_start_moves=-1)
