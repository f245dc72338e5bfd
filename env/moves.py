"""Where a move's unit comes from or goes to: one rule for every controller (DESIGN §3).

PARTIES Sec. 4.2.4 (Alg. 4, `find_victim_application`): an UP move takes one unit from the BE
jobs first; otherwise from the LC app with the most tail-latency slack, except for memory, where
the victim is the app with the most memory slack (allocated - used) as long as it exceeds 1 GB,
to avoid OOM kills. Unallocated (idle) resources are taken before anything is reclaimed from
another app. A DOWN move gives the unit to the BE jobs, or leaves it idle when there are none.
Frequency is a per-core setting: it has no counterpart.

`plan_move` returns the new allocation together with the counterpart it chose, so that PARTIES can
apply its anti-ping-pong rule to the victim; `move_mask` gives the feasibility of all eleven moves
of an app (the action mask of the Gymnasium env).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from env.types import (
    N_MOVES,
    Allocation,
    Capabilities,
    Direction,
    Move,
    Observation,
    Resource,
)

MEM_VICTIM_MIN_SLACK_GB = 1.0  # PARTIES Sec. 4.2.4


@dataclass(frozen=True)
class PlannedMove:
    """The outcome of planning `move` for `app`: the allocation after it (None if infeasible),
    the counterpart (victim of an UP move / recipient of a DOWN move; None = idle pool) and why."""

    app: str
    move: Move
    allocation: Allocation | None
    counterpart: str | None
    reason: str

    @property
    def feasible(self) -> bool:
        return self.allocation is not None


def memory_slack_gb(obs: Observation, alloc: Allocation) -> dict[str, float]:
    """Allocated minus resident memory per LC app (PARTIES' memory slack)."""
    return {s.name: alloc[s.name].memory_gb - s.usage.memory_gb for s in obs.apps if s.name in alloc}


def _latency_slack(obs: Observation) -> dict[str, float]:
    out = {}
    for s in obs.apps:
        v = s.slack
        out[s.name] = v if math.isfinite(v) else -math.inf  # unknown slack never makes a victim
    return out


def victim_candidates(
    obs: Observation, alloc: Allocation, caps: Capabilities, app: str, res: Resource
) -> list[str | None]:
    """Counterparts for an UP move of `res`, in PARTIES' order of preference (None = idle pool)."""
    order: list[str | None] = [None]
    order += [b.name for b in caps.be_apps if b.name in alloc]
    others = [s.name for s in obs.apps if s.name != app and s.name in alloc]
    lat = _latency_slack(obs)
    if res is Resource.MEM:
        mem = memory_slack_gb(obs, alloc)
        rich = sorted((n for n in others if mem.get(n, 0.0) > MEM_VICTIM_MIN_SLACK_GB), key=lambda n: -mem[n])
        poor = sorted((n for n in others if n not in rich), key=lambda n: -lat[n])
        order += rich
        order += poor
    else:
        by_slack = sorted(others, key=lambda n: -lat[n])
        order += by_slack
    return order


def _candidates(
    obs: Observation, alloc: Allocation, caps: Capabilities, app: str, move: Move
) -> list[str | None]:
    """The counterparts tried for `move`, in order (the one rule used by plan_move and move_mask)."""
    res = move.resource
    assert res is not None
    if res is Resource.FREQ:
        return [None]
    if move.direction is Direction.DOWN:
        return [*[b.name for b in caps.be_apps if b.name in alloc][:1], None]
    return victim_candidates(obs, alloc, caps, app, res)


def plan_move(
    obs: Observation, caps: Capabilities, app: str, move: Move, alloc: Allocation | None = None
) -> PlannedMove:
    """The allocation after `move` for `app`, with the counterpart chosen by the rule above."""
    alloc = obs.allocation if alloc is None else alloc
    if move is Move.HOLD:
        return PlannedMove(app, move, alloc, None, "hold")
    reasons = []
    for c in _candidates(obs, alloc, caps, app, move):
        why = alloc.infeasible_reason(app, move, caps, c)
        if not why:
            return PlannedMove(app, move, alloc.with_move(app, move, caps, c), c, "")
        reasons.append(why)
    res = move.resource
    if move.direction is Direction.UP and res is not None and res is not Resource.FREQ:
        return PlannedMove(
            app,
            move,
            None,
            None,
            f"no victim can give one unit of {res.value}: {reasons[-1] if reasons else ''}",
        )
    return PlannedMove(app, move, None, None, reasons[-1] if reasons else "infeasible")


def move_mask(obs: Observation, caps: Capabilities, app: str, alloc: Allocation | None = None) -> np.ndarray:
    """Feasibility of the eleven moves (HOLD first) for `app`, as a boolean array. Checks
    feasibility only (no allocation is built), with the same candidates as `plan_move`."""
    alloc = obs.allocation if alloc is None else alloc
    mask = np.zeros(N_MOVES, dtype=bool)
    mask[0] = True
    for m in list(Move)[1:]:
        mask[m.value] = any(
            not alloc.infeasible_reason(app, m, caps, c) for c in _candidates(obs, alloc, caps, app, m)
        )
    return mask
