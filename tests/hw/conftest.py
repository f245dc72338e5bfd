"""Fixtures of the hw tests: fake hosts, a hand-moved clock and a fake latency feed (tests.fakes)."""

from __future__ import annotations

import pytest

from tests.fakes import FakeFeed, FakeHost, ManualClock, make_v1_host, make_v2_host


@pytest.fixture
def v1_host(tmp_path) -> FakeHost:
    return make_v1_host(tmp_path)


@pytest.fixture
def v2_host(tmp_path) -> FakeHost:
    return make_v2_host(tmp_path)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def feed(clock) -> FakeFeed:
    return FakeFeed(clock)


@pytest.fixture
def host_factory():
    """make_v1_host / make_v2_host for tests that need a variant (pass the kind)."""
    return {"v1": make_v1_host, "v2": make_v2_host}
