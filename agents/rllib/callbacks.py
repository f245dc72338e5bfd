"""Training metrics in the fixed TensorBoard namespaces (DESIGN §6.7): `train/`, `qos/`, `be/`.

`ColocMetricsCallback` runs in the env runners: at the end of every episode it summarises the
per-step `info` of `env.gym_env.step_info` (QoS met, violation severity, BE throughput, reclaimed
resources, refused moves) and logs them to RLlib's metrics logger under `qos/...`, `be/...` and
`train/...` keys; they arrive in each iteration's result under `env_runners`.
`tensorboard_scalars(result)` maps a result dict (RLlib's metric keys) to the tags `train.py` writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    EPISODE_LEN_MEAN,
    EPISODE_RETURN_MEAN,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    TIMERS,
)

EPISODE_METRICS = {  # metrics-logger key: what it is (per episode, then averaged over episodes)
    "qos/met_frac": "fraction of the episode's intervals in which every LC app met its target",
    "qos/violation_mean": "mean violation severity (sum over missing apps of p99/target - 1, capped)",
    "be/throughput_mean": "mean BE throughput, normalised to the BE job alone",
    "be/reclaimed_mean": "mean share of cores, ways, memory and disk held by no LC app",
    "train/refused_frac": "fraction of intervals with a refused (infeasible) move; 0 with masking",
    "train/hold_frac": "fraction of intervals the policy held",
}
WINDOW = 100  # episodes averaged per reported value


def episode_summary(infos: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """The `EPISODE_METRICS` of one episode from its step infos (the reset info has no
    `qos_met` and is skipped); None for an episode without steps."""
    steps = [i for i in infos if "qos_met" in i]
    if not steps:
        return None
    n = len(steps)
    terms = [i.get("reward_terms", {}) for i in steps]
    return {
        "qos/met_frac": sum(bool(i["qos_met"]) for i in steps) / n,
        "qos/violation_mean": sum(float(t.get("violation", 0.0)) for t in terms) / n,
        "be/throughput_mean": sum(float(t.get("be_throughput", 0.0)) for t in terms) / n,
        "be/reclaimed_mean": sum(float(t.get("reclaimed", 0.0)) for t in terms) / n,
        "train/refused_frac": sum(bool(i.get("infeasible_action")) for i in steps) / n,
        "train/hold_frac": sum(i.get("moves") == "HOLD" for i in steps) / n,
    }


class ColocMetricsCallback(RLlibCallback):
    """Logs `EPISODE_METRICS` at each episode's end (module docstring)."""

    def on_episode_end(
        self,
        *,
        episode: Any,
        prev_episode_chunks: list[Any] | None = None,
        metrics_logger: Any = None,
        **kwargs: Any,
    ) -> None:
        if metrics_logger is None:
            return
        infos: list[Mapping[str, Any]] = []
        for chunk in [*(prev_episode_chunks or []), episode]:
            infos.extend(chunk.get_infos())
        summary = episode_summary(infos)
        if summary is None:
            return
        for key, value in summary.items():
            metrics_logger.log_value(key, value, reduce="mean", window=WINDOW)


def _get(d: Mapping[str, Any], *path: str) -> float | None:
    x: Any = d
    for p in path:
        if not isinstance(x, Mapping) or p not in x:
            return None
        x = x[p]
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


LEARNER_TAGS = {  # RLlib learner metric -> TensorBoard tag
    "policy_loss": "train/policy_loss",
    "vf_loss": "train/vf_loss",
    "entropy": "train/entropy",
    "mean_kl_loss": "train/kl",
    "vf_explained_var": "train/vf_explained_var",
    "qf_loss": "train/qf_loss",
    "qf_mean": "train/q_mean",
    "td_error_mean": "train/td_error_mean",
    "imitation_loss": "train/imitation_loss",  # ppo.imitation_weight > 0 (agents.rllib.learner)
}


def tensorboard_scalars(result: Mapping[str, Any]) -> dict[str, float]:
    """TensorBoard tag -> value for one `Algorithm.train()` result (keys that are missing, e.g.
    before the first finished episode, are left out)."""
    out: dict[str, float | None] = {
        "train/episode_return_mean": _get(result, ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN),
        "train/episode_len_mean": _get(result, ENV_RUNNER_RESULTS, EPISODE_LEN_MEAN),
        "train/env_steps": _get(result, ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME),
        "train/sample_s": _get(result, TIMERS, ENV_RUNNER_SAMPLING_TIMER),
        "train/learn_s": _get(result, TIMERS, LEARNER_UPDATE_TIMER),
    }
    for key in EPISODE_METRICS:
        out[key] = _get(result, ENV_RUNNER_RESULTS, key)
    learner = result.get(LEARNER_RESULTS, {})
    module = learner.get("default_policy", {}) if isinstance(learner, Mapping) else {}
    for key, tag in LEARNER_TAGS.items():
        out[tag] = _get(module, key)
    return {k: v for k, v in out.items() if v is not None}
