"""env.loop: the tick, its records and its error handling (DESIGN §3, §6.5, §6.7)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from baselines.simple import StaticController, UnmanagedController
from env.allocations import fair_allocation, unmanaged_allocation
from env.controller import BaseController
from env.guards import GuardChain, GuardsConfig, RateLimitConfig, build_guards
from env.loop import ControlLoop, TickRecord, read_jsonl, run_episode
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import AllocationError, Decision, Move


def scenario(duration_s: float = 10.0):
    return simple_scenario({"memcached": 0.2, "nginx": 0.2}, duration_s=duration_s, warmup_s=2.0)


class FlakyNode(SimNode):
    """A SimNode whose apply fails on chosen calls (AllocationError or OSError), optionally after
    writing part of the allocation (a partial write that the loop must undo)."""

    def __init__(self, *a, fail_on=(), exc=OSError, partial=False, **kw):
        super().__init__(*a, **kw)
        self.fail_on, self.exc, self.partial, self.calls = set(fail_on), exc, partial, 0

    def apply(self, allocation):
        self.calls += 1
        if self.calls in self.fail_on:
            if self.partial:
                cur = self.current_allocation()
                super().apply(cur.replace_app("memcached", freq_mhz=cur["memcached"].freq_mhz - 100))
            raise self.exc("resctrl write failed")
        return super().apply(allocation)


class Toggle(BaseController):
    """Alternates between fair and unmanaged every tick, so that every tick applies."""

    name = "toggle"

    def _reset(self):
        self.k = 0

    def _decide(self, obs):
        self.k += 1
        alloc = unmanaged_allocation(self.caps) if self.k % 2 else fair_allocation(self.caps)
        return Decision(alloc, reason=f"toggle {self.k}")


def test_records_cover_every_interval_of_the_episode():
    node = SimNode(scenario(), seed=1)
    recs = run_episode(node, UnmanagedController(), 10.0, rng=np.random.default_rng(0))
    assert [r.time_s for r in recs] == pytest.approx([0.5 * (k + 1) for k in range(20)])
    # the first interval ran with the node's initial (fair) allocation, the next ones unmanaged
    assert recs[0].alloc == fair_allocation(node.capabilities()).apps and recs[0].changed
    assert recs[1].alloc == unmanaged_allocation(node.capabilities()).apps and not recs[1].changed
    assert all(r.decide_ms >= 0 and math.isfinite(r.decide_ms) for r in recs)
    assert {a.name for a in recs[0].apps} == {"memcached", "nginx"}
    assert recs[0].be[0].name == "be_parties" and recs[0].be_throughput >= 0


def test_apply_errors_are_counted_logged_and_the_last_good_allocation_kept(caplog):
    node = FlakyNode(scenario(), seed=0, fail_on={2, 3}, exc=AllocationError)
    ctrl = Toggle()
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    loop = ControlLoop(node, ctrl)
    recs = loop.run(6)
    assert len(recs) == 6
    # ticks 2 and 4 try to go back to fair (apply calls 2 and 3); ticks 3 and 5 want unmanaged,
    # which the node still holds, so they apply nothing; tick 6 applies fair (call 4)
    assert [bool(r.errors) for r in recs] == [False, True, False, True, False, False]
    assert "apply: AllocationError: resctrl write failed" in recs[1].errors[0]
    assert [r.changed for r in recs] == [True, False, False, False, False, True]
    assert loop.stats.apply_errors == 2 and loop.stats.applied == 2
    # after the failed applies the node still holds what tick 1 applied (unmanaged)
    unmanaged = unmanaged_allocation(node.capabilities()).apps
    assert recs[2].alloc == recs[4].alloc == recs[5].alloc == unmanaged
    assert "keeping the last good allocation" in caplog.text


def test_a_partial_write_is_rolled_back_to_the_last_good_allocation():
    node = FlakyNode(scenario(), seed=0, fail_on={1}, exc=OSError, partial=True)
    ctrl = Toggle()
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    good = node.current_allocation()
    loop = ControlLoop(node, ctrl)
    rec = loop.tick()
    assert rec.errors and "OSError" in rec.errors[0] and not rec.changed
    assert node.current_allocation() == good


def test_observe_errors_give_an_invalid_record_and_the_loop_goes_on():
    class DeadFeed(SimNode):
        n = 0

        def observe(self):
            self.n += 1
            if self.n == 2:
                raise OSError("latency feed closed")
            return super().observe()

    node = DeadFeed(scenario(), seed=0)
    ctrl = StaticController()
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    loop = ControlLoop(node, ctrl)
    recs = loop.run(4)
    assert [r.valid for r in recs] == [True, False, True, True]
    assert recs[1].apps == () and "latency feed closed" in recs[1].errors[0]
    assert loop.stats.observe_errors == 1
    json.loads(recs[1].to_json())  # still one JSONL line


def test_controller_errors_raise_in_evaluation_and_hold_when_serving():
    class Broken(BaseController):
        name = "broken"

        def _decide(self, obs):
            raise ZeroDivisionError("bug")

    node = SimNode(scenario(), seed=0)
    with pytest.raises(ZeroDivisionError):
        run_episode(node, Broken(), 2.0, rng=np.random.default_rng(0))
    node = SimNode(scenario(), seed=0)
    ctrl = Broken()
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    loop = ControlLoop(node, ctrl, hold_on_controller_error=True)
    rec = loop.tick()
    assert rec.errors and "ZeroDivisionError" in rec.errors[0] and loop.stats.controller_errors == 1
    assert not rec.changed
    node = SimNode(scenario(), seed=0)
    recs = run_episode(node, Broken(), 2.0, rng=np.random.default_rng(0), hold_on_controller_error=True)
    assert len(recs) == 4 and all(r.errors and r.reason.startswith("controller error") for r in recs)


def test_guards_act_on_the_decision_and_their_notes_are_recorded():
    class Greedy(BaseController):
        name = "greedy"

        def _decide(self, obs):
            a = obs.allocation
            return Decision(a.replace_app("memcached", cores=99.0), "all cores", Move.UP_CORE, "memcached")

    node = SimNode(scenario(), seed=0)
    recs = run_episode(node, Greedy(), 1.0, rng=np.random.default_rng(0))
    assert recs[0].guards and recs[0].guards[0].startswith("clamp: memcached.cores 99->")
    assert "[clamp:" in recs[0].reason and recs[0].move == "<UP,CORE>" and recs[0].app == "memcached"
    caps = node.capabilities()
    assert recs[1].alloc_of("memcached").cores <= caps.cores


def test_a_rate_limited_chain_changes_what_is_applied():
    class Shrink(BaseController):
        name = "shrink"

        def _decide(self, obs):
            a = obs.allocation
            m = a["memcached"]
            if m.cores <= 2:
                return Decision.hold()
            target = a.replace_app("memcached", cores=1.0).replace_app(
                "be_parties", cores=a["be_parties"].cores + m.cores - 1.0
            )
            return Decision(target, "to one core")

    node = SimNode(scenario(), seed=0)
    chain = build_guards(GuardsConfig(rate_limit=RateLimitConfig(max_core_decrease=1.0)))
    recs = run_episode(node, Shrink(), 3.0, rng=np.random.default_rng(0), guards=chain)
    cores = [r.alloc_of("memcached").cores for r in recs]
    assert all(a - b <= 1.0 for a, b in itertools.pairwise(cores))
    assert cores[0] - cores[-1] >= 2.0


def test_stop_when_ends_the_run_after_that_record():
    node = SimNode(scenario(), seed=0)
    recs = run_episode(
        node, StaticController(), 10.0, rng=np.random.default_rng(0), stop_when=lambda r: r.time_s >= 2.0
    )
    assert len(recs) == 4 and recs[-1].time_s == pytest.approx(2.0)


def test_jsonl_round_trip_and_tensorboard_namespaces(tmp_path):
    node = SimNode(scenario(), seed=0)
    path = tmp_path / "ticks.jsonl"
    with path.open("w") as f:
        recs = run_episode(
            node,
            UnmanagedController(),
            2.0,
            rng=np.random.default_rng(0),
            on_tick=lambda r: f.write(r.to_json() + "\n"),
        )
    lines = path.read_text().splitlines()
    assert len(lines) == len(recs) == 4
    d = json.loads(lines[0])
    assert {"time_s", "apps", "alloc", "be_throughput", "power_w", "decision", "decide_ms", "errors"} <= set(
        d
    )
    assert {"p99_us", "target_us", "slack", "load_frac"} <= set(d["apps"][0])
    back = read_jsonl(path)
    assert [dataclasses.replace(r, decide_ms=0.0) for r in back] == [
        dataclasses.replace(r, decide_ms=0.0) for r in recs
    ]
    # NaN survives as null -> NaN
    bad = dataclasses.replace(recs[0], power_w=math.nan)
    assert json.loads(bad.to_json())["power_w"] is None and math.isnan(
        TickRecord.from_json(bad.to_json()).power_w
    )
    tags = recs[0].scalars()
    assert {t.split("/")[0] for t in tags} == {"qos", "alloc", "be", "loop"}
    assert "qos/memcached/p99_over_target" in tags and "alloc/be_parties/cores" in tags


def test_loop_with_an_empty_chain_still_never_applies_an_invalid_allocation():
    class Invalid(BaseController):
        name = "invalid"

        def _decide(self, obs):
            return Decision(obs.allocation.replace_app("nginx", freq_mhz=1234), "not a level")

    node = SimNode(scenario(), seed=0)
    before = node.current_allocation()
    recs = run_episode(node, Invalid(), 1.0, rng=np.random.default_rng(0), guards=GuardChain([]))
    assert node.current_allocation() == before
    assert all("chain: invalid allocation held" in r.guards[0] for r in recs)


def test_decision_signals_are_recorded_and_round_trip():
    """PARTIES' migration request (Sec. 4.2.1) must reach the run log."""
    import dataclasses as _dc

    from env.loop import TickRecord, record_of
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario
    from env.types import Decision

    node = SimNode(simple_scenario({"memcached": 0.3}), seed=0)
    obs = node.observe()
    decision = _dc.replace(Decision.hold("x"), signals={"migrate": "memcached"})
    rec = record_of(obs, decision, changed=False, decide_ms=0.1)
    assert rec.signals == (("migrate", "memcached"),)
    back = TickRecord.from_json(rec.to_json())
    assert back.signals == rec.signals
