"""Load traces, scenarios, platforms and profiles: shapes, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from env.config import ConfigError
from env.sim.platform import load_platform
from env.sim.profiles import LcProfile, load_profile
from env.sim.scenario import load_scenario, parse_scenario
from env.sim.traces import parse_trace, read_trace_csv

RNG = np.random.default_rng(0)


def values(spec, t):
    return parse_trace(spec, "test").build(np.random.default_rng(1)).values(np.asarray(t, dtype=float))


def test_constant_step_and_ramp_traces():
    assert values(0.4, [0, 10, 1000]).tolist() == [0.4, 0.4, 0.4]  # a bare number is constant
    step = {"kind": "step", "steps": [[0, 0.1], [10, 0.6], [20, 0.2]]}
    assert values(step, [0, 9.9, 10, 15, 20, 99]).tolist() == [0.1, 0.1, 0.6, 0.6, 0.2, 0.2]
    ramp = {
        "kind": "ramp",
        "points": [[0, 0.1], [25, 0.1], [55, 0.6], [115, 0.6], [145, 0.1]],
    }  # PARTIES Fig. 9
    v = values(ramp, [0, 25, 40, 55, 100, 130, 145, 500])
    assert v == pytest.approx([0.1, 0.1, 0.35, 0.6, 0.6, 0.35, 0.1, 0.1])


def test_sinusoid_diurnal_and_bursty_traces():
    t = np.linspace(0, 600, 6001)
    sin = values({"kind": "sinusoid", "low": 0.76, "high": 1.0, "period_s": 600, "phase_s": 450}, t)
    assert sin.min() == pytest.approx(0.76, abs=1e-4) and sin.max() == pytest.approx(1.0, abs=1e-4)
    assert sin[0] == pytest.approx(0.76, abs=1e-3) and sin[3000] == pytest.approx(
        1.0, abs=1e-3
    )  # Q-PRM Fig. 6.2
    day = values(
        {"kind": "diurnal", "low": 0.2, "high": 0.9, "period_s": 86400}, np.linspace(0, 86400, 10001)
    )
    assert day.min() == pytest.approx(0.2, abs=1e-3) and day.max() == pytest.approx(0.9, abs=1e-3)
    burst = values({"kind": "bursty", "base": 0.3, "burst": 0.9, "mean_gap_s": 30, "mean_burst_s": 5}, t)
    assert (
        set(np.round(burst[burst > 0.31], 6))
        and burst.min() == pytest.approx(0.3)
        and burst.max() == pytest.approx(0.9)
    )
    # the bursts are drawn from the injected generator: same seed, same bursts
    assert np.array_equal(
        burst, values({"kind": "bursty", "base": 0.3, "burst": 0.9, "mean_gap_s": 30, "mean_burst_s": 5}, t)
    )


def test_csv_replay_interpolates_and_bad_rows_name_the_line(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("t_s,load\n0,0.2\n10,0.4\n")
    assert values({"kind": "csv", "path": str(good)}, [0, 5, 10, 20]).tolist() == pytest.approx(
        [0.2, 0.3, 0.4, 0.4]
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,load\n0,0.2\n5,oops\n")
    with pytest.raises(ConfigError, match=r"bad.csv:3"):
        read_trace_csv(bad)
    back = tmp_path / "back.csv"
    back.write_text("0,0.2\n10,0.3\n5,0.4\n")
    with pytest.raises(ConfigError, match="backwards"):
        read_trace_csv(back)
    with pytest.raises(ConfigError, match="no such file"):
        read_trace_csv(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"kind": "wave", "load": 1}, "unknown trace kind"),
        ({"kind": "constant", "lod": 0.5}, "did you mean 'load'"),
        ({"kind": "constant", "load": -1}, "fraction of max load"),
        ({"kind": "sinusoid", "low": 0.1, "high": 0.5, "period_s": 0}, "period_s"),
        ({"load": 0.5}, "kind"),
    ],
)
def test_bad_traces_are_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        values(spec, [0])


def test_shipped_scenarios_platforms_and_profiles_load():
    for name in ("fig9-ramp", "mix3-const", "mix6-const", "qprm-sinusoid", "step-load"):
        assert load_scenario(name).apps
    for name in ("parties", "coco", "qprm"):
        p = load_platform(name)
        caps = p.capabilities()
        assert caps.freq_levels_mhz[-1] > caps.nominal_freq_mhz and caps.llc_ways == p.llc.ways
    for app in ("memcached", "xapian", "nginx", "moses", "mongodb", "sphinx", "memcached_qprm"):
        assert isinstance(load_profile(app), LcProfile)


def _scenario(**changes):
    data = {"name": "t", "apps": [{"app": "memcached", "load": 0.5}], "be": ["be_parties"]}
    data.update(changes)
    return parse_scenario(yaml.safe_load(yaml.safe_dump(data)), "t.yaml")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"aps": []}, "did you mean 'apps'"),
        ({"apps": [{"app": "redis", "load": 0.5}]}, "unknown app 'redis'"),
        ({"apps": [{"app": "be_parties"}], "be": []}, "batch job"),
        ({"apps": [{"app": "xapian"}], "be": ["memcached"]}, "LC app"),
        ({"platform": "skylake"}, "unknown node 'skylake'"),
        ({"duration_s": 10, "warmup_s": 20}, "duration_s > warmup_s"),
        ({"apps": [{"app": "memcached"}, {"app": "memcached"}]}, "duplicate"),
        ({"apps": [{"app": "memcached", "overrides": {"qos_target_us": 1}}]}, "not allowed"),
        ({"apps": [{"app": "memcached", "perturb": {"service": 50}}]}, r"\[0.1, 10\]"),
    ],
)
def test_bad_scenarios_name_the_field(changes, match):
    with pytest.raises(ConfigError, match=match):
        _scenario(**changes)


def test_profiles_and_platforms_are_strict(tmp_path):
    from env.sim.profiles import _parse

    data = yaml.safe_load((load_profile.__globals__["CONFIGS"] / "apps" / "xapian.yaml").read_text())
    data["servce_us"] = 3
    with pytest.raises(ConfigError, match="servce_us"):
        _parse(data, "xapian.yaml")
    data = yaml.safe_load((load_profile.__globals__["CONFIGS"] / "apps" / "xapian.yaml").read_text())
    data["frac_llc"], data["frac_mem"] = 0.5, 0.6  # no core share left
    with pytest.raises(ConfigError, match="frac_llc \\+ frac_mem"):
        _parse(data, "xapian.yaml")
    bad = tmp_path / "node.yaml"
    plat = yaml.safe_load((load_profile.__globals__["CONFIGS"] / "node" / "parties.yaml").read_text())
    plat["freq"]["turbo_mhz"] = 1000
    bad.write_text(yaml.safe_dump(plat))
    with pytest.raises(ConfigError, match="turbo_mhz"):
        load_platform(bad)
