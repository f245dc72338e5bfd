"""From profiles, scenarios and allocations to the kernel's arrays, and back (env.sim.model).

* `Layout`: the components of one scenario (LC apps, BE-job thread classes, antagonists) and how
  each maps to an entity of the `Allocation`.
* `reference_knee(profile)`: the derived quantity that puts the app's knee at its max load
  (PARTIES Sec. 3.2): alone on its reference allocation at max load, the app meets its target in
  `knee_meet_prob` of 1-minute runs at `knee_load` x max load. For `knee: cpu` apps that is S_ref, the service time
  per request; for `knee: disk` apps the page touches per request (S_ref is `service_us`).
* `SimBatch`: B independent nodes stepped together (the batched mode); `SimNode` wraps one.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy.special import betainc, gammaln

from env.histogram import (
    N_BUCKETS,
    LatencyHistogram,
    bucket_lower_ns,
    bucket_mid_ns,
    bucket_width_ns,
    quantile_rank,
)
from env.sim import model as M
from env.sim.platform import Platform, load_platform
from env.sim.profiles import BatchProfile, LcProfile, ThreadClass, load_profile
from env.sim.scenario import Scenario
from env.types import Allocation, AppAlloc

# The knee (profile.knee_load x max load, default 1.05) is where the app alone meets its target in
# profile.knee_meet_prob (default 0.97) of 1-minute runs: PARTIES raised the load step by step, so
# the knee lies within the step above the reported max load; mid-step keeps max load itself met
# with a margin, as Table 4 shows (an antagonist that does not touch the app leaves it at 100%).
KNEE_WINDOW_S = 60.0  # PARTIES Sec. 3.2: clients run for one minute; p99 over the whole run
P99 = 0.99
_PLACE = {"allocated": 0.0, "same_threads": 1.0, "sibling_threads": 2.0, "free_cores": 3.0}
FREE_GROUP = -1.0  # core group of antagonists running on the node's idle cores


@dataclass(frozen=True)
class Component:
    """One simulated entity of a layout: an LC app, one thread class of a BE job, or an antagonist."""

    entity: str  # app / BE job / antagonist name
    kind: str  # "lc", "be", "antagonist"
    profile: LcProfile | BatchProfile
    cls: int  # thread class index (batch)
    target: int  # component index an antagonist is pinned to, else -1
    service_scale: float = 1.0  # domain randomisation of the derived knee quantity


@dataclass(frozen=True)
class Layout:
    """The components of one scenario in kernel order, with the index of each LC app and BE job."""

    platform: Platform
    components: tuple[Component, ...]
    lc: tuple[int, ...]  # component indices of LC apps, in scenario order
    be: dict[str, tuple[int, ...]]  # BE job -> its component indices
    warm_start: bool = False  # the apps ran unmanaged before the first interval (Scenario.page_cache)

    @property
    def n(self) -> int:
        return len(self.components)

    def lc_profile(self, w: int) -> LcProfile:
        """The profile of component `w`, an LC app (an index in `lc`)."""
        prof = self.components[w].profile
        assert isinstance(prof, LcProfile), f"component {w} ({self.components[w].entity}) is not an LC app"
        return prof


def lc_profile_of(scn: Scenario, i: int) -> LcProfile:
    """The i-th app's profile as deployed by the scenario: its deployment overrides applied, and
    one worker thread per managed core of the node unless `threads` is overridden (an app can then
    use every core a controller gives it; PARTIES Fig. 2 sweeps up to 14 cores) or its threads serve
    connections rather than cores (`threads_follow_cores: false`, MongoDB's thread per client
    connection). The profile's own `threads` is the reference deployment of PARTIES Sec. 3.3 (8
    threads), which defines its knee."""
    prof = scn.lc_profiles[i]
    kw: dict = {"threads": scn.platform_spec.cores} if prof.threads_follow_cores else {}
    for k, v in scn.apps[i].overrides.items():
        kw[k] = int(v) if k == "threads" else float(v)
    for k, f in scn.apps[i].perturb.items():
        if k != "service":
            kw[k] = getattr(prof, k) * f
    if "frac_llc" in kw or "frac_mem" in kw:  # keep a core share of the service time
        fl, fm = kw.get("frac_llc", prof.frac_llc), kw.get("frac_mem", prof.frac_mem)
        if fl + fm > 0.95:
            kw["frac_llc"], kw["frac_mem"] = fl * 0.95 / (fl + fm), fm * 0.95 / (fl + fm)
    if "smt_speed" in kw:
        kw["smt_speed"] = min(1.0, kw["smt_speed"])
    return dataclasses.replace(prof, **kw)


def build_layout(scn: Scenario) -> Layout:
    """The scenario's components: the LC apps first (scenario order), then each BE job's thread
    classes, then the antagonists' (PARTIES Table 3), pinned to their target app."""
    comps: list[Component] = []
    for i, e in enumerate(scn.apps):
        comps.append(Component(e.instance, "lc", lc_profile_of(scn, i), 0, -1, e.perturb.get("service", 1.0)))
    lc = tuple(range(len(comps)))
    be: dict[str, tuple[int, ...]] = {}
    for name in scn.be:
        prof = load_profile(name)
        assert isinstance(prof, BatchProfile)
        idx = []
        for c in range(len(prof.classes)):
            idx.append(len(comps))
            comps.append(Component(name, "be", prof, c, -1))
        be[name] = tuple(idx)
    names = [e.instance for e in scn.apps]
    for a in scn.antagonists:
        prof = load_profile(a.profile)
        assert isinstance(prof, BatchProfile)
        target = names.index(a.target) if a.target in names else -1
        for c in range(len(prof.classes)):
            comps.append(Component(a.profile, "antagonist", prof, c, target))
    return Layout(scn.platform_spec, tuple(comps), lc, be, scn.page_cache == "warm")


# ---- parameters ---------------------------------------------------------------------------------
def platform_row(pl: Platform, warm_start: bool = False) -> np.ndarray:
    """The platform as the kernel's parameter row (`model.PL_*` columns); `warm_start`: the run
    starts from the apps' page caches warmed unmanaged (`Layout.warm_start`, model step 4)."""
    r = np.zeros(M.NPL)
    r[M.PL_WARM_START] = pl.memory.gb if warm_start else 0.0  # what the apps warmed their caches in
    r[M.PL_CORES] = pl.cores
    r[M.PL_TPC] = pl.threads_per_core
    r[M.PL_SOCKET_CORES] = pl.socket_cores
    r[M.PL_LLC_WAYS] = pl.llc.ways
    r[M.PL_LLC_MB] = pl.llc.mb
    r[M.PL_LLC_BW] = pl.llc.bandwidth_gbps
    r[M.PL_LLC_CONT] = pl.llc.contention
    r[M.PL_LLC_STREAM_W] = pl.llc.stream_weight
    r[M.PL_MBA_DELAY] = pl.mba.delay
    r[M.PL_FMIN] = pl.freq.min_mhz
    r[M.PL_FNOM] = pl.freq.nominal_mhz
    r[M.PL_FTURBO] = pl.freq.turbo_mhz
    r[M.PL_FALLTURBO] = pl.freq.all_core_turbo_mhz or pl.freq.turbo_mhz
    r[M.PL_TDP] = pl.power.tdp_w
    r[M.PL_UNCORE_W] = pl.power.uncore_w
    r[M.PL_CORE_IDLE_W] = pl.power.core_idle_w
    r[M.PL_CORE_DYN_W] = pl.power.core_dynamic_w
    r[M.PL_IRQ_ACTIVE] = pl.power.irq_active_cores
    r[M.PL_MEM_GB] = pl.memory.gb
    r[M.PL_MEM_BW] = pl.memory.bandwidth_gbps
    r[M.PL_MEM_Q] = pl.memory.queueing
    r[M.PL_RECLAIM] = pl.memory.reclaim_gbps
    r[M.PL_DISK_IOPS] = pl.disk.iops
    r[M.PL_DISK_SEQ] = pl.disk.seq_mbps
    r[M.PL_DISK_SLICE_S] = pl.disk.slice_ms / 1000
    r[M.PL_DISK_NCQ] = pl.disk.ncq_exponent
    r[M.PL_DISK_QD] = pl.disk.queue_depth
    r[M.PL_NET_GBPS] = pl.network.gbps
    r[M.PL_NET_CONG_S] = pl.network.congestion_delay_ms / 1000
    r[M.PL_SCHED_S] = pl.sched_wakeup_delay_ms / 1000
    r[M.PL_SCHED_SLICE_S] = pl.sched_slice_ms / 1000
    r[M.PL_MIG_PEN] = pl.migration_penalty
    r[M.PL_DT] = pl.interval_s
    r[M.PL_CFS_PERIOD_S] = pl.cfs_period_ms / 1000
    r[M.PL_CFS_STRAND_S] = pl.cfs_stranded_ms / 1000
    r[M.PL_CFS_RESUME_S] = pl.cfs_resume_wait_ms / 1000
    r[M.PL_QUOTA_MODE] = float(pl.core_mode == "quota")
    return r


def llc_footprint_mb(prof: LcProfile) -> float:
    """Occupancy beyond which the power-law miss curve gains less than 1% of its range."""
    return min(2000.0, prof.llc_kappa_mb * (100.0 ** (1.0 / prof.llc_alpha) - 1.0))


@cache
def working_set_table(kappa: float, alpha: float, mmin: float, foot: float) -> np.ndarray:
    """G(x_j) = integral_0^x_j dx / m(x) in MB at x_j = foot * model.GRID[j]: by Denning's
    working-set relation dW/dt = accesses x m(W), the MB an app must touch to hold W (Che's LRU)."""
    x = np.concatenate(([0.0], np.geomspace(foot * 1e-9, foot, 4000)))
    inv = 1.0 / (mmin + (1.0 - mmin) * (1.0 + x / kappa) ** (-alpha))
    g = np.concatenate(([0.0], np.cumsum(0.5 * (inv[1:] + inv[:-1]) * np.diff(x))))
    return np.interp(M.GRID * foot, x, g)


def lc_row(prof: LcProfile, knee: tuple[float, float], ref: Platform | None = None) -> np.ndarray:
    """The kernel row of an LC app; `knee` = (S_ref in s, page touches per request). `ref` is its
    reference platform (default: the one its profile names)."""
    s_ref, pages = knee
    ref = ref or load_platform(prof.reference.platform)
    foot = llc_footprint_mb(prof)
    r = np.zeros(M.NP)
    r[M.P_ACTIVE] = 1
    r[M.P_KIND] = 0
    r[M.P_THREADS] = prof.threads
    r[M.P_SREF] = s_ref
    r[M.P_FLLC] = prof.frac_llc
    r[M.P_FMEM] = prof.frac_mem
    r[M.P_SMT] = prof.smt_speed
    r[M.P_PRESS] = prof.smt_pressure
    r[M.P_PWR] = prof.power_factor
    r[M.P_LLC_APU] = prof.llc_accesses_per_req
    r[M.P_LLC_KAPPA] = prof.llc_kappa_mb
    r[M.P_LLC_ALPHA] = prof.llc_alpha
    r[M.P_LLC_FOOT] = foot
    r[M.P_LLC_MMIN] = prof.llc_miss_min
    r[M.P_LLC_STREAM] = 0
    r[M.P_LLC_MREF] = M._miss(
        min(ref.llc.mb, foot), prof.llc_kappa_mb, prof.llc_alpha, foot, prof.llc_miss_min, 0.0
    )
    r[M.P_GTAB : M.P_GTAB + M.NG] = working_set_table(
        prof.llc_kappa_mb, prof.llc_alpha, prof.llc_miss_min, foot
    )
    r[M.P_DRAM] = prof.dram_bytes_per_req / 1e9
    r[M.P_DATA_GB] = prof.dataset_gb
    r[M.P_INDEX_GB] = prof.index_gb
    r[M.P_ZIPF] = prof.zipf
    r[M.P_PAGES] = pages
    r[M.P_IO_KB] = prof.io_kb
    r[M.P_IOS] = prof.ios_per_miss
    r[M.P_NET_GBIT] = prof.net_bytes_per_req * 8 / 1e9
    r[M.P_FLOWS] = prof.net_flows
    r[M.P_BASE_S] = prof.base_latency_us / 1e6
    r[M.P_HOLD_S] = prof.hold_us / 1e6
    r[M.P_CV2] = prof.service_cv2
    r[M.P_DET] = prof.service_det
    r[M.P_PERTHREAD] = 1.0 if prof.queue == "per_thread" else 0.0
    r[M.P_IMBAL] = prof.worker_imbalance
    r[M.P_TIMEOUT_S] = prof.timeout_s
    r[M.P_PLACE] = 0
    r[M.P_TARGET] = -1
    r[M.P_QOS_S] = prof.qos_target_us / 1e6
    return r


def batch_row(prof: BatchProfile, c: ThreadClass, target: int) -> np.ndarray:
    """One thread class of a batch job (a BE job or an antagonist) as a kernel parameter row
    (`model.P_*` columns); `target` is the component an antagonist stresses, -1 otherwise."""
    r = np.zeros(M.NP)
    r[M.P_ACTIVE] = 1
    r[M.P_KIND] = 1
    r[M.P_THREADS] = c.threads
    r[M.P_SREF] = 1.0
    r[M.P_FLLC] = c.frac_llc
    r[M.P_FMEM] = c.frac_mem
    r[M.P_SMT] = c.smt_speed
    r[M.P_PRESS] = c.smt_pressure
    r[M.P_PWR] = c.power_factor
    r[M.P_LLC_APU] = c.llc_access_gbps * 1e9 / 64
    r[M.P_LLC_STREAM] = 1
    r[M.P_LLC_FOOT] = c.llc_footprint_mb * c.threads
    r[M.P_LLC_KAPPA] = 0
    r[M.P_LLC_MMIN] = 0
    r[M.P_LLC_MREF] = 1.0
    r[M.P_DRAM] = c.llc_access_gbps
    r[M.P_DATA_GB] = c.memory_gb * c.threads
    r[M.P_ZIPF] = 0.0
    r[M.P_PAGES] = c.llc_access_gbps * 1e9 / 4096 if c.memory_gb > 0 else 0.0
    r[M.P_IO_KB] = 4.0
    r[M.P_IOS] = 1.0
    r[M.P_SEQ_MB] = c.disk_mbps
    r[M.P_NET_GBIT] = c.net_gbps
    r[M.P_FLOWS] = c.net_flows
    r[M.P_PLACE] = _PLACE[prof.placement]
    r[M.P_TARGET] = target
    r[M.P_TIMEOUT_S] = 1.0
    r[M.P_BUSY] = c.cpu_util
    return r


def component_rows(layout: Layout) -> np.ndarray:
    """The kernel parameter rows of every component; each LC row carries its reference knee
    (PARTIES Sec. 3.2), scaled by the component's domain randomisation."""
    rows = np.zeros((layout.n, M.NP))
    for w, comp in enumerate(layout.components):
        if comp.kind == "lc":
            assert isinstance(comp.profile, LcProfile)
            s_ref, pages = reference_knee(base_profile(comp.profile))
            if comp.profile.knee == "cpu":
                s_ref *= comp.service_scale
            else:
                pages *= comp.service_scale
            rows[w] = lc_row(comp.profile, (s_ref, pages))
        else:
            assert isinstance(comp.profile, BatchProfile)
            rows[w] = batch_row(comp.profile, comp.profile.classes[comp.cls], comp.target)
    return rows


def base_profile(prof: LcProfile) -> LcProfile:
    """The shipped profile of an app (deployment overrides removed), which defines its knee."""
    base = load_profile(prof.name)
    return base if isinstance(base, LcProfile) else prof


def alloc_rows(layout: Layout, alloc: Allocation, prev: Allocation | None) -> np.ndarray:
    """Allocation -> (W, NA). Antagonists run on the idle cores (or on their target's threads),
    share their target's CLOS (the LLC is not partitioned for them) and are not limited. On a
    quota-mode platform an app's cores are a CFS quota on all cores (`_quota_cores`)."""
    pl = layout.platform
    rows = np.zeros((layout.n, M.NA))
    top = pl.freq_levels_mhz[-1]
    idle = alloc.idle_cores
    sharers = Counter(a.core_group for a in alloc)
    for w, comp in enumerate(layout.components):
        r = rows[w]
        if comp.kind == "antagonist":
            prof = comp.profile
            assert isinstance(prof, BatchProfile)  # layout() builds antagonists from batch profiles only
            t = comp.target if comp.target >= 0 else (layout.lc[0] if layout.lc else -1)
            tgt = alloc[layout.components[t].entity] if t >= 0 else None
            r[M.A_CORES] = max(idle, 0.0)
            r[M.A_GROUP] = FREE_GROUP
            r[M.A_WAYS] = tgt.llc_ways if tgt else pl.llc.ways
            r[M.A_CLOS] = tgt.clos if tgt else 0
            r[M.A_MBA] = 100
            r[M.A_FREQ] = (tgt.freq_mhz if prof.placement != "free_cores" else top) if tgt else top
            r[M.A_MEM] = pl.memory.gb
            r[M.A_DISK] = pl.disk.seq_mbps
            r[M.A_NET] = pl.network.gbps
            continue
        a = alloc[comp.entity]
        _fill(r, a)
        r[M.A_SHARES] *= _cpu_weight_part(layout, w)
        if pl.core_mode == "quota":
            _quota_cores(r, a, pl.cores, sharers[a.core_group])
            r[M.A_QUOTA] *= _cpu_weight_part(layout, w)  # the BE job's classes share its cgroup's quota
        if prev is not None and comp.entity in prev:
            p = prev[comp.entity]
            moved = p.cores != a.cores or p.core_group != a.core_group
            r[M.A_MOVED] = float(moved and pl.core_mode == "cpuset")  # a quota moves no thread
            r[M.A_FLUSH] = float(p.clos != a.clos)
    return rows


def _quota_cores(r: np.ndarray, a: AppAlloc, node_cores: int, sharers: int) -> None:
    """Quota mode (a Linux node whose cores are CFS quotas): every app runs on all of the node's
    cores under a CFS quota of its group's cores split evenly among the group's apps; a group
    holding every core is no limit for its members (the OS time-shares the node: `unmanaged`), and
    no cores pauses the app (the cgroup freezer). The app's own `cpu_quota` caps it further."""
    cores = a.cores
    r[M.A_CORES] = float(node_cores) if cores > 0.0 else 0.0
    r[M.A_GROUP] = 0.0
    quota = 0.0 if cores >= node_cores - 1e-9 else cores / max(sharers, 1)
    if a.cpu_quota > 0.0:
        quota = min(quota, a.cpu_quota) if quota > 0.0 else a.cpu_quota
    r[M.A_QUOTA] = quota


def _cpu_weight_part(layout: Layout, w: int) -> float:
    """Component w's part of its entity's CFS weight (and, in quota mode, its quota): a BE job's
    thread classes share one cgroup, so its weight is split in proportion to their runnable threads
    (they then saturate together, as the cgroup's threads would)."""
    comp = layout.components[w]
    idx = layout.be.get(comp.entity, ())
    if len(idx) < 2:
        return 1.0
    prof = comp.profile
    assert isinstance(prof, BatchProfile)
    runnable = [c.threads * c.cpu_util for c in prof.classes]
    return runnable[comp.cls] / sum(runnable) if sum(runnable) > 0 else 1.0 / len(idx)


def _fill(r: np.ndarray, a: AppAlloc) -> None:
    r[M.A_CORES] = a.cores
    r[M.A_GROUP] = a.core_group
    r[M.A_WAYS] = a.llc_ways
    r[M.A_CLOS] = a.clos
    r[M.A_MBA] = a.mba_pct
    r[M.A_FREQ] = a.freq_mhz
    r[M.A_MEM] = a.memory_gb
    r[M.A_DISK] = a.disk_mbps
    r[M.A_NET] = a.net_gbps
    r[M.A_QUOTA] = a.cpu_quota
    r[M.A_SHARES] = a.cpu_shares


# ---- derived constants --------------------------------------------------------------------------
def meet_probability(tail_at_target: np.ndarray | float, n_requests: np.ndarray | float) -> np.ndarray:
    """P(an interval's measured p99 <= target) given P(latency > target) and n requests: the
    order statistic k = quantile_rank(0.99, n) of n draws (env.histogram) is <= target iff
    Beta(k, n-k+1) <= F(target)."""
    n = np.maximum(np.asarray(n_requests, dtype=float), 1.0)
    k = quantile_rank(P99, n)
    f = np.clip(1.0 - np.asarray(tail_at_target, dtype=float), 0.0, 1.0)
    return betainc(k, n - k + 1.0, f)


def steady(plat: np.ndarray, prm: np.ndarray, alloc: np.ndarray, lam: np.ndarray, steps: int = 6) -> tuple:
    """Deterministic steady state of one node: arrivals = lam*dt exactly, p99 at the 0.99 point."""
    arr = M.new_arrays(1, prm.shape[0])
    arr["plat"][0] = plat
    arr["prm"][0] = prm
    arr["alloc"][0] = alloc
    dt = plat[M.PL_DT]
    arr["arrivals"][0] = lam * dt
    arr["usample"][0] = np.where(prm[:, M.P_KIND] < 0.5, P99, np.nan)
    M.step_arrays(arr, steps)
    return arr["out"][0].copy(), arr["nout"][0].copy()


def reference_alloc_row(pl: Platform, cores: int) -> np.ndarray:
    """The reference allocation of `reference_knee`: `cores` cores, every LLC way, the top
    frequency and the whole memory, disk and network (the app alone, PARTIES Sec. 3.2)."""
    r = np.zeros(M.NA)
    r[M.A_CORES] = cores
    r[M.A_GROUP] = 1
    r[M.A_WAYS] = pl.llc.ways
    r[M.A_CLOS] = 1
    r[M.A_MBA] = 100
    r[M.A_FREQ] = pl.freq_levels_mhz[-1]
    r[M.A_MEM] = pl.memory.gb
    r[M.A_DISK] = pl.disk.seq_mbps
    r[M.A_NET] = pl.network.gbps
    return r


_FEW_REQUESTS = 30.0  # below this mean count per interval the count's spread is summed over
_MAX_COUNT = np.arange(81)  # counts summed over (P(N > 80) < 1e-13 for a mean below 30)
_RANK = quantile_rank(P99, np.maximum(_MAX_COUNT, 1))  # the p99's rank among n requests
_SLOWEST = np.maximum(_MAX_COUNT, 1) == _RANK  # up to 50 requests the p99 is the slowest: Beta(n, 1) = F^n


def interval_meet_probability(
    tail_at_target: np.ndarray | float, mean_requests: np.ndarray | float, empty_u: float = P99
) -> np.ndarray:
    """P(one interval's measured p99 <= target) when its request count is Poisson with mean
    `mean_requests` (as `SimBatch.step` draws it): `meet_probability` for each count n >= 1,
    weighted by P(n); an interval without a request reports the latency distribution's `empty_u`
    quantile (`SimNode` passes 0.99: its expected p99), which meets iff P(latency > target) <=
    1 - `empty_u`. With few requests per interval this differs from `meet_probability` at the
    mean count: at 0.7 requests (Sphinx at 10% of its max load, 500 ms) half the intervals are
    empty, and a 5% tail meets in about half of them, not in 95%. From a mean of 30 on, the count's
    spread changes little and `meet_probability` at the mean is used."""
    q = np.asarray(tail_at_target, dtype=float)
    m = np.broadcast_to(np.asarray(mean_requests, dtype=float), np.broadcast(q, mean_requests).shape)
    q = np.broadcast_to(q, m.shape)
    few = m < _FEW_REQUESTS
    if not few.any():
        return meet_probability(q, m)
    out = np.empty(m.shape)
    out[~few] = meet_probability(q[~few], m[~few])
    mf, qf = np.maximum(m[few], 0.0)[:, None], q[few][:, None]
    n = _MAX_COUNT[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):  # a mean of 0: P(0) = 1, set below
        log_pmf = n * np.log(mf) - mf - gammaln(n + 1.0)
    pmf = np.where(mf > 0, np.exp(log_pmf), (n == 0).astype(float))
    f = np.clip(1.0 - qf, 0.0, 1.0)
    given = np.empty((len(mf), len(_MAX_COUNT)))
    given[:, _SLOWEST] = f ** _MAX_COUNT[_SLOWEST]  # meet_probability's Beta(n, 1), in closed form
    rest = ~_SLOWEST
    given[:, rest] = betainc(_RANK[rest], _MAX_COUNT[rest] - _RANK[rest] + 1.0, f)
    given[:, 0] = (qf[:, 0] <= 1.0 - empty_u).astype(float)  # n = 0: the expected p99
    out[few] = (pmf * given).sum(axis=1)
    return out


@cache
def reference_knee(prof: LcProfile, ref: Platform | None = None) -> tuple[float, float]:
    """(S_ref in s, page touches per request) putting the knee at max load: the p99 of a 1-minute
    run at `knee_load` x max load meets the target with probability `knee_meet_prob`. Bisection on the log of the
    derived quantity, since P(meet) falls as either grows. `ref` is the reference platform (default:
    the one the profile names; a fit passes its candidate platform)."""
    pl = ref or load_platform(prof.reference.platform)
    plat = platform_row(pl)
    alloc = reference_alloc_row(pl, prof.reference.cores)[None, :]
    lam = np.array([prof.max_load_rps * prof.knee_load])
    n = lam[0] * KNEE_WINDOW_S

    def knee(x: float) -> tuple[float, float]:
        if prof.knee == "cpu":
            return x, prof.pages_per_req
        return prof.service_us / 1e6, x

    def p_meet(x: float) -> float:
        out, _ = steady(plat, lc_row(prof, knee(x), pl)[None, :], alloc, lam)
        return float(meet_probability(out[0, M.O_TAIL_T], n))

    lo, hi = math.log(1e-9), math.log(100.0 if prof.knee == "cpu" else 1e6)
    if p_meet(math.exp(lo)) < prof.knee_meet_prob:
        raise ValueError(
            f"app {prof.name}: cannot meet {prof.qos_target_us} us at max load even with "
            f"{'instant service' if prof.knee == 'cpu' else 'no page faults'}: its fixed delays are too large"
        )
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if p_meet(math.exp(mid)) >= prof.knee_meet_prob:
            lo = mid
        else:
            hi = mid
    return knee(math.exp(lo))


@cache
def be_alone_progress(prof: BatchProfile, platform: str) -> float:
    """Progress rate of a BE job alone on the whole node (PARTIES Sec. 5: BE throughput is
    normalised to the job in isolation)."""
    pl = load_platform(platform)
    rows = np.stack([batch_row(prof, c, -1) for c in prof.classes])
    alloc = np.stack([reference_alloc_row(pl, pl.cores) for _ in prof.classes])
    out, _ = steady(platform_row(pl), rows, alloc, np.zeros(len(prof.classes)))
    return float(out[:, M.O_PROG].sum())


# ---- the batched simulator ----------------------------------------------------------------------
class SimBatch:
    """B nodes stepped together. Each node has its own layout (padded to the widest one) and
    allocation rows; `step()` draws arrivals and p99 order statistics and runs the kernel once for
    all nodes. Draws come from one shared generator (fastest, for large batches), or from one
    generator per node once `set_rng` has been called (then node i draws exactly what a
    standalone node with that generator would)."""

    def __init__(self, layouts: list[Layout], rng: np.random.Generator, width: int | None = None) -> None:
        self.B = len(layouts)
        self.W = max(width or 0, max((lay.n for lay in layouts), default=1))
        self.rng = rng
        self.rngs: list[np.random.Generator] | None = None
        self.a = M.new_arrays(self.B, self.W)
        self.lam = np.zeros((self.B, self.W))  # offered rps per LC component, set before step()
        self.layouts: list[Layout | None] = [None] * self.B
        for i, lay in enumerate(layouts):
            self.set_layout(i, lay)

    def set_layout(self, i: int, layout: Layout) -> None:
        if layout.n > self.W:
            raise ValueError(f"layout has {layout.n} components; this batch holds {self.W}")
        self.layouts[i] = layout
        self.a["plat"][i] = platform_row(layout.platform, layout.warm_start)
        self.a["prm"][i] = 0.0
        self.a["prm"][i, : layout.n] = component_rows(layout)
        self.a["alloc"][i] = 0.0
        self.a["state"][i] = 0.0
        self.lam[i] = 0.0
        prm = self.a["prm"]
        self._lc = (prm[:, :, M.P_KIND] < 0.5) & (prm[:, :, M.P_ACTIVE] > 0.5)
        self._dt = self.a["plat"][:, M.PL_DT][:, None].copy()

    def set_rng(self, i: int, rng: np.random.Generator) -> None:
        """Give node i its own generator (switches the batch to per-node draws)."""
        if self.rngs is None:
            self.rngs = [self.rng] * self.B
        self.rngs[i] = rng

    def set_alloc_rows(self, i: int, rows: np.ndarray) -> None:
        self.a["alloc"][i, : rows.shape[0]] = rows

    def step(self, empty_u: float = np.nan, index: int | None = None) -> None:
        """One interval for every node (or only node `index`), at the offered rates in `self.lam`
        (LC components only). An LC component that received no request gets the quantile point
        `empty_u` (NaN: its p99 is NaN; 0.99: its expected p99)."""
        if index is None:
            a, lam, lc, dt = self.a, self.lam, self._lc, self._dt
        else:
            sl = slice(index, index + 1)
            a = {k: v[sl] for k, v in self.a.items()}  # views: the kernel writes through them
            lam, lc, dt = self.lam[sl], self._lc[sl], self._dt[sl]
        mean = np.maximum(lam, 0.0) * dt
        if self.rngs is None:
            n, u = _draw(self.rng, mean)
        else:
            first = 0 if index is None else index
            n = np.zeros_like(mean)
            u = np.ones_like(mean)
            for r in range(mean.shape[0]):
                lay = self.layouts[first + r]
                w = lay.n if lay is not None else 0  # only the node's own components draw
                n[r, :w], u[r, :w] = _draw(self.rngs[first + r], mean[r, :w])
        a["arrivals"][:] = n
        a["state"][..., M.S_OFFER] = np.where(lc, mean, 0.0)
        a["usample"][:] = np.where(lc, np.where(n > 0, u, empty_u), np.nan)
        M.step_arrays(a)


def _draw(rng: np.random.Generator, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrival counts ~ Poisson(mean) and, for each, the CDF value of its p99 order statistic."""
    n = rng.poisson(mean).astype(float)
    k = quantile_rank(P99, n)  # at least 1
    return n, rng.beta(k, np.maximum(n - k + 1.0, 1.0))


# ---- an interval's latency histogram ------------------------------------------------------------
_EDGE_MASS = 0.05  # expected requests lumped into each end bucket (beyond the range evaluated)
_BUCKETS = np.arange(N_BUCKETS)
_EDGES_S = bucket_lower_ns(_BUCKETS) * 1e-9
_MIDS_NS = bucket_mid_ns(_BUCKETS)
_UPPER_NS = (bucket_lower_ns(_BUCKETS) + bucket_width_ns(_BUCKETS) - 1).astype(float)


def interval_histogram(d: np.ndarray, n_requests: int, rng: np.random.Generator) -> LatencyHistogram:
    """The latencies of the `n_requests` requests an LC app saw in one interval, as a histogram
    (`env.histogram`): the `dropped` ones at the timeout (what a load generator records for them),
    the rest drawn from the interval's distribution (`dist` row `d`, env.sim.model D_*): bucket
    probabilities are differences of P(latency > x) at the bucket edges (`model.dist_bucket_probs`),
    the counts one multinomial draw. Buckets are evaluated between the latencies exceeded with
    probability 1 - e and e, e = 0.05 / n (at most 1e-4); the mass beyond goes to the end buckets."""
    n = int(n_requests)
    if n <= 0 or d[M.D_N] < 0.5:
        return LatencyHistogram.empty()
    n_drop = min(n, round(float(d[M.D_DROPPED])))
    n_ok = n - n_drop
    e = min(_EDGE_MASS / max(n_ok, 1), 1e-4)
    lo, counts = M.interval_counts(d, n_ok, n_drop, _EDGES_S, e, _PROBS, rng.integers(1 << 32))
    hi = lo + counts.size
    return LatencyHistogram.trusted(
        lo,
        counts,
        sum_ns=float(counts @ _MIDS_NS[lo:hi]),
        min_ns=float(_EDGES_S[lo] * 1e9),
        max_ns=float(_UPPER_NS[hi - 1]),
    )


_PROBS = np.empty(N_BUCKETS)  # scratch for model.dist_bucket_probs (single-threaded use)


# ---- the p99s of an interval's sub-intervals ----------------------------------------------------
def sub_interval_p99s(
    d: np.ndarray, n_requests: int, n_sub: int, rng: np.random.Generator
) -> tuple[float, ...]:
    """The p99 (s) of each of `n_sub` equal sub-intervals of one interval in which an LC app saw
    `n_requests` requests, as a load generator rolling a histogram per sub-interval would report
    them; NaN for a sub-interval without a request.

    The requests fall into the sub-intervals uniformly (one multinomial draw) and each sub-interval's
    p99 is the order statistic k = quantile_rank(0.99, n_j) of its n_j requests drawn from the interval's
    latency distribution (`dist` row `d`, model D_*): its CDF value U ~ Beta(k, n_j - k + 1) inverted
    by `model.dist_quantile`, as the kernel draws the interval's own p99. When more than 1% of the
    interval's requests time out (the kernel's rule for the interval p99) every sub-interval reports
    the timeout. The distribution is the interval's: a backlog draining within the interval is
    spread over all its sub-intervals instead of its first ones."""
    if n_sub <= 0:
        return ()
    n = max(int(n_requests), 0)
    counts = rng.multinomial(n, np.full(n_sub, 1.0 / n_sub))
    k = quantile_rank(P99, counts)  # at least 1
    u = rng.beta(k, np.maximum(counts - k + 1.0, 1.0))
    if d[M.D_N] < 0.5:
        return (math.nan,) * n_sub
    timed_out = n > 0 and d[M.D_DROPPED] > 0.01 * n
    return tuple(
        math.nan
        if c == 0
        else float(d[M.D_TIMEOUT])
        if timed_out
        else float(M.dist_quantile(d, 1.0 - float(uj)))
        for c, uj in zip(counts.tolist(), u.tolist())
    )
