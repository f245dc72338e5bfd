"""harness.serving: the supervisor's state machines (safe mode, handover, backoff), its node wrappers,
its outputs, and fault injection for every safety case on a SimNode and on a LinuxNode over fake
kernel trees (tests/hw/conftest.py). No test sleeps on a real clock except the stop tests, which
wait on an event that a stop request ends at once."""

from __future__ import annotations

import errno
import json
import math
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from baselines.parties import PartiesController
from baselines.simple import StaticController
from env.allocations import fair_allocation
from env.config import ConfigError
from env.controller import BaseController
from env.guards import GuardChain, GuardsConfig, build_guards
from env.histogram import merge
from env.loop import read_jsonl
from env.node import RealClock
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import (
    Allocation,
    AllocationError,
    AppSample,
    BeSample,
    Decision,
    Observation,
    Usage,
    validate_allocation,
)
from harness.serving import (
    Active,
    ApplyDeferred,
    DryRunNode,
    EventLog,
    FallbackConfig,
    JsonlSink,
    MetricsConfig,
    NodeWrapper,
    ResilientNode,
    RetryConfig,
    SafeModeConfig,
    SafeModeGuard,
    ServeConfig,
    SignalStop,
    StoppableClock,
    StopServing,
    SupervisedController,
    Supervisor,
    TensorBoardSink,
    bench_overhead,
    feed_ok,
    format_status,
    load_serve_config,
    parse_serve_config,
    safe_allocation,
    wants_fallback,
)
from tests import fakes

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("cores", "llc_ways", "freq_mhz", "memory_gb", "disk_mbps", "net_gbps", "mba_pct")
USAGE = Usage(0.5, 1.0, 1.0, 1.0, 0.0, 0.0, 2200.0)


# ---- helpers --------------------------------------------------------------------------------------
def observation(caps, alloc, t, *, p99=None, valid=True, stale_s=0.0, frac=0.5) -> Observation:
    """A synthetic observation: each LC app at `frac` of its target unless `p99` says otherwise."""
    p99 = p99 or {}
    apps = tuple(
        AppSample(
            a.name,
            p99.get(a.name, frac * a.qos_target_us) if valid else math.nan,
            a.qos_target_us,
            100.0,
            0.5,
            100.0,
            0.0,
            50,
            USAGE,
            valid=valid,
        )
        for a in caps.lc_apps
    )
    be = tuple(BeSample(a.name, 0.4, USAGE) for a in caps.be_apps)
    return Observation(t, 0.5, apps, be, alloc, 10.0, 100.0, valid=valid, stale_s=stale_s)


def violating(caps, alloc, t):
    return observation(caps, alloc, t, frac=1.5)


def squeezed(caps) -> Allocation:
    """Fair start with memcached squeezed (cores, ways, memory, frequency given to the BE job)."""
    f = fair_allocation(caps)
    mc, be = f["memcached"], f["be_parties"]
    a = f.replace_app("memcached", cores=1.0, llc_ways=2, memory_gb=mc.memory_gb - 10, freq_mhz=1500)
    return a.replace_app(
        "be_parties",
        cores=be.cores + mc.cores - 1.0,
        llc_ways=be.llc_ways + mc.llc_ways - 2,
        memory_gb=be.memory_gb + 10,
    )


class Fixed(BaseController):
    """Asks for one allocation (or holds) every tick; counts its resets and decisions."""

    name = "fixed"

    def __init__(self, target: Allocation | None = None, raise_after: int | None = None) -> None:
        super().__init__()
        self.target, self.raise_after = target, raise_after
        self.resets = self.calls = 0

    def _reset(self) -> None:
        self.resets += 1

    def _decide(self, obs):
        self.calls += 1
        if self.raise_after is not None and self.calls > self.raise_after:
            raise RuntimeError("policy blew up")
        if self.target is None or obs.allocation == self.target:
            return Decision.hold("fixed: hold")
        return Decision(self.target, reason="fixed: set")


class Starve(BaseController):
    """A bad 'learned' policy: takes a core from every LC app above one step and gives it to BE."""

    name = "starve"

    def _decide(self, obs):
        caps, out = self.caps, obs.allocation
        be = caps.be_apps[0].name
        for lc in caps.lc_apps:
            if out[lc.name].cores > caps.core_step:
                out = out.replace_app(lc.name, cores=out[lc.name].cores - caps.core_step)
                out = out.replace_app(be, cores=out[be].cores + caps.core_step)
        return Decision(out, reason="starve") if out != obs.allocation else Decision.hold("starve: done")


class ScriptNode:
    """A `Node` whose apply() follows a script: "ok", an exception to raise, or ("partial", n) (the
    node swallows n knob errors and keeps the allocation in force, as a LinuxNode does)."""

    def __init__(self, caps, alloc, clock, script=()):
        self.caps, self.alloc, self._clock = caps, alloc, clock
        self.script = list(script)
        self.swallowed = 0
        self.applied: list[Allocation] = []
        self.observe_error: Exception | None = None
        self.closed = 0

    @property
    def clock(self):
        return self._clock

    def capabilities(self):
        return self.caps

    def current_allocation(self):
        return self.alloc

    def reset(self, seed=None, scenario=None):
        return self.observe()

    def close(self):
        self.closed += 1

    def observe(self):
        if self.observe_error is not None:
            raise self.observe_error
        return observation(self.caps, self.alloc, self._clock.now())

    def apply(self, allocation):
        validate_allocation(allocation, self.caps)
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, tuple):
            self.swallowed += step[1]
            return self.alloc
        self.alloc = allocation
        self.applied.append(allocation)
        return allocation


class StaleFeedNode(SimNode):
    """A SimNode whose latency feed goes silent from `silent_from` to `silent_until` (node time):
    as on a LinuxNode, a reading older than `stale_intervals` intervals makes the samples invalid."""

    def __init__(self, *a, silent_from=math.inf, silent_until=math.inf, stale_intervals=2.0, **kw):
        self.silent_from, self.silent_until, self.stale_intervals = silent_from, silent_until, stale_intervals
        self.last_reading_s = 0.0
        super().__init__(*a, **kw)

    def observe(self):
        obs = super().observe()
        t = obs.time_s
        if not (self.silent_from < t <= self.silent_until):
            self.last_reading_s = t
            return obs
        age = t - self.last_reading_s
        if age <= self.stale_intervals * obs.interval_s:
            return obs
        nan = math.nan
        apps = tuple(
            AppSample(s.name, nan, s.target_us, nan, nan, nan, nan, 0, s.usage, valid=False) for s in obs.apps
        )
        return Observation(
            t, obs.interval_s, apps, obs.be, obs.allocation, obs.mem_bw_gbps, obs.power_w, False, age
        )


class FlakyApplyNode(SimNode):
    """A SimNode whose apply() raises OSError (or something else) on chosen calls."""

    def __init__(self, *a, fail_calls=(), exc=None, **kw):
        self.fail_calls, self.exc, self.calls = set(fail_calls), exc, 0
        super().__init__(*a, **kw)

    def apply(self, allocation):
        if getattr(self, "fail_calls", None) is None:  # during SimNode.__init__
            return super().apply(allocation)
        self.calls += 1
        if self.calls in self.fail_calls:
            raise self.exc or OSError(errno.EBUSY, "resctrl busy")
        return super().apply(allocation)


def run_ticks(sup: Supervisor, node, n: int, dt: float = 0.5):
    out = []
    for _ in range(n):
        out.append(sup.tick())
        node.clock.sleep_until(node.clock.now() + dt)
    return out


def two_app_scenario(load: float = 0.7):
    return simple_scenario({"memcached": load, "nginx": load}, duration_s=120, warmup_s=0)


# ---- configuration --------------------------------------------------------------------------------
def test_shipped_serve_configs_load_and_unknown_keys_name_the_field(tmp_path):
    serving = GuardsConfig.serving()
    sim = load_serve_config(ROOT / "configs" / "serve" / "sim.yaml")
    assert sim.guards == serving and sim.fallback.controller == "parties"
    local = load_serve_config(ROOT / "configs" / "serve" / "linux-local.yaml")
    assert local.guards.lc_floor.min_cores == 0.5  # the default 2-core floor is the whole 2-CPU VM
    assert (local.guards.emergency, local.guards.rate_limit, local.guards.cooldown) == (
        serving.emergency,
        serving.rate_limit,
        serving.cooldown,
    )
    assert load_serve_config(ROOT / "configs/serve/sim.yaml").sim.scenario == "mix3-const"
    procs = load_serve_config(ROOT / "configs/serve/linux-local.yaml").linux.processes
    assert procs["memcached"].cmdline.startswith("memcached -u nobody") and procs["be"].pidfile is None
    with pytest.raises(ConfigError, match=r"x.linux.processes.mc: 'memcached' is a process name"):
        parse_serve_config({"linux": {"config": "linux-local", "processes": {"mc": "memcached"}}}, "x")
    with pytest.raises(ConfigError, match="exactly one of pidfile or cmdline"):
        parse_serve_config(
            {"linux": {"config": "x", "processes": {"mc": {"pidfile": "/p", "cmdline": "m"}}}}, "x"
        )
    with pytest.raises(ConfigError, match=r"x\.fallback\.windw_s: unknown key \(did you mean 'window_s'\?\)"):
        parse_serve_config({"fallback": {"windw_s": 3}}, "x")
    with pytest.raises(ConfigError, match=r"x\.safe_mode\.enter_after_ticks: expected an integer"):
        parse_serve_config({"safe_mode": {"enter_after_ticks": "two"}}, "x")
    with pytest.raises(ConfigError, match="min_violation_frac"):
        parse_serve_config({"fallback": {"min_violation_frac": 1.5}}, "x")
    with pytest.raises(ConfigError, match=r"x\.bogus: unknown key"):
        parse_serve_config({"bogus": 1}, "x")


def test_guards_section_keeps_the_serving_defaults_for_keys_not_given():
    cfg = parse_serve_config({"guards": {"emergency": None, "rate_limit": {"max_core_decrease": 2.0}}}, "x")
    assert cfg.guards.emergency is None
    assert cfg.guards.rate_limit.max_core_decrease == 2.0 and cfg.guards.rate_limit.max_llc_way_decrease == 1
    assert cfg.guards.lc_floor == GuardsConfig.serving().lc_floor and cfg.guards.cooldown is not None
    assert parse_serve_config({}, "x").guards == GuardsConfig.serving()


def test_retry_delays_grow_and_are_capped():
    r = RetryConfig(base_s=0.5, factor=2.0, max_s=3.0)
    assert [r.delay_s(k) for k in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_which_specs_get_a_fallback():
    auto = FallbackConfig()
    assert (
        wants_fallback("rl:runs/ppo", auto)
        and wants_fallback("bo", auto)
        and wants_fallback("bo:x.yaml", auto)
    )
    assert not wants_fallback("heracles", auto) and not wants_fallback("parties", auto)
    # a learned policy inside a wrapper keeps its safety net; a wrapped baseline gets none
    assert wants_fallback("be-dvfs:rl:runs/ppo", auto) and wants_fallback("handoff:30:parties+rl:x", auto)
    assert wants_fallback("be-dvfs:handoff:5:bo+static", auto)
    assert not wants_fallback("be-dvfs:parties", auto) and not wants_fallback(
        "handoff:5:parties+static", auto
    )
    always = FallbackConfig(applies_to="always")
    assert wants_fallback("heracles", always) and not wants_fallback("parties", always)  # not itself
    assert not wants_fallback("rl:x", FallbackConfig(applies_to="never"))


# ---- safe mode -------------------------------------------------------------------------------------
def assert_safe(out, current, start, caps):
    validate_allocation(out, caps)
    for a in caps.lc_apps:
        for f in FIELDS:
            assert getattr(out[a.name], f) >= getattr(start[a.name], f), (a.name, f)
    for a in caps.be_apps:
        for f in FIELDS:
            assert getattr(out[a.name], f) <= getattr(current[a.name], f), (a.name, f)


def test_safe_allocation_restores_lc_start_and_freezes_be(parties_caps):
    caps = parties_caps
    start = fair_allocation(caps)
    current = squeezed(caps)
    out = safe_allocation(None, current, start, caps)
    assert_safe(out, current, start, caps)
    assert out["memcached"].cores == start["memcached"].cores and out["memcached"].freq_mhz == 2200
    # a target that grows BE further: BE is held at what it has, LC apps above start keep it
    grow = current.replace_app("xapian", cores=start["xapian"].cores + 1.0)
    grow = grow.replace_app(
        "be_parties", cores=current["be_parties"].cores - 1.0, memory_gb=current["be_parties"].memory_gb + 5
    )
    out = safe_allocation(grow, current, start, caps)
    assert_safe(out, current, start, caps)
    assert out["xapian"].cores == start["xapian"].cores + 1.0
    # BE holds less than the LC apps need: it gives way, down to 0 cores if it must
    tight = start.replace_app("memcached", cores=1.0).replace_app(
        "be_parties", cores=start["be_parties"].cores + start["memcached"].cores - 1.0
    )
    out = safe_allocation(tight, tight, start, caps)
    assert_safe(out, tight, start, caps)
    assert out["be_parties"].cores == start["be_parties"].cores


def test_safe_allocation_of_a_regrouped_target_uses_the_start_grouping(parties_caps):
    from env.allocations import unmanaged_allocation

    caps = parties_caps
    start = fair_allocation(caps)
    shared = unmanaged_allocation(caps)  # every app in one core group and one CLOS
    out = safe_allocation(shared, start, start, caps)
    assert {(a.name, a.core_group, a.clos) for a in out} == {(a.name, a.core_group, a.clos) for a in start}
    assert_safe(out, start, start, caps)


def test_safe_mode_guard_enters_after_invalid_ticks_and_leaves_when_the_feed_is_back(parties_caps):
    caps = parties_caps
    start, current = fair_allocation(caps), squeezed(caps)
    events = EventLog()
    g = SafeModeGuard(SafeModeConfig(enter_after_ticks=2, exit_after_ticks=2), start, events)
    g.reset(caps)
    hold = Decision.hold("x")
    d, note = g.check(hold, observation(caps, current, 1.0), caps)
    assert d is hold and note == "" and not g.active
    d, note = g.check(hold, observation(caps, current, 1.5, valid=False, stale_s=1.2), caps)
    assert not g.active and d.allocation is None  # one invalid tick is not enough here
    d, note = g.check(hold, observation(caps, current, 2.0, valid=False, stale_s=1.7), caps)
    assert g.active and note.startswith("safe mode:")
    assert_safe(d.allocation, current, start, caps)
    (ev,) = events.drain()
    assert ev.kind == "safe_mode_on" and "memcached" in ev.message and "stale for 1.7 s" in ev.message
    # still in safe mode: a controller target that grows BE is held back
    greedy = Decision(
        current.replace_app("be_parties", memory_gb=current["be_parties"].memory_gb + 1), "greedy"
    )
    d, _ = g.check(greedy, observation(caps, current, 2.5, valid=False, stale_s=2.2), caps)
    assert_safe(d.allocation, current, start, caps)
    g.check(hold, observation(caps, start, 3.0), caps)
    assert g.active  # one valid tick: not yet
    d, _ = g.check(greedy, observation(caps, start, 3.5), caps)
    assert not g.active and d is greedy and g.state.entries == 1
    assert [e.kind for e in events.drain()] == ["safe_mode_off"]


def test_feed_ok_needs_valid_fresh_samples(parties_caps):
    a = fair_allocation(parties_caps)
    assert feed_ok(observation(parties_caps, a, 1.0))
    assert not feed_ok(observation(parties_caps, a, 1.0, valid=False))
    assert not feed_ok(observation(parties_caps, a, 1.0, stale_s=0.6))


# ---- handover -----------------------------------------------------------------------------------------
def make_supervised(caps, **cfg):
    primary, fallback = Fixed(), Fixed()
    events = EventLog()
    sc = SupervisedController(
        primary, fallback, FallbackConfig(**cfg), events=events, primary_name="rl:p", fallback_name="parties"
    )
    sc.reset(caps, np.random.default_rng(0))
    return sc, primary, fallback, events


def test_handover_when_violations_persist_over_the_window_and_hand_back_when_stable(parties_caps):
    caps = parties_caps
    a = fair_allocation(caps)
    sc, primary, fallback, events = make_supervised(caps, window_s=2.0, min_violation_frac=0.75, stable_s=2.0)
    t = 0.5
    for _ in range(3):  # violations, but the window is not full yet
        sc.decide(violating(caps, a, t))
        t += 0.5
    assert sc.active is Active.PRIMARY
    d = sc.decide(violating(caps, a, t))  # t = 2.0: 4 of the 4 intervals of the last 2 s violated
    assert sc.active is Active.FALLBACK and fallback.calls == 1 and d.reason.startswith("[fallback parties]")
    assert fallback.resets == 2 and primary.calls == 3  # validated at start, reset again to take over
    (ev,) = events.drain()
    assert ev.kind == "handover" and "4 of 4 valid intervals over the last 2 s" in ev.message
    # the fallback meets QoS for stable_s: control goes back (the primary is reset first)
    for _ in range(3):
        t += 0.5
        sc.decide(observation(caps, a, t))
    assert sc.active is Active.FALLBACK
    t += 0.5
    sc.decide(observation(caps, a, t))
    assert sc.active is Active.PRIMARY and primary.resets == 2 and sc.state.hand_backs == 1
    assert [e.kind for e in events.drain()] == ["hand_back"]


def test_no_handover_below_the_violation_fraction_nor_on_invalid_intervals(parties_caps):
    caps = parties_caps
    a = fair_allocation(caps)
    sc, *_ = make_supervised(caps, window_s=2.0, min_violation_frac=0.8)
    t = 0.5
    for i in range(40):  # every third interval meets QoS: 67% < 80%
        sc.decide(violating(caps, a, t) if i % 3 else observation(caps, a, t))
        t += 0.5
    for _ in range(40):  # a dead feed: safe mode's business, not a reason to hand over
        sc.decide(observation(caps, a, t, valid=False, stale_s=5.0))
        t += 0.5
    assert sc.active is Active.PRIMARY and sc.state.handovers == 0


def test_handovers_are_capped_and_hand_back_never(parties_caps):
    caps = parties_caps
    a = fair_allocation(caps)
    sc, *_ = make_supervised(caps, window_s=1.0, stable_s=1.0, max_handovers=2)
    t = 0.5
    for _ in range(40):  # violate under the primary, meet QoS under the fallback, repeatedly
        ok = sc.active is Active.FALLBACK
        sc.decide(observation(caps, a, t) if ok else violating(caps, a, t))
        t += 0.5
    assert sc.state.handovers == 2 and sc.state.hand_backs == 1 and sc.state.final
    assert sc.active is Active.FALLBACK
    never, *_ = make_supervised(caps, window_s=1.0, stable_s=1.0, hand_back="never")
    for k in range(20):
        never.decide(observation(caps, a, 0.5 * k) if k > 4 else violating(caps, a, 0.5 * k))
    assert never.active is Active.FALLBACK and never.state.hand_backs == 0 and never.state.final


def test_controller_errors_hand_over_after_n_in_a_row(parties_caps):
    caps = parties_caps
    a = fair_allocation(caps)
    primary = Fixed(raise_after=1)
    fallback = Fixed()
    events = EventLog()
    sc = SupervisedController(primary, fallback, FallbackConfig(max_controller_errors=3), events=events)
    sc.reset(caps, np.random.default_rng(0))
    sc.decide(observation(caps, a, 0.5))
    for t in (1.0, 1.5):
        with pytest.raises(RuntimeError, match="blew up"):  # the loop holds and counts these
            sc.decide(observation(caps, a, t))
    d = sc.decide(observation(caps, a, 2.0))  # the third in a row: the fallback answers
    assert sc.active is Active.FALLBACK and d.reason.startswith("[fallback") and sc.errors_absorbed == 1
    kinds = [e.kind for e in events.drain()]
    assert kinds == ["controller_error"] * 3 + ["handover"]
    alone = SupervisedController(Fixed(raise_after=0))  # no fallback: errors go to the loop
    alone.reset(caps, np.random.default_rng(0))
    with pytest.raises(RuntimeError):
        alone.decide(observation(caps, a, 0.5))


# ---- actuation: retries with backoff ----------------------------------------------------------------
def test_failed_actuation_backs_off_on_the_clock_and_recovers(parties_caps):
    caps = parties_caps
    clock = fakes.ManualClock(0.0)
    start = fair_allocation(caps)
    target = start.replace_app("memcached", freq_mhz=2100)
    node = ScriptNode(caps, start, clock, [OSError(errno.EBUSY, "busy"), OSError(errno.EBUSY, "busy"), "ok"])
    events = EventLog()
    rn = ResilientNode(node, clock=clock, retry=RetryConfig(0.5, 2.0, 4.0), events=events)
    with pytest.raises(OSError, match="busy"):
        rn.apply(target)  # failure 1 -> next attempt at 0.5 s
    assert rn.retry_at_s == 0.5 and rn.stats.failures == 1
    with pytest.raises(ApplyDeferred):
        rn.apply(target)
    clock.advance(0.5)
    with pytest.raises(OSError, match="busy"):
        rn.apply(target)  # failure 2 -> 1 s
    clock.advance(0.5)
    with pytest.raises(ApplyDeferred, match=r"next attempt in 0\.5 s"):
        rn.apply(target)
    assert rn.apply(start) == start  # a rollback to the last good allocation is never deferred
    assert rn.consecutive_failures == 2 and rn.retry_at_s == 1.5  # ... and leaves the backoff alone
    clock.advance(0.5)
    assert rn.apply(target) == target and node.alloc == target
    assert rn.consecutive_failures == 0 and rn.retry_at_s is None and rn.backoff_s == 0.0
    assert (rn.stats.failures, rn.stats.deferred, rn.stats.recovered) == (2, 2, 1)
    kinds = [e.kind for e in events.drain()]
    assert kinds.count("apply_failed") == 2 and kinds[-1] == "apply_recovered"


def test_any_actuation_exception_becomes_an_oserror_and_invalid_input_is_not_retried(parties_caps):
    caps = parties_caps
    clock = fakes.ManualClock(0.0)
    start = fair_allocation(caps)
    node = ScriptNode(caps, start, clock, [RuntimeError("cgroup vanished")])
    rn = ResilientNode(node, clock=clock)
    with pytest.raises(OSError, match="RuntimeError: cgroup vanished"):
        rn.apply(start.replace_app("memcached", freq_mhz=2100))
    rn2 = ResilientNode(ScriptNode(caps, start, clock), clock=clock)
    with pytest.raises(AllocationError):
        rn2.apply(start.replace_app("memcached", cores=99.0))
    assert rn2.stats.refused == 1 and rn2.retry_at_s is None  # the input is wrong: no backoff


def test_swallowed_knob_errors_count_as_a_partial_failure(parties_caps):
    caps = parties_caps
    clock = fakes.ManualClock(0.0)
    start = fair_allocation(caps)
    node = ScriptNode(caps, start, clock, [("partial", 2), "ok"])
    rn = ResilientNode(node, clock=clock, error_count=lambda: node.swallowed)
    target = start.replace_app("memcached", freq_mhz=2100)
    assert rn.apply(target) == start  # the node kept its last good values and said so
    assert rn.stats.partial == 1 and rn.consecutive_failures == 1
    with pytest.raises(ApplyDeferred):
        rn.apply(target)


def test_a_failing_observe_is_an_invalid_observation_never_a_crash(parties_caps):
    caps = parties_caps
    clock = fakes.ManualClock(5.0)
    node = ScriptNode(caps, fair_allocation(caps), clock)
    rn = ResilientNode(node, clock=clock)
    assert rn.observe().valid
    node.observe_error = OSError(errno.EIO, "feed socket died")
    clock.advance(1.5)
    obs = rn.observe()
    assert not obs.valid and not feed_ok(obs) and obs.stale_s == pytest.approx(1.5)
    assert all(not s.valid and math.isnan(s.p99_us) for s in obs.apps) and obs.allocation == node.alloc
    assert rn.stats.observe_failures == 1


# ---- dry run ----------------------------------------------------------------------------------------------
def test_dry_run_validates_logs_the_writes_and_writes_nothing():
    node = SimNode(two_app_scenario(), seed=1)
    start = node.current_allocation()
    events = EventLog()
    dry = DryRunNode(node, events=events)
    caps = node.capabilities()
    with pytest.raises(AllocationError):
        dry.apply(start.replace_app("memcached", cores=999.0))
    move = start.replace_app("memcached", cores=start["memcached"].cores + 1.0)
    move = move.replace_app("nginx", cores=start["nginx"].cores - 1.0)
    got = dry.apply(move)
    assert got == start and node.current_allocation() == start and dry.would_apply == 1
    (ev,) = events.drain()
    assert ev.kind == "dry_run" and "memcached.cores 7->8" in ev.message and "nginx.cores 7->6" in ev.message
    assert dry.apply(start) == start and dry.would_apply == 1  # no change: nothing to write
    sup = Supervisor(node, StaticController(), dry_run=True, guards=build_guards(GuardsConfig.serving()))
    target = start.replace_app("memcached", freq_mhz=caps.freq_levels_mhz[-1])
    sup.controller.primary = Fixed(target)
    sup.controller.primary.reset(caps, np.random.default_rng(0))
    recs = run_ticks(sup, node, 3)
    assert node.current_allocation() == start
    assert (
        all(r.serving.dry_run for r in recs)
        and sum(e.kind == "dry_run" for r in recs for e in r.serving.events) == 3
    )


def test_a_node_wrapper_forwards_the_node_protocol_and_any_other_attribute(parties_caps):
    caps = parties_caps
    node = ScriptNode(caps, fair_allocation(caps), fakes.ManualClock(3.0))
    w = NodeWrapper(NodeWrapper(node))  # a stack of wrappers reads like the node
    assert w.clock is node.clock and w.capabilities() is caps and w.current_allocation() == node.alloc
    assert w.observe().time_s == 3.0 and w.reset().time_s == 3.0
    target = squeezed(caps)
    assert w.apply(target) == target and node.applied == [target] and w.current_allocation() == target
    assert w.swallowed == 0 and w.script == []  # the inner node's own attributes
    with pytest.raises(AttributeError):
        _ = w.no_such_attribute
    w.close()
    assert node.closed == 1


# ---- stopping ----------------------------------------------------------------------------------------------
def test_a_stop_request_ends_a_real_clock_wait_at_once():
    clock = StoppableClock(RealClock())
    threading.Timer(0.05, clock.request_stop).start()
    with pytest.raises(StopServing):
        clock.sleep_until(clock.now() + 600.0)  # would be 10 minutes without the stop


def test_sigterm_finishes_the_tick_restores_and_returns(parties_caps):
    """SIGTERM during a run on a real clock: the run returns normally (no exception), the node is
    closed once, and no tick starts after the signal."""
    caps = parties_caps

    class SignalledNode(ScriptNode):
        """Sends SIGTERM to the main thread shortly after the first tick's observation (a fixed
        timer from the start raced a slow first tick on a loaded CI machine)."""

        observed = 0

        def observe(self):
            self.observed += 1
            if self.observed == 2:  # reset() observed once; this is the first tick's
                main = threading.main_thread().ident
                threading.Timer(0.05, lambda: signal.pthread_kill(main, signal.SIGTERM)).start()
            return super().observe()

    node = SignalledNode(caps, fair_allocation(caps), RealClock())
    sup = Supervisor(node, Fixed(), controller_name="fixed")
    before = signal.getsignal(signal.SIGTERM)
    with SignalStop() as sig:
        sig.attach(sup)
        summary = sup.run()
    assert summary.exit_reason == "signal SIGTERM" and node.closed == 1 and sup.closed
    assert summary.ticks >= 1
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_a_signal_before_the_supervisor_exists_ends_the_run_before_its_first_tick(parties_caps):
    caps = parties_caps
    node = ScriptNode(caps, fair_allocation(caps), RealClock())
    with SignalStop() as sig:
        signal.raise_signal(signal.SIGINT)  # e.g. Ctrl-C while the node was starting
        sup = Supervisor(node, Fixed())
        sig.attach(sup)
        summary = sup.run(duration_s=60.0)
    assert summary.ticks == 0 and node.closed == 1 and summary.exit_reason == "signal SIGINT"


def test_an_unexpected_error_still_restores_the_node(parties_caps):
    caps = parties_caps

    class BrokenGuard:
        name = "broken"

        def reset(self, caps):
            pass

        def check(self, decision, obs, caps):
            raise ZeroDivisionError("bug in a guard")

    node = ScriptNode(caps, fair_allocation(caps), fakes.ManualClock(0.0))
    sup = Supervisor(node, Fixed(), guards=GuardChain([BrokenGuard()]))
    with pytest.raises(ZeroDivisionError):
        sup.run(duration_s=5.0)
    assert node.closed == 1 and sup.summary().exit_reason.startswith("crashed: ZeroDivisionError")


# ---- fault injection on a SimNode ------------------------------------------------------------------------
def test_sim_silent_feed_safe_mode_within_two_intervals_and_back(tmp_path):
    node = StaleFeedNode(two_app_scenario(0.3), seed=3, silent_from=10.0, silent_until=16.0)
    start = node.current_allocation()
    sink = JsonlSink(tmp_path / "d.jsonl")
    sup = Supervisor(node, Starve(), guards=GuardChain(), sinks=[sink])  # no other guard: safe mode alone
    recs = run_ticks(sup, node, 50)
    sink.close()
    first_missing = 10.5  # the first interval without a reading
    safe = [r for r in recs if r.serving.mode == "safe"]
    assert safe and safe[0].tick.time_s - first_missing <= 2 * 0.5 + 1e-9
    before = [r for r in recs if r.tick.time_s < safe[0].tick.time_s]
    assert (
        min(r.tick.alloc_of("memcached").cores for r in before) < start["memcached"].cores
    )  # it was starved
    # the allocation in force from the tick after entering until the feed is back: LC >= start, BE frozen
    in_safe = [r for r in recs if safe[0].tick.time_s < r.tick.time_s <= 16.5]
    be_at_entry = safe[0].tick.alloc_of("be_parties")
    for r in in_safe:
        for lc in ("memcached", "nginx"):
            for f in FIELDS:
                assert getattr(r.tick.alloc_of(lc), f) >= getattr(start[lc], f)
        assert r.tick.alloc_of("be_parties").cores <= be_at_entry.cores
    assert recs[-1].serving.mode == "normal" and sup.safe_guard.state.entries == 1
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for x in lines for e in x["serving"]["events"]]
    assert kinds.count("safe_mode_on") == 1 and kinds.count("safe_mode_off") == 1


def test_sim_learned_controller_hands_over_to_parties_and_gets_control_back():
    node = SimNode(two_app_scenario(0.7), seed=1)
    cfg = ServeConfig(fallback=FallbackConfig(window_s=3.0, stable_s=5.0))
    sup = Supervisor(
        node,
        Starve(),
        config=cfg,
        guards=build_guards(GuardsConfig.serving()),
        fallback=PartiesController(),
        controller_name="rl:starve",
        fallback_name="parties",
    )
    recs = run_ticks(sup, node, 60)
    events = [e for r in recs for e in r.serving.events]
    kinds = [e.kind for e in events]
    assert "handover" in kinds and "hand_back" in kinds and kinds.index("handover") < kinds.index("hand_back")
    i = next(k for k, r in enumerate(recs) if r.serving.fallback_active)
    assert recs[i].serving.controller == "parties" and "[fallback parties]" in recs[i].tick.reason
    window = recs[i - 5 : i + 1]  # the 3 s up to the handover: violations persisted in >= 80%
    assert sum(not r.tick.all_qos_met for r in window) / len(window) >= 0.8
    j = next(k for k, r in enumerate(recs) if k > i and not r.serving.fallback_active)
    assert all(r.tick.all_qos_met for r in recs[j - 5 : j])  # PARTIES met every target before handing back
    assert "QoS missed in" in next(e.message for e in events if e.kind == "handover")


def test_sim_actuation_errors_are_retried_with_backoff_and_the_loop_goes_on():
    node = FlakyApplyNode(two_app_scenario(0.3), seed=2, fail_calls={1, 2, 3})
    caps = node.capabilities()
    start = node.current_allocation()
    target = start.replace_app("memcached", freq_mhz=caps.freq_levels_mhz[-1])
    sup = Supervisor(node, Fixed(target), config=ServeConfig(retry=RetryConfig(0.5, 2.0, 8.0)))
    recs = run_ticks(sup, node, 12)
    # attempts at t=0.5 (fail), 1.0 (fail, then wait 1 s), 2.0 (fail, then 2 s), 4.0 (ok)
    attempts = [
        r.tick.time_s
        for r in recs
        if any(e.kind in ("apply_failed", "apply_recovered") for e in r.serving.events)
    ]
    assert attempts == [0.5, 1.0, 2.0, 4.0]
    assert recs[-1].tick.alloc_of("memcached").freq_mhz == caps.freq_levels_mhz[-1]
    s = sup.summary()
    assert (s.apply_failures, s.applied, s.apply_deferred, s.ticks) == (
        3,
        1,
        4,
        12,
    )  # deferred at 1.5, 2.5-3.5
    assert all(r.tick.errors for r in recs[:7]) and not recs[-1].tick.errors


def test_sim_a_policy_that_raises_is_held_then_handed_over():
    node = SimNode(two_app_scenario(0.3), seed=2)
    sup = Supervisor(
        node,
        Fixed(raise_after=2),
        config=ServeConfig(fallback=FallbackConfig(max_controller_errors=3)),
        fallback=StaticController(),
        controller_name="rl:broken",
        fallback_name="static",
    )
    recs = run_ticks(sup, node, 8)
    assert [r.serving.controller for r in recs] == ["rl:broken"] * 4 + ["static"] * 4
    assert recs[2].tick.reason == "controller error: holding" and recs[2].tick.errors
    assert sup.summary().controller_errors == 3


def test_sim_observe_failure_goes_to_safe_mode():
    class DyingSensor(SimNode):
        def observe(self):
            if 3.0 < self.clock.now() <= 5.0:
                raise OSError(errno.EIO, "perf counters gone")
            return super().observe()

    node = DyingSensor(two_app_scenario(0.3), seed=2)
    sup = Supervisor(node, Fixed())
    recs = run_ticks(sup, node, 14)
    modes = [(r.tick.time_s, r.serving.mode) for r in recs]
    assert dict(modes)[3.5] == "safe" and dict(modes)[3.0] == "normal" and modes[-1][1] == "normal"
    assert not recs[6].tick.valid and any(e.kind == "observe_failed" for e in recs[6].serving.events)
    assert sup.summary().observe_errors == 4


# ---- fault injection on a LinuxNode over fake trees ---------------------------------------------------------
def linux_node(tmp_path, **kw):
    from hw.linux_node import LinuxNode

    host = fakes.make_v1_host(tmp_path)
    clock = fakes.ManualClock()
    feed = fakes.FakeFeed(clock)
    cfg = fakes.linux_config(host, tmp_path, **kw)
    node = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=host.fs)
    return node, host, clock, feed


def snapshot(host) -> dict[str, str]:
    return {str(p): p.read_text() for p in host.base.rglob("*") if p.is_file() and "state" not in p.parts}


def linux_ticks(sup, clock, feed, n, p99=300.0, publish=True):
    out = []
    for _ in range(n):
        if publish:
            feed.put("mc", p99, 5000.0)
        out.append(sup.tick())
        clock.advance(0.5)
    return out


def test_linux_stale_feed_safe_mode_restores_the_lc_start_allocation(tmp_path):
    node, host, clock, feed = linux_node(tmp_path)
    feed.put("mc", 300.0, 5000.0)
    node.reset()
    start = node.current_allocation()
    caps = node.capabilities()
    low = start.replace_app("mc", cores=1.0, llc_ways=2, memory_gb=1.0).replace_app(
        "be", cores=caps.cores - 1.0, llc_ways=start["be"].llc_ways + start["mc"].llc_ways - 2
    )
    ctl = Fixed(low)
    sup = Supervisor(node, ctl, error_count=lambda: sum(v for k, v in node.errors.items() if k != "usage"))
    recs = linux_ticks(sup, clock, feed, 3)
    assert node.current_allocation()["mc"].cores == 1.0  # the controller squeezed mc
    last_reading = clock.t - 0.5
    silent = linux_ticks(sup, clock, feed, 4, publish=False)
    first_safe = next(r for r in silent if r.serving.mode == "safe")
    assert (
        first_safe.tick.time_s - (last_reading + 0.5) <= 2 * 0.5 + 1e-9
    )  # within 2 intervals of the first gap
    mc, be = node.current_allocation()["mc"], node.current_allocation()["be"]
    assert (
        mc.cores >= start["mc"].cores
        and mc.llc_ways >= start["mc"].llc_ways
        and mc.memory_gb >= start["mc"].memory_gb
    )
    assert be.cores <= low["be"].cores
    cpus = (host.cgroup_root / "cpuset" / "mc" / "cpuset.cpus").read_text()
    assert cpus  # the write really reached the (fake) kernel
    back = linux_ticks(sup, clock, feed, 3)
    assert back[-1].serving.mode == "normal" and node.current_allocation()["mc"].cores == 1.0
    assert sup.summary().safe_mode_entries == 1 and recs[0].serving.mode == "normal"
    node.close()


def test_linux_write_errors_are_counted_backed_off_and_recovered(tmp_path):
    node, host, clock, feed = linux_node(tmp_path)
    feed.put("mc", 300.0, 5000.0)
    node.reset()
    start = node.current_allocation()
    target = start.replace_app("mc", memory_gb=start["mc"].memory_gb - 1.0).replace_app(
        "be", memory_gb=start["be"].memory_gb + 1.0
    )
    sup = Supervisor(
        node,
        Fixed(target),
        error_count=lambda: sum(v for k, v in node.errors.items() if k != "usage"),
        config=ServeConfig(retry=RetryConfig(0.5, 2.0, 8.0)),
    )
    host.fs.fail("cg/memory/mc/memory.limit_in_bytes", errno.EBUSY)
    recs = linux_ticks(sup, clock, feed, 4)
    assert node.errors["mem"] >= 2 and sup.node.stats.partial >= 2 and sup.node.stats.deferred >= 1
    assert node.current_allocation()["mc"].memory_gb == start["mc"].memory_gb  # the last good value
    host.fs.clear()
    recs += linux_ticks(sup, clock, feed, 8)
    assert node.current_allocation()["mc"].memory_gb == target["mc"].memory_gb
    assert sup.node.stats.recovered == 1 and sup.node.consecutive_failures == 0
    kinds = [e.kind for r in recs for e in r.serving.events]
    assert "apply_partial" in kinds and "apply_deferred" in kinds and "apply_recovered" in kinds
    node.close()


def test_linux_dry_run_of_a_node_never_reset_observes_it_against_the_assumed_start(tmp_path):
    node, host, clock, feed = linux_node(tmp_path)
    caps = node.capabilities()
    before = snapshot(host)  # started (probed, resolved); nothing applied
    with pytest.raises(RuntimeError, match="a dry run needs the allocation to take as in force"):
        DryRunNode(node)  # a LinuxNode never reset has no allocation in force
    start = fair_allocation(caps)
    with pytest.raises(AllocationError):
        node.assume(start.replace_app("mc", cores=999.0))
    sup = Supervisor(
        node,
        PartiesController(),
        dry_run=True,
        start_allocation=start,
        guards=build_guards(GuardsConfig.serving()),
    )
    assert node.current_allocation() == start  # told by the dry-run node: taken as in force, not written
    recs = linux_ticks(sup, clock, feed, 8, p99=100.0)  # lots of slack: PARTIES wants to downsize mc
    assert all(r.tick.valid and r.serving.dry_run and r.serving.mode == "normal" for r in recs)
    assert all(r.tick.alloc_of("mc") == start["mc"] for r in recs)
    writes = [e.message for r in recs for e in r.serving.events if e.kind == "dry_run"]
    assert writes and all(w.startswith("would write: ") for w in writes)
    assert sup.summary().would_apply == len(writes) and sup.summary().applied == 0
    with pytest.raises(RuntimeError, match="never resets"):
        sup.node.reset()
    assert snapshot(host) == before  # not one byte written to the (fake) kernel
    sup.close()
    assert snapshot(host) == before


def test_linux_run_restores_every_file_on_exit(tmp_path):
    node, host, _, feed = linux_node(tmp_path)
    before = snapshot(host)
    feed.put("mc", 300.0, 5000.0)
    node.reset()
    assert snapshot(host) != before
    sup = Supervisor(node, PartiesController(), guards=build_guards(GuardsConfig.serving()))
    summary = sup.run(duration_s=3.0)  # ManualClock: no real waiting
    assert summary.ticks == 6 and summary.exit_reason == "duration"
    changed = {p for p, v in before.items() if snapshot(host).get(p) != v and not p.endswith("tasks")}
    assert changed == set()
    assert not any(host.resctrl_root.glob("coloc_clos*"))


# ---- outputs -----------------------------------------------------------------------------------------------
def test_jsonl_tensorboard_prometheus_health_and_console(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    node = SimNode(two_app_scenario(0.3), seed=1)
    sinks = [JsonlSink(tmp_path / "d.jsonl"), TensorBoardSink(tmp_path / "tb")]
    sup = Supervisor(
        node, PartiesController(), sinks=sinks, metrics=MetricsConfig(port=0), controller_name="parties"
    )
    sup.start()
    url = sup.http.url
    try:
        body = urllib.request.urlopen(f"{url}/healthz", timeout=5).read()
        assert json.loads(body)["status"] == "starting"
        recs = run_ticks(sup, node, 6)
        health = json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=5).read())
        assert health["status"] == "ok" and health["ticks"] == 6 and health["controller"] == "parties"
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        assert "coloc_serve_ticks_total 6.0" in text
        assert (
            'coloc_serve_p99_us{app="memcached"}' in text
            and 'coloc_serve_allocation{app="nginx",resource="cores"}' in text
        )
        assert 'coloc_serve_active_controller{controller="parties"} 1.0' in text
        # the last minute's window tail: p99 of all its requests, from the intervals' histograms
        wt = sup.last_minute()
        assert wt.intervals == 6 and {a.name for a in wt.apps} == {"memcached", "nginx"}
        merged = merge(r.tick.app_tick("memcached").histogram for r in recs)
        mc = next(a for a in wt.apps if a.name == "memcached")
        assert mc.p99_us == pytest.approx(merged.quantile_us(0.99)) and mc.requests == merged.count
        assert f'coloc_serve_window_p99_us{{app="memcached"}} {mc.p99_us}' in text
        assert (
            'coloc_serve_window_over_target{app="nginx"}' in text and "coloc_serve_window_tail_ratio" in text
        )
        s = sup.summary()
        assert s.window_p99_us["memcached"] == pytest.approx(mc.p99_us)
        assert s.window_tail_ratio == pytest.approx(wt.tail_ratio) and "last minute: p99" in s.text()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{url}/other", timeout=5)
        sup.request_stop("test")
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"{url}/healthz", timeout=5)
    finally:
        sup.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/healthz", timeout=2)  # the endpoint is gone after close
    back = read_jsonl(tmp_path / "d.jsonl")  # env.loop reads the decision log back
    assert [r.time_s for r in back] == [r.tick.time_s for r in recs]
    line = json.loads((tmp_path / "d.jsonl").read_text().splitlines()[0])
    assert set(line["serving"]) >= {"tick", "mode", "controller", "fallback_active", "events", "control_ms"}
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {t.split("/")[0] for t in tags} == {"qos", "alloc", "be", "loop"}
    assert (
        "loop/safe_mode" in tags
        and "qos/memcached/slack" in tags
        and len(acc.Scalars("loop/control_ms")) == 6
    )
    line = format_status(recs[-1])
    assert line.startswith("t=    3.0s #6") and "memcached" in line and "parties" in line


def test_a_failing_output_never_stops_control(tmp_path):
    class Broken:
        def write(self, rec):
            raise OSError(errno.ENOSPC, "disk full")

        def close(self):
            pass

    node = SimNode(two_app_scenario(0.3), seed=1)
    sup = Supervisor(node, PartiesController(), sinks=[Broken()])
    run_ticks(sup, node, 4)
    assert sup.stats.ticks == 4 and sup.stats.sink_errors == 4


def test_bench_overhead_reports_control_time_and_cpu_share(tmp_path):
    node = SimNode(two_app_scenario(0.3), seed=1)
    r = bench_overhead(
        node,
        PartiesController(),
        ticks=20,
        warmup_ticks=2,
        guards=build_guards(GuardsConfig.serving()),
        out_dir=tmp_path,
    )
    assert r["ticks"] == 20 and r["lc_apps"] == 2 and r["applied"] >= 1
    for k in (
        "control_ms",
        "control_cpu_ms",
        "control_ms_applying_ticks",
        "decide_ms",
        "observe_ms",
        "sinks_ms",
    ):
        assert 0 < r[k]["p50"] <= r[k]["p99"] <= r[k]["max"]
    assert 0 < r["cpu_pct_of_core_excl_observe"] <= r["cpu_pct_of_core"]
    assert len(read_jsonl(tmp_path / "decisions.jsonl")) == 22
    lnode, host, clock, feed = linux_node(tmp_path / "fake")
    orig = snapshot(host)
    feed.put("mc", 300.0, 5000.0)
    lnode.reset()
    r = bench_overhead(
        lnode,
        StaticController(),
        ticks=10,
        warmup_ticks=1,
        before_observe=lambda: feed.put("mc", 300.0, 5000.0),
        clock=clock,
    )
    assert r["ticks"] == 10 and r["safe_mode_ticks"] == 0 and r["node"] == "fake"
    after = snapshot(host)
    assert {p for p, v in orig.items() if after.get(p) != v and not p.endswith("tasks")} == set()  # restored


def test_garbage_is_collected_between_ticks_only_while_serving(parties_caps):
    import gc

    caps = parties_caps
    seen = []

    class Probe(Fixed):
        def _decide(self, obs):
            seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
            return super()._decide(obs)

    node = ScriptNode(caps, fair_allocation(caps), fakes.ManualClock(0.0))
    assert gc.isenabled()
    Supervisor(node, Probe()).run(duration_s=2.0)
    assert seen == [(False, True)] * 4  # no automatic collection inside a tick; start-up heap frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0  # given back on close
    seen.clear()
    Supervisor(
        ScriptNode(caps, fair_allocation(caps), fakes.ManualClock(0.0)),
        Probe(),
        config=ServeConfig(gc_between_ticks=False),
    ).run(duration_s=1.0)
    assert seen == [(True, False)] * 2


def test_linux_learned_controller_hands_over_and_back(tmp_path):
    from hw.config import CoresConfig

    node, host, clock, feed = linux_node(
        tmp_path, knobs=("core", "mem"), cores=CoresConfig(mode="quota", quota_step_cores=0.5)
    )
    feed.put("mc", 300.0, 5000.0)
    node.reset()
    assert node.current_allocation()["mc"].cores == 4.0  # one LC app: the whole (fake) node

    def tick_with_physics(n):  # mc meets its 500 us target only with >= 2 cores of quota
        out = []
        for _ in range(n):
            cores = node.current_allocation()["mc"].cores
            feed.put("mc", 300.0 if cores >= 2.0 else 900.0, 5000.0)
            out.append(sup.tick())
            clock.advance(0.5)
        return out

    sup = Supervisor(
        node,
        Starve(),
        config=ServeConfig(fallback=FallbackConfig(window_s=2.0, stable_s=3.0)),
        fallback=PartiesController(),
        controller_name="rl:starve",
        fallback_name="parties",
    )
    recs = tick_with_physics(40)
    kinds = [e.kind for r in recs for e in r.serving.events]
    assert kinds == ["handover", "hand_back"] * 2 + ["handover"]  # the third handover is for good
    assert sup.controller.state.final and recs[-1].serving.controller == "parties"
    first = next(i for i, r in enumerate(recs) if r.serving.fallback_active)
    assert recs[first - 1].tick.alloc_of("mc").cores < 2.0  # starved when it was handed over
    back = next(i for i, r in enumerate(recs) if i > first and not r.serving.fallback_active)
    assert recs[back - 1].tick.alloc_of("mc").cores >= 2.0  # PARTIES gave the cores back first
    quota = int((host.cgroup_root / "cpu" / "mc" / "cpu.cfs_quota_us").read_text())
    assert quota == round(node.current_allocation()["mc"].cores * 100_000)  # the (fake) kernel saw it
    node.close()
