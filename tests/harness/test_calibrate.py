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
