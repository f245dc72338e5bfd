"""PPO's learner with the warm start's imitation loss beside its own (agents.rllib.learner). The
learner is built directly from a run's algorithm config, no Ray session; PPO's own loss is
replaced by a constant, so what is left is the imitation term."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from agents.rllib.algos import build_algo_config
from agents.rllib.config import build_train_config
from agents.rllib.imitation import imitation_loss
from agents.rllib.learner import (
    ColocPPOLearner,
    load_demonstrations,
    save_demonstrations,
)
from env.gym_env import EnvConfig
from env.vector_env import NodeVectorEnv, VectorActionMaskObs

PPO_LOSS = 7.0


def _learner(weight: float):
    config = build_train_config(
        {},
        [
            "warm_start.teacher=parties",
            f"ppo.imitation_weight={weight}",
            "ppo.minibatch_size=32",
            "ppo.train_batch_size=64",
            "model.hidden_units=16",
        ],
    )
    env = VectorActionMaskObs(NodeVectorEnv(1, EnvConfig(max_apps=config.env.max_apps)))
    spaces = {"default_policy": (env.single_observation_space, env.single_action_space)}
    learner = build_algo_config(config).build_learner(spaces=spaces)
    return learner, env


def _labels(learner, env, n: int = 200, seed: int = 0):
    """Observations of the real env after random moves, each labelled with the first move the
    network may take there after HOLD (a rule of the mask, learnable; the warm start labels only
    moves the network may take: `agents.rllib.imitation.label`)."""
    net = learner.module["default_policy"].unwrapped().net
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    xs, ms, oks = [], [], []
    for _ in range(n):
        x = torch.as_tensor(obs["observations"])
        mask = net.feasible(x, torch.as_tensor(obs["action_mask"])).numpy().reshape(-1) > 0.5
        ok = np.zeros_like(mask)
        ok[np.flatnonzero(mask)[1] if mask.sum() > 1 else 0] = True
        xs.append(obs["observations"][0])
        ms.append(mask.astype(np.float32))
        oks.append(ok)
        obs, *_ = env.step(np.array([rng.choice(np.flatnonzero(mask))]))
    return np.stack(xs), np.stack(ms), np.stack(oks)


@pytest.fixture
def ppo_loss_constant(monkeypatch):
    monkeypatch.setattr(PPOTorchLearner, "compute_loss_for_module", lambda self, **kw: torch.tensor(PPO_LOSS))


def _loss(learner) -> torch.Tensor:
    return learner.compute_loss_for_module(
        module_id="default_policy", config=learner.config, batch={}, fwd_out={}
    )


def test_the_learner_adds_the_weighted_imitation_loss_of_a_minibatch_of_labels(ppo_loss_constant):
    learner, env = _learner(0.5)
    assert isinstance(learner, ColocPPOLearner)
    x, m, ok = _labels(learner, env)
    assert float(_loss(learner)) == PPO_LOSS  # no labels yet: PPO alone
    assert learner.set_demonstrations(x, m, ok) == len(x)
    net = learner.module["default_policy"].unwrapped().net
    gen = torch.Generator().manual_seed(0)  # the run's seed (TrainConfig.seed)
    idx = torch.randint(len(x), (32,), generator=gen)
    expect = imitation_loss(
        net, torch.as_tensor(x[idx]), torch.as_tensor(m[idx]), torch.as_tensor(ok[idx]), torch.ones(32)
    )
    loss = _loss(learner)
    assert float(loss.detach()) == pytest.approx(PPO_LOSS + 0.5 * float(expect.detach()), rel=1e-6)
    loss.backward()  # the term reaches the policy's weights
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in net.parameters())


def test_minimising_the_term_makes_the_labels_likelier(ppo_loss_constant):
    learner, env = _learner(1.0)
    x, m, ok = _labels(learner, env)
    learner.set_demonstrations(x, m, ok)
    net = learner.module["default_policy"].unwrapped().net
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    everything = torch.ones(len(x))
    xt, mt, okt = torch.as_tensor(x), torch.as_tensor(m), torch.as_tensor(ok)
    with torch.no_grad():
        before = float(imitation_loss(net, xt, mt, okt, everything))
    for _ in range(60):
        opt.zero_grad()
        _loss(learner).backward()
        opt.step()
    with torch.no_grad():
        after = float(imitation_loss(net, xt, mt, okt, everything))
    assert after < 0.7 * before, (before, after)


def test_a_weight_of_zero_leaves_ppo_alone():
    learner, _ = _learner(0.0)
    assert not isinstance(learner, ColocPPOLearner)  # RLlib's own PPO learner


def test_demonstrations_round_trip_through_their_file_and_bad_ones_are_refused(tmp_path):
    learner, env = _learner(1.0)
    x, m, ok = _labels(learner, env, n=20)
    path = tmp_path / "demos.npz"
    save_demonstrations(path, x, m, ok)
    back = load_demonstrations(path)
    for a, b in zip((x, m, ok), back, strict=True):
        np.testing.assert_array_equal(a, b)
    np.savez(tmp_path / "other.npz", features=x)
    with pytest.raises(ValueError, match="not a demonstrations file"):
        load_demonstrations(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="equal lengths"):
        learner.set_demonstrations(x, m[:5], ok)
