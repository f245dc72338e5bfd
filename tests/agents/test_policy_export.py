"""Serving a policy without Ray (agents.policy): the export file, its checks on load, the
`rl:PATH` controller - and, with a Ray session, that the exported module picks the same actions as
RLlib's own inference on the same observations."""

from __future__ import annotations

import builtins
import dataclasses
import io
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from agents.policy import (
    DOWNSIZE_BAN_S,
    FAILED_DOWNSIZE_SLACK,
    LAST_POLICY_FILE,
    POLICY_FILE,
    ColocNet,
    GreedyArrays,
    LoadedPolicy,
    NetSpec,
    PolicyMeta,
    RlController,
    average_policies,
    export_policy,
    feature_layout,
    load_policy,
    make,
    policy_summary,
)
from env.config import ConfigError
from env.controller import ControllerContext
from env.features import N_APP_FEATURES, N_NODE_FEATURES, FeatureConfig, ObservationEncoder
from env.gym_env import ActionCodec
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Decision, Move, validate_allocation
from harness import registry

THREE = {"memcached": 0.5, "xapian": 0.4, "nginx": 0.5}


def sharpen(net: ColocNet) -> ColocNet:
    """`net` with its weights x3 and biases x20, in place: scores of a visible size, so that the
    greedy action varies with the input (a fresh or briefly trained network's scores are ~0 and
    its argmax is the same for every observation)."""
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(20.0 if p.dim() == 1 else 3.0)
    return net


def saved_policy(
    tmp_path: Path, mode: str = "single", max_apps: int = 6, seed: int = 0, never_hold: bool = False
) -> Path:
    """A sharpened random policy; `never_hold` scores HOLD far below every move, so that each
    decision moves (a random network may hold on every observation of a short run)."""
    torch.manual_seed(seed)
    spec = NetSpec(mode, max_apps, 32)
    net = sharpen(ColocNet(spec))
    if never_hold:
        with torch.no_grad():
            if net.hold_head is not None:
                net.hold_head.bias.fill_(-1e3)
            else:  # per-app mode: HOLD is each slot's first logit
                net.app_head[-1].bias[0] = -1e3
    return export_policy(
        tmp_path / f"{mode}-{max_apps}.pt",
        net,
        PolicyMeta(spec, FeatureConfig(), feature_layout(), "ppo", 7, 1000),
    )


def node_and_controller(path: Path, loads=THREE, seed: int = 0):
    scn = simple_scenario(loads, duration_s=60.0, warmup_s=5.0, seed=seed)
    node = SimNode(scn, seed=seed)
    ctrl = make(ControllerContext(node.capabilities(), scn, node, seed), str(path))
    ctrl.reset(node.capabilities(), np.random.default_rng(seed))
    return node, ctrl


# ---- the export file -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_export_round_trips_weights_and_metadata(tmp_path, mode):
    path = saved_policy(tmp_path, mode)
    policy = load_policy(path)
    assert policy.meta.net == NetSpec(mode, 6, 32) and policy.meta.trained_iterations == 7
    torch.manual_seed(0)
    again = sharpen(ColocNet(NetSpec(mode, 6, 32)))
    x = torch.rand(5, ObservationEncoder(6).size)
    torch.testing.assert_close(policy.net.scores(x), again.scores(x))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def _policy_of(tmp_path: Path, name: str, seed: int, iterations: int, hidden_units: int = 32) -> Path:
    torch.manual_seed(seed)
    spec = NetSpec("single", 6, hidden_units)
    meta = PolicyMeta(spec, FeatureConfig(), feature_layout(), "ppo", iterations, 1000 * iterations)
    return export_policy(tmp_path / name, ColocNet(spec), meta)


def test_an_average_of_policies_holds_the_mean_of_their_weights_and_names_them(tmp_path):
    paths = [_policy_of(tmp_path, f"p{i}.pt", seed=i, iterations=it) for i, it in enumerate((30, 10, 20))]
    out = average_policies(paths, tmp_path / "avg.pt")
    avg = load_policy(out)
    states = [load_policy(p).net.state_dict() for p in paths]
    for name, w in avg.net.state_dict().items():
        torch.testing.assert_close(w, (states[0][name] + states[1][name] + states[2][name]) / 3)
    assert not torch.equal(avg.net.state_dict()["hold_head.weight"], states[0]["hold_head.weight"])
    # the metadata is the latest network's, with every averaged iteration
    assert avg.meta.trained_iterations == 30 and avg.meta.trained_env_steps == 30_000
    assert avg.meta.averaged_iterations == (10, 20, 30)
    assert "the mean of the networks of iterations 10, 20, 30" in policy_summary(avg)
    # an average of one is that network; an average of averages names every iteration once
    one = load_policy(average_policies(paths[:1], tmp_path / "one.pt"))
    torch.testing.assert_close(one.net.state_dict(), states[0])
    assert one.meta.averaged_iterations == () and "mean" not in policy_summary(one)
    again = average_policies(
        [out, _policy_of(tmp_path, "p3.pt", seed=3, iterations=40)], tmp_path / "again.pt"
    )
    assert load_policy(again).meta.averaged_iterations == (10, 20, 30, 40)
    # a single network's file records no average
    assert load_policy(paths[0]).meta.averaged_iterations == ()


def test_policies_of_different_networks_are_not_averaged(tmp_path):
    a = _policy_of(tmp_path, "a.pt", seed=0, iterations=1)
    b = _policy_of(tmp_path, "b.pt", seed=1, iterations=2, hidden_units=16)
    with pytest.raises(ValueError, match="not networks of one training run"):
        average_policies([a, b], tmp_path / "avg.pt")
    with pytest.raises(ValueError, match="at least one"):
        average_policies([], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


def test_a_run_directory_resolves_to_its_policy(tmp_path):
    path = saved_policy(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    path.rename(run / POLICY_FILE)
    assert load_policy(run).path == run / POLICY_FILE


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("missing", "no trained policy here"),
        ("empty_dir", "no trained policy here"),
        ("garbage", "not a readable policy file"),
        ("truncated", "not a readable policy file"),
        ("other_format", "not a coloc policy file"),
        ("other_version", "policy file version"),
        ("other_features", "another observation layout"),
        ("bad_weights", "weights do not match"),
        ("nan_weights", "are not finite"),
        ("million_slots", "max_apps must be in 1..64"),
    ],
)
def test_a_bad_policy_file_is_a_config_error(tmp_path, damage, needle):
    good = saved_policy(tmp_path)
    payload = torch.load(good, weights_only=True)
    target = tmp_path / "bad.pt"
    if damage == "missing":
        target = tmp_path / "nope.pt"
    elif damage == "empty_dir":
        target = tmp_path / "empty"
        target.mkdir()
    elif damage == "garbage":
        target.write_bytes(b"not a torch file at all")
    elif damage == "truncated":
        target.write_bytes(good.read_bytes()[:200])
    else:
        if damage == "other_format":
            payload["format"] = "something-else"
        elif damage == "other_version":
            payload["version"] = 99
        elif damage == "other_features":
            payload["meta"]["feature_layout"] = payload["meta"]["feature_layout"][:-1]
        elif damage == "bad_weights":
            payload["meta"]["net"]["hidden_units"] = 16
        elif damage == "nan_weights":
            first = next(iter(payload["state_dict"]))
            payload["state_dict"][first].view(-1)[0] = float("nan")
        elif damage == "million_slots":
            payload["meta"]["net"]["max_apps"] = 1_000_000
        buf = io.BytesIO()
        torch.save(payload, buf)
        target.write_bytes(buf.getvalue())
    with pytest.raises(ConfigError, match=needle):
        load_policy(target)


def test_a_policy_of_another_action_layout_or_max_apps_is_refused_when_one_is_expected(tmp_path):
    path = saved_policy(tmp_path, "per_app", 4)
    with pytest.raises(ConfigError, match=r"action_mode='per_app'.*another action layout"):
        load_policy(path, expect_mode="single")
    with pytest.raises(ConfigError, match="max_apps=4"):
        load_policy(path, expect_max_apps=6)
    assert load_policy(path, expect_mode="per_app", expect_max_apps=4).meta.net.max_apps == 4


# ---- the controller ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_controller_acts_like_the_network_and_only_plans_feasible_moves(tmp_path, mode):
    path = saved_policy(tmp_path, mode, never_hold=True)
    node, ctrl = node_and_controller(path)
    assert isinstance(ctrl, RlController)
    caps = node.capabilities()
    codec = ActionCodec(6, mode)
    moved = 0
    previous = None  # the controller keeps the observation before, for the history features
    for _ in range(40):
        obs = node.observe()
        with (
            mock.patch.object(builtins, "open", side_effect=AssertionError("decide() opened a file")),
            mock.patch.object(time, "sleep", side_effect=AssertionError("decide() slept")),
        ):
            d = ctrl.decide(obs)
        assert isinstance(d, Decision)
        x = ctrl.encoder.encode(obs, caps, previous=previous)
        previous = obs
        mask = codec.mask(obs, caps, no_down=ctrl.no_down)  # its own ban (PARTIES Sec. 4.3), below
        with torch.no_grad():
            action = ctrl.policy.net.greedy(torch.as_tensor(x)[None], torch.as_tensor(mask.reshape(1, -1)))[
                0
            ].numpy()
        expected = codec.decode(action, obs, caps)
        assert not expected.rejected  # the mask keeps the policy to feasible moves
        if expected.applied:
            moved += 1
            assert d.allocation == expected.allocation
            validate_allocation(d.allocation, caps)
            if len(expected.applied) == 1:
                assert (d.app, d.move) == expected.applied[0][:2]
        else:
            assert d.allocation is None
        node.step(d.allocation)
    assert moved > 0


@pytest.mark.parametrize("mode", ["single", "per_app"])
@pytest.mark.parametrize("max_apps", [1, 3, 6])
@pytest.mark.parametrize(
    "masks",
    [
        (False, None, None, None),
        (True, None, None, None),
        (False, 0.2, None, None),
        (True, 0.2, None, None),
        (True, 0.2, 0.15, None),
        (False, None, None, 0.25),
        (True, 0.2, 0.15, 0.25),
    ],
)
def test_the_numpy_path_scores_and_picks_as_the_network_does(mode, max_apps, masks):
    """`GreedyArrays` (what `LoadedPolicy.act` runs) against `ColocNet` on random inputs: occupied
    and padded slots, random action masks, usage and slack on both sides of the withholding rules."""
    pressure, down_slack_min, spare_core_util, idle_core_util = masks
    spec = NetSpec(
        mode,
        max_apps,
        32,
        pressure_mask=pressure,
        down_slack_min=down_slack_min,
        spare_core_util=spare_core_util,
        idle_core_util=idle_core_util,
    )
    torch.manual_seed(max_apps)
    net = sharpen(ColocNet(spec)).eval()
    arrays = GreedyArrays(net)
    rng = np.random.default_rng(max_apps)
    size = ObservationEncoder(max_apps).size
    n_app = size - N_NODE_FEATURES
    withheld = 0
    for _ in range(150):
        x = rng.uniform(-1.0, 1.5, size).astype(np.float32)
        x[0:n_app:N_APP_FEATURES] = rng.integers(0, 2, max_apps)  # the `present` feature
        mask = (rng.uniform(size=spec.n_actions) < 0.7).astype(np.float32)
        xt, mt = torch.as_tensor(x)[None], torch.as_tensor(mask)[None]
        with torch.inference_mode():
            scores, action = net.scores(xt)[0].numpy(), net.greedy(xt, mt)[0].numpy()
            feasible = net.feasible(xt, mt)[0].numpy() > 0.5
        np.testing.assert_allclose(arrays.scores(x), scores, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(arrays.feasible(x, mask), feasible)
        np.testing.assert_array_equal(arrays.greedy(x, mask), action)
        withheld += int((feasible < (mask > 0.5)).sum())
    rules_on = pressure or down_slack_min is not None or idle_core_util is not None
    assert (withheld > 0) == rules_on  # the rules were exercised


def test_the_numpy_path_follows_weights_loaded_into_the_network():
    spec = NetSpec("single", 6, 32)
    torch.manual_seed(0)
    net = sharpen(ColocNet(spec)).eval()
    arrays = GreedyArrays(net)
    torch.manual_seed(1)
    net.load_state_dict(sharpen(ColocNet(spec)).state_dict())  # in place, as the RLlib test does
    x = np.random.default_rng(0).uniform(0.0, 1.0, ObservationEncoder(6).size).astype(np.float32)
    with torch.inference_mode():
        np.testing.assert_allclose(
            arrays.scores(x), net.scores(torch.as_tensor(x)[None])[0].numpy(), rtol=1e-5, atol=1e-4
        )


def test_after_a_failed_downsize_the_controller_offers_that_app_no_downsize_for_the_ban(tmp_path):
    """PARTIES Sec. 4.3: "downsizing an application is disabled for 30s once an incorrect downsize
    action was reverted" (`DOWNSIZE_BAN_S`: 10 s, the authors' code's). A policy that always takes a
    core from memcached when it may: once a take leaves memcached below 0.05 slack the next interval,
    it is offered no DOWN move for the ban's length of node time, then again."""
    loads = {"memcached": 0.9, "xapian": 0.4, "nginx": 0.5}
    node, ctrl = node_and_controller(saved_policy(tmp_path), loads=loads)
    assert isinstance(ctrl, RlController)
    down = ctrl.codec.single_index(0, Move.DOWN_CORE)  # memcached is slot 0

    def act(x, mask):
        return down if mask[down] else 0

    trace = []  # (time, memcached's slack, banned at this decision, took a core)
    with mock.patch.object(LoadedPolicy, "act", side_effect=act):
        for _ in range(240):
            obs = node.observe()
            d = ctrl.decide(obs)
            took = d.app == "memcached" and d.move is Move.DOWN_CORE
            trace.append((obs.time_s, obs.apps[0].slack, "memcached" in ctrl.no_down, took))
            node.step(d.allocation)
    failed = [i for i in range(len(trace) - 1) if trace[i][3] and trace[i + 1][1] < FAILED_DOWNSIZE_SLACK]
    assert failed, "no downsize failed: the test needs one"
    t_fail = trace[failed[0] + 1][0]
    during = [r for r in trace if t_fail <= r[0] < t_fail + DOWNSIZE_BAN_S]
    assert during and all(r[2] and not r[3] for r in during), during
    after = [r for r in trace if r[0] >= t_fail + DOWNSIZE_BAN_S]
    assert after and not after[0][2], after[:1]  # the ban ends: no downsize could fail during it


def test_controller_refuses_a_node_with_more_apps_than_the_policy_holds(tmp_path):
    path = saved_policy(tmp_path, "single", 2)
    with pytest.raises(ConfigError, match="max_apps=2"):
        node_and_controller(path)


def test_controller_holds_on_an_invalid_observation(tmp_path):
    node, ctrl = node_and_controller(saved_policy(tmp_path))
    obs = node.observe()
    bad = dataclasses.replace(obs, apps=(dataclasses.replace(obs.apps[0], valid=False), *obs.apps[1:]))
    assert ctrl.decide(bad).allocation is None


def test_factory_needs_a_path(tmp_path):
    scn = simple_scenario(THREE)
    node = SimNode(scn)
    with pytest.raises(ConfigError, match="rl:PATH"):
        make(ControllerContext(node.capabilities(), scn, node, 0), None)
    with pytest.raises(ConfigError, match="no trained policy"):
        make(ControllerContext(node.capabilities(), scn, node, 0), str(tmp_path / "missing"))


def test_the_rl_spec_resolves_through_the_registry(tmp_path):
    path = saved_policy(tmp_path)
    scn = simple_scenario(THREE)
    node = SimNode(scn)
    ctrl = registry.make_controller(f"rl:{path}", ControllerContext(node.capabilities(), scn, node, 0))
    assert isinstance(ctrl, RlController)
    with pytest.raises(ConfigError, match="needs an argument"):
        registry.parse_spec("rl")


# ---- RLlib's inference vs the exported module (needs Ray) ---------------------------------------------------
TINY = [
    "iterations=1",
    "checkpoint_every=1",
    "model.hidden_units=32",
    "env.sampler.duration_s=[10, 20]",
    "ppo.train_batch_size=128",
    "ppo.minibatch_size=64",
    "ppo.num_epochs=1",
    "dqn.train_batch_size=32",
    "dqn.learning_starts=32",
    "dqn.replay_capacity=2000",
    "resources.num_env_runners=0",
    "resources.num_envs_per_env_runner=2",
    "eval.enabled=false",
]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(("algo", "mode"), [("ppo", "single"), ("ppo", "per_app"), ("dqn", "single")])
def test_exported_module_picks_the_actions_of_rllib_inference(ray_session, tmp_path, algo, mode):
    from ray.rllib.core.rl_module.rl_module import RLModule

    from agents.rllib.config import build_train_config
    from agents.rllib.runtime import checkpoints_in
    from harness.training import RunOptions, train

    config = build_train_config({}, [f"algo={algo}", f"env.action_mode={mode}", *TINY])
    out = train(config, RunOptions(out=tmp_path / "run", log=io.StringIO()))
    ckpt = checkpoints_in(out.out)[-1]
    rllib_module = RLModule.from_checkpoint(
        ckpt / "learner_group" / "learner" / "rl_module" / "default_policy"
    )
    exported = load_policy(out.out / LAST_POLICY_FILE, expect_mode=mode, expect_max_apps=6)
    # the last checkpoint's export holds exactly the weights of its RLModule
    trained = rllib_module.net.state_dict()
    assert trained.keys() == exported.net.state_dict().keys()
    for k, v in exported.net.state_dict().items():
        torch.testing.assert_close(v, trained[k], rtol=0, atol=0)
    # then both compute the same actions: with the trained weights (after one iteration they may
    # pick one action everywhere: DQN's Q-values are all negative and HOLD's the least so), and
    # with the same random, sharpened weights loaded into both, so that many actions are compared
    compared, _ = compare_actions(rllib_module, exported, mode)
    assert compared == 48
    # (a random draw may still score one action highest everywhere: the first of a few that does not)
    for seed in range(1, 6):
        torch.manual_seed(seed)
        varied = sharpen(ColocNet(exported.meta.net)).state_dict()
        rllib_module.net.load_state_dict(varied)
        exported.net.load_state_dict(varied)
        compared, seen = compare_actions(rllib_module, exported, mode)
        assert compared == 48
        if len(seen) > 1:
            break
    assert len(seen) > 1  # a real comparison: not one action for every observation


def compare_actions(rllib_module, exported, mode: str) -> tuple[int, set[str]]:
    """Assert that the exported policy (`LoadedPolicy.act` and `RlController`) picks RLlib's own
    inference action on 48 observations of the real env (6 nodes x 8 steps, several mixes and
    states); returns how many were compared and the distinct actions seen."""
    from ray.rllib.core.columns import Columns

    from env.gym_env import EnvConfig
    from env.vector_env import NodeVectorEnv, VectorActionMaskObs

    vec = VectorActionMaskObs(
        NodeVectorEnv(6, EnvConfig(max_apps=6, action_mode=mode, episode_intervals=100))
    )
    obs, _ = vec.reset(seed=11)
    rng = np.random.default_rng(0)
    compared, seen = 0, set()
    ctrls = [RlController(exported) for _ in range(vec.num_envs)]  # one per node: history features
    for i, ctrl in enumerate(ctrls):
        ctrl.reset(vec.unwrapped.capabilities(i), np.random.default_rng(0))
    for _ in range(8):  # shorter than an episode: no sub-env resets
        batch = {Columns.OBS: {k: torch.as_tensor(v) for k, v in obs.items()}}
        with torch.no_grad():
            fwd = rllib_module.forward_inference(batch)
        if Columns.ACTIONS in fwd:  # DQN: greedy actions
            rllib_actions = fwd[Columns.ACTIONS].numpy()
        else:  # PPO: the deterministic version of the action distribution
            dist = rllib_module.get_inference_action_dist_cls().from_logits(fwd[Columns.ACTION_DIST_INPUTS])
            rllib_actions = dist.to_deterministic().sample().numpy()
        for i in range(vec.num_envs):
            mine = exported.act(obs["observations"][i], obs["action_mask"][i])
            np.testing.assert_array_equal(mine, rllib_actions[i])
            # and the controller, from the raw observation, applies exactly that action
            raw, caps = vec.unwrapped.observations()[i], vec.unwrapped.capabilities(i)
            expected = vec.unwrapped.codec.decode(rllib_actions[i], raw, caps)
            # a move, or the network partition
            changed = expected.applied or expected.allocation != raw.allocation
            decided = ctrls[i].decide(raw).allocation
            if ctrls[i].no_down:  # its own downsize ban (PARTIES Sec. 4.3): the env's mask less those DOWNs
                banned = vec.unwrapped.codec.mask(raw, caps, no_down=ctrls[i].no_down)
                expected = vec.unwrapped.codec.decode(exported.act(obs["observations"][i], banned), raw, caps)
                changed = expected.applied or expected.allocation != raw.allocation
            assert decided == (expected.allocation if changed else None)
            compared += 1
            seen.add(str(rllib_actions[i]))
        random = rng.integers(0, 2, size=vec.num_envs)  # move on with a mix of HOLD and policy actions
        obs, *_ = vec.step(np.where(random[:, None] if mode == "per_app" else random, rllib_actions, 0))
    vec.close()
    return compared, seen


def test_the_guard_chain_it_was_trained_under_is_recorded(tmp_path):
    from env.guards import CooldownConfig, GuardsConfig

    trained = GuardsConfig(cooldown=CooldownConfig(after_violation_s=3.0))
    net = ColocNet(NetSpec("single", 3, 32))
    path = export_policy(
        tmp_path / "p.pt", net, PolicyMeta(net.spec, FeatureConfig(), feature_layout(), guards=trained)
    )
    assert load_policy(path).meta.guards == trained
    unrecorded = export_policy(
        tmp_path / "q.pt", net, PolicyMeta(net.spec, FeatureConfig(), feature_layout())
    )
    assert load_policy(unrecorded).meta.guards is None
