"""Offline models a controller may take from profiling, built from the simulator's profiles.

Heracles (Sec. 4.4) needs "an offline model that describes the DRAM bandwidth used by the
latency-sensitive workloads at various loads, core, and LLC allocations". On a lab server that
model comes from profiling runs; in simulation we profile the app's deployment in the simulator
the same way: the app alone, pinned to c cores with w exclusive ways at turbo frequency, at each
load of a grid, and we read its memory bandwidth. One batched kernel call measures the whole grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.interpolate import RegularGridInterpolator

from env.sim import model as M
from env.sim.experiments import Setup, analytic_outputs, pinned
from env.sim.scenario import Scenario, simple_scenario

LOADS = np.round(np.arange(0.0, 1.501, 0.05), 3)


@dataclass(frozen=True)
class LcBandwidthModel:
    """`model(load_frac, cores, llc_ways) -> GB/s`: linear interpolation in a profiled grid."""

    app: str
    loads: np.ndarray
    cores: np.ndarray
    ways: np.ndarray
    gbps: np.ndarray  # (loads, cores, ways)
    _interp: RegularGridInterpolator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        interp = RegularGridInterpolator(
            (self.loads, self.cores, self.ways), self.gbps, bounds_error=False, fill_value=None
        )
        object.__setattr__(self, "_interp", interp)

    def __call__(self, load_frac: float, cores: float, llc_ways: int) -> float:
        x = np.clip(
            [load_frac, cores, llc_ways],
            [self.loads[0], self.cores[0], self.ways[0]],
            [self.loads[-1], self.cores[-1], self.ways[-1]],
        )
        return float(max(0.0, self._interp(x)[0]))


def lc_bandwidth_model(scenario: Scenario, app: str) -> LcBandwidthModel:
    """Profile `app` as deployed in `scenario` (same profile, overrides and platform)."""
    entry = next((e for e in scenario.apps if e.instance == app), None)
    if entry is None:
        raise KeyError(f"{app!r} is not an LC app of scenario {scenario.name!r}")
    pl = scenario.platform_spec
    key = f"{entry.app}:{app}" if entry.name else entry.app
    solo = simple_scenario(
        {key: 0.5},
        platform=scenario.platform,
        be=(),
        overrides={app: dict(entry.overrides)} if entry.overrides else None,
    )
    cores = np.arange(1, pl.cores + 1, dtype=float)
    ways = np.arange(pl.llc.min_ways, pl.llc.ways + 1, dtype=float)
    setups = [Setup(solo, pinned({app: int(c)}, ways={app: int(w)})) for c in cores for w in ways]
    out, _, lc = analytic_outputs(setups, LOADS)
    idx = int(np.argmax(lc[0, 0]))
    gbps = out[:, :, idx, M.O_MBW].reshape(len(cores), len(ways), len(LOADS)).transpose(2, 0, 1)
    return LcBandwidthModel(app, LOADS, cores, ways, np.ascontiguousarray(gbps))
