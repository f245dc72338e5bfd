"""PPO's learner, keeping the warm start's imitation loss beside PPO's own (`ppo.imitation_weight`).

Why: fine-tuned by PPO alone, the network imitated from the Oracle-guided teacher drifts from the
teacher's moves toward holding what it has (README, "Where the learned policy stands": where the
teacher would take a core from xapian at half its target, the shipped network holds with
probability 0.85 and takes the core with 0.00; 100 PPO iterations earlier, in a similar state, it
held with 0.6).
Keeping a behaviour-cloning term on the demonstrations during RL fine-tuning is how DAPG
(Rajeswaran et al., RSS 2018, demo augmented policy gradient) and kickstarting (Schmitt et
al., 2018) keep what the demonstrations teach while RL improves on them. Measured at weight 0.5 it
did not help (README: EMU higher on 3 of 13 scenarios, QoS on the Q-PRM node far below PARTIES'),
so the default is 0.

Each PPO minibatch update adds `imitation_weight` x `agents.rllib.imitation.imitation_loss` over
`minibatch_size` labels drawn uniformly from the warm start's demonstrations (its expressible
labels, every DAgger round's included) to PPO's loss; the term is logged as `imitation_loss`.
The demonstrations reach the learner after the warm start (`keep_imitating`, through
`LearnerGroup.foreach_learner`, so a remote learner gets them too); `train.py` keeps them in the run
directory (`DEMOS_FILE`), from which `--resume` gives them to the learner again.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from agents.policy import atomic_write_bytes
from agents.rllib.imitation import imitation_loss
from agents.rllib.module import ColocPPOModule

IMITATION_WEIGHT = "imitation_weight"  # learner_config_dict keys
IMITATION_SEED = "imitation_seed"
DEMOS_FILE = "demonstrations.npz"  # in the run directory: (features, masks, accepted) imitated
_DEMO_KEYS = ("features", "masks", "accepted")


class ColocPPOLearner(PPOTorchLearner):
    """`PPOTorchLearner` plus the imitation term (module docstring)."""

    _demos: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    _gen: torch.Generator | None = None

    def set_demonstrations(self, features: np.ndarray, masks: np.ndarray, accepted: np.ndarray) -> int:
        """Keep the labels to imitate (the expressible ones); returns how many."""
        if not (len(features) == len(masks) == len(accepted)) or len(features) == 0:
            raise ValueError(
                "set_demonstrations: features, masks and accepted must be non-empty, equal lengths"
            )
        self._demos = (
            torch.as_tensor(np.asarray(features, dtype=np.float32)),
            torch.as_tensor(np.asarray(masks, dtype=np.float32)),
            torch.as_tensor(np.asarray(accepted, dtype=bool)),
        )
        seed = int(self.config.learner_config_dict.get(IMITATION_SEED, 0))
        self._gen = torch.Generator().manual_seed(seed)
        return len(features)

    def compute_loss_for_module(
        self, *, module_id: Any, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> Any:  # a torch scalar (RLlib's TensorType)
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        weight = float(self.config.learner_config_dict.get(IMITATION_WEIGHT, 0.0))
        if weight <= 0.0 or self._demos is None:
            return loss
        assert self._gen is not None
        x, m, ok = self._demos
        idx = torch.randint(len(x), (min(self.config.minibatch_size or len(x), len(x)),), generator=self._gen)
        module = self.module[module_id].unwrapped()
        assert isinstance(module, ColocPPOModule)
        net = module.net
        ones = torch.ones(len(idx))
        bc = imitation_loss(net, x[idx], m[idx], ok[idx], ones)
        self.metrics.log_value((module_id, "imitation_loss"), float(bc.detach()), window=1)
        return loss + weight * bc


def keep_imitating(algo: Any, features: np.ndarray, masks: np.ndarray, accepted: np.ndarray) -> int:
    """Give every learner of `algo` the labels to keep imitating; returns how many each holds."""
    results = algo.learner_group.foreach_learner(
        lambda learner: learner.set_demonstrations(features, masks, accepted)
    )
    counts = {int(r.get()) for r in results}  # get() raises a learner's error
    if len(counts) != 1:
        raise RuntimeError(f"the learners hold different numbers of labels: {sorted(counts)}")
    return counts.pop()


def save_demonstrations(path: Path, features: np.ndarray, masks: np.ndarray, accepted: np.ndarray) -> None:
    """Write the imitated labels to `path` (`DEMOS_FILE`), never half-written (`atomic_write_bytes`)."""
    buf = io.BytesIO()
    np.savez(buf, features=features, masks=masks, accepted=accepted)
    atomic_write_bytes(path, buf.getvalue())


def load_demonstrations(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The labels `save_demonstrations` wrote (plain arrays: nothing in the file is executed)."""
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in _DEMO_KEYS if k not in z]
        if missing:
            raise ValueError(f"{path}: not a demonstrations file (missing {missing})")
        features, masks, accepted = (z[k] for k in _DEMO_KEYS)
    return features, masks, accepted
