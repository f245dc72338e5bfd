"""The typed training config of `train.py` (`configs/train/*.yaml`), strict like every config.

A YAML file is data for `TrainConfig`; `load_train_config(path, overrides)` applies `--set
key=value` overrides (dotted paths, values parsed as YAML; a mapping is merged into the section it
names, never replaces it) to the raw mapping and builds it
with `env.config.build`, so an unknown key - in the file or in an override - is a `ConfigError`
naming the field (exit 2 in the CLI). `resolved(config)` is the plain mapping saved beside a run
(`OUT/config.yaml`), which loads back into the same config.

Sections:

* `algo`: `ppo` (both action modes) or `dqn` (`single` mode only: RLlib's DQN needs a Discrete
  action space);
* `env`: `env.gym_env.EnvConfig` (action mode, `max_apps`, the scenario sampler, episode length,
  reward weights, feature scales); training always draws scenarios from the sampler, so
  `env.scenario` must stay null;
* `domain_randomization`: per-episode multiplicative factors on every LC app's physical
  parameters (`env.sim.scenario.AppEntry.perturb`), so the policy does not overfit one calibration;
* `model`: width of the network (`agents.policy.ColocNet`);
* `warm_start`: imitate a hand-written controller before RL (`agents.rllib.imitation`);
* `ppo` / `dqn`: the algorithm's hyper-parameters (only the section of `algo` is used);
* `resources`: env runners, vectorised envs per runner, learners (scaled out with `--ray-address`);
* `selection`: which network becomes `OUT/policy.pt`: the best of the imitated one and every
  checkpoint on validation episodes (`agents.rllib.selection`);
* `eval`: the end-of-training comparison with the baselines (`harness.compare.run_compare`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from agents.policy import NetSpec
from env.config import (
    ConfigError,
    build,
    load_yaml,
    plain_data,
    require_in,
    require_positive,
    resolve_config,
)
from env.guards import GuardsConfig
from env.gym_env import EnvConfig
from env.scenario_sampler import SamplerConfig
from env.sim.scenario import PERTURBABLE
from env.types import DOWNSIZE_SLACK_ABOVE

Algo = Literal["ppo", "dqn"]


def _default_factors() -> dict[str, tuple[float, float]]:
    return {
        "service": (0.85, 1.15),
        "frac_llc": (0.8, 1.25),
        "frac_mem": (0.8, 1.25),
        "llc_kappa_mb": (0.8, 1.25),
        "service_cv2": (0.8, 1.25),
    }


@dataclass(frozen=True)
class DomainRandomizationConfig:
    """Each episode, each LC app gets a factor per parameter drawn log-uniformly from
    `factors[param] = (low, high)` (parameters of `env.sim.scenario.PERTURBABLE`; `service` scales
    the app's derived service time). Disabled: the shipped profiles as they are."""

    enabled: bool = True
    factors: dict[str, tuple[float, float]] = field(default_factory=_default_factors)

    def __post_init__(self) -> None:
        for k, (lo, hi) in self.factors.items():
            if k not in PERTURBABLE:
                raise ConfigError(
                    f"domain_randomization.factors.{k}: not a perturbable parameter; allowed: {list(PERTURBABLE)}"
                )
            if not (0.1 <= lo <= hi <= 10.0):
                raise ConfigError(
                    f"domain_randomization.factors.{k}: need 0.1 <= low <= high <= 10, got [{lo}, {hi}]"
                )


@dataclass(frozen=True)
class ModelConfig:
    """`hidden_units`: width of every layer of `agents.policy.ColocNet`; `pressure_mask`: offer
    `<UP,MEM>` / `<UP,DISK>` only to apps that use most of their memory / disk bandwidth;
    `down_slack_min`: offer an app's DOWN moves only while its slack is above this (null: always;
    the network's docstring says why); `spare_core_util`: below it, still offer `<DOWN,CORE>` to an
    app whose cores are busy less than this fraction (null: never; agents.policy says why);
    `idle_core_util`: withhold `<UP,CORE>` from an app whose cores are busy less than this fraction
    (null: never; agents.policy says why)."""

    hidden_units: int = 128
    pressure_mask: bool = True
    down_slack_min: float | None = DOWNSIZE_SLACK_ABOVE  # PARTIES Alg. 1's downsize threshold
    spare_core_util: float | None = None
    idle_core_util: float | None = None

    def __post_init__(self) -> None:
        if not 4 <= self.hidden_units <= 4096:
            raise ConfigError(f"model.hidden_units must be in [4, 4096], got {self.hidden_units}")
        if self.down_slack_min is not None and not -1.0 <= self.down_slack_min < 1.0:
            raise ConfigError(f"model.down_slack_min must be in [-1, 1) or null, got {self.down_slack_min}")
        if self.spare_core_util is not None and not 0.0 < self.spare_core_util < 1.0:
            raise ConfigError(f"model.spare_core_util must be in (0, 1) or null, got {self.spare_core_util}")
        if self.idle_core_util is not None and not 0.0 < self.idle_core_util < 1.0:
            raise ConfigError(f"model.idle_core_util must be in (0, 1) or null, got {self.idle_core_util}")


@dataclass(frozen=True)
class PPOSettings:
    """RLlib PPO hyper-parameters (`PPOConfig.training`). `train_batch_size` is env steps per
    learner and iteration; `gamma` is per 500 ms interval (0.95: a ~10 s horizon, the time a
    load change takes to settle). `vf_clip_param` clips the critic's *squared* error: RLlib's
    default of 10 stops the critic from learning returns of this env (see `reward_scale`).
    `imitation_weight` > 0 keeps imitating the warm start's labels during PPO: each minibatch adds
    that weight times the imitation loss over `minibatch_size` of them (`agents.rllib.learner`;
    needs a `warm_start.teacher`; 0, the default, is PPO alone)."""

    lr: float = 3e-4
    gamma: float = 0.95
    gae_lambda: float = 0.95
    clip_param: float = 0.2
    entropy_coeff: float = 0.01
    vf_loss_coeff: float = 0.5
    vf_clip_param: float = 100.0
    use_kl_loss: bool = False
    kl_coeff: float = 0.2
    num_epochs: int = 6
    minibatch_size: int = 512
    train_batch_size: int = 4096
    grad_clip: float = 0.5
    imitation_weight: float = 0.0

    def __post_init__(self) -> None:
        require_positive("ppo", lr=self.lr, num_epochs=self.num_epochs, minibatch_size=self.minibatch_size)
        if not (self.imitation_weight >= 0 and math.isfinite(self.imitation_weight)):
            raise ConfigError(f"ppo.imitation_weight must be >= 0, got {self.imitation_weight}")
        require_in("ppo", 0.0, 1.0, gamma=self.gamma, gae_lambda=self.gae_lambda)
        if self.minibatch_size > self.train_batch_size:
            raise ConfigError("ppo.minibatch_size must be <= ppo.train_batch_size")


@dataclass(frozen=True)
class DQNSettings:
    """RLlib DQN hyper-parameters (`DQNConfig.training`), masked Q-values, epsilon-greedy over the
    feasible moves. Epsilon falls linearly from `initial_epsilon` to `final_epsilon` over
    `epsilon_timesteps` env steps; `target_network_update_freq` is in env steps."""

    lr: float = 5e-4
    gamma: float = 0.95
    n_step: int = 3
    double_q: bool = True
    train_batch_size: int = 256
    replay_capacity: int = 100_000
    prioritized_replay: bool = True
    target_network_update_freq: int = 2000
    initial_epsilon: float = 1.0
    final_epsilon: float = 0.05
    epsilon_timesteps: int = 50_000
    learning_starts: int = 2000
    training_intensity: float | None = None
    grad_clip: float = 10.0

    def __post_init__(self) -> None:
        require_positive(
            "dqn",
            lr=self.lr,
            n_step=self.n_step,
            train_batch_size=self.train_batch_size,
            replay_capacity=self.replay_capacity,
            target_network_update_freq=self.target_network_update_freq,
            epsilon_timesteps=self.epsilon_timesteps,
        )
        require_in(
            "dqn",
            0.0,
            1.0,
            gamma=self.gamma,
            initial_epsilon=self.initial_epsilon,
            final_epsilon=self.final_epsilon,
        )


@dataclass(frozen=True)
class ResourcesConfig:
    """Where the work runs. `num_env_runners` remote sampling actors (0 = sample in the driver),
    each stepping `num_envs_per_env_runner` simulated nodes in one batched kernel call
    (`env.vector_env.NodeVectorEnv`); `num_learners` remote learners (0 = learn in the driver).
    `rollout_fragment_length`: env steps per sub-env per sample call (null = RLlib's "auto").
    `local_num_cpus` is the CPU count of the Ray session `train.py` starts when no `--ray-address`
    is given (null = all of the machine's). `driver_torch_threads`: torch intra-op threads of the
    driver process, where the learner runs when `num_learners` is 0 (null = torch's default, one
    per core). Default 1: minibatches of this small network gain nothing from more, and on the
    shared 2-core machine torch's default pool made a PPO update 15x slower (learner 12.6 s vs
    0.8 s per 2048-step iteration of configs/train/demo.yaml)."""

    num_env_runners: int = 2
    num_envs_per_env_runner: int = 16
    num_cpus_per_env_runner: float = 1.0
    rollout_fragment_length: int | None = None
    num_learners: int = 0
    num_cpus_per_learner: float = 1.0
    local_num_cpus: int | None = 2
    driver_torch_threads: int | None = 1

    def __post_init__(self) -> None:
        if self.num_env_runners < 0 or self.num_learners < 0:
            raise ConfigError("resources.num_env_runners and num_learners must be >= 0")
        if self.num_envs_per_env_runner < 1:
            raise ConfigError("resources.num_envs_per_env_runner must be >= 1")
        for k in ("local_num_cpus", "driver_torch_threads", "rollout_fragment_length"):
            v = getattr(self, k)
            if v is not None and v < 1:
                raise ConfigError(f"resources.{k} must be >= 1 (or null)")


@dataclass(frozen=True)
class EvalConfig:
    """The end-of-training evaluation: the trained policy (`rl:OUT/policy.pt`) and `baselines` on
    each scenario (`configs/scenarios/`) for `seeds` seeds, with `harness.compare.run_compare`
    (the schema of `evaluate.py compare`); results in `OUT/eval/<scenario>/`.
    `single_app_baselines` join the comparison only on scenarios with one LC app: Intel PRM and
    the Q-PRM controllers manage one LC app beside BE jobs (Q-PRM thesis Sec. 5.2; with more they
    manage the strictest one and leave the others as they are, `baselines.prm`)."""

    enabled: bool = True
    scenarios: tuple[str, ...] = ("fig9-ramp", "qprm-sinusoid", "step-load", "mix3-const")
    baselines: tuple[str, ...] = ("parties",)
    single_app_baselines: tuple[str, ...] = ()
    seeds: int = 2
    workers: int = 1

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.workers < 1:
            raise ConfigError("eval.seeds and eval.workers must be >= 1")
        both = set(self.baselines) & set(self.single_app_baselines)
        if both:
            raise ConfigError(f"eval: {sorted(both)} listed in both baselines and single_app_baselines")
        if self.enabled and not self.scenarios:
            raise ConfigError("eval.scenarios: empty (set eval.enabled: false to skip the evaluation)")
        for s in self.scenarios:
            try:
                resolve_config("scenarios", s)
            except ConfigError as e:
                raise ConfigError(f"eval.scenarios: {e}") from None


@dataclass(frozen=True)
class WarmStartConfig:
    """Imitate `teacher` (a controller spec, e.g. `parties`; null = start from a random policy)
    before RL (`agents.rllib.imitation`): `episodes` teacher episodes of the training env, then
    `epochs` passes of supervised learning (policy: cross-entropy on the teacher's moves; critic,
    weighted by `value_weight`: the discounted returns). Then `dagger_rounds` DAgger rounds of
    `episodes` episodes each, the network acting in a `dagger_student_frac` share of the intervals
    and the teacher labelling them all, each followed by `epochs` passes over every label so far.
    `dagger_episodes`: `same` replays the teacher's episodes (their mixes, traces and perturbed
    parameters: the student's own states on them), so a teacher that caches its plans per episode
    (the Oracle-guided one) plans nothing again; `new` draws fresh ones each round. `workers`
    processes drive the episodes, each keeping its caches for the whole warm start. With a time
    budget (`max_train_minutes`), no DAgger round starts once a `dagger_budget_share` of it is
    spent: the rest is PPO's. `labels`: `teacher` imitates the teacher's own move; `options` accepts
    any of the moves a teacher names as equally good beside it (the Oracle-guided teacher's step of
    moves toward its plan, among which the observation cannot tell which it would take first:
    the loss is -log P(one of them)); a teacher that names none is imitated as with `teacher`.
    PPO only."""

    teacher: str | None = None
    episodes: int = 40
    epochs: int = 30
    batch_size: int = 256
    lr: float = 1e-3
    value_weight: float = 0.5
    dagger_rounds: int = 0
    dagger_student_frac: float = 0.5
    dagger_episodes: str = "same"  # or "new" (above)
    dagger_budget_share: float = 0.5  # of max_train_minutes, after which no DAgger round starts
    workers: int = 1  # processes driving the teacher's episodes (the same labels as one)
    labels: str = "teacher"  # or "options" (above)

    def __post_init__(self) -> None:
        require_positive(
            "warm_start",
            episodes=self.episodes,
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            workers=self.workers,
        )
        if self.value_weight < 0:
            raise ConfigError("warm_start.value_weight must be >= 0")
        if self.dagger_rounds < 0:
            raise ConfigError("warm_start.dagger_rounds must be >= 0")
        require_in(
            "warm_start",
            0.0,
            1.0,
            dagger_student_frac=self.dagger_student_frac,
            dagger_budget_share=self.dagger_budget_share,
        )
        if self.labels not in ("teacher", "options"):
            raise ConfigError(f"warm_start.labels must be 'teacher' or 'options', got {self.labels!r}")
        if self.dagger_episodes not in ("same", "new"):
            raise ConfigError(
                f"warm_start.dagger_episodes must be 'same' or 'new', got {self.dagger_episodes!r}"
            )


@dataclass(frozen=True)
class SelectionConfig:
    """`episodes` validation episodes score the imitated network and every checkpoint, and the best
    becomes `OUT/policy.pt` (`agents.rllib.selection`); 0 = the last iteration's network is the
    policy, as without selection. `average_best` > 1: `OUT/policy.pt` is the mean of the weights
    of that many best-scoring networks instead of the best one (`agents.policy.average_policies`).
    `rescore_best` > 1: at the end of a session the `rescore_best` best-scoring networks (and their
    mean, with `average_best` > 1) are scored again on `rescore_episodes` episodes, and the highest
    becomes `OUT/policy.pt`; 1 = no rescoring."""

    episodes: int = 16
    average_best: int = 1
    rescore_best: int = 1
    rescore_episodes: int = 128

    def __post_init__(self) -> None:
        if self.episodes < 0:
            raise ConfigError(f"selection.episodes must be >= 0, got {self.episodes}")
        for name, k in (("average_best", self.average_best), ("rescore_best", self.rescore_best)):
            if k < 1:
                raise ConfigError(f"selection.{name} must be >= 1, got {k}")
            if k > 1 and self.episodes == 0:
                raise ConfigError(
                    f"selection.{name} > 1 needs validation scores to rank the networks (selection.episodes > 0)"
                )
        if self.rescore_best > 1 and self.rescore_episodes <= self.episodes:
            raise ConfigError(
                f"selection.rescore_best > 1 rescores the best networks on more episodes than they were ranked on: "
                f"selection.rescore_episodes must be > selection.episodes ({self.episodes}), got {self.rescore_episodes}"
            )


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (module docstring). `iterations` are RLlib training
    iterations; a checkpoint is written every `checkpoint_every` iterations and at the end, and the
    newest `keep_checkpoints` are kept. `max_train_minutes` bounds the wall time of a session
    (building the algorithm, the warm start and the iterations; not the final evaluation): it stops
    early, with a checkpoint, rather than start an iteration it expects to end past the budget.
    `seed` seeds RLlib, the envs' scenario draws and the
    network's initialisation. `reward_scale` multiplies the env's reward before the learner sees
    it (`agents.rllib.envs.ScaledReward`: same optimal policy, value targets the critic can fit);
    the qos/ and be/ metrics stay unscaled, `train/episode_return_mean` is scaled."""

    algo: Algo = "ppo"
    iterations: int = 100
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    max_train_minutes: float | None = None
    seed: int = 0
    reward_scale: float = 0.1
    env: EnvConfig = field(default_factory=lambda: EnvConfig(sampler=SamplerConfig()))
    domain_randomization: DomainRandomizationConfig = field(default_factory=DomainRandomizationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    ppo: PPOSettings = field(default_factory=PPOSettings)
    dqn: DQNSettings = field(default_factory=DQNSettings)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.checkpoint_every < 1 or self.keep_checkpoints < 1:
            raise ConfigError("iterations, checkpoint_every and keep_checkpoints must be >= 1")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.max_train_minutes is not None and not self.max_train_minutes > 0:
            raise ConfigError(f"max_train_minutes must be > 0 (or null), got {self.max_train_minutes}")
        if not self.reward_scale > 0:
            raise ConfigError(f"reward_scale must be > 0, got {self.reward_scale}")
        if self.env.scenario is not None:
            raise ConfigError(
                "env.scenario: training draws scenarios from env.sampler (random mixes, loads and traces); "
                "leave env.scenario null and evaluate fixed scenarios with eval.scenarios"
            )
        if self.env.sampler is None:
            object.__setattr__(self, "env", dataclasses.replace(self.env, sampler=SamplerConfig()))
        if self.algo == "dqn" and self.warm_start.teacher is not None:
            raise ConfigError(
                "warm_start.teacher: imitation warm start is implemented for ppo only (set it to null)"
            )
        if self.algo == "ppo" and self.ppo.imitation_weight > 0 and self.warm_start.teacher is None:
            raise ConfigError(
                "ppo.imitation_weight keeps imitating the warm start's labels: it needs a warm_start.teacher"
            )
        teacher = (self.warm_start.teacher or "").partition(":")[0]
        if teacher.endswith("-per-app") and self.env.action_mode != "per_app":
            raise ConfigError(
                f"warm_start.teacher {self.warm_start.teacher!r} moves every app at once: its labels need "
                "env.action_mode: per_app"
            )
        if self.algo == "dqn" and self.env.action_mode != "single":
            raise ConfigError(
                "algo dqn needs env.action_mode: single (RLlib's DQN acts on a Discrete space); use ppo for per_app"
            )

    @property
    def guards(self) -> GuardsConfig:
        """The run's guard chain (`env.guards`): the training env applies it, the final comparison
        runs under it, and the exported policy records it."""
        return self.env.guards

    def net_spec(self) -> NetSpec:
        """The network this config trains and exports."""
        return NetSpec(
            action_mode=self.env.action_mode,
            max_apps=self.env.max_apps,
            hidden_units=self.model.hidden_units,
            with_value=self.algo == "ppo",
            pressure_mask=self.model.pressure_mask,
            down_slack_min=self.model.down_slack_min,
            spare_core_util=self.model.spare_core_util,
            idle_core_util=self.model.idle_core_util,
        )


# ---- loading --------------------------------------------------------------------------------------
def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as a YAML scalar/flow value; `1e-4` is a number)."""
    key, sep, raw = text.partition("=")
    path = [p.strip() for p in key.split(".")]
    if not sep or not all(path):
        raise ConfigError(f"--set {text!r}: expected key=value with a dotted key, e.g. ppo.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({e})") from None
    if isinstance(value, str) and value.strip().lower() not in ("nan", "inf", "-inf", "+inf"):
        with contextlib.suppress(ValueError):  # YAML 1.1 reads 1e-4 (no dot) as a string
            value = float(value)
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A deep copy of `data` with each `key=value` set (missing intermediate mappings created); a
    mapping value is merged into the section it names (`--set 'ppo={lr: 1e-4}'` changes `ppo.lr` and
    keeps the file's other `ppo` keys). The result is validated by `build`, so an unknown key fails
    there, naming the field."""
    out: dict[str, Any] = _copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {text!r}: {'.'.join(path[: i + 1])} is not a section")
            node = nxt
        old = node.get(path[-1])
        node[path[-1]] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _merged(old: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`old` with `new`'s keys set, sections merged recursively."""
    out = dict(old)
    for k, v in new.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _copy(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_copy(v) for v in x]
    return x


def build_train_config(
    data: Mapping[str, Any] | None, overrides: Sequence[str] = (), where: str = "train"
) -> TrainConfig:
    """A `TrainConfig` from a raw mapping and `--set` overrides (ConfigError on anything unknown)."""
    raw = apply_overrides(dict(data or {}), overrides)
    return build(TrainConfig, raw, where)


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """`configs/train/<name>.yaml` (by name or path) with `--set` overrides."""
    p = resolve_config("train", path)
    data = load_yaml(p)
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"{p}: expected a mapping of config sections, got {type(data).__name__}")
    return build_train_config(data, overrides, where=p.name)


def resolved(config: TrainConfig) -> dict[str, Any]:
    """The config as plain YAML data (tuples as lists; loads back with `build_train_config`), as
    `evaluate.py` saves its resolved configs."""
    return plain_data(config)
