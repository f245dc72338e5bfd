"""The simulator's physics: one compiled step over many nodes at once (DESIGN §4).

`step_nodes` advances B nodes by one interval. Each node runs W *components*: an LC app is one
component; a batch job (the BE job, an antagonist) has one component per thread class. Everything is
a float64 array so that one numba kernel serves both the scalar `SimNode` (B = 1) and the batched
training mode; randomness (Poisson arrival counts, the order statistic that becomes the measured
p99) is drawn outside with an injected numpy Generator, so runs are deterministic under a seed.

Per interval, per node:

1. **Cores.** Busy threads of the components sharing a core group spread over its cores as Linux
   would: one per physical core, then onto sibling hyperthreads (per-thread speed `smt_speed`),
   then time-sharing (speed shrinks with the oversubscription; a waking thread may find its
   hyperthread held by another runnable thread and waits `sched_wakeup_delay_ms`). An LC app's
   capacity, and how fast its queue drains while every server is busy, are those of all its threads
   runnable; a request's own service meets a busy sibling only as often as the threads its offered
   load keeps busy (Little) outnumber its cores, so at low load on fewer cores than threads it runs
   at a whole core's speed (PARTIES Sec. 5.3: on Fig. 9's fair share every app has slack). Time-sharing
   goes by runnable thread, unless a workload of the group has CFS shares (`cpu.shares`): then the
   group's hardware threads are split by weighted max-min over its workloads (weight = shares, the
   kernel's 1024 where unset), each capped by its runnable threads. Antagonists
   pinned to an app's own hyperthreads (PARTIES Table 3 "hyperthread") halve its hardware threads
   (its capacity) and always make a waking request wait, but a request in service runs at full
   speed (CFS would halve that too: measured with and without, README "Sphinx beside the
   hyperthread antagonist"); on the sibling hyperthreads ("CPU") they force the SMT speed. On a
   quota-mode platform nothing pins a thread to a core, so a waking thread also waits whenever the other
   workloads' runnable threads hold every CPU: with probability n_other - (cores - 1), clipped.
   A batch co-runner whose CFS quota binds is throttled for the rest of each period and its
   threads resume together at the next one (Linux sched-bwc.rst), each preempting what it finds
   on its CPU for a slice: the requests of an LC app sharing those cores that arrive there meanwhile
   wait (a share resumes x slice / (CPUs x period), the slice twice the node's
   `cfs_resume_wait_ms`, the mean wait). Measured on a 2-core VM, where such a co-runner cost
   memcached more intervals than an unthrottled one using as much CPU (README, "Bring your own
   service"); 0 on the papers' nodes, where nothing measured it.
2. **Power and turbo.** Groups capped at the turbo level share one frequency: the turbo bin for the
   number of active cores, lowered until the socket fits its TDP (dynamic power ~ f^3 x power
   factor per busy core). Fixed (userspace) levels are applied as set.
3. **LLC.** Components of a CLOS share its ways under LRU, by Che's approximation: one
   characteristic time T for the partition, each component holding its working set W(T) (from its
   miss curve for reuse patterns; what it streamed for array-cycling threads, a pure scan being
   demoted by Intel's adaptive, scan-resistant insertion). The
   miss ratio follows each profile's miss curve. Growth is lagged by the fill rate (cache warm-up
   after a CAT change); a CLOS migration flushes the app's lines (CoCo Sec. 3.3).
4. **Memory capacity.** Resident memory is the most frequently touched pages: a water-filling
   over every component's Zipf page-popularity under its cgroup limit and the node's capacity.
   An app with an index (MongoDB's _id B-tree) also reads one of its leaves per request; with
   hashed keys the leaves are touched about equally, so the index is kept whole once the data
   pages hotter than a leaf are, and until then most lookups miss (PARTIES Fig. 3's memory
   threshold). Touches of non-resident pages are page faults served by the disk. Residency grows at the
   fault-in rate and shrinks at the reclaim rate (the lags of a MEM move). On a warm start
   (`PL_WARM_START`: the apps ran unmanaged before the first interval, as services do before a
   manager takes them over) the pages they faulted in then stay charged outside their cgroups
   (Linux does not move a task's charges with it): no limit reclaims them, only a shortage of the
   node's memory does (they are kept by the same water level as the rest). A cgroup's usage, the
   resident memory reported, is what was charged to it.
5. **DRAM and uncore.** Traffic = progress x bytes per unit x (miss ratio / reference miss
   ratio). Loaded memory latency grows as u^2/(1-u) with utilisation u. The same form for uncore
   (LLC) bandwidth. MBA is a request-rate controller between a core and the interconnect (CoCo
   Sec. 2), so it delays every request leaving the core's private caches, LLC hits as well as DRAM
   accesses (CoCo Sec. 3.2: "bandwidth to LLC may also be reduced"), by a delay that grows linearly
   with the throttle (`_mba_latency`). Batch progress and traffic are solved as a short fixed point.
6. **Service time.** S = S_ref x (f_core x f_nom/f + f_llc x llc_latency + f_mem x miss_factor x
   mem_latency) / speed, with S_ref the service time at nominal frequency, reference occupancy and
   idle memory.
7. **Disk and network.** Disk time is shared max-min fairly among its users (blkio caps
   included); a sequential stream makes each random read wait up to an I/O-scheduler slice.
   The link is shared max-min by flows under each HTB ceil; past ~95% utilisation a standing
   queue delays every response. Both are queues in tandem with the CPU.
8. **Latency.** Requests queue on the app's threads: M/M/1 per thread (`per_thread`) or M/M/c
   (`shared`, Erlang C), with the waiting time stretched by (1 + cv^2)/2 for non-exponential
   service. Per-thread workers that accept their own connections may share them unevenly
   (`P_IMBAL`): the busiest worker's queue and the others' are then a mixture weighted by the
   requests each serves, so the tail crosses the target while the other workers still have room
   (the knee below the max RPS, PARTIES Sec. 3.2); it matters only while each worker has a hardware
   thread of its own. The sojourn tail is a sum of exponentials, convolved in closed form with page-fault
   I/O, scheduling delay and link queueing. A fluid backlog carries overload across intervals
   (requests older than the timeout are dropped), so an overloaded app recovers over several
   intervals. The measured p99 of an interval with n requests is the order statistic
   k = floor(0.99 n + 1/2) (`env.histogram.quantile_rank`): its CDF value U ~ Beta(k, n - k + 1)
   is drawn outside and inverted here, so the noise grows as fewer requests are seen. In the M/M/1 limit (one thread, no other
   component) the p99 is exactly Heracles' Eq. (1): ln(100) / (mu - lambda).
   A CFS quota (`A_QUOTA`) that binds is not a slower server: the app runs at full speed until
   the period's quota is used, then waits for the next period (Linux CFS bandwidth control), so
   the requests of a throttled window wait up to its length (`_cfs_throttle`, the uniform part
   of the latency when there is no backlog) and capacity is the quota.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# ---- platform row -------------------------------------------------------------------------------
PL_CORES = 0
PL_TPC = 1
PL_SOCKET_CORES = 2
PL_LLC_WAYS = 3
PL_LLC_MB = 4
PL_LLC_BW = 5
PL_LLC_CONT = 6
PL_MBA_DELAY = 7
PL_FMIN = 8
PL_FNOM = 9
PL_FTURBO = 10
PL_FALLTURBO = 11
PL_TDP = 12
PL_UNCORE_W = 13
PL_CORE_IDLE_W = 14
PL_CORE_DYN_W = 15
PL_IRQ_ACTIVE = 16
PL_MEM_GB = 17
PL_MEM_BW = 18
PL_MEM_Q = 19
PL_RECLAIM = 20
PL_DISK_IOPS = 21
PL_DISK_SEQ = 22
PL_DISK_SLICE_S = 23
PL_NET_GBPS = 24
PL_NET_CONG_S = 25
PL_SCHED_S = 26
PL_MIG_PEN = 27
PL_DT = 28
PL_LLC_STREAM_W = 29  # weight of streamed lines in LLC sharing (adaptive, scan-resistant insertion)
PL_SCHED_SLICE_S = 30  # CFS time slice: requests longer than this are stretched by time-sharing
PL_DISK_NCQ = 31  # NCQ exponent: d outstanding random reads complete at iops x d^ncq
PL_DISK_QD = 32  # the device's command queue depth
PL_CFS_PERIOD_S = 33  # CFS bandwidth period (cpu.cfs_period_us): a quota is granted per period
PL_CFS_STRAND_S = 34  # quota stranded on each further CPU a throttled group runs on (per-CPU runtime slices)
PL_QUOTA_MODE = 35  # 1: cores are CPU quotas on every core (no cpuset pins a thread), 0: cpusets
PL_WARM_START = 36  # > 0: the node memory (GB) the apps ran unmanaged in before the first interval (model step 4); 0: a cold start
PL_CFS_RESUME_S = 37  # mean wait behind a co-runner resuming from CFS throttling (step 1); 0: none
NPL = 38

# ---- component parameters -----------------------------------------------------------------------
P_ACTIVE = 0
P_KIND = 1  # 0 = LC app, 1 = batch thread class
P_THREADS = 2
P_SREF = 3  # LC: reference service time (s); batch: 1
P_FLLC = 4
P_FMEM = 5
P_SMT = 6
P_PWR = 7
P_LLC_APU = 8  # LLC accesses per unit (request, or thread-second)
P_LLC_KAPPA = 9  # MB
P_LLC_FOOT = 10  # MB
P_LLC_MMIN = 11
P_LLC_STREAM = 12
P_LLC_MREF = 13  # miss ratio at the reference occupancy
P_DRAM = 14  # GB per unit at the reference miss ratio
P_DATA_GB = 15
P_ZIPF = 16
P_PAGES = 17  # page touches per unit
P_IO_KB = 18
P_SEQ_MB = 19  # sequential disk MB per unit
P_NET_GBIT = 20  # Gbit per unit
P_FLOWS = 21
P_BASE_S = 22
P_CV2 = 23
P_PERTHREAD = 24
P_TIMEOUT_S = 25
P_PLACE = 26  # 0 allocated, 1 same hyperthreads as target, 2 sibling hyperthreads, 3 free cores
P_TARGET = 27  # component index an antagonist is pinned to
P_QOS_S = 28
P_BUSY = 29  # batch: fraction of time each thread is runnable (dd and iperf mostly wait)
P_IOS = 30  # sequential disk reads per page-cache miss event (index + data pages)
P_LLC_ALPHA = 31  # power-law exponent of the miss curve
P_DET = 32  # deterministic share of the service time (the rest is exponential): cv^2 = (1 - det)^2
P_PRESS = 33  # how much this workload's thread slows its sibling hyperthread (compute hog = 1)
P_HOLD_S = 34  # LC: thread time per request besides CPU and disk reads (s)
P_IMBAL = 35  # LC, per_thread: the busiest worker's share of the requests over an even split (>= 1)
P_INDEX_GB = 36  # LC: index leaf pages, one touched per request with near-uniform popularity (model step 4)
P_GTAB = 37  # LC: G(x_j) = integral_0^x_j dx / m(x) (MB) at x_j = footprint * GRID[j] (Che's working set)
NG = 24
NP = P_GTAB + NG
GRID = np.geomspace(1e-6, 1.0, NG)

# ---- allocation row -----------------------------------------------------------------------------
A_CORES = 0
A_GROUP = 1
A_WAYS = 2
A_CLOS = 3
A_MBA = 4
A_FREQ = 5  # MHz cap; >= turbo level means turbo
A_MEM = 6
A_DISK = 7  # MB/s cap
A_NET = 8  # Gbps cap
A_MOVED = 9  # cores changed this interval (thread migration)
A_FLUSH = 10  # CLOS changed this interval (its lines are flushed)
A_QUOTA = 11  # CPU quota within the group, cores (0 = none)
A_SHARES = 12  # CFS weight within the group (cgroup cpu.shares; 0 = not set)
NA = 13

# ---- state --------------------------------------------------------------------------------------
S_Q = 0  # backlog, requests
S_OCC = 1  # LLC occupancy, MB
S_RES = 2  # resident memory, GB
S_BUSY = 3  # busy threads last interval
S_RATE = 4  # batch: progress rate last interval (units/s)
S_INIT = 5  # 1 once occupancy and residency were initialised
S_CAP = 6  # LC: bottleneck capacity last interval (rps)
S_OFFER = 7  # LC: offered (mean) arrivals this interval, set by the caller before a sampled step; 0 = use `arrivals`
S_UNCH = 8  # resident memory charged outside the app's cgroup (warmed before the manager placed it), GB
NS = 9

# ---- outputs ------------------------------------------------------------------------------------
O_P99 = 0  # s; NaN when no request was seen
O_TAIL_T = 1  # P(latency > QoS target): the deterministic view of this interval
O_SERVED = 2  # rps
O_DROPPED = 3  # rps
O_UTIL = 4  # busy fraction of the group's cores
O_LLC = 5  # MB
O_MBW = 6  # GB/s
O_MEM = 7  # GB resident
O_DISK = 8  # MB/s
O_NET = 9  # Gbps
O_FREQ = 10  # MHz
O_PROG = 11  # batch progress, units/s
O_SLOW = 12  # service stretch factor
O_RHO = 13  # offered load / CPU capacity
O_CAP = 14  # bottleneck capacity, rps
NO = 15

N_MBW = 0
N_POWER = 1
N_MEMU = 2
N_LLCU = 3
N_LINKU = 4
N_FTURBO = 5
NNO = 6

# ---- an LC app's latency distribution over the interval ----------------------------------------
# P(latency > x) = _tail_total(x - shift, coef, rate, n, fb, wa, wb) for the requests served;
# `dropped` requests time out (latency `timeout`, the value a load generator records for them).
MAXT = 8  # terms of the sum of exponentials
D_N = 0
D_COEF = 1
D_RATE = D_COEF + MAXT
D_FB = D_RATE + MAXT
D_WA = D_FB + 1
D_WB = D_WA + 1
D_SHIFT = D_WB + 1
D_DROPPED = D_SHIFT + 1  # requests
D_TIMEOUT = D_DROPPED + 1  # s
ND = D_TIMEOUT + 1

LINE_MB = 64e-6
PAGE_GB = 4096 / 1e9
LN100 = math.log(100.0)


@njit(cache=True, inline="always")
def _mba_latency(delay, pct):
    """Latency factor of an access leaving the core under an MBA throttle of `pct` % (100: none):
    1 + delay x (100 - pct) / 100. The throttle programs a delay between requests whose response is
    linear in the throttle value (CoCo Sec. 2: "a programmable request rate controller"; Intel SDM
    vol. 3, MBA: CPUID.10H.3:ECX[2] reports a linear response); `delay` is the node's, the latency
    factor added at full throttle."""
    return 1.0 + delay * (100.0 - min(max(pct, 1.0), 100.0)) / 100.0


@njit(cache=True, inline="always")
def _miss(x, kappa, alpha, foot, mmin, stream):
    """Miss ratio at occupancy x MB: a streamed array (stream: hits in proportion to the share of
    the array that fits) or a power-law reuse curve mmin + (1 - mmin) (1 + x/kappa)^-alpha."""
    if stream > 0.5:
        if foot <= 0.0:
            return 1.0
        return max(mmin, 1.0 - x / foot)
    if kappa <= 0.0:
        return mmin
    return mmin + (1.0 - mmin) * (1.0 + x / kappa) ** (-alpha)


@njit(cache=True)
def _dram_miss(p, m):
    """The miss ratio `m` as DRAM sees it, at most one line per LLC access: DRAM traffic scales as
    m / m_ref from the profile's bytes per request at the reference, where dram / 64 B / accesses of
    the accesses miss, so m can rise at most 1 / that share above m_ref whatever the fitted curve
    says (a request cannot read more lines from DRAM than it accesses; a streamed batch class,
    which reads a line per access, is at its bound already)."""
    if p[P_DRAM] > 0.0 and p[P_LLC_APU] > 0.0:
        return min(m, p[P_LLC_MREF] * p[P_LLC_APU] * LINE_MB * 1e-3 / p[P_DRAM])
    return m


@njit(cache=True)
def _working_set(p, rate, t, cap, stream_w):
    """MB of distinct lines a component touched in the last `t` seconds (Che's approximation).
    Reuse (LC apps): W solves G(W) = touched MB, with G(x) = int_0^x dx'/m(x') tabulated per app.
    Streams (batch threads cycling over arrays): everything touched, up to the footprint; a thread
    whose array is at least the partition cannot fit beside co-runners and thrashes: adaptive
    (scan-resistant) insertion demotes it. PARTIES Table 4 supports this split: one thread streaming
    an LLC-sized array barely hurts memcached, twelve reusing 1/12 of it each do."""
    touched = rate * p[P_LLC_APU] * LINE_MB * t
    foot = p[P_LLC_FOOT]
    if p[P_LLC_STREAM] > 0.5:
        if foot / max(p[P_THREADS], 1.0) >= cap:  # cannot fit beside co-runners: a scan
            touched *= stream_w
        return min(foot, touched)
    g0 = p[P_GTAB]
    if touched <= g0:
        return touched * (GRID[0] * foot) / max(g0, 1e-300)
    if touched >= p[P_GTAB + NG - 1]:
        return foot
    lo = 0
    hi = NG - 1
    while hi - lo > 1:
        m = (lo + hi) // 2
        if p[P_GTAB + m] <= touched:
            lo = m
        else:
            hi = m
    ga = p[P_GTAB + lo]
    gb = p[P_GTAB + hi]
    xa = GRID[lo] * foot
    xb = GRID[hi] * foot
    return xa + (xb - xa) * (touched - ga) / max(gb - ga, 1e-300)


@njit(cache=True)
def _harmonic(n, s):
    """Generalised harmonic number H(n, s) = sum_{i<=n} i^-s (Euler-Maclaurin, n >= 0 real)."""
    if n <= 0.0:
        return 0.0
    if n < 1.0:
        return n
    if abs(s - 1.0) < 1e-6:
        return math.log(n) + 0.5772156649 + 0.5 / n
    return (n ** (1.0 - s) - 1.0) / (1.0 - s) + 0.5 * (1.0 + n ** (-s)) + s / 12.0 * (1.0 - n ** (-s - 1.0))


@njit(cache=True)
def _miss_mass(res_pages, data_pages, s):
    """Share of page touches that miss when the res_pages most popular of data_pages are resident."""
    if data_pages <= 0.0 or res_pages >= data_pages:
        return 0.0
    if res_pages <= 0.0:
        return 1.0
    if s <= 1e-6:
        return 1.0 - res_pages / data_pages
    return max(0.0, 1.0 - _harmonic(res_pages, s) / _harmonic(data_pages, s))


@njit(cache=True)
def _index_free_pages(p, npg, ipg):
    """Data pages touched more often than an index leaf (model step 4): the Zipf ranks i with
    pages_per_req x i^-s / H(npg, s) > 1 / ipg (all or none of a uniform data set)."""
    s = p[P_ZIPF]
    if s <= 1e-6:
        return npg if p[P_PAGES] / npg > 1.0 / ipg else 0.0
    return min(npg, (p[P_PAGES] * ipg / _harmonic(npg, s)) ** (1.0 / s))


@njit(cache=True)
def _page_misses(p, res_gb):
    """Page-cache misses per unit (request) with the `res_gb` most touched of the component's
    pages resident (model step 4): its data pages' Zipf miss mass x page touches per unit, plus,
    for an app with an index (`P_INDEX_GB`), the leaf its lookup reads. A B-tree over hashed keys
    (YCSB's scrambled Zipfian) spreads the popular keys over its leaves, so each leaf is touched
    about equally: the kernel keeps the data pages hotter than a leaf, then the leaves, then the
    rest of the data pages."""
    npg = p[P_DATA_GB] / PAGE_GB
    res = res_gb / PAGE_GB
    ipg = p[P_INDEX_GB] / PAGE_GB
    if ipg <= 0.0:
        return p[P_PAGES] * _miss_mass(res, npg, p[P_ZIPF])
    hot = _index_free_pages(p, npg, ipg)
    if res <= hot:
        return p[P_PAGES] * _miss_mass(res, npg, p[P_ZIPF]) + 1.0
    if res <= hot + ipg:
        return p[P_PAGES] * _miss_mass(hot, npg, p[P_ZIPF]) + 1.0 - (res - hot) / ipg
    return p[P_PAGES] * _miss_mass(res - ipg, npg, p[P_ZIPF])


@njit(cache=True, inline="always")
def _leaf_touches(p, rate):
    """Touches per second of each leaf of an app's index (`P_INDEX_GB` > 0): one leaf per request,
    spread evenly over its leaves (model step 4)."""
    return max(rate, 1e-12) * PAGE_GB / p[P_INDEX_GB]


@njit(cache=True)
def _water_fill(prm_b, need_gb, unch_gb, rate, tau, out, out_unch, nw):
    """Resident GB per component when the kernel keeps every page touched more often than `tau`
    per second (Zipf popularity; uniform when zipf = 0); returns the sum. A component's most popular
    `unch_gb` are charged outside its cgroup (`out_unch`: what of them is kept; all of a batch
    job's), the rest to it (`out`: capped by its `need_gb`, the limit)."""
    used = 0.0
    for w in range(nw):
        p = prm_b[w]
        out[w] = 0.0
        out_unch[w] = 0.0
        if p[P_ACTIVE] < 0.5 or (need_gb[w] <= 0.0 and unch_gb[w] <= 0.0):
            continue
        npg = p[P_DATA_GB] / PAGE_GB
        touch = max(rate[w] * p[P_PAGES], 1e-12)
        s = p[P_ZIPF]
        if s <= 1e-6:
            keep = npg if touch / npg >= tau else 0.0
        else:
            keep = (touch / (tau * _harmonic(npg, s))) ** (1.0 / s)
        if p[P_INDEX_GB] > 0.0 and _leaf_touches(p, rate[w]) >= tau:
            keep += p[P_INDEX_GB] / PAGE_GB
        kept = keep * PAGE_GB
        # a batch job's memory is anonymous: without swap no reclaim takes it (an LC app's is cache)
        out_unch[w] = unch_gb[w] if p[P_KIND] > 0.5 else min(unch_gb[w], kept)
        out[w] = min(max(need_gb[w], 0.0), max(kept - unch_gb[w], 0.0))
        used += out[w] + out_unch[w]
    return used


@njit(cache=True)
def _fill_memory(prm_b, need_gb, unch_gb, rate, cap_gb, out, out_unch, nw):
    """Model step 4's targets: the resident GB each component would settle at, `out` charged to its
    cgroup (at most `need_gb`, its limit less what is charged elsewhere), `out_unch` what the node
    keeps of the `unch_gb` charged outside it. Within capacity every component keeps all of both;
    beyond it the kernel keeps the pages touched most often, wherever they are charged (a water
    level on the per-page touch rate), and what is left at the level goes to the uniformly touched
    components sitting at it (the level's discontinuity), shared in proportion to their need."""
    total = 0.0
    for w in range(nw):
        out[w] = 0.0
        out_unch[w] = 0.0
        if prm_b[w, P_ACTIVE] > 0.5:
            total += max(need_gb[w], 0.0) + unch_gb[w]
    if total <= cap_gb:
        for w in range(nw):
            if prm_b[w, P_ACTIVE] > 0.5:
                out[w] = max(need_gb[w], 0.0)
                out_unch[w] = unch_gb[w]
        return
    lo = -30.0
    hi = 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _water_fill(prm_b, need_gb, unch_gb, rate, math.exp(mid), out, out_unch, nw) > cap_gb:
            lo = mid
        else:
            hi = mid
    tau_lo, tau_hi = math.exp(lo), math.exp(hi)
    used = _water_fill(prm_b, need_gb, unch_gb, rate, tau_hi, out, out_unch, nw)
    left = cap_gb - used
    want = 0.0
    for w in range(nw):
        want += _at_level(prm_b[w], need_gb[w], out[w], rate[w], tau_lo, tau_hi)
    if left > 0.0 and want > 0.0:
        share = min(1.0, left / want)
        for w in range(nw):
            out[w] += share * _at_level(prm_b[w], need_gb[w], out[w], rate[w], tau_lo, tau_hi)


@njit(cache=True, inline="always")
def _at_level(p, need_gb, out_gb, rate, tau_lo, tau_hi):
    """GB of a component's uniformly touched pages sitting at the water level (kept at `tau_lo`,
    not at `tau_hi`) that its limit would still take: a uniform data set (any one below its need,
    as before), or an index whose leaves are touched between the two levels."""
    if p[P_ACTIVE] < 0.5 or out_gb >= need_gb:
        return 0.0
    if p[P_ZIPF] <= 1e-6:
        return need_gb - out_gb
    if p[P_INDEX_GB] > 0.0 and tau_lo <= _leaf_touches(p, rate) < tau_hi:
        return min(p[P_INDEX_GB], need_gb - out_gb)
    return 0.0


@njit(cache=True)
def _ncq_read_time(x, iops, gamma, qd, nmax):
    """Mean time (s) a random read spends at the disk, queue and service, at x reads/s: a
    birth-death chain whose service rate with n reads outstanding is iops x min(n, qd)^gamma
    (command queueing shortens seeks as the queue deepens; gamma = 0 is a FIFO disk, M/M/1), with
    at most `nmax` outstanding (the threads that can wait on a read); Little's law on the reads
    the chain accepts. Past saturation the chain sits at nmax and the read time is nmax over the
    disk's rate there: the threads' pool, not the disk, then holds the rest."""
    if iops <= 0.0:  # no disk (an unused slot of a batch): reads never complete
        return 1e300
    if x <= 0.0 or nmax < 0.5:
        return 1.0 / iops
    nm = max(1, int(nmax + 0.5))
    wgt = 1.0
    tot = 1.0
    num = 0.0
    for n in range(1, nm + 1):
        wgt *= x / (iops * min(float(n), qd) ** gamma)
        tot += wgt
        num += n * wgt
        if tot > 1e150:
            wgt *= 1e-150
            tot *= 1e-150
            num *= 1e-150
    accepted = x * (1.0 - wgt / tot)
    return max((num / tot) / max(accepted, 1e-12), 1.0 / (iops * min(float(nm), qd) ** gamma))


@njit(cache=True)
def _erlang_c(c, a):
    """Probability of waiting in M/M/c with offered load a (Erlangs), via the Erlang-B recursion."""
    b = 1.0
    k = 1
    while k <= c:
        b = a * b / (k + a * b)
        k += 1
    rho = a / c
    if rho >= 1.0:
        return 1.0
    return b / (1.0 - rho * (1.0 - b))


@njit(cache=True)
def _convolve(coef, rate, n, q, r):
    """Tail sum_i coef_i e^(-rate_i t) of X  ->  tail of X + B*E_r, B ~ Bernoulli(q), E_r ~ Exp(r)."""
    if q <= 0.0 or r <= 0.0 or not math.isfinite(r):
        return n
    acc = 0.0
    for i in range(n):
        ri = rate[i]
        if abs(ri - r) < 1e-3 * max(ri, r):
            r = r * (1.0 - 2e-3) if r < ri else r * (1.0 + 2e-3)
    for i in range(n):
        ri = rate[i]
        d = ri - r
        acc += coef[i] * ri / d
        coef[i] = coef[i] * ((1.0 - q) - q * r / d)
    coef[n] = q * acc
    rate[n] = r
    return n + 1


@njit(cache=True)
def _service_wait(coef, rate, n, weight, r_svc, q, r_wait):
    """Append to the tail at term n one queue's sojourn, with `weight` of the requests: service ~
    Exp(r_svc) plus, with probability q, a wait ~ Exp(r_wait). Returns the new number of terms."""
    coef[n] = weight
    rate[n] = r_svc
    if q > 1e-12:
        return n + _convolve(coef[n:], rate[n:], 1, q, r_wait)
    return n + 1


@njit(cache=True, inline="always")
def _tail(x, coef, rate, n):
    if x <= 0.0:
        return 1.0
    s = 0.0
    for i in range(n):
        s += coef[i] * math.exp(-rate[i] * x)
    return min(1.0, max(0.0, s))


@njit(cache=True)
def _integral(x, coef, rate, n):
    """Integral of the tail from -inf... i.e. int_0^x tail(v) dv for x >= 0 (tail = 1 below 0)."""
    if x <= 0.0:
        return 0.0
    s = 0.0
    for i in range(n):
        s += coef[i] * (1.0 - math.exp(-rate[i] * x)) / rate[i]
    return s


@njit(cache=True)
def _tail_total(x, coef, rate, n, fb, wa, wb):
    """Tail with a backlog wait: with prob fb an extra wait ~ Uniform[wa, wb], else none."""
    t0 = _tail(x, coef, rate, n)
    if fb <= 0.0:
        return t0
    if wb - wa < 1e-12:
        tb = _tail(x - wa, coef, rate, n)
    else:
        hi = x - wa
        lo = x - wb
        neg = 0.0
        if lo < 0.0:
            neg = min(hi, 0.0) - lo
        tb = (neg + _integral(max(hi, 0.0), coef, rate, n) - _integral(max(lo, 0.0), coef, rate, n)) / (
            wb - wa
        )
    return (1.0 - fb) * t0 + fb * min(1.0, max(0.0, tb))


@njit(cache=True)
def _tail_slope(x, coef, rate, n, fb, wa, wb):
    """d/dx of _tail_total (<= 0)."""
    d0 = 0.0
    if x > 0.0:
        for i in range(n):
            d0 -= coef[i] * rate[i] * math.exp(-rate[i] * x)
    if fb <= 0.0:
        return d0
    if wb - wa < 1e-12:
        db = 0.0
        if x - wa > 0.0:
            for i in range(n):
                db -= coef[i] * rate[i] * math.exp(-rate[i] * (x - wa))
    else:
        db = (_tail(x - wa, coef, rate, n) - _tail(x - wb, coef, rate, n)) / (wb - wa) * -1.0
        db = -abs(db)
    return (1.0 - fb) * d0 + fb * db


@njit(cache=True)
def _quantile(p, coef, rate, n, fb, wa, wb):
    """Smallest x with tail_total(x) <= p: safeguarded Newton on a bracket (bisection fallback)."""
    if p >= 1.0:
        return 0.0
    rmin = 1e300
    apos = 0.0
    for i in range(n):
        rmin = min(rmin, rate[i])
        if coef[i] > 0:
            apos += coef[i]
    hi = max(math.log(max(apos, 1.0) / max(p, 1e-300)) / rmin, 1e-12) + wb
    lo = 0.0
    while _tail_total(hi, coef, rate, n, fb, wa, wb) > p:
        hi *= 2.0
    # Newton on log(tail): exactly linear for one exponential, nearly so for a sum of them
    lp = math.log(p)
    x = hi
    for _ in range(60):
        t = _tail_total(x, coef, rate, n, fb, wa, wb)
        if t > p:
            lo = x
        else:
            hi = x
        if hi - lo < 1e-6 * hi:
            break
        d = _tail_slope(x, coef, rate, n, fb, wa, wb)
        if t > 1e-300 and d < 0.0:
            nx = x - (math.log(t) - lp) * t / d
        else:
            nx = 0.5 * (lo + hi)
        if not (lo < nx < hi):
            nx = 0.5 * (lo + hi)
        if abs(nx - x) < 1e-7 * hi:
            x = nx
            break
        x = nx
    return x if _tail_total(x, coef, rate, n, fb, wa, wb) <= p * (1.0 + 1e-4) else hi


@njit(cache=True)
def _throttled_resumes(prm, alloc, b, w, g, hk, nw):
    """CPUs on which the batch co-runners of LC component w (core group `g`, `hk` hardware threads)
    resume once per CFS period because their quota binds: a group whose runnable threads ask for
    more than `cpu.cfs_quota_us` is throttled for the rest of each period, and its threads come
    back together at the next one, on up to `hk` CPUs per group (step 1 of the module docstring)."""
    cpus = 0.0
    for v in range(nw):
        pv = prm[b, v]
        q = alloc[b, v, A_QUOTA]
        if (
            v != w
            and pv[P_ACTIVE] > 0.5
            and pv[P_KIND] > 0.5
            and alloc[b, v, A_GROUP] == g
            and alloc[b, v, A_CORES] > 0.0
            and not (pv[P_PLACE] >= 0.5 and pv[P_PLACE] < 2.5)
            and q > 0.0
            and pv[P_THREADS] * pv[P_BUSY] > q * (1.0 + 1e-9)
        ):
            cpus += min(pv[P_THREADS], hk)
    return cpus


@njit(cache=True)
def _cfs_throttle(demand, quota, cores, period, svc, cv2):
    """(share of requests delayed, shortest and longest delay in s) of an app whose CFS quota
    binds (Linux CFS bandwidth control, Documentation/scheduler/sched-bwc.rst): `demand` cores of
    CPU time on average, `quota` cores usable per `period` s, `cores` hardware threads to run on
    between throttles, service time `svc` s with squared coefficient of variation `cv2`.

    The work of one period is Normal(m, v), m = demand x period, v = m x svc x (1 + cv2) (Poisson
    arrivals of random work). A period whose work X exceeds the quota Q = quota x period is
    throttled for the last T = period x (X - Q) / m of it (arrivals spread evenly, served at once
    while the quota lasts): the requests arriving in that window, a share E[T] / period of all,
    wait for the next period - the one arriving u into the window for T - u, plus the work that
    arrived before it in the window (u x demand / cores). The windows are summarised by one length
    T = E[T^2] / E[T] (the mean delay stays right), and T is at most what is left of a period once
    the quota is used at full speed."""
    m = demand * period
    if m <= 0.0 or quota <= 0.0:
        return 0.0, 0.0, 0.0
    v = m * svc * (1.0 + cv2)
    sd = math.sqrt(v)
    z = (quota * period - m) / sd
    phi = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    above = 0.5 * math.erfc(z / math.sqrt(2.0))
    e1 = sd * (phi - z * above)  # E[(X - Q)+]
    e2 = v * ((1.0 + z * z) * above - z * phi)  # E[(X - Q)+^2]
    if e1 <= 1e-12 * m or e2 <= 0.0:
        return 0.0, 0.0, 0.0
    left = max(1.0 - quota / cores, 0.0)
    share = min(e1 / m, left)
    window = min(period * e2 / (e1 * m), period * left)
    return share, window * min(1.0, demand / cores), window


@njit(cache=True)
def _maxmin(demand, weight, capacity, out, m, active):
    """Weighted max-min fair shares of `capacity` for `demand` (progressive filling); `active` is
    a boolean scratch array of length >= m."""
    for i in range(m):
        out[i] = 0.0
    left = capacity
    for i in range(m):
        active[i] = demand[i] > 0.0 and weight[i] > 0.0
    for _ in range(m + 1):
        wsum = 0.0
        for i in range(m):
            if active[i]:
                wsum += weight[i]
        if wsum <= 0.0 or left <= 1e-15:
            break
        progressed = False
        for i in range(m):
            if active[i] and demand[i] - out[i] <= left * weight[i] / wsum + 1e-15:
                left -= demand[i] - out[i]
                out[i] = demand[i]
                active[i] = False
                progressed = True
        if not progressed:
            for i in range(m):
                if active[i]:
                    out[i] += left * weight[i] / wsum
            left = 0.0
            break


@njit(cache=True, inline="always")
def _io_units(p, busy, rate):
    """Units that scale disk and network demand: requests/s for an LC app; for a batch class its
    threads while it runs (an I/O-bound thread's demand does not follow its CPU share)."""
    if p[P_KIND] < 0.5:
        return rate
    return p[P_THREADS] if busy > 0.0 else 0.0


@njit(cache=True)
def _greedy_share(demand, weight, capacity, w, cap_w, scratch, out, m, active):
    """What component w would get under weighted max-min fairness if it wanted up to cap_w (its
    fair share even when it currently uses less: TCP flows and I/O-scheduler slices ramp up)."""
    for i in range(m):
        scratch[i] = demand[i]
    scratch[w] = cap_w
    _maxmin(scratch, weight, capacity, out, m, active)
    return out[w]


@njit(cache=True, inline="always")
def _sibling_slowdown(p2, smt, press):
    """Speed factor of a hardware thread whose sibling is busy with probability p2, slowing it by
    (1 - smt) x the sibling's pressure when it is."""
    return (1.0 - p2) + p2 * (1.0 - (1.0 - smt) * press)


@njit(cache=True, inline="always")
def _smt_speed(k, tpc, hk, mine, press, n_other, press_other, smt):
    """Per-hardware-thread speed of a workload with `mine` runnable threads beside `n_other` others on
    a group of k cores (hk hardware threads): Linux spreads them one per physical core first, so a
    thread shares its core with a busy sibling only once more than k run, with probability
    2 (used - k) / used (`_sibling_slowdown`)."""
    tot = mine + n_other
    used = min(hk, tot)
    p2 = 0.0
    if tpc >= 2.0 and used > k:
        p2 = 2.0 * (used - k) / used
    pbar = (mine * press + press_other) / tot if tot > 0.0 else 0.0  # the sibling's pressure
    return _sibling_slowdown(p2, smt, pbar)


@njit(cache=True)
def step_nodes(plat, prm, alloc, state, arrivals, usample, out, nout, dist):
    """Advance every node one interval; see the module docstring. Arrays:
    plat (B, NPL), prm (B, W, NP), alloc (B, W, NA), state (B, W, NS) updated in place,
    arrivals (B, W) requests this interval, usample (B, W) order-statistic CDF value (NaN: none),
    out (B, W, NO), nout (B, NNO) and dist (B, W, ND: each LC app's latency distribution) written."""
    nb, nw = prm.shape[0], prm.shape[1]
    busy = np.zeros(nw)
    speed = np.ones(nw)  # per-hardware-thread speed (SMT) with every thread runnable (saturation)
    n_oth = np.zeros(nw)  # runnable threads of the other workloads of a component's core group
    p_oth = np.zeros(nw)  # ... their summed sibling pressure
    fsib = np.ones(nw)  # speed factor from antagonists pinned to a component's sibling hyperthreads
    hw = np.zeros(nw)  # hardware threads a workload gets
    hwf = np.zeros(nw)  # ... and what it runs on between CFS throttles (no quota applied)
    pwait = np.zeros(nw)
    presume = np.zeros(nw)  # share of an LC app's requests that wait behind a throttled co-runner's resume
    freq = np.zeros(nw)
    rate = np.zeros(nw)  # units per second (requests for LC)
    occ_t = np.zeros(nw)
    miss = np.ones(nw)
    slow = np.ones(nw)
    res_t = np.zeros(nw)
    unch = np.zeros(nw)
    unch_t = np.zeros(nw)
    wrate = np.zeros(nw)
    mm = np.zeros(nw)
    tmp = np.zeros(nw)
    tmp2 = np.zeros(nw)
    tmp3 = np.zeros(nw)
    coef = np.zeros(MAXT)
    rt = np.zeros(MAXT)
    scratch = np.zeros(nw)
    scratch2 = np.zeros(nw)
    active = np.zeros(nw, dtype=np.bool_)
    net_alloc = np.zeros(nw)
    for b in range(nb):
        pl = plat[b]
        dt = pl[PL_DT]
        tpc = pl[PL_TPC]
        fnom = pl[PL_FNOM]
        fturbo = pl[PL_FTURBO]
        # ---------------- 1. cores ------------------------------------------------------------
        for w in range(nw):
            p = prm[b, w]
            busy[w] = 0.0
            speed[w] = 1.0
            fsib[w] = 1.0
            n_oth[w] = 0.0
            p_oth[w] = 0.0
            pwait[w] = 0.0
            presume[w] = 0.0
            if p[P_ACTIVE] < 0.5:
                continue
            if p[P_PLACE] >= 0.5 and p[P_PLACE] < 2.5:
                busy[w] = p[P_THREADS] * p[P_BUSY]
            elif alloc[b, w, A_CORES] > 0.0:
                if p[P_KIND] < 0.5:
                    busy[w] = min(p[P_THREADS], state[b, w, S_BUSY])
                else:
                    busy[w] = p[P_THREADS] * p[P_BUSY]
                if alloc[b, w, A_QUOTA] > 0.0:  # CFS quota: at most this much CPU time
                    busy[w] = min(busy[w], alloc[b, w, A_QUOTA])
        for w in range(nw):
            p = prm[b, w]
            hw[w] = 0.0
            hwf[w] = 0.0
            if p[P_ACTIVE] < 0.5 or (p[P_PLACE] >= 0.5 and p[P_PLACE] < 2.5):
                continue
            k = alloc[b, w, A_CORES]
            if k <= 0.0:
                continue
            g = alloc[b, w, A_GROUP]
            hk = tpc * k  # hardware threads of the group
            n_other = 0.0  # runnable threads of the group's other workloads
            press_other = 0.0
            for v in range(nw):
                if (
                    v != w
                    and prm[b, v, P_ACTIVE] > 0.5
                    and alloc[b, v, A_GROUP] == g
                    and not (prm[b, v, P_PLACE] >= 0.5 and prm[b, v, P_PLACE] < 2.5)
                ):
                    n_other += busy[v]
                    press_other += busy[v] * prm[b, v, P_PRESS]
            # an LC app's capacity is what it gets at saturation (all its threads runnable); a
            # batch class runs its busy threads. CFS shares the hardware threads by runnable thread,
            # or by weighted max-min over the workloads when any of them has CFS shares.
            dem = p[P_THREADS] if p[P_KIND] < 0.5 else busy[w]
            tot = dem + n_other
            hw[w] = dem * min(1.0, hk / tot) if tot > 0.0 else 0.0
            if tot > hk:
                sdem = np.zeros(nw)
                swt = np.zeros(nw)
                m = 0
                me = 0
                weighted = False
                for v in range(nw):
                    if v == w or (
                        prm[b, v, P_ACTIVE] > 0.5
                        and alloc[b, v, A_GROUP] == g
                        and not (prm[b, v, P_PLACE] >= 0.5 and prm[b, v, P_PLACE] < 2.5)
                    ):
                        if v == w:
                            me = m
                        sdem[m] = dem if v == w else busy[v]
                        swt[m] = alloc[b, v, A_SHARES] if alloc[b, v, A_SHARES] > 0.0 else 1024.0
                        weighted = weighted or alloc[b, v, A_SHARES] > 0.0
                        m += 1
                if weighted:
                    sout = np.zeros(nw)
                    _maxmin(sdem, swt, hk, sout, m, np.zeros(nw, dtype=np.bool_))
                    hw[w] = sout[me]
            hwf[w] = hw[w]
            q = alloc[b, w, A_QUOTA]
            if q > 0.0 and p[P_KIND] < 0.5:  # a CFS quota caps the CPU time of its threads
                hw[w] = min(hw[w], q)
            speed[w] = _smt_speed(k, tpc, hk, dem, p[P_PRESS], n_other, press_other, p[P_SMT])
            n_oth[w] = n_other
            p_oth[w] = press_other
            runnable = busy[w] + n_other  # a waking thread may find its hardware thread taken
            if runnable > hk:
                pwait[w] = min(1.0, (runnable - hk) / hk)
            if pl[PL_QUOTA_MODE] > 0.5:  # unpinned: it waits when the others' threads hold every CPU
                pwait[w] = max(pwait[w], min(1.0, max(0.0, n_other - (hk - 1.0))))
            if p[P_KIND] < 0.5 and pl[PL_CFS_RESUME_S] > 0.0:
                # a co-runner's threads resuming from CFS throttling run a slice (2 x the mean wait)
                # before an LC thread they preempt: requests arriving on those CPUs meanwhile wait
                cpus = _throttled_resumes(prm, alloc, b, w, g, hk, nw)
                presume[w] = min(1.0, cpus * 2.0 * pl[PL_CFS_RESUME_S] / (hk * pl[PL_CFS_PERIOD_S]))
        # antagonists pinned onto an app's hyperthreads (PARTIES Table 3)
        for a in range(nw):
            pa = prm[b, a]
            if pa[P_ACTIVE] < 0.5:
                continue
            t = int(pa[P_TARGET])
            if t < 0 or t >= nw or not (pa[P_PLACE] > 0.5 and pa[P_PLACE] < 2.5):
                continue
            hw[a] = busy[a]  # it runs on the target's hardware threads
            if pa[P_PLACE] > 0.5 and pa[P_PLACE] < 1.5:  # same hyperthreads: CFS time-sharing
                hw[t] *= prm[b, t, P_THREADS] / (
                    prm[b, t, P_THREADS] + min(pa[P_THREADS], prm[b, t, P_THREADS])
                )
                pwait[t] = 1.0
            elif pa[P_PLACE] > 1.5 and pa[P_PLACE] < 2.5:  # sibling hyperthreads: SMT contention
                f2 = min(1.0, pa[P_THREADS] / max(prm[b, t, P_THREADS], 1.0))
                fs = _sibling_slowdown(f2, prm[b, t, P_SMT], pa[P_PRESS])
                speed[t] *= fs
                fsib[t] *= fs
        # ---------------- 2. power and turbo --------------------------------------------------
        dynw = pl[PL_CORE_DYN_W]
        n_act = pl[PL_IRQ_ACTIVE]
        w_turbo = pl[PL_IRQ_ACTIVE] * 0.8
        p_fixed = pl[PL_UNCORE_W] + pl[PL_SOCKET_CORES] * pl[PL_CORE_IDLE_W]
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5 or busy[w] <= 0.0:
                continue
            # active cores attributed to w: its share of its group's busy cores
            fcap = alloc[b, w, A_FREQ]
            if p[P_PLACE] >= 0.5 and p[P_PLACE] < 2.5:
                t = int(p[P_TARGET])
                cores_w = 0.25 * min(busy[w], prm[b, t, P_THREADS])  # extra SMT/time-share power
            else:
                k = alloc[b, w, A_CORES]
                g = alloc[b, w, A_GROUP]
                tot = 0.0
                for v in range(nw):
                    if (
                        prm[b, v, P_ACTIVE] > 0.5
                        and alloc[b, v, A_GROUP] == g
                        and not (prm[b, v, P_PLACE] >= 0.5 and prm[b, v, P_PLACE] < 2.5)
                    ):
                        tot += busy[v]
                tot = max(tot, busy[w])
                cores_w = min(k, tot) * busy[w] / tot
                n_act += cores_w
            pw = cores_w * p[P_PWR]
            if fturbo > 0.0 and fcap >= fturbo - 0.5:
                w_turbo += pw
            else:
                p_fixed += dynw * pw * (fcap / fnom) ** 3
        f_t = fnom
        if fturbo > 0.0:
            span = max(pl[PL_SOCKET_CORES] - 2.0, 1.0)
            frac = min(1.0, max(0.0, (n_act - 2.0) / span))
            f_bin = fturbo - (fturbo - pl[PL_FALLTURBO]) * frac
            f_t = f_bin
            if w_turbo > 0.0:
                head = pl[PL_TDP] - p_fixed
                f_pow = fnom * (max(head, 1e-9) / (dynw * w_turbo)) ** (1.0 / 3.0)
                f_t = max(pl[PL_FMIN], min(f_bin, f_pow))
        power = p_fixed + dynw * w_turbo * (f_t / fnom) ** 3
        nout[b, N_POWER] = power
        nout[b, N_FTURBO] = f_t
        for w in range(nw):
            fcap = alloc[b, w, A_FREQ]
            freq[w] = f_t if (fturbo > 0.0 and fcap >= fturbo - 0.5) else min(fcap, fnom)
            if freq[w] <= 0.0:
                freq[w] = fnom
        # ---------------- progress rates (first estimate) ------------------------------------
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5:
                rate[w] = 0.0
            elif p[P_KIND] < 0.5:
                rate[w] = (_offered(arrivals, state, b, w) + state[b, w, S_Q]) / dt
                if state[b, w, S_INIT] > 0.5:
                    rate[w] = min(rate[w], state[b, w, S_CAP])
            elif state[b, w, S_INIT] > 0.5:
                rate[w] = state[b, w, S_RATE]
            else:
                rate[w] = hw[w] * speed[w]
        # ---------------- 3. LLC occupancy -----------------------------------------------------
        mbw = pl[PL_LLC_MB] / pl[PL_LLC_WAYS]
        for w in range(nw):
            occ_t[w] = 0.0
            if alloc[b, w, A_FLUSH] > 0.5:
                state[b, w, S_OCC] = 0.0
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5 or occ_t[w] > 0.0:
                continue
            clos = alloc[b, w, A_CLOS]
            cap = alloc[b, w, A_WAYS] * mbw
            # members of this CLOS: tmp[v] = 1 (pinned antagonists carry their target's CLOS)
            members = 0
            for v in range(nw):
                tmp[v] = 1.0 if (prm[b, v, P_ACTIVE] > 0.5 and alloc[b, v, A_CLOS] == clos) else 0.0
                members += int(tmp[v])
                foot = prm[b, v, P_LLC_FOOT]
                tmp2[v] = foot
                x0 = state[b, v, S_OCC] if state[b, v, S_INIT] > 0.5 else cap
                tmp3[v] = min(foot, max(x0, 1e-3))
            if members == 1:  # alone in its CLOS: it holds what it can use of the ways
                occ_t[w] = max(min(cap, p[P_LLC_FOOT]), 1e-9)
                continue
            # Che's approximation of LRU: the members share one characteristic time T; each holds
            # the distinct lines it touched in the last T (its working set W(T)); T solves
            # sum W(T) = capacity (bisection on log T).
            lo = math.log(1e-9)
            hi = math.log(1e4)
            for _ in range(48):
                mid = 0.5 * (lo + hi)
                tot = 0.0
                for v in range(nw):
                    if tmp[v] > 0.5:
                        tot += _working_set(prm[b, v], rate[v], math.exp(mid), cap, pl[PL_LLC_STREAM_W])
                if tot > cap:
                    hi = mid
                else:
                    lo = mid
            for v in range(nw):
                if tmp[v] > 0.5:
                    occ_t[v] = max(
                        _working_set(prm[b, v], rate[v], math.exp(lo), cap, pl[PL_LLC_STREAM_W]), 1e-9
                    )
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5:
                continue
            x0 = state[b, w, S_OCC]
            if state[b, w, S_INIT] < 0.5 or occ_t[w] <= x0:
                state[b, w, S_OCC] = occ_t[w]  # shrinking: the other owners take the lines at once
                m1 = _miss(
                    occ_t[w], p[P_LLC_KAPPA], p[P_LLC_ALPHA], p[P_LLC_FOOT], p[P_LLC_MMIN], p[P_LLC_STREAM]
                )
                miss[w] = _dram_miss(p, m1)
                continue
            # growing (a CAT increase, or a refill after a CLOS migration flushed the lines): the
            # app fills at its miss rate, and this interval pays the misses of the refill
            m0 = _miss(x0, p[P_LLC_KAPPA], p[P_LLC_ALPHA], p[P_LLC_FOOT], p[P_LLC_MMIN], p[P_LLC_STREAM])
            fill_rate = rate[w] * p[P_LLC_APU] * m0 * LINE_MB  # MB/s
            gap = occ_t[w] - x0
            tau = gap / fill_rate if fill_rate > 0.0 else 1e300
            x1 = occ_t[w] if tau <= dt else x0 + fill_rate * dt
            m1 = _miss(x1, p[P_LLC_KAPPA], p[P_LLC_ALPHA], p[P_LLC_FOOT], p[P_LLC_MMIN], p[P_LLC_STREAM])
            f = min(tau, dt) / dt
            miss[w] = _dram_miss(p, f * 0.5 * (m0 + m1) + (1.0 - f) * m1)
            state[b, w, S_OCC] = x1
        # ---------------- 4. memory capacity ---------------------------------------------------
        # A warm start: before the first interval the apps ran unmanaged (no limits, the node's
        # capacity), so their page caches hold what the water level keeps there; those pages stay
        # charged where they were faulted in, outside the cgroups the manager then puts the apps in
        # (a moved task's charges do not move: Linux cgroup-v1 memory.txt, move_charge_at_immigrate).
        if state[b, 0, S_INIT] < 0.5:  # the node's first interval (every component starts at once)
            for w in range(nw):
                unch[w] = 0.0
                tmp[w] = prm[b, w, P_DATA_GB] + prm[b, w, P_INDEX_GB] if prm[b, w, P_ACTIVE] > 0.5 else 0.0
                res_t[w] = 0.0
                # touched as they ran unmanaged: an LC app at its load, a batch class on every thread
                wrate[w] = prm[b, w, P_THREADS] if prm[b, w, P_KIND] > 0.5 else rate[w]
            if pl[PL_WARM_START] > 0.0:
                _fill_memory(prm[b], tmp, unch, wrate, pl[PL_WARM_START], res_t, unch_t, nw)
            for w in range(nw):
                state[b, w, S_UNCH] = res_t[w]
        for w in range(nw):
            p = prm[b, w]
            unch[w] = state[b, w, S_UNCH] if p[P_ACTIVE] > 0.5 else 0.0
            tmp[w] = (
                min(p[P_DATA_GB] + p[P_INDEX_GB] - unch[w], alloc[b, w, A_MEM]) if p[P_ACTIVE] > 0.5 else 0.0
            )
        _fill_memory(prm[b], tmp, unch, rate, pl[PL_MEM_GB], res_t, unch_t, nw)
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5:
                continue
            u = unch[w]
            if unch_t[w] < u:  # global reclaim: the node's memory is short, the limit does not protect them
                u = max(unch_t[w], u - pl[PL_RECLAIM] * dt)
                state[b, w, S_UNCH] = u
            r = state[b, w, S_RES]
            if state[b, w, S_INIT] < 0.5:
                r = 0.0 if pl[PL_WARM_START] > 0.0 else res_t[w]
            elif res_t[w] > r:
                reads = rate[w] * _page_misses(p, u + r) * p[P_IOS]
                r = min(res_t[w], r + reads * max(p[P_IO_KB], 4.0) * 1e-6 * dt)
            else:
                r = max(res_t[w], r - pl[PL_RECLAIM] * dt)
            state[b, w, S_RES] = r
            mm[w] = _page_misses(p, u + r)  # per request
        # ---------------- 5/6. DRAM, uncore and service stretch (fixed point) ----------------
        memu = 0.0
        llcu = 0.0
        for _it in range(4):
            traffic = 0.0
            llc_bw = 0.0
            for w in range(nw):
                p = prm[b, w]
                if p[P_ACTIVE] < 0.5:
                    continue
                mref = max(p[P_LLC_MREF], 1e-6)
                traffic += rate[w] * p[P_DRAM] * miss[w] / mref
                llc_bw += rate[w] * p[P_LLC_APU] * LINE_MB / 1000.0
            memu = min(traffic / pl[PL_MEM_BW], 0.97)
            llcu = min(llc_bw / pl[PL_LLC_BW], 0.95)
            lmem = 1.0 + pl[PL_MEM_Q] * memu * memu / (1.0 - memu)
            lllc = 1.0 + pl[PL_LLC_CONT] * llcu * llcu / (1.0 - llcu)
            for w in range(nw):
                p = prm[b, w]
                if p[P_ACTIVE] < 0.5:
                    continue
                mba = _mba_latency(pl[PL_MBA_DELAY], alloc[b, w, A_MBA])
                fcore = 1.0 - p[P_FLLC] - p[P_FMEM]
                mref = max(p[P_LLC_MREF], 1e-6)
                slow[w] = (
                    fcore * fnom / freq[w] + (p[P_FLLC] * lllc + p[P_FMEM] * (miss[w] / mref) * lmem) * mba
                )
                if alloc[b, w, A_MOVED] > 0.5:
                    slow[w] *= 1.0 + pl[PL_MIG_PEN]
                if p[P_KIND] > 0.5:
                    rnew = hw[w] * speed[w] / slow[w]
                    rate[w] = rnew if _it == 0 else 0.5 * rate[w] + 0.5 * rnew
        nout[b, N_MEMU] = memu
        nout[b, N_LLCU] = llcu
        # ---------------- 7a. disk -----------------------------------------------------------
        iops = pl[PL_DISK_IOPS]
        seqbw = pl[PL_DISK_SEQ]
        for w in range(nw):
            p = prm[b, w]
            tmp[w] = 0.0
            tmp2[w] = 1.0
            if p[P_ACTIVE] < 0.5:
                continue
            io_rate = rate[w] * mm[w] * p[P_IOS]
            seq = _io_units(p, busy[w], rate[w]) * p[P_SEQ_MB]
            d = io_rate / iops + seq / seqbw
            cap_mb = alloc[b, w, A_DISK]
            if io_rate > 0.0:
                cap_t = (cap_mb * 1000.0 / max(p[P_IO_KB], 4.0)) / iops
            else:
                cap_t = cap_mb / seqbw
            tmp[w] = min(d, cap_t) if d > 0.0 else 0.0
        _maxmin(tmp, tmp2, 1.0, tmp3, nw, active)  # tmp3 = disk-time shares actually used
        seq_share = 0.0
        for w in range(nw):
            if prm[b, w, P_ACTIVE] > 0.5 and prm[b, w, P_SEQ_MB] > 0.0:
                seq_share += tmp3[w]
        # random reads share one device queue (NCQ): their rate, at most each app's blkio cap, and
        # the threads that can wait on them bound the queue. A sequential stream takes the disk
        # time the random readers leave, but the I/O scheduler gives a process with reads pending
        # its fair slice (CFQ: half the disk against one stream), so it holds at most half of it
        x_reads = 0.0
        waiters = 0.0
        for w in range(nw):
            p = prm[b, w]
            if p[P_ACTIVE] < 0.5 or rate[w] * mm[w] <= 1e-9:  # only the threads of apps that read
                continue
            cap_reads = alloc[b, w, A_DISK] * 1000.0 / max(p[P_IO_KB], 4.0)
            x_reads += min(rate[w] * mm[w] * p[P_IOS], cap_reads)
            waiters += p[P_THREADS]
        if x_reads > 0.0:
            seq_share = min(seq_share, 0.5)
        t_read = _ncq_read_time(
            x_reads, iops * max(1.0 - seq_share, 0.02), pl[PL_DISK_NCQ], pl[PL_DISK_QD], waiters
        )
        # ---------------- 7b. network --------------------------------------------------------
        link = pl[PL_NET_GBPS]
        for w in range(nw):
            p = prm[b, w]
            tmp[w] = 0.0
            tmp2[w] = 0.0
            if p[P_ACTIVE] < 0.5:
                continue
            dem = _io_units(p, busy[w], rate[w]) * p[P_NET_GBIT]
            tmp[w] = min(dem, alloc[b, w, A_NET])
            tmp2[w] = max(p[P_FLOWS], 1.0)
        _maxmin(tmp, tmp2, link, net_alloc, nw, active)
        used_link = 0.0
        for w in range(nw):
            used_link += net_alloc[w]
        linku = used_link / link
        nout[b, N_LINKU] = linku
        congest = pl[PL_NET_CONG_S] if (rate_sum_demand(tmp, nw) > 0.95 * link) else 0.0
        # ---------------- 8. per component outputs --------------------------------------------
        tot_mbw = 0.0
        for w in range(nw):
            p = prm[b, w]
            o = out[b, w]
            for j in range(NO):
                o[j] = 0.0
            dist[b, w, D_N] = 0.0
            if p[P_ACTIVE] < 0.5:
                o[O_P99] = math.nan
                continue
            mref = max(p[P_LLC_MREF], 1e-6)
            mbw_w = rate[w] * p[P_DRAM] * miss[w] / mref
            o[O_LLC] = state[b, w, S_OCC]
            o[O_MEM] = state[b, w, S_RES]
            o[O_FREQ] = freq[w]
            o[O_SLOW] = slow[w]
            o[O_NET] = net_alloc[w]
            io_rate = rate[w] * mm[w] * p[P_IOS]
            o[O_DISK] = io_rate * max(p[P_IO_KB], 4.0) / 1000.0 + _io_units(p, busy[w], rate[w]) * p[P_SEQ_MB]
            kc = alloc[b, w, A_CORES]
            if pl[PL_QUOTA_MODE] > 0.5 and alloc[b, w, A_QUOTA] > 0.0:  # its cores are its quota
                kc = alloc[b, w, A_QUOTA]
            if p[P_KIND] > 0.5:
                o[O_PROG] = rate[w]
                o[O_MBW] = mbw_w
                tot_mbw += mbw_w
                o[O_UTIL] = min(1.0, busy[w] / kc) if kc > 0.0 else 0.0
                state[b, w, S_RATE] = rate[w]
                state[b, w, S_BUSY] = busy[w]
                state[b, w, S_INIT] = 1.0
                o[O_P99] = math.nan
                continue
            # ---- LC app: queueing ----
            nthr = p[P_THREADS]
            # The M/G/c tail below already holds the Poisson variability of arrivals; the queue
            # and the fluid backlog follow the offered rate, so a sampled count does not count
            # that variability twice (it would turn a few-requests-per-interval app near its knee
            # into a random walk). The sampled count still sets the requests seen and the p99's
            # order statistic (sampling noise).
            lam = _offered(arrivals, state, b, w) / dt
            svc = p[P_SREF] * slow[w] / max(speed[w], 1e-6)  # per hardware thread
            cpu_cap = max(hw[w], 1e-9) / svc  # requests/s at saturation
            # SMT at the offered load: `speed` holds every thread runnable (saturation), which sets
            # the capacity and how fast a queue drains while every server is busy; a request's own
            # service runs beside a busy sibling only as often as the threads serving the offered
            # load (lam x service time, Little) outnumber the cores (`_smt_speed`), so at low load
            # on fewer cores than threads it runs at a whole core's speed.
            svc_lo = svc
            k_c = alloc[b, w, A_CORES]
            if tpc >= 2.0 and k_c > 0.0 and speed[w] < 1.0:
                for _fp in range(2):  # fixed point: the busy threads follow the service time
                    b_lo = min(nthr, min(lam, cpu_cap) * svc_lo)
                    sp = fsib[w] * _smt_speed(
                        k_c, tpc, tpc * k_c, b_lo, p[P_PRESS], n_oth[w], p_oth[w], p[P_SMT]
                    )
                    svc_lo = p[P_SREF] * slow[w] / max(sp, speed[w], 1e-6)
            # CFS bandwidth control: a quota below what the app would otherwise run on does not slow
            # its requests down; its threads run at full speed on hwf[w] hardware threads until the
            # period's quota is used (less what stays stranded in the other CPUs' runtime slices),
            # then wait for the next period (`_cfs_throttle`). Capacity is the usable quota.
            hs = hw[w]  # hardware threads serving its requests
            q_use = 0.0
            if alloc[b, w, A_QUOTA] > 0.0 and hwf[w] > hw[w] + 1e-9:
                hs = hwf[w]
                spread = max(min(hs, nthr) - 1.0, 0.0) * pl[PL_CFS_STRAND_S] / pl[PL_CFS_PERIOD_S]
                q_use = max(alloc[b, w, A_QUOTA] - spread, 0.1 * alloc[b, w, A_QUOTA])
                cpu_cap = min(hw[w], q_use) / svc
            run_cap = max(hs, 1e-9) / svc  # requests/s while it runs
            # disk: miss events per request, each `ios` reads through the shared device queue
            # (t_read) and this app's blkio throttle (a token bucket: M/D/1 wait); a competing
            # sequential stream holds the disk for up to a scheduler slice per event. A thread
            # waits for its reads: the request holds it for its CPU and I/O time, so an I/O-bound
            # app's capacity is its threads over that holding time (its knee: every thread blocked
            # on the disk) and two of them share a deeper, faster-served device queue.
            mf = mm[w]
            ios = p[P_IOS]
            q_io = 0.0
            r_io = 0.0
            io_cap = 1e300  # requests/s the threads (and the throttle) allow
            t_hold = svc
            if mf > 1e-9:
                cap_reads = max(alloc[b, w, A_DISK] * 1000.0 / max(p[P_IO_KB], 4.0), 1e-3)  # 0 MB/s: ~none
                lam_r = lam * mf * ios
                rho_t = min(lam_r / cap_reads, 0.995)
                per_read = t_read + rho_t / (2.0 * cap_reads * (1.0 - rho_t))
                per_event = ios * per_read + seq_share * pl[PL_DISK_SLICE_S] * 0.5
                q_io = 1.0 - math.exp(-mf)
                r_io = 1.0 / (per_event * mf / q_io)
                t_hold = svc + p[P_HOLD_S] + mf * per_event
                io_cap = min(nthr / t_hold, cap_reads / (mf * ios))
            # network
            bits = p[P_NET_GBIT]
            net_cap = 1e300
            r_net = 0.0
            if bits > 0.0:
                avail = _greedy_share(tmp, tmp2, link, w, alloc[b, w, A_NET], scratch, scratch2, nw, active)
                avail = max(avail, net_alloc[w], 1e-9)  # no bandwidth: ~nothing served, never 0/0
                net_cap = avail / bits
                if net_cap > lam:
                    r_net = net_cap - lam
            mu_tot = max(min(cpu_cap, io_cap, net_cap), 1e-9)
            rho = lam / cpu_cap
            o[O_RHO] = rho
            o[O_CAP] = mu_tot
            # stochastic part at the (capped) utilisation of the CPU queue
            lam_q = min(lam, 0.995 * mu_tot, 0.995 * cpu_cap)
            # Servers: with fewer hardware threads than software threads, short requests run at
            # full speed within a CFS slice (the hardware threads are the servers; waiting for a
            # slice is the scheduling-delay term), long ones span slices and are stretched by the
            # requests in service beyond the hardware threads (processor sharing). Those are the
            # requests the pool takes in while every hardware thread is busy: the mean queue of
            # M/M/c on the hardware threads (Erlang C), none at low load, all the pool's threads
            # in saturation. Capacity is the same either way.
            mix = min(1.0, svc / pl[PL_SCHED_SLICE_S])
            base = max(1.0, min(hs, nthr))
            extra = max(0.0, nthr - hs)
            if extra > 0.0 and mix > 0.0:
                cb = max(1, int(base + 0.5))
                rho_b = lam_q * svc / cb
                if rho_b >= 1.0:
                    lq = extra
                elif p[P_PERTHREAD] > 0.5:
                    lq = cb * rho_b * rho_b / (1.0 - rho_b)
                else:
                    lq = _erlang_c(cb, lam_q * svc) * rho_b / (1.0 - rho_b)
                extra = min(extra, lq)
            servers = base + mix * extra
            if io_cap < cpu_cap:  # I/O-bound: requests wait for a thread of the pool (holding t_hold)
                c = max(1, int(nthr + 0.5))
                lam_c = lam_q
                mu = 1.0 / max(svc, 1e-12)  # the CPU part runs at full speed on its own thread
                a = lam_c * t_hold
                cw = _erlang_c(c, a) if lam_c > 0.0 else 0.0
                theta = max(c / t_hold - lam_c, 1e-9)  # holding times ~ exponential (the reads)
            else:
                if p[P_PERTHREAD] > 0.5:  # connections pinned to threads: one queue per server
                    c = 1
                    lam_c = lam_q / servers
                    mu = run_cap / servers
                else:  # one queue for the thread pool
                    c = max(1, int(servers + 0.5))
                    lam_c = lam_q
                    mu = run_cap / c
                a = lam_c / mu
                cw = _erlang_c(c, a) if lam_c > 0.0 else 0.0
                theta = (c * mu - lam_c) * 2.0 / (1.0 + p[P_CV2])
            # service time: a deterministic part det/mu (added to the shift below) plus an
            # exponential remainder of mean (1 - det)/mu (det = 0: exponential, M/M/1 exact),
            # then the Erlang-C wait in front of it
            det = min(p[P_DET], 0.99)
            # a request's own service at the offered load's SMT speed, except the share of it spent
            # time-sharing beyond the hardware threads (then every one of them is busy)
            own = 1.0 if io_cap < cpu_cap else min(1.0, mu * base / run_cap)
            mu_s = mu * (1.0 + (svc / svc_lo - 1.0) * own)
            # Uneven workers (per_thread, `P_IMBAL` > 1): connections are not spread evenly over the
            # worker processes, so the busiest takes imbal/nthr of the requests (never less than an
            # even share of the servers, at most what one server can serve); its queue and the
            # others' are a mixture, weighted by the requests each serves
            lam_h = 0.0
            if p[P_PERTHREAD] > 0.5 and io_cap >= cpu_cap and servers > 1.0 + 1e-9 and lam_c > 0.0:
                lam_h = min(max(lam_c, lam_q * p[P_IMBAL] / nthr), 0.995 * mu)
            if lam_h > lam_c * (1.0 + 1e-9):
                w_h = lam_h / lam_q
                lam_r = (lam_q - lam_h) / (servers - 1.0)
                stretch = 2.0 / (1.0 + p[P_CV2])
                nt = _service_wait(coef, rt, 0, w_h, mu_s / (1.0 - det), lam_h / mu, (mu - lam_h) * stretch)
                nt = _service_wait(
                    coef, rt, nt, 1.0 - w_h, mu_s / (1.0 - det), lam_r / mu, (mu - lam_r) * stretch
                )
            else:
                nt = _service_wait(coef, rt, 0, 1.0, mu_s / (1.0 - det), cw, theta)
            nt = _convolve(coef, rt, nt, q_io, r_io)
            nt = _convolve(coef, rt, nt, pwait[w], 1.0 / pl[PL_SCHED_S])
            if presume[w] > 0.0:
                nt = _convolve(coef, rt, nt, presume[w], 1.0 / pl[PL_CFS_RESUME_S])
            if r_net > 0.0 and r_net < 100.0 * mu:  # skip a link queue under 1% of the service time
                nt = _convolve(coef, rt, nt, 1.0, r_net)
            # fluid backlog carried across intervals
            q0 = state[b, w, S_Q]
            q1 = q0 + (lam - mu_tot) * dt
            dropped = 0.0
            fb = 0.0
            wa = 0.0
            wb = 0.0
            if q1 > 0.0:
                qmax = mu_tot * p[P_TIMEOUT_S]
                if q1 > qmax:
                    dropped = q1 - qmax
                    q1 = qmax
                fb = 1.0
                wa = q0 / mu_tot
                wb = q1 / mu_tot
                if wa > wb:
                    wa, wb = wb, wa
            else:
                if q0 > 0.0 and mu_tot > lam:
                    tdrain = q0 / (mu_tot - lam)
                    fb = min(1.0, tdrain / dt)
                    wa = 0.0
                    wb = q0 / mu_tot
                q1 = 0.0
            if fb <= 0.0 and hs > hw[w]:  # no backlog to wait behind: the quota's throttling
                fb, wa, wb = _cfs_throttle(lam_q * svc, q_use, hs, pl[PL_CFS_PERIOD_S], svc, p[P_CV2])
            state[b, w, S_Q] = q1
            shift = p[P_BASE_S] + p[P_HOLD_S] + congest + det / mu_s
            d = dist[b, w]
            d[D_N] = nt
            for j in range(nt):
                d[D_COEF + j] = coef[j]
                d[D_RATE + j] = rt[j]
            d[D_FB] = fb
            d[D_WA] = wa
            d[D_WB] = wb
            d[D_SHIFT] = shift
            d[D_DROPPED] = dropped
            d[D_TIMEOUT] = p[P_TIMEOUT_S] + shift
            o[O_TAIL_T] = _tail_total(p[P_QOS_S] - shift, coef, rt, nt, fb, wa, wb)
            u = usample[b, w]
            n_req = arrivals[b, w]
            if n_req > 0.0 and dropped > 0.01 * n_req:
                o[O_P99] = p[P_TIMEOUT_S] + shift
                o[O_TAIL_T] = 1.0
            elif math.isnan(u):
                o[O_P99] = math.nan
            else:
                o[O_P99] = shift + _quantile(1.0 - u, coef, rt, nt, fb, wa, wb)
            served = max(0.0, (arrivals[b, w] + q0 - q1 - dropped) / dt)
            o[O_SERVED] = served
            o[O_DROPPED] = dropped / dt
            busy_next = nthr if q1 > 0.0 else min(nthr, served * svc_lo)  # runnable threads
            state[b, w, S_BUSY] = busy_next
            o[O_UTIL] = min(1.0, busy_next / kc) if kc > 0.0 else 0.0
            mbw_w = served * p[P_DRAM] * miss[w] / mref
            o[O_MBW] = mbw_w
            tot_mbw += mbw_w
            state[b, w, S_RATE] = served
            state[b, w, S_CAP] = mu_tot
            state[b, w, S_INIT] = 1.0
        nout[b, N_MBW] = tot_mbw
        for w in range(nw):  # migrations and flushes happen once, in the interval after the change
            alloc[b, w, A_MOVED] = 0.0
            alloc[b, w, A_FLUSH] = 0.0


@njit(cache=True, inline="always")
def _offered(arrivals, state, b, w):
    """Offered arrivals of LC component w this interval: the caller's mean when it set one (sampled
    steps), else the arrivals themselves (analytic steps, where they are the mean)."""
    m = state[b, w, S_OFFER]
    return m if m > 0.0 else arrivals[b, w]


@njit(cache=True, inline="always")
def rate_sum_demand(dem, n):
    """Sum of the first `n` demands (Gbit/s): the link counts as congested above 95% of its capacity."""
    s = 0.0
    for i in range(n):
        s += dem[i]
    return s


KERNEL_ARGS = ("plat", "prm", "alloc", "state", "arrivals", "usample", "out", "nout", "dist")


def step_arrays(arr: dict[str, np.ndarray], steps: int = 1) -> None:
    """Run `step_nodes` `steps` times on the arrays of `new_arrays` (in place)."""
    args = tuple(arr[k] for k in KERNEL_ARGS)
    for _ in range(steps):
        step_nodes(*args)


def new_arrays(nb: int, nw: int) -> dict[str, np.ndarray]:
    """Zeroed arrays for `nb` nodes of `nw` components."""
    return {
        "plat": np.zeros((nb, NPL)),
        "prm": np.zeros((nb, nw, NP)),
        "alloc": np.zeros((nb, nw, NA)),
        "state": np.zeros((nb, nw, NS)),
        "arrivals": np.zeros((nb, nw)),
        "usample": np.full((nb, nw), np.nan),
        "out": np.zeros((nb, nw, NO)),
        "nout": np.zeros((nb, NNO)),
        "dist": np.zeros((nb, nw, ND)),
    }


# ---- an interval's latency distribution, read back ---------------------------------------------
@njit(cache=True)
def dist_tail(d, x):
    """P(latency > x) (x in s) for the served requests of a `dist` row (see D_*)."""
    n = int(d[D_N])
    return _tail_total(
        x - d[D_SHIFT], d[D_COEF : D_COEF + n], d[D_RATE : D_RATE + n], n, d[D_FB], d[D_WA], d[D_WB]
    )


@njit(cache=True)
def dist_quantile(d, p):
    """The latency (s) exceeded with probability p by the served requests of a `dist` row."""
    n = int(d[D_N])
    coef = d[D_COEF : D_COEF + n]
    rate = d[D_RATE : D_RATE + n]
    return d[D_SHIFT] + _quantile(p, coef, rate, n, d[D_FB], d[D_WA], d[D_WB])


@njit(cache=True)
def dist_bucket_probs(d, edges_s, e, p):
    """Bucket probabilities of the served requests of a `dist` row on the histogram layout whose
    bucket lower edges (s, ascending) are `edges_s`: buckets i0 .. i0 + k - 1 get p[0 .. k), from
    the bucket holding the latency exceeded with probability 1 - e to the one holding the latency
    exceeded with probability e (the mass beyond each goes to that end bucket). Returns (i0, k).

    The tail is a sum of exponentials in x - shift, x - wa - shift and x - wb - shift (the backlog
    wait's integral, `_tail_total`), so from edge to edge each exponential is updated by one
    multiplication (edges are equally spaced within each power of two), with an exact refresh
    every 32 edges, wherever the spacing changes and wherever an argument changes sign."""
    i0 = max(np.searchsorted(edges_s, dist_quantile(d, 1.0 - e), side="right") - 1, 0)
    i1 = max(np.searchsorted(edges_s, dist_quantile(d, e), side="right") - 1, i0)
    n = int(d[D_N])
    coef = d[D_COEF : D_COEF + n]
    rate = d[D_RATE : D_RATE + n]
    shift, fb, wa, wb = d[D_SHIFT], d[D_FB], d[D_WA], d[D_WB]
    spread = fb > 0.0 and wb - wa >= 1e-12
    ex0 = np.empty(n)  # exp(-rate_i x)
    exa = np.empty(n)  # exp(-rate_i (x - wa))
    exb = np.empty(n)  # exp(-rate_i (x - wb))
    fac = np.empty(n)  # exp(-rate_i dx) for the current spacing
    dx_prev = -1.0
    fresh = 0
    signs = -1
    prev = 1.0
    for j in range(i0, i1):
        x = edges_s[j + 1] - shift
        sg = (x > 0.0) * 1 + (x - wa > 0.0) * 2 + (x - wb > 0.0) * 4
        dx = edges_s[j + 1] - edges_s[j]
        if fresh == 0 or fresh >= 32 or sg != signs or abs(dx - dx_prev) > 1e-9 * dx:
            for i in range(n):
                ex0[i] = math.exp(-rate[i] * max(x, 0.0))
                exa[i] = math.exp(-rate[i] * max(x - wa, 0.0))
                exb[i] = math.exp(-rate[i] * max(x - wb, 0.0))
                fac[i] = math.exp(-rate[i] * dx)
            dx_prev = dx
            signs = sg
            fresh = 1
        else:
            for i in range(n):
                if x > 0.0:
                    ex0[i] *= fac[i]
                if x - wa > 0.0:
                    exa[i] *= fac[i]
                if x - wb > 0.0:
                    exb[i] *= fac[i]
            fresh += 1
        t0 = 1.0
        if x > 0.0:
            t0 = 0.0
            for i in range(n):
                t0 += coef[i] * ex0[i]
            t0 = min(1.0, max(0.0, t0))
        t = t0
        if fb > 0.0:
            if not spread:
                tb = 1.0
                if x - wa > 0.0:
                    tb = 0.0
                    for i in range(n):
                        tb += coef[i] * exa[i]
            else:  # (neg + I(x - wa) - I(x - wb)) / (wb - wa), I(y) = sum c_i (1 - e^(-r_i y)) / r_i
                hi = x - wa
                lo = x - wb
                tb = 0.0
                if lo < 0.0:
                    tb = min(hi, 0.0) - lo
                for i in range(n):
                    if hi > 0.0:
                        tb += coef[i] * (1.0 - exa[i]) / rate[i]
                    if lo > 0.0:
                        tb -= coef[i] * (1.0 - exb[i]) / rate[i]
                tb /= wb - wa
            t = (1.0 - fb) * t0 + fb * min(1.0, max(0.0, tb))
        t = min(prev, t)
        p[j - i0] = prev - t
        prev = t
    p[i1 - i0] = prev
    return i0, i1 - i0 + 1


@njit(cache=True)
def interval_counts(d, n_ok, n_drop, edges_s, e, p, seed):
    """Bucket counts of one interval's requests (`engine.interval_histogram`): n_drop at the
    timeout, n_ok drawn from the `dist` row over `dist_bucket_probs` (one multinomial draw: n
    sorted uniforms against the CDF when n is small next to the number of buckets, else a chain of
    binomials) from numba's generator seeded with `seed`. Returns (first bucket, counts)."""
    np.random.seed(seed)
    i0 = 0
    k = 0
    if n_ok > 0:
        i0, k = dist_bucket_probs(d, edges_s, e, p)
    j = i0
    if n_drop > 0:
        j = max(np.searchsorted(edges_s, d[D_TIMEOUT], side="right") - 1, 0)
    lo = min(i0, j)
    hi = max(i0 + k, j + 1)
    counts = np.zeros(hi - lo, dtype=np.int64)
    left = n_ok
    rest = 1.0
    if n_ok > 0 and n_ok * 4 < k:  # few requests over many buckets: n sorted uniforms against the CDF
        u = np.sort(np.random.random(n_ok))
        m = 0
        cdf = p[0]
        for r in range(n_ok):
            while u[r] >= cdf and m < k - 1:
                m += 1
                cdf += p[m]
            counts[i0 - lo + m] += 1
        left = 0
    for m in range(k):
        if left <= 0:
            break
        if m == k - 1 or rest <= 0.0:
            c = left
        else:
            c = np.random.binomial(left, min(1.0, max(0.0, p[m] / rest)))
        counts[i0 - lo + m] += c
        left -= c
        rest -= p[m]
    counts[j - lo] += n_drop
    return lo, counts
