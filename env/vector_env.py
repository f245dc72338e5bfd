"""`NodeVectorEnv`: `num_envs` simulated nodes stepped by one kernel call (DESIGN §4 batched mode).

The native vector env of `ColocSim-v0` (`gym.make_vec("ColocSim-v0", num_envs=B)`), for training
speed: it is not a loop of scalar envs but one `env.sim.node.SimFleet`, whose `step` advances all
B nodes in one call of the simulator kernel. Everything else is the scalar env's code, reused:
features (`env.features.ObservationEncoder`), actions and masks (`env.gym_env.ActionCodec`), the
reward (`env.rewards`), the choice of scenario and node seed per episode
(`env.gym_env.EpisodePlanner`) and the info keys (`env.gym_env.step_info`).

Seeding follows `gymnasium.vector.SyncVectorEnv`: `reset(seed=s)` seeds sub-env i like a scalar
`NodeEnv.reset(seed=s + i)`, so sub-env i draws the same scenarios and node seeds as that scalar
env. The simulator's sampling noise (Poisson arrivals, p99 order statistics) comes from the
fleet's one generator, seeded from `s` too: the vector env is deterministic under a seed, but its
noise stream differs from the scalar env's.

Autoreset (`metadata["autoreset_mode"]`): `NEXT_STEP` (default, what RLlib 2.60 expects),
`SAME_STEP` (final observation and info in `info["final_obs"]`, `info["final_info"]`) or
`DISABLED` (reset finished sub-envs with `reset(options={"reset_mask": mask})`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

from env.config import ConfigError
from env.features import ObservationEncoder
from env.guards import build_guards
from env.gym_env import (
    ActionCodec,
    DecodedAction,
    EnvConfig,
    EpisodePlanner,
    episode_start,
    guarded_target,
    mask_space,
    masked_observation,
    reset_info,
    step_info,
)
from env.rewards import QosFirstReward, RewardFn, as_reward_fn
from env.sim.engine import build_layout
from env.sim.node import SimFleet
from env.sim.scenario import Scenario
from env.types import Allocation, Capabilities, Observation


class NodeVectorEnv(VectorEnv):
    """`num_envs` copies of `ColocSim-v0` (`env.gym_env.NodeEnv`; same spaces, features, reward,
    masks and episode rules; see its docstring) on one batched simulator. Observations are
    `(num_envs, n_features)` float32; actions are `(num_envs,)` in single mode and
    `(num_envs, max_apps)` in per-app mode; `info["action_mask"]` is batched the same way."""

    # not a ClassVar: gymnasium's VectorEnv declares `metadata` as an instance attribute
    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}  # noqa: RUF012

    def __init__(
        self,
        num_envs: int = 1,
        config: EnvConfig | Mapping[str, Any] | None = None,
        *,
        reward: RewardFn | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.config = EnvConfig.resolve(config).for_simulation()
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.encoder = ObservationEncoder(self.config.max_apps, self.config.features)
        self.codec = ActionCodec(self.config.max_apps, self.config.action_mode)
        self.reward_fn: RewardFn = as_reward_fn(reward) if reward else QosFirstReward(self.config.reward)
        self.planner = EpisodePlanner(self.config)
        self.single_observation_space = self.encoder.space
        self.single_action_space = self.codec.space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.fleet: SimFleet | None = None
        self._guards = [build_guards(self.config.guards) for _ in range(num_envs)]  # state per sub-env
        self._width = 0
        self._rngs: list[np.random.Generator] = []
        self._obs: list[Observation | None] = [None] * num_envs
        self._caps: list[Capabilities | None] = [None] * num_envs
        self._names = [""] * num_envs
        self._t = np.zeros(num_envs, dtype=np.int64)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self._done = np.zeros(num_envs, dtype=bool)
        self._x = np.zeros((num_envs, self.encoder.size), dtype=np.float32)
        self._mask = np.zeros((num_envs, *self._mask_shape()), dtype=bool)

    def _mask_shape(self) -> tuple[int, ...]:
        return (self.codec.mask_size,) if self.codec.mode == "single" else (self.config.max_apps, 11)

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        options = dict(options or {})
        reset_mask = options.pop("reset_mask", None)
        scenario_opt = options.pop("scenario", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; known: scenario, reset_mask")
        seeds = self._seeds(seed)
        if reset_mask is not None:
            reset_mask = np.asarray(reset_mask, dtype=bool)
            if reset_mask.shape != (self.num_envs,) or not reset_mask.any():
                raise ValueError(
                    f"options['reset_mask'] must be a bool array of shape ({self.num_envs},) with a True"
                )
            if self.fleet is None:
                raise ValueError("reset_mask needs a first full reset()")
            which = np.flatnonzero(reset_mask)
        else:
            which = np.arange(self.num_envs)
        if seeds[0] is not None and reset_mask is None:
            super().reset(seed=seeds[0])  # seeds np_random, which seeds the fleet's noise
        for i in which:
            if seeds[i] is not None or len(self._rngs) <= i:
                rng, _ = seeding.np_random(seeds[i])
                if len(self._rngs) <= i:
                    self._rngs.append(rng)
                else:
                    self._rngs[i] = rng
        plans = {int(i): self.planner.draw(self._rngs[i], scenario_opt) for i in which}
        if self.fleet is None or (seed is not None and reset_mask is None):
            self._build_fleet([plans[i][0] for i in range(self.num_envs)])
        infos: dict[str, Any] = {}
        for i in which:
            scn, node_seed = plans[int(i)]
            infos = self._add_info(infos, self._reset_one(int(i), scn, node_seed), int(i))
        return self._x.copy(), infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self.fleet is None:
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions)
        if actions.shape[0] != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got shape {actions.shape}")
        restart = (
            self._done.copy()
            if self.autoreset_mode is AutoresetMode.NEXT_STEP
            else np.zeros(self.num_envs, bool)
        )
        if self.autoreset_mode is AutoresetMode.DISABLED and self._done.any():
            raise RuntimeError(
                f"sub-envs {np.flatnonzero(self._done).tolist()} are done: reset them with reset_mask"
            )
        decoded: list[DecodedAction | None] = [None] * self.num_envs
        allocs: list[Allocation | None] = []
        for i in range(self.num_envs):
            prev, caps = self._obs[i], self._caps[i]
            if restart[i] or prev is None or caps is None:
                allocs.append(None)
                continue
            decoded[i] = dec = self.codec.decode(actions[i], prev, caps)
            allocs.append(guarded_target(self._guards[i], dec, prev, caps))
        observations = self.fleet.step(allocs)  # one kernel call for every node
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if restart[i]:
                scn, node_seed = self.planner.draw(self._rngs[i])
                infos = self._add_info(infos, self._reset_one(i, scn, node_seed), i)
                continue
            d = decoded[i]
            assert d is not None
            obs, caps = observations[i], self._caps[i]
            assert caps is not None
            self._t[i] += 1
            terms = self.reward_fn(obs, caps, self.fleet.nodes[i].tail_at_target())
            self._set_obs(i, obs, previous=self._obs[i])
            rewards[i] = terms.reward
            truncations[i] = self._t[i] >= self._length[i]
            info = step_info(obs, terms, d, self._mask[i].copy(), self._names[i], int(self._t[i]))
            if self.autoreset_mode is AutoresetMode.SAME_STEP and truncations[i]:
                infos = self._add_info(infos, {"final_obs": self._x[i].copy(), "final_info": info}, i)
                scn, node_seed = self.planner.draw(self._rngs[i])
                info = self._reset_one(i, scn, node_seed)
            infos = self._add_info(infos, info, i)
        self._done = terminations | truncations
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            self._done[:] = False
        return self._x.copy(), rewards, terminations, truncations, infos

    def close_extras(self, **kwargs: Any) -> None:
        if self.fleet is not None:
            for node in self.fleet.nodes:
                node.close()

    # -- views ------------------------------------------------------------------------------------
    def observations(self) -> list[Observation | None]:
        """The last raw `Observation` of each sub-env."""
        return list(self._obs)

    def capabilities(self, i: int) -> Capabilities | None:
        return self._caps[i]

    @property
    def action_masks(self) -> np.ndarray:
        """The current action mask of every sub-env, `(num_envs, *mask shape)`."""
        return self._mask.copy()

    # -- internals --------------------------------------------------------------------------------
    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"got {len(seed)} seeds for {self.num_envs} sub-envs")
        return list(seed)

    def _width_for(self, scenarios: list[Scenario]) -> int:
        need = max(build_layout(s).n for s in scenarios)
        if self.planner.sampler is not None:
            need = max(need, self.config.max_apps + self.planner.sampler.max_be_components)
        return need

    def _build_fleet(self, drawn: list[Scenario | None]) -> None:
        scenarios = [s for s in drawn if s is not None]
        assert len(scenarios) == len(drawn)  # for_simulation(): the planner always draws a scenario
        self._width = self._width_for(scenarios)
        fleet_seed = int(self.np_random.integers(2**63))
        # training observes p99s only: no latency histograms (env.sim.node)
        self.fleet = SimFleet(scenarios, seed=fleet_seed, width=self._width, histograms=False)

    def _reset_one(self, i: int, scenario: Scenario | None, node_seed: int) -> dict[str, Any]:
        assert self.fleet is not None and scenario is not None
        if build_layout(scenario).n > self._width:
            raise ConfigError(
                f"scenario {scenario.name!r} needs {build_layout(scenario).n} simulator components; this vector "
                f"env was built for {self._width} (reset all sub-envs with a seed to rebuild it)"
            )
        obs = self.fleet.reset(i, node_seed, scenario, initial=episode_start(self.config, self._rngs[i]))
        caps = self.fleet.nodes[i].capabilities()
        self._caps[i] = caps
        self._guards[i].reset(caps)
        self._names[i] = scenario.name
        self._t[i] = 0
        self._length[i] = self.planner.episode_intervals(scenario, caps)
        self._done[i] = False
        self._set_obs(i, obs, previous=None)
        return reset_info(obs, self._mask[i].copy(), scenario.name)

    def _set_obs(self, i: int, obs: Observation, previous: Observation | None) -> None:
        caps = self._caps[i]
        assert caps is not None
        self._obs[i] = obs
        # the mask is a function of the allocation (and the node): kept while the allocation stays
        if previous is None or obs.allocation != previous.allocation:
            self._mask[i] = self.codec.mask(obs, caps)
        self.encoder.encode(obs, caps, out=self._x[i], previous=previous)


class VectorActionMaskObs(VectorWrapper):
    """The vector form of `env.gym_env.ActionMaskObs`: batched Dict observations
    {"observations": (B, n_features), "action_mask": (B, mask_size)} for RLlib."""

    env: NodeVectorEnv

    def __init__(self, env: NodeVectorEnv) -> None:
        super().__init__(env)
        codec: ActionCodec = env.unwrapped.codec
        self.single_observation_space = spaces.Dict(
            {"observations": env.single_observation_space, "action_mask": mask_space(codec)}
        )
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        x, info = self.env.reset(seed=seed, options=options)
        return masked_observation(x, self._mask(info), batched=True), info

    def step(self, actions: Any):
        x, r, term, trunc, info = self.env.step(actions)
        return masked_observation(x, self._mask(info), batched=True), r, term, trunc, info

    def _mask(self, info: dict[str, Any]) -> np.ndarray:
        # from the env, not the info: a partial reset reports only the sub-envs it reset
        return self.env.unwrapped.action_masks


def make_sim_vector_env(
    num_envs: int = 1,
    config: EnvConfig | Mapping[str, Any] | None = None,
    *,
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    **fields: Any,
) -> NodeVectorEnv:
    """`vector_entry_point` of `ColocSim-v0`: takes `EnvConfig` fields as keywords, like the scalar env."""
    return NodeVectorEnv(num_envs, EnvConfig.resolve(config, **fields), autoreset_mode=autoreset_mode)
