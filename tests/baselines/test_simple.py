"""`static` and `static:FILE.yaml` (baselines.simple): the fair start, or the fair start with a
file's per-app values, held; bad files fail before any run with the entry named."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.simple import StaticController, load_static_overrides, static_allocation
from env.allocations import fair_allocation
from env.config import ConfigError
from env.controller import ControllerContext
from env.loop import run_episode
from env.sim.node import SimNode
from env.sim.scenario import load_scenario
from harness.registry import make_controller


@pytest.fixture(scope="module")
def vm_node():
    return SimNode(load_scenario("vm-mix"), seed=0)


def write(tmp_path, text: str):
    p = tmp_path / "split.yaml"
    p.write_text(text)
    return p


def test_a_static_file_sets_the_named_fields_and_leaves_the_rest_fair(tmp_path, vm_node):
    caps = vm_node.capabilities()
    path = write(
        tmp_path,
        "nginx-vm: {cores: 1.5}\nmemcached-vm: {cores: 0.25}\nbe_stress_cpu2: {cores: 0.25, cpu_shares: 2}\n",
    )
    ctl = make_controller(f"static:{path}", ControllerContext(caps))
    ctl.reset(caps, np.random.default_rng(0))
    fair = fair_allocation(caps)
    records = run_episode(vm_node, ctl, 3.0, rng=np.random.default_rng(0))
    held = {a.name: a for a in records[-1].alloc}  # in force during the last interval
    cores = {name: a.cores for name, a in held.items()}
    assert cores == {"nginx-vm": 1.5, "memcached-vm": 0.25, "be_stress_cpu2": 0.25}
    assert held["be_stress_cpu2"].cpu_shares == 2
    assert held["nginx-vm"].cpu_shares == fair["nginx-vm"].cpu_shares
    assert held["nginx-vm"].memory_gb == fair["nginx-vm"].memory_gb
    assert fair["nginx-vm"].cores != 1.5  # the file changed something


def test_plain_static_is_the_fair_start(vm_node):
    caps = vm_node.capabilities()
    ctl = make_controller("static", ControllerContext(caps))
    assert isinstance(ctl, StaticController)
    assert static_allocation(caps, {}) == fair_allocation(caps)


@pytest.mark.parametrize(
    "text, said",
    [
        ("nginx-vm: {corez: 1}\n", "nginx-vm.corez: unknown key"),
        ("nginx-vm: {cores: lots}\n", "nginx-vm.cores: expected a number"),
        ("nginx-vm: {cpu_shares: 2.5}\n", "nginx-vm.cpu_shares: expected an integer"),
        ("nginx-vm: 1.5\n", "nginx-vm: expected a mapping of fields"),
        ("- nginx-vm\n", "expected a mapping of app names"),
    ],
)
def test_a_malformed_static_file_is_a_config_error_naming_the_entry(tmp_path, text, said):
    with pytest.raises(ConfigError, match=said):
        load_static_overrides(write(tmp_path, text))


def test_an_unknown_app_or_an_allocation_the_node_cannot_hold_fails_when_the_spec_is_built(tmp_path, vm_node):
    caps = vm_node.capabilities()
    ctx = ControllerContext(caps)
    unknown = write(tmp_path, "nginx: {cores: 1.5}\n")
    with pytest.raises(ConfigError, match="no app 'nginx' on this node; its apps: memcached-vm, nginx-vm"):
        make_controller(f"static:{unknown}", ctx)
    too_much = write(tmp_path, "nginx-vm: {cores: 1.75}\nmemcached-vm: {cores: 1.0}\n")  # 2.75 of 2 cores
    with pytest.raises(ConfigError, match="the node cannot hold this allocation"):
        make_controller(f"static:{too_much}", ctx)
