"""The papers' measurement set-ups, runnable two ways on the same simulator code.

A `Setup` is a scenario (apps, BE jobs, antagonists, platform) plus a fixed allocation. The
characterisation experiments of PARTIES Sec. 3 (Fig. 1, Tables 2 and 4) measure one p99 over a
1-minute run (Sec. 3.2), so QoS is met when the p99 of all requests of the 60 s window (after a 30 s
warm-up) is within the target. A set-up can be evaluated

* *sampled*: run on a `SimNode` (Poisson arrivals, backlog, lags). Over the window, the number of
  requests slower than the target is Binomial(N, p) with p the request-weighted probability of the
  intervals' latency distributions; the window p99 meets the target iff that count is at most
  N - quantile_rank(0.99, N) (`env.metrics.allowed_over`, the referee's own count). This is what the
  calibration report uses.
* *analytic*: the deterministic steady state of the same kernel, many set-ups and loads in one
  batched call, with P(the window p99 meets the target) from the same order statistic
  (`engine.meet_probability`); a load is met when that probability is >= 1/2. This is what the
  fitting script optimises (smooth and noise-free).

Max-load searches follow PARTIES Sec. 3.3/Table 4: loads in 10% steps from 10% up; the result is
the highest load before the first failure (0 when even 10% fails). Controllers are judged by the
referee of DESIGN §5 (`env.metrics`), not by these tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from env.histogram import LatencyHistogram, merge
from env.metrics import TAIL_Q, allowed_over
from env.sim import model as M
from env.sim.engine import Layout, alloc_rows, build_layout, component_rows, meet_probability, platform_row
from env.sim.node import SimNode
from env.sim.platform import load_platform
from env.sim.profiles import load_lc_profile
from env.sim.scenario import AntagonistEntry, Scenario, simple_scenario
from env.types import Allocation, AppAlloc, Capabilities

WARMUP_S = 30.0
MEASURE_S = 60.0
MEET_THRESHOLD = 0.5  # analytic: the window p99 meets the target more often than not


@dataclass(frozen=True)
class Setup:
    """A scenario at some load with a fixed allocation built from the node's capabilities."""

    scenario: Scenario
    allocation: Callable[[Capabilities], Allocation]
    label: str = ""

    def at_loads(self, loads: dict[str, float]) -> Setup:
        return dataclasses.replace(self, scenario=self.scenario.with_loads(loads))


# ---- allocations used by the papers' characterisation experiments --------------------------------
def pinned(
    cores: dict[str, float],
    *,
    ways: dict[str, int] | None = None,
    mba: dict[str, int] | None = None,
    freq_mhz: dict[str, int] | None = None,
    memory_gb: dict[str, float] | None = None,
    disk_mbps: dict[str, float] | None = None,
    net_gbps: dict[str, float] | None = None,
    shared_llc: bool = False,
) -> Callable[[Capabilities], Allocation]:
    """Each named app on its own cores; everything not given is the whole node (no partition).
    `shared_llc`: every app in one CLOS holding all ways (no CAT), as in PARTIES Sec. 3.3."""

    def build(caps: Capabilities) -> Allocation:
        top = caps.freq_levels_mhz[-1]
        apps = []
        for i, a in enumerate(caps.apps, start=1):
            clos = 0 if shared_llc else min(i, caps.clos_count - 1)
            apps.append(
                AppAlloc(
                    name=a.name,
                    cores=float(cores.get(a.name, 0.0)),
                    core_group=i,
                    llc_ways=(ways or {}).get(a.name, caps.llc_ways),
                    clos=clos,
                    freq_mhz=(freq_mhz or {}).get(a.name, top),
                    memory_gb=(memory_gb or {}).get(a.name, caps.memory_gb),
                    disk_mbps=(disk_mbps or {}).get(a.name, caps.disk_mbps),
                    net_gbps=(net_gbps or {}).get(a.name, caps.net_gbps),
                    mba_pct=(mba or {}).get(a.name, 100),
                )
            )
        return Allocation.of(apps, caps)

    return build


def _reference_threads(app: str) -> dict[str, dict[str, float]]:
    """PARTIES Sec. 3.3: "we instantiate each application with 8 threads" (the profile's threads)."""
    from env.sim.profiles import load_profile

    return {app: {"threads": float(load_profile(app).threads)}}


def alone(
    app: str, *, platform: str = "parties", cores: int | None = None, overrides: dict | None = None, **kw
) -> Setup:
    """The app alone on the node (PARTIES Sec. 3.2 / Fig. 1) in its reference deployment (8
    threads), all resources, no BE job."""
    ov = _reference_threads(app)
    ov[app].update(overrides or {})
    scn = simple_scenario(
        {app: 1.0}, platform=platform, be=(), duration_s=WARMUP_S + MEASURE_S, warmup_s=WARMUP_S, overrides=ov
    )
    n = cores or load_platform(platform).cores
    return Setup(scn, pinned({app: n}, **kw), f"{app} alone")


def with_antagonist(app: str, antagonist: str | None, *, cores: int = 8) -> Setup:
    """PARTIES Sec. 3.3 / Table 4: the app's 8 threads on 8 physical cores, the antagonist of
    Table 3 on the remaining cores or on the app's hyperthreads, no cache partitioning."""
    ants = (AntagonistEntry(f"ant_{antagonist}", app),) if antagonist else ()
    scn = simple_scenario(
        {app: 1.0},
        be=(),
        antagonists=ants,
        duration_s=WARMUP_S + MEASURE_S,
        warmup_s=WARMUP_S,
        overrides=_reference_threads(app),
    )
    return Setup(scn, pinned({app: cores}, shared_llc=True), f"{app} + {antagonist or 'nothing'}")


def mongodb_pair(memory_gb: float = 60.0) -> Setup:
    """PARTIES Sec. 5.2.1: two MongoDB instances on one node cannot exceed 160% aggregate load
    (I/O contention on the shared disk). Each gets half the cores, ways and memory; the disk is
    shared without throttling."""
    scn = simple_scenario(
        {"mongodb:mongo_a": 0.5, "mongodb:mongo_b": 0.5},
        be=(),
        duration_s=WARMUP_S + MEASURE_S,
        warmup_s=WARMUP_S,
    )
    half = load_platform("parties").cores // 2
    return Setup(
        scn,
        pinned(
            {"mongo_a": half, "mongo_b": half},
            ways={"mongo_a": 10, "mongo_b": 10},
            memory_gb={"mongo_a": memory_gb, "mongo_b": memory_gb},
        ),
        "two MongoDB instances",
    )


def mongodb_memory(memory_gb: float, disk_mbps: float | None = None) -> Setup:
    """PARTIES Sec. 3.4.2 / Fig. 3: MongoDB alone with a memory limit (and a disk-bandwidth cap)."""
    disk = None if disk_mbps is None else {"mongodb": disk_mbps}
    return alone("mongodb", cores=8, memory_gb={"mongodb": memory_gb}, disk_mbps=disk)


def fig2_setup(app: str, load: float, cores: int, ways: int, freq_mhz: int | None = None) -> Setup:
    """PARTIES Sec. 3.4.1 / Fig. 2a-b: the app alone on `cores` cores and `ways` LLC ways (at
    `freq_mhz`, default the top level: turbo), deployed as on the managed node (a worker thread per
    core of the node, so that every core given can be used)."""
    from env.sim.profiles import load_lc_profile

    prof = load_lc_profile(app)
    ov = {"threads": load_platform("parties").cores} if prof.threads_follow_cores else {}
    freq = None if freq_mhz is None else {app: freq_mhz}
    return alone(app, cores=cores, ways={app: ways}, freq_mhz=freq, overrides=ov).at_loads({app: load})


FUNGIBLE_TUPLES = ((10, 11, 3600), (14, 11, 1800), (14, 2, 2200))  # <cores, ways, MHz> that meet
SMALL_TUPLE = (4, 2, 1200)  # ... and one that does not


def moses_fungibility(cores: int, ways: int, freq_mhz: int) -> Setup:
    """PARTIES Sec. 3.4.3: Moses (14 threads) at 90% load on <cores, ways, frequency>; the paper's
    three `FUNGIBLE_TUPLES` all meet its QoS, a small tuple does not."""
    s = alone(
        "moses", cores=cores, ways={"moses": ways}, freq_mhz={"moses": freq_mhz}, overrides={"threads": 14}
    )
    return s.at_loads({"moses": 0.9})


FIG9_START_LOADS = {"memcached": 0.1, "xapian": 0.2, "moses": 0.1}  # PARTIES Sec. 5.3 / Fig. 9 at 0 s
FIG9_START_MAX_P99_OVER_TARGET = 0.8  # slack > 0.2: PARTIES' downsize threshold (Alg. 1, Sec. 4.3)


def fig9_start() -> Setup:
    """PARTIES Sec. 5.3 / Fig. 9 at its start: Memcached, Xapian and Moses at 10%, 20% and 10% of
    their max loads with the BE job, on PARTIES' fair allocation (Alg. 1 `initialization()`,
    `env.allocations.fair_allocation`: equal cores, ways, memory and disk, nominal frequency). The
    paper: "PARTIES detects a large slack in the tail latency of all services (Memcached first, then
    Moses and Xapian), and decreases their core and cache allocations", i.e. each has more slack
    than the downsize threshold, 0.2, there."""
    from env.allocations import fair_allocation

    scn = simple_scenario(dict(FIG9_START_LOADS), duration_s=WARMUP_S + MEASURE_S, warmup_s=WARMUP_S)
    return Setup(scn, fair_allocation, "PARTIES Fig. 9 start (fair allocation)")


def fig9_start_p99_over_target() -> dict[str, float]:
    """Each Fig. 9 app's p99 / QoS target at `fig9_start` (deterministic steady state)."""
    setup = fig9_start()
    first = next(iter(FIG9_START_LOADS.values()))  # analytic_outputs sets the first app's load
    out, _, lc = analytic_outputs([setup], np.array([first]))
    layout = build_layout(setup.scenario)
    return {
        layout.components[w].entity: float(out[0, 0, w, M.O_P99] * 1e6 / layout.lc_profile(w).qos_target_us)
        for w in layout.lc
        if lc[0, 0, w]
    }


# ---- analytic (deterministic) evaluation ----------------------------------------------------------
@dataclass
class _Packed:
    layout: Layout
    prm: np.ndarray
    alloc: np.ndarray
    lam_frac: np.ndarray  # per component: 1 for LC apps (scaled by load), 0 otherwise
    max_rps: np.ndarray


def _pack(setup: Setup) -> _Packed:
    layout = build_layout(setup.scenario)
    node_caps = layout.platform.capabilities(
        [_spec(c) for c in layout.components if c.kind == "lc"] + [_be_spec(n) for n in layout.be]
    )
    alloc = setup.allocation(node_caps)
    prm = component_rows(layout)
    rows = alloc_rows(layout, alloc, None)
    lam = np.zeros(layout.n)
    max_rps = np.zeros(layout.n)
    for w in layout.lc:
        lam[w] = 1.0
        max_rps[w] = layout.lc_profile(w).max_load_rps
    return _Packed(layout, prm, rows, lam, max_rps)


def _spec(c):
    from env.types import AppSpec

    return AppSpec(c.entity, "lc", c.profile.qos_target_us, c.profile.max_load_rps)


def _be_spec(name):
    from env.types import AppSpec

    return AppSpec(name, "be")


def analytic_outputs(
    setups: Sequence[Setup], loads: np.ndarray, steps: int = 8, sweep_all: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic steady state of every (setup, load) pair in one batched kernel call.
    Returns (out (S, L, W, NO), arrivals per interval (S, L, W), LC mask (S, L, W)). The load axis
    sets the first LC app's load (every LC app's with `sweep_all`); other LC apps keep theirs."""
    loads = np.asarray(loads, dtype=float)
    packs = [_pack(s) for s in setups]
    width = max(p.layout.n for p in packs)
    nb = len(packs) * len(loads)
    arr = M.new_arrays(nb, width)
    lc_mask = np.zeros((nb, width), dtype=bool)
    for i, p in enumerate(packs):
        fixed = np.full(p.layout.n, np.nan) if sweep_all else _fixed_fracs(setups[i], p)
        for j, x in enumerate(loads):
            b = i * len(loads) + j
            arr["plat"][b] = platform_row(p.layout.platform)
            arr["prm"][b, : p.layout.n] = p.prm
            arr["alloc"][b, : p.layout.n] = p.alloc
            frac = np.where(np.isnan(fixed), x, fixed)
            lam = p.lam_frac * frac * p.max_rps
            arr["arrivals"][b, : p.layout.n] = lam * p.layout.platform.interval_s
            lc_mask[b, : p.layout.n] = p.lam_frac > 0
    arr["usample"][:] = np.where(lc_mask, 0.99, np.nan)
    M.step_arrays(arr, steps)
    shape = (len(packs), len(loads))
    dt = arr["plat"][:, M.PL_DT][:, None]
    return (
        arr["out"].reshape(*shape, width, M.NO),
        (arr["arrivals"] / dt).reshape(*shape, width),
        lc_mask.reshape(*shape, width),
    )


KNEE_OF_MAX_RPS = (0.6, 0.8)  # PARTIES Sec. 3.2: max load sits "typically between 60% and 80%" of the max RPS
TARGET_AT_KNEE_MIN = 0.5  # PARTIES Sec. 3.2: the p99 at max load within 2x of the target it defines
OVERLOAD = 3.0  # x max load: far past every app's knee, where the node serves its max RPS and drops the rest


def knee_over_max_rps(apps: Sequence[str]) -> dict[str, float | None]:
    """PARTIES Sec. 3.2 / Fig. 1: load rises "until the application starts dropping requests", and
    tail latency rises rapidly past "a load threshold, typically between 60% and 80% of their
    maximum RPS"; that knee is max load. Per app alone on its reference allocation (the Table 2
    set-up, deterministic steady state): max load over the max RPS, the rate served when offered
    `OVERLOAD` x max load (None if nothing is served)."""
    out, _, lc = analytic_outputs([alone(a) for a in apps], np.array([OVERLOAD]))
    frac: dict[str, float | None] = {}
    for i, app in enumerate(apps):
        w = int(np.argmax(lc[i, 0]))
        served = float(out[i, 0, w, M.O_SERVED])
        frac[app] = load_lc_profile(app).max_load_rps / served if served > 0 else None
    return frac


def analytic_meet(
    setups: Sequence[Setup],
    loads: np.ndarray,
    window_s: float = MEASURE_S,
    steps: int = 8,
    sweep_all: bool = False,
) -> np.ndarray:
    """P(the p99 over a `window_s` run meets every QoS target) for each setup (rows) at each load
    (columns)."""
    out, rps, lc = analytic_outputs(setups, loads, steps, sweep_all)
    pm = meet_probability(out[..., M.O_TAIL_T], rps * window_s)
    return np.where(lc, pm, 1.0).prod(axis=-1)


def _fixed_fracs(setup: Setup, p: _Packed) -> np.ndarray:
    """Per component: NaN for apps on the swept load axis (the first LC app), else the constant load
    given in the scenario (other LC apps of a multi-app set-up stay at their loads)."""
    out = np.full(p.layout.n, np.nan)
    scn = setup.scenario
    for k, w in enumerate(p.layout.lc):
        if k == 0:
            continue
        ld = scn.apps[k].load
        out[w] = float(ld) if isinstance(ld, int | float) else float(ld.get("load", 0.5))
    return out


def analytic_max_load(pmeet: np.ndarray, loads: np.ndarray, threshold: float = MEET_THRESHOLD) -> np.ndarray:
    """Continuous max load per row: the first crossing of `threshold` walking up the load grid
    (linear interpolation between grid points); below the first point -> 0; never failing -> last."""
    out = np.empty(pmeet.shape[0])
    for i, row in enumerate(pmeet):
        fail = np.nonzero(row < threshold)[0]
        if len(fail) == 0:
            out[i] = loads[-1]
        elif fail[0] == 0:
            out[i] = 0.0
        else:
            j = fail[0]
            x0, x1, y0, y1 = loads[j - 1], loads[j], row[j - 1], row[j]
            out[i] = x0 + (x1 - x0) * (y0 - threshold) / max(y0 - y1, 1e-12)
    return out


def grid_max_load(pmeet_at_grid: np.ndarray, threshold: float = MEET_THRESHOLD) -> np.ndarray:
    """Table-4 style result from P(meet) on the 10%..100% grid: highest grid load before the first
    failure, in percent."""
    ok = pmeet_at_grid >= threshold
    out = np.zeros(ok.shape[0])
    for i, row in enumerate(ok):
        k = 0
        while k < len(row) and row[k]:
            k += 1
        out[i] = 10.0 * k
    return out


# ---- sampled evaluation ---------------------------------------------------------------------------
def run_window(
    setup: Setup,
    seed: int,
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    histograms: bool = False,
) -> dict:
    """Run the set-up on a SimNode. Returns, per LC app, the requests of the measured window, the
    expected number slower than the target and each measured interval's p99 / target, and the
    fraction of 500 ms intervals that met every target. With `histograms`, also each app's p99 over
    every request of the window (its interval histograms merged, as the referee and the papers' load
    generators read it) over its target, `window_p99_over_target`."""
    node = SimNode(setup.scenario, seed=seed, initial=setup.allocation, histograms=histograms)
    dt = node.capabilities().interval_s
    n_warm, n_meas = round(warmup_s / dt), round(measure_s / dt)
    lc_apps = node.capabilities().lc_apps
    names = [a.name for a in lc_apps]
    req = dict.fromkeys(names, 0.0)
    slow = dict.fromkeys(names, 0.0)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    hists: dict[str, list[LatencyHistogram]] = {n: [] for n in names}
    met_all = 0
    for k in range(n_warm + n_meas):
        obs = node.step()
        if k < n_warm:
            continue
        tails = node.tail_at_target()
        for s in obs.apps:
            req[s.name] += s.requests
            slow[s.name] += s.requests * tails[s.name]
            ratios[s.name].append(s.p99_us / s.target_us)
            if s.histogram is not None:
                hists[s.name].append(s.histogram)
        met_all += obs.all_qos_met
    out = {
        "requests": req,
        "expected_slow": slow,
        "interval_p99_over_target": ratios,
        "interval_meet_fraction": met_all / n_meas,
    }
    if histograms:
        merged = {a.name: (merge(hists[a.name]), a.qos_target_us) for a in lc_apps}
        out["window_p99_over_target"] = {n: m.quantile_us(TAIL_Q) / t for n, (m, t) in merged.items() if m}
    return out


def sampled_window_meet(setup: Setup, seed: int) -> bool:
    """The paper's test (Sec. 3.2): is the p99 of every LC app over the 1-minute window within its
    target? The slow-request count is drawn Binomial(N, p) with a generator seeded by `seed`."""
    run = run_window(setup, seed)
    rng = np.random.default_rng([seed, 1])
    for app, n in run["requests"].items():
        if n <= 0:
            continue
        p = min(1.0, run["expected_slow"][app] / n)
        slow = rng.binomial(int(n), p)
        if slow > allowed_over(n):
            return False
    return True


def sampled_max_load(setup: Setup, seed: int, loads: Sequence[float] = tuple(np.arange(1, 11) / 10)) -> float:
    """PARTIES Table 4 protocol in the simulator: walk up the 10% grid while QoS is met."""
    app = setup.scenario.apps[0].instance
    best = 0.0
    for i, x in enumerate(loads):
        if sampled_window_meet(setup.at_loads({app: float(x)}), seed + i):
            best = float(x) * 100
        else:
            break
    return best
