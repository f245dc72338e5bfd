"""resctrl (CAT/MBA) on a fake /sys/fs/resctrl: masks, MBA, CLOS limit, ENOSPC, kernel errors."""

from __future__ import annotations

import errno

import pytest

from hw.resctrl import Resctrl, mask_ways, parse_schemata, read_info
from hw.runner import HwInputError, KnobError
from hw.state import Journal


def rdt(host, tmp_path):
    j = Journal(tmp_path / "journal.jsonl", host.fs)
    j.open()
    return Resctrl(host.resctrl_root, fs=host.fs, journal=j), j


def test_info_reads_ways_closids_mba_and_monitoring(v1_host):
    info = read_info(v1_host.resctrl_root, v1_host.fs)
    assert info is not None
    assert (info.ways, info.min_cbm_bits, info.num_closids, info.clos_available) == (20, 1, 4, 3)
    assert info.l3_ids == (0, 1) and info.mba_levels_pct == (10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
    assert "llc_occupancy" in info.mon_features


def test_missing_resctrl_says_how_to_mount(tmp_path):
    with pytest.raises(HwInputError, match="mount -t resctrl"):
        Resctrl(tmp_path / "nothing")


def test_apply_packs_contiguous_masks_and_gives_idle_ways_to_default(v1_host, tmp_path):
    r, j = rdt(v1_host, tmp_path)
    got = r.apply({0: 2, 1: 6, 2: 6}, {0: 50, 1: 100, 2: 100})
    assert got == {0: (2, 50), 1: (6, 100), 2: (6, 100)}
    s = {c: parse_schemata((r.group_dir(c) / "schemata").read_text())["L3"][0] for c in range(3)}
    assert [int(s[c], 16) for c in range(3)] == [0x3, 0xFC, 0x3F00]
    root = parse_schemata((v1_host.resctrl_root / "schemata").read_text())["L3"]
    assert int(root[0], 16) == 0xFC000  # the 6 idle ways at the top
    # diff: applying the same again writes nothing
    n = len(v1_host.fs.writes)
    r.apply({0: 2, 1: 6, 2: 6}, {0: 50, 1: 100, 2: 100})
    assert len(v1_host.fs.writes) == n
    # restore removes our groups and gives the default group its full mask back
    assert j.restore().ok
    assert not r.group_dir(0).exists()
    assert int(parse_schemata((v1_host.resctrl_root / "schemata").read_text())["L3"][0], 16) == 0xFFFFF


def test_bad_input_raises_before_writing(v1_host, tmp_path):
    r, _ = rdt(v1_host, tmp_path)
    with pytest.raises(HwInputError, match="21 LLC ways"):
        r.apply({0: 10, 1: 11})
    with pytest.raises(HwInputError, match="3 for apps"):
        r.apply({0: 1, 1: 1, 2: 1, 3: 1})
    with pytest.raises(HwInputError, match="MBA 55%"):
        r.apply({0: 2}, {0: 55})
    assert v1_host.fs.writes == []


def test_enospc_on_mkdir_reports_the_clos_limit(v1_host, tmp_path):
    r, _ = rdt(v1_host, tmp_path)
    v1_host.fs.fail("coloc_clos2", errno.ENOSPC, op="mkdir")
    with pytest.raises(KnobError, match="CLOS limit is reached") as ei:
        r.apply({0: 2, 1: 2, 2: 2})
    assert ei.value.errno == errno.ENOSPC


def test_kernel_rejection_quotes_last_cmd_status(v1_host, tmp_path):
    r, _ = rdt(v1_host, tmp_path)
    r.ensure_group(0)
    with pytest.raises(KnobError, match="not contiguous"):
        r._set(r.group_dir(0), "L3", {0: "5", 1: "5"})


@pytest.mark.parametrize("err", [errno.EBUSY, errno.EACCES])
def test_schemata_write_errors_surface(v1_host, tmp_path, err):
    r, _ = rdt(v1_host, tmp_path)
    v1_host.fs.fail("coloc_clos0/schemata", err)
    with pytest.raises(KnobError) as ei:
        r.apply({0: 2})
    assert ei.value.errno == err


def test_assign_skips_exited_threads_and_monitor_sums_domains(v1_host, tmp_path):
    r, _ = rdt(v1_host, tmp_path)
    r.apply({0: 2})
    v1_host.fs.fail("coloc_clos0/tasks", errno.ESRCH)
    assert r.assign(0, [11, 12]) == 0  # both exited: skipped, no error
    v1_host.fs.clear()
    assert r.assign(0, [11, 12]) == 2
    assert r.assign(0, [11, 12]) == 0  # already there
    (r.group_dir(0) / "mon_data" / "mon_L3_00" / "mbm_total_bytes").write_text("3000")
    (r.group_dir(0) / "mon_data" / "mon_L3_01" / "mbm_total_bytes").write_text("Unavailable")
    llc, mbm = r.monitor(0)
    assert llc == 1_500_000 and mbm == 3000


def test_mask_ways_rejects_non_contiguous():
    assert mask_ways(0xF0) == 4
    with pytest.raises(ValueError):
        mask_ways(0b101)
