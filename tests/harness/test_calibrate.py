"""harness.calibrate: the facts about what the node holds, beside PARTIES' cells (PARTIES Sec. 5.2.1)."""

from __future__ import annotations

from harness.calibrate import FIG5_HIGH_PCT, FIG5_TYPICAL_LOADS_PCT, oracle_admits


def test_the_node_holds_a_typical_pair_and_not_two_apps_at_their_max_loads():
    """Fig. 5's most favourable typical point (the co-runner at 40%, the app at 80%) is one the node
    holds for xapian beside nginx; memcached and nginx both at their max loads it cannot hold (each
    alone needs most of the node's cores at its knee), and the Oracle says so rather than viable."""
    typical = oracle_admits(("xapian", "nginx", min(FIG5_TYPICAL_LOADS_PCT), FIG5_HIGH_PCT, "cold"))
    assert typical["viable"] and typical["verdict"] == "viable"
    assert typical["best_p_all"] > 0.99
    both_max = oracle_admits(("memcached", "nginx", 100.0, 100.0, "cold"))
    assert not both_max["viable"] and both_max["verdict"] == "infeasible"
    assert both_max["best_p_all"] < 0.01


def _tick(p99: dict[str, float], cores: dict[str, float], reason: str = "", app: str | None = None):
    from env.loop import AppTick, TickRecord
    from env.types import AppAlloc

    apps = tuple(AppTick(n, v, 1000.0, 0.1, 100.0, 100.0, 0.0) for n, v in p99.items())
    alloc = tuple(AppAlloc(n, c, i, 2, i, 2200, 10.0, 20.0, 1.0) for i, (n, c) in enumerate(cores.items()))
    return TickRecord(0.5, 0.5, apps, alloc, (), 0.0, 0.0, True, None, app, reason, bool(reason), 0.1)


def test_victim_impact_counts_lc_victims_with_slack_hurt_by_an_upsize():
    """Sec. 4.2.4: each upsize that takes a unit from an LC app with slack > 0.2 counts once; it is
    hurt when that app's slack is below 0.05 the next interval. The upsized app, the BE job and an
    app that lost nothing do not count, nor does a victim that had little slack to begin with."""
    from harness.calibrate import victim_impact

    cores = {"xapian": 2.0, "moses": 2.0, "memcached": 2.0, "be": 1.0}
    recs = [
        # moses upsized: a core from xapian (slack 0.4), and a core from the BE job
        _tick({"xapian": 600, "moses": 1100, "memcached": 500}, cores, "upsize moses (slack -0.1)", "moses"),
        # xapian collapses; memcached (slack 0.9) then loses a core to xapian and stays fine
        _tick(
            {"xapian": 4300, "moses": 700, "memcached": 100},
            {**cores, "xapian": 1.0, "moses": 3.0, "be": 0.0},
            "upsize xapian (slack -3.3)",
            "xapian",
        ),
        # moses (slack 0.1 before) loses a core to xapian's next upsize: not counted
        _tick(
            {"xapian": 600, "moses": 900, "memcached": 300},
            {**cores, "xapian": 2.0, "moses": 3.0, "memcached": 1.0, "be": 0.0},
            "upsize xapian (slack -0.01)",
            "xapian",
        ),
        _tick(
            {"xapian": 500, "moses": 2000, "memcached": 300},
            {**cores, "xapian": 3.0, "moses": 2.0, "memcached": 1.0, "be": 0.0},
        ),
    ]
    assert victim_impact(recs) == (2, 1)


def test_a_scenario_run_names_the_apps_that_miss_its_window():
    """Fig. 6's runs say which apps miss the window: PARTIES on mix6-const (seed 0) misses it, and
    exactly the apps over their targets are named; the static fair start on mix3-const meets it and
    names none."""
    from harness.calibrate import _scenario_runs

    miss = _scenario_runs(("parties", "mix6-const", 0))
    assert not miss["window_sustained"] and miss["window_missed_by"]
    assert set(miss["window_missed_by"]) <= {"memcached", "xapian", "nginx", "moses", "sphinx", "mongodb"}
    met = _scenario_runs(("static", "mix3-const", 0))
    assert met["window_sustained"] and met["window_missed_by"] == []
