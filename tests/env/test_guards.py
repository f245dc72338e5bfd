"""env.guards: each guard changes exactly what it promises and says so (DESIGN §3)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from env.allocations import fair_allocation
from env.config import ConfigError
from env.guards import (
    BeDvfsConfig,
    BeDvfsGuard,
    ClampGuard,
    CooldownConfig,
    CooldownGuard,
    EmergencyConfig,
    EmergencyGuard,
    GuardChain,
    GuardsConfig,
    LcFloorConfig,
    LcFloorGuard,
    RateLimitConfig,
    RateLimitGuard,
    be_frequency_step,
    build_guards,
    clamp_only,
)
from env.sim.node import SimNode
from env.sim.scenario import simple_scenario
from env.types import AllocationError, Decision, Move, validate_allocation


@pytest.fixture(scope="module")
def base():
    node = SimNode(simple_scenario({"memcached": 0.2, "xapian": 0.2, "nginx": 0.2}), seed=0)
    return node.observe(), node.capabilities()


def with_p99(obs, t_s=None, **tard):
    apps = tuple(dataclasses.replace(s, p99_us=s.target_us * tard.get(s.name, 0.5)) for s in obs.apps)
    return dataclasses.replace(obs, apps=apps, time_s=obs.time_s if t_s is None else t_s)


def move(alloc, app, res_field, delta, to="be_parties"):
    """Move `delta` of a pooled field from `to` to `app` (negative: the other way)."""
    a = alloc.replace_app(app, **{res_field: getattr(alloc[app], res_field) + delta})
    return a.replace_app(to, **{res_field: getattr(alloc[to], res_field) - delta})


# ---- clamp -------------------------------------------------------------------------------------------
def test_clamp_passes_a_valid_target_untouched(base):
    obs, caps = base
    target = move(obs.allocation, "memcached", "cores", 1.0)
    d, note = ClampGuard().check(Decision(target, "up"), obs, caps)
    assert d.allocation is target and note == ""


def test_clamp_repairs_out_of_range_fields_and_reports_them(base):
    obs, caps = base
    a = obs.allocation
    bad = a.replace_app("memcached", cores=40.0, freq_mhz=2249, llc_ways=50).replace_app(
        "nginx", memory_gb=math.nan
    )
    with pytest.raises(AllocationError):
        validate_allocation(bad, caps)
    d, note = ClampGuard().check(Decision(bad, "greedy"), obs, caps)
    validate_allocation(d.allocation, caps)
    fixed = d.allocation
    assert fixed["memcached"].freq_mhz == 2200  # nearest real level
    assert fixed["nginx"].memory_gb == a["nginx"].memory_gb  # NaN falls back to the current value
    # over-subscribed cores and ways are taken back from BE first, then from the largest holder
    assert fixed["be_parties"].cores == 0.0
    assert sum(fixed.groups().values()) <= caps.cores
    assert sum(w for w, _ in fixed.closes().values()) <= caps.llc_ways
    assert fixed["xapian"].cores == a["xapian"].cores and fixed["xapian"].llc_ways == a["xapian"].llc_ways
    assert "memcached.cores" in note and "memcached.freq_mhz 2249->2200" in note


def test_clamp_fills_in_missing_apps_from_the_current_allocation(base):
    obs, caps = base
    a = obs.allocation
    partial = type(a).of([a["memcached"], a["xapian"], a["nginx"]], caps)  # no BE entry
    d, _ = ClampGuard().check(Decision(partial), obs, caps)
    assert d.allocation["be_parties"] == a["be_parties"]


def test_chain_holds_what_no_guard_can_repair(base):
    obs, caps = base
    bad = obs.allocation.replace_app("memcached", cores=99.0)
    d, notes = GuardChain([]).apply(Decision(bad, "x", move=Move.UP_CORE, app="memcached"), obs, caps)
    assert d.allocation is None and len(notes) == 1 and "chain: invalid allocation held" in notes[0]
    assert notes[0] in d.reason and d.reason.startswith("x")
    # and the clamp chain repairs the same target instead
    d, notes = clamp_only().apply(Decision(bad), obs, caps)
    assert d.allocation is not None and notes and notes[0].startswith("clamp:")


# ---- LC floor ----------------------------------------------------------------------------------------
def test_lc_floor_raises_lc_apps_from_be(base):
    obs, caps = base
    a = obs.allocation
    low = move(a, "nginx", "cores", -(a["nginx"].cores - 1.0))  # nginx down to 1 core, BE got them
    low = move(low, "nginx", "llc_ways", -(a["nginx"].llc_ways - 1))
    g = LcFloorGuard(LcFloorConfig(min_cores=2.0, min_llc_ways=2, min_freq_mhz=2000))
    d, note = g.check(Decision(low), obs, caps)
    out = d.allocation
    validate_allocation(out, caps)
    assert out["nginx"].cores == 2.0 and out["nginx"].llc_ways == 2
    assert out["be_parties"].cores == low["be_parties"].cores - 1.0
    assert all(out[n].freq_mhz >= 2000 for n in ("memcached", "xapian", "nginx"))
    assert "nginx.cores 1->2" in note
    # nothing to do: no change, no note
    d2, note2 = g.check(Decision(a), obs, caps)
    assert d2.allocation is a and note2 == ""


def test_lc_floor_never_takes_from_another_lc_app(base):
    obs, caps = base
    a = obs.allocation
    starved = move(a, "nginx", "cores", -(a["nginx"].cores - 1.0), to="memcached")
    starved = starved.replace_app("be_parties", cores=0.0)
    starved = starved.replace_app("memcached", cores=caps.cores - starved["xapian"].cores - 1.0)
    assert starved.idle_cores == 0
    d, _ = LcFloorGuard(LcFloorConfig(min_cores=2.0)).check(Decision(starved), obs, caps)
    assert d.allocation["memcached"].cores == starved["memcached"].cores
    assert d.allocation["nginx"].cores == 1.0


# ---- rate limit --------------------------------------------------------------------------------------
def test_rate_limit_caps_lc_losses_per_tick_and_keeps_totals(base):
    obs, caps = base
    a = obs.allocation
    # memcached gives 3 cores to xapian and drops 4 frequency levels
    target = move(a, "xapian", "cores", 3.0, to="memcached").replace_app("memcached", freq_mhz=1800)
    g = RateLimitGuard(RateLimitConfig(max_core_decrease=1.0, max_freq_level_decrease=2))
    d, note = g.check(Decision(target), obs, caps)
    out = d.allocation
    validate_allocation(out, caps)
    assert out["memcached"].cores == a["memcached"].cores - 1.0
    assert out["xapian"].cores == a["xapian"].cores + 1.0  # the gain shrinks with the donor's loss
    assert out["memcached"].freq_mhz == 2000
    assert "memcached.cores" in note
    # a budget that is not a whole number of cores rounds down to whole cores
    d, _ = RateLimitGuard(RateLimitConfig(max_core_decrease=1.5)).check(Decision(target), obs, caps)
    validate_allocation(d.allocation, caps)
    assert d.allocation["memcached"].cores == a["memcached"].cores - 1.0


def test_rate_limit_never_limits_lc_upsizes_from_be(base):
    obs, caps = base
    target = move(obs.allocation, "memcached", "cores", 2.0)  # BE loses 2: the safe direction
    d, note = RateLimitGuard(RateLimitConfig(max_core_decrease=1.0)).check(Decision(target), obs, caps)
    assert d.allocation == target and note == ""


def test_rate_limit_holds_a_regrouping(base):
    obs, caps = base
    regroup = obs.allocation.replace_app("nginx", core_group=9)
    d, note = RateLimitGuard(RateLimitConfig()).check(Decision(regroup), obs, caps)
    assert d.allocation is None and "held" in note


# ---- cooldown ----------------------------------------------------------------------------------------
def test_cooldown_blocks_reductions_after_a_violation_until_it_expires(base):
    obs, caps = base
    g = CooldownGuard(CooldownConfig(after_violation_s=5.0, between_downsizes_s=0.0))
    g.reset(caps)
    t0 = obs.time_s
    g.check(Decision.hold(), with_p99(obs, t0, nginx=1.3), caps)  # nginx misses its target
    shrink = move(obs.allocation, "nginx", "cores", -1.0)
    d, note = g.check(Decision(shrink), with_p99(obs, t0 + 2.0), caps)
    assert d.allocation["nginx"].cores == obs.allocation["nginx"].cores and "nginx" in note
    validate_allocation(d.allocation, caps)
    # another app may still be reduced
    other = move(obs.allocation, "memcached", "cores", -1.0)
    d, note = g.check(Decision(other), with_p99(obs, t0 + 2.5), caps)
    assert d.allocation == other and note == ""
    d, note = g.check(Decision(shrink), with_p99(obs, t0 + 5.5), caps)
    assert d.allocation == shrink and note == ""


def test_cooldown_spaces_reductions_of_one_app(base):
    obs, caps = base
    g = CooldownGuard(CooldownConfig(after_violation_s=0.0, between_downsizes_s=2.0))
    g.reset(caps)
    t0 = obs.time_s
    g.check(Decision.hold(), with_p99(obs, t0), caps)
    reduced = move(obs.allocation, "nginx", "cores", -1.0)
    obs1 = dataclasses.replace(with_p99(obs, t0 + 0.5), allocation=reduced)  # the node applied it
    again = move(reduced, "nginx", "cores", -1.0)
    d, note = g.check(Decision(again), obs1, caps)
    assert d.allocation["nginx"].cores == reduced["nginx"].cores and note
    obs2 = dataclasses.replace(with_p99(obs, t0 + 2.5), allocation=reduced)
    d, note = g.check(Decision(again), obs2, caps)
    assert d.allocation == again and note == ""


# ---- emergency ---------------------------------------------------------------------------------------
def test_emergency_pauses_be_for_the_violators_and_protects_them_from_reductions(base):
    obs, caps = base
    a = obs.allocation
    g = EmergencyGuard(EmergencyConfig(trigger_tardiness=2.0, trigger_ticks=2, recover_ticks=3))
    g.reset(caps)
    t = obs.time_s
    d, note = g.check(Decision.hold(), with_p99(obs, t, xapian=3.0), caps)
    assert d.allocation is None and note == ""  # one tick is not enough
    d, note = g.check(Decision.hold(), with_p99(obs, t + 0.5, xapian=3.0), caps)
    out = d.allocation
    validate_allocation(out, caps)
    assert out["be_parties"].cores == 0.0 and out["be_parties"].llc_ways == caps.min_llc_ways
    assert out["xapian"].cores == a["xapian"].cores + a["be_parties"].cores
    assert out["xapian"].llc_ways == a["xapian"].llc_ways + a["be_parties"].llc_ways - caps.min_llc_ways
    assert out["xapian"].freq_mhz == caps.freq_levels_mhz[-1]
    assert out["memcached"] == a["memcached"] and "BE paused" in note
    # while active, an app still missing its target cannot be shrunk...
    em = dataclasses.replace(with_p99(obs, t + 1.0, xapian=1.5), allocation=out)
    shrink_violator = move(out, "xapian", "cores", -1.0)
    d, note = g.check(Decision(shrink_violator), em, caps)
    assert d.allocation["xapian"].cores == out["xapian"].cores and "violating" in note
    # ...but a healthy LC app may still give it a core (PARTIES' remedy, Sec. 4.2.4)
    give = out.replace_app("memcached", cores=out["memcached"].cores - 1).replace_app(
        "xapian", cores=out["xapian"].cores + 1
    )
    d, note = g.check(Decision(give), dataclasses.replace(em, time_s=t + 1.5), caps)
    assert d.allocation == give and note == ""
    # recovery after recover_ticks met intervals
    shrink = move(out, "memcached", "cores", -1.0)
    met = dataclasses.replace(with_p99(obs, t + 2.0), allocation=out)
    for k in range(3):
        d, note = g.check(Decision(shrink), dataclasses.replace(met, time_s=t + 2.0 + 0.5 * k), caps)
    assert note == "recovered" and d.allocation == shrink


# ---- config ------------------------------------------------------------------------------------------
def test_guards_config_is_strict_and_builds_the_documented_order():
    assert build_guards(GuardsConfig()).names == ("clamp",)
    cfg = GuardsConfig.from_dict({"rate_limit": {"max_core_decrease": 2}, "lc_floor": {}, "emergency": {}})
    assert cfg.rate_limit == RateLimitConfig(max_core_decrease=2.0)
    assert build_guards(cfg).names == ("clamp", "emergency", "rate_limit", "lc_floor")
    dvfs = GuardsConfig.from_dict({"be_dvfs": {"cycle_s": 4}, "emergency": {}})
    assert dvfs.be_dvfs == BeDvfsConfig(cycle_s=4.0)
    assert build_guards(dvfs).names == ("clamp", "be_dvfs", "emergency")
    assert GuardsConfig.from_dict(dvfs.to_dict()) == dvfs
    for bad in ({"tdp_frac": 1.2}, {"tdp_frac": 0}, {"cycle_s": 0}, {"cycle": 2}):
        with pytest.raises(ConfigError):
            GuardsConfig.from_dict({"be_dvfs": bad})
    assert build_guards(GuardsConfig.serving()).names == (
        "clamp",
        "emergency",
        "cooldown",
        "rate_limit",
        "lc_floor",
    )
    with pytest.raises(ConfigError, match=r"rate_limt.*did you mean 'rate_limit'"):
        GuardsConfig.from_dict({"rate_limt": {}})
    with pytest.raises(ConfigError, match="max_core_decrease"):
        GuardsConfig.from_dict({"rate_limit": {"max_core_decrease": "lots"}})


def test_full_chain_keeps_fair_start_valid_under_a_reckless_controller(base):
    """A controller that strips every LC app to one core, one way and the lowest frequency: the
    serving chain turns it into a valid, limited step."""
    obs, caps = base
    a = fair_allocation(caps)
    obs = dataclasses.replace(with_p99(obs), allocation=a)
    reckless = a
    for n in ("memcached", "xapian", "nginx"):
        reckless = move(reckless, n, "cores", -(a[n].cores - 1.0))
        reckless = move(reckless, n, "llc_ways", -(a[n].llc_ways - 1))
        reckless = reckless.replace_app(n, freq_mhz=caps.freq_levels_mhz[0])
    chain = build_guards(GuardsConfig.serving())
    chain.reset(caps)
    d, notes = chain.apply(Decision(reckless, "reckless"), obs, caps)
    validate_allocation(d.allocation, caps)
    for n in ("memcached", "xapian", "nginx"):
        assert d.allocation[n].cores == a[n].cores - 1.0
        assert d.allocation[n].llc_ways == a[n].llc_ways - 1
    assert any(x.startswith("rate_limit:") for x in notes)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"lc_floor": {"min_cores": -5}}, "lc_floor.min_cores"),
        ({"lc_floor": {"min_llc_ways": 1000}}, "lc_floor.min_llc_ways"),
        ({"lc_floor": {"min_freq_mhz": 0}}, "lc_floor.min_freq_mhz"),
        ({"rate_limit": {"max_core_decrease": -1}}, "rate_limit.max_core_decrease"),
        ({"cooldown": {"after_violation_s": -1}}, "cooldown.after_violation_s"),
        ({"emergency": {"trigger_tardiness": 0.5}}, "emergency.trigger_tardiness"),
        ({"emergency": {"trigger_ticks": 0}}, "emergency.trigger_ticks"),
        ({"emergency": {"recover_ticks": -3}}, "emergency.recover_ticks"),
        ({"cooldown": {"between_downsizes_s": float("nan")}}, "expected a finite number"),
    ],
)
def test_guard_settings_out_of_range_are_config_errors(data, match):
    with pytest.raises(ConfigError, match=match):
        GuardsConfig.from_dict(data)
    assert GuardsConfig.from_dict({"lc_floor": {"min_cores": 0.5, "min_llc_ways": 1}}).lc_floor is not None


# ---- BE frequency under the power budget (Heracles Alg. 3) -------------------------------------------
LEVELS = (1200, 1300, 2200, 3600)


@pytest.mark.parametrize(
    "freq, power_w, short, expected",
    [
        (2200, 100.0, False, 3600),  # headroom, LC at its guarantee: up a level
        (3600, 100.0, False, 3600),  # already at the top
        (3600, 140.0, True, 2200),  # over budget, LC short of its guarantee: down a level
        (1200, 140.0, True, 1200),  # already at the bottom
        (2200, 140.0, False, 2200),  # over budget but the LC cores keep their frequency: hold
        (2200, 100.0, True, 2200),  # headroom but the LC cores are short: hold
        (3000, 140.0, True, 2200),  # off the levels counts as the top
    ],
)
def test_alg3_step(freq, power_w, short, expected):
    assert be_frequency_step(LEVELS, freq, power_w, 130.0, short) == expected


def _at(obs, t_s, power_w, lc_mhz=None):
    apps = obs.apps
    if lc_mhz is not None:
        apps = tuple(
            dataclasses.replace(s, usage=dataclasses.replace(s.usage, freq_mhz=lc_mhz)) for s in apps
        )
    return dataclasses.replace(obs, time_s=t_s, power_w=power_w, apps=apps)


def test_be_dvfs_raises_the_be_frequency_once_a_cycle_and_leaves_the_lc_decision(base):
    obs, caps = base
    levels = caps.freq_levels_mhz
    low = levels[levels.index(caps.nominal_freq_mhz) - 1]  # start a level under nominal: two ups to make
    obs = dataclasses.replace(obs, allocation=obs.allocation.replace_app("be_parties", freq_mhz=low))
    g = BeDvfsGuard(BeDvfsConfig(cycle_s=2.0))
    g.reset(caps)
    lc_move = move(obs.allocation, "memcached", "cores", 1.0)
    cool = 0.5 * caps.tdp_w
    seen = []
    for k in range(9):  # 0.5 s intervals from t = 1 s: cycles due at 3 s and 5 s
        d, note = g.check(Decision(lc_move, "up"), _at(obs, 1.0 + 0.5 * k, cool), caps)
        assert d.allocation.replace_app("be_parties", freq_mhz=low) == lc_move  # LC as decided
        seen.append((d.allocation["be_parties"].freq_mhz, bool(note)))
    up, up2 = levels[levels.index(low) + 1], levels[levels.index(low) + 2]
    assert seen == [(low, False)] * 4 + [(up, True)] + [(up, False)] * 3 + [(up2, True)]
    # a HOLD becomes an allocation that changes the BE frequency alone
    d, _ = g.check(Decision.hold("hold"), _at(obs, 5.5, cool), caps)
    assert d.allocation == obs.allocation.replace_app("be_parties", freq_mhz=up2)


def test_be_dvfs_lowers_it_over_budget_only_while_the_lc_apps_run_short(base):
    obs, caps = base
    nominal = caps.nominal_freq_mhz
    hot = 1.2 * caps.tdp_w
    for lc_mhz, expected in (
        (nominal - 300.0, caps.freq_levels_mhz[caps.freq_levels_mhz.index(nominal) - 1]),
        (nominal, nominal),
    ):
        g = BeDvfsGuard(BeDvfsConfig(cycle_s=1.0))
        g.reset(caps)
        for k in range(3):
            d, _ = g.check(Decision.hold("hold"), _at(obs, 1.0 + 0.5 * k, hot, lc_mhz), caps)
        assert g.be_freq_mhz == expected
        assert (d.allocation or obs.allocation)["be_parties"].freq_mhz == expected


@pytest.mark.parametrize("change", [{"tdp_w": math.nan}, {"be_apps": ()}])
def test_be_dvfs_changes_nothing_without_rapl_or_be_jobs(base, change):
    obs, caps = base
    if "be_apps" in change:
        caps = dataclasses.replace(caps, apps=tuple(a for a in caps.apps if a.is_lc))
    else:
        caps = dataclasses.replace(caps, **change)
    g = BeDvfsGuard(BeDvfsConfig(cycle_s=0.5))
    g.reset(caps)
    for k in range(6):
        d, note = g.check(Decision.hold("hold"), _at(obs, 1.0 + 0.5 * k, 10.0), caps)
        assert d.allocation is None and note == ""
