"""tc HTB: parsing, the command sequence through the runner (fake), errors, and a real netns."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from hw.runner import CommandError, HwInputError, Runner, RunResult, TargetGone
from hw.state import Journal, JournalEntry
from hw.tc import Tc, parse_classes, parse_rate_bps, restore_handler

SHOW = """class htb 1:1 root rate 1Gbit ceil 1Gbit burst 1375b cburst 1375b
 Sent 5000 bytes 10 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
class htb 1:10 parent 1:1 prio 0 rate 200Mbit ceil 200Mbit burst 1600b cburst 1600b
 Sent 1234 bytes 3 pkt (dropped 2, overlimits 0 requeues 0)
"""


def test_parse_rates_and_classes():
    assert parse_rate_bps("200Mbit") == 200_000_000
    assert parse_rate_bps("1Gbit") == 1_000_000_000
    assert parse_rate_bps("12Kbit") == 12_000
    assert parse_rate_bps("10Mbps") == 80_000_000  # tc's "bps" is bytes per second
    c = parse_classes(SHOW)
    assert set(c) == {"1:1", "1:10"}
    assert c["1:10"].parent == "1:1" and c["1:10"].ceil_bps == 200_000_000
    assert (c["1:10"].sent_bytes, c["1:10"].dropped) == (1234, 2)
    with pytest.raises(ValueError):
        parse_rate_bps("fast")


def _fmt(rate: str) -> str:
    """tc prints whole megabits as 'NMbit'."""
    if rate.endswith("kbit") and int(rate[:-4]) % 1000 == 0:
        return f"{int(rate[:-4]) // 1000}Mbit"
    return rate


class FakeTcRunner(Runner):
    """Plays `tc`: keeps the classes it was given and prints them like `tc -s class show`."""

    def __init__(self, root_qdisc: str = "qdisc noqueue 0: root refcnt 2", fail_with: str = "") -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []
        self.root = root_qdisc
        self.classes: dict[str, str] = {}
        self.fail_with = fail_with

    def which(self, tool: str) -> str | None:
        return "/usr/sbin/tc"

    def run(self, argv, *, check=True, timeout_s=None, input_text=None) -> RunResult:
        argv = tuple(argv)
        self.calls.append(argv)
        if self.fail_with:
            if check:
                raise CommandError("tc failed", argv, 1, self.fail_with)
            return RunResult(argv, 1, "", self.fail_with)
        a = list(argv[1:])
        if a[:2] == ["-n", a[1]] and a[0] == "-n":
            a = a[2:]
        out = ""
        if a[:2] == ["qdisc", "show"]:
            out = self.root + "\n"
        elif a[:2] == ["qdisc", "replace"]:
            self.root = "qdisc htb 1: root refcnt 2 r2q 10 default 0xfff0"
        elif a[:2] == ["class", "replace"]:
            cid = a[a.index("classid") + 1]
            parent = a[a.index("parent") + 1]
            rate, ceil = a[a.index("rate") + 1], a[a.index("ceil") + 1]
            where = "root" if parent == "1:" else f"parent {parent}"
            self.classes[cid] = (
                f"class htb {cid} {where} prio 0 rate {_fmt(rate)} ceil {_fmt(ceil)} burst 1600b cburst 1600b\n Sent 42 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n"
            )
        elif a[:3] == ["-s", "class", "show"]:
            out = "".join(self.classes.values())
        return RunResult(argv, 0, out, "")


def test_setup_journals_then_replaces_root_and_sets_classes(tmp_path):
    r = FakeTcRunner()
    j = Journal(tmp_path / "j.jsonl")
    j.open()
    tc = Tc("eth9", link_gbps=1.0, runner=r, journal=j)
    assert tc.set_limit(0x10, 0.25) == pytest.approx(0.25)
    assert j.entries[0] == JournalEntry("tc_root", "/eth9", {"dev": "eth9", "netns": None})
    assert all(c[0] == "tc" for c in r.calls)
    assert (
        "tc",
        "qdisc",
        "replace",
        "dev",
        "eth9",
        "root",
        "handle",
        "1:",
        "htb",
        "default",
        "fff0",
    ) in r.calls
    n = len(r.calls)
    tc.set_limit(0x10, 0.25)
    assert not any(c[1:3] == ("class", "replace") for c in r.calls[n:])  # unchanged: not rewritten
    assert tc.sent_bytes(0x10) == 42
    tc.add_port_filters(0x10, [11211])
    assert any("sport" in c and "11211" in c and "1:10" in c for c in r.calls)


def test_bad_input_and_foreign_qdisc_are_refused(tmp_path):
    r = FakeTcRunner(root_qdisc="qdisc cake 8001: root refcnt 2 bandwidth unlimited")
    tc = Tc("eth9", link_gbps=1.0, runner=r)
    with pytest.raises(HwInputError, match="cake root qdisc"):
        tc.setup()
    with pytest.raises(HwInputError, match="outside"):
        Tc("eth9", link_gbps=1.0, runner=FakeTcRunner()).set_limit(0x10, 2.0)
    with pytest.raises(HwInputError, match="link_gbps"):
        Tc("eth9", link_gbps=0, runner=r)


def test_vanished_device_is_target_gone_and_restore_skips_it():
    r = FakeTcRunner(fail_with='Cannot find device "eth9"')
    with pytest.raises(TargetGone):
        Tc("eth9", link_gbps=1.0, runner=r).classes()
    with pytest.raises(TargetGone):
        restore_handler(r)(JournalEntry("tc_root", "/eth9", {"dev": "eth9", "netns": None}))


def test_runner_reports_missing_tool_and_timeouts():
    with pytest.raises(CommandError, match="not installed"):
        Runner().run(["coloc-no-such-tool-xyz"])
    with pytest.raises(CommandError, match="timed out"):
        Runner(timeout_s=0.2).run(["sleep", "5"])
    with pytest.raises(CommandError, match="exit 1"):
        Runner().run(["false"])


def _can_netns() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


@pytest.mark.linux
@pytest.mark.skipif(not _can_netns(), reason="needs root, ip and tc")
def test_real_htb_in_a_network_namespace(tmp_path):
    ns = f"coloc_t_{uuid.uuid4().hex[:8]}"
    run = Runner()
    run.run(["ip", "netns", "add", ns])
    try:
        run.run(["ip", "-n", ns, "link", "add", "cv0", "type", "veth", "peer", "name", "cv1"])
        run.run(["ip", "-n", ns, "link", "set", "cv0", "up"])
        j = Journal(tmp_path / "j.jsonl")
        j.open()
        tc = Tc("cv0", link_gbps=1.0, runner=run, journal=j, netns=ns)
        assert tc.set_limit(0x10, 0.2) == pytest.approx(0.2)
        assert tc.set_limit(0x11, 0.05) == pytest.approx(0.05)
        tc.add_port_filters(0x10, [11211])
        classes = tc.classes()
        assert classes["1:10"].ceil_bps == 200_000_000 and classes["1:1"].rate_bps == 1_000_000_000
        assert tc.root_qdisc() == ("htb", "1:")
        assert j.restore({"tc_root": restore_handler(run)}).ok
        assert tc.root_qdisc()[0] != "htb"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
