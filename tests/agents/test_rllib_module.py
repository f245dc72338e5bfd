"""The policy network and its RLlib modules (agents.policy, agents.rllib.module), the training
config, domain randomisation and the metrics callback. No Ray session: RLModules are built and run
directly, on observations of the real env."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

from ray.rllib.algorithms.dqn.default_dqn_rl_module import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from agents.policy import MASKED_LOGIT, ColocNet, NetSpec
from agents.rllib.callbacks import episode_summary, tensorboard_scalars
from agents.rllib.config import (
    DomainRandomizationConfig,
    TrainConfig,
    build_train_config,
    load_train_config,
    resolved,
)
from agents.rllib.envs import PerturbedSampler, make_training_env, training_env_config
from agents.rllib.module import ColocDQNModule, ColocPPOModule, net_model_config
from env.config import CONFIGS, ConfigError
from env.features import N_APP_FEATURES, N_NODE_FEATURES
from env.gym_env import EnvConfig
from env.scenario_sampler import SamplerConfig, ScenarioSampler
from env.types import N_MOVES
from env.vector_env import NodeVectorEnv, VectorActionMaskObs
from harness.registry import factory_of

M = 6


def env_batch(mode: str, n: int = 8, steps: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Masked observations of the real vector env after a few random feasible moves."""
    vec = VectorActionMaskObs(
        NodeVectorEnv(n, EnvConfig(max_apps=M, action_mode=mode, episode_intervals=200))
    )
    obs, _ = vec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        mask = obs["action_mask"].reshape(n, -1) > 0.5
        if mode == "single":
            act = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        else:
            act = np.array([[rng.choice(np.flatnonzero(s)) for s in m.reshape(M, N_MOVES)] for m in mask])
        obs, *_ = vec.step(act)
    return obs


def torch_batch(obs: dict[str, np.ndarray]) -> dict:
    return {Columns.OBS: {k: torch.as_tensor(v) for k, v in obs.items()}}


def build(module_cls, mode: str, **extra):
    vec = VectorActionMaskObs(NodeVectorEnv(1, EnvConfig(max_apps=M, action_mode=mode)))
    spec = NetSpec(mode, M, 32, with_value=module_cls is ColocPPOModule)
    return RLModuleSpec(
        module_class=module_cls,
        observation_space=vec.single_observation_space,
        action_space=vec.single_action_space,
        model_config={**net_model_config(spec), **extra},
    ).build()


def random_features(rng: np.random.Generator, present: list[bool]) -> torch.Tensor:
    x = rng.uniform(0.0, 1.0, size=N_APP_FEATURES * M + 14).astype(np.float32)
    for k, p in enumerate(present):
        x[k * N_APP_FEATURES] = 1.0 if p else 0.0
        if not p:
            x[k * N_APP_FEATURES + 1 : (k + 1) * N_APP_FEATURES] = 0.0
    return torch.as_tensor(x)


def permute_slots(x: torch.Tensor, perm: list[int]) -> torch.Tensor:
    apps = x[: N_APP_FEATURES * M].reshape(M, N_APP_FEATURES)[perm]
    return torch.cat([apps.reshape(-1), x[N_APP_FEATURES * M :]])


# ---- the network ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_permuting_the_apps_permutes_their_scores_and_keeps_hold_and_value(mode):
    torch.manual_seed(0)
    net = ColocNet(NetSpec(mode, M, 32)).eval()
    rng = np.random.default_rng(1)
    x = random_features(rng, [True, True, False, True, True, False])
    perm = [3, 0, 5, 1, 2, 4]  # slot k of the permuted input is slot perm[k] of the original
    with torch.no_grad():
        s, sp = net.scores(x[None])[0], net.scores(permute_slots(x, perm)[None])[0]
        v, vp = net.value(x[None]), net.value(permute_slots(x, perm)[None])
    per = N_MOVES if mode == "per_app" else N_MOVES - 1
    off = 0 if mode == "per_app" else 1
    apps, apps_p = s[off:].reshape(M, per), sp[off:].reshape(M, per)
    torch.testing.assert_close(apps_p, apps[perm])
    torch.testing.assert_close(vp, v)
    if mode == "single":
        torch.testing.assert_close(sp[0], s[0])
    assert not torch.allclose(apps[0], apps[1])  # the apps are told apart by their features


def test_padded_slots_do_not_change_what_the_present_apps_see():
    torch.manual_seed(0)
    net = ColocNet(NetSpec("single", M, 32)).eval()
    x = random_features(np.random.default_rng(2), [True, True, True, False, False, False])
    noisy = x.clone()
    noisy[3 * N_APP_FEATURES + 1 : 6 * N_APP_FEATURES] = 0.9  # garbage in padded slots, present = 0
    for k in (3, 4, 5):
        noisy[k * N_APP_FEATURES] = 0.0
    with torch.no_grad():
        a, b = net.scores(x[None])[0], net.scores(noisy[None])[0]
        torch.testing.assert_close(net.value(x[None]), net.value(noisy[None]))
    torch.testing.assert_close(a[: 1 + 10 * 3], b[: 1 + 10 * 3])


def test_more_apps_change_the_context_a_present_app_sees():
    torch.manual_seed(0)
    net = ColocNet(NetSpec("per_app", M, 32)).eval()
    rng = np.random.default_rng(3)
    x1 = random_features(rng, [True, False, False, False, False, False])
    x2 = x1.clone()
    x2[N_APP_FEATURES : 2 * N_APP_FEATURES] = random_features(rng, [True] * M)[:N_APP_FEATURES]
    with torch.no_grad():
        assert not torch.allclose(net.scores(x1[None])[0, :N_MOVES], net.scores(x2[None])[0, :N_MOVES])


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_pressure_mask_offers_more_memory_or_disk_only_to_apps_that_use_most_of_theirs(mode):
    """... and less only to apps that use under half of theirs."""
    from agents.policy import PRESSURE_FRAC, SPARE_FRAC, feasible_mask
    from env.features import APP_FEATURES
    from env.gym_env import ActionCodec
    from env.types import Move

    names = [f.name for f in APP_FEATURES]
    x = random_features(np.random.default_rng(4), [True] * 3 + [False] * 3)
    use = {0: (0.95, 0.2), 1: (0.2, PRESSURE_FRAC), 2: (SPARE_FRAC, SPARE_FRAC)}  # (memory_used, disk_used)
    for slot, (mem, disk) in use.items():
        x[slot * N_APP_FEATURES + names.index("memory_used")] = mem
        x[slot * N_APP_FEATURES + names.index("disk_used")] = disk
    codec = ActionCodec(M, mode)
    got = feasible_mask(NetSpec(mode, M, 32, pressure_mask=True), x[None], torch.ones(1, codec.mask_size))[0]
    assert got.shape == (codec.mask_size,)
    withheld = {(0, Move.UP_DISK), (1, Move.UP_MEM), (2, Move.UP_MEM), (2, Move.UP_DISK)}
    withheld |= {(0, Move.DOWN_MEM), (1, Move.DOWN_DISK), (2, Move.DOWN_MEM), (2, Move.DOWN_DISK)}
    withheld |= {(k, m) for k in range(3, M) for m in (Move.UP_MEM, Move.UP_DISK)}  # padded: use 0
    for slot in range(M):
        for move in Move:
            if move is Move.HOLD and mode == "single":
                continue
            idx = codec.single_index(slot, move) if mode == "single" else slot * N_MOVES + move.value
            assert bool(got[idx]) is ((slot, move) not in withheld), (slot, move)
    if mode == "single":
        assert bool(got[0])  # HOLD
    # the network's own choice respects it, even when a withheld move scores highest
    torch.manual_seed(0)
    net = ColocNet(NetSpec(mode, M, 32, pressure_mask=True)).eval()
    free = ColocNet(NetSpec(mode, M, 32, pressure_mask=False)).eval()
    free.load_state_dict(net.state_dict())
    target = codec.single_index(2, Move.UP_MEM) if mode == "single" else 2 * N_MOVES + Move.UP_MEM.value
    with torch.no_grad():
        for n in (net, free):
            bias = n.app_head[-1].bias
            bias.zero_()
            bias[Move.UP_MEM.value - (mode == "single")] = 50.0  # UP MEM wins in every slot
    env_mask = torch.ones(1, codec.mask_size)
    with torch.no_grad():
        chosen = net.masked_scores(x[None], env_mask).argmax(dim=-1).item()
        assert free.masked_scores(x[None], env_mask)[0, target] > -1e30  # without it: offered
        assert net.masked_scores(x[None], env_mask)[0, target] == MASKED_LOGIT
    assert chosen == (codec.single_index(0, Move.UP_MEM) if mode == "single" else Move.UP_MEM.value)


def _scores_where_one_move_wins(spec, move, x, env_mask):
    """The masked scores of a `spec` network whose app head favours `move` in every slot by 50."""
    torch.manual_seed(0)
    net = ColocNet(spec).eval()
    with torch.no_grad():
        bias = net.app_head[-1].bias
        bias.zero_()
        bias[move.value - (spec.action_mode == "single")] = 50.0
        return net.masked_scores(x[None], env_mask)[0]


def _move_flags(got, codec, slots):
    """(slot, move, offered) for every move of `slots` in the flat feasible mask `got` of `codec`'s
    action layout (single mode has HOLD once, not per slot)."""
    from env.types import Move

    for slot in slots:
        for move in Move:
            if move is Move.HOLD and codec.mode == "single":
                continue
            idx = codec.single_index(slot, move) if codec.mode == "single" else slot * N_MOVES + move.value
            yield slot, move, bool(got[idx])


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_down_slack_min_withholds_every_down_move_of_an_app_at_or_below_it_and_nothing_else(mode):
    """PARTIES Alg. 1 downsizes only apps with slack above 0.2: with `down_slack_min` the network
    is offered no DOWN move of an app whose slack feature is at or below it (a violating app, or one
    near its target), every other move as before; None (policy files written before it) offers all."""
    from agents.policy import feasible_mask
    from env.features import APP_FEATURES
    from env.gym_env import ActionCodec
    from env.types import Direction, Move

    names = [f.name for f in APP_FEATURES]
    x = random_features(np.random.default_rng(5), [True] * 3 + [False] * 3)
    for slot, sl in {0: 0.5, 1: 0.2, 2: -0.3}.items():  # above, at and below the floor
        x[slot * N_APP_FEATURES + names.index("slack")] = sl
    codec = ActionCodec(M, mode)
    env_mask = torch.ones(1, codec.mask_size)
    spec = NetSpec(mode, M, 32, pressure_mask=False, down_slack_min=0.2)
    got = feasible_mask(spec, x[None], env_mask)[0]
    for slot, move, offered in _move_flags(got, codec, range(3)):
        assert offered is not (move.direction is Direction.DOWN and slot != 0), (slot, move)
    unset = NetSpec(mode, M, 32, pressure_mask=False)
    assert unset.down_slack_min is None and torch.equal(feasible_mask(unset, x[None], env_mask), env_mask)
    # with the pressure mask as well: both rules apply
    both = feasible_mask(NetSpec(mode, M, 32, pressure_mask=True, down_slack_min=0.2), x[None], env_mask)[0]
    assert torch.equal(
        both, got * feasible_mask(NetSpec(mode, M, 32, pressure_mask=True), x[None], env_mask)[0]
    )
    # the network's own choice respects it
    chosen = _scores_where_one_move_wins(spec, Move.DOWN_CORE, x, env_mask).argmax().item()
    assert chosen == (codec.single_index(0, Move.DOWN_CORE) if mode == "single" else Move.DOWN_CORE.value)


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_spare_core_util_offers_down_core_below_the_slack_rule_to_an_app_whose_cores_idle(mode):
    """Below `down_slack_min`, `<DOWN,CORE>` alone is offered again to an app whose cores are busy
    less than `spare_core_util` (MongoDB waiting on I/O at its knee, PARTIES Fig. 6 right); not to
    one as close to its target whose cores are busy, nor on a `cpu_util` of 0 (unmeasured)."""
    from agents.policy import feasible_mask
    from env.features import APP_FEATURES
    from env.gym_env import ActionCodec
    from env.types import Direction, Move

    names = [f.name for f in APP_FEATURES]
    x = random_features(np.random.default_rng(6), [True] * 4 + [False] * 2)
    for slot, (sl, util) in {0: (0.1, 0.05), 1: (0.1, 0.5), 2: (0.1, 0.0), 3: (0.5, 0.9)}.items():
        x[slot * N_APP_FEATURES + names.index("slack")] = sl
        x[slot * N_APP_FEATURES + names.index("cpu_util")] = util
    codec = ActionCodec(M, mode)
    env_mask = torch.ones(1, codec.mask_size)
    spec = NetSpec(mode, M, 32, pressure_mask=False, down_slack_min=0.2, spare_core_util=0.15)
    got = feasible_mask(spec, x[None], env_mask)[0]
    for slot, move, offered in _move_flags(got, codec, range(4)):
        down_core_0 = slot == 0 and move is Move.DOWN_CORE
        assert offered is (move.direction is not Direction.DOWN or slot == 3 or down_core_0), (slot, move)
    # without it the slack rule alone: slot 0's DOWN CORE withheld as well
    slack_only = feasible_mask(
        NetSpec(mode, M, 32, pressure_mask=False, down_slack_min=0.2), x[None], env_mask
    )[0]
    core0 = codec.single_index(0, Move.DOWN_CORE) if mode == "single" else Move.DOWN_CORE.value
    assert not slack_only[core0] and int((got != slack_only).sum()) == 1


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_idle_core_util_withholds_up_core_from_an_app_whose_cores_idle(mode):
    """`<UP,CORE>` alone is withheld from an app whose cores are busy less than `idle_core_util`
    (MongoDB waiting on I/O at its knee, PARTIES Sec. 3.4.1); offered at or above it, and on a
    `cpu_util` of 0 (unmeasured, or no request served in the interval); every other move as before.
    The network's own choice respects it."""
    from agents.policy import feasible_mask
    from env.features import APP_FEATURES
    from env.gym_env import ActionCodec
    from env.types import Move

    names = [f.name for f in APP_FEATURES]
    x = random_features(np.random.default_rng(7), [True] * 4 + [False] * 2)
    for slot, util in {0: 0.05, 1: 0.25, 2: 0.0, 3: 0.9}.items():
        x[slot * N_APP_FEATURES + names.index("cpu_util")] = util
    codec = ActionCodec(M, mode)
    env_mask = torch.ones(1, codec.mask_size)
    base = NetSpec(mode, M, 32, pressure_mask=True, down_slack_min=0.2)
    spec = dataclasses.replace(base, idle_core_util=0.25)
    got = feasible_mask(spec, x[None], env_mask)[0]
    without = feasible_mask(base, x[None], env_mask)[0]
    for (slot, move, offered), (_, _, before) in zip(
        _move_flags(got, codec, range(4)), _move_flags(without, codec, range(4)), strict=True
    ):
        withheld = slot == 0 and move is Move.UP_CORE
        assert offered is (before and not withheld), (slot, move)
    up_core_0 = codec.single_index(0, Move.UP_CORE) if mode == "single" else Move.UP_CORE.value
    assert without[up_core_0] and int((got != without).sum()) == 1
    alone = feasible_mask(NetSpec(mode, M, 32, idle_core_util=0.25), x[None], env_mask)[0]
    assert not alone[up_core_0] and int((alone != env_mask[0]).sum()) == 1  # with no other rule on
    scores = _scores_where_one_move_wins(spec, Move.UP_CORE, x, env_mask)
    if mode == "single":  # one move for the node: another app's core, slot 0's is withheld
        assert scores.argmax().item() in {codec.single_index(s, Move.UP_CORE) for s in (1, 2, 3)}
    else:  # one move per app: slot 0 takes its next best, slot 1 its core
        per_slot = scores.reshape(M, N_MOVES).argmax(dim=-1)
        assert per_slot[0].item() != Move.UP_CORE.value and per_slot[1].item() == Move.UP_CORE.value


# ---- RLlib modules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_ppo_module_never_samples_a_masked_move(mode):
    torch.manual_seed(0)
    module = build(ColocPPOModule, mode)
    obs = env_batch(mode)
    mask = obs["action_mask"] > 0.5
    assert (~mask).any(), "the batch should contain infeasible moves"
    out = module.forward_exploration(torch_batch(obs))
    logits = out[Columns.ACTION_DIST_INPUTS]
    assert torch.all(logits[torch.as_tensor(~mask)] == MASKED_LOGIT)
    dist = module.get_exploration_action_dist_cls().from_logits(logits)
    for _ in range(50):
        a = dist.sample().numpy()
        if mode == "single":
            assert mask[np.arange(len(a)), a].all()
        else:
            slots = mask.reshape(len(a), M, N_MOVES)
            assert np.take_along_axis(slots, a[..., None], axis=-1).all()
    greedy = (
        module.get_inference_action_dist_cls()
        .from_logits(module.forward_inference(torch_batch(obs))[Columns.ACTION_DIST_INPUTS])
        .to_deterministic()
        .sample()
    )
    expected = module.net.greedy(torch.as_tensor(obs["observations"]), torch.as_tensor(obs["action_mask"]))
    assert torch.equal(greedy.long(), expected)
    assert torch.isfinite(dist.entropy()).all() and torch.isfinite(dist.logp(dist.sample())).all()


def test_ppo_module_trains_on_masked_logits_and_has_a_value_per_row():
    torch.manual_seed(0)
    module = build(ColocPPOModule, "single")
    batch = torch_batch(env_batch("single", n=4))
    out = module.forward_train(batch)
    values = module.compute_values(batch)
    assert values.shape == (4,) and torch.isfinite(values).all()
    loss = -module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS]).entropy().mean()
    loss.backward()
    assert module.net.app_head[-1].weight.grad is not None


def test_dqn_module_masks_q_values_and_explores_only_feasible_moves():
    torch.manual_seed(0)
    module = build(ColocDQNModule, "single", epsilon=[(0, 1.0), (10, 1.0)], double_q=True)
    obs = env_batch("single")
    mask = obs["action_mask"] > 0.5
    q = module.compute_q_values(torch_batch(obs))[QF_PREDS]
    assert torch.isneginf(q[torch.as_tensor(~mask)]).all() and torch.isfinite(q[torch.as_tensor(mask)]).all()
    for _ in range(20):
        a = module.forward_exploration(torch_batch(obs), t=0)[Columns.ACTIONS].numpy()
        assert mask[np.arange(len(a)), a].all()
    greedy = module.forward_inference(torch_batch(obs))[Columns.ACTIONS]
    assert torch.equal(greedy, q.argmax(dim=-1))
    module.make_target_networks()
    ((main, target),) = module.get_target_network_pairs()
    assert main is module.net and target is not main
    nxt = env_batch("single", seed=1)
    batch = {**torch_batch(obs), Columns.NEXT_OBS: torch_batch(nxt)[Columns.OBS]}
    out = module.forward_train(batch)
    assert out[QF_PREDS].shape == out[QF_NEXT_PREDS].shape == out[QF_TARGET_NEXT_PREDS].shape == q.shape
    assert torch.isneginf(out[QF_TARGET_NEXT_PREDS][torch.as_tensor(nxt["action_mask"] < 0.5)]).all()


def test_dqn_module_refuses_per_app_mode():
    with pytest.raises(ValueError, match="single"):
        build(ColocDQNModule, "per_app", epsilon=0.1)


# ---- config -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((CONFIGS / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_training_config_builds_and_round_trips(path: Path):
    config = load_train_config(path)
    assert build_train_config(resolved(config)) == config


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["ppo.lrr=0.1"], "train.ppo.lrr: unknown key (did you mean 'lr'?)"),
        (["bogus=1"], "train.bogus: unknown key"),
        (["env.max_apps=two"], "train.env.max_apps: expected an integer"),
        (["algo=dqn", "env.action_mode=per_app"], "env.action_mode: single"),
        (["env.scenario=fig9-ramp"], "env.scenario"),
        (["domain_randomization.factors.threads=[1, 2]"], "domain_randomization.factors.threads"),
        (["eval.scenarios=[nope]"], "eval.scenarios"),
        (["ppo.lr"], "expected key=value"),
        (["ppo.imitation_weight=-0.1"], "ppo.imitation_weight must be >= 0"),
        (["ppo.imitation_weight=nan"], "ppo.imitation_weight: expected a number"),
        (["ppo.imitation_weight=0.5"], "needs a warm_start.teacher"),
    ],
)
def test_bad_overrides_name_the_field(overrides, needle):
    with pytest.raises(ConfigError) as e:
        build_train_config({}, overrides)
    assert needle in str(e.value)


def test_overrides_set_nested_fields_and_read_numbers_like_1e_4():
    c = build_train_config(
        {"ppo": {"lr": 0.1}}, ["ppo.lr=1e-4", "env.max_apps=3", "eval.scenarios=[fig9-ramp]"]
    )
    assert c.ppo.lr == pytest.approx(1e-4) and c.env.max_apps == 3 and c.eval.scenarios == ("fig9-ramp",)
    assert c.env.sampler is not None and c.env.sampler.mix_max == 3  # the sampler follows max_apps
    assert TrainConfig().env.sampler is not None and TrainConfig().env.sampler.mix_max == 6


# ---- domain randomisation -----------------------------------------------------------------------------------
def test_perturbed_sampler_draws_factors_in_range_deterministically():
    dr = DomainRandomizationConfig(factors={"service": (0.8, 1.25), "frac_mem": (1.0, 1.0)})
    sampler = PerturbedSampler(ScenarioSampler(SamplerConfig()), dr)
    a = [sampler.sample(np.random.default_rng(7)) for _ in range(2)]
    assert a[0] == a[1]
    seen = []
    for scn in (sampler.sample(np.random.default_rng(s)) for s in range(30)):
        for e in scn.apps:
            assert set(e.perturb) == {"service", "frac_mem"} and e.perturb["frac_mem"] == 1.0
            assert 0.8 <= e.perturb["service"] <= 1.25
            seen.append(e.perturb["service"])
    assert min(seen) < 0.9 and max(seen) > 1.1  # spread over the range


@pytest.mark.parametrize("enabled", [True, False])
def test_training_env_runs_perturbed_profiles_when_enabled(enabled):
    config = build_train_config({}, [f"domain_randomization.enabled={str(enabled).lower()}"])
    env = make_training_env({**training_env_config(config), "num_envs": 2})
    obs, _ = env.reset(seed=3)
    assert set(obs) == {"observations", "action_mask"} and obs["action_mask"].shape == (2, 61)
    for node in env.unwrapped.fleet.nodes:
        perturbs = [e.perturb for e in node.scenario.apps]
        if enabled:
            assert all(set(p) == set(config.domain_randomization.factors) for p in perturbs)
        else:
            assert all(p == {} for p in perturbs)


def test_the_learner_sees_scaled_rewards_and_the_metrics_unscaled_terms():
    config = build_train_config({}, ["reward_scale=0.25"])
    vec = make_training_env({**training_env_config(config), "num_envs": 3})
    vec.reset(seed=4)
    _, reward, *_, info = vec.step(np.zeros(3, dtype=np.int64))
    np.testing.assert_allclose(reward, 0.25 * np.asarray(info["reward_terms"]["reward"]))
    scalar = make_training_env(training_env_config(config))
    scalar.reset(seed=4)
    _, r, *_, info = scalar.step(0)
    assert r == pytest.approx(0.25 * info["reward_terms"]["reward"]) and r != 0


# ---- metrics ------------------------------------------------------------------------------------------------
def test_episode_summary_averages_the_step_infos():
    reset = {"action_mask": None, "scenario": "s"}
    steps = [
        {
            "qos_met": True,
            "moves": "HOLD",
            "infeasible_action": False,
            "reward_terms": {"violation": 0.0, "be_throughput": 0.4, "reclaimed": 0.2},
        },
        {
            "qos_met": False,
            "moves": "a:<UP,CORE> from be",
            "infeasible_action": True,
            "reward_terms": {"violation": 2.0, "be_throughput": 0.2, "reclaimed": 0.4},
        },
    ]
    s = episode_summary([reset, *steps])
    assert s == pytest.approx(
        {
            "qos/met_frac": 0.5,
            "qos/violation_mean": 1.0,
            "be/throughput_mean": 0.3,
            "be/reclaimed_mean": 0.3,
            "train/refused_frac": 0.5,
            "train/hold_frac": 0.5,
        }
    )
    assert episode_summary([reset]) is None


def test_tensorboard_scalars_use_the_fixed_namespaces():
    result = {
        "env_runners": {
            "episode_return_mean": -3.0,
            "num_env_steps_sampled_lifetime": 4096,
            "qos/met_frac": 0.75,
            "be/throughput_mean": 0.3,
            "episode_len_mean": float("nan"),
        },
        "learners": {"default_policy": {"policy_loss": 0.1, "entropy": 2.0}},
    }
    tags = tensorboard_scalars(result)
    assert tags == {
        "train/episode_return_mean": -3.0,
        "train/env_steps": 4096.0,
        "qos/met_frac": 0.75,
        "be/throughput_mean": 0.3,
        "train/policy_loss": 0.1,
        "train/entropy": 2.0,
    }
    assert all(t.split("/")[0] in ("train", "qos", "be") for t in tags)


def test_node_scenarios_are_visible_to_the_tests():
    # guards the assumption of test_training_env_runs_perturbed_profiles_when_enabled
    vec = NodeVectorEnv(1, EnvConfig(max_apps=2))
    vec.reset(seed=0)
    assert dataclasses.is_dataclass(vec.fleet.nodes[0].scenario)


# ---- warm start (imitation) ---------------------------------------------------------------------------------
def _decision_cases():
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    node = SimNode(simple_scenario({"memcached": 0.3, "xapian": 0.2}, seed=0), seed=0)
    obs, caps = node.observe(), node.capabilities()
    return obs, caps


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_teacher_decisions_become_labels_in_the_action_layout(mode):
    from agents.rllib.imitation import label
    from env.gym_env import ActionCodec
    from env.moves import plan_move
    from env.types import Decision, Move

    obs, caps = _decision_cases()
    codec = ActionCodec(4, mode)
    mask = codec.mask(obs, caps)
    hold = 0 if mode == "single" else [0, 0, 0, 0]
    a, ok = label(Decision.hold(), obs, caps, codec, mask)
    assert ok and np.array_equal(a, hold)
    a, ok = label(Decision(obs.allocation, move=Move.UP_CORE, app="xapian"), obs, caps, codec, mask)
    assert ok and np.array_equal(a, hold)  # no change: HOLD
    plan = plan_move(obs, caps, "xapian", Move.UP_CACHE)
    a, ok = label(Decision(plan.allocation, move=Move.UP_CACHE, app="xapian"), obs, caps, codec, mask)
    assert ok and np.array_equal(a, 1 + 10 * 1 + 1 if mode == "single" else [0, Move.UP_CACHE.value, 0, 0])
    from env.moves import adjust_network

    # decoding adds the network partition (outside the ten moves, PARTIES Alg. 1)
    assert codec.decode(a, obs, caps).allocation == adjust_network(obs, plan.allocation, caps)[0]
    a, ok = label(Decision(plan.allocation, reason="no single move"), obs, caps, codec, mask)
    assert not ok and np.array_equal(a, hold)
    # a change outside the ten moves (PARTIES' network adjustment, move HOLD) is a HOLD to imitate
    a, ok = label(Decision(plan.allocation, reason="net", move=Move.HOLD), obs, caps, codec, mask)
    assert ok and np.array_equal(a, hold)
    blocked = mask.copy()
    blocked.reshape(-1)[:] = False
    a, ok = label(Decision(plan.allocation, move=Move.UP_CACHE, app="xapian"), obs, caps, codec, blocked)
    assert not ok and np.array_equal(a, hold)


@pytest.mark.parametrize("mode", ["single", "per_app"])
def test_a_decision_of_several_apps_moves_is_a_per_app_label(mode):
    """`Decision.moves` (a per-app teacher): in per-app mode one label with each app's move at its
    slot, unexpressible when the mask refuses any of them; in single mode never expressible."""
    from agents.rllib.imitation import label
    from env.gym_env import ActionCodec
    from env.moves import plan_moves
    from env.types import Decision, Move

    obs, caps = _decision_cases()
    codec = ActionCodec(4, mode)
    mask = codec.mask(obs, caps)
    moves = (("memcached", Move.UP_FREQ), ("xapian", Move.UP_CACHE))
    alloc, applied, _ = plan_moves(obs, caps, list(moves))
    assert len(applied) == 2
    a, ok = label(Decision(alloc, moves=moves), obs, caps, codec, mask)
    if mode == "single":
        assert not ok and a == 0
        return
    assert ok and a.tolist() == [Move.UP_FREQ.value, Move.UP_CACHE.value, 0, 0]
    assert codec.decode(a, obs, caps).applied == tuple((p.app, p.move, p.counterpart) for p in applied)
    blocked = mask.copy()
    blocked[1, Move.UP_CACHE.value] = False
    a, ok = label(Decision(alloc, moves=moves), obs, caps, codec, blocked)
    assert not ok and a.tolist() == [0, 0, 0, 0]


def test_a_label_accepts_the_teachers_options_only_when_they_begin_with_its_move():
    from agents.rllib.imitation import accepted
    from env.gym_env import ActionCodec
    from env.types import Move

    obs, caps = _decision_cases()
    codec = ActionCodec(4, "single")
    mask = codec.mask(obs, caps)
    a = codec.single_index(1, Move.UP_CACHE)  # xapian's
    opts = (("xapian", Move.UP_CACHE), ("memcached", Move.DOWN_CORE), ("xapian", Move.UP_CORE))
    got = accepted(a, opts, caps, codec, mask)
    want = {a, codec.single_index(0, Move.DOWN_CORE), codec.single_index(1, Move.UP_CORE)}
    assert set(np.flatnonzero(got)) == {i for i in want if mask[i]} | {a} and got.sum() > 1
    assert set(np.flatnonzero(accepted(a, (), caps, codec, mask))) == {a}  # no options: the label
    assert set(np.flatnonzero(accepted(a, opts[1:], caps, codec, mask))) == {a}  # not the teacher's own
    blocked = mask.copy()
    blocked[codec.single_index(1, Move.UP_CORE)] = 0
    assert codec.single_index(1, Move.UP_CORE) not in np.flatnonzero(accepted(a, opts, caps, codec, blocked))
    per_app = ActionCodec(4, "per_app")
    act = np.array([0, Move.UP_CACHE.value, 0, 0])
    flat = accepted(act, opts, caps, per_app, per_app.mask(obs, caps))
    assert flat.reshape(4, N_MOVES).sum(axis=1).tolist() == [1, 1, 1, 1]  # per slot: its label
    assert flat.reshape(4, N_MOVES)[1, Move.UP_CACHE.value]


def test_imitating_options_puts_the_mass_on_what_every_label_accepts():
    """Three labels of one state, each with the teacher's options: A or B, B or C, B alone. The
    options loss (-log P(an accepted action)) learns B, which every label accepts; the teacher's
    own moves alone leave the three about equally likely."""
    from agents.rllib.imitation import Demonstrations, pretrain

    spec = NetSpec("single", 6, 32, with_value=False)
    size = spec.n_actions
    x = np.zeros((300, 6 * N_APP_FEATURES + N_NODE_FEATURES), dtype=np.float32)
    x[:, 0] = 1.0
    masks = np.ones((300, size), dtype=np.float32)
    a_, b_, c_ = 3, 5, 7
    actions = np.tile([a_, c_, b_], 100)
    sets = np.zeros((300, size), dtype=bool)
    sets[0::3, [a_, b_]] = True
    sets[1::3, [b_, c_]] = True
    sets[2::3, b_] = True
    own = np.zeros_like(sets)
    own[np.arange(300), actions] = True
    warm = build_train_config({}, ["warm_start.teacher=parties", "warm_start.epochs=60"]).warm_start
    probs = {}
    for name, acc in (("options", sets), ("teacher", own)):
        demos = Demonstrations(x, masks, actions, np.ones(300, bool), acc, np.zeros(300, np.float32), 0, 1)
        torch.manual_seed(0)
        net = ColocNet(spec)
        stats = pretrain(net, demos, warm, seed=0)
        with torch.no_grad():
            probs[name] = torch.softmax(
                net.masked_scores(torch.as_tensor(x[:1]), torch.as_tensor(masks[:1])), -1
            )[0]
        if name == "options":  # B is accepted by every label and is the teacher's own move in a third
            assert stats.accuracy == stats.move_accuracy == 1.0
            assert stats.own_move_accuracy == pytest.approx(1 / 3)
    assert probs["options"][b_] > 0.9
    assert all(abs(float(probs["teacher"][i]) - 1 / 3) < 0.1 for i in (a_, b_, c_))


def test_the_oracle_guided_teacher_labels_with_its_options_when_asked():
    from agents.rllib.imitation import collect_demonstrations

    got = {}
    for labels in ("options", "teacher"):
        config = build_train_config(
            {},
            [
                "warm_start.teacher=oracle-guided",
                "warm_start.episodes=2",
                "env.sampler.duration_s=[15, 20]",
                "env.sampler.max_apps=3",
                f"warm_start.labels={labels}",
            ],
        )
        got[labels] = collect_demonstrations(
            config, config.warm_start, 0.95, 3, factory_of(config.warm_start.teacher)
        )
    opts, own = got["options"], got["teacher"]
    np.testing.assert_array_equal(opts.actions, own.actions)  # the same teacher, the same moves
    rows = np.arange(len(opts))
    assert np.all(opts.accepted[rows, opts.actions]) and np.all(own.accepted.sum(axis=1) == 1)
    assert (opts.accepted.sum(axis=1) > 1).sum() > 5  # several labels with more than one good move
    assert np.all(opts.masks[opts.accepted] == 1.0)  # every accepted action is feasible


def test_imitation_fits_the_teachers_decisions():
    from agents.rllib.imitation import collect_demonstrations, pretrain

    config = build_train_config(
        {},
        [
            "warm_start.teacher=parties",
            "warm_start.episodes=2",
            "warm_start.epochs=600",
            "warm_start.lr=0.003",
            "env.sampler.duration_s=[15, 20]",
            "model.hidden_units=64",
        ],
    )
    demos = collect_demonstrations(config, config.warm_start, 0.95, 3, factory_of(config.warm_start.teacher))
    assert len(demos) == len(demos.masks) == len(demos.actions) == len(demos.returns) > 40
    assert demos.moves > 0 and demos.episodes == 2
    assert np.all(demos.masks[np.arange(len(demos)), demos.actions] == 1.0)  # labels are feasible
    torch.manual_seed(0)
    net = ColocNet(NetSpec("single", 6, 64))
    with torch.no_grad():
        before = (
            net.greedy(torch.as_tensor(demos.features), torch.as_tensor(demos.masks)).numpy() == demos.actions
        ).mean()
    stats = pretrain(net, demos, config.warm_start, seed=0)
    assert stats.accuracy > before + 0.3 and stats.accuracy > 0.5
    assert stats.value_r2 > 0.5


def _tiny_warm_config(*extra: str):
    return build_train_config(
        {},
        [
            "warm_start.teacher=parties",
            "warm_start.episodes=2",
            "env.sampler.duration_s=[15, 20]",
            "model.hidden_units=32",
            *extra,
        ],
    )


def test_dagger_lets_the_student_drive_while_the_teacher_labels():
    from agents.rllib.imitation import collect_demonstrations
    from env.features import APP_FEATURES, N_APP_FEATURES

    config = _tiny_warm_config()
    hold_only = ColocNet(NetSpec("single", 6, 32)).eval()
    with torch.no_grad():
        hold_only.hold_head.bias.fill_(1e3)  # a student that never moves
    teacher = collect_demonstrations(
        config, config.warm_start, 0.95, 3, factory_of(config.warm_start.teacher)
    )
    student = collect_demonstrations(
        config, config.warm_start, 0.95, 3, factory_of(config.warm_start.teacher), hold_only, student_frac=1.0
    )
    names = [f.name for f in APP_FEATURES]
    changed = [names.index(n) for n in ("d_cores", "d_llc_ways", "d_freq_level", "d_memory", "d_disk")]

    def allocation_changes(d) -> int:
        apps = d.features[:, : 6 * N_APP_FEATURES].reshape(len(d), 6, N_APP_FEATURES)
        return int(np.abs(apps[:, :, changed]).sum())

    assert allocation_changes(teacher) > 0  # the teacher's moves were applied ...
    assert allocation_changes(student) == 0  # ... the student's HOLDs were, the teacher's were not
    assert student.moves > 0  # while the teacher still labelled the states with its moves
    both = teacher + student
    assert len(both) == len(teacher) + len(student) and both.episodes == 4
    np.testing.assert_array_equal(both.actions[len(teacher) :], student.actions)


def test_labels_the_policy_cannot_express_are_not_imitated():
    from agents.rllib.imitation import collect_demonstrations, pretrain

    config = _tiny_warm_config("warm_start.epochs=3")
    demos = collect_demonstrations(config, config.warm_start, 0.95, 3, factory_of(config.warm_start.teacher))
    unexpressible = dataclasses.replace(demos, expressible=np.zeros(len(demos), dtype=bool))
    assert unexpressible.unexpressed == len(demos)
    torch.manual_seed(0)
    net = ColocNet(NetSpec("single", 6, 32, with_value=False))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    pretrain(net, unexpressible, config.warm_start, seed=0)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, before[k])  # nothing to imitate, no critic: no change


def _pid(_task: object) -> int:
    return os.getpid()


def test_the_episode_runner_keeps_each_episode_in_its_own_process_across_rounds():
    from agents.rllib.imitation import EpisodeRunner

    with EpisodeRunner(2) as runner:
        first = runner.run(_pid, range(6), range(6))
        again = runner.run(_pid, range(6), [4, 5, 2, 3, 0, 1])  # the same episodes, another order
    assert first == [again[4], again[5], again[2], again[3], again[0], again[1]]  # episode k: one process
    assert len(set(first)) == 2 and os.getpid() not in first
    with EpisodeRunner(1) as here:
        assert here.run(_pid, range(3), range(3)) == [os.getpid()] * 3  # one worker: this process


def test_the_episode_runner_reports_its_progress_in_the_callers_thread():
    import threading

    from agents.rllib.imitation import EpisodeRunner

    for workers in (1, 2):
        calls: list[tuple[int, int, bool]] = []

        def progress(done: int, total: int, calls: list[tuple[int, int, bool]] = calls) -> None:
            calls.append((done, total, threading.current_thread() is threading.main_thread()))

        with EpisodeRunner(workers) as runner:
            assert len(runner.run(_pid, range(7), range(7), progress)) == 7
            first = len(calls)
            runner.run(_pid, range(7), range(7), progress)  # a second round: every episode has a home
        for round_calls in (calls[:first], calls[first:]):
            done = [d for d, _, _ in round_calls]
            assert done == sorted(set(done)) and done[-1] == 7 and done[0] >= 1  # rising, to the end
            assert all(total == 7 and main for _, total, main in round_calls)
        if workers == 1:
            assert [d for d, _, _ in calls[:first]] == list(range(1, 8))  # one call per episode here


def test_the_warm_starts_progress_lines_are_at_most_one_a_minute_and_the_last():
    from harness.training import episode_progress

    lines: list[str] = []
    progress = episode_progress(lines.append, "DAgger round 1", every_s=3600.0)
    for done in range(1, 101):
        progress(done, 100)
    assert len(lines) == 1 and lines[0].startswith("warm start: 100/100 episodes of DAgger round 1 (")
    lines.clear()
    every = episode_progress(lines.append, "the first round", every_s=0.0)
    for done in (3, 5, 9):
        every(done, 9)
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        "warm start: 3/9 episodes of the first round",
        "warm start: 5/9 episodes of the first round",
        "warm start: 9/9 episodes of the first round",
    ]


def _long_or_short(task: tuple[str, int, int]) -> int:
    """Task 0 is long: it waits (at most 60 s) until the `n` others have each written a line to
    `path`, and returns how many it saw; the others write their line at once."""
    path, index, n = task
    if index > 0:
        with open(path, "a") as f:
            f.write(f"{index}\n")
        return -1
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        with open(path) as f:
            seen = len(f.readlines())
        if seen == n:
            return seen
        time.sleep(0.01)
    return seen


def test_a_long_episode_does_not_hold_up_the_short_ones_behind_it(tmp_path: Path):
    from agents.rllib.imitation import EpisodeRunner

    path = tmp_path / "done"
    path.write_text("")
    with EpisodeRunner(2) as runner:
        seen = runner.run(_long_or_short, [(str(path), i, 5) for i in range(6)], range(6))
        # episode k in process k mod 2 would queue episodes 2 and 4 behind episode 0: it sees 3 of 5
        assert seen[0] == 5
        again = runner.run(_pid, range(6), range(6))  # and each stays in the process that ran it
    assert len(set(again[1:])) == 1 and again[0] not in again[1:]


def _fails_on_two(i: int) -> int:
    if i == 2:
        raise ValueError("episode 2 failed")
    return i


def test_an_episode_that_fails_fails_the_run():
    from agents.rllib.imitation import EpisodeRunner

    for workers in (1, 2):
        with EpisodeRunner(workers) as runner, pytest.raises(ValueError, match="episode 2 failed"):
            runner.run(_fails_on_two, range(8), range(8))
        with EpisodeRunner(workers) as runner, pytest.raises(ValueError, match="2 tasks but 3 keys"):
            runner.run(_fails_on_two, range(2), range(3))


def _fails_or_sleeps(task: tuple[str, int]) -> int:
    """Task 0 fails at once; any other writes its process id to `path` and sleeps a minute."""
    path, index = task
    if index == 0:
        time.sleep(0.5)  # the other task has started by then
        raise ValueError("episode 0 failed")
    Path(path).write_text(str(os.getpid()))
    time.sleep(60.0)
    return index


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pids: list[int], within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_leaving_the_episode_runner_by_an_exception_kills_the_episodes_in_progress(tmp_path: Path):
    from agents.rllib.imitation import EpisodeRunner

    path = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="episode 0 failed"), EpisodeRunner(2) as runner:
        runner.run(_fails_or_sleeps, [(str(path), 0), (str(path), 1)], [0, 1])
    assert time.monotonic() - t0 < 45.0  # it did not wait for the minute-long episode
    assert _gone([int(path.read_text())])


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_episode_runners_processes_die_with_the_driver(tmp_path: Path):
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from agents.rllib.imitation import EpisodeRunner\n"
        "if __name__ == '__main__':\n"
        "    with EpisodeRunner(2) as runner:\n"
        "        runner.run(time.sleep, [60.0, 60.0], [0, 1])\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60.0
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:  # its two pools' processes (and a tracker)
            time.sleep(0.2)
            workers = [
                int(d.name)
                for d in Path("/proc").iterdir()
                if d.name.isdigit()
                and _alive(int(d.name))
                and f"PPid:\t{driver.pid}\n" in (d / "status").read_text()
                and "spawn_main" in (d / "cmdline").read_text()
            ]
        assert len(workers) >= 2
    finally:
        driver.send_signal(signal.SIGKILL)  # no `with` exit, no shutdown: killed outright
        driver.wait()
    assert _gone(workers)


def test_a_dagger_round_on_the_same_episodes_replays_the_teachers_mixes_and_traces():
    from agents.rllib.imitation import EpisodeRunner, collect_demonstrations

    config = _tiny_warm_config("warm_start.workers=2")
    make = factory_of(config.warm_start.teacher)
    student = ColocNet(NetSpec("single", 6, 32)).eval()
    with EpisodeRunner(2) as runner:
        teacher = collect_demonstrations(config, config.warm_start, 0.95, 3, make, runner=runner)
        same = collect_demonstrations(config, config.warm_start, 0.95, 3, make, student, 1.0, runner=runner)
        new = collect_demonstrations(
            config, config.warm_start, 0.95, 1_003, make, student, 1.0, runner=runner
        )
    assert len(same) == len(teacher)  # the same episodes (an episode's length is its scenario's)
    np.testing.assert_array_equal(teacher.features[0], same.features[0])  # its first observation
    assert not np.array_equal(teacher.features, same.features)  # the student's states on it
    assert not np.array_equal(teacher.features[0], new.features[0])  # fresh episodes


def test_parallel_teacher_episodes_give_the_labels_one_process_gives():
    from agents.rllib.imitation import collect_demonstrations

    one = _tiny_warm_config()
    two = _tiny_warm_config("warm_start.workers=2")
    a = collect_demonstrations(one, one.warm_start, 0.95, 3, factory_of(one.warm_start.teacher))
    b = collect_demonstrations(two, two.warm_start, 0.95, 3, factory_of(two.warm_start.teacher))
    assert a.moves == b.moves > 0 and a.episodes == b.episodes == 2
    for x, y in zip(
        (a.features, a.masks, a.actions, a.expressible, a.accepted, a.returns),
        (b.features, b.masks, b.actions, b.expressible, b.accepted, b.returns),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
