"""env.allocations.lean_start: the fair start with up to k LC cores and LLC ways given to the BE job."""

from __future__ import annotations

import numpy as np
import pytest

from env.allocations import fair_allocation, lean_start
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import validate_allocation

CAPS = SimNode(
    simple_scenario({"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}, duration_s=5.0, warmup_s=1.0)
).capabilities()
LC = [a.name for a in CAPS.lc_apps]
BE = CAPS.be_apps[0].name


def _units(alloc, names):
    return sum(alloc[n].cores for n in names), sum(alloc[n].llc_ways for n in names)


def test_zero_moves_is_the_fair_start():
    assert lean_start(CAPS, np.random.default_rng(0), 0) == fair_allocation(CAPS)


def test_lc_units_go_to_the_be_job_and_every_start_is_valid():
    fair = fair_allocation(CAPS)
    fair_cores, fair_ways = _units(fair, LC)
    moved = []
    for seed in range(30):
        a = lean_start(CAPS, np.random.default_rng(seed), 8)
        validate_allocation(a, CAPS)
        cores, ways = _units(a, LC)
        lost_cores, lost_ways = fair_cores - cores, fair_ways - ways
        assert lost_cores >= 0 and lost_ways >= 0
        assert a[BE].cores - fair[BE].cores == lost_cores and a[BE].llc_ways - fair[BE].llc_ways == lost_ways
        assert lost_cores / CAPS.core_step + lost_ways <= 8
        assert all(a[n].freq_mhz == fair[n].freq_mhz and a[n].memory_gb == fair[n].memory_gb for n in LC)
        moved.append(lost_cores / CAPS.core_step + lost_ways)
        assert a == lean_start(CAPS, np.random.default_rng(seed), 8)  # the generator decides everything
    assert min(moved) < 4 < max(moved)  # 0..8 units: starts near the fair one and far from it


def test_an_app_at_its_minimum_is_skipped():
    a = lean_start(CAPS, np.random.default_rng(1), 400)
    validate_allocation(a, CAPS)
    assert all(a[n].cores == CAPS.core_step and a[n].llc_ways == CAPS.min_llc_ways for n in LC)


def test_negative_moves_refused():
    with pytest.raises(ValueError, match="max_moves"):
        lean_start(CAPS, np.random.default_rng(0), -1)
