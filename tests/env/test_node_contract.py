"""The Node contract (DESIGN §3, §6.9), shared by every node: `SimNode`, `LinuxNode` on fake cgroup
v1 and v2 trees, and every node wrapper of the serving layer around them.

* `apply` validates first: an invalid allocation raises `AllocationError` before anything is
  written (the allocation in force, and on a LinuxNode every file of the tree, unchanged);
* read-back: `apply` returns what is really in force, and `current_allocation()` agrees with it;
  a node that writes returns exactly the valid allocation it was given;
* `close` restores what the node found and is idempotent;
* `observe` never reports a zero for a missing sample: a missing latency is NaN and marked invalid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from env.allocations import fair_allocation
from env.node import Node
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import Allocation, AllocationError
from hw.config import CoresConfig
from hw.linux_node import LinuxNode
from tests.fakes import FakeFeed, FakeHost, ManualClock, linux_config, make_v1_host, make_v2_host


@dataclass
class Subject:
    """A node under test and how to look at what it has written."""

    node: Node
    state: Callable[[], object]  # everything the node could have written (compared before/after)
    writes: bool = True  # False: a dry run, which applies nothing
    missing_sample: Callable[[], None] | None = None  # make the next observation miss a sample
    found: object = None  # the state before the node started (None: nothing outside the node)


def _tree(host: FakeHost) -> Callable[[], object]:
    roots = [host.cgroup_root, host.resctrl_root]
    return lambda: {str(p): p.read_text() for r in roots for p in sorted(r.rglob("*")) if p.is_file()}


def sim_subject(tmp_path: Path) -> Subject:
    node = SimNode(simple_scenario({"memcached": 0.3, "nginx": 0.3}), seed=0)
    return Subject(node, lambda: node.current_allocation())


def linux_subject(tmp_path: Path, kind: str) -> Subject:
    clock = ManualClock()
    feed = FakeFeed(clock)
    if kind == "v1":
        host = make_v1_host(tmp_path)
        cfg = linux_config(host, tmp_path)
    else:
        host = make_v2_host(tmp_path)
        cfg = linux_config(
            host,
            tmp_path,
            knobs=("core", "mem", "disk"),
            cores=CoresConfig(mode="quota", quota_step_cores=0.25),
        )
    tree = _tree(host)
    found = tree()
    node = LinuxNode(cfg, feed=feed, clock=clock, monotonic=clock, fs=host.fs)
    node.reset()

    def silent_feed() -> None:  # no reading for an interval and more: the sample is missing
        clock.advance(2.0)

    return Subject(node, tree, missing_sample=silent_feed, found=found)


FACTORIES: dict[str, Callable[[Path], Subject]] = {
    "sim": sim_subject,
    "linux-v1": lambda p: linux_subject(p, "v1"),
    "linux-v2-quota": lambda p: linux_subject(p, "v2"),
}


@pytest.fixture(params=sorted(FACTORIES))
def subject(request, tmp_path) -> Iterator[Subject]:
    s = FACTORIES[request.param](tmp_path)
    yield s
    s.node.close()


def a_change(node: Node) -> Allocation:
    """A valid allocation other than the one in force: one core step moved from BE to an LC app."""
    caps = node.capabilities()
    cur = node.current_allocation()
    lc, be = caps.lc_apps[0].name, caps.be_apps[0].name
    step = caps.core_step
    if cur[be].cores >= step:
        return cur.replace_app(lc, cores=cur[lc].cores + step).replace_app(be, cores=cur[be].cores - step)
    return cur.replace_app(lc, cores=cur[lc].cores - step).replace_app(be, cores=cur[be].cores + step)


def test_is_a_node(subject):
    assert isinstance(subject.node, Node)


def test_invalid_allocation_raises_before_any_write(subject):
    node = subject.node
    before_alloc, before_state = node.current_allocation(), subject.state()
    caps = node.capabilities()
    lc = caps.lc_apps[0].name
    for bad in (
        before_alloc.replace_app(lc, cores=caps.cores + 1.0),  # more cores than the node has
        before_alloc.replace_app(lc, memory_gb=-1.0),
        before_alloc.replace_app(lc, freq_mhz=caps.freq_levels_mhz[0] + 1),  # not a frequency level
    ):
        with pytest.raises(AllocationError):
            node.apply(bad)
        assert node.current_allocation() == before_alloc
        assert subject.state() == before_state


def test_read_back_equals_what_was_applied(subject):
    node = subject.node
    target = a_change(node)
    got = node.apply(target)
    assert node.current_allocation() == got
    if subject.writes:
        assert got == target
        assert subject.state() != {}  # something is in force
    back = node.apply(fair_allocation(node.capabilities()))
    assert node.current_allocation() == back


def test_close_restores_and_is_idempotent(tmp_path):
    for name, factory in sorted(FACTORIES.items()):
        s = factory(tmp_path / name)
        s.node.apply(a_change(s.node))
        s.node.close()
        s.node.close()
        if s.found is not None:  # a simulated node has nothing outside itself to restore
            assert s.state() == s.found, name


def test_observe_never_reports_zero_for_a_missing_sample(subject):
    obs = subject.node.observe()
    for sample in obs.apps:
        if sample.valid:
            assert math.isfinite(sample.p99_us) and sample.p99_us > 0.0
        else:
            assert math.isnan(sample.p99_us)
    if subject.missing_sample is not None:
        subject.missing_sample()
        obs = subject.node.observe()
        assert not obs.valid
        for sample in obs.apps:
            assert not sample.valid and math.isnan(sample.p99_us) and sample.p99_us != 0.0
