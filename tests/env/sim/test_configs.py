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


# ---- hostile or careless input: a ConfigError naming the field, never another exception ----------------
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"duration_s": NAN}, "duration_s: expected a finite number"),
        ({"duration_s": INF}, "duration_s: expected a finite number"),
        ({"warmup_s": NAN}, "warmup_s: expected a finite number"),
        ({"duration_s": 86_401}, "at most 86400 s"),
        ({"seed": -3}, "seed = -3"),
        ({"be": ["ant_cpu"]}, "antagonist, not a BE job"),
        ({"be": ["ant_hyperthread"]}, "antagonist, not a BE job"),
        ({"apps": [{"app": "memcached", "overrides": {"threads": NAN}}]}, "threads: expected a finite"),
        ({"apps": [{"app": "memcached", "overrides": {"dataset_gb": INF}}]}, "dataset_gb: expected a finite"),
        ({"apps": [{"app": "memcached", "overrides": {"threads": 1.5}}]}, "whole number of threads"),
        ({"apps": [{"app": "memcached", "load": NAN}]}, r"apps\[0\].load: load nan must be"),
        (
            {
                "apps": [
                    {
                        "app": "memcached",
                        "load": {"kind": "sinusoid", "low": 0.1, "high": 0.5, "period_s": NAN},
                    }
                ]
            },
            "period_s",
        ),
        (
            {
                "apps": [
                    {"app": "memcached", "load": {"kind": "diurnal", "low": 0.1, "high": 0.5, "phase_s": INF}}
                ]
            },
            "phase_s",
        ),
        (
            {"apps": [{"app": "memcached", "load": {"kind": "step", "steps": [[0, 0.2], [NAN, 0.5]]}}]},
            r"steps\[1\]\[0\]",
        ),
        (
            {
                "apps": [
                    {
                        "app": "memcached",
                        "load": {"kind": "bursty", "base": 0.1, "burst": 0.5, "horizon_s": 1e12},
                    }
                ]
            },
            "horizon_s",
        ),
        (
            {
                "apps": [
                    {
                        "app": "memcached",
                        "load": {
                            "kind": "bursty",
                            "base": 0.1,
                            "burst": 0.5,
                            "mean_gap_s": 1e-6,
                            "mean_burst_s": 1e-6,
                        },
                    }
                ]
            },
            "bursts expected",
        ),
        (
            {
                "apps": [
                    {"app": "memcached", "load": {"kind": "bursty", "base": 0.1, "burst": 0.5, "ramp_s": -1}}
                ]
            },
            "ramp_s",
        ),
        ({"apps": [{"app": "memcached", "load": {"kind": ["csv"]}}]}, "unknown trace kind"),
    ],
)
def test_hostile_scenarios_are_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        _scenario(**changes)


def test_binary_or_malformed_scenario_and_trace_files_are_config_errors(tmp_path):
    (tmp_path / "float.yaml").write_text("name: t\napps: 1.5\n")
    with pytest.raises(ConfigError, match="apps: expected a list"):
        load_scenario(tmp_path / "float.yaml")
    blob = bytes(range(256))
    (tmp_path / "scn.yaml").write_bytes(blob)
    with pytest.raises(ConfigError, match="not a text file"):
        load_scenario(tmp_path / "scn.yaml")
    (tmp_path / "t.csv").write_bytes(blob)
    with pytest.raises(ConfigError, match="not a text file"):
        read_trace_csv(tmp_path / "t.csv")
    (tmp_path / "nul.csv").write_bytes(b"0,0.1\n1,\x000.2\n")
    with pytest.raises(ConfigError, match=r"nul\.csv"):
        read_trace_csv(tmp_path / "nul.csv")
    with pytest.raises(ConfigError, match="time_scale"):
        values({"kind": "csv", "path": str(tmp_path / "t.csv"), "time_scale": -1}, [0])


def _write_variant(tmp_path, kind: str, name: str, change) -> str:
    data = yaml.safe_load((load_profile.__globals__["CONFIGS"] / kind / f"{name}.yaml").read_text())
    change(data)
    p = tmp_path / f"{name}-variant.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("memory", "bandwidth_gbps"), 0, "memory.bandwidth_gbps must be > 0"),
        (("disk", "seq_mbps"), -100, "disk.seq_mbps must be > 0"),
        (("network", "gbps"), 0, "network.gbps must be > 0"),
        (("llc", "bandwidth_gbps"), -1, "llc.bandwidth_gbps must be > 0"),
        (("freq", "step_mhz"), 0, "freq.step_mhz"),
        (("memory", "step_gb"), 0, "memory.step_gb"),
        (("disk", "step_mbps"), -10, "disk.step_mbps"),
        (("sched_wakeup_delay_ms",), 0, "sched_wakeup_delay_ms must be > 0"),
        (("cfs_resume_wait_ms",), -0.5, r"cfs_resume_wait_ms must be in \[0, 50\]"),
        (("cfs_resume_wait_ms",), 60.0, r"cfs_resume_wait_ms must be in \[0, 50\]"),
    ],
)
def test_platforms_with_zero_or_negative_bandwidths_and_steps_are_config_errors(tmp_path, path, value, match):
    def change(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    with pytest.raises(ConfigError, match=match):
        load_platform(_write_variant(tmp_path, "node", "parties", change))


def test_a_platform_too_small_for_the_apps_is_a_config_error_and_a_thin_link_still_runs(tmp_path):
    from env.sim.node import SimNode

    small = _write_variant(tmp_path, "node", "vm2", lambda d: d["memory"].update(gb=0.5))
    with pytest.raises(ConfigError, match="do not fit on platform"):
        _scenario(platform=small, apps=[{"app": "memcached"}, {"app": "xapian"}])
    # the fair start leaves memcached no network bandwidth: the simulator serves ~nothing, it does not divide by 0
    thin = _write_variant(tmp_path, "node", "qprm", lambda d: d["network"].update(gbps=0.5))
    node = SimNode(_scenario(platform=thin))
    assert node.current_allocation()["memcached"].net_gbps == 0.0
    assert node.step().apps[0].p99_us > node.scenario.lc_profiles[0].qos_target_us


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [
        ("be_parties", lambda d: d.update(classes=[]), "classes is empty"),
        ("be_parties", lambda d: d["classes"][0].update(threads=0), r"classes\[0\].threads"),
        ("ant_disk_bandwidth", lambda d: d["classes"][0].update(cpu_util=0), "cpu_util"),
        ("memcached", lambda d: d.update(max_load_rps=1e20), "max_load_rps"),
        ("memcached", lambda d: d.update(llc_alpha=0), "llc_alpha"),
        ("mongodb", lambda d: d.update(ios_per_miss=0), "ios_per_miss"),
        ("mongodb", lambda d: d.update(index_frac=2.0), "index_frac"),
        ("memcached", lambda d: d.update(extends=["x"]), "extends"),
    ],
)
def test_profiles_out_of_their_physical_range_are_config_errors(tmp_path, name, change, match):
    with pytest.raises(ConfigError, match=match):
        load_profile(_write_variant(tmp_path, "apps", name, change))
