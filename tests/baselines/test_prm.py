"""Intel PRM NaiveController and the Q-PRM controllers (baselines/prm.py; Q-PRM thesis Sec. 4.1-4.2).

State machines are driven by hand-built observations on a 9-core, 20-way node (the Q-PRM server
node, Sec. 5.2) with 500 ms ticks; a short run of each spec on a SimNode closes the file.

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
    PropConfig,
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


def qprm_caps(core_step: float = 0.01, *, two_lc: bool = False) -> Capabilities:
    apps = [AppSpec("memcached", "lc", TARGET_US, 500_000.0)]
    if two_lc:
        apps.append(AppSpec("xapian", "lc", 50_000.0, 8000.0))
    apps.append(AppSpec("spec_be", "be"))
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
                usage=_usage(min(1.0, lc_busy_cores / cores), mem_bw_gbps),
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


# ---- level -> allocation mapping (Sec. 4.1.2) ---------------------------------------------------------
def test_cpu_levels_map_to_be_cores_over_the_pool():
    caps = qprm_caps()
    lay = LevelLayout(caps, fair_allocation(caps), "memcached", ("spec_be",), LEVELS, cat=True)
    assert lay.pool_cores == pytest.approx(9.0)
    assert lay.be_cores(0) == pytest.approx(0.01)  # 1% of a CPU (Sec. 7.1.1)
    assert lay.be_cores(1) == pytest.approx(0.45)  # 9 CPUs in 20 steps
    assert lay.be_cores(10) == pytest.approx(4.5)
    assert lay.be_cores(19) == pytest.approx(8.55)
    assert lay.be_cores(20) == pytest.approx(8.99)  # "full": the LC app keeps one core step
    alloc = lay.allocation(fair_allocation(caps), 10, 0)
    validate_allocation(alloc, caps)
    assert alloc["memcached"].cores + alloc["spec_be"].cores == pytest.approx(9.0)


def test_quota_mode_keeps_the_be_jobs_in_the_lc_cpuset_under_a_cfs_quota():
    """Sec. 4.1.2 / 7.1.1: the PRM throttles the BE job's CPU quota inside the shared cpuset."""
    caps = qprm_caps(core_step=1.0)
    levels = dataclasses.replace(LEVELS, cpu_mode="quota")
    start = fair_allocation(caps)
    lay = LevelLayout(caps, start, "memcached", ("spec_be",), levels, cat=True)
    assert lay.be_cores(0) == pytest.approx(0.01)  # 1% of a CPU even with whole-core steps
    assert lay.be_cores(10) == pytest.approx(4.5) and lay.be_cores(20) == pytest.approx(9.0)
    for level, quota in ((0, 0.01), (7, 3.15), (20, 0.0)):  # 0 = no quota at the top level
        a = lay.allocation(start, level, 0)
        validate_allocation(a, caps)
        assert a["spec_be"].core_group == a["memcached"].core_group
        assert a["spec_be"].cores == a["memcached"].cores == pytest.approx(9.0)
        assert a["spec_be"].cpu_quota == pytest.approx(quota) and a["memcached"].cpu_quota == 0.0


def test_level_zero_rounds_up_to_one_core_step():
    caps = qprm_caps(core_step=1.0)
    lay = LevelLayout(caps, fair_allocation(caps), "memcached", ("spec_be",), LEVELS, cat=True)
    assert lay.be_cores(0) == 1.0  # the BE job is never stopped, as the PRM's 1% minimum
    assert lay.be_cores(1) == 1.0  # 0.45 rounds to 0, clamped to level 0's step
    assert lay.be_cores(3) == 1.0  # 1.35
    assert lay.be_cores(4) == 2.0  # 1.8
    assert lay.be_cores(20) == 8.0


def test_proportional_v2_maps_low_levels_exponentially():
    caps = qprm_caps()
    lin = LevelLayout(caps, fair_allocation(caps), "memcached", ("spec_be",), LEVELS, cat=False)
    exp = LevelLayout(
        caps, fair_allocation(caps), "memcached", ("spec_be",), LEVELS, cat=False, quota_exp_base=2.0
    )
    assert [exp.be_cores(lv) for lv in range(7)] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64])
    assert exp.be_cores(9) == pytest.approx(lin.be_cores(9))  # 4.05 < 5.12: linear from here on
    assert all(exp.be_cores(lv) == pytest.approx(lin.be_cores(lv)) for lv in range(9, 21))
    cores = [exp.be_cores(lv) for lv in range(21)]
    assert cores == sorted(cores)


def test_llc_levels_map_to_be_ways_with_cat_and_are_shared_without():
    caps = qprm_caps()
    start = fair_allocation(caps)
    lay = LevelLayout(caps, start, "memcached", ("spec_be",), LEVELS, cat=True)
    assert lay.llc_max_level == 16
    a0, top = lay.allocation(start, 0, 0), lay.allocation(start, 0, 99)
    assert (a0["spec_be"].llc_ways, a0["memcached"].llc_ways) == (2, 18)  # level 0 = 2 ways
    assert (top["spec_be"].llc_ways, top["memcached"].llc_ways) == (18, 2)  # max = 18 of 20
    assert a0["spec_be"].clos != a0["memcached"].clos
    shared = LevelLayout(caps, start, "memcached", ("spec_be",), LEVELS, cat=False).allocation(start, 5, 0)
    validate_allocation(shared, caps)
    assert shared["spec_be"].clos == shared["memcached"].clos
    assert shared["spec_be"].llc_ways == shared["memcached"].llc_ways == 20


def test_strictest_lc_app_is_managed_and_the_others_untouched():
    caps = qprm_caps(two_lc=True)
    run = Run(StepController(StepConfig(), LEVELS), caps)
    xapian = run.alloc["xapian"]
    run.until(30.0)
    assert run.ctrl.lc == "memcached"
    assert run.ctrl.cpu_level == 10  # +1 per 3 s without violation
    assert run.alloc["xapian"] == xapian
    pool = fair_allocation(caps)["memcached"].cores + fair_allocation(caps)["spec_be"].cores
    assert run.alloc["memcached"].cores + run.be_cores == pytest.approx(pool)
    assert run.be_cores == pytest.approx(pool / 2)


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


# ---- Intel PRM NaiveController (Sec. 4.1) ------------------------------------------------------------
def test_naive_starts_at_level_zero_and_climbs_after_seven_quiet_cpu_cycles():
    run = Run(naive(), qprm_caps())
    d = run.tick()
    assert d.allocation is not None and run.be_cores == pytest.approx(0.01)  # initial state: stripped
    run.until(13.5)
    assert run.ctrl.cpu_level == 0
    run.tick()  # t = 14 s: 7 cycles of 2 s without contention (Sec. 4.1.1)
    assert run.ctrl.cpu_level == 1 and run.be_cores == pytest.approx(0.45)
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
    prof = PrmProfile(lc_max_util_cores=4.0)
    run = Run(naive(cpu_quiet_cycles=1, profile=prof), qprm_caps())
    run.until(4.0, lc_busy_cores=1.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_level == 2
    # 2.5 + 0.9 + 0.5 = 3.9 <= 4: no contention, but one more level (+0.45) would reach 4: hold.
    run.until(10.0, lc_busy_cores=2.5, be_busy_cores=0.9)
    assert run.ctrl.cpu_level == 2 and run.ctrl.cpu_hold and not run.ctrl.cpu_contention
    run.until(11.5, lc_busy_cores=2.7, be_busy_cores=0.9)
    assert run.ctrl.cpu_level == 2
    run.tick(lc_busy_cores=2.7, be_busy_cores=0.9)  # cycle end: 4.1 > 4 -> contention
    assert run.ctrl.cpu_contention and run.ctrl.cpu_level == 0 and run.be_cores == pytest.approx(0.01)


def test_naive_records_the_lc_maximum_utilisation_at_run_time():
    run = Run(naive(profile=PrmProfile(lc_max_util_cores=2.0)), qprm_caps())
    run.until(2.0, lc_busy_cores=3.0, be_busy_cores=0.0)
    assert run.ctrl.cpu_threshold_cores == pytest.approx(3.0)
    assert run.ctrl.cpu_contention  # 3 + 0 + 0.5 > 3
    unprofiled = Run(naive(), qprm_caps())
    unprofiled.tick()
    assert unprofiled.ctrl.cpu_threshold_cores == pytest.approx(9.0)  # no profile: all pooled cores


def test_naive_llc_climbs_one_level_per_six_quiet_20s_cycles():
    run = Run(naive(), qprm_caps())
    run.until(119.5)
    assert run.ctrl.llc_level == 0 and run.alloc["spec_be"].llc_ways == 2
    run.tick()  # t = 120 s: 6 cycles of 20 s (Sec. 4.1.1, Fig. 7.5)
    assert run.ctrl.llc_level == 1
    assert (run.alloc["spec_be"].llc_ways, run.alloc["memcached"].llc_ways) == (3, 17)
    run.until(240.0)
    assert run.ctrl.llc_level == 2


def test_naive_llc_contention_drops_to_level_zero():
    # LC alone: 1 busy core for 1e5 req/s = 10 us/request, 0.1 GB/s = 1 KB/request.
    fence = LlcBin(util_start_cores=0.0, util_end_cores=9.0, cpu_us_per_req=12.0, mem_kb_per_req=1.5)
    run = Run(
        naive(llc_quiet_cycles=1, profile=PrmProfile(lc_max_util_cores=6.0, llc_bins=(fence,))), qprm_caps()
    )
    run.until(40.0)
    assert run.ctrl.llc_level == 2 and not run.ctrl.llc_contention
    cpu_before = run.ctrl.cpu_level
    # CPI proxy up but MPKI proxy within its fence: no LLC contention (both must exceed).
    run.until(60.0, lc_busy_cores=1.5, mem_bw_gbps=0.1)
    assert run.ctrl.llc_level == 3 and not run.ctrl.llc_contention
    run.until(79.5, lc_busy_cores=1.5, mem_bw_gbps=0.2)
    assert run.ctrl.llc_level == 3
    run.tick(lc_busy_cores=1.5, mem_bw_gbps=0.2)  # cycle end: 15 us and 2 KB per request
    assert run.ctrl.llc_contention and run.ctrl.llc_level == 0 and run.alloc["spec_be"].llc_ways == 2
    assert run.ctrl.cpu_level >= cpu_before  # the CPU level is regulated separately


def test_naive_without_cat_shares_the_llc_and_keeps_it():
    run = Run(naive(cat=False), qprm_caps())
    run.until(300.0)
    assert run.ctrl.llc_level == 0
    be, lc = run.alloc["spec_be"], run.alloc["memcached"]
    assert be.clos == lc.clos and be.llc_ways == lc.llc_ways == 20


def test_profile_lc_builds_the_cpu_threshold_and_llc_fences():
    caps = qprm_caps()
    alloc = fair_allocation(caps)
    busy = [1.0, 2.0, 3.0, 2.0] * 20  # 40 s of ticks
    obs = [make_obs((i + 1) * DT, alloc, caps, lc_busy_cores=b) for i, b in enumerate(busy)]
    prof = profile_lc(obs, "memcached")
    assert prof.lc_max_util_cores == pytest.approx(2.0)  # each 2-s cycle averages 1, 2, 3, 2
    (b,) = prof.llc_bins
    assert b.util_start_cores == pytest.approx(2.0) and b.util_end_cores == pytest.approx(2.5)
    assert b.cpu_us_per_req == pytest.approx(20.0)  # constant across cycles: std 0
    assert b.mem_kb_per_req == pytest.approx(1.0)
    assert prof.bin_for(1.0) is None and prof.bin_for(7.0) is b


# ---- Q-PRM Step (Sec. 4.2.2) --------------------------------------------------------------------------
def test_step_climbs_every_three_seconds_without_violation():
    run = Run(StepController(StepConfig(), LEVELS), qprm_caps())
    run.until(2.5)
    assert run.ctrl.cpu_level == 0
    run.tick()  # t = 3 s: three 1-s samples without violation
    assert run.ctrl.cpu_level == 1
    run.until(5.5)
    assert run.ctrl.cpu_level == 1
    run.tick()
    assert run.ctrl.cpu_level == 2


def test_step_drops_one_level_per_violating_sample_and_restarts_its_count():
    run = Run(StepController(StepConfig(), LEVELS), qprm_caps())
    run.until(12.0)
    assert run.ctrl.cpu_level == 4
    run.until(13.0, p99_us=1.1 * TARGET_US)  # one violating sample: -1, not to level 0
    assert run.ctrl.cpu_level == 3 and run.be_cores == pytest.approx(1.35)
    run.until(15.0)
    assert run.ctrl.cpu_level == 3
    run.until(16.0)
    assert run.ctrl.cpu_level == 4
    run.until(24.0, p99_us=1.1 * TARGET_US)
    assert run.ctrl.cpu_level == 0  # never below level 0


def test_step_sample_is_the_request_weighted_p99_of_its_ticks():
    run = Run(StepController(StepConfig(), LEVELS), qprm_caps())
    run.until(3.0)
    assert run.ctrl.cpu_level == 1
    # Each second: one tick of 100 requests at 2x the target, one of 900 at half of it.
    for _ in range(3):
        run.tick(p99_us=2.0 * TARGET_US, requests=100)
        run.tick(p99_us=0.5 * TARGET_US, requests=900)
    assert run.ctrl.last_slack == pytest.approx(0.35)
    assert run.ctrl.cpu_level == 2  # no violation: the weighted p99 is 0.65 x target


# ---- Q-PRM Proportional and Proportional v2 (Sec. 4.2.2) ---------------------------------------------
def test_proportional_moves_by_floor_of_gain_times_slack():
    run = Run(ProportionalController(PropConfig(), LEVELS), qprm_caps())
    run.until(2.5, p99_us=0.5 * TARGET_US)
    assert run.ctrl.cpu_level == 0
    run.tick(p99_us=0.5 * TARGET_US)  # third sample asking for floor(8 * 0.5) = +4
    assert run.ctrl.cpu_level == 4 and run.be_cores == pytest.approx(1.8)
    run.until(4.0, p99_us=1.3 * TARGET_US)  # slack -0.3: floor(-2.4) = -3, at once
    assert run.ctrl.cpu_level == 1
    run.until(30.0, p99_us=0.9 * TARGET_US)  # slack 0.1: floor(0.8) = 0, no change
    assert run.ctrl.cpu_level == 1


def test_proportional_v2_gives_finer_quota_at_low_levels():
    prop = Run(ProportionalController(PropConfig(), LEVELS), qprm_caps())
    prop2 = Run(ProportionalController(PropConfig(quota_exp_base=2.0), LEVELS), qprm_caps())
    for run in (prop, prop2):
        run.until(3.0, p99_us=0.5 * TARGET_US)
        assert run.ctrl.cpu_level == 4  # same rule
    assert prop.be_cores == pytest.approx(1.8)
    assert prop2.be_cores == pytest.approx(0.16)  # 0.01 * 2^4


# ---- Q-PRM Basic (Sec. 4.2.2) -------------------------------------------------------------------------
def basic_run() -> Run:
    return Run(BasicController(BasicConfig(), LEVELS), qprm_caps())


def feed(run: Run, slacks: list[float]) -> None:
    """One 1-s sample per slack (two 500 ms ticks each)."""
    for s in slacks:
        run.ticks(2, p99_us=(1.0 - s) * TARGET_US)


def test_basic_decides_every_ten_seconds_with_slack_sized_steps():
    run = basic_run()
    feed(run, [0.5] * 9)
    assert run.ctrl.cpu_level == 0 and len(run.ctrl.buffer) == 9
    feed(run, [0.5])  # 10-s average 0.5: first decision goes up by floor(8 * 0.5) = 4
    assert run.ctrl.cpu_level == 4 and run.ctrl.prev_loss == pytest.approx(0.3)
    feed(run, [0.5] * 10)  # loss unchanged: same direction
    assert run.ctrl.cpu_level == 8
    feed(run, [0.2] * 10)  # loss 0 (improved): keep going, single step under 25% slack
    assert run.ctrl.cpu_level == 9
    assert len(run.ctrl.buffer) == 10  # a ring buffer of 10 slacks


def test_basic_reverses_direction_when_the_loss_grows():
    run = basic_run()
    feed(run, [0.5] * 20)
    assert run.ctrl.cpu_level == 8
    feed(run, [0.6] * 10)  # |0.6 - 0.2| > |0.5 - 0.2|: reverse, step floor(4.8) = 4
    assert run.ctrl.direction == -1 and run.ctrl.cpu_level == 4
    feed(run, [0.24] * 10)  # loss 0.04 improved: keep going down, one step (24% < 25%)
    assert run.ctrl.cpu_level == 3


def test_basic_violation_throttles_to_zero_then_restores_half_after_recovery():
    run = basic_run()
    feed(run, [0.5] * 20)
    assert run.ctrl.cpu_level == 8
    feed(run, [-0.2])  # 3-s average (0.5 + 0.5 - 0.2) / 3 = 0.27: not yet
    assert run.ctrl.cpu_level == 8 and not run.ctrl.recovery
    feed(run, [-0.2])  # (0.5 - 0.2 - 0.2) / 3 = 0.033 < 5%: violation
    assert run.ctrl.recovery and run.ctrl.cpu_level == 0 and run.ctrl.restore_level == 4
    assert run.be_cores == pytest.approx(0.01)
    feed(run, [0.25] * 10)  # 10-s average 0.25 < 30%: keep recovering at level 0
    assert run.ctrl.recovery and run.ctrl.cpu_level == 0
    feed(run, [0.35] * 9)
    assert run.ctrl.cpu_level == 0
    feed(run, [0.35])  # 10-s average 0.35 >= 30%: restore half the old level
    assert not run.ctrl.recovery and run.ctrl.cpu_level == 4 and run.be_cores == pytest.approx(1.8)


# ---- configuration ------------------------------------------------------------------------------------
def test_yaml_builds_every_spec_with_the_thesis_constants():
    cfgs = load_configs()
    assert cfgs.levels == LevelMap(
        max_level=20, min_quota_cores=0.01, llc_min_ways=2, llc_lc_min_ways=2, cpu_mode="quota"
    )
    assert (cfgs.prm.cpu_cycle_s, cfgs.prm.cpu_quiet_cycles) == (2.0, 7)
    assert (cfgs.prm.llc_cycle_s, cfgs.prm.llc_quiet_cycles) == (20.0, 6)
    assert cfgs.prm.cat and not cfgs.prm_nocat.cat
    assert cfgs.qprm_step.up_after_samples == 3
    assert cfgs.qprm_prop.quota_exp_base is None and cfgs.qprm_prop2.quota_exp_base == 2.0
    assert cfgs.qprm_basic == BasicConfig()
    kinds = {s: type(build_controller(s)).__name__ for s in SPECS}
    assert kinds == {
        "prm": "NaiveController",
        "prm-nocat": "NaiveController",
        "qprm-step": "StepController",
        "qprm-prop": "ProportionalController",
        "qprm-prop2": "ProportionalController",
        "qprm-basic": "BasicController",
    }
    assert all(build_controller(s).name == s for s in SPECS)


def test_unknown_yaml_key_and_unknown_spec_are_config_errors(tmp_path):
    text = DEFAULT_CONFIG.read_text()
    bad = tmp_path / "prm.yaml"
    bad.write_text(text.replace("  up_after_samples: 3    # +1", "  up_after_sample: 3    # +1"))
    with pytest.raises(ConfigError, match="up_after_sample"):
        load_configs(bad)
    with pytest.raises(ConfigError, match="unknown PRM controller"):
        build_controller("qprm-pid")


def test_registry_factories_profile_the_prm_in_simulation_only():

    from baselines import prm
    from env.sim.node import SimNode
    from env.sim.scenario import simple_scenario

    scn = simple_scenario({"memcached": 0.4}, duration_s=60, warmup_s=10, seed=0)
    node = SimNode(scn, seed=0)
    sim_ctx = ControllerContext(node.capabilities(), scn, node, 0)
    real_ctx = ControllerContext(node.capabilities())
    t0 = node.time_s
    profiled = prm.make("prm", sim_ctx)
    assert node.time_s == t0  # the profiling run used a fresh SimNode, not the node under evaluation
    p = profiled.config.profile
    assert p.lc_max_util_cores is not None and 0 < p.lc_max_util_cores <= node.capabilities().cores
    assert p.llc_bins and all(b.cpu_us_per_req > 0 and b.mem_kb_per_req > 0 for b in p.llc_bins)
    assert prm.make("prm-nocat", real_ctx).config.profile == PrmProfile()  # a real node: the YAML profile
    made = [prm.make(s, real_ctx) for s in ("qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic")]
    assert [c.name for c in made] == ["qprm-step", "qprm-prop", "qprm-prop2", "qprm-basic"]


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
        if lay.quota:  # the shipped configuration: BE under a CFS quota in the LC app's cpuset
            assert a["be_parties"].core_group == a["memcached"].core_group
            assert a["memcached"].cores == a["be_parties"].cores == pytest.approx(pool)
            top = ctrl.cpu_level >= lay.levels.max_level
            assert a["be_parties"].cpu_quota == pytest.approx(0.0 if top else lay.be_cores(ctrl.cpu_level))
        else:
            assert a["memcached"].cores + a["be_parties"].cores == pytest.approx(pool)
            assert a["be_parties"].cores == pytest.approx(lay.be_cores(ctrl.cpu_level))
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
        assert all(slacks[i] < 0 for i in downs)  # only a violating sample lowers the level


def _sim_cpu_levels(spec: str, memcached_load: float) -> list[tuple[int, int, float]]:
    """60 s of 500 ms ticks on the simulator: per tick, (level before, level after, slack of the
    controller's latest sample)."""
    node, ctrl = _simnode(spec, memcached_load)
    obs, rows = node.observe(), []
    for _ in range(120):
        before = ctrl.cpu_level
        d = ctrl.decide(obs)
        rows.append((before, ctrl.cpu_level, ctrl.last_slack))
        obs = node.step(d.allocation)
    return rows


@pytest.mark.parametrize("spec", ["qprm-step", "qprm-prop2"])
def test_qprm_throttles_the_be_job_at_each_violating_sample_on_the_simulator(spec):
    """Q-PRM thesis Sec. 4.2.2: a sample whose p99 is over the target lowers the BE job's CPU level at once.
    At 70% memcached load the BE job's growth makes memcached miss; the controller must throttle
    at every new violating sample and so keep the BE job lower than at 20% load."""
    heavy, light = _sim_cpu_levels(spec, 0.7), _sim_cpu_levels(spec, 0.2)
    new_samples = [i for i in range(1, len(heavy)) if heavy[i][2] != heavy[i - 1][2]]
    violating = [i for i in new_samples if heavy[i][2] < 0]
    assert len(violating) >= 3, "the scenario no longer makes memcached miss: pick a heavier load"
    assert all(heavy[i][1] < heavy[i][0] for i in violating)
    assert max(r[1] for r in heavy) < max(r[1] for r in light)
