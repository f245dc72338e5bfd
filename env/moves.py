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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from env.types import (
    EPS,
    N_MOVES,
    POOL_FIELD,
    Allocation,
    AppAlloc,
    AppSample,
    Capabilities,
    Direction,
    Move,
    Observation,
    Resource,
    min_amount,
)

MEM_VICTIM_MIN_SLACK_GB = 1.0  # PARTIES Sec. 4.2.4
# Memory and disk bandwidth help an app only when it uses what it has (PARTIES Sec. 4.2.3: the storage
# wheel is for an app whose memory is "almost saturated"): more of them is offered to an app using at
# least PRESSURE_FRAC of its limit, less to one using under SPARE_FRAC
PRESSURE_FRAC = 0.9
SPARE_FRAC = 0.25


def storage_share(s: AppSample, a: AppAlloc, res: Resource) -> float:
    """The share of its memory limit / disk-bandwidth limit (`a`'s) the app used in sample `s`:
    NaN where the sample reports no such use, 0 without a limit."""
    used, limit = (
        (s.usage.memory_gb, a.memory_gb) if res is Resource.MEM else (s.usage.disk_mbps, a.disk_mbps)
    )
    if not math.isfinite(used):
        return math.nan
    return used / limit if limit > 0 else 0.0


def storage_use(obs: Observation, alloc: Allocation, app: str, res: Resource) -> float:
    """The share of its memory limit / disk-bandwidth limit the app used in the last interval
    (0 without a limit, a valid sample or a reported use)."""
    s = next((x for x in obs.apps if x.name == app), None)
    if s is None or not s.valid:
        return 0.0
    share = storage_share(s, alloc[app], res)
    return share if math.isfinite(share) else 0.0


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


def per_app_order(obs: Observation, moves: list[tuple[str, Move]]) -> list[tuple[str, Move]]:
    """The order in which several apps' moves of one interval apply (the `per_app` action mode):
    every DOWN first, in the order given, since they free units; then every UP, the app with the
    least slack first (an app without a latency sample counts as least), so that the app furthest
    from its target has first pick of what is free or reclaimable (PARTIES Alg. 1 upsizes the
    worst app first)."""
    if len(moves) < 2:
        return list(moves)
    slack = {s.name: s.slack for s in obs.apps}

    def up_key(item: tuple[str, Move]) -> float:
        v = slack.get(item[0], math.nan)
        return v if math.isfinite(v) else -math.inf

    downs = [x for x in moves if x[1].direction is Direction.DOWN]
    ups = sorted((x for x in moves if x[1].direction is Direction.UP), key=up_key)
    return downs + ups


def plan_moves(
    obs: Observation,
    caps: Capabilities,
    moves: list[tuple[str, Move]],
    accept: Callable[[PlannedMove], bool] | None = None,
) -> tuple[Allocation, list[PlannedMove], list[PlannedMove]]:
    """Several apps' moves of one interval, applied in `per_app_order`, each planned with
    `plan_move` on the allocation the ones before it produced: (the allocation after them, the
    moves applied, the moves refused: infeasible, or, with `accept`, a feasible one it rejects)."""
    alloc = obs.allocation
    applied: list[PlannedMove] = []
    refused: list[PlannedMove] = []
    for app, move in per_app_order(obs, moves):
        planned = plan_move(obs, caps, app, move, alloc)
        if planned.allocation is None or (accept is not None and not accept(planned)):
            refused.append(planned)
            continue
        alloc = planned.allocation
        applied.append(planned)
    return alloc, applied, refused


def move_mask(obs: Observation, caps: Capabilities, app: str, alloc: Allocation | None = None) -> np.ndarray:
    """Feasibility of the eleven moves (HOLD first) for `app`, as a boolean array: `plan_move`'s
    candidates, checked with `Allocation.infeasible_reason`'s rules (no allocation is built, no
    reason is formatted: this runs for every app of every node each interval of training).

    A move is feasible when some candidate can take part, so the candidates' order (the latency and
    memory slack that `plan_move` ranks them by) does not matter: a DOWN move needs only the app's
    own unit above its minimum (the idle pool always takes it), an UP move the idle pool's unit or
    one candidate above its minimum that shares no core group or CLOS with the app."""
    alloc = obs.allocation if alloc is None else alloc
    return MaskContext(alloc, caps).mask(app)


_UP_DOWN = {r: (Move.of(Direction.UP, r).value, Move.of(Direction.DOWN, r).value) for r in Resource}


class MaskContext:
    """Per-allocation quantities of `move_mask`, computed once for all of its apps."""

    def __init__(self, alloc: Allocation, caps: Capabilities) -> None:
        self.alloc, self.caps = alloc, caps
        self.pool = {
            Resource.CORE: alloc.idle_cores,
            Resource.CACHE: float(alloc.idle_llc_ways),
            Resource.MEM: alloc.idle_memory_gb,
            Resource.DISK: alloc.idle_disk_mbps,
        }
        self.step = {r: (1.0 if r is Resource.CACHE else caps.step(r)) for r in self.pool}
        self.be = {b.name for b in caps.be_apps}
        self.members = [a for a in alloc.apps]

    def _minimum(self, res: Resource, name: str) -> float:
        return min_amount(res, self.caps, name in self.be)

    def mask(self, app: str) -> np.ndarray:
        caps, alloc = self.caps, self.alloc
        me = alloc[app]
        out = np.zeros(N_MOVES, dtype=bool)
        out[0] = True
        for res in Resource:
            if res not in caps.knobs:
                continue
            up, down = _UP_DOWN[res]
            if res is Resource.FREQ:
                levels = caps.freq_levels_mhz
                if me.freq_mhz in levels:
                    i = levels.index(me.freq_mhz)
                    out[up], out[down] = i + 1 < len(levels), i > 0
                continue
            field, step = POOL_FIELD[res], self.step[res]
            out[down] = getattr(me, field) - step >= self._minimum(res, app) - EPS
            if self.pool[res] + EPS >= step:
                out[up] = True
                continue
            key = "core_group" if res is Resource.CORE else "clos" if res is Resource.CACHE else None
            for other in self.members:
                if other.name == app or (key is not None and getattr(other, key) == getattr(me, key)):
                    continue
                if getattr(other, field) - step >= self._minimum(res, other.name) - EPS:
                    out[up] = True
                    break
        return out


# ---- the network partition, outside the ten moves -------------------------------------------------------
@dataclass(frozen=True)
class NetworkRule:
    """PARTIES Sec. 4.2.1 `adjust_network_bandwidth_partition()`: network bandwidth is a threshold, not
    a tradeable resource, so it follows each LC app's use every interval, outside the ten moves."""

    increase_below_gbps: float = 0.5  # bandwidth slack (limit - use) below which the limit grows
    reclaim_above_gbps: float = 1.0  # slack above which bandwidth is reclaimed
    step_gbps: float = 0.5


def adjust_network(
    obs: Observation, alloc: Allocation, caps: Capabilities, rule: NetworkRule = NetworkRule()
) -> tuple[Allocation, list[str]]:
    """PARTIES' network partition (Alg. 1, Sec. 4.2.1; the one rule every controller of the ten moves
    shares): `step_gbps` more to an LC app whose bandwidth slack is below `increase_below_gbps` (from
    unallocated link capacity first, then from the BE jobs), `step_gbps` reclaimed from one whose
    slack exceeds `reclaim_above_gbps` (to the BE jobs, idle when there are none); reclaims first, so
    that the bandwidth can serve an increase in the same interval. The sum of the limits never
    exceeds the link. Returns the allocation and one note per change."""
    notes: list[str] = []
    be = next((b.name for b in caps.be_apps if b.name in alloc), None)
    lc = {a.name for a in caps.lc_apps}
    samples = [s for s in obs.apps if s.name in lc and s.name in alloc and s.valid]
    out = alloc
    for s in samples:
        lim = out[s.name].net_gbps
        if lim - s.usage.net_gbps > rule.reclaim_above_gbps:
            give = min(rule.step_gbps, lim)
            out = out.replace_app(s.name, net_gbps=_q(lim - give))
            if be is not None:
                out = out.replace_app(be, net_gbps=_q(min(out[be].net_gbps + give, caps.net_gbps)))
            notes.append(f"net {s.name} -{give:g} Gbps")
    for s in sorted(samples, key=lambda x: out[x.name].net_gbps - x.usage.net_gbps):
        lim = out[s.name].net_gbps
        if lim - s.usage.net_gbps >= rule.increase_below_gbps:
            continue
        idle = max(caps.net_gbps - sum(a.net_gbps for a in out), 0.0)
        from_idle = min(rule.step_gbps, idle, caps.net_gbps - lim)
        from_be = 0.0
        if be is not None:
            from_be = min(rule.step_gbps - from_idle, out[be].net_gbps, caps.net_gbps - lim - from_idle)
        got = from_idle + max(from_be, 0.0)
        if got <= EPS:
            continue
        out = out.replace_app(s.name, net_gbps=_q(lim + got))
        if be is not None and from_be > 0:
            out = out.replace_app(be, net_gbps=_q(out[be].net_gbps - from_be))
        notes.append(f"net {s.name} +{got:g} Gbps")
    return out, notes


def _q(x: float) -> float:
    """A bandwidth rounded to 1e-6 Gbps, so that repeated +-0.5 steps do not drift."""
    return round(x, 6)
