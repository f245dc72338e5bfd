"""PARTIES (Chen, Delimitrou, Martinez, ASPLOS'19; ../shared/seeds/000_*.txt, Sec. 4) as a tick function.

The paper's controller is a loop that sleeps 500 ms between measurements (Alg. 1) and, inside
`upsize`/`downsize` (Alg. 2/3), acts, sleeps another 500 ms and judges the action. Here each
`decide()` call is one 500 ms interval; the measure-then-act structure is explicit state: an
adjustment made in one interval is recorded in `_pending` and judged on the next interval's
observation (Alg. 2: did latency decrease? Alg. 3: is slack still >= 0.05, else revert), after which
the same observation drives the main loop's next choice (Alg. 1). At most one of the ten moves is
made per interval (Sec. 5.2.2: "only one resource is adjusted in each interval"); the network
partition is adjusted every interval outside the moves (Alg. 1, Sec. 4.2.1).

Rules and where they come from:

* fair start (Alg. 1 `initialization()`, Sec. 4.2.1): the first decision returns
  `env.allocations.fair_allocation` when the node is not already in it;
* upsize the app with the smallest slack when it is < 0.05, else downsize the one with the largest
  slack when it is > 0.2 (Alg. 1);
* the resource is chosen by `_next_action` on the trading wheels of Fig. 4 / Sec. 4.2.3: compute
  (CORE -> CACHE -> FREQ) and storage (MEM -> DISK); a random state of a random wheel when the
  direction changes; the next state when the last adjustment did not help (Alg. 2) or was reverted
  (Alg. 3); after a full storage turn a random compute state; after a full UP compute turn the
  memory slack decides between another compute round and the storage wheel (Sec. 4.2.3);
* skipped states (Sec. 4.2.3): a move `env.moves.plan_move` finds infeasible (the app, or every
  possible victim, is at its min/max), and <DOWN,MEM> for in-memory apps with < 1 GB memory slack;
  in-memory apps are detected online as in Sec. 4.3 (no disk I/O during the first second);
* victims and recipients from `env.moves.plan_move` (Alg. 4 `find_victim_application`, Sec.
  4.2.4), plus the anti-ping-pong rule of Alg. 4: when the victim of an UP move is an LC app whose
  action equals the upsized app's, the victim's action advances;
* a reverted downsize bans downsizing that app for 30 s (Sec. 4.2.2, 4.3);
* after 60 s of unmet QoS a migration is requested in `Decision.signals["migrate"]`: a stateless
  app first, else the one with the most relaxed QoS target (Sec. 4.2.1), since a node cannot
  migrate by itself.

Choices where the paper is ambiguous (each also noted at the code):

1. Judge and act in the same interval. Alg. 1 monitors 500 ms at the top of its loop and Alg. 2/3
   monitor another 500 ms after acting; taken literally every adjustment would cost two intervals.
   The interval after an adjustment is both the judging window of Alg. 2/3 and the next monitoring
   window of Alg. 1, which keeps the paper's "sub-second" decisions (Sec. 4.2.3: the right resource
   is found "within the next four decision intervals"). A revert is that interval's one adjustment.
2. "Latency has not decreased" (Alg. 2 comment, Sec. 4.2.2 "beneficial if latency decreases")
   versus the code's `latency > previous`: we follow the text (advance when latency >= previous),
   otherwise a latency pinned at a ceiling (time-outs) would never make PARTIES try another resource.
3. Random entry picks a wheel uniformly, then a state of that wheel uniformly ("a random state in
   one of the UP wheels", Sec. 4.2.3). Wheel switches: storage -> a random compute state (stated);
   UP compute -> storage lands on MEM (the switch happens because memory is saturated); DOWN wheels
   alternate after each full turn at a random state (the paper describes only the UP side;
   "transitions between wheels ... happen when options for the current wheel have been exhausted").
   A compute turn in which every state was infeasible also counts as exhausted.
4. "Memory almost saturated" (Sec. 4.2.3) has no number; `memory_saturated_below_gb` (1 GB, the
   paper's memory-slack threshold elsewhere) is used.
5. A banned app is skipped and the non-banned app with the largest slack is downsized instead, since
   the ban is per app ("downsizing of this application is disabled").
6. The network partition: bandwidth given to an LC app comes from unallocated link capacity first,
   then from the BE jobs; reclaimed bandwidth goes to the BE jobs (idle when there are none), the
   same rule Sec. 4.2.4 gives for the ten moves. The sum of the limits never exceeds the link.
7. Migration: the timer restarts after each request, so an unanswered request repeats every 60 s;
   among several stateless apps the one with the most relaxed target is chosen.
8. In-memory apps: PARTIES knows nothing but the QoS targets (Sec. 4.3), so the class comes from its
   own online test (no disk I/O in the first second), not from `AppSpec.in_memory`; a hint of True
   only adds caution (the operator says so), a hint of False does not override the test. (This
   matters: nginx does no disk I/O, PARTIES Table 2, so PARTIES treats it as in-memory even though
   its profile says otherwise.) Until the first second has passed an app counts as in-memory, the
   conservative side of the <DOWN,MEM> skip. The class is fixed after the probe: later I/O (e.g.
   swapping caused by a downsize) does not change it.
9. If a pending adjustment was not applied (a guard changed or rejected it), it is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from env.allocations import fair_allocation
from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController, ControllerContext
from env.moves import PlannedMove, plan_move
from env.types import (
    Allocation,
    AllocationError,
    Decision,
    Direction,
    Move,
    Observation,
    Resource,
)

ResourceName = Literal["core", "cache", "freq", "mem", "disk"]
DEFAULT_CONFIG = CONFIGS / "baselines" / "parties.yaml"
_EPS = 1e-9
COMPUTE, STORAGE = 0, 1


@dataclass(frozen=True)
class PartiesConfig:
    """PARTIES' constants (Sec. 4.3; ../shared/calibration/parties.yaml `controller`).

    Thresholds are latency slacks, (target - p99) / target. Step sizes of the ten moves come from
    the node's `Capabilities.step` (Sec. 4.2.4 granularity); the network step is the paper's 0.5 Gbps.
    """

    interval_s: float = 0.5  # Sec. 4.2.1: decisions every 500 ms
    upsize_slack_below: float = 0.05  # Alg. 1
    downsize_slack_above: float = 0.20  # Alg. 1
    revert_slack_below: float = 0.05  # Alg. 3
    downsize_ban_s: float = 30.0  # Sec. 4.2.2
    migration_after_s: float = 60.0  # Alg. 1, Sec. 4.3
    compute_wheel: tuple[ResourceName, ...] = ("core", "cache", "freq")  # Fig. 4
    storage_wheel: tuple[ResourceName, ...] = ("mem", "disk")  # Fig. 4
    memory_saturated_below_gb: float = 1.0  # Sec. 4.2.3 (value: module docstring, choice 4)
    in_memory_mem_down_min_slack_gb: float = 1.0  # Sec. 4.2.3 skipped state
    in_memory_probe_s: float = 1.0  # Sec. 4.3 online classification window
    in_memory_max_disk_mbps: float = 0.0  # Sec. 4.3: "does not involve I/O at all"
    net_increase_below_gbps: float = 0.5  # Sec. 4.2.1
    net_reclaim_above_gbps: float = 1.0  # Sec. 4.2.1
    net_step_gbps: float = 0.5  # Sec. 4.2.1
    fair_start: bool = True  # Alg. 1 initialization()

    def __post_init__(self) -> None:
        wheels = list(self.compute_wheel) + list(self.storage_wheel)
        if sorted(wheels) != sorted(r.value for r in Resource):
            raise ConfigError(
                f"parties: compute_wheel + storage_wheel must hold each of {[r.value for r in Resource]} "
                f"exactly once, got {wheels}"
            )
        if self.interval_s <= 0:
            raise ConfigError("parties.interval_s must be > 0")
        if not self.upsize_slack_below < self.downsize_slack_above:
            raise ConfigError("parties: upsize_slack_below must be < downsize_slack_above")
        for name in ("downsize_ban_s", "migration_after_s", "in_memory_probe_s", "net_step_gbps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"parties.{name} must be >= 0")
        if self.net_increase_below_gbps > self.net_reclaim_above_gbps:
            raise ConfigError("parties: net_increase_below_gbps must be <= net_reclaim_above_gbps")

    @property
    def wheels(self) -> tuple[tuple[Resource, ...], tuple[Resource, ...]]:
        return (
            tuple(Resource(r) for r in self.compute_wheel),
            tuple(Resource(r) for r in self.storage_wheel),
        )


def load_parties_config(path: str | Path | None = None) -> PartiesConfig:
    """`configs/baselines/parties.yaml` (or `path`) as a `PartiesConfig`; unknown keys are errors."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    data = load_yaml(p)
    return build(PartiesConfig, {} if data is None else data, where=p.name)


@dataclass
class _AppState:
    """What PARTIES remembers per LC app (Sec. 4.2.3: "remembers the most recent action")."""

    action: Move | None = None  # action[A] of Alg. 2-4
    turn: int = 0  # states of the current wheel visited since entering it (Sec. 4.2.3 "a turn")
    ban_until_s: float = -math.inf  # downsizing disabled until then (Sec. 4.2.2)
    in_memory: bool | None = None  # Sec. 4.3 classification (None: not known yet)


@dataclass(frozen=True)
class _Pending:
    """An adjustment taken in one interval, judged in the next (Alg. 2 / Alg. 3)."""

    app: str
    move: Move
    counterpart: str | None
    latency_before_us: float
    amount_after: float  # the app's amount of the moved resource once applied


@dataclass
class _Tick:
    """Scratch of one decision: what was done, for the Decision's reason."""

    notes: list[str] = field(default_factory=list)


class PartiesController(BaseController):
    """PARTIES' controller (Sec. 4, Alg. 1-4); see the module docstring for the rules and choices."""

    name = "parties"

    def __init__(self, config: PartiesConfig | str | Path | None = None) -> None:
        super().__init__()
        if config is None or isinstance(config, str | Path):
            config = load_parties_config(config)
        self.cfg: PartiesConfig = config
        self._wheels = config.wheels
        self._reset()

    # ---- episode state -------------------------------------------------------------------------
    def _reset(self) -> None:
        caps = self.caps
        self._state: dict[str, _AppState] = {}
        if caps is not None:
            for a in caps.lc_apps:
                self._state[a.name] = _AppState(in_memory=True if a.in_memory else None)  # choice 8
        self._lc_names = frozenset(self._state)
        self._be_names = tuple(a.name for a in caps.be_apps) if caps is not None else ()
        self._t0: float | None = None
        self._last_t: float | None = None
        self._started = False
        self._pending: _Pending | None = None
        self._violating_since: float | None = None

    # ---- one tick --------------------------------------------------------------------------------
    def _decide(self, obs: Observation) -> Decision:
        caps = self.caps
        assert caps is not None
        t = obs.time_s
        if self._t0 is None:
            self._t0 = t - obs.interval_s  # the first interval started then
        self._classify_in_memory(obs)

        # Alg. 1 initialization(): start from the fair allocation (Sec. 4.2.1).
        if not self._started:
            self._started = True
            if self.cfg.fair_start:
                fair = fair_allocation(caps)
                if obs.allocation != fair:
                    self._last_t = t
                    return Decision(fair, reason="fair start (PARTIES Alg. 1 initialization)")

        # One PARTIES interval every `interval_s` (Sec. 4.2.1), whatever the loop's tick is; a real
        # clock's ticks jitter by milliseconds around it (0.497-0.499 s seen), so allow 10%.
        if self._last_t is not None and t - self._last_t < 0.9 * self.cfg.interval_s:
            return Decision.hold("parties: between 500 ms intervals")
        self._last_t = t

        signals = self._migration(obs)
        tick = _Tick()
        # Alg. 1: adjust_network_bandwidth_partition() every interval, outside the ten moves.
        alloc = self._adjust_network(obs, obs.allocation, tick)

        move, app = Move.HOLD, None
        # Alg. 2 / Alg. 3 second half: judge last interval's adjustment on this interval.
        reverted = self._judge(obs, alloc, tick)
        if reverted is not None:
            assert reverted.allocation is not None
            alloc, move, app = reverted.allocation, reverted.move, reverted.app
        else:
            planned = self._main(obs, alloc, tick)
            if planned is not None:
                assert planned.allocation is not None
                alloc, move, app = planned.allocation, planned.move, planned.app

        reason = "; ".join(tick.notes) or "parties: all apps within [0.05, 0.2] slack, hold"
        if alloc == obs.allocation:
            return Decision(None, reason=reason, move=Move.HOLD, signals=signals)
        return Decision(alloc, reason=reason, move=move, app=app, signals=signals)

    # ---- Alg. 1 main function -------------------------------------------------------------------
    def _main(self, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 1: upsize the smallest slack below 0.05, else downsize the largest above 0.2."""
        slacks = {s.name: s.slack for s in obs.apps if s.name in self._lc_names}
        if not slacks:
            return None
        s_app = min(slacks, key=lambda n: slacks[n])
        if slacks[s_app] < self.cfg.upsize_slack_below:
            return self._upsize(s_app, obs, alloc, tick)
        # Choice 5: the ban is per app, so the largest-slack app that may be downsized is chosen.
        allowed = {n: v for n, v in slacks.items() if obs.time_s >= self._state[n].ban_until_s - 1e-9}
        if not allowed:
            tick.notes.append("parties: every app with slack is banned from downsizing")
            return None
        l_app = max(allowed, key=lambda n: allowed[n])
        if allowed[l_app] > self.cfg.downsize_slack_above:
            return self._downsize(l_app, obs, alloc, tick)
        return None

    def _upsize(self, app: str, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 2 first half: pick an UP action (next_action on a direction change) and take it."""
        st = self._state[app]
        if st.action is None or st.action.direction is not Direction.UP:
            st.action = self._next_action(app, Direction.UP, obs, alloc)
        planned = self._select(app, Direction.UP, obs, alloc)
        if planned is None:
            tick.notes.append(
                f"parties: {app} slack {obs.app(app).slack:.3f} < 0.05 but no UP move is feasible"
            )
            return None
        self._take(planned, obs)
        # Alg. 4: avoid ping-ponging a resource between two LC apps.
        victim = planned.counterpart
        if victim in self._lc_names and self._state[victim].action == planned.move:
            assert planned.allocation is not None  # _select() returns feasible moves only
            self._state[victim].action = self._next_action(victim, Direction.UP, obs, planned.allocation)
            tick.notes.append(f"victim {victim}'s action advanced to {self._state[victim].action} (Alg. 4)")
        tick.notes.insert(
            0,
            f"upsize {app} (slack {obs.app(app).slack:.3f} < {self.cfg.upsize_slack_below}): {planned.move}"
            f" from {planned.counterpart or 'idle'} (Alg. 1-2, 4)",
        )
        return planned

    def _downsize(self, app: str, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 3 first half: pick a DOWN action (next_action on a direction change) and take it."""
        st = self._state[app]
        if st.action is None or st.action.direction is not Direction.DOWN:
            st.action = self._next_action(app, Direction.DOWN, obs, alloc)
        planned = self._select(app, Direction.DOWN, obs, alloc)
        if planned is None:
            tick.notes.append(f"parties: {app} has slack to give but no DOWN move is feasible")
            return None
        self._take(planned, obs)
        tick.notes.insert(
            0,
            f"downsize {app} (slack {obs.app(app).slack:.3f} > {self.cfg.downsize_slack_above}): {planned.move}"
            f" to {planned.counterpart or 'idle'} (Alg. 1, 3)",
        )
        return planned

    def _take(self, planned: PlannedMove, obs: Observation) -> None:
        """Alg. 4 take_action: record the adjustment so that the next interval judges it."""
        res = planned.move.resource
        assert res is not None and planned.allocation is not None
        self._pending = _Pending(
            app=planned.app,
            move=planned.move,
            counterpart=planned.counterpart,
            latency_before_us=obs.app(planned.app).p99_us,
            amount_after=planned.allocation[planned.app].amount(res),
        )

    def _judge(self, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 2/3 second half, on the interval after the adjustment. Returns a revert, if any."""
        p, self._pending = self._pending, None
        if p is None or p.app not in obs.allocation:
            return None
        res = p.move.resource
        assert res is not None
        if abs(obs.allocation[p.app].amount(res) - p.amount_after) > 1e-6:
            return None  # choice 9: the adjustment never took effect; nothing to judge
        st = self._state[p.app]
        sample = obs.app(p.app)
        if p.move.direction is Direction.UP:
            # Alg. 2: "latency has not decreased" -> adjust another resource next time (choice 2).
            if sample.p99_us >= p.latency_before_us:
                st.action = self._next_action(p.app, Direction.UP, obs, alloc)
                tick.notes.append(
                    f"{p.app}: {p.move} did not lower p99 ({p.latency_before_us:.0f} -> {sample.p99_us:.0f} us),"
                    f" next {st.action} (Alg. 2)"
                )
            return None
        # Alg. 3: QoS about to be violated after a downsize -> revert, next resource, 30 s ban.
        if sample.slack >= self.cfg.revert_slack_below:
            return None
        revert = self._revert(p, obs, alloc)
        st.ban_until_s = obs.time_s + self.cfg.downsize_ban_s
        st.action = self._next_action(p.app, Direction.DOWN, obs, alloc)
        tick.notes.insert(
            0,
            f"revert {p.app}'s {p.move}: slack {sample.slack:.3f} < {self.cfg.revert_slack_below};"
            f" no downsizing for {self.cfg.downsize_ban_s:.0f} s (Alg. 3, Sec. 4.2.2)",
        )
        return revert

    def _revert(self, p: _Pending, obs: Observation, alloc: Allocation) -> PlannedMove | None:
        """revert_back(A): take the unit back from whoever received it (or the idle pool)."""
        caps = self.caps
        assert caps is not None
        back = p.move.opposite
        counterpart = None if back.resource is Resource.FREQ else p.counterpart
        if alloc.move_feasible(p.app, back, caps, counterpart):
            try:
                return PlannedMove(
                    p.app, back, alloc.with_move(p.app, back, caps, counterpart), counterpart, ""
                )
            except AllocationError:  # pragma: no cover - move_feasible and with_move agree
                pass
        planned = plan_move(obs, caps, p.app, back, alloc)  # the recipient no longer holds it
        return planned if planned.feasible else None

    # ---- Fig. 4: next_action on the trading wheels ------------------------------------------------
    def _select(
        self, app: str, direction: Direction, obs: Observation, alloc: Allocation
    ) -> PlannedMove | None:
        """Skip states until a feasible one (Sec. 4.2.3 "skipping states"): `next_action` is called
        again while the action is at the min/max of its resource (no feasible `plan_move`) or is the
        in-memory <DOWN,MEM> exception. None when no state of either wheel is feasible."""
        caps = self.caps
        assert caps is not None
        st = self._state[app]
        exhausted: set[Resource] = set()
        for _ in range(4 * len(Resource)):
            move = st.action
            assert move is not None and move.direction is direction
            if not self._skip_in_memory(app, move, obs, alloc):
                planned = plan_move(obs, caps, app, move, alloc)
                if planned.feasible:
                    return planned
            res = move.resource
            assert res is not None
            exhausted.add(res)
            if len(exhausted) == len(Resource):
                return None
            st.action = self._next_action(app, direction, obs, alloc, exhausted)
        return None

    def _next_action(
        self,
        app: str,
        direction: Direction,
        obs: Observation,
        alloc: Allocation,
        exhausted: set[Resource] | frozenset[Resource] = frozenset(),
    ) -> Move:
        """next_action(action[A], direction) of Fig. 4 / Sec. 4.2.3 (choices 3-4 of the docstring)."""
        st = self._state[app]
        cur = st.action
        if cur is None or cur.direction is not direction:
            # Direction change: a random state of a random wheel (Sec. 4.2.3).
            w = int(self.rng.integers(len(self._wheels)))
            return self._enter(st, direction, w, random_state=True)
        assert cur.resource is not None
        w = COMPUTE if cur.resource in self._wheels[COMPUTE] else STORAGE
        wheel = self._wheels[w]
        following = wheel[(wheel.index(cur.resource) + 1) % len(wheel)]
        if st.turn < len(wheel):
            st.turn += 1
            return Move.of(direction, following)
        # A full turn of this wheel is complete.
        if w == STORAGE:
            # "If not, the controller will start adjusting compute resources by randomly selecting a
            # resource in the compute wheel" (Sec. 4.2.3).
            return self._enter(st, direction, COMPUTE, random_state=True)
        if direction is Direction.UP:
            # "Every time the controller completes a turn in the compute wheel, it checks memory
            # utilization before deciding whether to initiate another round or to jump to the storage
            # wheel" (Sec. 4.2.3). A turn of infeasible states exhausts the wheel (Fig. 4 caption).
            mem_slack = alloc[app].memory_gb - obs.app(app).usage.memory_gb
            compute_exhausted = all(r in exhausted for r in wheel)
            if mem_slack >= self.cfg.memory_saturated_below_gb and not compute_exhausted:
                st.turn = 1
                return Move.of(direction, following)
            return self._enter(st, direction, STORAGE, random_state=False)
        return self._enter(st, direction, STORAGE, random_state=True)

    def _enter(self, st: _AppState, direction: Direction, wheel: int, random_state: bool) -> Move:
        states = self._wheels[wheel]
        res = states[int(self.rng.integers(len(states)))] if random_state else states[0]
        st.turn = 1
        return Move.of(direction, res)

    # ---- in-memory apps (Sec. 4.2.3 skipped state, Sec. 4.3 detection) ----------------------------
    def _classify_in_memory(self, obs: Observation) -> None:
        """Sec. 4.3: an app with no disk I/O during its first second is in-memory (choice 8)."""
        assert self._t0 is not None
        for s in obs.apps:
            st = self._state.get(s.name)
            if st is None or st.in_memory is not None:
                continue
            if s.usage.disk_mbps > self.cfg.in_memory_max_disk_mbps:
                st.in_memory = False
            elif st.in_memory is None and obs.time_s - self._t0 >= self.cfg.in_memory_probe_s - 1e-9:
                st.in_memory = True

    def _skip_in_memory(self, app: str, move: Move, obs: Observation, alloc: Allocation) -> bool:
        """<DOWN,MEM> is skipped for in-memory apps with < 1 GB memory slack (Sec. 4.2.3; choice 8)."""
        if move is not Move.DOWN_MEM or self._state[app].in_memory is False:
            return False
        mem_slack = alloc[app].memory_gb - obs.app(app).usage.memory_gb
        return mem_slack < self.cfg.in_memory_mem_down_min_slack_gb

    # ---- Sec. 4.2.1: network bandwidth, every interval ---------------------------------------------
    def _adjust_network(self, obs: Observation, alloc: Allocation, tick: _Tick) -> Allocation:
        """adjust_network_bandwidth_partition(): +0.5 Gbps to an LC app whose bandwidth slack
        (limit - use) is < 0.5 Gbps, 0.5 Gbps reclaimed from one whose slack is > 1 Gbps (choice 6)."""
        caps = self.caps
        assert caps is not None
        cfg = self.cfg
        be = next((b for b in self._be_names if b in alloc), None)
        samples = [s for s in obs.apps if s.name in self._lc_names and s.name in alloc]
        out = alloc
        for s in samples:  # reclaim first, so the bandwidth can serve an increase this interval
            lim = out[s.name].net_gbps
            if lim - s.usage.net_gbps > cfg.net_reclaim_above_gbps:
                give = min(cfg.net_step_gbps, lim)
                out = out.replace_app(s.name, net_gbps=_q(lim - give))
                if be is not None:
                    out = out.replace_app(be, net_gbps=_q(min(out[be].net_gbps + give, caps.net_gbps)))
                tick.notes.append(f"net {s.name} -{give:g} Gbps")
        for s in sorted(samples, key=lambda x: out[x.name].net_gbps - x.usage.net_gbps):
            lim = out[s.name].net_gbps
            if lim - s.usage.net_gbps >= cfg.net_increase_below_gbps:
                continue
            idle = max(caps.net_gbps - sum(a.net_gbps for a in out), 0.0)
            from_idle = min(cfg.net_step_gbps, idle, caps.net_gbps - lim)
            from_be = 0.0
            if be is not None:
                from_be = min(
                    cfg.net_step_gbps - from_idle, out[be].net_gbps, caps.net_gbps - lim - from_idle
                )
            got = from_idle + max(from_be, 0.0)
            if got <= _EPS:
                continue
            out = out.replace_app(s.name, net_gbps=_q(lim + got))
            if be is not None and from_be > 0:
                out = out.replace_app(be, net_gbps=_q(out[be].net_gbps - from_be))
            tick.notes.append(f"net {s.name} +{got:g} Gbps")
        return out

    # ---- Alg. 1 / Sec. 4.2.1: migration -------------------------------------------------------------
    def _migration(self, obs: Observation) -> dict[str, str]:
        """A timer of unmet QoS, reset when every app meets its target; after 60 s a migration is
        requested for a stateless app, else the one with the most relaxed QoS target (choice 7)."""
        if obs.all_qos_met:
            self._violating_since = None
            return {}
        t = obs.time_s
        if self._violating_since is None:
            self._violating_since = t - obs.interval_s  # the violation began with this interval
        if t - self._violating_since < self.cfg.migration_after_s - 1e-6:
            return {}
        self._violating_since = t
        caps = self.caps
        assert caps is not None
        targets = {s.name: s.target_us for s in obs.apps if s.name in self._lc_names}
        stateless = [n for n in targets if caps.app(n).stateless]
        pool = stateless or list(targets)
        return {"migrate": max(pool, key=lambda n: targets[n])}


def _q(x: float) -> float:
    """Round a bandwidth to 1e-6 Gbps so that repeated +-0.5 steps do not drift."""
    return round(x, 6)


def make(context: ControllerContext, arg: str | None = None) -> PartiesController:
    """Registry factory (`harness.registry`): spec `parties` (default config) or `parties:PATH`
    (another YAML file of `PartiesConfig` keys). PARTIES needs no offline knowledge (Sec. 4.3)."""
    return PartiesController(arg or None)
