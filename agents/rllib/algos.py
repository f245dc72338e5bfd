"""RLlib algorithm configs (new API stack) for a `TrainConfig`: PPO (`single` / `per_app`) and DQN
(`single`), over the batched simulator with the action-masking modules of `agents.rllib.module`.

`build_algo_config(config)` returns an `AlgorithmConfig` ready for `.build_algo()`; every setting
that decides what is learned comes from the typed config, so the resolved `OUT/config.yaml` fully
describes a run.
"""

from __future__ import annotations

import gymnasium as gym
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.tune.registry import register_env

from agents.rllib.callbacks import ColocMetricsCallback
from agents.rllib.config import ResourcesConfig, TrainConfig
from agents.rllib.envs import make_training_env, training_env_config
from agents.rllib.learner import IMITATION_SEED, IMITATION_WEIGHT, ColocPPOLearner
from agents.rllib.module import ColocDQNModule, ColocPPOModule, net_model_config

ENV_ID = "coloc-sim-train"  # the Ray-registered name of `make_training_env`
# RLlib's default (60 s) drops a whole iteration's samples when a shared machine is busy
SAMPLE_TIMEOUT_S = 600.0


def build_algo_config(config: TrainConfig, resources: ResourcesConfig | None = None) -> AlgorithmConfig:
    """The RLlib config of a run; `resources` overrides `config.resources` (e.g. `--num-env-runners`)."""
    res = resources or config.resources
    register_env(ENV_ID, make_training_env)  # in Ray's registry, so remote env runners find it
    spec = config.net_spec()
    if config.algo == "ppo":
        p = config.ppo
        algo: AlgorithmConfig = PPOConfig().training(
            lr=p.lr,
            gamma=p.gamma,
            lambda_=p.gae_lambda,
            clip_param=p.clip_param,
            entropy_coeff=p.entropy_coeff,
            vf_loss_coeff=p.vf_loss_coeff,
            vf_clip_param=p.vf_clip_param,
            use_kl_loss=p.use_kl_loss,
            kl_coeff=p.kl_coeff,
            num_epochs=p.num_epochs,
            minibatch_size=p.minibatch_size,
            train_batch_size_per_learner=p.train_batch_size,
            grad_clip=p.grad_clip,
        )
        module = ColocPPOModule
        if p.imitation_weight > 0:  # PPO's loss plus the warm start's imitation loss
            algo = algo.learners(
                learner_class=ColocPPOLearner,
                learner_config_dict={IMITATION_WEIGHT: p.imitation_weight, IMITATION_SEED: config.seed},
            )
    else:
        d = config.dqn
        buffer = "PrioritizedEpisodeReplayBuffer" if d.prioritized_replay else "EpisodeReplayBuffer"
        replay: dict = {"type": buffer, "capacity": d.replay_capacity}
        if d.prioritized_replay:
            replay |= {"alpha": 0.6, "beta": 0.4}
        algo = DQNConfig().training(
            lr=d.lr,
            gamma=d.gamma,
            n_step=d.n_step,
            double_q=d.double_q,
            dueling=False,
            num_atoms=1,
            train_batch_size_per_learner=d.train_batch_size,
            replay_buffer_config=replay,
            target_network_update_freq=d.target_network_update_freq,
            epsilon=[(0, d.initial_epsilon), (d.epsilon_timesteps, d.final_epsilon)],
            num_steps_sampled_before_learning_starts=d.learning_starts,
            training_intensity=d.training_intensity,
            grad_clip=d.grad_clip,  # type: ignore[arg-type]  # RLlib annotates int; it clips to any float
        )
        module = ColocDQNModule
    return (
        algo.api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(env=ENV_ID, env_config=training_env_config(config))
        .env_runners(
            num_env_runners=res.num_env_runners,
            num_envs_per_env_runner=res.num_envs_per_env_runner,
            num_cpus_per_env_runner=res.num_cpus_per_env_runner,  # type: ignore[arg-type]  # RLlib annotates int; Ray takes fractional CPUs
            gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT,
            rollout_fragment_length=res.rollout_fragment_length or "auto",
            sample_timeout_s=SAMPLE_TIMEOUT_S,
        )
        .learners(num_learners=res.num_learners, num_cpus_per_learner=res.num_cpus_per_learner)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=module, model_config=net_model_config(spec)))
        .callbacks(ColocMetricsCallback)
        .debugging(seed=config.seed, log_level="ERROR")
    )
