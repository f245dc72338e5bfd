"""Intel PRM NaiveController and the Q-PRM controllers (baselines/prm.py; Q-PRM thesis Sec. 4.1-4.2).

State machines are driven by hand-built observations on a 9-core, 20-way node (the Q-PRM server
node, Sec. 5.2) with 500 ms ticks; a short run of each spec on a SimNode closes the file. Rules
cite the authors' code: intel/platform-resource-manager `eris/...` for the PRM and the Q-PRM fork
jonassa/platform-resource-manager, branch latency_controller, as `qprm:eris/...`.

Note: this directory has no __init__.py on purpose: with one, pytest would import it as the
package `baselines` and shadow the real one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from baselines.prm import (
    DEFAULT_CONFIG,
    SPECS,
    BasicConfig,
    BasicController,
    LevelLayout,
    LevelMap,
    LlcBin,
    NaiveConfig,
    NaiveController,
    PrmProfile,
    ProportionalController,
    StepConfig,
    StepController,
    build_controller,
    load_configs,
    profile_lc,
)
from env.allocations import fair_allocation
from env.config import ConfigError
from env.controller import ControllerContext
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

TARGET_US = 4760.0  # memcached's QoS target in the thesis (Sec. 6.1)
DT = 0.5
LEVELS = LevelMap()


def qprm_caps(core_step: float = 0.01, *, two_lc: bool = False, two_be: bool = False) -> Capabilities:
    apps = [AppSpec("memcached", "lc", TARGET_US, 500_000.0)]
    if two_lc:
        apps.append(AppSpec("xapian", "lc", 50_000.0, 8000.0))
    apps.append(AppSpec("spec_be", "be"))
    if two_be:
        apps.append(AppSpec("spec_be2", "be"))
    return Capabilities(
        node_name="qprm-test",
        interval_s=DT,
        cores=9.0,
        core_step=core_step,
        llc_ways=20,
        clos_count=4,
        freq_levels_mhz=(1200, 2100),
        nominal_freq_mhz=2100,
        memory_gb=64.0,
        memory_step_gb=1.0,
        disk_mbps=100.0,
        disk_step_mbps=10.0,
        net_gbps=10.0,
        net_step_gbps=0.5,
        apps=tuple(apps),
        min_llc_ways=1,
    )


def _usage(cpu_util: float, mem_bw_gbps: float = 0.0) -> Usage:
    return Usage(
        cpu_util=cpu_util,
        llc_mb=1.0,
        mem_bw_gbps=mem_bw_gbps,
        memory_gb=1.0,
        disk_mbps=0.0,
        net_gbps=0.0,
        freq_mhz=2100.0,
    )


def make_obs(
    t: float,
    alloc: Allocation,
    caps: Capabilities,
    *,
    p99_us: float = 0.5 * TARGET_US,
    requests: int = 1000,
    lc_busy_cores: float = 1.0,
    be_busy_cores: float = 1.0,
    served_rps: float = 100_000.0,
    mem_bw_gbps: float = 0.1,
    freq_mhz: float = 2100.0,
) -> Observation:
    """One tick ending at `t`. Utilisations are given in busy cores and converted to fractions of
    the cores each app holds, as the node reports them."""
    samples = []
    for spec in caps.lc_apps:
        cores = alloc[spec.name].cores
        samples.append(
            AppSample(
                name=spec.name,
                p99_us=p99_us if spec.name == "memcached" else 0.1 * spec.qos_target_us,
                target_us=spec.qos_target_us,
                load_rps=served_rps,
                load_frac=0.8,
                served_rps=served_rps,
                dropped_rps=0.0,
                requests=requests,
                usage=dataclasses.replace(
                    _usage(min(1.0, lc_busy_cores / cores), mem_bw_gbps), freq_mhz=freq_mhz
                ),
            )
        )
    bes = []
    for spec in caps.be_apps:
        cores = alloc[spec.name].cores
        util = min(1.0, be_busy_cores / cores) if cores > 0 else 0.0
        bes.append(BeSample(spec.name, throughput=0.1, usage=_usage(util)))
    return Observation(
        time_s=t,
        interval_s=DT,
        apps=tuple(samples),
        be=tuple(bes),
        allocation=alloc,
        mem_bw_gbps=1.0,
        power_w=100.0,
    )


class Run:
    """Drives a controller tick by tick, applying (and validating) what it decides."""

    def __init__(self, ctrl, caps: Capabilities) -> None:
        self.ctrl, self.caps = ctrl, caps
        ctrl.reset(caps, np.random.default_rng(0))
        self.alloc = fair_allocation(caps)
        self.t = 0.0

    def tick(self, **kw):
        self.t = round(self.t + DT, 9)
        d = self.ctrl.decide(make_obs(self.t, self.alloc, self.caps, **kw))
        if d.allocation is not None:
            validate_allocation(d.allocation, self.caps)
            self.alloc = d.allocation
        return d

    def ticks(self, n: int, **kw) -> None:
        for _ in range(n):
            self.tick(**kw)

    def until(self, t: float, **kw) -> None:
        while self.t < t - 1e-9:
            self.tick(**kw)

    @property
    def be_cores(self) -> float:
        return self.alloc["spec_be"].cores


def naive(**changes) -> NaiveController:
    return NaiveController(dataclasses.replace(NaiveConfig(), **changes), LEVELS)


def layout(caps: Capabilities, *, cpu_levels: int = 20, levels: LevelMap = LEVELS, **kw) -> LevelLayout:
    bes = tuple(a.name for a in caps.be_apps)
    return LevelLayout(caps, fair_allocation(caps), "memcached", bes, levels, cpu_levels=cpu_levels, **kw)


# ---- level -> allocation mapping ----------------------------------------------------------------------
def test_cpu_levels_are_k_of_n_of_sysmax_split_over_the_be_jobs():
    """eris/cpuquota.py:46-61 (level k -> k x sysmax / 20, level 0 -> CPU_QUOTA_MIN, full -> no
    quota) and :104-110 (budgeting: each BE container gets quota / len(bes), except at min and full)."""
    caps = qprm_caps(two_be=True)
    lay = layout(caps, levels=dataclasses.replace(LEVELS, cpu_mode="quota"), cat=True)
    assert lay.be_quota_cores(0, 6.0) == pytest.approx(0.01)  # 1% each, not split
    assert lay.be_quota_cores(1, 6.0) == pytest.approx(0.15)  # 6/20 split over two BE jobs
    assert lay.be_quota_cores(10, 6.0) == pytest.approx(1.5)
    assert lay.be_quota_cores(19, 6.0) == pytest.approx(2.85)
    assert lay.be_quota_cores(20, 6.0) is None  # "full": no quota
    assert lay.be_quota_cores(10, 12.0) == pytest.approx(2.25)  # sysmax beyond the pool: the pool
    start = fair_allocation(caps)
    for level, quota in ((0, 0.01), (1, 0.15), (20, 0.0)):  # 0 = no quota
        a = lay.allocation(start, level, 0, 6.0)
        validate_allocation(a, caps)
        for be in ("spec_be", "spec_be2"):
            assert a[be].cpu_quota == pytest.approx(quota) and a[be].core_group == a["memcached"].core_group
            assert a[be].cores == a["memcached"].cores == pytest.approx(9.0)
        assert a["memcached"].cpu_quota == 0.0


def test_qprm_has_100_cpu_levels():
    """qprm:eris/cpuquota.py:39-61: level_max = 100, quota_step = sysmax / 100."""
    lay = layout(qprm_caps(), cpu_levels=100, cat=False)
    assert lay.be_cores(1, 9.0) == pytest.approx(0.09)
    assert lay.be_cores(50, 9.0) == pytest.approx(4.5)
    assert lay.be_quota_cores(100, 9.0) is None


def test_every_controller_gives_the_lc_app_cfs_shares_over_the_be_jobs():
    """eris/cpuquota.py:35-36 (CPU_SHARE_BE = 2, CPU_SHARE_LC = 200000), set on every container
    found (eris/eris.py:248-253; the Q-PRM keeps it, qprm:eris/eris.py:268-273)."""
    caps = qprm_caps()
    for spec in SPECS:
        run = Run(build_controller(spec), caps)
        run.tick()
        assert (run.alloc["memcached"].cpu_shares, run.alloc["spec_be"].cpu_shares) == (200_000, 2), spec


def test_cores_mode_rounds_the_quota_to_core_steps_but_never_stops_the_be_job():
    lay = layout(qprm_caps(core_step=1.0), cat=True)
    assert lay.be_cores(0, 9.0) == 1.0  # the BE job is never stopped, as at the PRM's 1% minimum
    assert lay.be_cores(1, 9.0) == 1.0  # 0.45 rounds to 0, clamped to level 0's step
    assert lay.be_cores(3, 9.0) == 1.0  # 1.35
    assert lay.be_cores(4, 9.0) == 2.0  # 1.8
    assert lay.be_cores(20, 9.0) == 8.0  # full: the LC app keeps one step


def test_proportional_v2_maps_low_levels_exponentially():
    """Not in the public code: our reading of Sec. 4.2.2 (min quota x 2^level until linear)."""
    caps = qprm_caps()
    lin = layout(caps, cpu_levels=100, cat=False)
    exp = layout(caps, cpu_levels=100, cat=False, quota_exp_base=2.0)
    got = [exp.be_cores(lv, 9.0) for lv in range(7)]
    assert got == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.54])  # 0.54 = 6/100 x 9: linear
    assert all(exp.be_cores(lv, 9.0) == pytest.approx(lin.be_cores(lv, 9.0)) for lv in range(6, 101))
    cores = [exp.be_cores(lv, 9.0) for lv in range(101)]
    assert cores == sorted(cores)


def test_llc_levels_map_to_be_masks_non_exclusive_and_exclusive():
    """eris/llcoccup.py:30-40: BE masks of level + 2 ways up to every way (bitcnt - 1 levels);
    --exclusive-cat: BE 2..11 and LC 18..9 of 20 (10 levels, full = the last). Without
    --exclusive-cat the LC app keeps the whole cache (eris/eris.py:153-155, 322-324); here its CLOS
    holds the ways the BE mask leaves, and a mask over every way shares one CLOS."""
    caps = qprm_caps()
    start = fair_allocation(caps)
    shared = layout(caps, cat=True)
    assert shared.llc_max_level == 18
    ways = {lv: shared.allocation(start, 0, lv, 9.0) for lv in (0, 5, 17, 18, 99)}
    assert [(a["spec_be"].llc_ways, a["memcached"].llc_ways) for a in ways.values()] == [
        (2, 18),
        (7, 13),
        (19, 1),
        (20, 20),
        (20, 20),
    ]
    assert ways[0]["spec_be"].clos != ways[0]["memcached"].clos
    assert ways[18]["spec_be"].clos == ways[18]["memcached"].clos  # every way: not partitioned
    exclusive = layout(caps, cat=True, exclusive_cat=True)
    assert exclusive.llc_max_level == 9
    got = [exclusive.allocation(start, 0, lv, 9.0) for lv in (0, 9, 99)]
    assert [(a["spec_be"].llc_ways, a["memcached"].llc_ways) for a in got] == [(2, 18), (11, 9), (11, 9)]
    nocat = layout(caps, cat=False).allocation(start, 5, 0, 9.0)
    validate_allocation(nocat, caps)
    assert nocat["spec_be"].clos == nocat["memcached"].clos
    assert nocat["spec_be"].llc_ways == nocat["memcached"].llc_ways == 20


def test_strictest_lc_app_is_managed_and_the_others_untouched():
    caps = qprm_caps(two_lc=True)
    run = Run(StepController(StepConfig(), LEVELS), caps)
    xapian = run.alloc["xapian"]
    run.until(30.0)
    assert run.ctrl.lc == "memcached"
    assert run.ctrl.cpu_level == 10  # +1 per 3 s with slack' >= 0.125
    assert run.alloc["xapian"] == xapian
    pool = fair_allocation(caps)["memcached"].cores + fair_allocation(caps)["spec_be"].cores
    assert run.alloc["memcached"].cores + run.be_cores == pytest.approx(pool)
    assert run.be_cores == pytest.approx(pool * 10 / 100)


def test_unpartitioned_start_is_partitioned_or_held():
    from env.allocations import unmanaged_allocation

    caps = qprm_caps()
    ctrl = StepController(StepConfig(), LEVELS)
    ctrl.reset(caps, np.random.default_rng(0))
    d = ctrl.decide(make_obs(0.5, unmanaged_allocation(caps), caps))  # one LC app: split the node
    validate_allocation(d.allocation, caps)
    assert d.allocation["spec_be"].core_group != d.allocation["memcached"].core_group
    assert d.allocation["spec_be"].cores == pytest.approx(0.01)
    caps2 = qprm_caps(two_lc=True)
    ctrl.reset(caps2, np.random.default_rng(0))
    d = ctrl.decide(make_obs(0.5, unmanaged_allocation(caps2), caps2))  # would have to move xapian
    assert d.allocation is None and "shares its core group" in d.reason
    no_be = dataclasses.replace(caps, apps=caps.apps[:1])
    ctrl.reset(no_be, np.random.default_rng(0))
    d = ctrl.decide(make_obs(0.5, fair_allocation(no_be), no_be))
    assert d.allocation is None and d.reason == "no BE job to throttle"


# ---- Intel PRM NaiveController ----------------------------------------------------------------------------
def test_naive_starts_at_level_zero_and_climbs_after_seven_quiet_cpu_cycles():
    """eris/naivectrl.py:46-56: no contention and no hold -> +1 level every cyc_thresh (7) cycles
    of 2 s (eris/eris.py:430-438); initial level 0 (eris/eris.py:280-281)."""
    run = Run(naive(), qprm_caps())
    d = run.tick()
    assert d.allocation is not None and run.be_cores == pytest.approx(0.01)  # initial state: stripped
    run.until(13.5)
    assert run.ctrl.cpu_level == 0
    run.tick()  # t = 14 s: 7 cycles of 2 s without contention (Sec. 4.1.1)
    assert run.ctrl.cpu_level == 1 and run.be_cores == pytest.approx(0.45)  # 9 CPUs / 20
    run.until(27.5)
    assert run.ctrl.cpu_level == 1
    run.tick()
    assert run.ctrl.cpu_level == 2


def test_naive_climbs_after_three_quiet_cycles_when_so_configured():
    run = Run(naive(cpu_quiet_cycles=3), qprm_caps())
    run.until(5.5)
    assert run.ctrl.cpu_level == 0
    run.tick()  # 3 quiet 2-s cycles (Sec. 4.1.3's "3 consecutive measurements")
    assert run.ctrl.cpu_level == 1


def test_naive_cpu_contention_drops_to_level_zero_and_hold_stops_the_climb():
    """eris/cpuquota.py:112-131: exceed = (lc + be) + margin > sysmax; hold = (lc + be) + margin +
    quota_step >= sysmax with quota_step = sysmax / 20; eris/naivectrl.py:41-49."""
    prof = PrmProfile(lc_max_util_cores=4.0)
    run = Run(naive(cpu_quiet_cycles=1, profile=prof), qprm_caps())
    run.until(4.0, lc_busy_cores=1.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_level == 2 and run.be_cores == pytest.approx(0.4)  # 2 x 4/20
    # 2.9 + 0.4 + 0.5 = 3.8 <= 4: no contention, but one more step (4/20 = 0.2) would reach 4: hold
    run.until(10.0, lc_busy_cores=2.9, be_busy_cores=0.4)
    assert run.ctrl.cpu_level == 2 and run.ctrl.cpu_hold and not run.ctrl.cpu_contention
    run.until(11.5, lc_busy_cores=3.2, be_busy_cores=0.4)
    assert run.ctrl.cpu_level == 2
    run.tick(lc_busy_cores=3.2, be_busy_cores=0.4)  # cycle end: 4.1 > 4 -> contention
    assert run.ctrl.cpu_contention and run.ctrl.cpu_level == 0 and run.be_cores == pytest.approx(0.01)


def test_naive_counts_an_idle_lc_app_as_contention():
    """eris/cpuquota.py:125: exceed = lc_utils == 0 or ..."""
    run = Run(naive(cpu_quiet_cycles=1), qprm_caps())
    run.until(20.0, lc_busy_cores=0.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_contention and run.ctrl.cpu_level == 0


def test_naive_raises_sysmax_at_run_time_and_the_quota_follows_at_the_next_level():
    """eris/eris.py:274-278: lc_utils > sysmax -> update_max_sys_util, which moves quota_max and
    quota_step (eris/cpuquota.py:54-61); the written quota changes at the next budgeting."""
    run = Run(naive(cpu_quiet_cycles=1, profile=PrmProfile(lc_max_util_cores=4.0)), qprm_caps())
    run.until(2.0, lc_busy_cores=1.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_level == 1 and run.be_cores == pytest.approx(0.2)  # 4 / 20
    run.until(4.0, lc_busy_cores=5.0, be_busy_cores=0.0)  # 5 > 4: sysmax 5, and 5.5 > 5: contention
    assert run.ctrl.cpu_threshold_cores == pytest.approx(5.0) and run.ctrl.cpu_level == 0
    run.until(6.0, lc_busy_cores=1.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_level == 1 and run.be_cores == pytest.approx(0.25)  # 5 / 20
    unprofiled = Run(naive(), qprm_caps())
    unprofiled.tick()
    assert unprofiled.ctrl.cpu_threshold_cores == pytest.approx(
        9.0
    )  # no model file: every CPU (eris.py:380-381)


def test_naive_llc_climbs_one_level_per_six_quiet_20s_cycles():
    """eris/eris.py:435-436 (--llc-cycles 6), :432-434 (--metric-interval 20 s); Fig. 7.5."""
    run = Run(naive(), qprm_caps())
    run.until(119.5)
    assert run.ctrl.llc_level == 0 and run.alloc["spec_be"].llc_ways == 2
    run.tick()  # t = 120 s: 6 cycles of 20 s (Sec. 4.1.1, Fig. 7.5)
    assert run.ctrl.llc_level == 1
    assert (run.alloc["spec_be"].llc_ways, run.alloc["memcached"].llc_ways) == (3, 17)
    run.until(240.0)
    assert run.ctrl.llc_level == 2


def _llc_run(bin_start_cores: float) -> Run:
    # LC alone: 1 busy core at 2.1 GHz for 1e5 req/s = 21,000 cycles and 0.1 GB/s / 64 B = 15.6 L3
    # misses per request
    fence = LlcBin(
        util_start_cores=bin_start_cores, util_end_cores=9.0, cycles_per_req=25_000.0, misses_per_req=20.0
    )
    prof = PrmProfile(lc_max_util_cores=6.0, llc_bins=(fence,))
    return Run(naive(llc_quiet_cycles=1, profile=prof), qprm_caps())


def test_naive_llc_contention_needs_cpi_and_mpki_over_their_fences():
    """eris/container.py:209-223: CPI over its fence, then L3 MPKI over its fence -> LLC
    contention; eris/naivectrl.py:41-45: the LLC level drops to 0."""
    run = _llc_run(0.0)
    run.until(40.0)
    assert run.ctrl.llc_level == 2 and not run.ctrl.llc_contention
    cpu_before = run.ctrl.cpu_level
    run.until(60.0, lc_busy_cores=1.5, mem_bw_gbps=0.1)  # 31,500 cycles but 15.6 misses: not both
    assert run.ctrl.llc_level == 3 and not run.ctrl.llc_contention
    run.until(79.5, lc_busy_cores=1.5, mem_bw_gbps=0.2)
    assert run.ctrl.llc_level == 3
    run.tick(lc_busy_cores=1.5, mem_bw_gbps=0.2)  # cycle end: 31,500 cycles and 31.3 misses per request
    assert run.ctrl.llc_contention and run.ctrl.llc_level == 0 and run.alloc["spec_be"].llc_ways == 2
    assert run.ctrl.cpu_level >= cpu_before  # the CPU level is regulated separately


def test_naive_llc_detects_nothing_below_the_first_utilisation_bin():
    """eris/container.py:265-269: below the first bin no detection at all (the thesis needed the
    9-CPU node for memcached to reach it, Sec. 5.2)."""
    run = _llc_run(4.5)
    run.until(100.0, lc_busy_cores=1.5, mem_bw_gbps=0.2)
    assert not run.ctrl.llc_contention and run.ctrl.llc_level == 5


def test_naive_without_cat_shares_the_llc_and_keeps_it():
    run = Run(naive(cat=False), qprm_caps())
    run.until(300.0)
    assert run.ctrl.llc_level == 0
    be, lc = run.alloc["spec_be"], run.alloc["memcached"]
    assert be.clos == lc.clos and be.llc_ways == lc.llc_ways == 20


def test_profile_lc_builds_sysmax_and_fences_per_analyzer_bin():
    """analyzer.py:188-194 (lcutilmax = the largest LC utilisation), :81-92 and :134-181 (bins from
    half the requested CPUs, a fence per metric per bin with data)."""
    caps = qprm_caps()
    alloc = fair_allocation(caps)
    busy = [1.0, 2.0, 3.0, 2.0] * 20  # 40 s of ticks
    obs = [make_obs((i + 1) * DT, alloc, caps, lc_busy_cores=b) for i, b in enumerate(busy)]
    prof = profile_lc(obs, "memcached", requested_cores=4.0)
    assert prof.lc_max_util_cores == pytest.approx(2.0)  # each 2-s cycle averages 1, 2, 3, 2
    (b,) = prof.llc_bins  # bins start at 2 cores; 2.0 falls in [2.0, 2.5] only
    assert (b.util_start_cores, b.util_end_cores) == pytest.approx((2.0, 2.5))
    assert b.cycles_per_req == pytest.approx(2.0 * 2.1e9 / 1e5)  # constant across cycles
    assert b.misses_per_req == pytest.approx(0.1e9 / 64 / 1e5)
    assert prof.bin_for(1.0) is None and prof.bin_for(7.0) is b


# ---- Q-PRM Step --------------------------------------------------------------------------------------------------
def step_run(**cfg) -> Run:
    return Run(StepController(StepConfig(**cfg), LEVELS), qprm_caps())


def test_step_climbs_one_level_every_third_sample_with_slack_over_the_dead_band():
    """qprm:eris/controller.py:443-460: level change = floor(-8 (lat - 0.9 T) / 0.9 T); > 0 counts,
    every CYCLE_THRESHOLD = 3 such samples step_up (+1)."""
    run = step_run()
    run.until(2.5)  # p99 0.5 T: slack' = 0.44, change 3
    assert run.ctrl.cpu_level == 0
    run.tick()  # t = 3 s: the third sample
    assert run.ctrl.cpu_level == 1 and run.be_cores == pytest.approx(0.09)  # 1 of 100 levels of 9 CPUs
    run.until(6.0)
    assert run.ctrl.cpu_level == 2


def test_step_dead_band_does_nothing_not_even_to_its_count():
    """slack' in [0, 0.125) gives floor(8 slack') = 0: no move, the count kept (controller.py:452-460)."""
    run = step_run()
    run.until(2.0)  # two good samples
    run.until(10.0, p99_us=0.85 * TARGET_US)  # slack' 0.056: eight samples in the dead band
    assert run.ctrl.cpu_level == 0 and run.ctrl.up_count == 2
    run.until(11.0)
    assert run.ctrl.cpu_level == 1


def test_step_drops_one_level_when_p99_passes_09_of_the_target():
    """change < 0 -> step_down at once and the count restarts (controller.py:452-454); the target
    is 0.9 x the QoS target (--margin-ratio 0.9, qprm:eris/eris.py:471-473, controller.py:440)."""
    run = step_run()
    run.until(12.0)
    assert run.ctrl.cpu_level == 4
    run.until(13.0, p99_us=0.95 * TARGET_US)  # QoS met, but over 0.9 x target: -1
    assert run.ctrl.cpu_level == 3 and run.be_cores == pytest.approx(0.27)
    run.until(15.0)
    assert run.ctrl.cpu_level == 3
    run.until(16.0)
    assert run.ctrl.cpu_level == 4
    run.until(24.0, p99_us=1.1 * TARGET_US)
    assert run.ctrl.cpu_level == 0  # never below level 0


def test_step_sample_is_the_request_weighted_p99_of_its_ticks():
    run = step_run()
    run.until(3.0)
    assert run.ctrl.cpu_level == 1
    # Each second: one tick of 100 requests at 2x the target, one of 900 at 0.3 of it.
    for _ in range(3):
        run.tick(p99_us=2.0 * TARGET_US, requests=100)
        run.tick(p99_us=0.3 * TARGET_US, requests=900)
    assert run.ctrl.last_slack == pytest.approx((0.9 - 0.47) / 0.9)  # weighted p99 = 0.47 x target
    assert run.ctrl.cpu_level == 2


# ---- Q-PRM Proportional and Proportional v2 --------------------------------------------------------------
def test_proportional_moves_by_floor_of_eight_times_slack_prime():
    """qprm:eris/controller.py:413-430: step_by(floor(8 slack')): decreases at once, increases on
    every third sample asking for one."""
    run = Run(ProportionalController(StepConfig(), LEVELS), qprm_caps())
    run.until(2.5)
    assert run.ctrl.cpu_level == 0
    run.tick()  # the third sample with slack' 0.44: +3
    assert run.ctrl.cpu_level == 3 and run.be_cores == pytest.approx(0.27)
    run.until(6.0)
    assert run.ctrl.cpu_level == 6
    run.until(7.0, p99_us=1.3 * TARGET_US)  # slack' = -0.44: floor(-3.6) = -4, at once
    assert run.ctrl.cpu_level == 2
    run.until(30.0, p99_us=0.85 * TARGET_US)  # dead band
    assert run.ctrl.cpu_level == 2


def test_proportional_v2_gives_finer_quota_at_low_levels():
    prop = Run(ProportionalController(StepConfig(), LEVELS), qprm_caps())
    prop2 = Run(ProportionalController(StepConfig(quota_exp_base=2.0), LEVELS), qprm_caps())
    for run in (prop, prop2):
        run.until(3.0)
        assert run.ctrl.cpu_level == 3  # same rule
    assert prop.be_cores == pytest.approx(0.27)
    assert prop2.be_cores == pytest.approx(0.08)  # 0.01 x 2^3


# ---- Q-PRM Basic --------------------------------------------------------------------------------------------------
def basic_run() -> Run:
    return Run(BasicController(BasicConfig(), LEVELS), qprm_caps())


def feed(run: Run, slacks: list[float]) -> None:
    """One 1-s sample per slack (two 500 ms ticks each)."""
    for s in slacks:
        run.ticks(2, p99_us=(1.0 - s) * TARGET_US)


def test_basic_decides_every_ten_samples_with_steps_5_3_2_1():
    """qprm:eris/controller.py:119-150: every BUFFER_SIZE = 10 samples, on the buffer's average;
    _step_from_slack: 5 / 3 / 2 / 1 above 0.75 / 0.5 / 0.25 / else (:127-135)."""
    run = basic_run()
    feed(run, [0.8] * 9)
    assert run.ctrl.cpu_level == 0 and len(run.ctrl.buffer) == 9
    feed(run, [0.8])  # 10-s average 0.8: the first decision goes up by 5
    assert run.ctrl.cpu_level == 5 and run.ctrl.prev_loss == pytest.approx(0.6)
    levels = []
    for avg in (0.8, 0.6, 0.3, 0.22):  # the loss never grows: up by 5, 3, 2, 1
        feed(run, [avg] * 10)
        levels.append(run.ctrl.cpu_level)
    assert levels == [10, 13, 15, 16]
    assert len(run.ctrl.buffer) == 10  # a ring buffer of 10 slacks


def test_basic_reverses_direction_when_the_loss_grows_and_a_zero_loss_counts_as_none():
    """controller.py:137-150: `if self.prev_loss:` - a last loss of exactly 0 compares with nothing."""
    run = basic_run()
    feed(run, [0.3] * 30)
    assert run.ctrl.cpu_level == 6
    feed(run, [0.8] * 10)  # loss 0.6 > 0.1: reverse, 5 levels
    assert run.ctrl.direction == -1 and run.ctrl.cpu_level == 1
    run2 = basic_run()
    run2.ctrl.prev_loss = 0.0
    feed(run2, [0.9] * 10)  # loss 0.7 > 0, but a zero last loss is falsy: no reversal
    assert run2.ctrl.direction == 1 and run2.ctrl.cpu_level == 5


def test_basic_violation_throttles_to_zero_and_recovers_on_the_3s_average_every_10s():
    """controller.py:109-114 (violation: level 0, restore half, recovery) when _running_avg(3) <=
    MARGIN (:154-158); recovery every 10 samples when the 3-sample average > 0.3 (:159-167)."""
    run = basic_run()
    feed(run, [0.3] * 30)
    assert run.ctrl.cpu_level == 6
    feed(run, [-0.2])  # 3-s average (0.3 + 0.3 - 0.2) / 3 = 0.13: not yet
    assert run.ctrl.cpu_level == 6 and not run.ctrl.recovery
    feed(run, [-0.2])  # (0.3 - 0.2 - 0.2) / 3 = -0.03 <= 0.05: violation
    assert run.ctrl.recovery and run.ctrl.cpu_level == 0 and run.ctrl.restore_level == 3
    assert run.be_cores == pytest.approx(0.01)
    feed(run, [0.4] * 9)
    assert run.ctrl.recovery  # checked every 10 samples only
    feed(run, [0.0])  # 10th: 3-s average (0.4 + 0.4 + 0) / 3 = 0.27 <= 0.3: still recovering
    assert run.ctrl.recovery and run.ctrl.cpu_level == 0
    feed(run, [0.0] * 7 + [0.4] * 3)  # 10-s average 0.12, 3-s average 0.4 > 0.3: recovered
    assert not run.ctrl.recovery and run.ctrl.cpu_level == 3 and run.be_cores == pytest.approx(0.27)


def test_basic_keeps_its_last_loss_across_a_violation():
    """controller.py:109-114: a violation leaves prev_loss (and the direction) as they were."""
    run = basic_run()
    feed(run, [0.3] * 10)
    assert run.ctrl.prev_loss == pytest.approx(0.1) and run.ctrl.cpu_level == 2
    feed(run, [0.0] * 3)  # 3-s averages 0.2, 0.1, then 0 <= 0.05: violation
    assert run.ctrl.recovery and run.ctrl.prev_loss == pytest.approx(0.1)
    feed(run, [0.35] * 10)  # recovered: restore level 1
    assert not run.ctrl.recovery and run.ctrl.cpu_level == 1
    feed(run, [0.35] * 10)  # loss 0.15 > 0.1 (from before the violation): reverse
    assert run.ctrl.direction == -1 and run.ctrl.cpu_level == 0


# ---- configuration ------------------------------------------------------------------------------------
def test_yaml_builds_every_spec_with_the_codes_constants():
    cfgs = load_configs()
    assert cfgs.levels == LevelMap(min_quota_cores=0.01, cpu_mode="quota", llc_min_ways=2)
    assert (cfgs.prm.cpu_levels, cfgs.prm.cpu_cycle_s, cfgs.prm.cpu_quiet_cycles) == (20, 2.0, 7)
    assert (cfgs.prm.llc_cycle_s, cfgs.prm.llc_quiet_cycles) == (20.0, 6)
    assert cfgs.prm.cat and not cfgs.prm.exclusive_cat and not cfgs.prm_nocat.cat
    assert cfgs.qprm_step == StepConfig() and cfgs.qprm_prop == StepConfig()
    assert (cfgs.qprm_step.cpu_levels, cfgs.qprm_step.target_margin, cfgs.qprm_step.gain_levels) == (
        100,
        0.9,
        8.0,
    )
    assert cfgs.qprm_prop2 == StepConfig(quota_exp_base=2.0)
    assert cfgs.qprm_basic == BasicConfig()
    assert [cfgs.qprm_basic.step(s) for s in (0.8, 0.6, 0.3, 0.25, -1.0)] == [5, 3, 2, 1, 1]
    kinds = {s: type(build_controller(s)).__name__ for s in SPECS}
    assert kinds == {
        "prm": "NaiveController",
        "prm:exclusive-cat": "NaiveController",
        "prm-nocat": "NaiveController",
        "qprm-step": "StepController",
        "qprm-prop": "ProportionalController",
        "qprm-prop2": "ProportionalController",
        "qprm-basic": "BasicController",
    }
    assert all(build_controller(s).name == s for s in SPECS)
    assert build_controller("prm:exclusive-cat").exclusive_cat


def test_unknown_yaml_key_and_unknown_spec_are_config_errors(tmp_path):
    text = DEFAULT_CONFIG.read_text()
    bad = tmp_path / "prm.yaml"
    bad.write_text(text.replace("  up_after_samples: 3    # CYCLE", "  up_after_sample: 3    # CYCLE"))
    with pytest.raises(ConfigError, match="up_after_sample"):
        load_configs(bad)
    with pytest.raises(ConfigError, match="unknown PRM controller"):
        build_controller("qprm-pid")
    with pytest.raises(ConfigError, match="unknown PRM controller"):
        build_controller("prm:inclusive")


def test_profiling_the_qprm_sinusoid_fences_the_bins_memcached_reaches():
    from baselines.prm import profile_in_sim
    from env.sim.scenario import load_scenario

    p = profile_in_sim(load_scenario("qprm-sinusoid"), "memcached", 600.0)
    assert p.lc_max_util_cores == pytest.approx(9.0, abs=0.5)  # saturates the 9-core node at the peak
    assert p.llc_bins and all(b.util_start_cores >= 4.5 for b in p.llc_bins)  # half of the 9 requested
    assert all(b.cycles_per_req > 0 and b.misses_per_req > 0 for b in p.llc_bins)


def test_registry_factories_profile_the_prm_in_simulation_only():
    from baselines import prm
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario
    from harness.registry import make_controller

    scn = simple_scenario({"memcached": 0.4}, duration_s=60, warmup_s=10, seed=0)
    node = SimNode(scn, seed=0)
    sim_ctx = ControllerContext(node.capabilities(), scn, node, 0)
    real_ctx = ControllerContext(node.capabilities())
    t0 = node.time_s
    profiled = prm.make("prm", sim_ctx)
    assert node.time_s == t0  # the profiling run used a fresh SimNode, not the node under evaluation
    p = profiled.config.profile
    assert p.lc_max_util_cores is not None and 0 < p.lc_max_util_cores <= node.capabilities().cores
    # memcached alone at 40% uses ~3 of the 14 cores it requests, under the Analyzer's first bin (7):
    # no fence, the PRM's LLC detection cannot work (why the thesis shrank its node, Sec. 5.2)
    assert p.lc_max_util_cores < 7.0 and p.llc_bins == ()
    assert prm.make("prm-nocat", real_ctx).config.profile == PrmProfile()  # a real node: the YAML profile
    made = [prm.make(s, real_ctx) for s in ("qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic")]
    assert [c.name for c in made] == ["qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic"]
    xcat = make_controller("prm:exclusive-cat", real_ctx)
    assert isinstance(xcat, NaiveController) and xcat.exclusive_cat and xcat.name == "prm:exclusive-cat"


# ---- short runs on the simulator ----------------------------------------------------------------------
def _simnode(spec: str, memcached_load: float):
    """A simulated node running memcached at `memcached_load` beside xapian at 20% (60 s after a
    10 s warm-up) and the controller `spec`, reset on it: (node, controller)."""
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    scn = simple_scenario({"memcached": memcached_load, "xapian": 0.2}, duration_s=60, warmup_s=10, seed=0)
    node = SimNode(scn, seed=0)
    ctrl = build_controller(spec)
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    return node, ctrl


@pytest.mark.parametrize("spec", SPECS)
def test_short_simnode_run(spec):
    node, ctrl = _simnode(spec, 0.2)
    obs = node.observe()
    start = obs.allocation
    pool = start["memcached"].cores + start["be_parties"].cores + start.idle_cores
    times, levels, slacks = [], [], []
    for _ in range(120):  # 60 s of 500 ms ticks
        d = ctrl.decide(obs)
        times.append(obs.time_s)
        levels.append(ctrl.cpu_level)
        slacks.append(getattr(ctrl, "last_slack", math.nan))
        obs = node.step(d.allocation)  # SimNode.apply validates every allocation
        a = obs.allocation
        assert a["xapian"] == start["xapian"]  # the other LC app is left alone
        lay = ctrl.layout
        assert lay.quota  # the shipped configuration: BE under a CFS quota in the LC app's cpuset
        assert a["be_parties"].core_group == a["memcached"].core_group
        assert a["memcached"].cores == a["be_parties"].cores == pytest.approx(pool)
        quota = lay.be_quota_cores(ctrl.cpu_level, ctrl._quota_sysmax_cores)
        assert a["be_parties"].cpu_quota == pytest.approx(quota or 0.0)
    assert ctrl.lc == "memcached" and levels[0] == 0
    if spec.startswith("prm"):
        # Light load, no profile: no contention, so +1 level every 14 s (7 quiet 2-s cycles).
        assert levels == [int(t // 14.0 + 1e-9) for t in times]
        return
    ups = [i for i in range(1, len(levels)) if levels[i] > levels[i - 1]]
    downs = [i for i in range(1, len(levels)) if levels[i] < levels[i - 1]]
    assert ups  # the BE job is given CPU under slack
    violating = [i for i, s in enumerate(slacks[:-1]) if s < 0]
    assert downs or not violating  # ... and throttled when QoS suffers (if it does at this load)
    if spec in ("qprm-step", "qprm-prop", "qprm-prop2"):
        assert all(slacks[i] < 0 for i in downs)  # only a sample over 0.9 x target lowers the level


def _sim_cpu_levels(spec: str, memcached_load: float) -> list[tuple[int, int, float]]:
    """120 s of 1-s ticks on the simulated Q-PRM node (memcached_qprm beside fotonik): per tick,
    (level before, level after, slack' of the controller's latest sample)."""
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    scn = simple_scenario(
        {"memcached_qprm:memcached": memcached_load},
        platform="qprm",
        be=("be_fotonik",),
        duration_s=120,
        warmup_s=0,
    )
    node = SimNode(scn, seed=0)
    ctrl = build_controller(spec)
    ctrl.reset(node.capabilities(), np.random.default_rng(0))
    obs, rows = node.observe(), []
    for _ in range(120):
        before = ctrl.cpu_level
        d = ctrl.decide(obs)
        rows.append((before, ctrl.cpu_level, ctrl.last_slack))
        obs = node.step(d.allocation)
    return rows


@pytest.mark.parametrize("spec", ["qprm-step", "qprm-prop2"])
def test_qprm_throttles_the_be_job_at_each_violating_sample_on_the_simulator(spec):
    """Q-PRM thesis Sec. 4.2.2: a sample whose p99 is over the (0.9 x) target lowers the BE job's CPU
    level at once. At a heavy memcached load the BE job's growth makes memcached miss; the
    controller must throttle at every new violating sample and so keep the BE job lower than at
    20% load."""
    heavy, light = _sim_cpu_levels(spec, 0.9), _sim_cpu_levels(spec, 0.2)
    new_samples = [i for i in range(1, len(heavy)) if heavy[i][2] != heavy[i - 1][2]]
    violating = [i for i in new_samples if heavy[i][2] < 0 and heavy[i][0] > 0]
    assert len(violating) >= 3, "the scenario no longer makes memcached miss: pick a heavier load"
    assert all(heavy[i][1] < heavy[i][0] for i in violating)
    assert max(r[1] for r in heavy) < max(r[1] for r in light)
