"""The simulator's physics (env.sim.model): the latency model, sharing rules, lags, determinism."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from env.sim import model as M
from env.sim.engine import lc_row, platform_row, reference_alloc_row, reference_knee, steady
from env.sim.experiments import OVERLOAD, Setup, analytic_outputs, pinned
from env.sim.node import SimFleet, SimNode
from env.sim.platform import load_platform
from env.sim.profiles import load_profile
from env.sim.scenario import simple_scenario


def _mm1_profile():
    """One thread, exponential service, no fixed delay, no cache/memory/disk/network effects."""
    return dataclasses.replace(
        load_profile("xapian"),
        threads=1,
        frac_llc=0.0,
        frac_mem=0.0,
        base_latency_us=0.0,
        pages_per_req=0.0,
        net_bytes_per_req=0.0,
        dram_bytes_per_req=0.0,
        llc_accesses_per_req=0.0,
        service_det=0.0,
        service_cv2=1.0,
    )


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
def test_mm1_limit_matches_heracles_equation_1(rho):
    """Heracles Eq. (1): r99 = ln(100) / (mu - lambda) for an M/M/1 queue (goal: within 5%)."""
    pl = load_platform("parties")
    plat = platform_row(pl)
    plat[M.PL_FTURBO] = 0  # fixed nominal frequency: service time exactly S
    alloc = reference_alloc_row(pl, 1)
    alloc[M.A_FREQ] = pl.freq.nominal_mhz
    s_ref = 1e-3
    lam = rho / s_ref
    out, _ = steady(plat, lc_row(_mm1_profile(), (s_ref, 0.0))[None, :], alloc[None, :], np.array([lam]))
    expected = math.log(100) / (1 / s_ref - lam)
    assert out[0, M.O_P99] == pytest.approx(expected, rel=0.05)
    assert out[0, M.O_P99] == pytest.approx(expected, rel=1e-3)  # in fact exact


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_uneven_workers_are_a_mixture_of_two_mm1_queues(imbalance):
    """Worker processes that each accept their own connections (`queue: per_thread`) share them
    unevenly (`worker_imbalance`): the busiest of n takes imbalance/n of the requests and the rest
    split the remainder. The latency is the mixture of the two M/M/1 sojourn tails, weighted by the
    requests each serves: P(T > x) = w e^-(mu - lam_h) x + (1 - w) e^-(mu - lam_r) x."""
    pl = load_platform("parties")
    plat = platform_row(pl)
    plat[M.PL_FTURBO] = 0
    n = 4
    alloc = reference_alloc_row(pl, n)
    alloc[M.A_FREQ] = pl.freq.nominal_mhz
    plat[M.PL_TPC] = 1  # one hardware thread per core: n servers
    prof = dataclasses.replace(_mm1_profile(), threads=n, queue="per_thread", worker_imbalance=imbalance)
    s_ref, lam = 1e-3, 2000.0  # 50% of the 4 servers
    out, _ = steady(plat, lc_row(prof, (s_ref, 0.0))[None, :], alloc[None, :], np.array([lam]))
    mu = 1 / s_ref
    lam_h = lam * imbalance / n
    lam_r = (lam - lam_h) / (n - 1)
    w = lam_h / lam

    def tail(x):
        return w * math.exp(-(mu - lam_h) * x) + (1 - w) * math.exp(-(mu - lam_r) * x)

    p99 = float(out[0, M.O_P99])
    assert tail(p99) == pytest.approx(0.01, rel=1e-3)
    if imbalance == 1.0:
        assert p99 == pytest.approx(math.log(100) / (mu - lam / n), rel=1e-3)  # n M/M/1 queues
    else:
        assert p99 > math.log(100) / (mu - lam / n)  # the busiest worker's queue is longer


def test_uneven_workers_move_the_knee_below_the_max_rps():
    """PARTIES Sec. 3.2: tail latency rises past 60-80% of the max RPS. With every worker evenly
    loaded the p99 of an app whose target is hundreds of service times stays flat until its cores
    saturate; with the busiest worker taking more, it crosses the target while the others still have
    capacity, so the max RPS (what the node serves when overloaded) lies well above the knee."""
    from env.sim.experiments import knee_over_max_rps
    from env.sim.fit import _Patched

    base = load_profile("nginx")
    knees = {}
    for imb in (1.0, 1.3):
        with _Patched(dataclasses.replace(base, worker_imbalance=imb)):
            knees[imb] = knee_over_max_rps(["nginx"])["nginx"]
    assert knees[1.3] < knees[1.0] - 0.1, knees


def _p99(app: str, load: float, cores: int = 8, **kw) -> float:
    s = Setup(simple_scenario({app: load}, be=()), pinned({app: cores}, **kw))
    out, _, _ = analytic_outputs([s], np.array([load]))
    return float(out[0, 0, 0, M.O_P99])


@pytest.mark.parametrize("app", ["memcached", "xapian", "nginx", "moses", "mongodb", "sphinx"])
def test_latency_grows_with_load_and_falls_with_resources(app):
    loads = [0.2, 0.5, 0.8, 1.0]
    p = [_p99(app, x) for x in loads]
    assert all(a <= b * 1.0001 for a, b in itertools.pairwise(p)), p
    # fewer cores or a lower frequency never help
    assert _p99(app, 0.5, cores=2) >= _p99(app, 0.5, cores=8) * 0.999
    assert _p99(app, 0.5, freq_mhz={app: 1200}) >= _p99(app, 0.5) * 0.999


def test_measured_p99_noise_shrinks_with_more_requests():
    """The per-interval p99 is an order statistic: its spread falls as more requests are seen."""

    def spread(load: float) -> float:
        node = SimNode(simple_scenario({"xapian": load}, be=()), seed=3)
        vals = [node.step().apps[0].p99_us for _ in range(300)]
        return float(np.std(np.log(vals)))

    assert spread(0.05) > 2 * spread(0.6)


def test_same_seed_same_run_and_different_seed_differs():
    scn = simple_scenario({"memcached": 0.5, "nginx": 0.4})
    a = [SimNode(scn, seed=7).step() for _ in range(1)]
    n1, n2, n3 = SimNode(scn, seed=7), SimNode(scn, seed=7), SimNode(scn, seed=8)
    r1 = [n1.step().apps for _ in range(30)]
    r2 = [n2.step().apps for _ in range(30)]
    r3 = [n3.step().apps for _ in range(30)]
    assert r1 == r2 and r1 != r3 and a


def test_fleet_node_equals_standalone_node():
    s1, s2 = simple_scenario({"memcached": 0.4, "xapian": 0.3}), simple_scenario({"nginx": 0.5})
    fleet = SimFleet([s1, s2], seed=5)
    seed = fleet.nodes[0]._seed
    solo = SimNode(s1, seed=seed)
    fleet.reset(0, seed)
    for _ in range(25):
        assert fleet.step()[0].apps == solo.step().apps


def test_backlog_carries_over_and_an_overloaded_app_recovers_over_several_intervals():
    """Overload builds a backlog (bounded by the drop timeout); when the load drops, the app needs
    several intervals to drain it. Sphinx: long requests, a 2.5 s target, a 25 s drop timeout."""
    trace = {"kind": "step", "steps": [[0, 0.3], [20, 4.0], [40, 0.3]]}  # 4x: ~2x its capacity
    node = SimNode(simple_scenario({"sphinx": trace}, be=()), seed=1, initial=pinned({"sphinx": 8}))
    obs = [node.step() for _ in range(180)]
    start = [round(o.time_s - o.interval_s, 1) for o in obs]
    tard = dict(zip(start, (o.apps[0].tardiness for o in obs)))
    backlog = dict(zip(start, (o.apps[0].served_rps - o.apps[0].load_rps for o in obs)))
    assert np.mean([v <= 1 for t, v in tard.items() if t < 20]) > 0.95
    assert np.mean([v for t, v in tard.items() if 30 <= t < 40]) > 3
    # after the drop the app serves faster than requests arrive (it drains its backlog)...
    draining = [t for t, v in backlog.items() if t >= 40 and v > 0.5]
    assert len(draining) >= 4
    # ...is still violated for a while, and is back under its target at the end
    assert tard[40.0] > 1 and tard[41.0] > 1
    late = [v for t, v in tard.items() if t >= 75]  # ~2 requests per interval: a noisy p99
    assert np.mean([v <= 1 for v in late]) > 0.95


def test_requests_waiting_beyond_the_timeout_are_dropped():
    node = SimNode(simple_scenario({"xapian": 3.0}, be=()), seed=0, initial=pinned({"xapian": 2}))
    obs = [node.step() for _ in range(30)][-1]
    s = obs.apps[0]
    assert s.dropped_rps > 0.3 * s.load_rps
    assert s.p99_us >= load_profile("xapian").timeout_s * 1e6


def test_llc_alone_in_a_clos_holds_its_ways_and_sharers_split_them():
    ways = 6
    mb = load_platform("parties").llc.mb / 20 * ways
    solo = Setup(simple_scenario({"moses": 0.5}, be=()), pinned({"moses": 8}, ways={"moses": ways}))
    out, _, _ = analytic_outputs([solo], np.array([0.5]))
    foot = load_profile("moses")
    assert out[0, 0, 0, M.O_LLC] == pytest.approx(min(mb, 1e9), rel=1e-6) or out[0, 0, 0, M.O_LLC] <= mb
    # two apps in one CLOS: each holds less than the CLOS, together at most the CLOS
    pair = Setup(
        simple_scenario({"moses": 0.5, "sphinx": 0.5}, be=()),
        pinned({"moses": 4, "sphinx": 4}, ways={"moses": 12, "sphinx": 12}, shared_llc=True),
    )
    out, _, _ = analytic_outputs([pair], np.array([0.5]), sweep_all=True)
    occ = out[0, 0, :2, M.O_LLC]
    total = load_platform("parties").llc.mb  # shared_llc: one CLOS holding every way
    assert (occ > 0).all() and (occ < total).all() and occ.sum() <= total * (1 + 1e-6)
    assert foot.llc_kappa_mb > 0


def test_a_clos_migration_flushes_the_app_and_the_refill_costs_misses():
    """CoCo Sec. 3.3: lines are flushed when an app changes CLOS; the refill (at the app's miss rate)
    costs extra misses - DRAM traffic - until the partition is warm again. Shown on an app that
    touches the LLC slowly, so the refill spans several intervals."""
    from env.sim.fit import _Patched

    slow_toucher = dataclasses.replace(  # a cache-sensitive app that touches the LLC slowly
        load_profile("moses"),
        llc_accesses_per_req=200.0,
        dram_bytes_per_req=200.0 * 64 * 0.05,  # 5% of its accesses miss at the reference
        llc_kappa_mb=2.0,
        llc_alpha=1.0,
        llc_miss_min=0.02,
        frac_mem=0.5,
    )
    with _Patched(slow_toucher):
        scn = simple_scenario({"moses": 0.25}, be=())  # unsaturated: the refill shows as DRAM traffic
        node = SimNode(scn, seed=0, initial=pinned({"moses": 8}, ways={"moses": 10}))
        for _ in range(5):
            node.step()
        settled = node.observe().apps[0].usage
        moved = node.current_allocation().replace_app("moses", clos=2)
        after = [node.step(moved).apps[0].usage for _ in range(60)]
    assert after[0].llc_mb < 0.5 * settled.llc_mb  # flushed, refilling
    assert after[0].mem_bw_gbps > 1.1 * settled.mem_bw_gbps  # the refill costs misses
    assert all(a.llc_mb <= b.llc_mb + 1e-9 for a, b in itertools.pairwise(after))  # warms up monotonically
    assert after[-1].llc_mb == pytest.approx(settled.llc_mb, rel=0.01)
    assert after[-1].mem_bw_gbps == pytest.approx(settled.mem_bw_gbps, rel=0.05)


def test_cat_changes_take_effect_within_an_interval_for_fast_missers():
    """Heracles Sec. 4.2: CAT changes take effect in milliseconds; a memory-intensive app refills a
    larger partition within one 500 ms interval."""
    scn = simple_scenario({"sphinx": 0.5}, be=())
    node = SimNode(scn, seed=0, initial=pinned({"sphinx": 8}, ways={"sphinx": 1}))
    for _ in range(5):
        node.step()
    small = node.observe().apps[0].usage.llc_mb
    big = node.current_allocation().replace_app("sphinx", llc_ways=20)
    occ = node.step(big).apps[0].usage.llc_mb
    assert occ > 5 * small


def test_memory_is_reclaimed_gradually_and_faults_go_to_disk():
    """Lowering MongoDB's memory limit takes a few intervals (reclaim rate), and a smaller page
    cache turns into more disk reads (PARTIES Sec. 3.4.2)."""
    scn = simple_scenario({"mongodb": 0.5}, be=())
    node = SimNode(scn, seed=0, initial=pinned({"mongodb": 8}))
    for _ in range(5):
        node.step()
    before = node.observe().apps[0].usage
    low = node.current_allocation().replace_app("mongodb", memory_gb=40.0)
    res = [node.step(low).apps[0].usage for _ in range(120)]
    assert res[0].memory_gb > 40.0  # not instant
    assert res[-1].memory_gb == pytest.approx(40.0, abs=0.01)
    assert res[-1].disk_mbps > before.disk_mbps


def test_an_index_stays_resident_whole_or_costs_a_read_per_request():
    """Model step 4: MongoDB's lookups read one leaf of its _id index each, the leaves touched about
    equally. The page cache keeps the data pages hotter than a leaf, then the leaves, then the
    rest: between those two sizes the misses per request fall by one (every leaf read missing ->
    none), and nowhere does more cache bring more misses."""
    prof = load_profile("mongodb")
    assert prof.index_gb > 0
    row = lc_row(prof, reference_knee(prof))
    npg, ipg = prof.dataset_gb / M.PAGE_GB, prof.index_gb / M.PAGE_GB
    hot_gb = M._index_free_pages(row, npg, ipg) * M.PAGE_GB
    grid = np.linspace(0.0, 200.0, 401)
    misses = np.array([M._page_misses(row, g) for g in grid])
    assert np.all(np.diff(misses) <= 1e-12)
    before = M._page_misses(row, hot_gb)
    after = M._page_misses(row, hot_gb + prof.index_gb)
    assert before - after == pytest.approx(1.0, abs=0.02)  # the data pages barely change in between
    # without the index, the same cache serves the data pages alone: no read per request to add
    bare = row.copy()
    bare[M.P_INDEX_GB] = 0.0
    assert M._page_misses(bare, hot_gb) == pytest.approx(before - 1.0, rel=1e-9)


def test_an_idle_app_does_not_queue_at_the_disk():
    """Model step 7: the reads of every app share one device queue, bounded by the threads that can
    wait on them. An app that would miss its page cache but serves no requests issues no reads, so
    its threads do not deepen the queue: MongoDB's tail is the same beside it as alone."""
    pl = load_platform("parties")
    plat = platform_row(pl)
    mongo, memc = load_profile("mongodb"), load_profile("memcached")
    rows = np.stack([lc_row(mongo, reference_knee(mongo)), lc_row(memc, reference_knee(memc))])
    alloc = np.stack([reference_alloc_row(pl, 2), reference_alloc_row(pl, 1)])
    alloc[0, M.A_MEM] = 16.0  # below MongoDB's index: most lookups read from the disk
    alloc[1, M.A_GROUP] = 2
    alloc[1, M.A_MEM] = 1.0  # below memcached's data set: it would fault, were it asked anything
    lam = np.array([0.3 * mongo.max_load_rps, 0.0])
    beside, _ = steady(plat, rows, alloc, lam)
    alone, _ = steady(plat, rows[:1], alloc[:1], lam[:1])
    assert beside[0, M.O_DISK] > 1.0  # MongoDB is reading
    assert beside[0, M.O_P99] == pytest.approx(alone[0, M.O_P99], rel=1e-9)


def test_a_warm_page_cache_is_charged_outside_the_limit():
    """Warm start (model step 4): MongoDB ran unmanaged before the first interval, so the pages it
    cached then stay outside the cgroup the manager puts it in. A 40 GB limit does not reclaim them:
    fewer reads miss than under the same limit from a cold start, the disk serves fewer of them, and
    the cgroup reports only what was charged to it since (at most the limit)."""
    runs = {}
    for start in ("warm", "cold"):
        scn = simple_scenario({"mongodb": 0.9}, be=(), page_cache=start)
        node = SimNode(scn, seed=0, initial=pinned({"mongodb": 8}, memory_gb={"mongodb": 40.0}))
        runs[start] = [node.step().apps[0] for _ in range(60)]
    warm, cold = runs["warm"][-1], runs["cold"][-1]
    assert warm.usage.disk_mbps < 0.8 * cold.usage.disk_mbps
    assert np.median([a.p99_us for a in runs["warm"]]) < np.median([a.p99_us for a in runs["cold"]])
    assert cold.usage.memory_gb == pytest.approx(40.0, abs=0.01)
    assert 0.0 <= warm.usage.memory_gb < 40.0


def test_a_warm_page_cache_yields_when_the_node_runs_short_of_memory():
    """The warm pages no limit protects go when another app's hotter pages need the node's memory
    (the same water level as every page, model step 4), at the reclaim rate: MongoDB's warm cache
    fills the node while Memcached idles, and shrinks once Memcached's load rises; Memcached then
    gets room for its whole data set."""
    rise = {"kind": "step", "steps": [[0, 0.0], [10, 0.5]]}
    scn = simple_scenario({"mongodb": 0.5, "memcached": rise}, be=(), page_cache="warm")
    node = SimNode(
        scn,
        seed=0,
        initial=pinned(
            {"mongodb": 7, "memcached": 7},
            ways={"mongodb": 10, "memcached": 10},
            memory_gb={"mongodb": 1.0, "memcached": 20.0},
        ),
    )
    state = node._sim.a["state"][node._index]
    node.step()
    early = state[0, M.S_UNCH]
    for _ in range(80):
        obs = node.step()
    late = state[0, M.S_UNCH]
    node_gb = load_platform("parties").memory.gb
    assert early == pytest.approx(node_gb, abs=0.5)  # idle Memcached's pages are touched by nobody
    # Memcached's hotter pages take its whole data set; MongoDB's warm cache keeps the rest
    assert late == pytest.approx(node_gb - load_profile("memcached").dataset_gb, abs=0.5)
    assert obs.apps[1].usage.memory_gb > 0.0  # faulted in since, charged to Memcached


def test_a_warm_batch_job_keeps_its_anonymous_memory():
    """A batch job's memory is anonymous: it warmed with the rest (touched as it ran unmanaged), and
    without swap no shortage of node memory reclaims it, even while the job idles on no cores. So
    when it gets a core it does not fault its arrays in through MongoDB's disk."""
    scn = simple_scenario({"mongodb": 0.9, "memcached": 0.1}, page_cache="warm")
    node = SimNode(
        scn,
        seed=0,
        initial=pinned(
            {"mongodb": 7, "memcached": 7},
            ways={"mongodb": 9, "memcached": 9, "be_parties": 2},
            memory_gb={"be_parties": 1.0},
        ),
    )
    state = node._sim.a["state"][node._index]
    be = list(node._sim.layouts[node._index].be["be_parties"])
    data = node._sim.a["prm"][node._index, be, M.P_DATA_GB]
    for _ in range(10):
        node.step()
    alloc = node.current_allocation()
    alloc = alloc.replace_app("memcached", cores=6.0).replace_app("be_parties", cores=1.0)
    tails = [node.step(alloc).apps[0].tardiness for _ in range(10)]
    np.testing.assert_allclose(state[be, M.S_UNCH], data)
    assert max(tails) < 1.0


def test_unpartitioned_cores_share_and_slow_everyone_down():
    """Unmanaged (PARTIES Sec. 5.2.3): the BE job's 28 threads share the LC app's cores."""
    from env.allocations import fair_allocation, unmanaged_allocation

    scn = simple_scenario({"memcached": 0.5})
    fair = SimNode(scn, seed=0, initial=fair_allocation)
    shared = SimNode(scn, seed=0, initial=unmanaged_allocation)
    pf = [fair.step().apps[0].tardiness for _ in range(30)]
    ps = [shared.step().apps[0].tardiness for _ in range(30)]
    assert np.median(ps) > 2 * np.median(pf)


def test_a_request_pays_smt_only_as_often_as_its_sibling_hyperthread_is_busy():
    """Moses' 8 threads on 4 cores would fill both hyperthreads of every core, and do at saturation:
    its capacity is the SMT one, about half the whole node's. At 10% load about one thread is busy
    and Linux runs it alone on a core, so on PARTIES' fair share for Fig. 9 (6 ways, nominal
    frequency) its requests are served as fast as on all 14 cores (Sec. 5.3: at that start every app
    has more slack than the downsize threshold); at 70% the siblings are busy and 4 cores are slower."""
    setups = [
        Setup(
            simple_scenario({"moses": 0.1}, be=()),
            pinned({"moses": k}, ways={"moses": 6}, freq_mhz={"moses": 2200}),
        )
        for k in (4, 14)
    ]
    out, _, _ = analytic_outputs(setups, np.array([0.1, 0.7]))
    p99 = out[:, :, 0, M.O_P99]
    cap = out[:, :, 0, M.O_CAP]
    assert p99[0, 0] < 1.01 * p99[1, 0]  # 10%: no busy sibling (1.14x before this mechanism)
    assert p99[0, 1] > 1.3 * p99[1, 1]  # 70%: busy siblings
    assert 0.45 < cap[0, 0] / cap[1, 0] < 0.55  # saturation: 8 hyperthreads at moses' SMT speed


def test_without_hyperthreads_oversubscription_time_shares_without_an_smt_penalty():
    """On a node with one hardware thread per core (the Q-PRM server, Sec. 5.1), BE threads in the
    LC app's cpuset cost it a CPU share, not an SMT slowdown, and the app recovers once the BE job
    is throttled (a saturated app must not latch into overload). Two CPU-bound BE threads
    (`be_stress_cpu2`) beside memcached's 9 on 9 cores leave it 9/11 of them, below its 95% load."""
    import numpy as np

    from env.sim.scenario import load_scenario

    base = load_scenario("qprm-sinusoid-namd")
    be = "be_stress_cpu2"
    scn = dataclasses.replace(base, apps=(dataclasses.replace(base.apps[0], load=0.95),), be=(be,))
    node = SimNode(scn, seed=0, initial=pinned({"memcached": 9}, shared_llc=True))
    start = node.current_allocation()
    mc = start["memcached"]
    shared = start.replace_app(
        be, cores=mc.cores, core_group=mc.core_group, clos=mc.clos, freq_mhz=mc.freq_mhz
    )
    free = [node.step(shared).apps[0] for _ in range(30)]  # the BE job unthrottled in memcached's cpuset
    quiet = shared.replace_app(be, cpu_quota=0.01)  # the PRM's level 0
    after = [node.step(quiet).apps[0] for _ in range(60)]
    assert free[-1].tardiness > 1  # 95% load with 9/11 of the CPU: really overloaded
    assert after[0].tardiness > 1  # the backlog takes several intervals to drain...
    assert np.mean([a.tardiness <= 1 for a in after[20:]]) > 0.9  # ...then it recovers (no latch)


def test_lru_sharing_reusing_thrashers_squeeze_an_app_but_a_scan_does_not():
    """Che's approximation with scan resistance: threads cycling over arrays that fit (PARTIES
    Table 3 "LLC bandwidth") take the LLC from memcached; one thread streaming an LLC-sized array
    ("LLC capacity") cannot fit beside it and is demoted by adaptive insertion, as are threads
    streaming arrays far larger than the LLC ("memory bandwidth", 512 MB each)."""
    from env.sim.experiments import with_antagonist

    out, _, _ = analytic_outputs(
        [
            with_antagonist("memcached", None),
            with_antagonist("memcached", "memory_bandwidth"),
            with_antagonist("memcached", "llc_bandwidth"),
            with_antagonist("memcached", "llc_capacity"),
        ],
        np.array([0.5]),
    )
    alone, scan, reuse, llc_sized = (float(out[i, 0, 0, M.O_LLC]) for i in range(4))
    llc = load_platform("parties").llc.mb
    assert scan > 0.2 * min(alone, llc) and llc_sized > 0.2 * min(alone, llc)
    assert reuse < 0.25 * min(scan, llc_sized)
    # every member of the shared partition together holds at most the partition
    assert float(out[2, 0, :, M.O_LLC].sum()) <= llc * (1 + 1e-6)


# ---- a thread pool over few cores; threads blocked on the disk ---------------------------------------
def test_a_pool_over_few_cores_is_stretched_only_by_requests_beyond_the_hardware_threads():
    """14 worker threads on 2 cores: at low load only ~1 request is in service, so it runs at full
    speed (PARTIES Fig. 2: Moses meets QoS at 30% load on a few cores); near saturation the pool's
    extra threads time-share the cores and stretch long requests."""
    from env.sim.experiments import alone, fig2_setup

    def p99(cores: int, load: float) -> float:
        out, _, _ = analytic_outputs([fig2_setup("moses", load, cores, 20)], np.array([load]))
        return float(out[0, 0, 0, M.O_P99])

    assert p99(2, 0.1) == pytest.approx(p99(14, 0.1), rel=0.25)  # no stretch at low load
    assert p99(2, 0.1) < 0.015  # within Moses' 15 ms target

    from env.sim.fit import _Patched
    from env.sim.profiles import load_profile

    # Sphinx with near-deterministic service (cv^2 < 1), so that sharing a core stretches a long
    # request more than waiting in a FIFO queue would (with very variable service, processor sharing
    # is the better discipline for the tail and the two cross)
    near_det = dataclasses.replace(load_profile("sphinx"), service_cv2=0.66, service_det=0.54)

    def sphinx_on_2_cores(threads: int, load: float) -> np.ndarray:
        """The kernel's outputs for Sphinx on 2 cores (long requests: every extra thread shares)."""
        s = alone("sphinx", cores=2, overrides={"threads": threads}).at_loads({"sphinx": load})
        with _Patched(near_det):
            out, _, _ = analytic_outputs([s], np.array([load]))
        return out[0, 0, 0]

    def sphinx_p99(threads: int, load: float) -> float:
        return float(sphinx_on_2_cores(threads, load)[M.O_P99])

    # near saturation: 85% of what the 2 cores serve when offered far more than their capacity
    near = 0.85 * float(sphinx_on_2_cores(4, OVERLOAD)[M.O_SERVED]) / near_det.max_load_rps

    assert sphinx_p99(14, 0.1) == pytest.approx(sphinx_p99(4, 0.1), rel=1e-6)  # 4 = its hardware threads
    assert sphinx_p99(14, near) > 1.1 * sphinx_p99(4, near)  # queued requests time-share instead of waiting


def test_ncq_read_time_is_mm1_for_a_fifo_disk_and_faster_with_command_queueing():
    iops = 180.0
    for x in (20.0, 90.0, 150.0):
        assert M._ncq_read_time(x, iops, 0.0, 32.0, 1000.0) == pytest.approx(1.0 / (iops - x), rel=1e-3)
    # command queueing: the same reads wait less, and a deeper queue is served faster than iops
    assert M._ncq_read_time(150.0, iops, 0.25, 32.0, 1000.0) < 0.5 * M._ncq_read_time(
        150.0, iops, 0.0, 32.0, 1000.0
    )
    assert math.isfinite(M._ncq_read_time(400.0, iops, 0.25, 32.0, 16.0))  # past the FIFO disk's capacity
    # bounded by the threads that can wait on a read: past saturation the read time is n / rate(n)
    assert M._ncq_read_time(1e6, iops, 0.25, 32.0, 8.0) == pytest.approx(8.0 / (iops * 8.0**0.25), rel=1e-3)


def test_mongodbs_knee_is_its_threads_blocked_on_reads():
    """PARTIES Sec. 5.2.1: an I/O-bound app's capacity is its threads over the time a request holds
    one (CPU, hold, reads); more connections (threads) serve more of the same load."""
    from env.sim.experiments import alone

    def cap(threads: int) -> float:
        s = alone("mongodb", cores=8, overrides={"threads": threads})
        out, _, _ = analytic_outputs([s], np.array([0.5]))
        return float(out[0, 0, 0, M.O_CAP])

    assert cap(16) > 1.5 * cap(8)  # the disk has room: the threads are the knee
    s8 = alone("mongodb", cores=8)
    out, _, _ = analytic_outputs([s8], np.array([0.5, 1.0]))
    assert out[0, 1, 0, M.O_CAP] < out[0, 0, 0, M.O_CAP]  # reads wait longer as the disk's queue deepens


def test_cfs_shares_split_a_shared_cpuset_by_weight_and_stay_work_conserving():
    """Intel PRM gives LC containers cpu.shares 200000 and BE containers 2 (eris/cpuquota.py:35-36,
    eris/eris.py:249-253): a BE thread in the LC app's cpuset then takes almost nothing from the
    saturated LC app (it did take 1/10 of the CPU by runnable thread), yet still runs on what the
    LC app leaves idle. Unset shares keep sharing by runnable thread."""
    from env.sim.scenario import load_scenario

    base = load_scenario("qprm-sinusoid-namd")

    def run(load: float, lc_shares: int, be_shares: int):
        scn = dataclasses.replace(base, apps=(dataclasses.replace(base.apps[0], load=load),))
        node = SimNode(scn, seed=0, initial=pinned({"memcached": 9}, shared_llc=True))
        mc = node.current_allocation()["memcached"]
        shared = (
            node.current_allocation()
            .replace_app(
                "be_namd", cores=mc.cores, core_group=mc.core_group, clos=mc.clos, freq_mhz=mc.freq_mhz
            )
            .replace_app("memcached", cpu_shares=lc_shares)
            .replace_app("be_namd", cpu_shares=be_shares)
        )
        obs = [node.step(shared) for _ in range(30)]
        cap = float(node._sim.a["out"][0, node._lc_list[0], M.O_CAP])
        return obs, cap

    by_thread, cap_thread = run(0.95, 0, 0)
    weighted, cap_weighted = run(0.95, 200_000, 2)
    assert cap_weighted == pytest.approx(cap_thread * 10 / 9, rel=0.02)  # 9 of 9 cores, not 9 of 10
    assert by_thread[-1].apps[0].tardiness > 1 >= np.median([o.apps[0].tardiness for o in weighted[10:]])
    light_thread, _ = run(0.3, 0, 0)
    light_weighted, _ = run(0.3, 200_000, 2)
    be = [np.mean([o.be_throughput for o in r[10:]]) for r in (light_thread, light_weighted)]
    assert be[1] == pytest.approx(be[0], rel=0.05) and be[1] > 0  # idle CPU still goes to the BE job


# ---- CPU quota mode and CFS bandwidth control (small machines) ----------------------------------
def _quota_node(**kw):
    """The 2-core VM platform trading cores in CPU-quota steps (as `hw.LinuxNode` there)."""
    return dataclasses.replace(load_platform("vm2"), name="vm2-quota", core_mode="quota", **kw)


def _web_service():
    """A CPU-heavy web service on that node (about 1 ms of CPU per request, two worker processes)."""
    from env.sim.profiles import LcProfile, Reference

    return LcProfile(
        name="web", description="test service", qos_target_us=20_000, max_load_rps=1500, threads=2,
        queue="per_thread", frac_llc=0.0, frac_mem=0.0, smt_speed=1.0, base_latency_us=300.0,
        llc_kappa_mb=1.0, llc_miss_min=0.0, llc_accesses_per_req=0.0, dram_bytes_per_req=0.0,
        dataset_gb=0.01, zipf=0.9, pages_per_req=0.0, io_kb=4.0, net_bytes_per_req=0.0,
        threads_follow_cores=False, reference=Reference("vm2", 2),
    )  # fmt: skip


def test_quota_mode_platform_trades_cores_in_quota_steps_on_every_core(tmp_path):
    """`core_mode: quota`: a CORE move is a quota step; every app runs on all cores under a CFS quota
    of its cores (split among its group's apps), a group holding every core is no limit, none pauses."""
    from pathlib import Path

    import yaml

    from env.allocations import unmanaged_allocation
    from env.sim.engine import alloc_rows, build_layout
    from env.sim.scenario import AppEntry, Scenario

    pl = _quota_node(quota_step_cores=0.25, knobs=("core", "mem"))
    caps = pl.capabilities()
    assert caps.core_step == 0.25 and {k.value for k in caps.knobs} == {"core", "mem"}
    path = tmp_path / "vmq.yaml"
    data = yaml.safe_load(Path("configs/node/vm2.yaml").read_text())
    path.write_text(yaml.safe_dump({**data, "core_mode": "quota", "quota_step_cores": 0.25}))
    scn = Scenario(name="q", apps=(AppEntry("memcached", load=0.01),), platform=str(path), be=("be_parties",))
    node = SimNode(scn, seed=0)
    fair = node.current_allocation()  # PARTIES' fair start: the LC app holds the node, the BE job waits
    assert (fair["memcached"].cores, fair["be_parties"].cores) == (2.0, 0.0)
    lay = build_layout(scn)
    paused = alloc_rows(lay, fair, None)
    assert paused[0, M.A_QUOTA] == 0.0 and paused[1, M.A_CORES] == paused[2, M.A_CORES] == 0.0
    split = fair.replace_app("memcached", cores=1.25).replace_app("be_parties", cores=0.75)
    rows = alloc_rows(lay, split, None)
    assert set(rows[:, M.A_CORES]) == {2.0} and set(rows[:, M.A_GROUP]) == {0.0}
    assert rows[0, M.A_QUOTA] == 1.25
    assert rows[1, M.A_QUOTA] + rows[2, M.A_QUOTA] == pytest.approx(0.75)  # its thread classes share it
    shared = alloc_rows(lay, unmanaged_allocation(node.capabilities()), None)
    assert set(shared[:, M.A_QUOTA]) == {0.0}  # the whole node: no quota at all
    obs = [node.step(split) for _ in range(4)]
    assert obs[-1].be_throughput > 0 and obs[-1].apps[0].valid


def test_a_binding_cfs_quota_makes_requests_wait_for_the_next_period_not_run_slower():
    """Linux CFS bandwidth control: below its demand's fluctuations a quota throttles the app for
    the rest of a period, so the tail grows towards the period; a quota above them changes nothing
    (requests still run at full speed on both cores), a shorter period shortens the waits, and
    runtime stranded on the other CPU makes the same quota bind harder."""
    from env.sim.fit import MeasuredPoint, simulate_points

    prof = _web_service()
    rate = 250.0

    def p99(quota, **node):
        return float(simulate_points(prof, _quota_node(**node), [MeasuredPoint(rate, quota, 1.0)])[0])

    free, generous, tight = p99(2.0), p99(1.0), p99(0.3)
    demand = rate * 1e-3  # ~0.25 cores
    assert generous == pytest.approx(free, rel=0.02)
    assert tight > 3 * free
    assert tight < 100_000 * (1 - demand / 2) + 2 * free  # at most about a period's rest
    assert p99(0.3, cfs_period_ms=20.0) < tight
    assert p99(0.3, cfs_stranded_ms=3.0) > tight


def test_on_a_quota_node_a_waking_thread_waits_when_the_others_hold_every_cpu():
    """Quota mode pins nothing: beside a CPU-bound BE job whose quota leaves a CPU free the app
    wakes at once; as the job's quota fills the last CPU the app's requests wait for a CPU (the
    node's wake-up delay). Its CPU use is reported against its quota, as a real cgroup's is."""
    from env.sim.fit import MeasuredPoint, simulate_points

    prof = _web_service()
    node = _quota_node(sched_wakeup_delay_ms=2.0, cfs_resume_wait_ms=0.0)  # (the next test's mechanism)

    def p99(be_quota):
        pt = MeasuredPoint(100.0, 0.5, 1.0, be_threads=2 if be_quota else 0, be_quota_cores=be_quota)
        return float(simulate_points(prof, node, [pt])[0])

    alone, one_cpu_free, most, all_of_it = p99(0.0), p99(1.0), p99(1.5), p99(1.9)
    assert one_cpu_free == pytest.approx(alone, rel=0.05)  # (time-sharing by runnable threads)
    assert alone < most < all_of_it
    assert all_of_it > alone + 2_000  # a wake-up delay of 2 ms, at most every request
    cpuset_node = dataclasses.replace(node, core_mode="cpuset")  # the oversubscription rule only
    pt = MeasuredPoint(100.0, 0.5, 1.0, be_threads=2, be_quota_cores=1.5)
    assert float(simulate_points(prof, cpuset_node, [pt])[0]) == pytest.approx(alone, rel=0.06)


def test_a_co_runner_throttled_by_its_quota_delays_the_requests_its_resumes_preempt():
    """Linux CFS bandwidth control throttles a group whose threads ask for more than its quota for
    the rest of each period; they resume together at the next one and hold the CPUs they land on
    for a slice. So a BE job throttled that way costs an LC app more of its tail than one using as
    much CPU unthrottled (measured on the 2-core VM: README, "Bring your own service"), a job
    resuming on both CPUs more than on one, and a longer period less; a node that does not model it
    (`cfs_resume_wait_ms` 0, the papers' nodes) sees none of it."""
    from env.sim.fit import MeasuredPoint, simulate_points

    prof = load_profile("memcached-vm")
    node = _quota_node(sched_wakeup_delay_ms=0.05, cfs_resume_wait_ms=0.75)

    def p99(threads, be_quota, pl=node):
        pt = MeasuredPoint(1000.0, 0.5, 1.0, be_threads=threads, be_quota_cores=be_quota)
        return float(simulate_points(prof, pl, [pt])[0])

    alone = p99(0, 0.0)
    unthrottled = p99(1, 1.0)  # one thread under a quota of a whole core: never throttled
    one_cpu = p99(1, 0.5)  # half the CPU time, throttled every period
    two_cpus = p99(2, 1.0)  # as much CPU as the unthrottled one, resuming on both CPUs
    assert unthrottled == pytest.approx(alone, rel=0.02)
    assert one_cpu > 1.05 * unthrottled  # 0.75% of its requests wait: at the p99's edge
    assert two_cpus > 1.5 * one_cpu  # 1.5%: past it
    assert (
        p99(2, 1.0, _quota_node(sched_wakeup_delay_ms=0.05, cfs_resume_wait_ms=0.75, cfs_period_ms=400.0))
        < two_cpus
    )
    off = _quota_node(sched_wakeup_delay_ms=0.05, cfs_resume_wait_ms=0.0)
    assert p99(2, 1.0, off) == pytest.approx(p99(0, 0.0, off), rel=0.02)


def test_mba_delays_every_off_core_access_linearly_in_the_throttle():
    """CoCo Sec. 2: MBA is a request-rate controller between the cores and the interconnect, so it
    delays LLC hits as well as DRAM accesses (Sec. 3.2: "bandwidth to LLC may also be reduced"), by
    a delay linear in the throttle (Intel's MBA reports a linear response). An app none of whose
    accesses reach DRAM still slows under a throttle, and the stretch at 20% is four times the
    stretch at 80%."""
    from env.sim.experiments import alone
    from env.sim.fit import _Patched

    def stretch(app: str) -> np.ndarray:
        setups = [alone(app, platform="coco", cores=8, mba={app: p}) for p in (100, 80, 20)]
        out, _, _ = analytic_outputs(setups, np.array([0.05]))
        return out[:, 0, 0, M.O_SLOW]

    s100, s80, s20 = stretch("memcached")
    assert s100 < s80 < s20
    assert (s20 - s100) / (s80 - s100) == pytest.approx(4.0, rel=0.05)

    llc_only = dataclasses.replace(load_profile("nginx"), frac_mem=0.0, frac_llc=0.5)
    with _Patched(llc_only):
        s100, _, s20 = stretch("nginx")
    delay = load_platform("coco").mba.delay
    assert s20 > s100 * (1.0 + 0.5 * delay * 0.8 * 0.9)  # the LLC half of its time, throttled to 20%


def test_a_request_reads_at_most_one_dram_line_per_llc_access():
    """Squeezed to one LLC way, Sphinx's fitted miss curve misses 40x more often than at the whole
    LLC, but its profile has 17% of its LLC accesses missing there (3.1 GB/s of DRAM at 14 rps,
    PARTIES Table 2, over its LLC accesses): a request cannot read more lines from DRAM than it
    accesses, so its DRAM traffic and the DRAM part of its service time grow at most 1 / 0.17 times.
    On the whole LLC the bound does not bind and nothing changes."""
    prof = load_profile("sphinx")
    lines_per_req = prof.llc_accesses_per_req
    at_ref = prof.dram_bytes_per_req / 64.0 / lines_per_req
    ways_per_mb = 20 / load_platform("parties").llc.mb

    def run(ways: int) -> np.ndarray:
        s = Setup(simple_scenario({"sphinx": 0.3}, be=()), pinned({"sphinx": 8}, ways={"sphinx": ways}))
        out, _, _ = analytic_outputs([s], np.array([0.3]))
        return out[0, 0, 0]

    full, one = run(20), run(1)
    assert one[M.O_LLC] * ways_per_mb <= 1.0 + 1e-6 < full[M.O_LLC] * ways_per_mb
    curve = lambda x: M._miss(x, prof.llc_kappa_mb, prof.llc_alpha, 1e9, prof.llc_miss_min, 0.0)  # noqa: E731
    assert curve(one[M.O_LLC]) / curve(full[M.O_LLC]) > 2.0 / at_ref  # the curve alone would exceed it
    per_req = lambda o: o[M.O_MBW] * 1e9 / o[M.O_SERVED] / 64.0  # noqa: E731  DRAM lines a request reads
    assert per_req(one) == pytest.approx(lines_per_req, rel=0.02)
    assert per_req(full) == pytest.approx(at_ref * lines_per_req, rel=0.02)
    fcore = 1.0 - prof.frac_llc - prof.frac_mem
    assert one[M.O_SLOW] <= (fcore + prof.frac_llc + prof.frac_mem / at_ref) * 1.3  # uncore queueing aside
