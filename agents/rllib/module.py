"""RLlib RLModules (new API stack) around `agents.policy.ColocNet`.

Both modules read the env's Dict observation {"observations": features, "action_mask": 0/1}
(`env.gym_env.ActionMaskObs` / `env.vector_env.VectorActionMaskObs`) and hold the network as
`self.net`, so its `state_dict` is exactly what `agents.policy.export_policy` saves and
`RlController` serves without Ray. `model_config` is `net_model_config(NetSpec)`: every field of
`NetSpec` but `with_value` (`NET_KEYS`: the action layout, the width and the withholding rules),
plus what RLlib adds, e.g. DQN's `epsilon`.

* `ColocPPOModule` (PPO, `single` and `per_app`): masked logits as `ACTION_DIST_INPUTS`
  (Categorical, or a MultiCategorical of `max_apps` x 11 in per-app mode) and the critic's value
  (`ValueFunctionAPI`).
* `ColocDQNModule` (DQN, `single`): masked Q-values (`-inf` on infeasible moves, which RLlib's
  DQN learner expects), a target network (`TargetNetworkAPI`), greedy inference and
  epsilon-greedy exploration over the feasible moves only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from ray.rllib.algorithms.dqn.default_dqn_rl_module import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchMultiCategorical
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI, ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.schedules.scheduler import Scheduler

from agents.policy import ColocNet, NetSpec
from env.types import N_MOVES

# every field of NetSpec but `with_value`, which follows the module class (PPO's has a critic)
NET_KEYS = tuple(f.name for f in dataclasses.fields(NetSpec) if f.name != "with_value")


def net_model_config(spec: NetSpec) -> dict[str, Any]:
    """The RLModule `model_config` that builds `spec`'s network."""
    return {k: getattr(spec, k) for k in NET_KEYS}


def _config(module: TorchRLModule) -> dict[str, Any]:
    """The module's `model_config`: always the dict of `net_model_config` here (RLlib also allows
    its `DefaultModelConfig`, which these modules do not read)."""
    cfg = module.model_config
    if not isinstance(cfg, dict):
        raise ValueError(f"model_config is {type(cfg).__name__}; build it with net_model_config(NetSpec)")
    return cfg


def _spec(model_config: dict[str, Any], with_value: bool) -> NetSpec:
    missing = [k for k in NET_KEYS if k not in model_config]
    if missing:
        raise ValueError(f"model_config lacks {missing}; build it with net_model_config(NetSpec)")
    return NetSpec(**{k: model_config[k] for k in NET_KEYS}, with_value=with_value)


def _obs(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    obs = batch[Columns.OBS]
    if not isinstance(obs, dict) or "observations" not in obs or "action_mask" not in obs:
        raise ValueError(
            "expected Dict observations {'observations', 'action_mask'} (wrap the env in ActionMaskObs)"
        )
    return obs["observations"], obs["action_mask"]


class ColocPPOModule(TorchRLModule, ValueFunctionAPI):
    """PPO's module: masked policy logits and a value head (module docstring)."""

    def setup(self) -> None:
        spec = _spec(_config(self), with_value=True)
        self.net = ColocNet(spec)
        if spec.action_mode == "per_app":
            # RLlib annotates this classmethod's `cls` as a Distribution instance
            self.action_dist_cls = TorchMultiCategorical.get_partial_dist_cls(  # type: ignore[misc]
                input_lens=[N_MOVES] * spec.max_apps
            )
        else:
            self.action_dist_cls = TorchCategorical

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        x, mask = _obs(batch)
        return {Columns.ACTION_DIST_INPUTS: self.net.masked_scores(x, mask)}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        x, _ = _obs(batch)
        return self.net.value(x)


class ColocDQNModule(TorchRLModule, QNetAPI, TargetNetworkAPI, InferenceOnlyAPI):
    """DQN's module: masked Q-values, a target network, epsilon-greedy over feasible moves."""

    def setup(self) -> None:
        cfg = _config(self)
        spec = _spec(cfg, with_value=False)
        if spec.action_mode != "single":
            raise ValueError("ColocDQNModule needs action_mode 'single' (a Discrete action space)")
        self.net = ColocNet(spec)
        self.action_dist_cls = TorchCategorical
        self.uses_double_q = bool(cfg.get("double_q", True))
        self.epsilon_schedule = Scheduler(cfg.get("epsilon", 0.05), framework="torch")

    # -- Q-values ----------------------------------------------------------------------------------
    @staticmethod
    def _q(net: ColocNet, obs: dict[str, Any]) -> torch.Tensor:
        return net.masked_scores(obs["observations"], obs["action_mask"], fill=float("-inf"))

    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        _obs(batch)
        return {QF_PREDS: self._q(self.net, batch[Columns.OBS])}

    # -- target network ----------------------------------------------------------------------------
    def make_target_networks(self) -> None:
        target = make_target_network(self.net)
        assert isinstance(target, ColocNet)  # a deep copy of self.net
        self._target_net = target

    def get_target_network_pairs(self) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
        return [(self.net, self._target_net)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {QF_PREDS: self._q(self._target_net, batch[Columns.OBS])}

    def get_non_inference_attributes(self) -> list[str]:
        return ["_target_net"]

    # -- forward passes ----------------------------------------------------------------------------
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        q = self.compute_q_values(batch)[QF_PREDS]
        return {Columns.ACTIONS: q.argmax(dim=-1)}

    def _forward_exploration(self, batch: dict[str, Any], t: int = 0, **kwargs: Any) -> dict[str, Any]:
        """Epsilon-greedy: with probability epsilon a uniformly random *feasible* move."""
        x, mask = _obs(batch)
        q = self.compute_q_values(batch)[QF_PREDS]
        greedy = q.argmax(dim=-1)
        self.epsilon_schedule.update(t)
        epsilon = float(self.epsilon_schedule.get_current_value())
        feasible = (self.net.feasible(x, mask) > 0.5).float()
        random = torch.multinomial(feasible / feasible.sum(dim=-1, keepdim=True), num_samples=1).squeeze(-1)
        explore = torch.rand(q.shape[0], device=q.device) < epsilon
        return {Columns.ACTIONS: torch.where(explore, random, greedy)}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.inference_only:
            raise RuntimeError("an inference-only DQN module cannot be trained")
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        out: dict[str, Any] = {}
        if self.uses_double_q:
            both = {k: torch.cat([obs[k], next_obs[k]], dim=0) for k in ("observations", "action_mask")}
            out[QF_PREDS], out[QF_NEXT_PREDS] = torch.chunk(self._q(self.net, both), 2, dim=0)
        else:
            out[QF_PREDS] = self._q(self.net, obs)
        out[QF_TARGET_NEXT_PREDS] = self._q(self._target_net, next_obs)
        return out
