"""cpufreq on a fake sysfs: levels, max_freq and userspace modes, range checks, errors."""

from __future__ import annotations

import errno

import pytest

from hw.cpufreq import CpuFreq, read_info
from hw.runner import HwInputError, KnobError
from hw.state import Journal


def test_levels_follow_parties_with_turbo(v1_host):
    info = read_info(v1_host.cpu_root, range(4), v1_host.fs)
    assert info is not None and (info.min_mhz, info.base_mhz, info.max_mhz) == (1200, 2200, 3600)
    levels = info.levels_mhz(100)
    assert levels[0] == 1200 and levels[-2] == 2200 and levels[-1] == 3600 and len(levels) == 12


def test_no_cpufreq_says_what_to_load(tmp_path):
    (tmp_path / "cpu0").mkdir()
    with pytest.raises(HwInputError, match="cpufreq driver"):
        CpuFreq(tmp_path, [0])


def test_max_freq_mode_lowers_min_first_and_restores(v1_host, tmp_path):
    j = Journal(tmp_path / "j.jsonl", v1_host.fs)
    j.open()
    d = v1_host.cpu_root / "cpu1" / "cpufreq"
    (d / "scaling_min_freq").write_text("2000000")
    f = CpuFreq(v1_host.cpu_root, [0, 1], fs=v1_host.fs, journal=j)
    assert f.set({0: 1500, 1: 1500}) == {0: 1500, 1: 1500}
    assert (d / "scaling_min_freq").read_text() == "1200000"
    n = len(v1_host.fs.writes)
    f.set({0: 1500})
    assert len(v1_host.fs.writes) == n  # unchanged: not written
    assert j.restore().ok
    assert (d / "scaling_max_freq").read_text() == "3600000" and (
        d / "scaling_min_freq"
    ).read_text() == "2000000"


def test_userspace_mode_switches_governor(v1_host, tmp_path):
    j = Journal(tmp_path / "j.jsonl", v1_host.fs)
    j.open()
    f = CpuFreq(v1_host.cpu_root, [2], mode="userspace", fs=v1_host.fs, journal=j)
    assert f.set({2: 2100}) == {2: 2100}
    d = v1_host.cpu_root / "cpu2" / "cpufreq"
    assert (d / "scaling_governor").read_text() == "userspace"
    assert (d / "scaling_setspeed").read_text() == "2100000"
    j.restore()
    assert (d / "scaling_governor").read_text() == "powersave"


def test_out_of_range_and_unmanaged_raise_before_writing(v1_host):
    f = CpuFreq(v1_host.cpu_root, [0, 1], fs=v1_host.fs)
    with pytest.raises(HwInputError, match=r"outside 1200..3600"):
        f.set({0: 4000})
    with pytest.raises(HwInputError, match="CPU 3 is not managed"):
        f.set({3: 2000})
    assert v1_host.fs.writes == []


@pytest.mark.parametrize("err", [errno.EBUSY, errno.EACCES])
def test_write_errors_surface(v1_host, err):
    f = CpuFreq(v1_host.cpu_root, [0], fs=v1_host.fs)
    v1_host.fs.fail("cpu0/cpufreq/scaling_max_freq", err)
    with pytest.raises(KnobError) as ei:
        f.set({0: 2000})
    assert ei.value.errno == err
    assert f.cur_mhz([0, 1]) == 2000.0
