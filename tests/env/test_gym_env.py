"""NodeEnv (env.gym_env): Gymnasium API, determinism, features, actions, masks, reward, registration."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import env.gym_env  # noqa: F401 - registers the ids
from env.config import ConfigError
from env.features import APP_FEATURES, N_APP_FEATURES, NODE_FEATURES, ObservationEncoder
from env.gym_env import ActionCodec, ActionMaskObs, EnvConfig, NodeEnv
from env.histogram import quantile_rank
from env.moves import move_mask
from env.rewards import QosFirstReward, RewardConfig, reclaimed_share, window_budget
from env.sim.scenario import simple_scenario
from env.types import Move

THREE = simple_scenario(
    {"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}, duration_s=20.0, warmup_s=0.0, name="three"
)


def _env(**fields) -> NodeEnv:
    return NodeEnv(EnvConfig(**{"scenario": THREE, **fields}))


@pytest.fixture(scope="module")
def started():
    env = _env(max_apps=4)
    _, info = env.reset(seed=0)
    return env, info


# ---- Gymnasium API --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_check_env_passes_on_registered_sim_env(mode):
    env = gym.make("ColocSim-v0", action_mode=mode, episode_intervals=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught if "WARN:" in str(w.message)] == []  # gymnasium.logger.warn
    assert env.spec is not None and env.spec.nondeterministic is False


def test_seeded_rollouts_are_identical_and_seeds_matter():
    def rollout(seed: int, steps: int = 12):
        env = gym.make("ColocSim-v0", episode_intervals=50)
        x, info = env.reset(seed=seed)
        rng = np.random.default_rng(7)  # the same action sequence policy for both envs
        xs, rs, moves = [x], [], []
        for _ in range(steps):
            a = int(rng.choice(np.flatnonzero(info["action_mask"])))
            x, r, _, _, info = env.step(a)
            xs.append(x)
            rs.append(r)
            moves.append(info["moves"])
        return np.array(xs), np.array(rs), moves, info["scenario"]

    a, b, c = rollout(11), rollout(11), rollout(12)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2] and a[3] == b[3]
    assert not np.array_equal(a[0], c[0])  # a different seed is a different episode


def test_episode_truncates_after_episode_intervals_and_never_terminates():
    env = _env(episode_intervals=3)
    env.reset(seed=1)
    flags = [env.step(0)[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_default_episode_length_is_the_scenario_duration():
    env = _env()
    env.reset(seed=1)
    steps = 0
    truncated = False
    while not truncated:
        _, _, _, truncated, info = env.step(0)
        steps += 1
    assert steps == 40  # 20 s of 500 ms intervals
    assert info["time_s"] == pytest.approx(20.5)  # the first interval is simulated by reset


def test_reset_option_picks_the_scenario_and_too_many_apps_are_refused():
    env = _env(max_apps=3)
    two = simple_scenario({"moses": 0.3, "sphinx": 0.3}, duration_s=10.0, warmup_s=0.0, name="two")
    x, info = env.reset(seed=0, options={"scenario": two})
    present = x[[env.encoder.index(f"app{k}.present") for k in range(3)]]
    assert info["scenario"] == "two" and present.tolist() == [1.0, 1.0, 0.0]
    four = simple_scenario(["memcached", "xapian", "nginx", "moses"], warmup_s=0.0)
    with pytest.raises(ConfigError, match="max_apps=3"):
        env.reset(options={"scenario": four})


def test_a_given_node_keeps_its_own_scenario_unless_told_otherwise():
    from env.sim.node import SimNode

    env = NodeEnv(EnvConfig(), node=SimNode(THREE, seed=0))
    assert env.config.sampler is None  # no sampler is forced onto a node that was handed in
    _, info = env.reset(seed=0)
    assert info["scenario"] == "three" and env.planner.episode_intervals(None, env.capabilities) == 240
    steps, truncated = 0, False
    while not truncated:
        truncated = env.step(0)[3]
        steps += 1
    assert steps == 40  # the node's scenario lasts 20 s
    assert NodeEnv(EnvConfig()).config.sampler is not None  # a simulated env samples by default


def test_render_ansi_shows_every_app():
    env = NodeEnv(EnvConfig(scenario=THREE), render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert all(name in text for name in ("memcached", "xapian", "nginx", "be_parties"))


# ---- features -------------------------------------------------------------------------------------
def test_docstring_table_lists_every_feature_with_its_bounds():
    rows = re.findall(
        r"^\s*\| ([^|]+) \| (app\[k\]|node)\.(\w+) \| \[([-\d.]+), ([-\d.]+)\] \|", NodeEnv.__doc__, re.M
    )
    documented = [(scope, name, float(lo), float(hi)) for _, scope, name, lo, hi in rows]
    expected = [("app[k]", f.name, f.low, f.high) for f in APP_FEATURES] + [
        ("node", f.name, f.low, f.high) for f in NODE_FEATURES
    ]
    assert documented == expected
    assert f"Box(shape=({N_APP_FEATURES} * max_apps + {len(NODE_FEATURES)},)" in NodeEnv.__doc__


def test_features_encode_the_observation(started):
    env, _ = started
    obs, caps, x = env.observation, env.capabilities, env.encoder.encode(env.observation, env.capabilities)
    assert x in env.observation_space
    apps, node = env.encoder.split(x)
    for k, spec in enumerate(caps.lc_apps):  # slots follow Capabilities.lc_apps
        s, a = obs.app(spec.name), obs.allocation[spec.name]
        assert apps[k, 0] == 1.0  # present
        assert apps[k, 2] == pytest.approx(np.clip(s.slack, -1, 1), abs=1e-6)
        assert apps[k, 3] == pytest.approx(np.clip(np.log10(s.tardiness) / 2, -1, 1), abs=1e-6)
        assert apps[k, 4] == pytest.approx(0.2)
        assert apps[k, 13] == pytest.approx(a.cores / caps.cores)
        assert apps[k, 14] == pytest.approx(a.llc_ways / caps.llc_ways)
        assert apps[k, 15] == pytest.approx(
            caps.freq_levels_mhz.index(a.freq_mhz) / (len(caps.freq_levels_mhz) - 1)
        )
    assert not apps[3].any()  # the padded slot is all zero
    assert node[3] == pytest.approx(obs.be_throughput, abs=1e-6)
    assert node[5] == pytest.approx(obs.allocation["be_parties"].cores / caps.cores)


def test_each_slot_says_which_kind_of_service_it_holds_by_its_qos_target(started):
    """The QoS target, the one fact PARTIES knows of an app beforehand (Sec. 4.3), on a log scale:
    memcached's 600 us, xapian's 5 ms and nginx's 10 ms tell the three slots apart, and it stays
    known while the app's latency feed is down."""
    env, _ = started
    obs, caps = env.observation, env.capabilities
    col = env.encoder.index("app0.qos_target")
    x = env.encoder.encode(obs, caps)
    got = {spec.name: x[col + k * N_APP_FEATURES] for k, spec in enumerate(caps.lc_apps)}
    assert got == pytest.approx(
        {"memcached": np.log10(600) / 7, "xapian": np.log10(5000) / 7, "nginx": 4 / 7}
    )
    broken = dataclasses.replace(obs.apps[0], p99_us=float("nan"), valid=False)
    blind = env.encoder.encode(dataclasses.replace(obs, apps=(broken, *obs.apps[1:])), caps)
    assert blind[col] == x[col] > 0
    unknown = dataclasses.replace(
        caps, apps=(dataclasses.replace(caps.apps[0], qos_target_us=float("nan")), *caps.apps[1:])
    )
    assert env.encoder.encode(obs, unknown)[col] == 0.0  # no target given: 0, not a guess


def test_a_failed_latency_feed_is_flagged_not_faked(started):
    env, _ = started
    obs, caps = env.observation, env.capabilities
    broken = dataclasses.replace(obs.apps[0], p99_us=float("nan"), valid=False)
    x = env.encoder.encode(dataclasses.replace(obs, apps=(broken, *obs.apps[1:])), caps)
    apps, _ = env.encoder.split(x)
    assert apps[0, :4].tolist() == [1.0, 0.0, 0.0, 0.0]  # present, invalid, no slack, no tardiness
    assert apps[1, 1] == 1.0
    assert np.isfinite(x).all()


def test_features_a_node_cannot_measure_are_zero_as_that_node_reports_them(started):
    """A policy for a VM without resctrl, cpufreq or RAPL is trained with those features at 0."""
    from env.features import FeatureConfig

    env, _ = started
    obs, caps = env.observation, env.capabilities
    full = env.encoder.encode(obs, caps)
    gone = ("llc_occupancy", "freq_achieved", "power")
    blind = ObservationEncoder(env.encoder.max_apps, FeatureConfig(unmeasured=gone)).encode(obs, caps)
    lost = [n for n, a, b in zip(env.encoder.names, full, blind) if a != b]
    assert lost and all(n.split(".", 1)[1] in gone for n in lost)
    assert (
        all(blind[env.encoder.index(f"app0.{n}")] == 0 for n in gone[:2])
        and full[env.encoder.index("app0.freq_achieved")] > 0
    )
    with pytest.raises(ValueError, match="not features"):
        FeatureConfig(unmeasured=("turbo_temperature",))


def test_encoder_refuses_more_apps_than_slots(started):
    env, _ = started
    with pytest.raises(ValueError, match="max_apps=2"):
        ObservationEncoder(2).encode(env.observation, env.capabilities)


def test_history_features_show_what_the_last_move_changed_and_how_latency_moved():
    env = _env(max_apps=4)
    x0, _ = env.reset(seed=3)
    names = [f.name for f in APP_FEATURES]
    history = [names.index(n) for n in names if n.startswith("d_")]
    assert len(history) == 6 and not env.encoder.split(x0)[0][:, history].any()  # nothing before reset
    before = env.observation
    x1, *_ = env.step(env.codec.single_index(1, Move.UP_CORE))
    apps, _ = env.encoder.split(x1)
    d = {n: apps[:, names.index(n)] for n in names if n.startswith("d_")}
    assert d["d_cores"].tolist() == [0.0, 1.0, 0.0, 0.0]  # xapian got a core, nobody else lost one
    for n in ("d_llc_ways", "d_freq_level", "d_memory", "d_disk"):
        assert not d[n].any()
    after = env.observation
    for k in range(3):
        s0, s1 = before.apps[k], after.apps[k]
        expect = (np.log10(s1.tardiness) - np.log10(s0.tardiness)) / 2
        assert d["d_log_tardiness"][k] == pytest.approx(np.clip(expect, -1, 1), abs=1e-5)
    # the same pair through the encoder directly; a taken core shows as -1 for its owner
    assert np.array_equal(env.encoder.encode(after, env.capabilities, previous=before), x1)
    x_back = env.encoder.encode(before, env.capabilities, previous=after)
    assert env.encoder.split(x_back)[0][1, names.index("d_cores")] == -1.0


# ---- actions and masks ----------------------------------------------------------------------------
def test_single_action_index_moves_the_app_in_its_slot():
    env = _env(max_apps=4)
    _, info = env.reset(seed=3)
    before = env.observation.allocation
    a = env.codec.single_index(1, Move.UP_CORE)
    assert a == 1 + 10 * 1 + 0 and info["action_mask"][a]
    _, _, _, _, info = env.step(a)
    after = env.observation.allocation
    assert after["xapian"].cores == before["xapian"].cores + 1
    assert after["be_parties"].cores == before["be_parties"].cores - 1  # the BE job is the first victim
    assert _sans_net(after["memcached"]) == _sans_net(before["memcached"])  # the network follows use
    assert info["moves"] == "xapian:<UP,CORE> from be_parties" and not info["infeasible_action"]


def _sans_net(a):
    """An app's allocation but its network limit (adjusted every interval outside the moves)."""
    return dataclasses.replace(a, net_gbps=0.0)


def test_mask_is_move_mask_per_app_and_padded_slots_only_hold(started):
    env, info = started
    obs, caps = env.observation, env.capabilities
    mask = info["action_mask"]
    assert mask.shape == (1 + 10 * 4,) and mask.dtype == bool and mask[0]
    for k, spec in enumerate(caps.lc_apps):
        np.testing.assert_array_equal(mask[1 + 10 * k : 11 + 10 * k], move_mask(obs, caps, spec.name)[1:])
    assert not mask[1 + 10 * 3 :].any()
    per_app = ActionCodec(4, "per_app").mask(obs, caps)
    assert per_app.shape == (4, 11) and per_app[:, 0].all() and not per_app[3, 1:].any()


def test_infeasible_actions_are_applied_as_hold_and_reported():
    env = _env(max_apps=4)
    _, info = env.reset(seed=4)
    alloc = env.observation.allocation
    padded = env.codec.single_index(3, Move.UP_CORE)
    assert not info["action_mask"][padded]
    _, _, _, _, info = env.step(padded)
    assert [_sans_net(a) for a in env.observation.allocation] == [_sans_net(a) for a in alloc]
    assert info["infeasible_action"] and "slot3" in info["rejected"] and info["moves"] == "HOLD"
    for _ in range(12):  # memcached at nominal frequency: 10 levels down to the minimum, then refused
        env.step(env.codec.single_index(0, Move.DOWN_FREQ))
    assert not env.codec.mask(env.observation, env.capabilities)[env.codec.single_index(0, Move.DOWN_FREQ)]
    assert env.observation.allocation["memcached"].freq_mhz == env.capabilities.freq_levels_mhz[0]


def test_per_app_moves_apply_downs_first_then_ups_by_least_slack(started):
    env, _ = started
    obs, caps = env.observation, env.capabilities
    a0 = obs.allocation
    # the BE job holds one core and nothing is idle
    alloc = a0.replace_app("be_parties", cores=1.0).replace_app(
        "nginx", cores=a0["nginx"].cores + a0["be_parties"].cores - 1
    )
    assert alloc.idle_cores == 0
    samples = {"memcached": 1.5, "xapian": 0.5, "nginx": 0.1}  # p99 / target: memcached is the worst
    apps = tuple(dataclasses.replace(s, p99_us=s.target_us * samples[s.name]) for s in obs.apps)
    crafted = dataclasses.replace(obs, apps=apps, allocation=alloc)
    codec = ActionCodec(4, "per_app")
    up_both = codec.decode([Move.UP_CORE, Move.UP_CORE, 0, 0], crafted, caps)
    # memcached (least slack) goes first and gets the BE job's last core; xapian then takes one from nginx
    assert up_both.applied == (("memcached", Move.UP_CORE, "be_parties"), ("xapian", Move.UP_CORE, "nginx"))
    down_up = codec.decode([Move.UP_CORE, Move.DOWN_CORE, 0, 0], crafted, caps)
    # xapian's DOWN runs first and gives its core to the BE job...
    assert down_up.applied[0] == ("xapian", Move.DOWN_CORE, "be_parties")
    assert down_up.applied[1] == ("memcached", Move.UP_CORE, "be_parties")  # ...which is memcached's victim
    assert down_up.allocation["be_parties"].cores == 1.0


def test_action_mask_wrapper_gives_rllib_dict_observations():
    for mode, size in (("single", 41), ("per_app", 44)):
        env = ActionMaskObs(_env(max_apps=4, action_mode=mode))
        obs, info = env.reset(seed=0)
        assert set(obs) == {"observations", "action_mask"} and obs in env.observation_space
        assert obs["action_mask"].shape == (size,) and obs["action_mask"].dtype == np.float32
        np.testing.assert_array_equal(obs["action_mask"], info["action_mask"].reshape(-1).astype(np.float32))
        obs, *_ = env.step(env.action_space.sample())
        assert obs in env.observation_space


# ---- reward ---------------------------------------------------------------------------------------
def test_reward_puts_qos_first(started):
    env, _ = started
    obs, caps = env.observation, env.capabilities
    rw = QosFirstReward(RewardConfig())

    def with_tardiness(**t):
        return dataclasses.replace(
            obs, apps=tuple(dataclasses.replace(s, p99_us=s.target_us * t[s.name]) for s in obs.apps)
        )

    met = rw(with_tardiness(memcached=0.5, xapian=0.9, nginx=1.0), caps)
    assert met.qos_met and met.reward == pytest.approx(
        1.0 + obs.be_throughput + 0.5 * reclaimed_share(obs, caps)
    )
    missed = rw(with_tardiness(memcached=1.5, xapian=0.9, nginx=30.0), caps)
    assert not missed.qos_met and missed.reward == pytest.approx(-(1.0 + 0.5 + 4.0))  # nginx capped at 4
    barely = rw(with_tardiness(memcached=1.001, xapian=0.1, nginx=0.1), caps)
    assert barely.reward < 0 <= met.reward  # no BE throughput buys a violation
    lean = obs.allocation.replace_app("memcached", cores=1.0)  # 3 cores back to nobody: more reclaimed
    assert reclaimed_share(dataclasses.replace(obs, allocation=lean), caps) > reclaimed_share(obs, caps)


def test_window_budget_is_the_share_a_window_of_that_many_requests_tolerates():
    """PARTIES Sec. 5.1's verdict: the p99 of n requests meets when at most 1% are over the target; the
    budget is the share at which it meets with the given confidence (P computed by simulation)."""
    n = np.array([84, 1_000, 100_000])
    b = window_budget(n, 0.9)
    assert b[0] < b[1] < b[2] < 0.01 and b[2] > 0.0095
    rng = np.random.default_rng(0)
    for ni, bi in zip(n[:2], b[:2]):
        over = rng.binomial(int(ni), bi, size=20_000)  # requests over the target per window
        meets = over <= int(ni) - int(quantile_rank(0.99, ni))
        assert meets.mean() == pytest.approx(0.9, abs=0.01)


def test_window_risk_reward_judges_the_ground_truth_share(started):
    """`window_risk`: a p99 reading over the target is not a miss when the share over the target is
    within the window's budget, and a reading under it is one when the share is not; without
    ground truth (a real node) the interval's p99 decides."""
    env, _ = started
    obs, caps = env.observation, env.capabilities
    obs = dataclasses.replace(
        obs, apps=tuple(dataclasses.replace(s, p99_us=s.target_us * 1.2) for s in obs.apps)
    )
    rw = QosFirstReward(RewardConfig(qos="window_risk"))
    budgets = {s.name: float(window_budget(s.load_rps * 60.0, 0.9)) for s in obs.apps}
    within = rw(obs, caps, {a: 0.5 * b for a, b in budgets.items()})
    assert within.qos_met and within.violation == 0.0
    over = {**{a: 0.5 * b for a, b in budgets.items()}, "xapian": 3.0 * budgets["xapian"]}
    fast = dataclasses.replace(
        obs, apps=tuple(dataclasses.replace(s, p99_us=s.target_us * 0.5) for s in obs.apps)
    )
    missed = rw(fast, caps, over)
    assert not missed.qos_met and missed.violation == pytest.approx(2.0)
    assert missed.reward == pytest.approx(-(1.0 + 2.0))
    assert not rw(obs, caps, None).qos_met  # no ground truth: the 1.2x p99 readings miss
    assert QosFirstReward(RewardConfig())(obs, caps, {a: 0.0 for a in budgets}).qos_met is False
    with pytest.raises(ValueError, match=r"reward\.qos"):
        RewardConfig(qos="window")  # type: ignore[arg-type]


def test_the_env_hands_the_simulator_s_ground_truth_to_the_reward():
    seen = []

    def spy(obs, caps, tail_share=None):
        seen.append(tail_share)
        return QosFirstReward()(obs, caps, tail_share)

    env = NodeEnv(EnvConfig(scenario=THREE), reward=spy)
    env.reset(seed=0)
    env.step(0)
    assert seen and seen[-1] == env.node.tail_at_target()
    assert set(seen[-1]) == {"memcached", "xapian", "nginx"} and all(
        0.0 <= v <= 1.0 for v in seen[-1].values()
    )


def test_reward_can_be_replaced():
    env = NodeEnv(
        EnvConfig(scenario=THREE),
        reward=lambda obs, caps: QosFirstReward(RewardConfig(base=10.0))(
            obs, caps
        ),  # two arguments still work
    )
    env.reset(seed=0)
    _, r, _, _, info = env.step(0)
    assert r == info["reward_terms"]["reward"]
    assert (r >= 10.0) == info["qos_met"]


# ---- config and registration ----------------------------------------------------------------------
def test_config_is_strict_and_builds_from_yaml_data():
    with pytest.raises(ConfigError, match="action_mod"):
        gym.make("ColocSim-v0", action_mod="per_app")
    with pytest.raises(ConfigError, match="action_mode"):
        EnvConfig.from_mapping({"action_mode": "all"})
    cfg = EnvConfig.from_mapping({"max_apps": 3, "reward": {"be_weight": 2.0}, "sampler": {"max_apps": 3}})
    assert cfg.reward.be_weight == 2.0 and cfg.reward.base == 1.0 and cfg.sampler.max_apps == 3
    assert EnvConfig.resolve(cfg, action_mode="per_app").max_apps == 3
    assert EnvConfig.resolve(None, reward=RewardConfig(base=2.0)).reward.base == 2.0  # ready objects pass
    with pytest.raises(ConfigError, match="expected RewardConfig"):
        EnvConfig.resolve(None, reward=EnvConfig())


def test_registration_without_importing_hw():
    spec = gym.spec("ColocLinux-v0")
    assert spec.nondeterministic and spec.entry_point == "hw.gym:make_linux_env"
    assert gym.spec("ColocSim-v0").vector_entry_point == "env.vector_env:make_sim_vector_env"
    code = "import sys, env.gym_env, env.vector_env; print(sorted(m for m in sys.modules if m.split('.')[0] == 'hw'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- the run's guard chain -------------------------------------------------------------------------
def _allocations_after(cfg, vector, actions):
    """The allocations a one-node env of `cfg` (scalar or vector) observes from reset (seed 0) and
    after each of the single-mode `actions`, and the node's capabilities."""
    from env.vector_env import NodeVectorEnv

    if vector:
        env = NodeVectorEnv(1, cfg)
        env.reset(seed=0)
        seen = [env.observations()[0].allocation]
        for a in actions:
            env.step(np.array([a]))
            seen.append(env.observations()[0].allocation)
        caps = env.capabilities(0)
    else:
        env = NodeEnv(cfg)
        env.reset(seed=0)
        seen = [env.observation.allocation]
        for a in actions:
            env.step(a)
            seen.append(env.observation.allocation)
        caps = env.capabilities
    env.close()
    return seen, caps


@pytest.mark.parametrize("vector", [False, True])
def test_the_guard_chain_of_the_config_wraps_every_action(vector):
    """A rate limit that allows no LC core reduction holds <DOWN,CORE>; the default chain (clamp
    only) applies it. Both envs (scalar and vector) pass actions through the same chain."""
    from env.guards import GuardsConfig, RateLimitConfig
    from env.types import Move

    down_core = 1 + (Move.DOWN_CORE - 1)  # slot 0, single mode
    no_core_decrease = GuardsConfig(rate_limit=RateLimitConfig(max_core_decrease=0.0))
    cores = {}
    for name, guards in (("clamp", GuardsConfig()), ("rate_limit", no_core_decrease)):
        cfg = EnvConfig(max_apps=3, scenario="mix3-const", guards=guards)
        (before, after), caps = _allocations_after(cfg, vector, [down_core])
        app = caps.lc_apps[0].name
        cores[name] = (before[app].cores, after[app].cores)
    assert cores["clamp"][1] < cores["clamp"][0]  # the move was applied
    assert cores["rate_limit"][1] == cores["rate_limit"][0]  # the chain held it


@pytest.mark.parametrize("vector", [False, True])
def test_the_be_dvfs_guard_moves_the_be_frequency_while_the_policy_holds(vector):
    """With `env.guards.be_dvfs` the BE job's frequency follows Heracles' power rule (Alg. 3) in
    training: on mix3-const the socket draws under 90% of its TDP, so HOLD after HOLD it climbs a
    level every 2 s from the nominal start; without the guard it stays where the start put it."""
    from env.guards import BeDvfsConfig, GuardsConfig

    seen = {}
    for name, guards in (("clamp", GuardsConfig()), ("be_dvfs", GuardsConfig(be_dvfs=BeDvfsConfig()))):
        cfg = EnvConfig(max_apps=3, scenario="mix3-const", guards=guards)
        allocs, caps = _allocations_after(cfg, vector, [0] * 6)  # 3 s of HOLDs
        seen[name] = [a["be_parties"].freq_mhz for a in allocs[1:]]
    nominal = caps.nominal_freq_mhz
    assert seen["clamp"] == [nominal] * 6
    assert seen["be_dvfs"][0] == nominal and seen["be_dvfs"][-1] > nominal
