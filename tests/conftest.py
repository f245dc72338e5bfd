"""Shared fixtures. Tests import the project from the repository root."""

from __future__ import annotations

import pytest

from env.sim.platform import load_platform


@pytest.fixture(scope="session")
def parties_caps():
    """Capabilities of the PARTIES platform running three LC apps and the BE job."""
    from env.types import AppSpec

    apps = (
        AppSpec("memcached", "lc", 600.0, 1.28e6),
        AppSpec("xapian", "lc", 5000.0, 8000.0),
        AppSpec("nginx", "lc", 10000.0, 560000.0),
        AppSpec("be_parties", "be"),
    )
    return load_platform("parties").capabilities(apps)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session for the whole test run (starting Ray takes seconds; two sessions in
    one process do not mix)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
