"""The Oracle, one move at a time: a privileged teacher for the learned policy, and a controller.

The Oracle (`baselines.oracle`, PARTIES Sec. 5.2.3) knows the scenario's loads and the simulator's
model and jumps to the best allocation for them. A policy that sees only what a real node shows
(slack, load, utilisation) cannot jump: it makes one of PARTIES' ten moves per 500 ms interval
(Sec. 4.2.3). `OracleGuidedController` bridges the two: at each interval it takes the Oracle's plan
for the loads ahead (planned once per load vector, from the episode's first allocation, and cached)
and makes the move that leads there. Imitated by DAgger (`agents.rllib.imitation`), it is a teacher
that knows where to go, where PARTIES only knows which way is up (privileged-teacher distillation,
as in learning by cheating: Chen et al., CoRL 2019; the student sees only the observation, so it
still deploys on a real node).

The move, in this order (each only if the action mask allows it, `env.moves.plan_move`):

1. an app missing or about to miss its target (slack < `urgent_slack`, the smallest slack first)
   that holds less of some resource than the plan: UP on that resource (cores first, then LLC ways,
   frequency, memory, disk: the order of PARTIES' wheels, Fig. 4; memory and disk only for an app
   that uses what it has, `env.moves.PRESSURE_FRAC`, as the student's mask allows);
2. make before break: an app the plan trades one resource for another (less of one, more of the
   other: the resources are fungible, PARTIES Sec. 4.2.3) gets its UP first, when the unit comes
   from the idle pool or a BE job, or from no one (frequency);
3. an app holding more cores, LLC ways or frequency than the plan: DOWN (the largest slack first),
   so that the unit goes to the BE job or the idle pool, where the UP moves of step 4 take it from
   (memory and disk are not reclaimed: `RECLAIM`);
4. any other app holding less than the plan: UP;
5. otherwise HOLD.

An UP move takes its unit from the idle pool or the BE job first (PARTIES Alg. 4), so steps 3-4
move a unit between LC apps through the BE job without ever taking it from an LC app that needs
it. Step 2 keeps an app from passing through an allocation below both ends of its trade: on the
Q-PRM node the plan gives the BE job one of memcached's nine cores and memcached turbo in exchange;
taken the other way round (the core first) memcached ran at 23x its target for the interval between,
and a student learning from that episode sees the move that feeds the BE job followed by the worst
miss of the episode.

`oracle-guided-per-app` (`GuidedConfig.per_app`) is the teacher of the `per_app` action mode, where
every app makes one move per interval: each app takes the first of these steps that has a move for
it, and the moves apply together as that mode applies them (`moves_per_app`). With six apps a
plan that needs a dozen moves is reached in a few intervals instead of a dozen. (`oracle-guided`
in `per_app` mode labels its one move at its app's slot, HOLD elsewhere.)

Which plan: the teacher's Oracle keeps every interval within target (`verdict: intervals`,
configs/baselines/oracle-guided.yaml). Where no allocation can (`SearchReport.verdict` not
"viable"), it plans again under the referee's own rule, the window verdict (PARTIES Sec. 5.1:
every app's p99 over the measured window), and leads to that plan when it is viable; only when
neither is does it lead to the closest intervals plan. With `interval_counts: poisson`
(configs/baselines/oracle-guided-poisson.yaml: the intervals verdict as the simulated node
reports an interval) it also plans again when the window verdict does not admit the intervals
plan (`OracleController.admits`): for an app with under one request an interval (Sphinx at 10%
of its max load) half the intervals are empty and report its expected p99, so a tail of a few
percent meets most intervals, while the window's p99 of ~80 requests is their slowest
(settle-mix5: that intervals plan missed the window in one of two seeds). Why: beside six apps (`mix6-const`: MongoDB at
its knee) no allocation keeps every interval within target, and the closest intervals plan (the
likeliest to meet in one interval) gives MongoDB 7 cores and Sphinx 1: led there, the teacher met
QoS in 12.8% of the intervals and the window in none of 3 seeds, leaving the BE job 0.0%; led to the
window plan, 83.9%, 3 of 3 and 14.0% (`evaluate.py compare --scenario mix6-const --seeds 3`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from env.config import ConfigError, resolve_config
from env.controller import BaseController, ControllerContext
from env.moves import PRESSURE_FRAC, PlannedMove, adjust_network, plan_move, plan_moves, storage_use
from env.types import (
    DOWNSIZE_SLACK_ABOVE,
    UPSIZE_SLACK_BELOW,
    Allocation,
    Capabilities,
    Decision,
    Direction,
    Move,
    Observation,
    Resource,
)

if TYPE_CHECKING:
    from baselines.oracle import OracleController, Plan

ORDER = (Resource.CORE, Resource.CACHE, Resource.FREQ, Resource.MEM, Resource.DISK)  # Fig. 4's wheels
# reclaimed (DOWN) toward a plan: compute only. The BE job (PARTIES Sec. 5.1: compute and memory-
# bandwidth microbenchmarks) gains nothing from an LC app's spare memory or disk bandwidth, and a
# tighter memory limit risks page faults the plan's steady state does not see
RECLAIM = (Resource.CORE, Resource.CACHE, Resource.FREQ)


@dataclass(frozen=True)
class GuidedConfig:
    """The teacher's threshold (below this slack an app's UP moves come before any reclaim) and
    its pace: one move per interval (PARTIES Sec. 4.2.3), or, `per_app`, one per app
    (`moves_per_app`, which downsizes only apps with more slack than `down_slack_above`)."""

    urgent_slack: float = UPSIZE_SLACK_BELOW  # PARTIES Alg. 1's upsize threshold
    per_app: bool = False
    down_slack_above: float = DOWNSIZE_SLACK_ABOVE  # per_app: Alg. 1's downsize threshold (below)


def units(alloc: Allocation, caps: Capabilities, app: str, res: Resource) -> float:
    """How much of `res` the app holds, in move units (frequency: its level's index)."""
    a = alloc[app]
    if res is Resource.FREQ:
        levels = caps.freq_levels_mhz
        return float(levels.index(a.freq_mhz)) if a.freq_mhz in levels else float(len(levels) - 1)
    field = {
        Resource.CORE: "cores",
        Resource.CACHE: "llc_ways",
        Resource.MEM: "memory_gb",
        Resource.DISK: "disk_mbps",
    }
    return float(getattr(a, field[res])) / caps.step(res)


def gaps(cur: Allocation, target: Allocation, caps: Capabilities, app: str) -> dict[Resource, float]:
    """Per resource the app's knob can move, target minus current, in move units."""
    return {r: units(target, caps, app, r) - units(cur, caps, app, r) for r in ORDER if r in caps.knobs}


def _toward(
    obs: Observation,
    caps: Capabilities,
    g: dict[str, dict[Resource, float]],
    lc: list[str],
    apps: list[str],
    direction: Direction,
    lc_victim: bool = True,
) -> Iterator[tuple[str, Move]]:
    """The feasible moves of `apps` (in that order, each app's resources in Fig. 4's order) that
    close a gap `g` to the plan in `direction`; with `lc_victim` False, only UP moves whose unit
    comes from the idle pool, a BE job or no one."""
    cur = obs.allocation
    for a in apps:
        for r in ORDER if direction is Direction.UP else RECLAIM:
            d = g[a].get(r, 0.0)
            if d > 0.5 if direction is Direction.UP else d < -0.5:
                if r in (Resource.MEM, Resource.DISK) and storage_use(obs, cur, a, r) < PRESSURE_FRAC:
                    continue  # more memory / disk helps only an app that uses what it has
                m = Move.of(direction, r)
                planned = plan_move(obs, caps, a, m)
                if planned.feasible and (lc_victim or planned.counterpart not in lc):
                    yield a, m


def _slack_and_gaps(
    obs: Observation, caps: Capabilities, target: Allocation
) -> tuple[dict[str, float], list[str], dict[str, dict[Resource, float]]]:
    """Each app's slack (-inf when unmeasured), the LC apps the plan covers, their gaps to it."""
    cur = obs.allocation
    slack = {s.name: (s.slack if math.isfinite(s.slack) else -math.inf) for s in obs.apps}
    lc = [a.name for a in caps.lc_apps if a.name in cur and a.name in target]
    return slack, lc, {a: gaps(cur, target, caps, a) for a in lc}


def _steps(
    obs: Observation, caps: Capabilities, target: Allocation, cfg: GuidedConfig
) -> Iterator[tuple[bool, Iterator[tuple[str, Move]]]]:
    """The steps of the module docstring's order, each as (is it step 1, its feasible moves in the
    teacher's order). The moves are generated lazily, so the first costs one `plan_move` per
    candidate before it and no more."""
    slack, lc, g = _slack_and_gaps(obs, caps, target)
    by_need = sorted(lc, key=lambda a: slack.get(a, -math.inf))
    urgent = [a for a in by_need if slack.get(a, -math.inf) < cfg.urgent_slack]
    trading = [a for a in by_need if any(g[a].get(r, 0.0) < -0.5 for r in RECLAIM)]
    yield True, _toward(obs, caps, g, lc, urgent, Direction.UP)
    yield False, _toward(obs, caps, g, lc, trading, Direction.UP, lc_victim=False)
    yield False, _toward(obs, caps, g, lc, sorted(lc, key=lambda a: -slack.get(a, -math.inf)), Direction.DOWN)
    yield False, _toward(obs, caps, g, lc, by_need, Direction.UP)


def moves_per_app(
    obs: Observation, caps: Capabilities, target: Allocation, cfg: GuidedConfig = GuidedConfig()
) -> tuple[tuple[str, Move], ...]:
    """At most one move per app toward `target`, all in one interval (the `per_app` action mode,
    module docstring): each app takes the first move of the module docstring's steps restricted to
    itself (urgent UP; a trade's UP from the idle pool, a BE job or no one; DOWN, only with slack
    above `cfg.down_slack_above`, PARTIES Alg. 1's downsize threshold: many apps are downsized at
    once, and the student's mask offers DOWN moves only there, `model.down_slack_min`; UP). They apply
    as `env.moves.plan_moves` applies them (DOWNs first, so that the units they free serve the UPs
    of the same interval); an UP that would then take its unit from another LC app is left out
    unless its app is urgent (step 1), so that apps moving at once do not take from each other what
    the plan gives them. Slot order; () when there is none to make (HOLD)."""
    return _slot_order(caps, _per_app_plan(obs, caps, target, cfg)[0])


def _slot_order(caps: Capabilities, applied: list[PlannedMove]) -> tuple[tuple[str, Move], ...]:
    slot = {a.name: k for k, a in enumerate(caps.lc_apps)}
    return tuple(sorted(((p.app, p.move) for p in applied), key=lambda x: slot[x[0]]))


def _per_app_plan(
    obs: Observation, caps: Capabilities, target: Allocation, cfg: GuidedConfig
) -> tuple[list[PlannedMove], Allocation]:
    """`moves_per_app`'s moves, in the order they apply, and the allocation after them."""
    slack, lc, g = _slack_and_gaps(obs, caps, target)
    urgent = {a for a in lc if slack.get(a, -math.inf) < cfg.urgent_slack}
    proposed: list[tuple[str, Move]] = []
    for a in lc:
        steps = [(Direction.UP, True)] if a in urgent else []
        if any(g[a].get(r, 0.0) < -0.5 for r in RECLAIM):
            steps.append((Direction.UP, False))
        if slack.get(a, -math.inf) > cfg.down_slack_above:
            steps.append((Direction.DOWN, True))
        steps.append((Direction.UP, True))
        for direction, lc_victim in steps:
            first = next(_toward(obs, caps, g, lc, [a], direction, lc_victim), None)
            if first is not None:
                proposed.append(first)
                break

    def no_lc_victim(p: PlannedMove) -> bool:
        return p.move.direction is not Direction.UP or p.counterpart not in lc or p.app in urgent

    alloc, applied, _ = plan_moves(obs, caps, proposed, accept=no_lc_victim)
    return applied, alloc


def move_toward(
    obs: Observation, caps: Capabilities, target: Allocation, cfg: GuidedConfig = GuidedConfig()
) -> tuple[str, Move] | None:
    """The one move that leads from the observation's allocation to `target` (module docstring);
    None when there is none to make (HOLD)."""
    for _, moves in _steps(obs, caps, target, cfg):
        first = next(moves, None)
        if first is not None:
            return first
    return None


def move_options(
    obs: Observation, caps: Capabilities, target: Allocation, cfg: GuidedConfig = GuidedConfig()
) -> tuple[tuple[str, Move], ...]:
    """Every move of the first step of the module docstring's order that has one, the teacher's own
    move first (`move_toward`); () when there is none to make (HOLD). Within a step the order among
    apps and resources follows what the observation shows (slack) and what it does not (which
    resources the plan holds below or above the allocation); the moves a student cannot tell apart
    are equally good labels (`agents.rllib.imitation`, `labels: options`). Step 1 keeps only the
    app with the smallest slack, which the student sees."""
    for step1, moves in _steps(obs, caps, target, cfg):
        found = list(moves)
        if found:  # step 1: the most urgent app that can be given something, alone
            return tuple(o for o in found if not step1 or o[0] == found[0][0])
    return ()


class OracleGuidedController(BaseController):
    """The Oracle's plan reached one PARTIES move per interval (module docstring)."""

    name = "oracle-guided"

    def __init__(self, oracle: OracleController, config: GuidedConfig | None = None) -> None:
        super().__init__()
        self.oracle = oracle
        self.cfg = config or GuidedConfig()
        # the referee's rule when no plan keeps every interval within target (module docstring)
        self.fallback: OracleController | None = None
        if oracle.cfg.verdict != "window":
            self.fallback = type(oracle)(
                oracle.scenario, oracle.seed, dataclasses.replace(oracle.cfg, verdict="window")
            )
        self._start: Allocation | None = None
        self._last: tuple[Observation, Allocation] | None = None  # the last decision's state and plan
        self._options: tuple[tuple[str, Move], ...] | None = None  # its options, once asked for

    @property
    def options(self) -> tuple[tuple[str, Move], ...]:
        """The last decision's equally good moves, its own first (`move_options`; () = HOLD).
        Found only when asked for (a `plan_move` per candidate), once per decision."""
        if self._options is None:
            if self._last is None or self.caps is None:
                self._options = ()
            else:
                obs, target = self._last
                self._options = move_options(obs, self.caps, target, self.cfg)
        return self._options

    def _reset(self) -> None:
        assert self.caps is not None and self.rng is not None
        self.oracle.reset(self.caps, self.rng)
        if self.fallback is not None:
            self.fallback.reset(self.caps, self.rng)
        self._start = None
        self._last, self._options = None, None

    def plan_for(self, obs: Observation) -> Plan:
        """The Oracle's plan for the loads ahead, planned from the episode's first allocation (so
        that one plan per load vector serves every interval: the moves change the allocation); the
        window verdict's plan where no allocation keeps every interval within target, or (with
        `interval_counts: poisson`) where the window verdict does not admit the intervals plan, and
        one meets the window (module docstring)."""
        return self._plan(obs)[0]

    def _plan(self, obs: Observation) -> tuple[Plan, str | None]:
        """`plan_for`'s plan, and, when it is the window verdict's, why (a note for the reason)."""
        if self._start is None:
            self._start = obs.allocation
        plan = self.oracle.plan_from(obs, self._start)
        if self.fallback is None:
            return plan, None
        if not plan.viable:
            why = "no allocation keeps every interval within target"
        elif self.oracle.cfg.interval_counts == "mean" or self.fallback.admits(
            obs, self._start, plan.allocation
        ):
            return plan, None
        else:
            why = "the window verdict does not admit the intervals plan"
        window = self.fallback.plan_from(obs, self._start)
        if not window.viable:
            return plan, None
        return window, f"the window verdict's plan: {why}"

    def _decide(self, obs: Observation) -> Decision:
        plan, fallback_note = self._plan(obs)
        caps = self.caps
        assert caps is not None
        self._last, self._options = (obs, plan.allocation), None
        if self.cfg.per_app:
            return self._decide_per_app(obs, plan.allocation, fallback_note)
        step = move_toward(obs, caps, plan.allocation, self.cfg)
        if step is None:
            return self._at_plan(obs)
        app, move = step
        planned = plan_move(obs, caps, app, move)
        assert planned.allocation is not None  # move_toward returns feasible moves only
        alloc, notes = adjust_network(obs, planned.allocation, caps)
        if fallback_note:
            notes = [fallback_note, *notes]
        return Decision(
            alloc,
            reason=f"oracle-guided: {move} for {app} toward the Oracle's plan (PARTIES Sec. 5.2.3)"
            + (f"; {', '.join(notes)}" if notes else ""),
            move=move,
            app=app,
        )

    def _at_plan(self, obs: Observation) -> Decision:
        """No move to make: a HOLD, with the network partition following the apps' use."""
        assert self.caps is not None
        alloc, notes = adjust_network(obs, obs.allocation, self.caps)  # outside the moves (PARTIES Alg. 1)
        reason = "oracle-guided: at the Oracle's plan (or no move leads there)"
        if alloc == obs.allocation:
            return Decision.hold(reason)
        return Decision(alloc, reason=f"{reason}; {', '.join(notes)}", move=Move.HOLD)

    def _decide_per_app(self, obs: Observation, target: Allocation, fallback_note: str | None) -> Decision:
        caps = self.caps
        assert caps is not None
        applied, alloc = _per_app_plan(obs, caps, target, self.cfg)
        if not applied:
            return self._at_plan(obs)
        moves = _slot_order(caps, applied)
        alloc, notes = adjust_network(obs, alloc, caps)  # outside the moves (PARTIES Alg. 1)
        if fallback_note:
            notes = [fallback_note, *notes]
        said = ", ".join(f"{p.move} for {p.app}" for p in applied)
        return Decision(
            alloc,
            reason=f"oracle-guided: {said} toward the Oracle's plan (PARTIES Sec. 5.2.3)"
            + (f"; {', '.join(notes)}" if notes else ""),
            move=moves[0][1] if len(moves) == 1 else None,
            app=moves[0][0] if len(moves) == 1 else None,
            moves=moves,
        )


def make(
    context: ControllerContext, arg: str | None = None, *, per_app: bool = False
) -> OracleGuidedController:
    """Spec `oracle-guided[:CONFIG]` (needs_sim): the Oracle with `CONFIG` (a name in configs/baselines/
    or a path; default `oracle-guided`: every interval within target, else the window, no lookahead), one move at a
    time; `oracle-guided-per-app[:CONFIG]` (`per_app`): one move per app and interval."""
    from baselines import oracle

    name = "oracle-guided-per-app" if per_app else "oracle-guided"
    if context.scenario is None:
        raise ConfigError(f"{name}: needs the scenario (the Oracle plans with the simulator's model)")
    path = resolve_config("baselines", arg or "oracle-guided")
    controller = OracleGuidedController(
        oracle.OracleController(context.scenario, context.seed, oracle.load_oracle_config(path)),
        GuidedConfig(per_app=per_app),
    )
    controller.name = name
    return controller
