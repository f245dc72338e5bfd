"""Reinforcement learning with RLlib's new API stack: one policy for any mix of LC apps.

Modules (import the one you need; only `module`, `algos`, `callbacks` import Ray):

* `config`    the typed training config (`configs/train/*.yaml`, `--set` overrides)
* `envs`      the training env: batched simulator, action masks, domain randomisation, reward scale
* `module`    RLModules around `agents.policy.ColocNet` (PPO: masked logits + value; DQN: masked Q)
* `algos`     PPO / DQN `AlgorithmConfig` builders
* `callbacks` qos/, be/, train/ metrics from the env runners; TensorBoard scalars of a result
* `imitation` warm start: behaviour cloning of a teacher controller before RL (DAgger)
* `selection` which network becomes the policy: the best on validation episodes
* `runtime`   Ray sessions, checkpoints and their manifest, export (`harness.training` drives a run)

Serving needs none of this: `agents.policy` loads the exported network with torch alone.
"""
