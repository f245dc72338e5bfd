"""Serving a trained RL policy without Ray: the network, its export file and `RlController`.

The network (`ColocNet`) is plain torch; RLlib's RLModules (`agents.rllib.module`) wrap it for
training, and `export_policy` saves its weights with the metadata needed to rebuild it. This module
imports torch and `env` only, so `evaluate.py` and `serve.py` can run a policy on a machine without
Ray (DESIGN §1, use 3).

**The network: one policy for any mix of up to `max_apps` LC apps.** The observation is
`env.features` (split with `ObservationEncoder.split` into one row per app slot and the node
block). A shared per-app encoder embeds every slot; the embeddings of the slots that hold an app
(`present = 1`; padded slots are masked out) are pooled (mean, max and the fraction of occupied
slots) and combined with the node features into a node context; every slot then scores its moves
from its own embedding and that context. Permuting the apps permutes their scores and leaves the
context, the HOLD score and the value unchanged (permutation-equivariant), and a policy trained
on 1..6-app mixes runs on any mix of up to `max_apps` apps.

* `per_app` mode: 11 logits per slot (HOLD + the ten PARTIES moves), flattened slot by slot:
  the `MultiDiscrete([11] * max_apps)` layout of `env.gym_env.ActionCodec`.
* `single` mode: `1 + 10 * max_apps` logits: HOLD (scored from the context), then the ten moves of
  slot 0, slot 1, ... (`ActionCodec.single_index`).
* infeasible entries (the env's action mask, from `env.moves.move_mask`) are set to a huge
  negative number for policy logits (`MASKED_LOGIT`: a float32 "-inf" that keeps the entropy and
  log-probabilities finite, as RLlib's action-masking example does) and to `-inf` for Q-values
  (what RLlib's DQN learner expects).
* a value head on a separate trunk of the same shape (PPO's critic; absent for DQN).
* `pressure_mask` (NetSpec): `<UP,MEM>` and `<UP,DISK>` of an app are only offered when that app
  uses at least `PRESSURE_FRAC` of its memory limit / disk bandwidth limit (the `memory_used` and
  `disk_used` features). Why: more memory or disk bandwidth cannot lower the latency of an app that
  does not use what it has, but each such UP takes a unit from a victim; a stateless policy whose
  app stays just above its target repeats the same useless `<UP,MEM>` every interval and drains
  another app's memory into a shortfall (measured: PPO policies drained memcached's memory for
  moses on PARTIES Fig. 9's mix until memcached's p99 was 80x its target). PARTIES itself moves on
  to the next resource when an upsize does not help (Sec. 4.2.3); a stateless policy cannot see
  that, so the network is kept from the moves that cannot help. The mask is part of the network,
  so RLlib's sampling, the exported policy and `RlController` apply the same one. Symmetrically,
  `<DOWN,MEM>` and `<DOWN,DISK>` are only offered while the app uses less than `SPARE_FRAC` of
  the limit: PARTIES undoes a downsize that hurt and bans it (Alg. 3); a policy that cannot see
  its ban repeated `<DOWN,MEM>` on NGINX (imitation of PARTIES on Fig. 8's mix) down to 1 GB, below
  its working set, where its p99 went to 10x the target and never recovered. A quarter, not a
  half: at half, policies cut NGINX to 3 GB (1.9 GB resident) at 20% load, too little page cache
  when its load rose to 50% (10x its target), and could not give it back (an app using 63% of its
  memory is not offered more); with a quarter the trained policy's QoS guarantee on the Q-PRM
  sinusoid went from 90.1% to 98.9% (README, "Where the learned policy stands").
* `down_slack_min` (NetSpec): an app's DOWN moves are only offered while its slack feature is above
  it (`model.down_slack_min` of a training config, 0.2 by default: PARTIES Alg. 1 downsizes only an
  app whose slack exceeds 0.2, Sec. 4.2). Why: an app at its knee (MongoDB at 100% of its max load
  in the six-app mix, PARTIES Fig. 6) sits near its target (0.85-1.06x); one LLC way taken from it
  there is a violation for the rest of the run. PPO networks a few iterations apart differ in whether
  they take it: of 30 checkpoints of one training run, 8 met mix6-const's window in most seeds.
  Withheld, the same 30 networks met it in 77 of 90 runs (24 without), and on the twelve other
  scenarios of the README's table two of them moved by at most 1.5 points of EMU and 0.1 of QoS
  (README, "Where the learned policy stands"). It costs little elsewhere because the Oracle-guided
  teacher rarely takes from an app that close to its target either (2-3% of its labels).
* `spare_core_util` (NetSpec): below `down_slack_min`, `<DOWN,CORE>` is still offered to an app
  whose cores are busy less than this fraction of the time (the `cpu_util` feature; 0, unmeasured,
  does not count). Why: the slack rule is a ratchet for an app whose latency is not its cores'.
  MongoDB at its knee beside five apps (PARTIES Fig. 6 right) sits at 0.8-0.95x its target on any
  number of cores, its threads waiting on I/O (0.05-0.2 of its cores busy), so a core given to it
  after a noisy interval is never offered back; the Oracle gives it one core there. PARTIES does not
  take back an upsize that did not help either (Sec. 4.2.3). `model.spare_core_util` is off by
  default: at 0.15, in two training seeds, EMU rose on the held-out five-app mix in one; the other
  lost QoS on the Q-PRM node, where the rule does not fire (README, "Where the learned policy
  stands").
* `idle_core_util` (NetSpec): `<UP,CORE>` is withheld from an app whose cores are busy less than
  this fraction of the time (the `cpu_util` feature; 0, unmeasured or no request in service during
  the interval, does not count). Why: a core added to an app whose cores already idle does not
  shorten its tail, which is set by what its requests wait on. MongoDB at its knee beside five
  apps (PARTIES Fig. 6 right) keeps 0.02-0.2 of its cores busy, its threads waiting on I/O, and
  "only requires a single core at the lowest frequency to meet QoS at high load" (PARTIES Sec.
  3.4.1); a policy that upsizes its cores whenever a noisy interval reads near the target takes
  them from the BE job, where the Oracle leaves them. `model.idle_core_util` is off by default and
  0.25 in `full.yaml`: a trained network given the rule, or trained with it and denied it, moves
  only on the five- and six-app mixes, and gains on mix6-const in each of the three so ablated (README,
  "Where the learned policy stands").

**The export file** (`policy.pt`, written atomically by `export_policy`) is a torch pickle of plain
data only - `{"format", "version", "meta", "state_dict"}` - read with `torch.load(weights_only=True)`.
`meta` holds the action mode, `max_apps`, the network width, the feature layout (name and bounds of
every feature) and the feature scales; `load_policy` refuses a file whose layout differs from the
code's or from what the caller expects, with a `ConfigError` that the CLIs turn into exit 2.

**`RlController`** (spec `rl:PATH`; PATH = a `policy.pt` or a training run directory holding one)
encodes each observation with `env.features`, masks infeasible moves with the env's `ActionCodec`
(`env.moves.move_mask`), takes the highest-scoring action (deterministic) and turns it into an
allocation with `ActionCodec.decode` (`env.moves.plan_move`) - the same code as the training env,
so the policy acts in evaluation and serving exactly as it did in training (the network's greedy
path runs in numpy there, `GreedyArrays`: the same computation without torch's per-operation
cost), with one rule of
PARTIES' own on top (Sec. 4.3: "downsizing an application is disabled for 30s once an incorrect
downsize action was reverted"): an app whose slack falls below 0.05 the interval after the policy
downsized it is offered no DOWN move for `DOWNSIZE_BAN_S`. Why: a policy that reads a slack of
0.2-0.4 on memcached at 94% of its max load on the Q-PRM node took its ninth core, saw 18-21x the
target, gave the core back and took it again every three intervals (QoS guarantee 91.1% against
PARTIES' 96.1%; with the ban 98.7%, README "Where the learned policy stands"). The training env
does not keep the ban (its mask is the node's alone).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from env.config import ConfigError
from env.controller import BaseController, ControllerContext
from env.features import (
    APP_FEATURES,
    N_APP_FEATURES,
    N_NODE_FEATURES,
    NODE_FEATURES,
    FeatureConfig,
    ObservationEncoder,
)
from env.guards import GuardsConfig
from env.gym_env import MAX_APP_SLOTS, N_APP_MOVES, ActionCodec, describe_move
from env.moves import PRESSURE_FRAC, SPARE_FRAC
from env.types import DOWN_MOVES, N_MOVES, UPSIZE_SLACK_BELOW, Decision, Direction, Move, Observation

ActionMode = Literal["single", "per_app"]
POLICY_FORMAT = "coloc-policy"
POLICY_VERSION = 1
POLICY_FILE = "policy.pt"
LAST_POLICY_FILE = "policy_last.pt"  # a training run's last network (OUT/policy.pt is the selected one)
MAX_HIDDEN_UNITS = 4096  # the widest network a training config may ask for (ModelConfig)
MASKED_LOGIT = float(torch.finfo(torch.float32).min)  # "-inf" for logits: exp() = 0, no NaN
_APP_NAMES = [f.name for f in APP_FEATURES]
PRESSURE_MOVES = (  # (move, the usage feature that must be >= PRESSURE_FRAC for it)
    (Move.UP_MEM, _APP_NAMES.index("memory_used")),
    (Move.UP_DISK, _APP_NAMES.index("disk_used")),
)
SPARE_MOVES = (  # (move, the usage feature that must be < SPARE_FRAC for it)
    (Move.DOWN_MEM, _APP_NAMES.index("memory_used")),
    (Move.DOWN_DISK, _APP_NAMES.index("disk_used")),
)


def feature_layout() -> list[list[Any]]:
    """The observation layout this code produces: [scope, name, low, high] per feature of one app
    block and of the node block. A policy is only valid for the layout it was trained on."""
    return [["app", f.name, float(f.low), float(f.high)] for f in APP_FEATURES] + [
        ["node", f.name, float(f.low), float(f.high)] for f in NODE_FEATURES
    ]


# ---- the network ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NetSpec:
    """What shapes a `ColocNet`: action layout, slots and width (saved in the export metadata).

    `hidden_units` is the width of every layer; `with_value` adds the critic trunk and value head
    (PPO); DQN scores actions with the policy trunk only. `pressure_mask` withholds `<UP,MEM>` /
    `<UP,DISK>` from apps that do not use most of what they have (module docstring; off in files
    written before it existed). `down_slack_min`: the DOWN moves of an app are offered only while
    its slack feature is above it (module docstring; None, as in files written before it: always);
    `spare_core_util`: below it, `<DOWN,CORE>` is still offered to an app whose `cpu_util` is under
    this (module docstring; None, as in files written before it: never). `idle_core_util`:
    `<UP,CORE>` is withheld from an app whose `cpu_util` is under this (module docstring; None, as
    in files written before it: never)."""

    action_mode: ActionMode
    max_apps: int
    hidden_units: int = 128
    with_value: bool = True
    pressure_mask: bool = False
    down_slack_min: float | None = None
    spare_core_util: float | None = None
    idle_core_util: float | None = None

    def __post_init__(self) -> None:
        if self.action_mode not in ("single", "per_app"):
            raise ConfigError(f"action_mode {self.action_mode!r}; choose 'single' or 'per_app'")
        if not (1 <= self.max_apps <= MAX_APP_SLOTS and 1 <= self.hidden_units <= MAX_HIDDEN_UNITS):
            raise ConfigError(
                f"max_apps must be in 1..{MAX_APP_SLOTS} and hidden_units in 1..{MAX_HIDDEN_UNITS}, "
                f"got {self.max_apps} and {self.hidden_units}"
            )

    @property
    def n_actions(self) -> int:
        """Length of the flat score vector (= the action mask's length)."""
        return ActionCodec(self.max_apps, self.action_mode).mask_size

    @property
    def withholds_moves(self) -> bool:
        """Whether any of `_withhold`'s rules is on (`spare_core_util` acts only inside the slack rule)."""
        return self.pressure_mask or self.down_slack_min is not None or self.idle_core_util is not None


def _mlp(n_in: int, n_hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, n_hidden), nn.ReLU(), nn.Linear(n_hidden, n_out), nn.ReLU())


def _by_app(x: torch.Tensor, action_mode: str, allowed: torch.Tensor) -> torch.Tensor:
    """Per-app move flags `(..., max_apps, moves)` as a flat mask in the layout of `action_mode`."""
    flat = allowed.flatten(start_dim=-2)
    if action_mode == "per_app":
        return flat
    return torch.cat([torch.ones(*x.shape[:-1], 1, dtype=torch.bool), flat], dim=-1)  # HOLD first


def _app_features(x: Any, max_apps: int) -> Any:
    """The per-app blocks `(..., max_apps, N_APP_FEATURES)` of features `x` (a tensor or an array)."""
    return x[..., : N_APP_FEATURES * max_apps].reshape(*x.shape[:-1], max_apps, N_APP_FEATURES)


def _moves_per_slot(action_mode: str) -> int:
    """Columns of the per-app move flags: HOLD and the ten moves per app, or the ten moves alone."""
    return N_MOVES if action_mode == "per_app" else N_APP_MOVES


def _no_moves_withheld(x: torch.Tensor, max_apps: int, action_mode: str) -> torch.Tensor:
    return torch.ones(*x.shape[:-1], max_apps, _moves_per_slot(action_mode), dtype=torch.bool)


def _withhold(spec: NetSpec, apps: Any, allowed: Any) -> None:
    """Clear, in the per-app move flags `allowed`, the moves that `spec`'s pressure, slack and idle-core
    masks withhold from each app given its features `apps` (tensors or arrays: the same rules for
    the network and its numpy view, `GreedyArrays`). `NetSpec.withholds_moves` names the same rules."""
    if spec.pressure_mask:
        _withhold_pressure(allowed, apps, spec.action_mode)
    if spec.down_slack_min is not None:
        _withhold_slack(allowed, apps, spec.action_mode, spec.down_slack_min, spec.spare_core_util)
    if spec.idle_core_util is not None:
        util = apps[..., _APP_NAMES.index("cpu_util")]
        allowed[..., _column(Move.UP_CORE, spec.action_mode)] &= (util <= 0) | (util >= spec.idle_core_util)


def _column(move: Move, action_mode: str) -> int:
    """A move's column in the per-app flags (single mode has no HOLD column there)."""
    return move.value if action_mode == "per_app" else move.value - 1


def _withhold_pressure(allowed: Any, apps: Any, action_mode: str) -> None:
    for move, feature in PRESSURE_MOVES:
        allowed[..., _column(move, action_mode)] &= apps[..., feature] >= PRESSURE_FRAC
    for move, feature in SPARE_MOVES:
        allowed[..., _column(move, action_mode)] &= apps[..., feature] < SPARE_FRAC


def _withhold_slack(
    allowed: Any, apps: Any, action_mode: str, down_slack_min: float, spare_core_util: float | None
) -> None:
    ok = apps[..., _APP_NAMES.index("slack")] > down_slack_min
    for move in DOWN_MOVES:
        if move is Move.DOWN_CORE and spare_core_util is not None:
            util = apps[..., _APP_NAMES.index("cpu_util")]
            allowed[..., _column(move, action_mode)] &= ok | ((util > 0) & (util < spare_core_util))
        else:
            allowed[..., _column(move, action_mode)] &= ok


def feasible_mask(spec: NetSpec, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The actions a network of `spec` may take on features `x`: the env's action `mask` times the
    pressure mask (`spec.pressure_mask`), the slack mask (`spec.down_slack_min`) and the idle-core
    mask (`spec.idle_core_util`), in `mask`'s dtype and shape (module docstring). The rules write
    into one set of per-app flags."""
    if not spec.withholds_moves:
        return mask
    allowed = _no_moves_withheld(x, spec.max_apps, spec.action_mode)
    _withhold(spec, _app_features(x, spec.max_apps), allowed)
    return mask * _by_app(x, spec.action_mode, allowed).reshape(mask.shape).to(mask.dtype)


class SetTrunk(nn.Module):
    """Shared per-app encoder + masked pooling + node context (the module docstring).

    `forward(x)` takes the flat feature vector `(B, N_APP_FEATURES * max_apps + N_NODE_FEATURES)` and returns the per-slot
    embeddings joined with the context `(B, max_apps, 2h)` and the context alone `(B, h)`."""

    def __init__(self, max_apps: int, hidden: int) -> None:
        super().__init__()
        self.max_apps = max_apps
        self.app_encoder = _mlp(N_APP_FEATURES, hidden, hidden)
        self.context = _mlp(2 * hidden + 1 + N_NODE_FEATURES, hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cut = N_APP_FEATURES * self.max_apps
        apps = x[..., :cut].reshape(*x.shape[:-1], self.max_apps, N_APP_FEATURES)
        node = x[..., cut:]
        present = (apps[..., 0] > 0.5).unsqueeze(-1)  # (B, M, 1): the `present` feature
        h = self.app_encoder(apps) * present  # padded slots contribute nothing
        count = present.sum(dim=-2)  # (B, 1)
        mean = h.sum(dim=-2) / count.clamp(min=1)
        peak = h.masked_fill(~present, -1.0).amax(dim=-2).clamp(min=0.0)  # ReLU outputs are >= 0
        ctx = self.context(torch.cat([mean, peak, count / self.max_apps, node], dim=-1))
        joined = torch.cat([h, ctx.unsqueeze(-2).expand(*h.shape[:-1], ctx.shape[-1])], dim=-1)
        return joined, ctx


class ColocNet(nn.Module):
    """The policy network (module docstring): `scores(x)` are unmasked logits or Q-values in the
    action layout of `spec.action_mode`; `masked_scores(x, mask, fill)` applies the action mask;
    `value(x)` is the critic's estimate (PPO)."""

    def __init__(self, spec: NetSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_units
        per_app = N_MOVES if spec.action_mode == "per_app" else N_APP_MOVES
        self.trunk = SetTrunk(spec.max_apps, h)
        self.app_head = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), nn.Linear(h, per_app))
        self.hold_head = nn.Linear(h, 1) if spec.action_mode == "single" else None
        if spec.with_value:
            self.critic_trunk = SetTrunk(spec.max_apps, h)
            self.value_head = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        # small initial scores: a near-uniform policy over the feasible moves at the start
        last = self.app_head[-1]
        assert isinstance(last, nn.Linear)
        nn.init.orthogonal_(last.weight, gain=0.01)
        nn.init.zeros_(last.bias)
        if self.hold_head is not None:
            nn.init.orthogonal_(self.hold_head.weight, gain=0.01)
            nn.init.zeros_(self.hold_head.bias)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        joined, ctx = self.trunk(x)
        per_slot = self.app_head(joined)  # (B, M, 11 or 10)
        flat = per_slot.flatten(start_dim=-2)
        if self.hold_head is None:
            return flat
        return torch.cat([self.hold_head(ctx), flat], dim=-1)

    @staticmethod
    def apply_mask(scores: torch.Tensor, mask: torch.Tensor, fill: float = MASKED_LOGIT) -> torch.Tensor:
        """`scores` with every entry whose mask is 0 replaced by `fill`."""
        return scores.masked_fill(mask < 0.5, fill)

    def feasible(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The actions this network may take (`feasible_mask`: the env's action mask, the pressure
        mask and the slack mask as `spec` asks; module docstring); 1/0 floats of `mask`'s shape."""
        return feasible_mask(self.spec, x, mask)

    def masked_scores(self, x: torch.Tensor, mask: torch.Tensor, fill: float = MASKED_LOGIT) -> torch.Tensor:
        return self.apply_mask(self.scores(x), self.feasible(x, mask), fill)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        if not self.spec.with_value:
            raise RuntimeError("this network has no value head (built with with_value=False)")
        _, ctx = self.critic_trunk(x)
        return self.value_head(ctx).squeeze(-1)

    def greedy(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The highest-scoring feasible action per row: `(B,)` in single mode, `(B, max_apps)`
        per slot in per-app mode (argmax, as RLlib's deterministic distributions do)."""
        s = self.masked_scores(x, mask)
        if self.spec.action_mode == "single":
            return s.argmax(dim=-1)
        return s.reshape(*s.shape[:-1], self.spec.max_apps, N_MOVES).argmax(dim=-1)


class GreedyArrays:
    """`ColocNet.greedy` for one observation in numpy, on views of the network's parameters (no
    copy: it follows in-place updates such as `load_state_dict`; the critic is left out, acting does
    not need it).

    Why: serving decides once an interval on a single observation, and most of what a small torch
    network costs there is torch's per-operation dispatch (about 60 operations), which a tick that
    comes after 20-500 ms of other work pays cold. Measured on the 2-core development machine on
    the 6-app mix (`full.yaml`'s network, `harness.bench.learned_policy_overhead`: the serve loop
    paced 20 ms apart), the greedy action took a median 1.04 ms through torch and 0.25 ms here, and
    `decide()`'s p99 went from 2.21 to 1.18 ms (medians of three alternating runs; README, "Speed").
    It computes what `ColocNet.greedy` computes, operation for operation in float32; the
    moves it withholds come from the same rules (`_withhold`), and tests check that both pick the
    same action on random networks and inputs in both action modes."""

    def __init__(self, net: ColocNet) -> None:
        spec = net.spec
        self.spec = spec

        def layers(seq: nn.Module) -> list[tuple[np.ndarray, np.ndarray]]:
            return [
                (m.weight.detach().numpy().T, m.bias.detach().numpy())
                for m in seq.modules()
                if isinstance(m, nn.Linear)
            ]

        self.app_encoder = layers(net.trunk.app_encoder)
        self.context = layers(net.trunk.context)
        self.app_head = layers(net.app_head)
        self.hold_head = None if net.hold_head is None else layers(net.hold_head)[0]
        self._cut = N_APP_FEATURES * spec.max_apps

    @staticmethod
    def _mlp(layers: list[tuple[np.ndarray, np.ndarray]], h: np.ndarray, relu_last: bool) -> np.ndarray:
        for i, (w, b) in enumerate(layers):
            h = h @ w + b
            if relu_last or i < len(layers) - 1:
                h = np.maximum(h, 0.0)
        return h

    def scores(self, x: np.ndarray) -> np.ndarray:
        """`ColocNet.scores` of one flat feature vector: the unmasked flat score vector."""
        m = self.spec.max_apps
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        apps = x[: self._cut].reshape(m, N_APP_FEATURES)
        present = apps[:, :1] > 0.5  # (M, 1)
        h = self._mlp(self.app_encoder, apps, relu_last=True) * present
        count = np.float32(present.sum())
        mean = h.sum(axis=0) / max(count, np.float32(1.0))
        peak = np.where(present, h, np.float32(-1.0)).max(axis=0).clip(min=0.0)
        ctx = self._mlp(
            self.context,
            np.concatenate([mean, peak, [count / np.float32(m)], x[self._cut :]]),
            relu_last=True,
        )
        joined = np.concatenate([h, np.broadcast_to(ctx, (m, ctx.shape[0]))], axis=1)
        flat = self._mlp(self.app_head, joined, relu_last=False).reshape(-1)
        if self.hold_head is None:
            return flat
        w, b = self.hold_head
        return np.concatenate([ctx @ w + b, flat])

    def feasible(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """`feasible_mask` of one observation: the action mask with the withheld moves cleared (bool)."""
        spec = self.spec
        allowed = np.ones((spec.max_apps, _moves_per_slot(spec.action_mode)), dtype=bool)
        _withhold(spec, _app_features(np.asarray(x, dtype=np.float32).reshape(-1), spec.max_apps), allowed)
        flat = allowed.reshape(-1)
        if spec.action_mode == "single":
            flat = np.concatenate([[True], flat])  # HOLD first, never withheld
        return (np.asarray(mask).reshape(-1) >= 0.5) & flat

    def greedy(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """`ColocNet.greedy` of one observation: an int (single mode) or one per slot (per-app)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)  # once: both steps below take it as it is
        s = np.where(self.feasible(x, mask), self.scores(x), np.float32(MASKED_LOGIT))
        if self.spec.action_mode == "single":
            return np.asarray(s.argmax())
        return s.reshape(self.spec.max_apps, N_MOVES).argmax(axis=-1)


# ---- export and load ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyMeta:
    """Metadata saved with the weights and checked on load."""

    net: NetSpec
    features: FeatureConfig
    feature_layout: list[list[Any]]
    algo: str = ""
    trained_iterations: int = 0
    trained_env_steps: int = 0
    guards: GuardsConfig | None = None  # the guard chain it was trained under (None: not recorded)
    # the training iterations whose networks' weights were averaged into this one (`average_policies`;
    # empty: one network's weights)
    averaged_iterations: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> PolicyMeta:
        try:
            return cls(
                net=NetSpec(**data["net"]),
                features=FeatureConfig(**data["features"]),
                feature_layout=[list(x) for x in data["feature_layout"]],
                algo=str(data.get("algo", "")),
                trained_iterations=int(data.get("trained_iterations", 0)),
                trained_env_steps=int(data.get("trained_env_steps", 0)),
                guards=None
                if data.get("guards") is None
                else GuardsConfig.from_dict(data["guards"], f"{where}: guards"),
                averaged_iterations=tuple(int(i) for i in data.get("averaged_iterations", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: bad policy metadata ({e})") from None


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy ready to act: its metadata and the network in eval mode."""

    meta: PolicyMeta
    net: ColocNet
    path: Path

    greedy: GreedyArrays = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "greedy", GreedyArrays(self.net))

    def act(self, features: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The greedy action for one encoded observation and its action mask (any shape that
        flattens to the mask length): an int in single mode, an int array per slot in per-app mode.
        It runs `GreedyArrays` on the network's parameters."""
        return self.greedy.greedy(features, mask)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, then restore the previous setting.

    Why: a few observations through this small network take ~0.2 ms on one thread, but torch's
    default pool (a thread per core) waits on busy cores: measured on the 2-core CI machine under
    load, one observation took a p50 of 0.27 ms and a p99 of 56 ms (one run had a median of 61 ms)
    against 0.2 ms / ~5-9 ms with one thread, when `decide()` still ran torch (it runs
    `GreedyArrays` now). Used where training code runs the network on small batches."""
    previous = torch.get_num_threads()
    if previous != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if previous != 1:
            torch.set_num_threads(previous)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_policy(path: str | Path, net: ColocNet, meta: PolicyMeta) -> Path:
    """Save `net`'s weights with `meta` to `path` (a file, or a directory that gets `policy.pt`)."""
    path = Path(path)
    if path.is_dir():
        path = path / POLICY_FILE
    if meta.net != net.spec:
        raise ValueError(f"metadata {meta.net} does not describe the network {net.spec}")
    state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    payload = {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "meta": meta.to_dict(),
        "state_dict": state,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def average_policies(paths: Sequence[str | Path], path: str | Path) -> Path:
    """Write to `path` the policy whose weights are the element-wise mean of the policies at `paths`
    (networks of one training run, e.g. its best-scoring checkpoints: stochastic weight averaging,
    Izmailov et al., UAI 2018, which finds a point nearer the centre of the region the late
    iterates of one run wander in than any one of them). The metadata is the latest network's
    (the most iterations), with `averaged_iterations` listing every network's (none for one network).
    ValueError when the policies describe different networks, observation layouts or training
    (algorithm, guards)."""
    if not paths:
        raise ValueError("average_policies needs at least one policy")
    loaded = [load_policy(p) for p in paths]
    first = loaded[0].meta
    for p in loaded[1:]:
        m = p.meta
        if (m.net, m.features, m.algo, m.guards) != (first.net, first.features, first.algo, first.guards):
            raise ValueError(f"{p.path} and {loaded[0].path} are not networks of one training run")
    states = [p.net.state_dict() for p in loaded]
    net = ColocNet(first.net)
    net.load_state_dict({k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]}, strict=True)
    latest = max((p.meta for p in loaded), key=lambda m: m.trained_iterations)
    iterations = tuple(
        sorted(i for p in loaded for i in (p.meta.averaged_iterations or (p.meta.trained_iterations,)))
    )
    return export_policy(
        path, net, replace(latest, averaged_iterations=iterations if len(iterations) > 1 else ())
    )


def resolve_policy_path(path: str | Path) -> Path:
    """A `policy.pt`, or a directory (a training run) holding one; ConfigError when missing."""
    p = Path(path)
    if p.is_dir():
        p = p / POLICY_FILE
    if not p.is_file():
        raise ConfigError(
            f"{path}: no trained policy here (expected a {POLICY_FILE} file or a training run directory "
            f"holding one; train.py writes OUT/{POLICY_FILE})"
        )
    return p


def load_policy(
    path: str | Path, *, expect_mode: str | None = None, expect_max_apps: int | None = None
) -> LoadedPolicy:
    """Load an exported policy with torch alone. ConfigError (exit 2 in the CLIs) when the file is
    missing, corrupt, of another format, trained on another feature layout, of another action
    layout / `max_apps` than expected, or holds weights that are not finite."""
    p = resolve_policy_path(path)
    try:
        payload = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds on a damaged file
        raise ConfigError(f"{p}: not a readable policy file ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != POLICY_FORMAT:
        raise ConfigError(f"{p}: not a coloc policy file (written by train.py / agents.policy.export_policy)")
    if payload.get("version") != POLICY_VERSION:
        raise ConfigError(
            f"{p}: policy file version {payload.get('version')}; this code reads version {POLICY_VERSION}"
        )
    meta = PolicyMeta.from_dict(payload.get("meta") or {}, str(p))
    if meta.feature_layout != feature_layout():
        raise ConfigError(
            f"{p}: the policy was trained on another observation layout than env.features produces now "
            "(features added, removed or rescaled); retrain it"
        )
    check_layout(meta.net, expect_mode, expect_max_apps, str(p))
    net = ColocNet(meta.net)
    try:
        net.load_state_dict(payload["state_dict"], strict=True)
    except (RuntimeError, KeyError, TypeError) as e:
        raise ConfigError(f"{p}: weights do not match the network described by its metadata ({e})") from None
    bad = [name for name, w in net.state_dict().items() if not bool(torch.isfinite(w).all())]
    if bad:
        raise ConfigError(
            f"{p}: the weights of {bad[0]} are not finite (NaN or infinity): the policy would pick arbitrary "
            "moves; it is damaged or its training diverged (retrain it, or export an earlier checkpoint)"
        )
    net.eval()
    return LoadedPolicy(meta, net, p)


def check_layout(spec: NetSpec, expect_mode: str | None, expect_max_apps: int | None, where: str) -> None:
    """ConfigError when a saved network's action layout or slot count is not the expected one."""
    if expect_mode is not None and spec.action_mode != expect_mode:
        raise ConfigError(
            f"{where}: the checkpoint has action_mode={spec.action_mode!r}, this run uses {expect_mode!r} "
            "(another action layout; set env.action_mode to match, or start a new run)"
        )
    if expect_max_apps is not None and spec.max_apps != expect_max_apps:
        raise ConfigError(
            f"{where}: the checkpoint has max_apps={spec.max_apps}, this run uses {expect_max_apps} "
            "(the observation and action spaces differ; set env.max_apps to match, or start a new run)"
        )


# ---- the controller -------------------------------------------------------------------------------
# PARTIES Sec. 4.3: "downsizing an application is disabled for 30s once an incorrect downsize action
# was reverted"; a downsize is incorrect when the app's slack falls below PARTIES' upsize threshold
# the next interval (Alg. 1 / Alg. 3: 0.05). The ban lasts 10 s, as in the authors' code (`REST`,
# 100 samples of 100 ms; `parties:code`): on the README's 13 scenarios it kept the Q-PRM node's gain
# of 30 s and lost less elsewhere (the six-app window 3 of 3 seeds, not 2)
DOWNSIZE_BAN_S = 10.0
FAILED_DOWNSIZE_SLACK = UPSIZE_SLACK_BELOW


class RlController(BaseController):
    """A trained policy as a `Controller` (spec `rl:PATH`; module docstring). Besides the previous
    observation (history features) it keeps one rule of PARTIES' own (Sec. 4.3): an app whose slack
    falls below `FAILED_DOWNSIZE_SLACK` the interval after the policy downsized it is offered no
    DOWN move for `DOWNSIZE_BAN_S`. An invalid observation holds the allocation (BaseController's
    default)."""

    name = "rl"

    def __init__(self, policy: LoadedPolicy) -> None:
        super().__init__()
        self.policy = policy
        spec = policy.meta.net
        self.encoder = ObservationEncoder(spec.max_apps, policy.meta.features)
        self.codec = ActionCodec(spec.max_apps, spec.action_mode)
        self._previous: Observation | None = None  # for the history features (env.features)
        self._downsized: frozenset[str] = frozenset()  # apps the last decision downsized
        self._banned_until_s: dict[str, float] = {}  # app -> end of its downsize ban (node time)
        self.no_down: frozenset[str] = frozenset()  # apps the last decision offered no DOWN move

    def _reset(self) -> None:
        assert self.caps is not None
        self._previous = None
        self._downsized, self._banned_until_s, self.no_down = frozenset(), {}, frozenset()
        n = len(self.caps.lc_apps)
        if n > self.codec.max_apps:
            raise ConfigError(
                f"rl:{self.policy.path}: the node runs {n} LC apps; this policy was trained for at most "
                f"max_apps={self.codec.max_apps}"
            )

    def _on_invalid(self, observation: Observation) -> Decision:
        self._previous = observation  # the env's encoder sees every observation, valid or not
        return super()._on_invalid(observation)

    def _decide(self, observation: Observation) -> Decision:
        caps = self.caps
        assert caps is not None
        x = self.encoder.encode(observation, caps, previous=self._previous)
        self._previous = observation
        now = observation.time_s
        for sample in observation.apps:  # Sec. 4.3: the last downsize of this app failed
            if sample.name in self._downsized and sample.valid and sample.slack < FAILED_DOWNSIZE_SLACK:
                self._banned_until_s[sample.name] = now + DOWNSIZE_BAN_S
        self._banned_until_s = {a: until for a, until in self._banned_until_s.items() if until > now}
        self.no_down = frozenset(self._banned_until_s)
        mask = self.codec.mask(observation, caps, no_down=self.no_down)
        action = self.policy.act(x, mask)
        decoded = self.codec.decode(action, observation, caps)
        self._downsized = frozenset(a for a, m, _ in decoded.applied if m.direction is Direction.DOWN)
        if not decoded.applied:
            why = "; ".join(f"{a}:{m} refused ({r})" for a, m, r in decoded.rejected)
            reason = "policy: HOLD" + (f" ({why})" if why else "")
            if decoded.allocation == observation.allocation:
                return Decision.hold(reason)
            # the network partition follows the apps' use (env.moves.adjust_network, PARTIES Alg. 1)
            return Decision(
                decoded.allocation, reason=reason + "; network partition adjusted", move=Move.HOLD
            )
        reason = "policy: " + ", ".join(describe_move(*x) for x in decoded.applied)
        if len(decoded.applied) == 1:
            app, move, _ = decoded.applied[0]
            return Decision(decoded.allocation, reason=reason, move=move, app=app)
        return Decision(decoded.allocation, reason=reason, moves=tuple((a, m) for a, m, _ in decoded.applied))


def make(context: ControllerContext, arg: str | None) -> RlController:
    """Factory of the registry spec `rl:PATH` (`harness.registry`)."""
    if not arg:
        raise ConfigError("controller 'rl' needs a path: rl:PATH (a policy.pt or a train.py run directory)")
    return RlController(load_policy(arg))


def policy_summary(policy: LoadedPolicy) -> str:
    """One line describing a loaded policy (for logs and `--help`-style listings)."""
    m = policy.meta
    params = sum(p.numel() for p in policy.net.parameters())
    steps = f"{m.trained_env_steps / 1e6:.2f}M" if m.trained_env_steps >= 1e5 else str(m.trained_env_steps)
    averaged = (
        f" (the mean of the networks of iterations {', '.join(map(str, m.averaged_iterations))})"
        if m.averaged_iterations
        else ""
    )
    return (
        f"{policy.path}: {m.algo or '?'} {m.net.action_mode} policy, max_apps={m.net.max_apps}, "
        f"{params} parameters, {m.trained_iterations} iterations / {steps} env steps{averaged}"
    )


__all__ = [
    "LAST_POLICY_FILE",
    "MASKED_LOGIT",
    "POLICY_FILE",
    "ColocNet",
    "GreedyArrays",
    "LoadedPolicy",
    "NetSpec",
    "PolicyMeta",
    "RlController",
    "average_policies",
    "check_layout",
    "export_policy",
    "feasible_mask",
    "feature_layout",
    "load_policy",
    "make",
]
