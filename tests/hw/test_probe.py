"""Capability probe: knobs found or missing (with what to enable), ranges, masking, config errors."""

from __future__ import annotations

import pytest

from env.config import ConfigError, build
from env.types import Resource
from hw.config import (
    AppTarget,
    CacheConfig,
    CoresConfig,
    DiskConfig,
    LinuxNodeConfig,
    MemoryConfig,
    load_linux_config,
)
from hw.probe import CapabilityError, capabilities, check, probe
from hw.runner import HwInputError

APPS = (
    AppTarget("mc", "lc", qos_target_us=500.0, max_load_rps=1e4, cgroup="mc"),
    AppTarget("be", "be", cgroup="be"),
)


def cfg(host, tmp_path, **kw):
    base = dict(
        name="p", apps=APPS, knobs=("core", "cache", "freq", "mem", "disk"),
        cgroup_root=str(host.cgroup_root), proc_root=str(host.proc_root), cpu_root=str(host.cpu_root),
        disk=DiskConfig(device="254:0"), cache=CacheConfig(resctrl_root=str(host.resctrl_root)),
    )  # fmt: skip
    base.update(kw)
    return LinuxNodeConfig(**base)


def test_full_host_has_every_knob(v1_host, tmp_path):
    c = cfg(v1_host, tmp_path)
    r = probe(c, fs=v1_host.fs)
    check(c, r)
    assert r.available == {"core", "cache", "freq", "mem", "disk"} and r.missing == {}
    assert r.cores == ((0, 1), (2, 3)) and r.disk_device == "254:0"
    caps = capabilities(c, r)
    assert caps.memory_gb == pytest.approx(31.0)  # 32 GiB MemTotal - 1 GiB reserve
    assert caps.mba_levels_pct[-1] == 100 and caps.knobs == frozenset(Resource)
    assert "cgroup v1 (hybrid" in r.summary()


def test_missing_knobs_say_what_to_enable(tmp_path, host_factory):
    host = host_factory["v1"](tmp_path, resctrl=False, cpufreq=False)
    c = cfg(host, tmp_path)
    r = probe(c, fs=host.fs)
    assert set(r.missing) == {"cache", "freq"}
    with pytest.raises(CapabilityError) as ei:
        check(c, r)
    msg = str(ei.value)
    assert "mount -t resctrl" in msg and "cpufreq driver" in msg and "require_knobs: false" in msg
    caps = capabilities(c, r)
    assert Resource.CACHE not in caps.knobs and Resource.FREQ not in caps.knobs
    assert caps.freq_levels_mhz == (2000,) and caps.llc_ways == 20 and caps.clos_count == 2


def test_quota_mode_masks_freq_and_uses_quota_steps(v1_host, tmp_path):
    c = cfg(v1_host, tmp_path, cores=CoresConfig(mode="quota", quota_step_cores=0.5))
    r = probe(c, fs=v1_host.fs)
    assert "freq" in r.missing and "cpuset" in r.missing["freq"]
    caps = capabilities(c, r)
    assert (caps.cores, caps.core_step) == (4.0, 0.5)


def test_bad_input_is_named(v1_host, tmp_path):
    with pytest.raises(HwInputError, match=r"CPUs \[9\] are not online"):
        probe(cfg(v1_host, tmp_path, cores=CoresConfig(cpus=(0, 9))), fs=v1_host.fs)
    f = tmp_path / "notadev"
    f.write_text("")
    with pytest.raises(HwInputError, match=r"disk.device.*no major:minor"):
        probe(cfg(v1_host, tmp_path, disk=DiskConfig(device=str(f))), fs=v1_host.fs)
    with pytest.raises(HwInputError, match="reserve_gb"):
        c = cfg(v1_host, tmp_path, memory=MemoryConfig(reserve_gb=64))
        capabilities(c, probe(c, fs=v1_host.fs))


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="needs qos_target_us"):
        AppTarget("mc", "lc", cgroup="x")
    with pytest.raises(ConfigError, match="exactly one of"):
        AppTarget("mc", "be", cgroup="x", container="y")
    with pytest.raises(ConfigError, match=r"knob disk needs disk.device"):
        LinuxNodeConfig(name="n", apps=APPS, knobs=("disk",))
    with pytest.raises(ConfigError, match=r"apps\[0\].kind"):
        build(LinuxNodeConfig, {"name": "n", "apps": [{"name": "a", "kind": "xx"}]}, "n")
    assert AppTarget("job", "be", pids=(1,)).create  # plain processes go into a created cgroup


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: AppTarget("be", "be", cgroup="../../etc"), r"apps.be.cgroup '../../etc'"),
        (lambda: AppTarget("be", "be", cgroup="/system.slice/../../x"), "without '..'"),
        (lambda: AppTarget("../x", "be", create=True), r"apps.../x.name '../x': a plain name"),
        (lambda: AppTarget("a/b", "be", create=True), "a plain name"),
        (lambda: LinuxNodeConfig(name="n", apps=APPS, cgroup_parent="/etc"), "not an absolute one"),
        (lambda: LinuxNodeConfig(name="n", apps=APPS, cgroup_parent="coloc/../.."), "without '..'"),
        (lambda: CacheConfig(group_prefix="../x"), "cache.group_prefix"),
    ],
)
def test_paths_under_the_kernel_roots_cannot_climb_out_or_be_absolute_names(make, needle):
    with pytest.raises(ConfigError, match=needle):
        make()
    assert AppTarget("be", "be", cgroup="/").cgroup == "/"  # the hierarchy root itself
    assert AppTarget("be", "be", cgroup="/system.slice/x.service").cgroup


@pytest.mark.parametrize("name", ["linux-local", "linux-docker", "linux-lab"])
def test_shipped_configs_load(name):
    c = load_linux_config(name)
    assert c.apps and c.name
