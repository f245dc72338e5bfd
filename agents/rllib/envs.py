"""The training environments RLlib's env runners build: the batched simulator with action masks
and domain randomisation.

`make_training_env(env_config)` is the env creator given to `AlgorithmConfig.environment(env=...)`.
With `gym_env_vectorize_mode="vector_entry_point"` RLlib calls it with `num_envs` in the config
and gets one `env.vector_env.NodeVectorEnv` (all sub-envs stepped by one simulator kernel call)
wrapped in `VectorActionMaskObs` (Dict observations {"observations", "action_mask"}) and
`ScaledReward`; without `num_envs` it returns the scalar `NodeEnv`, wrapped the same way.

`env_config` is plain data (it travels to remote env runners and into checkpoints):
`{"env": <EnvConfig as a mapping>, "domain_randomization": <DomainRandomizationConfig mapping>,
"reward_scale": float}` (`training_env_config`).

Domain randomisation: `PerturbedSampler` wraps the env's `ScenarioSampler` and gives every LC app
of every drawn scenario multiplicative factors on its physical parameters
(`env.sim.scenario.AppEntry.perturb`), drawn log-uniformly from the configured ranges with the
env's own generator (so a seeded env draws the same perturbed scenarios).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper
from gymnasium.wrappers import TransformReward

from agents.rllib.config import DomainRandomizationConfig, TrainConfig, resolved
from env.config import build
from env.gym_env import ActionMaskObs, EnvConfig, NodeEnv
from env.scenario_sampler import ScenarioSampler
from env.sim.scenario import Scenario
from env.vector_env import NodeVectorEnv, VectorActionMaskObs


class PerturbedSampler:
    """A `ScenarioSampler` whose scenarios carry random `perturb` factors on every LC app."""

    def __init__(self, base: ScenarioSampler, config: DomainRandomizationConfig) -> None:
        self.base = base
        self.config = config
        self._ranges = sorted(config.factors.items())

    @property
    def max_be_components(self) -> int:
        return self.base.max_be_components

    def perturbation(self, rng: np.random.Generator) -> dict[str, float]:
        """One app's factors: log-uniform in each configured range, rounded to 1e-4."""
        return {
            k: round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 4) if hi > lo else lo
            for k, (lo, hi) in self._ranges
        }

    def sample(self, rng: np.random.Generator) -> Scenario:
        scn = self.base.sample(rng)
        apps = tuple(dataclasses.replace(e, perturb=self.perturbation(rng)) for e in scn.apps)
        return dataclasses.replace(scn, apps=apps, description=scn.description + "; perturbed profiles")


class ScaledReward(VectorWrapper):
    """Multiplies the vector env's rewards by `scale` (`TrainConfig.reward_scale`): the same optimal
    policy, value targets in a range the critic fits (QosFirstReward spans about -25..2.5 per
    interval, i.e. returns of -500..50 at gamma 0.95). `info["reward_terms"]` stays unscaled."""

    def __init__(self, env: VectorEnv, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def step(self, actions: Any):
        obs, reward, term, trunc, info = self.env.step(actions)
        return obs, reward * self.scale, term, trunc, info


def training_env_config(config: TrainConfig) -> dict[str, Any]:
    """The plain-data `env_config` of a training run."""
    data = resolved(config)
    return {
        "env": data["env"],
        "domain_randomization": data["domain_randomization"],
        "reward_scale": config.reward_scale,
    }


def _parse(env_config: Mapping[str, Any]) -> tuple[EnvConfig, DomainRandomizationConfig]:
    env = build(EnvConfig, dict(env_config.get("env") or {}), "env")
    dr = build(
        DomainRandomizationConfig, dict(env_config.get("domain_randomization") or {}), "domain_randomization"
    )
    return env, dr


def _randomise(planner: Any, dr: DomainRandomizationConfig) -> None:
    if dr.enabled and dr.factors and isinstance(planner.sampler, ScenarioSampler):
        planner.sampler = PerturbedSampler(planner.sampler, dr)


def make_vector_env(num_envs: int, env_config: Mapping[str, Any]) -> VectorEnv:
    """`num_envs` simulated nodes on one batched simulator, masked observations, randomised
    profiles, scaled rewards."""
    env, dr = _parse(env_config)
    vec = NodeVectorEnv(num_envs, env)
    _randomise(vec.planner, dr)
    return ScaledReward(VectorActionMaskObs(vec), float(env_config.get("reward_scale", 1.0)))


def make_scalar_env(env_config: Mapping[str, Any]) -> gym.Env:
    """The scalar `NodeEnv` of `env_config` (module docstring), domain-randomised, with action masks in
    its observations and rewards multiplied by `reward_scale`."""
    env, dr = _parse(env_config)
    scalar = NodeEnv(env)
    _randomise(scalar.planner, dr)
    scale = float(env_config.get("reward_scale", 1.0))
    return TransformReward(ActionMaskObs(scalar), lambda r: float(r) * scale)


def make_training_env(env_config: Mapping[str, Any]) -> gym.Env | VectorEnv:
    """The env creator RLlib calls (module docstring)."""
    num_envs = env_config.get("num_envs")
    if num_envs is None:
        return make_scalar_env(env_config)
    return make_vector_env(int(num_envs), env_config)
