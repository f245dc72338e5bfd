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
  slack when it is > 0.2 (Alg. 1); an app whose slack is not a number (no valid p99) takes no part;
* the resource is chosen by `_next_action` on the trading wheels of Fig. 4 / Sec. 4.2.3: compute
  (CORE -> CACHE -> FREQ, the order of the authors' code too, `manager/PARTIES.py:191-211`) and
  storage (MEM -> DISK); a random state of a random wheel when the direction changes; the next
  state when the last adjustment did not help (Alg. 2) or was reverted (Alg. 3); after a full
  storage turn a random compute state; after a full UP compute turn the memory slack decides
  between another compute round and the storage wheel (Sec. 4.2.3);
* skipped states (Sec. 4.2.3): a move `env.moves.plan_move` finds infeasible (the app, or every
  possible victim, is at its min/max), and <DOWN,MEM> for in-memory apps with < 1 GB memory slack;
  in-memory apps are detected online as in Sec. 4.3 (no disk I/O during the first second);
* victims and recipients from `env.moves.plan_move` (Alg. 4 `find_victim_application`, Sec.
  4.2.4), plus the anti-ping-pong rule of Alg. 4: when the victim of an UP move is an LC app whose
  action equals the upsized app's, the victim's action advances (`PARTIES.py:375-376, 432-433`);
* a reverted downsize bans downsizing that app for 30 s (Sec. 4.2.2, 4.3);
* after 60 s of unmet QoS a migration is requested in `Decision.signals["migrate"]`: a stateless
  app first, else the one with the most relaxed QoS target (Sec. 4.2.1), since a node cannot
  migrate by itself.

Where the paper is silent, the authors' code decides (sc2682cornell/PARTIES, `manager/PARTIES.py`):

1. Judge and act in the same interval. Alg. 1 monitors 500 ms at the top of its loop and Alg. 2/3
   monitor another 500 ms after acting; taken literally every adjustment would cost two intervals.
   The code judges a move over the 500 ms after it and decides at once with the latest sample
   (`PARTIES.py:106-124, 164-176`), so the interval after an adjustment is both the judging window
   of Alg. 2/3 and the next monitoring window of Alg. 1; a revert is that interval's one adjustment.
2. "Latency has not decreased" (Alg. 2 comment, Sec. 4.2.2 "beneficial if latency decreases")
   versus Alg. 2's `latency > previous`: the code counts a sample as beneficial only when
   `Lat < cur` (`PARTIES.py:111`), i.e. advances when latency >= previous, as the text says; so a
   latency pinned at a ceiling (time-outs) makes PARTIES try another resource.
3. A banned app is skipped and the non-banned app with the largest slack is downsized instead
   (`PARTIES.py:171`: only apps with `LDOWN == 0` are candidates); the ban is per app ("downsizing
   of this application is disabled").

Our own choices, in neither the paper nor the code (each kept for the reason given):

4. Random entry picks a wheel uniformly, then a state of that wheel uniformly ("a random state in
   one of the UP wheels", Sec. 4.2.3; the code has one wheel and picks a state uniformly,
   `PARTIES.py:195`): the phrase names a wheel first, so storage gets half the entries, not 2/5.
5. Wheel switches: storage -> a random compute state (stated); UP compute -> storage lands on MEM
   (the switch happens because memory is saturated); DOWN wheels alternate after each full turn at
   a random state: the paper describes only the UP side, and Fig. 4's caption ("transitions between
   wheels ... happen when options for the current wheel have been exhausted") applies to both
   directions. A compute turn in which every state was infeasible also counts as exhausted.
6. "Memory almost saturated" (Sec. 4.2.3) has no number; `memory_saturated_below_gb` (1 GB, the
   paper's memory-slack threshold for in-memory apps and victims, Sec. 4.2.3-4.2.4) is used, so
   one threshold means "little memory slack" throughout.
7. The network partition: bandwidth given to an LC app comes from unallocated link capacity first,
   then from the BE jobs; reclaimed bandwidth goes to the BE jobs (idle when there are none), the
   same rule Sec. 4.2.4 gives for the ten moves. The sum of the limits never exceeds the link.
8. Migration: a node cannot migrate by itself, so the request is advisory; the timer restarts
   after each request, so a request nobody acts on repeats every 60 s while QoS stays unmet (not
   every interval); among several stateless apps the one with the most relaxed target.
9. In-memory apps: PARTIES knows nothing but the QoS targets (Sec. 4.3), so the class comes from its
   own online test (no disk I/O in the first second), not from `AppSpec.in_memory`; a hint of True
   only adds caution (the operator says so), a hint of False does not override the test. (This
   matters: nginx does no disk I/O, PARTIES Table 2, so PARTIES treats it as in-memory even though
   its profile says otherwise.) Until the first second has passed an app counts as in-memory, the
   conservative side of the <DOWN,MEM> skip. The class is fixed after the probe: later I/O (e.g.
   swapping caused by a downsize) does not change it.
10. If a pending adjustment was not applied (a guard changed or rejected it), it is not judged: a
    controller cannot blame latency on a change that never happened.
11. One PARTIES interval every `interval_s` whatever the loop's tick (a node with shorter ticks gets
    decisions every 500 ms, Sec. 4.3); a real clock's ticks jitter by milliseconds around 500 ms
    (0.497-0.499 s seen), so an interval counts as elapsed at 0.9 x `interval_s`: without the
    allowance every other real tick would be skipped.
12. The DISK step is the node's (`Capabilities.disk_step_mbps`): on the PARTIES node 10 MB/s, since
    the paper's 1 GB/s step exceeds its whole HDD (configs/node/parties.yaml).

Where the code departs from the paper, its behaviour is the named variant `parties:code`
(`configs/baselines/parties-code.yaml`, built by `make(ctx, "code")`); the paper stays the default.
`parties:code-stats` takes only the code's statistics (the first four points below) and keeps the
paper's 30 s ban and storage wheel (`configs/baselines/parties-code-stats.yaml`):

* samples: the code reads a p99 every 100 ms (`PARTIES.py:20` INTERVAL = 0.1, `:280-296`); the
  variant reads the node's sub-interval p99s (`AppSample.sub_p99_us`; a node without them gives one
  sample per interval), a sub-interval without a request repeats the last value (`PARTIES.py:290`);
* acting: an app is upsized only when both its latest slack and the slack of its moving-average
  latency over the last 1 s of samples are < 0.05, the one with the smallest average first; an app
  is downsized only when both are > 0.2, the largest latest slack first (`PARTIES.py:78, 293,
  167-172`; the paper: the interval's slack alone);
* judging: by the majority of the first 5 samples after the move (`PARTIES.py:53` TOLERANCE = 5,
  `:108-117`; the paper: the next interval's p99); a downsize is reverted when *any* LC app dips
  below 0.05 slack in the majority (`PARTIES.py:128-141`; the paper: the downsized app);
* after a revert the code waits 5 more samples and, when the majority still violates, 5 more before
  deciding (`PARTIES.py:143-157`): the variant holds the interval after a revert when its samples
  still violate;
* the ban is `REST` = 100 samples of 100 ms = 10 s (`PARTIES.py:22, 226, 268-270`; the paper 30 s);
* compute wheel only (the code manages cores, cache and frequency; its README advises removing the
  memory wheel, `manager/README.md`); the paper's storage wheel stays in the default.

The code decides every 100 ms while nothing is pending (`PARTIES.py:162-163`); here decisions come
once per control interval (the loop's tick), so the variant acts on the interval's last sample and
the 1 s average at its end.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from env.allocations import fair_allocation
from env.config import CONFIGS, ConfigError, build, load_yaml
from env.controller import BaseController, ControllerContext
from env.moves import NetworkRule, PlannedMove, adjust_network, plan_move
from env.types import (
    DOWNSIZE_SLACK_ABOVE,
    UPSIZE_SLACK_BELOW,
    Allocation,
    AllocationError,
    AppSample,
    Decision,
    Direction,
    Move,
    Observation,
    Resource,
    slack,
)

ResourceName = Literal["core", "cache", "freq", "mem", "disk"]
DEFAULT_CONFIG = CONFIGS / "baselines" / "parties.yaml"
VARIANTS = {  # `parties:NAME` (module docstring)
    "code": CONFIGS / "baselines" / "parties-code.yaml",
    "code-stats": CONFIGS / "baselines" / "parties-code-stats.yaml",
}
_EPS = 1e-9
COMPUTE, STORAGE = 0, 1


@dataclass(frozen=True)
class PartiesConfig:
    """PARTIES' constants (Sec. 4.3; ../shared/calibration/parties.yaml `controller`).

    Thresholds are latency slacks, (target - p99) / target. Step sizes of the ten moves come from
    the node's `Capabilities.step` (Sec. 4.2.4 granularity); the network step is the paper's 0.5 Gbps.
    The defaults are the paper's; the last five fields set the statistics of the authors' code
    (`parties:code`, module docstring), and their defaults reduce them to the paper's.
    """

    interval_s: float = 0.5  # Sec. 4.2.1: decisions every 500 ms
    upsize_slack_below: float = UPSIZE_SLACK_BELOW  # Alg. 1
    downsize_slack_above: float = DOWNSIZE_SLACK_ABOVE  # Alg. 1
    revert_slack_below: float = UPSIZE_SLACK_BELOW  # Alg. 3
    downsize_ban_s: float = 30.0  # Sec. 4.2.2
    migration_after_s: float = 60.0  # Alg. 1, Sec. 4.3
    compute_wheel: tuple[ResourceName, ...] = ("core", "cache", "freq")  # Fig. 4
    storage_wheel: tuple[ResourceName, ...] = ("mem", "disk")  # Fig. 4
    memory_saturated_below_gb: float = 1.0  # Sec. 4.2.3 (value: module docstring, choice 6)
    in_memory_mem_down_min_slack_gb: float = 1.0  # Sec. 4.2.3 skipped state
    in_memory_probe_s: float = 1.0  # Sec. 4.3 online classification window
    in_memory_max_disk_mbps: float = 0.0  # Sec. 4.3: "does not involve I/O at all"
    net_increase_below_gbps: float = 0.5  # Sec. 4.2.1
    net_reclaim_above_gbps: float = 1.0  # Sec. 4.2.1
    net_step_gbps: float = 0.5  # Sec. 4.2.1
    fair_start: bool = True  # Alg. 1 initialization()
    # "interval": one p99 per control interval (Alg. 1); "sub_interval": the node's sub-interval p99s
    samples: Literal["interval", "sub_interval"] = "interval"
    moving_average_s: float = 0.0  # > 0: act only when the average over this window agrees
    judge_samples: int = 1  # a move is judged by the majority of this many samples after it
    revert_scope: Literal["app", "any"] = "app"  # whose slack under 0.05 reverts a downsize
    settle_after_revert: bool = False  # hold the interval after a revert while samples still violate

    def __post_init__(self) -> None:
        wheels = list(self.compute_wheel) + list(self.storage_wheel)
        known = [r.value for r in Resource]
        if not self.compute_wheel or len(set(wheels)) != len(wheels) or not set(wheels) <= set(known):
            raise ConfigError(
                f"parties: compute_wheel (not empty) and storage_wheel (may be empty, as in the authors' "
                f"code) must hold distinct resources of {known}, got {wheels}"
            )
        if self.interval_s <= 0:
            raise ConfigError("parties.interval_s must be > 0")
        if not self.upsize_slack_below < self.downsize_slack_above:
            raise ConfigError("parties: upsize_slack_below must be < downsize_slack_above")
        for name in (
            "downsize_ban_s",
            "migration_after_s",
            "in_memory_probe_s",
            "net_step_gbps",
            "moving_average_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"parties.{name} must be >= 0")
        if self.judge_samples < 1:
            raise ConfigError("parties.judge_samples must be >= 1")
        if self.net_increase_below_gbps > self.net_reclaim_above_gbps:
            raise ConfigError("parties: net_increase_below_gbps must be <= net_reclaim_above_gbps")

    @property
    def wheels(self) -> tuple[tuple[Resource, ...], ...]:
        """The non-empty trading wheels, compute first (Fig. 4)."""
        return tuple(tuple(Resource(r) for r in w) for w in (self.compute_wheel, self.storage_wheel) if w)


def load_parties_config(path: str | Path | None = None) -> PartiesConfig:
    """`configs/baselines/parties.yaml`, a named variant (`VARIANTS`: "code") or the YAML file
    `path` as a `PartiesConfig`; unknown keys are errors."""
    p = DEFAULT_CONFIG if path is None else VARIANTS.get(str(path), Path(path))
    data = load_yaml(p)
    return build(PartiesConfig, {} if data is None else data, where=p.name)


@dataclass
class _AppState:
    """What PARTIES remembers per LC app (Sec. 4.2.3: "remembers the most recent action")."""

    action: Move | None = None  # action[A] of Alg. 2-4
    turn: int = 0  # states of the current wheel visited since entering it (Sec. 4.2.3 "a turn")
    ban_until_s: float = -math.inf  # downsizing disabled until then (Sec. 4.2.2)
    in_memory: bool | None = None  # Sec. 4.3 classification (None: not known yet)
    last_p99_us: float = math.nan  # the last sample's p99 (PARTIES.py:291: Lat[i] holds it)
    recent_p99_us: deque[float] = field(default_factory=deque)  # samples averaged (PARTIES.py:78 MLat)


@dataclass(frozen=True)
class _Samples:
    """One interval of an LC app as the rules read it: its p99 samples in order (one per interval,
    or one per sub-interval), the latest sample's slack and the slack of the moving average."""

    p99_us: tuple[float, ...]
    target_us: float
    avg_slack: float

    @property
    def slack(self) -> float:
        return slack(self.target_us, self.p99_us[-1])


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
        self._samples: dict[str, _Samples] = {}
        self._settle = False
        if caps is not None:
            for a in caps.lc_apps:
                self._state[a.name] = _AppState(in_memory=True if a.in_memory else None)  # choice 9
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
        self._samples = self._read_samples(obs)

        # Alg. 1 initialization(): start from the fair allocation (Sec. 4.2.1).
        if not self._started:
            self._started = True
            if self.cfg.fair_start:
                fair = fair_allocation(caps)
                if obs.allocation != fair:
                    self._last_t = t
                    return Decision(fair, reason="fair start (PARTIES Alg. 1 initialization)")

        # One PARTIES interval every `interval_s` (Sec. 4.2.1), whatever the loop's tick is; a real
        # clock's ticks jitter by milliseconds around it (0.497-0.499 s seen), so allow 10% (choice 11).
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
        elif self._settling(tick):
            pass
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
        """Alg. 1: upsize the smallest slack below 0.05, else downsize the largest above 0.2. An app
        without a valid slack (NaN) is left out, so it can neither win nor hide a violation. With a
        moving average (`parties:code`) both slacks must agree and the smallest average is upsized
        first (PARTIES.py:167-172)."""
        cfg = self.cfg
        samples = {n: x for n, x in self._samples.items() if math.isfinite(x.slack)}
        if not samples:
            return None
        low = {
            n: x.avg_slack for n, x in samples.items() if max(x.slack, x.avg_slack) < cfg.upsize_slack_below
        }
        if low:
            return self._upsize(min(low, key=lambda n: low[n]), obs, alloc, tick)
        # Choice 3: the ban is per app, so the largest-slack app that may be downsized is chosen.
        allowed = {n: x for n, x in samples.items() if obs.time_s >= self._state[n].ban_until_s - 1e-9}
        if not allowed:
            tick.notes.append("parties: every app with slack is banned from downsizing")
            return None
        high = {
            n: x.slack for n, x in allowed.items() if min(x.slack, x.avg_slack) > cfg.downsize_slack_above
        }
        if high:
            return self._downsize(max(high, key=lambda n: high[n]), obs, alloc, tick)
        return None

    def _upsize(self, app: str, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 2 first half: pick an UP action (next_action on a direction change) and take it."""
        st = self._state[app]
        if st.action is None or st.action.direction is not Direction.UP:
            st.action = self._next_action(app, Direction.UP, obs, alloc)
        planned = self._select(app, Direction.UP, obs, alloc)
        if planned is None:
            tick.notes.append(
                f"parties: {app} slack {self._samples[app].slack:.3f} < 0.05 but no UP move is feasible"
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
            f"upsize {app} (slack {self._samples[app].slack:.3f} < {self.cfg.upsize_slack_below}): {planned.move}"
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
            f"downsize {app} (slack {self._samples[app].slack:.3f} > {self.cfg.downsize_slack_above}): {planned.move}"
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
            latency_before_us=self._samples[planned.app].p99_us[-1],
            amount_after=planned.allocation[planned.app].amount(res),
        )

    def _judge(self, obs: Observation, alloc: Allocation, tick: _Tick) -> PlannedMove | None:
        """Alg. 2/3 second half, on the interval after the adjustment. Returns a revert, if any."""
        p, self._pending = self._pending, None
        if p is None or p.app not in obs.allocation:
            return None
        res = p.move.resource
        assert res is not None
        if abs(obs.allocation[p.app].amount(res) - p.amount_after) > 1e-6 or p.app not in self._samples:
            return None  # choice 10: the adjustment never took effect; nothing to judge
        st = self._state[p.app]
        if p.move.direction is Direction.UP:
            # Alg. 2: "latency has not decreased" -> adjust another resource next time (choice 2):
            # a sample counts for the move when latency < before (PARTIES.py:108-117).
            lat = self._judged(p.app)
            votes = sum(1 if x < p.latency_before_us else -1 for x in lat)
            if lat and votes <= 0:
                st.action = self._next_action(p.app, Direction.UP, obs, alloc)
                tick.notes.append(
                    f"{p.app}: {p.move} did not lower p99 ({p.latency_before_us:.0f} -> {lat[-1]:.0f} us"
                    f"{self._of(len(lat), votes)}), next {st.action} (Alg. 2)"
                )
            return None
        # Alg. 3: QoS about to be violated after a downsize -> revert, next resource, 30 s ban.
        votes, n = self._qos_votes(p.app if self.cfg.revert_scope == "app" else None)
        if n == 0 or votes > 0:
            return None
        revert = self._revert(p, obs, alloc)
        st.ban_until_s = obs.time_s + self.cfg.downsize_ban_s
        st.action = self._next_action(p.app, Direction.DOWN, obs, alloc)
        self._settle = self.cfg.settle_after_revert
        who = f"{p.app}'s slack" if self.cfg.revert_scope == "app" else "an LC app's slack"
        tick.notes.insert(
            0,
            f"revert {p.app}'s {p.move}: {who} < {self.cfg.revert_slack_below}"
            f" ({self._samples[p.app].slack:.3f}{self._of(n, votes)});"
            f" no downsizing for {self.cfg.downsize_ban_s:.0f} s (Alg. 3, Sec. 4.2.2)",
        )
        return revert

    def _settling(self, tick: _Tick) -> bool:
        """`parties:code`: after a revert, hold while the majority of samples still has an LC app
        under 0.05 slack (PARTIES.py:143-157); the next interval decides either way."""
        if not self._settle:
            return False
        self._settle = False
        votes, n = self._qos_votes(None)
        if n == 0 or votes > 0:
            return False
        tick.notes.append(
            "parties: an LC app still under 0.05 slack after the revert, settling (PARTIES.py:143-157)"
        )
        return True

    def _judged(self, app: str) -> tuple[float, ...]:
        """The finite p99 samples a move of `app` is judged on: the first `judge_samples` of the
        interval after it (PARTIES.py:109 TOLERANCE)."""
        return tuple(x for x in self._samples[app].p99_us[: self.cfg.judge_samples] if math.isfinite(x))

    def _qos_votes(self, app: str | None) -> tuple[int, int]:
        """(votes, samples) over the judged samples: +1 for a sample in which `app` (None: every LC
        app, PARTIES.py:131-138) has slack >= 0.05, -1 otherwise. An app with fewer samples counts
        its last one for the rest; an app without any takes no part."""
        names = [app] if app is not None else list(self._samples)
        judged = {a: lat for a in names if a in self._samples and (lat := self._judged(a))}
        n = max((len(lat) for lat in judged.values()), default=0)
        votes = 0
        for k in range(n):
            ok = all(
                slack(self._samples[a].target_us, lat[min(k, len(lat) - 1)]) >= self.cfg.revert_slack_below
                for a, lat in judged.items()
            )
            votes += 1 if ok else -1
        return votes, n

    @staticmethod
    def _of(n: int, votes: int) -> str:
        """ "; K of N samples against" for a reason, when more than one sample was judged."""
        return f"; {(n - votes) // 2} of {n} samples against" if n > 1 else ""

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
        managed = {r for w in self._wheels for r in w}
        for _ in range(4 * len(managed)):
            move = st.action
            assert move is not None and move.direction is direction
            if not self._skip_in_memory(app, move, obs, alloc):
                planned = plan_move(obs, caps, app, move, alloc)
                if planned.feasible:
                    return planned
            res = move.resource
            assert res is not None
            exhausted.add(res)
            if exhausted >= managed:
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
        """next_action(action[A], direction) of Fig. 4 / Sec. 4.2.3 (choices 4-6 of the docstring).
        With the compute wheel alone (`parties:code`) the turns simply go on (PARTIES.py:191-211)."""
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
        if st.turn < len(wheel) or len(self._wheels) == 1:
            st.turn = st.turn + 1 if st.turn < len(wheel) else 1
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

    # ---- samples ------------------------------------------------------------------------------------
    def _read_samples(self, obs: Observation) -> dict[str, _Samples]:
        """Each LC app's samples of this interval (`PartiesConfig.samples`), and the moving average."""
        return {s.name: self._app_samples(s, obs.interval_s) for s in obs.apps if s.name in self._state}

    def _app_samples(self, s: AppSample, interval_s: float) -> _Samples:
        """The paper: the interval's p99. `parties:code`: the sub-interval p99s (the interval's p99
        where the node reports none), a sample without a value repeating the last one (PARTIES.py:
        290-295), and the average of the last `moving_average_s` of valid samples (PARTIES.py:78,
        293: MLat keeps the last 10 readings of 100 ms)."""
        cfg, st = self.cfg, self._state[s.name]
        if cfg.samples == "interval":
            return _Samples((s.p99_us,), s.target_us, s.slack)
        raw = s.sub_p99_us or (s.p99_us,)
        filled = []
        for x in raw:
            if math.isfinite(x):
                st.last_p99_us = x
                st.recent_p99_us.append(x)
            elif not math.isfinite(st.last_p99_us) and math.isfinite(s.p99_us):
                st.last_p99_us = s.p99_us  # nothing read yet: the interval's p99
            filled.append(st.last_p99_us)
        keep = max(1, round(cfg.moving_average_s * len(raw) / interval_s))
        while len(st.recent_p99_us) > keep:
            st.recent_p99_us.popleft()
        p99s = tuple(filled)
        if cfg.moving_average_s > 0 and st.recent_p99_us:
            avg = slack(s.target_us, sum(st.recent_p99_us) / len(st.recent_p99_us))
        else:
            avg = slack(s.target_us, p99s[-1])
        return _Samples(p99s, s.target_us, avg)

    # ---- in-memory apps (Sec. 4.2.3 skipped state, Sec. 4.3 detection) ----------------------------
    def _classify_in_memory(self, obs: Observation) -> None:
        """Sec. 4.3: an app with no disk I/O during its first second is in-memory (choice 9)."""
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
        """<DOWN,MEM> is skipped for in-memory apps with < 1 GB memory slack (Sec. 4.2.3; choice 9)."""
        if move is not Move.DOWN_MEM or self._state[app].in_memory is False:
            return False
        mem_slack = alloc[app].memory_gb - obs.app(app).usage.memory_gb
        return mem_slack < self.cfg.in_memory_mem_down_min_slack_gb

    # ---- Sec. 4.2.1: network bandwidth, every interval ---------------------------------------------
    def _adjust_network(self, obs: Observation, alloc: Allocation, tick: _Tick) -> Allocation:
        """adjust_network_bandwidth_partition() (Alg. 1): `env.moves.adjust_network` with this
        config's thresholds (choice 7)."""
        assert self.caps is not None
        cfg = self.cfg
        rule = NetworkRule(cfg.net_increase_below_gbps, cfg.net_reclaim_above_gbps, cfg.net_step_gbps)
        out, notes = adjust_network(obs, alloc, self.caps, rule)
        tick.notes.extend(notes)
        return out

    # ---- Alg. 1 / Sec. 4.2.1: migration -------------------------------------------------------------
    def _migration(self, obs: Observation) -> dict[str, str]:
        """A timer of unmet QoS, reset when every app meets its target; after 60 s a migration is
        requested for a stateless app, else the one with the most relaxed QoS target (choice 8)."""
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


def make(context: ControllerContext, arg: str | None = None) -> PartiesController:
    """Registry factory (`harness.registry`): spec `parties` (the paper), `parties:code` (the
    authors' code), `parties:code-stats` (the code's statistics, the paper's ban and wheels; module
    docstring) or `parties:PATH` (another YAML file of `PartiesConfig` keys).
    PARTIES needs no offline knowledge (Sec. 4.3)."""
    return PartiesController(arg or None)
