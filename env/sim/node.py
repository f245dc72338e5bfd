"""`SimNode`: the `Node` protocol over one simulated server (DESIGN §3, §4).

Time is a `SimClock`. `reset` starts the scenario at t = 0 with the initial allocation (PARTIES'
fair start unless told otherwise) and simulates the first interval. `observe` simulates every
interval up to the clock's `now()` with the allocation in force and returns the last one;
`apply` validates, diffs (thread migrations and CLOS changes cost a little, see env.sim.model) and
takes effect from the next interval. `step(allocation)` is apply + one interval + observe, the fast
path used by the Gymnasium env and the benchmarks.

`SimFleet` is the batched mode: B `SimNode`s are views over one `SimBatch`, so one kernel call
advances all of them while each keeps the exact observation code of a single node.

An interval with no request (a lightly loaded slow app such as Sphinx at 14 rps x 10%) reports
`requests = 0` and the app's expected p99 over that interval.

Each `AppSample` carries the interval's latency histogram (`env.histogram`): the latencies of the
requests seen, drawn from the model's own distribution for the interval
(`engine.interval_histogram`), from a generator of its own, so that turning histograms off
(`histograms=False`, for training, where only the p99 is observed) changes no other draw.

With `sub_interval_s` set (e.g. 0.1, the sampling period of PARTIES' own code), each `AppSample`
also carries the p99 of every sub-interval of that length (`engine.sub_interval_p99s`), drawn from
a third generator of its own: turning them on changes no other draw either.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from env.allocations import fair_allocation
from env.node import SimClock
from env.sim import model as M
from env.sim.engine import (
    Layout,
    SimBatch,
    alloc_rows,
    be_alone_progress,
    build_layout,
    interval_histogram,
    lc_profile_of,
    sub_interval_p99s,
)
from env.sim.scenario import Scenario, load_scenario
from env.types import (
    Allocation,
    AppSample,
    AppSpec,
    BeSample,
    Capabilities,
    Observation,
    Usage,
    validate_allocation,
)

_CHUNK = 512  # intervals of load precomputed at a time


class SimNode:
    """The `Node` protocol over one simulated server running `scenario` (module docstring); `seed`
    drives its noise (default: the scenario's seed)."""

    def __init__(
        self,
        scenario: Scenario | str,
        *,
        seed: int | None = None,
        clock: SimClock | None = None,
        initial: Callable[[Capabilities], Allocation] = fair_allocation,
        histograms: bool = True,
        sub_interval_s: float | None = None,
        _batch: SimBatch | None = None,
        _index: int = 0,
    ) -> None:
        self._histograms = histograms
        self._sub_interval_s = sub_interval_s
        self._batch = _batch
        self._index = _index
        self._clock = clock or SimClock()
        self._initial = initial
        self._scenario = load_scenario(scenario) if isinstance(scenario, str) else scenario
        self._seed = self._scenario.seed if seed is None else seed
        self._obs: Observation | None = None
        self.reset(self._seed, self._scenario)

    # ---- Node protocol ---------------------------------------------------------------------------
    @property
    def clock(self) -> SimClock:
        return self._clock

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    def capabilities(self) -> Capabilities:
        return self._caps

    def current_allocation(self) -> Allocation:
        return self._alloc

    def reset(
        self,
        seed: int | None = None,
        scenario: Scenario | str | None = None,
        *,
        initial: Callable[[Capabilities], Allocation] | None = None,
    ) -> Observation:
        """Start `scenario` (default: the current one) at t = 0 with seed `seed`, from `initial`'s
        allocation (default: the node's own start, PARTIES' fair start unless told otherwise)."""
        if scenario is not None:
            self._scenario = load_scenario(scenario) if isinstance(scenario, str) else scenario
        scn = self._scenario
        self._seed = scn.seed if seed is None else seed
        rng = np.random.default_rng(self._seed)
        self._hist_rng = np.random.default_rng([self._seed, 2])
        self._sub_rng = np.random.default_rng([self._seed, 3])
        self._layout: Layout = build_layout(scn)
        lay = self._layout
        if self._batch is None:
            self._sim = SimBatch([lay], rng)
        else:
            self._sim = self._batch
            self._sim.set_layout(self._index, lay)
            self._sim.set_rng(self._index, rng)  # draws identical to a standalone node's
        self._traces = [t.build(rng) for t in scn.traces]
        self._profiles = [lc_profile_of(scn, i) for i in range(len(scn.apps))]
        self._max_rps = np.array([p.max_load_rps for p in self._profiles])
        apps = [
            AppSpec(
                name=e.instance,
                kind="lc",
                qos_target_us=p.qos_target_us,
                max_load_rps=p.max_load_rps,
                stateless=p.stateless,
                in_memory=p.in_memory,
            )
            for e, p in zip(scn.apps, self._profiles)
        ]
        apps += [AppSpec(name=b, kind="be") for b in scn.be]
        pl = lay.platform
        self._dt = pl.interval_s
        self._n_sub = _sub_intervals(self._dt, self._sub_interval_s)
        self._caps = pl.capabilities(apps)
        self._be_norm = {
            b: be_alone_progress(lay.components[idx[0]].profile, scn.platform) for b, idx in lay.be.items()
        }
        self._lc_idx = np.array(lay.lc, dtype=int)
        self._lc_list = list(lay.lc)
        self._names = [c.entity for c in lay.components]
        self._targets = [p.qos_target_us for p in self._profiles]
        self._load_t0 = -1
        self._loads = np.zeros((len(self._lc_idx), 0))
        self._k = 0  # intervals simulated
        self._clock.reset()
        self._alloc = (initial or self._initial)(self._caps)
        validate_allocation(self._alloc, self._caps)
        self._sim.set_alloc_rows(self._index, alloc_rows(lay, self._alloc, None))
        self._obs = self._advance()
        self._clock.sleep_until(self._k * self._dt)
        return self._obs

    def apply(self, allocation: Allocation) -> Allocation:
        if allocation is self._alloc:
            return allocation
        validate_allocation(allocation, self._caps)
        self._sim.set_alloc_rows(self._index, alloc_rows(self._layout, allocation, self._alloc))
        self._alloc = allocation
        return allocation

    def observe(self) -> Observation:
        while self._k * self._dt < self._clock.now() - 1e-9:
            self._obs = self._advance()
        assert self._obs is not None
        return self._obs

    def close(self) -> None:
        """Nothing to restore in simulation; idempotent."""

    # ---- fast path --------------------------------------------------------------------------------
    def step(self, allocation: Allocation | None = None) -> Observation:
        """Apply `allocation` (if given), simulate one interval, return its observation."""
        if allocation is not None:
            self.apply(allocation)
        self._clock.sleep_until((self._k + 1) * self._dt)
        return self.observe()

    @property
    def time_s(self) -> float:
        return self._k * self._dt

    def tail_at_target(self) -> dict[str, float]:
        """Ground truth for the last interval: P(latency > QoS target) per LC app (not observable on
        a real node; used by calibration and analysis)."""
        out = self._sim.a["out"][self._index]
        return {self._layout.components[w].entity: float(out[w, M.O_TAIL_T]) for w in self._lc_idx}

    # ---- internals ---------------------------------------------------------------------------------
    def _load_fracs(self, k: int) -> np.ndarray:
        if not (self._load_t0 <= k < self._load_t0 + self._loads.shape[1]):
            self._load_t0 = k
            t = (k + np.arange(_CHUNK) + 0.5) * self._dt
            self._loads = (
                np.stack([tr.values(t) for tr in self._traces]) if self._traces else np.zeros((0, _CHUNK))
            )
        return self._loads[:, k - self._load_t0]

    def _prepare(self) -> None:
        """Set this node's offered load for the next interval in the shared batch."""
        frac = self._load_fracs(self._k)
        self._frac, self._lam_rps = frac, frac * self._max_rps
        self._sim.lam[self._index, self._lc_idx] = self._lam_rps

    def _finish(self) -> Observation:
        """Account for the interval the batch just simulated and build its observation."""
        self._k += 1
        self._obs = self._observation(self._frac, self._lam_rps)
        return self._obs

    def _advance(self) -> Observation:
        self._prepare()
        # no request in an interval: report the expected p99 (module docstring)
        self._sim.step(empty_u=0.99, index=None if self._batch is None else self._index)
        return self._finish()

    def _observation(self, frac: np.ndarray, lam_rps: np.ndarray) -> Observation:
        a, i = self._sim.a, self._index
        n = self._layout.n
        out = a["out"][i, :n].tolist()  # plain floats: cheaper than numpy scalars per field
        nout = a["nout"][i].tolist()
        arr = a["arrivals"][i, :n].tolist()
        dist = a["dist"][i]
        fr, lam = frac.tolist(), lam_rps.tolist()
        samples = []
        for j, w in enumerate(self._lc_list):
            o = out[w]
            hist = interval_histogram(dist[w], int(arr[w]), self._hist_rng) if self._histograms else None
            sub = sub_interval_p99s(dist[w], int(arr[w]), self._n_sub, self._sub_rng) if self._n_sub else ()
            samples.append(
                AppSample(
                    name=self._names[w],
                    p99_us=o[M.O_P99] * 1e6,
                    target_us=self._targets[j],
                    load_rps=lam[j],
                    load_frac=fr[j],
                    served_rps=o[M.O_SERVED],
                    dropped_rps=o[M.O_DROPPED],
                    requests=int(arr[w]),
                    usage=_usage(o),
                    histogram=hist,
                    sub_p99_us=tuple(x * 1e6 for x in sub),
                )
            )
        bes = []
        for name, idx in self._layout.be.items():
            rows = [out[w] for w in idx]
            bes.append(
                BeSample(
                    name=name,
                    throughput=sum(r[M.O_PROG] for r in rows) / self._be_norm[name],
                    usage=Usage(
                        cpu_util=min(1.0, sum(r[M.O_UTIL] for r in rows)),  # busy time, quota included
                        llc_mb=sum(r[M.O_LLC] for r in rows),
                        mem_bw_gbps=sum(r[M.O_MBW] for r in rows),
                        memory_gb=sum(r[M.O_MEM] for r in rows),
                        disk_mbps=sum(r[M.O_DISK] for r in rows),
                        net_gbps=sum(r[M.O_NET] for r in rows),
                        freq_mhz=rows[0][M.O_FREQ],
                    ),
                )
            )
        return Observation(
            time_s=self._k * self._dt,
            interval_s=self._dt,
            apps=tuple(samples),
            be=tuple(bes),
            allocation=self._alloc,
            mem_bw_gbps=nout[M.N_MBW],
            power_w=nout[M.N_POWER],
        )


def _sub_intervals(interval_s: float, sub_interval_s: float | None) -> int:
    """How many sub-intervals of `sub_interval_s` make one interval (0: none); the interval must
    hold a whole number of them."""
    if sub_interval_s is None:
        return 0
    n = round(interval_s / sub_interval_s) if sub_interval_s > 0 else 0
    if n < 1 or abs(n * sub_interval_s - interval_s) > 1e-9 * interval_s:
        raise ValueError(
            f"sub_interval_s = {sub_interval_s}: must divide the node's interval ({interval_s} s) evenly"
        )
    return n


def _usage(o: list[float]) -> Usage:
    return Usage(
        cpu_util=o[M.O_UTIL],
        llc_mb=o[M.O_LLC],
        mem_bw_gbps=o[M.O_MBW],
        memory_gb=o[M.O_MEM],
        disk_mbps=o[M.O_DISK],
        net_gbps=o[M.O_NET],
        freq_mhz=o[M.O_FREQ],
    )


class SimFleet:
    """B simulated nodes stepped by one kernel call (the batched mode, DESIGN §4).

    `nodes[i]` is a full `SimNode` (capabilities, allocation, observations) whose physics runs in
    slot i of a shared `SimBatch` with its own random stream, so node i behaves exactly like a
    standalone `SimNode` with the same scenario and seed. `step` applies one allocation per node (None keeps it) and
    advances all nodes one interval; `reset(i, ...)` restarts one node with a new scenario.
    """

    def __init__(
        self,
        scenarios: list[Scenario],
        seed: int = 0,
        *,
        width: int = 8,
        initial: Callable[[Capabilities], Allocation] = fair_allocation,
        histograms: bool = True,
    ) -> None:
        if not scenarios:
            raise ValueError("a fleet needs at least one scenario")
        self._ss = np.random.SeedSequence(seed)
        seeds = self._ss.spawn(len(scenarios) + 1)
        self.batch = SimBatch([build_layout(s) for s in scenarios], np.random.default_rng(seeds[0]), width)
        self.nodes = [
            SimNode(
                s,
                seed=int(sd.generate_state(1)[0]),
                initial=initial,
                histograms=histograms,
                _batch=self.batch,
                _index=i,
            )
            for i, (s, sd) in enumerate(zip(scenarios, seeds[1:]))
        ]

    def __len__(self) -> int:
        return len(self.nodes)

    def reset(
        self,
        i: int,
        seed: int | None = None,
        scenario: Scenario | str | None = None,
        *,
        initial: Callable[[Capabilities], Allocation] | None = None,
    ) -> Observation:
        return self.nodes[i].reset(seed, scenario, initial=initial)

    def step(self, allocations: list[Allocation | None] | None = None) -> list[Observation]:
        allocations = allocations or [None] * len(self.nodes)
        if len(allocations) != len(self.nodes):
            raise ValueError(f"got {len(allocations)} allocations for {len(self.nodes)} nodes")
        for node, alloc in zip(self.nodes, allocations):
            if alloc is not None:
                node.apply(alloc)
            node._prepare()
        self.batch.step(empty_u=0.99)
        out = []
        for node in self.nodes:
            node.clock.sleep_until((node._k + 1) * node._dt)
            out.append(node._finish())
        return out
