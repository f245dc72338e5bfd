"""`NodeEnv`: the Gymnasium face of a managed node (DESIGN §2 `gym_env`).

This module holds the env, its config (`EnvConfig`), the action codec shared with the vector env
and the RL controller (`ActionCodec`), the RLlib action-mask wrapper (`ActionMaskObs`) and the
registration of `ColocSim-v0` and `ColocLinux-v0`. Observations come from `env.features`, rewards
from `env.rewards`, training scenarios from `env.scenario_sampler`.

    import gymnasium as gym
    import env.gym_env  # registers the ids (or: gym.make("env.gym_env:ColocSim-v0"))

    env = gym.make("ColocSim-v0", scenario="fig9-ramp", action_mode="per_app")
    vec = gym.make_vec("ColocSim-v0", num_envs=16)  # the native batched env (env.vector_env)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.allocations import fair_allocation, lean_start
from env.config import ConfigError, build
from env.features import FeatureConfig, ObservationEncoder
from env.guards import GuardChain, GuardsConfig, build_guards
from env.moves import MaskContext, adjust_network, plan_moves
from env.node import Node, tail_at_target
from env.rewards import QosFirstReward, RewardConfig, RewardFn, RewardTerms, as_reward_fn
from env.scenario_sampler import SamplerConfig, ScenarioSampler
from env.sim.scenario import Scenario, load_scenario
from env.types import (
    DOWN_MOVES,
    N_MOVES,
    Allocation,
    Capabilities,
    Decision,
    Direction,
    Move,
    Observation,
    Resource,
)

ActionMode = Literal["single", "per_app"]
N_APP_MOVES = N_MOVES - 1  # the ten PARTIES moves of one app (HOLD is shared)
DEFAULT_EPISODE_S = 120.0  # episode length when nothing else sets it (Scenario's default duration)


# ---- config -------------------------------------------------------------------------------------
MAX_APP_SLOTS = 64  # LC apps one node can host with a core each; the spaces grow with the slots


@dataclass(frozen=True)
class EnvConfig:
    """Everything that shapes a `NodeEnv` (and a `NodeVectorEnv`); built strictly from YAML with
    `EnvConfig.from_mapping`.

    * `max_apps`: LC app slots of the observation and action spaces (at most `MAX_APP_SLOTS`); a
      scenario with more LC apps is refused at reset.
    * `action_mode`: `"single"` (one move per interval, PARTIES) or `"per_app"` (every app moves).
    * `scenario`: a scenario name (configs/scenarios/), path or `Scenario` run in every episode;
      when None, `sampler` draws one per episode (its `max_apps` is lowered to `max_apps`); when
      both are None the node keeps its own (a real node's load is what it is). A simulated env
      (`ColocSim-v0`, `NodeVectorEnv`, `NodeEnv` without a node) with neither uses the default
      `SamplerConfig()` (`for_simulation`).
    * `episode_intervals`: episode length in control intervals; None = the scenario's duration
      (`DEFAULT_EPISODE_S` when the node runs its own scenario and does not expose it).
    * `lean_start_moves`: on a simulated node, each episode starts from `env.allocations.lean_start`
      (the fair start with up to this many LC cores and LLC ways given to the BE jobs, drawn from
      the env's generator) instead of the fair start; 0 (the default) = the fair start. A node the
      env does not simulate starts where it is.
    * `reward`, `features`: weights of the default reward and node scales of the features.
    * `guards`: the guard chain every action passes before it reaches the node (`env.guards`;
      clamp only by default). Choose the chain the policy will be served under: a policy trained
      without a rate limit or cooldown behaves differently when served with them (DESIGN §3).
    """

    max_apps: int = 6
    action_mode: ActionMode = "single"
    scenario: str | Scenario | None = None
    sampler: SamplerConfig | None = None
    episode_intervals: int | None = None
    lean_start_moves: int = 0
    reward: RewardConfig = field(default_factory=RewardConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.max_apps <= MAX_APP_SLOTS:
            raise ConfigError(f"env.max_apps must be in 1..{MAX_APP_SLOTS}, got {self.max_apps}")
        if self.action_mode not in ("single", "per_app"):
            raise ConfigError(f"env.action_mode: {self.action_mode!r}; choose 'single' or 'per_app'")
        if self.episode_intervals is not None and self.episode_intervals < 1:
            raise ConfigError(f"env.episode_intervals must be >= 1 (or null), got {self.episode_intervals}")
        if self.lean_start_moves < 0:
            raise ConfigError(f"env.lean_start_moves must be >= 0, got {self.lean_start_moves}")
        s = self.sampler
        if s is not None:
            for x in (s, *(a.sampler for a in s.also)):
                if x.min_apps > self.max_apps:
                    raise ConfigError(
                        f"env.sampler.min_apps={x.min_apps} exceeds env.max_apps={self.max_apps}"
                    )
            # the sampler never draws more apps than the spaces hold (the resolved config says so)
            object.__setattr__(self, "sampler", s.capped(self.max_apps))

    def for_simulation(self) -> EnvConfig:
        """This config, with the default scenario sampler if it names neither scenario nor sampler."""
        if self.scenario is None and self.sampler is None:
            return dataclasses.replace(self, sampler=SamplerConfig())
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, where: str = "env") -> EnvConfig:
        return build(cls, dict(data or {}), where)

    @classmethod
    def resolve(cls, config: EnvConfig | Mapping[str, Any] | None, **fields: Any) -> EnvConfig:
        """`config` (a dataclass, a mapping or None) with `fields` overriding it, checked strictly
        (how `gym.make("ColocSim-v0", action_mode="per_app")` keyword arguments arrive). Values may
        be YAML data (checked and converted by `env.config.build`) or ready objects (a `Scenario`,
        a `RewardConfig`, ...), which are taken as they are."""
        allowed = sorted(f.name for f in dataclasses.fields(cls))
        data = dict(fields) if isinstance(config, EnvConfig) else {**dict(config or {}), **fields}
        for k in data:
            if k not in allowed:
                raise ConfigError(f"env.{k}: unknown key; allowed: {allowed}")
        ready = {k: data.pop(k) for k in list(data) if dataclasses.is_dataclass(data[k])}
        hints = get_type_hints(cls)
        for k, v in ready.items():
            kinds = tuple(t for t in (get_args(hints[k]) or (hints[k],)) if isinstance(t, type))
            if not isinstance(v, kinds):
                raise ConfigError(
                    f"env.{k}: expected {' or '.join(t.__name__ for t in kinds)}, got {type(v).__name__}"
                )
        base = config if isinstance(config, EnvConfig) else cls()
        parsed = build(cls, data, "env") if data else None
        changes = {k: getattr(parsed, k) for k in data} if parsed is not None else {}
        return dataclasses.replace(base, **changes, **ready) if changes or ready else base


def episode_start(config: EnvConfig, rng: np.random.Generator) -> Callable[[Capabilities], Allocation] | None:
    """An episode's start allocation on a simulated node, drawn from `rng` when the node builds it
    (`EnvConfig.lean_start_moves`: `env.allocations.lean_start`); None = the node's own start. The
    one rule of `NodeEnv` and `NodeVectorEnv`."""
    n = config.lean_start_moves
    return (lambda caps: lean_start(caps, rng, n)) if n else None


# ---- actions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodedAction:
    """An action turned into the allocation to apply, with what was applied and what was refused."""

    allocation: Allocation
    applied: tuple[tuple[str, Move, str | None], ...]  # (app, move, counterpart; None = idle pool)
    rejected: tuple[tuple[str, Move, str], ...]  # (app or slot, move, why) - applied as HOLD


_DOWN_COLUMNS = [m.value for m in DOWN_MOVES]


class ActionCodec:
    """Action spaces, masks and decoding for `max_apps` LC app slots (apps in `Capabilities.lc_apps`
    order). Shared by `NodeEnv`, `NodeVectorEnv` and the RL controller at serving time.

    * `single`: `Discrete(1 + 10 * max_apps)`; 0 = HOLD, `1 + 10 * k + (m - 1)` = move `m`
      (`Move` values 1..10) of the app in slot k. Mask: a flat bool array of that length.
    * `per_app`: `MultiDiscrete([11] * max_apps)`; entry k is a `Move` value for slot k. Mask:
      bool array `(max_apps, 11)`. The moves are applied one after another, each planned with
      `env.moves.plan_move` on the allocation the previous ones produced (`env.moves.plan_moves`),
      in this order: first every DOWN move (slot order), since they free units; then every UP move,
      the app with the least slack first (an app without a latency sample counts as least), so the
      app furthest from its target has first pick of what is free or reclaimable (PARTIES upsizes
      the worst app first).

    The mask of slot k is `env.moves.move_mask` on the current observation (the one rule for
    counterparts); padded slots can only HOLD. A per-app mask is computed per app on the current
    allocation, so in `per_app` mode two moves that are each feasible may compete for the last unit:
    the later one is then refused. A refused or masked-out move is applied as HOLD and reported.
    """

    def __init__(self, max_apps: int, mode: ActionMode) -> None:
        if mode not in ("single", "per_app"):
            raise ValueError(f"action mode {mode!r}; choose 'single' or 'per_app'")
        self.max_apps = max_apps
        self.mode = mode

    @property
    def space(self) -> spaces.Discrete | spaces.MultiDiscrete:
        if self.mode == "single":
            return spaces.Discrete(1 + N_APP_MOVES * self.max_apps)
        return spaces.MultiDiscrete([N_MOVES] * self.max_apps)

    @property
    def mask_size(self) -> int:
        """Length of the flattened mask (= the policy's logits: Discrete n, or MultiDiscrete sum)."""
        return 1 + N_APP_MOVES * self.max_apps if self.mode == "single" else N_MOVES * self.max_apps

    def app_masks(self, obs: Observation, caps: Capabilities, no_down: Collection[str] = ()) -> np.ndarray:
        """(max_apps, 11) feasibility of each slot's moves; padded slots only HOLD. The apps named in
        `no_down` are offered no DOWN move (a controller's own ban, e.g. after a failed downsize)."""
        m = np.zeros((self.max_apps, N_MOVES), dtype=bool)
        m[:, Move.HOLD] = True
        ctx = MaskContext(obs.allocation, caps)
        for k, spec in enumerate(caps.lc_apps[: self.max_apps]):
            m[k] = ctx.mask(spec.name)
            if spec.name in no_down:
                m[k, _DOWN_COLUMNS] = False
        return m

    def mask(self, obs: Observation, caps: Capabilities, no_down: Collection[str] = ()) -> np.ndarray:
        """The action mask in this mode's shape (`info["action_mask"]`); `no_down` as `app_masks`."""
        m = self.app_masks(obs, caps, no_down)
        if self.mode == "per_app":
            return m
        return np.concatenate([[True], m[:, 1:].reshape(-1)])

    def single_index(self, slot: int, move: Move) -> int:
        """The `single`-mode action of `move` for the app in `slot` (0 for HOLD)."""
        return 0 if move is Move.HOLD else 1 + N_APP_MOVES * slot + (move.value - 1)

    def moves_of(self, action: Any) -> list[tuple[int, Move]]:
        """(slot, move) pairs an action asks for, HOLDs left out."""
        if self.mode == "single":
            a = int(action)
            if not 0 <= a < self.mask_size:
                raise ValueError(f"action {a} is outside Discrete({self.mask_size})")
            return [] if a == 0 else [((a - 1) // N_APP_MOVES, Move((a - 1) % N_APP_MOVES + 1))]
        arr = np.asarray(action).reshape(-1)
        if arr.shape != (self.max_apps,) or np.any(arr < 0) or np.any(arr >= N_MOVES):
            raise ValueError(f"action {action!r} is not in MultiDiscrete([{N_MOVES}] * {self.max_apps})")
        return [(k, Move(int(v))) for k, v in enumerate(arr) if v != Move.HOLD]

    def decode(self, action: Any, obs: Observation, caps: Capabilities) -> DecodedAction:
        """The allocation after `action`, planned from `obs.allocation`, with the network partition
        adjusted to the apps' use (`env.moves.adjust_network`, PARTIES Alg. 1: outside the ten moves,
        every interval, for every controller of them)."""
        lc = caps.lc_apps
        wanted = self.moves_of(action)
        rejected: list[tuple[str, Move, str]] = []
        moves: list[tuple[str, Move]] = []
        for slot, move in wanted:
            if slot >= len(lc):
                rejected.append((f"slot{slot}", move, "no app in this slot"))
            else:
                moves.append((lc[slot].name, move))
        alloc, done, refused = plan_moves(obs, caps, moves)
        rejected += [(p.app, p.move, p.reason) for p in refused]
        applied = [(p.app, p.move, p.counterpart) for p in done]
        alloc, _ = adjust_network(obs, alloc, caps)  # outside the ten moves, as PARTIES (Alg. 1)
        return DecodedAction(alloc, tuple(applied), tuple(rejected))


def describe_move(app: str, move: Move, counterpart: str | None) -> str:
    """`memcached:<UP,CORE> from be_parties`, `xapian:<DOWN,CACHE> to idle`, `nginx:<UP,FREQ>`."""
    if move.resource is Resource.FREQ:
        return f"{app}:{move}"
    if move.direction is Direction.UP:
        return f"{app}:{move} from {counterpart or 'idle'}"
    return f"{app}:{move} to {counterpart or 'idle'}"


def guarded_target(
    guards: GuardChain, decoded: DecodedAction, obs: Observation, caps: Capabilities
) -> Allocation | None:
    """The allocation to apply after the guard chain, None to keep the current one. The decoded
    action is a decision like any controller's (a hold when it changes nothing), so the chain sees
    every interval, as in `env.loop` (a guard may act on a hold, e.g. the QoS emergency)."""
    proposed = None if decoded.allocation is obs.allocation else decoded.allocation
    decision, _ = guards.apply(Decision(proposed, reason="policy"), obs, caps)
    return decision.allocation


def step_info(
    obs: Observation, terms: RewardTerms, decoded: DecodedAction, mask: np.ndarray, scenario: str, t: int
) -> dict[str, Any]:
    """The `info` of a step (the scalar and the vector env return the same keys)."""
    return {
        "action_mask": mask,
        "qos_met": terms.qos_met,
        "reward_terms": terms.as_info(),
        "moves": ", ".join(describe_move(*x) for x in decoded.applied) or "HOLD",
        "infeasible_action": bool(decoded.rejected),
        "rejected": "; ".join(f"{a}:{m} ({why})" for a, m, why in decoded.rejected),
        "scenario": scenario,
        "time_s": float(obs.time_s),
        "interval": t,
    }


def reset_info(obs: Observation, mask: np.ndarray, scenario: str) -> dict[str, Any]:
    """The `info` of a reset (the same keys as `step_info` where they apply; interval 0)."""
    return {"action_mask": mask, "scenario": scenario, "time_s": float(obs.time_s), "interval": 0}


# ---- episodes -----------------------------------------------------------------------------------
def as_scenario(value: str | Scenario) -> Scenario:
    """A scenario given by name (configs/scenarios/) or already loaded."""
    return value if isinstance(value, Scenario) else load_scenario(value)


class EpisodePlanner:
    """Which scenario an episode runs and with which node seed, drawn from the env's generator so
    that `reset(seed=s)` fixes both (shared by the scalar and the vector env)."""

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self.fixed = as_scenario(config.scenario) if config.scenario is not None else None
        self.sampler = (
            ScenarioSampler(config.sampler) if self.fixed is None and config.sampler is not None else None
        )
        if self.fixed is not None:
            self.check(self.fixed)

    def check(self, scenario: Scenario) -> None:
        if len(scenario.apps) > self.config.max_apps:
            raise ConfigError(
                f"scenario {scenario.name!r} runs {len(scenario.apps)} LC apps; this env has "
                f"max_apps={self.config.max_apps} (raise env.max_apps)"
            )

    def draw(
        self, rng: np.random.Generator, option: str | Scenario | None = None
    ) -> tuple[Scenario | None, int]:
        """(scenario or None for the node's own, node seed). `option` is `reset(options={"scenario"})`."""
        if option is not None:
            scn: Scenario | None = as_scenario(option)
        elif self.fixed is not None:
            scn = self.fixed
        elif self.sampler is not None:
            scn = self.sampler.sample(rng)
        else:
            scn = None
        if scn is not None:
            self.check(scn)
        return scn, int(rng.integers(2**31))

    def episode_intervals(self, scenario: Scenario | None, caps: Capabilities) -> int:
        if self.config.episode_intervals is not None:
            return self.config.episode_intervals
        duration_s = DEFAULT_EPISODE_S if scenario is None else scenario.duration_s
        return max(1, round(duration_s / caps.interval_s))


# ---- the env ------------------------------------------------------------------------------------
class NodeEnv(gym.Env):
    """
    ## Description

    A server running latency-critical (LC) services beside best-effort (BE) jobs. Every control
    interval (500 ms on the PARTIES platform) the agent may move one unit of a resource to or from
    an LC app, as PARTIES does (Sec. 4.2.3): the ten moves <UP|DOWN, CORE|CACHE|FREQ|MEM|DISK>. An
    UP move takes the unit from the BE job first, else from the LC app with the most slack (for
    memory, the most memory slack); a DOWN move gives it to the BE job (or leaves it idle) -
    `env.moves`, the rule every controller shares. The goal is to keep every LC app's p99 latency
    under its QoS target while leaving the BE job as much of the node as possible.

    The node is any `env.node.Node`: `SimNode` for `ColocSim-v0`, a real `LinuxNode` for
    `ColocLinux-v0`.

    ## Action Space

    `action_mode="single"` (default): `Discrete(1 + 10 * max_apps)`. 0 is HOLD; action
    `1 + 10 * k + (m - 1)` applies move `m` (`env.types.Move` 1..5 = UP CORE, CACHE, FREQ, MEM,
    DISK; 6..10 = DOWN in the same order) to the LC app in slot k.

    `action_mode="per_app"`: `MultiDiscrete([11] * max_apps)`, one `Move` value per slot, applied in
    one interval: DOWN moves first, then UP moves from the app with the least slack (`ActionCodec`).

    Slots follow `Capabilities.lc_apps`. Infeasible moves (a resource at its minimum or maximum, no
    victim, a knob the node lacks, an empty slot) are masked in `info["action_mask"]` (bool; flat
    `(1 + 10 * max_apps,)` in single mode, `(max_apps, 11)` in per-app mode). A masked action is
    not an error: it is applied as HOLD and reported in `info["infeasible_action"]` and
    `info["rejected"]`. `ActionMaskObs` puts the mask into a Dict observation for RLlib.

    ## Observation Space

    `Box(shape=(26 * max_apps + 14,), dtype=float32)`: one block of 26 features per LC app slot
    (zero with `present = 0` for empty slots), then 14 node features (`env.features`). Bounds:

    | index | feature | range | meaning |
    |---|---|---|---|
    | 0 + 26k | app[k].present | [0, 1] | 1 if this slot holds an LC app, 0 for padding |
    | 1 + 26k | app[k].latency_valid | [0, 1] | 1 if the p99 sample is a measurement (feed alive), else 0 |
    | 2 + 26k | app[k].slack | [-1, 1] | (target - p99) / target, clipped; > 0 means QoS met |
    | 3 + 26k | app[k].log_tardiness | [-1, 1] | log10(p99 / target) / 2, clipped: 0 at the target, 1 at 100x |
    | 4 + 26k | app[k].load | [0, 2] | offered load / max load (PARTIES Table 2), clipped |
    | 5 + 26k | app[k].drop_frac | [0, 1] | dropped / offered requests |
    | 6 + 26k | app[k].cpu_util | [0, 1] | busy fraction of the app's cores |
    | 7 + 26k | app[k].llc_occupancy | [0, 1] | LLC MB used / MB of the app's ways |
    | 8 + 26k | app[k].mem_bw | [0, 1] | memory bandwidth used / node peak |
    | 9 + 26k | app[k].memory_used | [0, 1.5] | resident memory / memory limit |
    | 10 + 26k | app[k].disk_used | [0, 1.5] | disk bandwidth used / disk limit |
    | 11 + 26k | app[k].net_used | [0, 1.5] | network bandwidth used / network limit |
    | 12 + 26k | app[k].freq_achieved | [0, 1] | achieved core frequency / highest level (turbo) |
    | 13 + 26k | app[k].cores | [0, 1] | allocated cores / node cores |
    | 14 + 26k | app[k].llc_ways | [0, 1] | allocated LLC ways / node ways |
    | 15 + 26k | app[k].freq_level | [0, 1] | index of the frequency cap in the node's levels / (levels - 1) |
    | 16 + 26k | app[k].memory | [0, 1] | memory limit / node memory |
    | 17 + 26k | app[k].disk | [0, 1] | disk limit / node disk bandwidth |
    | 18 + 26k | app[k].net | [0, 1] | network limit / node network bandwidth |
    | 19 + 26k | app[k].d_log_tardiness | [-1, 1] | log_tardiness minus the previous observation's (0 if either is invalid) |
    | 20 + 26k | app[k].d_cores | [-1, 1] | sign of the change of cores since the previous observation |
    | 21 + 26k | app[k].d_llc_ways | [-1, 1] | sign of the change of LLC ways since the previous observation |
    | 22 + 26k | app[k].d_freq_level | [-1, 1] | sign of the change of the frequency cap since the previous observation |
    | 23 + 26k | app[k].d_memory | [-1, 1] | sign of the change of the memory limit since the previous observation |
    | 24 + 26k | app[k].d_disk | [-1, 1] | sign of the change of the disk limit since the previous observation |
    | 25 + 26k | app[k].qos_target | [0, 1] | log10(QoS target in us) / 7, clipped: which kind of service the slot holds (0.40 at 600 us, 0.91 at 2.5 s) |
    | 26M + 0 | node.obs_valid | [0, 1] | 1 if the whole observation is valid and fresh (stale_s = 0) |
    | 26M + 1 | node.mem_bw | [0, 1] | node memory bandwidth / node peak |
    | 26M + 2 | node.power | [0, 1.5] | socket power / TDP (0 if the TDP is unknown) |
    | 26M + 3 | node.be_throughput | [0, 1.5] | BE throughput, normalised to the BE job alone on the node |
    | 26M + 4 | node.be_present | [0, 1] | 1 if the node runs a BE job |
    | 26M + 5 | node.be_cores | [0, 1] | cores of the BE jobs' core groups / node cores |
    | 26M + 6 | node.be_llc_ways | [0, 1] | LLC ways of the BE jobs' CLOSes / node ways |
    | 26M + 7 | node.be_freq_level | [0, 1] | BE frequency level index / (levels - 1) |
    | 26M + 8 | node.be_memory | [0, 1] | BE memory limits / node memory |
    | 26M + 9 | node.be_disk | [0, 1] | BE disk limits / node disk bandwidth |
    | 26M + 10 | node.idle_cores | [0, 1] | cores held by nobody / node cores |
    | 26M + 11 | node.idle_llc_ways | [0, 1] | LLC ways in no CLOS / node ways |
    | 26M + 12 | node.idle_memory | [0, 1] | memory under no limit / node memory |
    | 26M + 13 | node.idle_disk | [0, 1] | disk bandwidth under no limit / node disk bandwidth |

    (k = slot 0..max_apps-1, M = max_apps.) A failed latency feed gives `latency_valid = 0` with
    slack and tardiness 0, never a fake measurement. The `d_*` features compare with the observation
    before (0 after `reset`): the one step of memory a policy needs to tell a move that helped from
    one that did not.

    ## Rewards

    `env.rewards.QosFirstReward` by default (configurable through `EnvConfig.reward`, or any
    `RewardFn` passed as `reward=`): when any LC app misses its target,
    `r = -(1 + sum_i min(p99_i / target_i - 1, 4))`; when all meet it,
    `r = 1 + be_throughput + 0.5 * reclaimed`, with `reclaimed` the mean share of cores, LLC ways,
    memory and disk that no LC app holds. Every interval with a miss scores below every interval
    without one: QoS first, then BE throughput and lean LC allocations.

    ## Starting State

    `reset` starts a scenario (`EnvConfig.scenario`, or one drawn by the scenario sampler, or
    `options={"scenario": name | path | Scenario}`) from PARTIES' fair allocation and returns the
    observation of its first interval.

    ## Episode End

    The episode is truncated after `episode_intervals` steps (default: the scenario's duration
    divided by the control interval, or 120 s on a node that runs its own load). It never
    terminates: a server has no terminal state.

    ## Arguments

    `gym.make("ColocSim-v0", **fields)` takes the fields of `EnvConfig` as keywords
    (`max_apps=6`, `action_mode="single"`, `scenario=None`, `sampler=None` (= `SamplerConfig()`
    in simulation), `episode_intervals=None`, `reward=RewardConfig()`, `features=FeatureConfig()`)
    or `config=EnvConfig(...)`. `NodeEnv(config, node=..., reward=...)` wraps any node.
    `render_mode="ansi"` renders a text table of the apps.

    ## Version History

    * v0: initial version.
    """

    # not a ClassVar: gymnasium's Env declares `metadata` as an instance attribute
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 2}  # noqa: RUF012

    def __init__(
        self,
        config: EnvConfig | Mapping[str, Any] | None = None,
        *,
        node: Node | None = None,
        reward: RewardFn | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.config = EnvConfig.resolve(config)
        if node is None:
            self.config = self.config.for_simulation()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r}; choose one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.encoder = ObservationEncoder(self.config.max_apps, self.config.features)
        self.codec = ActionCodec(self.config.max_apps, self.config.action_mode)
        self.reward_fn: RewardFn = as_reward_fn(reward) if reward else QosFirstReward(self.config.reward)
        self.planner = EpisodePlanner(self.config)
        self.observation_space = self.encoder.space
        self.action_space = self.codec.space
        self.node = node
        self.guards = build_guards(self.config.guards)
        self._obs: Observation | None = None
        self._caps: Capabilities | None = None
        self._mask: np.ndarray | None = None
        self._scenario_name = ""
        self._t = 0
        self._length = 0
        self._t0_s = 0.0

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        scenario, node_seed = self.planner.draw(self.np_random, (options or {}).get("scenario"))
        if self.node is None:
            assert scenario is not None  # for_simulation() guarantees a scenario or a sampler
            from env.sim.node import SimNode  # the simulator loads numba kernels: import on first use

            self.node = SimNode(
                scenario, seed=node_seed, histograms=False, initial=self._start() or fair_allocation
            )
            obs = self.node.observe()  # the policy sees p99s only (no histograms)
        else:
            obs = self._reset_node(node_seed, scenario)
        caps = self.node.capabilities()
        running = scenario if scenario is not None else getattr(self.node, "scenario", None)
        self._length = self.planner.episode_intervals(running, caps)
        self._scenario_name = running.name if isinstance(running, Scenario) else ""
        self._caps, self._t = caps, 0
        self.guards.reset(caps)
        self._t0_s = self.node.clock.now()
        x, mask = self._observe(obs, previous=None)
        return x, reset_info(obs, mask, self._scenario_name)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._obs is None or self.node is None or self._caps is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        decoded = self.codec.decode(action, self._obs, self._caps)
        target = guarded_target(self.guards, decoded, self._obs, self._caps)
        if target is not None:
            self.node.apply(target)
        self._t += 1
        self.node.clock.sleep_until(self._t0_s + self._t * self._caps.interval_s)
        obs = self.node.observe()
        terms = self.reward_fn(obs, self._caps, tail_at_target(self.node))
        x, mask = self._observe(obs, previous=self._obs)
        info = step_info(obs, terms, decoded, mask, self._scenario_name, self._t)
        return x, terms.reward, False, self._t >= self._length, info

    # gymnasium types render() with a free TypeVar (RenderFrame); the "ansi" mode returns text
    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode != "ansi" or self._obs is None or self._caps is None:
            return None
        return render_text(self._obs, self._caps)

    def close(self) -> None:
        if self.node is not None:
            self.node.close()

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def observation(self) -> Observation | None:
        """The last raw `Observation` (what a `Controller` would see)."""
        return self._obs

    @property
    def capabilities(self) -> Capabilities | None:
        return self._caps

    def _start(self) -> Callable[[Capabilities], Allocation] | None:
        return episode_start(self.config, self.np_random)

    def _reset_node(self, node_seed: int, scenario: Scenario | None) -> Observation:
        assert self.node is not None
        if self.config.lean_start_moves:
            from env.sim.node import SimNode  # only a simulated node starts where it is told

            if isinstance(self.node, SimNode):
                return self.node.reset(node_seed, scenario, initial=self._start())
        return self.node.reset(node_seed, scenario)

    def _observe(self, obs: Observation, previous: Observation | None) -> tuple[np.ndarray, np.ndarray]:
        """The encoded observation and its action mask; both are kept for the next step."""
        assert self._caps is not None
        self._obs = obs
        self._mask = mask = self.codec.mask(obs, self._caps)
        return self.encoder.encode(obs, self._caps, previous=previous), mask


def render_text(obs: Observation, caps: Capabilities) -> str:
    """A one-screen text view of an observation (render_mode="ansi")."""
    lines = [
        f"t={obs.time_s:8.1f}s  power={obs.power_w:6.1f}W  membw={obs.mem_bw_gbps:5.1f}GB/s  BE={obs.be_throughput:5.3f}"
    ]
    lines.append(f"{'app':<12}{'load':>6}{'p99/tgt':>9}{'cores':>7}{'ways':>6}{'MHz':>6}{'memGB':>7}")
    for s in obs.apps:
        a = obs.allocation[s.name]
        lines.append(
            f"{s.name:<12}{s.load_frac:6.2f}{s.tardiness:9.2f}{a.cores:7.1f}{a.llc_ways:6d}{a.freq_mhz:6d}{a.memory_gb:7.1f}"
        )
    for b in caps.be_apps:
        if b.name in obs.allocation:
            a = obs.allocation[b.name]
            lines.append(
                f"{b.name:<12}{'':>6}{'':>9}{a.cores:7.1f}{a.llc_ways:6d}{a.freq_mhz:6d}{a.memory_gb:7.1f}"
            )
    return "\n".join(lines) + "\n"


# ---- RLlib action masking -----------------------------------------------------------------------
def mask_space(codec: ActionCodec) -> spaces.Box:
    """The Box of the flattened action mask (0/1 floats, `codec.mask_size` entries) in RLlib's
    Dict observation."""
    return spaces.Box(0.0, 1.0, shape=(codec.mask_size,), dtype=np.float32)


def masked_observation(x: np.ndarray, mask: np.ndarray, batched: bool = False) -> dict[str, np.ndarray]:
    """The RLlib action-masking observation: {"observations": features, "action_mask": 0/1 floats}.

    The mask is flattened (per sub-env when `batched`): in per-app mode its 11 * max_apps entries
    line up with the concatenated logits of RLlib's MultiDiscrete distribution, as the Discrete
    logits do in single mode."""
    flat = mask.reshape(mask.shape[0], -1) if batched else mask.reshape(-1)
    return {"observations": x, "action_mask": flat.astype(np.float32)}


class ActionMaskObs(gym.Wrapper):
    """Puts `info["action_mask"]` into the observation: Dict({"observations": Box,
    "action_mask": Box(0, 1, (n,), float32)}), the layout RLlib's action-masking RLModule expects
    (ray.rllib.examples.rl_modules.classes.action_masking_rlm). n = 1 + 10 * max_apps in single
    mode, 11 * max_apps in per-app mode."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        base = env.unwrapped
        assert isinstance(base, NodeEnv), f"ActionMaskObs wraps a NodeEnv, not {type(base).__name__}"
        codec = base.codec
        self.observation_space = spaces.Dict(
            {"observations": env.observation_space, "action_mask": mask_space(codec)}
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        x, info = self.env.reset(seed=seed, options=options)
        return masked_observation(x, info["action_mask"]), info

    def step(self, action: Any):
        x, r, term, trunc, info = self.env.step(action)
        return masked_observation(x, info["action_mask"]), r, term, trunc, info


# ---- registration -------------------------------------------------------------------------------
def make_sim_env(
    config: EnvConfig | Mapping[str, Any] | None = None, *, render_mode: str | None = None, **fields: Any
) -> NodeEnv:
    """Entry point of `ColocSim-v0`: a `NodeEnv` over a `SimNode` (built at the first reset)."""
    return NodeEnv(EnvConfig.resolve(config, **fields), render_mode=render_mode)


def register_envs() -> None:
    """Register `ColocSim-v0` (with the native vector env) and `ColocLinux-v0` once. `env/` does not
    import `hw/`: the real-node entry point is a string resolved by `gym.make`."""
    if "ColocSim-v0" not in gym.registry:
        gym.register(
            id="ColocSim-v0",
            entry_point="env.gym_env:make_sim_env",
            vector_entry_point="env.vector_env:make_sim_vector_env",
            nondeterministic=False,
        )
    if "ColocLinux-v0" not in gym.registry:
        gym.register(id="ColocLinux-v0", entry_point="hw.gym:make_linux_env", nondeterministic=True)


register_envs()
