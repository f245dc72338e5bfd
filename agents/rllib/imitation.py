"""Warm start: imitate a hand-written controller (PARTIES by default) before reinforcement learning.

Why: from a random policy, PPO needs far more than the ~10^5-10^6 environment steps a 2-core
machine gives in 30 minutes to learn what PARTIES encodes by hand (upsize the app that misses its
target, downsize the one with slack). Starting from a policy that already acts like the teacher
and a critic that already knows what its states are worth, RL spends its budget improving on the
teacher instead of rediscovering it (behaviour cloning + RL fine-tuning, as in DQfD or
kickstarting).

1. `collect_demonstrations`: the teacher (any controller, built per episode by the caller's factory) runs
   `episodes` episodes of the training environment - the same sampler, domain randomisation and
   reward scale as RL training. At each interval its `Decision` becomes a label in the policy's
   action layout: HOLD when it keeps the allocation, the single-move index (single mode) or the
   move at that app's slot with HOLD elsewhere (per-app mode) when it makes one PARTIES move that
   the action mask and the network's pressure mask (`agents.policy.pressure_mask`) allow; HOLD
   also when its only change is outside the ten moves (PARTIES' network adjustment, Alg. 1).
   Other decisions (the fair start, moves the masks forbid) cannot be expressed: the env applies
   HOLD for them, so the teacher still drives the episode, but they are left out of the imitation
   loss. Labelling them HOLD taught the policy to hold while an app missed its target: on the
   training mixes PARTIES spends long stretches on `<UP,MEM>` / `<UP,DISK>` of apps that do not
   use what they have (two thirds of its decisions in 12 sampled episodes), which the pressure
   mask forbids.
2. `pretrain`: the network is fitted to the expressible labels (cross-entropy of the masked
   scores, summed over slots in per-app mode) and, for PPO, its critic to the discounted (scaled)
   returns of the teacher's episodes (every interval). With `labels: options` a label accepts
   every move the teacher names as equally good beside its own (`OffersOptions`; the Oracle-guided
   teacher's step of moves toward its plan, `baselines.oracle_guided.move_options`) and the loss is
   -log P(an accepted move). Why: the teacher orders those moves by what only it knows (which
   resources its plan holds below the allocation), so its own first move is, from the observation,
   one of several; fitted to it alone, the student is asked for an order it cannot see and spreads
   its probability over them.
3. DAgger (Ross et al., AISTATS 2011), `dagger_rounds` times: the fitted network drives
   `episodes` more episodes (each interval, with probability `dagger_student_frac`, its greedy
   action is applied instead of the teacher's), the teacher labels every state it visits, and the
   network is fitted again on all the labels so far. Why: cloning alone sees only the states the
   teacher visits; the student's own small mistakes lead it to states (an app over its target
   after a wrong move) where it has no label and compounds them. A teacher with state (PARTIES'
   pending move and bans) keeps deciding as if its own decisions were applied; its labels on the
   student's states are what it would do there given its own history, the usual approximation.
   By default (`dagger_episodes: same`) a round replays the teacher's episodes: the same mixes and
   traces, the student's states on them. The episodes run in `EpisodeRunner` processes that live
   for the whole warm start, episode k always in the same one, so a teacher's per-process caches
   serve it in every round: the Oracle-guided teacher's plans (`baselines.oracle`, one search per
   load step, most of the warm start's time) are searched again only for loads the first run did
   not reach.
4. `train.py` pushes the weights into the learner (and the env runners) before the first iteration.
   With `ppo.imitation_weight` > 0 it also gives the learner the expressible labels, and PPO keeps
   `imitation_loss` beside its own (`agents.rllib.learner`).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
import torch

from agents.policy import ColocNet, feasible_mask, one_thread
from agents.rllib.config import TrainConfig, WarmStartConfig
from agents.rllib.envs import make_scalar_env, training_env_config
from env.controller import ControllerContext, ControllerFactory
from env.gym_env import ActionCodec, NodeEnv
from env.types import N_MOVES, Capabilities, Decision, Move, Observation

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Demonstrations:
    """Teacher transitions: encoded observations, masks, labels, discounted returns."""

    features: np.ndarray  # (N, n_features) float32
    masks: np.ndarray  # (N, mask_size) float32 0/1
    actions: np.ndarray  # (N,) single mode, (N, max_apps) per-app mode; int64
    expressible: np.ndarray  # (N,) bool: the label stands for the teacher's decision (imitated)
    accepted: np.ndarray  # (N, mask_size) bool: the actions as good as the label (it among them)
    returns: np.ndarray  # (N,) discounted returns of the scaled reward
    moves: int  # labels that are not HOLD
    episodes: int

    @property
    def unexpressed(self) -> int:
        """Teacher decisions the labels cannot express (left out of the imitation loss)."""
        return int((~self.expressible).sum())

    def __len__(self) -> int:
        return len(self.features)

    def imitated(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features, masks, accepted) of the expressible labels: what the imitation loss fits."""
        keep = self.expressible
        return self.features[keep], self.masks[keep], self.accepted[keep]

    def __add__(self, other: Demonstrations) -> Demonstrations:
        """Both sets of labels (DAgger's aggregate)."""
        return Demonstrations(
            np.concatenate([self.features, other.features]),
            np.concatenate([self.masks, other.masks]),
            np.concatenate([self.actions, other.actions]),
            np.concatenate([self.expressible, other.expressible]),
            np.concatenate([self.accepted, other.accepted]),
            np.concatenate([self.returns, other.returns]),
            self.moves + other.moves,
            self.episodes + other.episodes,
        )


def label(
    decision: Decision, obs: Observation, caps: Capabilities, codec: ActionCodec, mask: np.ndarray
) -> tuple[np.ndarray | int, bool]:
    """(the action that stands for `decision`, whether it was expressible as one; HOLD if not)."""
    hold: np.ndarray | int = 0 if codec.mode == "single" else np.zeros(codec.max_apps, dtype=np.int64)
    if decision.allocation is None or decision.allocation == obs.allocation:
        return hold, True
    names = [a.name for a in caps.lc_apps]
    if decision.moves and codec.mode == "per_app":  # one move per app (a per-app teacher)
        if any(name not in names for name, _ in decision.moves):
            return hold, False
        act = np.zeros(codec.max_apps, dtype=np.int64)
        for name, m in decision.moves:
            act[names.index(name)] = m.value
        allowed = mask.reshape(codec.max_apps, N_MOVES)
        if not allowed[np.arange(codec.max_apps), act].all():
            return hold, False
        return act, True
    if len(decision.moves) > 1:  # several apps' moves: one action of single mode cannot say them
        return hold, False
    move, app = decision.move, decision.app
    if move is Move.HOLD:  # a change outside the ten moves (PARTIES' network adjustment)
        return hold, True
    if move is None or app not in names:
        return hold, False
    slot = names.index(app)
    if codec.mode == "single":
        a = codec.single_index(slot, move)
        return (a, True) if mask.reshape(-1)[a] else (hold, False)
    if not mask.reshape(codec.max_apps, N_MOVES)[slot, move.value]:
        return hold, False
    act = np.zeros(codec.max_apps, dtype=np.int64)
    act[slot] = move.value
    return act, True


@runtime_checkable
class OffersOptions(Protocol):
    """A teacher that names, beside its decision, the moves it holds equally good (its own first):
    `baselines.oracle_guided.OracleGuidedController.options`."""

    @property
    def options(self) -> tuple[tuple[str, Move], ...]: ...


def accepted(
    action: np.ndarray | int,
    options: Sequence[tuple[str, Move]],
    caps: Capabilities,
    codec: ActionCodec,
    mask: np.ndarray,
) -> np.ndarray:
    """The actions as good as `action` (`warm_start.labels`), flat in the mask's layout: `action`
    itself and, in single mode, every allowed move of `options` (per-app mode: `action`'s move at
    each slot). `options` counts only when it begins with `action`'s move (the teacher's own)."""
    out = np.zeros(codec.mask_size, dtype=bool)
    if codec.mode != "single":
        out.reshape(codec.max_apps, N_MOVES)[np.arange(codec.max_apps), np.asarray(action)] = True
        return out
    out[int(action)] = True
    names = [a.name for a in caps.lc_apps]
    first = options[0] if options else None
    if (
        first is None
        or first[0] not in names
        or codec.single_index(names.index(first[0]), first[1]) != action
    ):
        return out
    flat = mask.reshape(-1)
    for app, move in options:
        if app in names:
            a = codec.single_index(names.index(app), move)
            out[a] |= bool(flat[a])
    return out


def discounted(rewards: list[float], gamma: float) -> np.ndarray:
    """The discounted returns of one episode, per interval (the critic's targets in `pretrain`)."""
    out = np.zeros(len(rewards), dtype=np.float32)
    acc = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        acc = rewards[i] + gamma * acc
        out[i] = acc
    return out


class EpisodeRunner:
    """Runs tasks in `workers` single-process pools that live until `close()`. A task whose key (an
    episode's index) has run before runs again in the process that ran it, so module-level caches
    a teacher keeps (the Oracle's plans) built for an episode in one round serve it in the next
    (module docstring, step 3). A new key goes to whichever process is free first: episodes differ
    in cost (1-6 apps, 60-180 s, one Oracle search per load step), and a fixed split (episode k in
    process k mod workers) left one of two processes idle for more than half of the first round on
    `configs/train/full.yaml`. Where a task runs does not change what it returns (episodes are
    independent). A task that raises stops the dispatch; its error is raised here. With one worker
    the tasks run here, in this process, whose caches last as long. A context manager: left
    normally it lets the processes finish; left by an exception (Ctrl-C, SIGTERM, a failed episode)
    it kills them at once, since an episode in progress can run for minutes (the Oracle's plans
    beside MongoDB) and its labels are no longer wanted. The processes also die with this one
    (`_die_with_parent`), so a driver killed outright leaves none behind."""

    def __init__(self, workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: the driver runs Ray's threads
        n = workers if workers > 1 else 0
        self._pools = [
            ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_die_with_parent) for _ in range(n)
        ]
        self._pids = [pool.submit(os.getpid) for pool in self._pools]  # each pool's one process
        self._home: dict[int, int] = {}  # key -> the pool that ran it first

    def run(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        keys: Sequence[int],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[R]:
        """`fn(task)` for every task, results in task order; `fn` must pickle (a module-level
        function). `progress(done, total)` is called here, in the caller's thread, each time more
        tasks have finished (a first round of `configs/train/full.yaml` runs for 10-15 minutes)."""
        if len(tasks) != len(keys):
            raise ValueError(f"{len(tasks)} tasks but {len(keys)} keys")
        if not self._pools:
            out = []
            for t in tasks:
                out.append(fn(t))
                if progress is not None:
                    progress(len(out), len(tasks))
            return out
        futures: dict[int, Future[R]] = {}
        running: list[list[Future[R]]] = [[] for _ in self._pools]  # per pool: its unfinished tasks
        reported = 0

        def report() -> None:
            nonlocal reported
            done = sum(f.done() for f in futures.values())
            if progress is not None and done > reported:
                reported = done
                progress(done, len(tasks))

        def submit(i: int, pool: int) -> None:
            self._home.setdefault(keys[i], pool)
            futures[i] = self._pools[pool].submit(fn, tasks[i])
            running[pool].append(futures[i])

        def free_pools() -> list[int]:
            for q in running:
                for f in q:
                    err = f.exception() if f.done() else None
                    if err is not None:
                        raise err
                q[:] = [f for f in q if not f.done()]
            return [j for j, q in enumerate(running) if not q]

        new = []
        for i, k in enumerate(keys):
            if k in self._home:
                submit(i, self._home[k])
            else:
                new.append(i)
        for i in new:  # one at a time, to the first pool with nothing left to run
            while not (free := free_pools()):
                wait([f for q in running for f in q], return_when=FIRST_COMPLETED)
                report()
            submit(i, free[0])
        while len(free_pools()) < len(self._pools):  # the last tasks (free_pools raises a failure)
            wait([f for q in running for f in q], return_when=FIRST_COMPLETED)
            report()
        return [futures[i].result() for i in range(len(tasks))]

    def close(self, kill: bool = False) -> None:
        """Shut the processes down once their tasks are done; with `kill`, now (SIGKILL)."""
        for pool, pid in zip(self._pools, self._pids, strict=True):
            if kill:
                if pid.done() and pid.exception() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid.result(), signal.SIGKILL)
                pool.shutdown(wait=False, cancel_futures=True)
            else:
                pool.shutdown(cancel_futures=True)

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(kill=exc_type is not None)


def _die_with_parent() -> None:
    """A worker process's initializer: on Linux the kernel sends it SIGKILL when the process that
    started it dies (prctl PR_SET_PDEATHSIG), so a driver killed mid-round (a second Ctrl-C,
    SIGKILL, the OOM killer) leaves no process running the teacher's episodes, which would
    otherwise block forever on its task queue once done."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl: reparented already
        os._exit(1)


def collect_demonstrations(
    config: TrainConfig,
    warm: WarmStartConfig,
    gamma: float,
    seed: int,
    make_teacher: ControllerFactory,
    student: ColocNet | None = None,
    student_frac: float = 0.0,
    runner: EpisodeRunner | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Demonstrations:
    """The teacher's labels on `warm.episodes` training episodes (module docstring): driven by the
    teacher, or, with a `student`, by the student's greedy action with probability `student_frac`
    at each interval (DAgger). `make_teacher(context, None)` builds the teacher for each episode's
    simulated node (the caller binds the spec, e.g. `warm.teacher` through the controller registry;
    it must pickle when `warm.workers` > 1). Episodes are independent (episode k: seed + k, its
    own coin for the student), so `warm.workers` processes give the same labels as one. `runner`
    keeps the processes (and their caches) for later rounds; without one they last this call.
    `progress(episodes done, episodes)` as they finish (`EpisodeRunner.run`)."""
    student_state = None if student is None else (student.spec, student.state_dict())
    tasks = [
        (config, gamma, seed, ep, make_teacher, student_state, student_frac, warm.labels == "options")
        for ep in range(warm.episodes)
    ]
    episodes = list(range(warm.episodes))
    if runner is None:
        with EpisodeRunner(warm.workers) as own:
            parts = own.run(_episode, tasks, episodes, progress)
    else:
        parts = runner.run(_episode, tasks, episodes, progress)
    return Demonstrations(
        np.concatenate([p[0] for p in parts]).astype(np.float32),
        np.concatenate([p[1] for p in parts]).astype(np.float32),
        np.concatenate([p[2] for p in parts]).astype(np.int64),
        np.concatenate([p[3] for p in parts]).astype(bool),
        np.concatenate([p[4] for p in parts]).astype(bool),
        np.concatenate([p[5] for p in parts]),
        int(sum(p[6] for p in parts)),
        warm.episodes,
    )


_EpisodeTask = tuple[TrainConfig, float, int, int, ControllerFactory, tuple | None, float, bool]


def _episode(
    task: _EpisodeTask,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """One teacher-labelled episode: (features, masks, labels, expressible, accepted, returns,
    moves). With `options` (`warm_start.labels`), a teacher that offers them (`OffersOptions`) adds
    its equally good moves to each label's accepted set."""
    from env.sim.node import SimNode  # the simulator loads numba kernels: import on first use

    config, gamma, seed, ep, make_teacher, student_state, student_frac, use_options = task
    student = None
    if student_state is not None:
        student = ColocNet(student_state[0])
        student.load_state_dict(student_state[1])
        student.eval()
    env = make_scalar_env(training_env_config(config))
    node_env = env.unwrapped
    assert isinstance(node_env, NodeEnv)  # make_scalar_env wraps a NodeEnv
    codec: ActionCodec = node_env.codec
    spec = config.net_spec()
    feats, masks, acts, expressible, accepts = [], [], [], [], []
    rewards: list[float] = []
    moves = 0
    coin = np.random.default_rng([seed, 2, ep])
    obs, _ = env.reset(seed=seed + ep)
    caps, sim = node_env.capabilities, node_env.node
    assert caps is not None  # set by reset()
    assert isinstance(sim, SimNode)  # training envs run in simulation
    teacher = make_teacher(ControllerContext(caps, sim.scenario, sim, seed + ep), None)
    teacher.reset(caps, np.random.default_rng([seed + ep, 1]))
    done = False
    while not done:
        raw = node_env.observation
        assert raw is not None  # set by reset() and step()
        # the moves the network may take (agents.policy.feasible_mask)
        m = torch.as_tensor(obs["action_mask"])
        allowed = feasible_mask(spec, torch.as_tensor(obs["observations"]), m).numpy()
        action, ok = label(teacher.decide(raw), raw, caps, codec, allowed)
        options = teacher.options if use_options and isinstance(teacher, OffersOptions) else ()
        accepts.append(accepted(action, options, caps, codec, allowed))
        expressible.append(ok)
        moves += bool(np.any(action))
        feats.append(obs["observations"])
        masks.append(allowed)
        acts.append(action)
        if student is not None and coin.random() < student_frac:
            with one_thread(), torch.no_grad():
                x = torch.as_tensor(obs["observations"])[None]
                m = torch.as_tensor(obs["action_mask"], dtype=torch.float32).reshape(1, -1)
                action = student.greedy(x, m)[0].numpy()
        obs, reward, term, trunc, _ = env.step(action)
        rewards.append(float(reward))
        done = term or trunc
    env.close()
    return (
        np.asarray(feats, dtype=np.float32),
        np.asarray(masks, dtype=np.float32),
        np.asarray(acts, dtype=np.int64),
        np.asarray(expressible, dtype=bool),
        np.asarray(accepts, dtype=bool),
        discounted(rewards, gamma),
        moves,
    )


@dataclass(frozen=True)
class PretrainStats:
    """How well `pretrain` fitted the teacher's labels and returns, and how long it took (s)."""

    accuracy: float  # greedy action accepted (the label or one of its options), over the expressible labels
    move_accuracy: float  # the same, over labels that are moves
    value_r2: float  # critic's explained variance of the returns (nan without a critic)
    seconds: float
    own_move_accuracy: float = float("nan")  # greedy action == the teacher's own move, over the moves


def imitation_loss(
    net: ColocNet, x: torch.Tensor, mask: torch.Tensor, accepted: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """The imitation loss of a batch of labels: -log P(an accepted action) under `net`'s masked
    scores (per slot, summed, in per-app mode), the cross-entropy of the label when it is the only
    one accepted; mean over the rows weighted by `weight` (0 for a label not imitated). `pretrain`
    fits it, and PPO keeps it beside its own loss with `ppo.imitation_weight`
    (`agents.rllib.learner`)."""
    n = x.shape[0]
    groups = (n, net.spec.max_apps, N_MOVES) if net.spec.action_mode == "per_app" else (n, 1, -1)
    logp = torch.log_softmax(net.masked_scores(x, mask).reshape(groups), dim=-1)
    ce = -torch.logsumexp(logp.masked_fill(~accepted.reshape(groups), -math.inf), dim=-1).sum(dim=-1)
    return (ce * weight).sum() / weight.sum().clamp(min=1.0)


def pretrain(net: ColocNet, demos: Demonstrations, warm: WarmStartConfig, seed: int) -> PretrainStats:
    """Fit `net` to the teacher's labels (and its critic to the returns), in place."""
    with one_thread():  # small batches: one thread is faster, and much faster on a busy machine
        return _pretrain(net, demos, warm, seed)


def _pretrain(net: ColocNet, demos: Demonstrations, warm: WarmStartConfig, seed: int) -> PretrainStats:
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(demos.features)
    m = torch.as_tensor(demos.masks)
    a = torch.as_tensor(demos.actions)
    ok = torch.as_tensor(demos.accepted)
    g = torch.as_tensor(demos.returns)
    w = torch.as_tensor(demos.expressible, dtype=torch.float32)  # imitate expressible labels only
    per_app = net.spec.action_mode == "per_app"
    opt = torch.optim.Adam(net.parameters(), lr=warm.lr)
    n = len(demos)
    net.train()
    for _ in range(warm.epochs):
        for idx in torch.randperm(n, generator=gen).split(warm.batch_size):
            loss = imitation_loss(net, x[idx], m[idx], ok[idx], w[idx])
            if net.spec.with_value:
                loss = loss + warm.value_weight * torch.nn.functional.mse_loss(net.value(x[idx]), g[idx])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
    net.eval()
    with torch.no_grad():
        keep = torch.as_tensor(demos.expressible)
        greedy = net.greedy(x[keep], m[keep])
        a, acc = a[keep], ok[keep]
        if per_app:
            slots = acc.reshape(len(a), net.spec.max_apps, N_MOVES)
            hit = slots.gather(-1, greedy.unsqueeze(-1)).squeeze(-1).all(dim=-1)
        else:
            hit = acc.gather(-1, greedy.unsqueeze(-1)).squeeze(-1)
        is_move = (a != 0) if not per_app else (a != 0).any(dim=-1)
        own = (greedy == a) if not per_app else (greedy == a).all(dim=-1)
        r2 = float("nan")
        if net.spec.with_value:
            v = net.value(x)
            r2 = float(1.0 - torch.var(g - v) / torch.var(g).clamp(min=1e-9))
    return PretrainStats(
        float(hit.float().mean()),
        float(hit[is_move].float().mean()) if bool(is_move.any()) else float("nan"),
        r2,
        time.perf_counter() - t0,
        float(own[is_move].float().mean()) if bool(is_move.any()) else float("nan"),
    )
