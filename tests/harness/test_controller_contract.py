"""The controller contract (DESIGN §3, §6.9), shared by every spec in harness.registry that can be
built on a simulated node: reset, then one decide() per tick on real observations; a Decision whose
allocation is None or valid; no sleeping and no I/O inside decide(); the same decisions for the same
seed; an invalid observation (failed latency feed) handled without crashing.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import os
import socket
import subprocess
import time

import numpy as np
import pytest

from env.controller import Controller, ControllerContext
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Decision, Move, validate_allocation
from harness.registry import contract_specs, make_controller
from tests.fakes import no_io

SPECS = [*contract_specs(), "parties:code"]  # the code variant, on a node without sub-intervals here
SCENARIOS = {
    "light": {"memcached": 0.2, "xapian": 0.1, "nginx": 0.2},
    "heavy": {"memcached": 0.7, "xapian": 0.5, "nginx": 0.6},
}
TICKS = 60


def make(spec: str, loads: dict[str, float], seed: int = 0):
    scn = simple_scenario(loads, duration_s=TICKS * 0.5, warmup_s=5.0, seed=seed)
    node = SimNode(scn, seed=seed)
    ctrl = make_controller(spec, ControllerContext(node.capabilities(), scn, node, seed))
    ctrl.reset(node.capabilities(), np.random.default_rng(seed))
    return node, ctrl


def drive(node: SimNode, ctrl: Controller, ticks: int = TICKS) -> list[Decision]:
    caps = node.capabilities()
    out = []
    for _ in range(ticks):
        obs = node.observe()
        with no_io():
            d = ctrl.decide(obs)
        assert isinstance(d, Decision), f"{type(d)} is not a Decision"
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
        if d.move is not None:
            assert isinstance(d.move, Move)
        assert isinstance(d.reason, str)
        out.append(d)
        node.step(d.allocation)
    return out


def test_the_patches_really_forbid_io():
    with no_io():
        for f in (lambda: time.sleep(0), lambda: builtins.open(os.devnull).close(), lambda: socket.socket()):
            with pytest.raises(AssertionError):
                f()
        with pytest.raises(AssertionError):
            subprocess.run(["true"])


def test_registry_has_contract_specs():
    assert {"unmanaged", "static"} <= set(SPECS)


@pytest.mark.parametrize("load", sorted(SCENARIOS))
@pytest.mark.parametrize("spec", SPECS)
def test_decisions_are_valid_and_pure(spec, load):
    node, ctrl = make(spec, SCENARIOS[load])
    assert isinstance(ctrl, Controller) and isinstance(ctrl.name, str) and ctrl.name
    drive(node, ctrl)


@pytest.mark.parametrize("spec", SPECS)
def test_deterministic_for_a_seed(spec):
    def trace(seed):
        node, ctrl = make(spec, SCENARIOS["heavy"], seed)
        return [(d.allocation, d.move, d.app, d.reason) for d in drive(node, ctrl, 40)]

    assert trace(3) == trace(3)


@pytest.mark.parametrize("spec", SPECS)
def test_invalid_observations_do_not_crash(spec):
    node, ctrl = make(spec, SCENARIOS["heavy"])
    caps = node.capabilities()
    drive(node, ctrl, 10)
    obs = node.observe()
    dead = tuple(dataclasses.replace(s, p99_us=math.nan, valid=False) for s in obs.apps)
    for bad in (
        dataclasses.replace(obs, apps=dead),
        dataclasses.replace(obs, apps=(dead[0], *obs.apps[1:])),
        dataclasses.replace(obs, valid=False, stale_s=5.0),
    ):
        with no_io():
            d = ctrl.decide(bad)
        assert isinstance(d, Decision)
        if d.allocation is not None:
            validate_allocation(d.allocation, caps)
    # and it carries on normally afterwards
    drive(node, ctrl, 5)


def test_registry_parses_specs_strictly(monkeypatch):
    from env.config import ConfigError
    from harness import registry as R

    monkeypatch.setitem(R.REGISTRY, "needs", R.Entry(R._static, "x", arg="PATH"))
    monkeypatch.setitem(R.REGISTRY, "maybe", R.Entry(R._static, "x", arg="CFG", optional_arg=True))
    monkeypatch.setitem(R.REGISTRY, "simonly", R.Entry(R._static, "x", needs_sim=True))
    assert R.parse_spec("static") == ("static", None)
    assert R.parse_spec("needs:a/b.pt") == ("needs", "a/b.pt")
    assert R.parse_spec("maybe") == ("maybe", None) and R.parse_spec("maybe:c.yaml") == ("maybe", "c.yaml")
    for bad, msg in (
        ("statik", "did you mean 'static'"),
        ("needs", "needs an argument: needs:PATH"),
        ("unmanaged:x", "takes no argument"),
        ("maybe:", "empty argument"),
    ):
        with pytest.raises(ConfigError, match=msg):
            R.parse_spec(bad)
    with pytest.raises(ConfigError, match="given twice"):
        R.parse_specs("static,static")
    with pytest.raises(ConfigError, match="comma-separated"):
        R.parse_specs("static,,unmanaged")
    assert "maybe[:CFG]" in R.known_specs() and "needs:PATH" in R.known_specs()
    node, _ = make("static", SCENARIOS["light"])
    with pytest.raises(ConfigError, match="needs the simulator"):
        R.make_controller("simonly", ControllerContext(node.capabilities()))
    assert R.make_controller("simonly", ControllerContext(node.capabilities(), sim=node)).name == "static"
