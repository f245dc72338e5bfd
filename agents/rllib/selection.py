"""Which of a run's networks becomes its policy: the best on validation episodes.

PPO's return does not rise monotonically from the warm start, least of all in a short run: in one
`make demo` run the networks of successive checkpoints (every 5 iterations) met the targets in
71, 70, 89, 89, 92, 87 and 63% of fig9-ramp's intervals. So the network of the last iteration is
not always the best one a run has held, and how many iterations a time budget affords depends on
the machine. Every network a run checkpoints (and the one PPO starts from: the imitated one, or the
resumed one) is therefore scored on the same validation episodes, and `OUT/policy.pt` is the best
so far; `OUT/policy_last.pt` is the last checkpoint's.

Validation episodes are drawn by the training env itself (its scenario sampler, with the sampler's
held-out mixes excluded, and its domain randomisation) from seeds no training episode uses
(`VALIDATION_SEED` + i; the warm start uses 10,000 + seed, RLlib's env runners small seeds), so
they are episodes of the training distribution that no network trained on. The scenarios a run is
evaluated on afterwards (`eval.scenarios`) play no part: selecting on them would fit the result to
its own test.

Score: the mean over episodes of the mean reward per interval (`env.rewards`, unscaled: the
objective PPO maximises), the network acting as it does when deployed (`agents.policy.RlController`:
greedy, masked). All episodes run at once on the batched simulator (`env.vector_env`), so one
validation costs about one episode's length in batched steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy import LAST_POLICY_FILE, POLICY_FILE, ColocNet, atomic_write_bytes, load_policy, one_thread
from agents.rllib.config import TrainConfig
from agents.rllib.envs import make_vector_env, training_env_config

VALIDATION_SEED = 900_000  # first seed of the validation episodes (module docstring)
SELECTION_FILE = "selection.json"


@dataclass(frozen=True)
class ValidationScore:
    """A network on the validation episodes: `reward_per_interval` (the selection score: mean over
    episodes of the mean unscaled reward per interval), the share of intervals meeting every target
    and the mean BE throughput (both pooled over intervals, for the log); `qos_met_by_node`: the share
    per node type (`Capabilities.node_name`: the PARTIES node, the Q-PRM thesis' node)."""

    iteration: int
    reward_per_interval: float
    qos_met: float
    be_throughput: float
    episodes: int
    intervals: int
    qos_met_by_node: dict[str, float] = field(default_factory=dict)


def validate(net: ColocNet, config: TrainConfig, episodes: int, iteration: int) -> ValidationScore:
    """Run `net` greedily on `episodes` validation episodes of `config`'s training env (module
    docstring); deterministic for a given network, config and episode count."""
    import torch

    env_config = {**training_env_config(config), "reward_scale": 1.0}
    env = make_vector_env(episodes, env_config)
    try:
        obs, _ = env.reset(seed=VALIDATION_SEED)
        nodes = []
        for i in range(episodes):
            caps = env.unwrapped.capabilities(i)
            assert caps is not None  # every sub-env was just reset
            nodes.append(caps.node_name)
        live = np.ones(episodes, dtype=bool)
        total = np.zeros(episodes)
        steps = np.zeros(episodes, dtype=np.int64)
        met = np.zeros(episodes, dtype=np.int64)  # intervals meeting every target, per episode
        be = 0.0
        net.eval()
        while live.any():
            with one_thread(), torch.no_grad():
                x = torch.as_tensor(obs["observations"], dtype=torch.float32)
                m = torch.as_tensor(obs["action_mask"], dtype=torch.float32).reshape(episodes, -1)
                actions = net.greedy(x, m).numpy()
            obs, reward, term, trunc, info = env.step(actions)
            total[live] += reward[live]
            steps[live] += 1
            met += np.asarray(info["qos_met"], dtype=bool) & live
            be += float(np.sum(np.asarray(info["reward_terms"]["be_throughput"], dtype=float)[live]))
            live &= ~(term | trunc)
    finally:
        env.close()
    n = int(steps.sum())
    by_node = {}
    for name in sorted(set(nodes)):
        mine = np.array([x == name for x in nodes])
        k = int(steps[mine].sum())
        by_node[name] = int(met[mine].sum()) / k if k else math.nan
    return ValidationScore(
        iteration=iteration,
        reward_per_interval=float(np.mean(total / np.maximum(steps, 1))),
        qos_met=int(met.sum()) / n if n else math.nan,
        be_throughput=be / n if n else math.nan,
        episodes=episodes,
        intervals=n,
        qos_met_by_node=by_node,
    )


@dataclass
class Selection:
    """The scores of a run's networks so far and the best one (persisted in `OUT/selection.json`,
    so a resumed run keeps comparing against the networks before it)."""

    episodes: int
    scores: list[ValidationScore] = field(default_factory=list)

    @property
    def best(self) -> ValidationScore | None:
        """The highest score (the earliest network among equals)."""
        return max(self.scores, key=lambda s: (s.reward_per_interval, -s.iteration), default=None)

    def add(self, score: ValidationScore) -> bool:
        """Record `score`; True when it is the new best."""
        if score.episodes != self.episodes:
            raise ValueError(f"a score over {score.episodes} episodes joins a selection over {self.episodes}")
        self.scores.append(score)
        return self.best is score

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "episodes": self.episodes,
            "first_seed": VALIDATION_SEED,
            "best_iteration": None if best is None else best.iteration,
            "scores": [asdict(s) for s in self.scores],
        }

    def save(self, out: Path) -> None:
        """Write `OUT/selection.json` atomically."""
        atomic_write_bytes(out / SELECTION_FILE, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, out: Path, episodes: int) -> Selection:
        """The selection of run `out` (empty when it has none, or when it was scored on a different
        number of episodes: such scores are not comparable)."""
        path = out / SELECTION_FILE
        if not path.is_file():
            return cls(episodes)
        data = json.loads(path.read_text())
        if int(data.get("episodes", -1)) != episodes or int(data.get("first_seed", -1)) != VALIDATION_SEED:
            return cls(episodes)
        return cls(episodes, [ValidationScore(**s) for s in data.get("scores", [])])


def describe(score: ValidationScore, best: ValidationScore | None) -> str:
    """One log line: a network's validation score and the best so far."""
    by_node = score.qos_met_by_node if len(score.qos_met_by_node) > 1 else {}
    text = (
        f"validation ({score.episodes} episodes): iteration {score.iteration} scores "
        f"{score.reward_per_interval:.3f} per interval (QoS met {100 * score.qos_met:.1f}%"
        + "".join(f"; {k} {100 * v:.1f}%" for k, v in by_node.items())
        + f", BE {100 * score.be_throughput:.1f}%)"
    )
    if best is None or best is score:
        return text + "; the best so far, now the policy"
    return text + f"; the policy stays iteration {best.iteration} ({best.reward_per_interval:.3f})"


def adopt_last(out: Path) -> None:
    """Make the last exported network (`OUT/policy_last.pt`) the run's policy (`OUT/policy.pt`)."""
    atomic_write_bytes(out / POLICY_FILE, (out / LAST_POLICY_FILE).read_bytes())


def select(config: TrainConfig, out: Path, iteration: int, selection: Selection) -> ValidationScore:
    """Score the network just exported as `OUT/policy_last.pt` (of `iteration`; read back from the
    file, so the network scored is the one adopted), make it `OUT/policy.pt` when it is the best so
    far, and save the selection."""
    score = validate(load_policy(out / LAST_POLICY_FILE).net, config, selection.episodes, iteration)
    if selection.add(score):
        adopt_last(out)
    selection.save(out)
    return score
