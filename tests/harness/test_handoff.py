"""harness.handoff: `handoff:SECONDS:FIRST+SECOND` applies FIRST's decisions before the switch and
SECOND's after it, each controller as it would decide alone; malformed specs are refused when parsed."""

from __future__ import annotations

import numpy as np
import pytest

from env.allocations import fair_allocation
from env.config import ConfigError
from env.controller import ControllerContext
from env.loop import run_episode
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from harness.handoff import HandoffController, parse_handoff
from harness.registry import make_controller, parse_spec, parse_specs

LOADS = {"memcached": 0.2, "xapian": 0.1, "nginx": 0.2}


def _run(spec: str, seconds: float, rng: np.random.Generator):
    scn = simple_scenario(LOADS, duration_s=seconds, warmup_s=1.0, seed=3)
    node = SimNode(scn, seed=3)
    ctrl = make_controller(spec, ControllerContext(node.capabilities(), scn, node, 3))
    return run_episode(node, ctrl, seconds, rng=rng), node.capabilities()


def test_first_decides_before_the_switch_and_second_after():
    recs, caps = _run("handoff:6:parties+static", 12.0, np.random.default_rng(7))
    alone, _ = _run("parties", 12.0, np.random.default_rng(7).spawn(2)[0])  # the first's generator
    before = [r for r in recs if r.time_s < 6.0]
    assert len(before) == 11
    assert [r.alloc for r in before] == [r.alloc for r in alone[: len(before)]]
    assert [r.move for r in before] == [r.move for r in alone[: len(before)]]
    assert any(r.changed for r in before), "PARTIES moved nothing before the switch: the test shows nothing"
    fair = fair_allocation(caps)
    assert before[-1].alloc != fair.apps  # PARTIES left the fair start
    # from the switch on, static's decision: PARTIES' fair start held
    after = [r for r in recs if r.time_s >= 6.0]
    assert after[0].changed
    assert all(r.alloc == fair.apps for r in after[1:])


def test_name_and_generators():
    scn = simple_scenario(LOADS, duration_s=5.0, warmup_s=1.0, seed=0)
    node = SimNode(scn, seed=0)
    ctrl = make_controller(
        "handoff:2.5:static+unmanaged", ControllerContext(node.capabilities(), scn, node, 0)
    )
    assert isinstance(ctrl, HandoffController)
    assert ctrl.name == "handoff:2.5:static+unmanaged"
    assert ctrl.switch_s == 2.5


def test_parse():
    assert parse_handoff("30:oracle-guided+rl:runs/x/policy.pt") == parse_handoff(
        "30: oracle-guided + rl:runs/x/policy.pt"
    )
    h = parse_handoff("0:parties:code+parties")
    assert (h.switch_s, h.first, h.second) == (0.0, "parties:code", "parties")
    assert parse_spec("handoff:1:static+handoff:2:parties+static")[0] == "handoff"
    assert parse_specs("handoff:30:parties+static,parties") == ["handoff:30:parties+static", "parties"]


@pytest.mark.parametrize(
    "spec",
    [
        "handoff",
        "handoff:abc:static+parties",
        "handoff:-1:static+parties",
        "handoff:nan:static+parties",
        "handoff:5",
        "handoff:5:static",
        "handoff:5:+parties",
        "handoff:5:static+",
        "handoff:5:nope+parties",
        "handoff:5:static+rl",
    ],
)
def test_bad_specs_refused_when_parsed(spec):
    with pytest.raises(ConfigError):
        parse_spec(spec)
