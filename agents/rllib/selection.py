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

Averaging (`selection.average_best` = K > 1): `OUT/policy.pt` is the mean of the weights of the K
best-scoring networks (`agents.policy.average_policies`: stochastic weight averaging) instead of the
best one, and the mean is scored too (logged and kept in `selection.json`). Late in a run the best
scores lie closer together than the validation can tell apart: in three runs of `full.yaml` the
five best of 31 networks scored within 0.03 per interval of each other, and on 128 episodes instead
of 16 the policies of those runs scored 2.16-2.22, while networks of one run (seed 1's iterations
260 and 330) reached 0.90x and 0.82x the Oracle's EMU on a five-app mix. So picking the best picks
partly by chance; the mean of the best is one network from the region they share. The K networks
are kept in `OUT/networks/` (only those still among the K best), so a resumed run averages across
the resume.

Rescoring (`selection.rescore_best` = K > 1): at the end of a session the K best-scoring networks
(kept in `OUT/networks/` as for averaging), and their mean when the policy is one, are scored again
on `selection.rescore_episodes` validation episodes (the first of which are the ranking's own), and
the highest becomes `OUT/policy.pt` (the mean among equals, else the earlier network). Sixteen
episodes rank the late networks of a run partly by chance (above); in three runs of `full.yaml`
a 128-episode score picked, among each run's four best, the network with the highest mean EMU
ratio to the Oracle's over 14 evaluation scenarios, where the 16-episode score picked it in none.
Each candidate costs one more validation, about 11 s for 128 episodes on this 2-core machine; a
resumed run reuses the scores of networks it rescored before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy import (
    LAST_POLICY_FILE,
    POLICY_FILE,
    ColocNet,
    atomic_write_bytes,
    average_policies,
    load_policy,
    one_thread,
)
from agents.rllib.config import TrainConfig
from agents.rllib.envs import make_vector_env, training_env_config

VALIDATION_SEED = 900_000  # first seed of the validation episodes (module docstring)
SELECTION_FILE = "selection.json"
NETWORKS_DIR = "networks"  # OUT/networks/iter_NNNNNN.pt: the networks an average is taken over


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


def ranking(score: ValidationScore) -> tuple[float, int]:
    """The order of networks, best first: the higher score, then the earlier network."""
    return (-score.reward_per_interval, score.iteration)


@dataclass
class Selection:
    """The scores of a run's networks so far and the best one (persisted in `OUT/selection.json`,
    so a resumed run keeps comparing against the networks before it)."""

    episodes: int
    scores: list[ValidationScore] = field(default_factory=list)
    averaged: list[int] = field(default_factory=list)  # iterations averaged into the policy (best first)
    average_score: float | None = None  # the average's own validation score (reward per interval)
    rescored: list[ValidationScore] = field(default_factory=list)  # the best networks on more episodes
    rescored_mean: float | None = None  # the average's score on those episodes
    chosen: int | None = None  # the network rescoring made the policy (None: the selection's own choice)

    @property
    def policy_iteration(self) -> int | None:
        """The iteration of the network `OUT/policy.pt` is (of the best, when it is an average)."""
        if self.chosen is not None:
            return self.chosen
        best = self.best
        return None if best is None else best.iteration

    @property
    def policy_averaged(self) -> list[int]:
        """The iterations `OUT/policy.pt` is the mean of (none when it is one network)."""
        return [] if self.chosen is not None else self.averaged

    def policy_changed(self) -> None:
        """The selection replaced `OUT/policy.pt`: an earlier rescoring's choice no longer holds."""
        self.chosen = None
        self.rescored_mean = None

    @property
    def best(self) -> ValidationScore | None:
        """The highest score (the earliest network among equals): the first of `top`."""
        return next(iter(self.top(1)), None)

    def top(self, k: int, among: set[int] | None = None) -> list[ValidationScore]:
        """The `k` highest scores, best first (the earlier network among equals), of the
        iterations in `among` (all when None)."""
        pool = [s for s in self.scores if among is None or s.iteration in among]
        return sorted(pool, key=ranking)[:k]

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
            "averaged_iterations": self.averaged,
            "average_reward_per_interval": self.average_score,
            "policy_iteration": self.policy_iteration,
            "policy_averaged_iterations": self.policy_averaged,
            "rescored": [asdict(s) for s in self.rescored],
            "rescored_average_reward_per_interval": self.rescored_mean,
            "rescore_chose_iteration": self.chosen,
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
        return cls(
            episodes,
            [ValidationScore(**s) for s in data.get("scores", [])],
            [int(i) for i in data.get("averaged_iterations", [])],
            data.get("average_reward_per_interval"),
            [ValidationScore(**s) for s in data.get("rescored", [])],
            data.get("rescored_average_reward_per_interval"),
            data.get("rescore_chose_iteration"),
        )


def describe(score: ValidationScore, selection: Selection | None = None) -> str:
    """One log line: a network's validation score and, given the `selection` it joined, what the
    policy is now (the best so far, the mean of the best with the mean's own score, or the
    network a rescoring chose)."""
    by_node = score.qos_met_by_node if len(score.qos_met_by_node) > 1 else {}
    text = (
        f"validation ({score.episodes} episodes): iteration {score.iteration} scores "
        f"{score.reward_per_interval:.3f} per interval (QoS met {100 * score.qos_met:.1f}%"
        + "".join(f"; {k} {100 * v:.1f}%" for k, v in by_node.items())
        + f", BE {100 * score.be_throughput:.1f}%)"
    )
    if selection is None:
        return text
    averaged = selection.policy_averaged
    if len(averaged) > 1:
        joined = ", ".join(map(str, averaged))
        own = "" if selection.average_score is None else f" (it scores {selection.average_score:.3f})"
        return text + f"; the policy is the mean of the networks of iterations {joined}{own}"
    if selection.chosen is not None:
        return text + f"; the policy stays iteration {selection.chosen} (chosen on more episodes)"
    best = selection.best
    if best is None or best is score:
        return text + "; the best so far, now the policy"
    return text + f"; the policy stays iteration {best.iteration} ({best.reward_per_interval:.3f})"


def adopt_last(out: Path) -> None:
    """Make the last exported network (`OUT/policy_last.pt`) the run's policy (`OUT/policy.pt`)."""
    atomic_write_bytes(out / POLICY_FILE, (out / LAST_POLICY_FILE).read_bytes())


def network_file(out: Path, iteration: int) -> Path:
    """Where a run keeps the network of `iteration` while an average may need it."""
    return out / NETWORKS_DIR / f"iter_{iteration:06d}.pt"


def kept_networks(out: Path) -> dict[int, Path]:
    """The networks run `out` keeps for averaging, by iteration."""
    return {
        int(p.stem.removeprefix("iter_")): p
        for p in sorted((out / NETWORKS_DIR).glob("iter_*.pt"))
        if p.stem.removeprefix("iter_").isdigit()
    }


def keep_best(out: Path, selection: Selection, k: int) -> dict[int, Path]:
    """The `k` best-scoring networks run `out` keeps, by iteration, best first; the other kept
    networks are deleted (module docstring)."""
    kept = kept_networks(out)
    top = {s.iteration: kept[s.iteration] for s in selection.top(k, set(kept))}
    for iteration, path in kept.items():
        if iteration not in top:
            path.unlink()
    return top


def select(config: TrainConfig, out: Path, iteration: int, selection: Selection) -> ValidationScore:
    """Score the network just exported as `OUT/policy_last.pt` (of `iteration`; read back from the
    file, so the network scored is the one adopted), make it `OUT/policy.pt` when it is the best so
    far (or, with `selection.average_best` > 1, average it in when it is among the best, and score
    the mean), and save the selection."""
    score = validate(load_policy(out / LAST_POLICY_FILE).net, config, selection.episodes, iteration)
    is_best = selection.add(score)
    k = config.selection.average_best
    keep = max(k, config.selection.rescore_best)
    top: dict[int, Path] = {}  # the networks the policy averages
    if keep > 1:
        atomic_write_bytes(network_file(out, iteration), (out / LAST_POLICY_FILE).read_bytes())
        top = dict(list(keep_best(out, selection, keep).items())[:k])
    if k > 1:
        if iteration in top:
            average_policies(list(top.values()), out / POLICY_FILE)
            selection.averaged = list(top)
            selection.policy_changed()
            mean = validate(load_policy(out / POLICY_FILE).net, config, selection.episodes, iteration)
            selection.average_score = mean.reward_per_interval
    elif is_best:
        adopt_last(out)
        selection.policy_changed()
    selection.save(out)
    return score


def rescore(
    config: TrainConfig, out: Path, selection: Selection, log: Callable[[str], None] = lambda _: None
) -> None:
    """Score the `selection.rescore_best` best networks run `out` keeps (and their mean, when the
    policy is one) on `selection.rescore_episodes` episodes, make the highest `OUT/policy.pt`, log
    each score, and save the selection (module docstring). Nothing to do with fewer than two
    candidates."""
    n = config.selection.rescore_episodes
    kept = kept_networks(out)
    top = selection.top(config.selection.rescore_best, set(kept))
    averaging = config.selection.average_best > 1 and len(selection.averaged) > 1
    averaging = averaging and all(i in kept for i in selection.averaged)
    if len(top) + averaging < 2:
        return
    log(
        f"rescoring the {len(top)} best networks{' and their mean' if averaging else ''} on {n} validation episodes"
    )
    cached = {s.iteration: s for s in selection.rescored if s.episodes == n}
    scores = []
    for rank, s in enumerate(top, 1):
        again = cached.get(s.iteration) or validate(
            load_policy(kept[s.iteration]).net, config, n, s.iteration
        )
        scores.append(again)
        log(f"  {describe(again)} (ranked {rank} on {selection.episodes} episodes)")
    selection.rescored = scores
    best = min(scores, key=ranking)  # `top` is not empty: at most one other candidate, the mean
    mean = None
    averaged = ", ".join(map(str, selection.averaged))
    if averaging:
        average_policies([kept[i] for i in selection.averaged], out / POLICY_FILE)
        mean = validate(
            load_policy(out / POLICY_FILE).net, config, n, max(selection.averaged)
        ).reward_per_interval
        log(f"  the mean of iterations {averaged} scores {mean:.3f} per interval")
    selection.rescored_mean = mean
    if mean is not None and mean >= best.reward_per_interval:
        selection.chosen = None
        log(f"the policy: the mean of iterations {averaged}")
    else:
        atomic_write_bytes(out / POLICY_FILE, kept[best.iteration].read_bytes())
        selection.chosen = best.iteration
        log(f"the policy: the network of iteration {best.iteration}")
    selection.save(out)
