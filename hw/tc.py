"""Egress bandwidth per app with HTB (PARTIES Table 3: "Linux's qdisc traffic control scheduler
with hierarchical token bucket (HTB) queueing discipline is used to limit the egress network
bandwidth"; Heracles' network sub-controller enforces its limit the same way).

Layout on the managed device (all through the `tc` binary and the one `Runner`):

    root qdisc 1: htb default fff0
      class 1:1     rate=ceil=link                      (the link)
        class 1:10+i  rate=ceil=<app i's net_gbps>      (one per managed app)
        class 1:fff0  rate 1mbit ceil=link              (everything else)

Traffic is sorted into the app classes by u32 filters on source ports (`match: port`) or by the
`cgroup` classifier with each app's v1 `net_cls.classid` (`match: cgroup`). Read-back parses
`tc -s class show`, which also gives the bytes sent per class (the app's network usage).

The root qdisc the device had is journalled (`tc_root`) before it is replaced; restoring deletes
our root qdisc, which gives the device its default qdisc back. A device whose root qdisc is not a
kernel default is refused unless `replace_existing` is set (we could not put it back).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from hw.runner import CommandError, HwInputError, Runner, TargetGone
from hw.state import Journal, JournalEntry

HANDLE = 1
LINK_MINOR = 0x1
DEFAULT_MINOR = 0xFFF0
FIRST_APP_MINOR = 0x10
DEFAULT_QDISCS = frozenset({"noqueue", "pfifo_fast", "fq_codel", "mq", "fq", "pfifo", "noop"})

_UNITS = {
    "": 1,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_rate_bps(text: str) -> int:
    """A tc rate ('500Mbit', '1Gbit', '12Kbit', '800bit', '10Mbps' = bytes/s) in bits/s."""
    m = re.fullmatch(r"([\d.]+)\s*([kmgt]i?)?(bit|bps)", text.strip(), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a tc rate: {text!r}")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if m.group(3).lower() == "bps":
        value *= 8
    return round(value)


def format_rate(gbps: float) -> str:
    """Gbit/s -> a tc rate in kbit (exact for any 1 kbit/s multiple)."""
    return f"{max(1, round(gbps * 1e6))}kbit"


@dataclass(frozen=True)
class HtbClass:
    """One HTB class as `tc -s class show` reports it: rates in bit/s, bytes sent and packets dropped."""

    classid: str
    parent: str
    rate_bps: int
    ceil_bps: int
    sent_bytes: int
    dropped: int


def parse_classes(text: str) -> dict[str, HtbClass]:
    """Parse `tc -s class show dev X` output (HTB classes only)."""
    out: dict[str, HtbClass] = {}
    cur: dict | None = None
    for line in text.splitlines():
        m = re.match(r"\s*class htb (\S+) (?:parent (\S+)|root)", line)
        if m:
            if cur:
                out[cur["classid"]] = HtbClass(**cur)
            rate = re.search(r"\brate (\S+)", line)
            ceil = re.search(r"\bceil (\S+)", line)
            cur = {
                "classid": m.group(1),
                "parent": m.group(2) or "root",
                "rate_bps": parse_rate_bps(rate.group(1)) if rate else 0,
                "ceil_bps": parse_rate_bps(ceil.group(1)) if ceil else 0,
                "sent_bytes": 0,
                "dropped": 0,
            }
            continue
        s = re.match(r"\s*Sent (\d+) bytes \d+ pkt \(dropped (\d+)", line)
        if s and cur:
            cur["sent_bytes"] = int(s.group(1))
            cur["dropped"] = int(s.group(2))
    if cur:
        out[cur["classid"]] = HtbClass(**cur)
    return out


def classid(minor: int) -> str:
    """The HTB class id `1:<minor>` (hex) under the managed root qdisc."""
    return f"{HANDLE:x}:{minor:x}"


class Tc:
    """HTB egress shaping on one device (optionally inside a network namespace)."""

    def __init__(
        self,
        dev: str,
        *,
        link_gbps: float,
        runner: Runner | None = None,
        journal: Journal | None = None,
        netns: str | None = None,
        replace_existing: bool = False,
    ) -> None:
        if link_gbps <= 0:
            raise HwInputError(f"tc on {dev}: link_gbps must be positive, got {link_gbps}")
        self.dev = dev
        self.link_gbps = link_gbps
        self.runner = runner or Runner()
        self.journal = journal
        self.netns = netns
        self.replace_existing = replace_existing
        self._ready = False

    def _tc(self, *args: str, check: bool = True) -> str:
        argv = ["tc", *(["-n", self.netns] if self.netns else []), *args]
        try:
            return self.runner.run(argv, check=check).stdout
        except CommandError as e:
            if re.search(r"Cannot find device|does not exist|Cannot open network namespace", e.stderr):
                raise TargetGone(f"tc: device {self.dev!r} is gone: {e.stderr.strip()}") from None
            raise

    @property
    def key(self) -> str:
        return f"{self.netns or ''}/{self.dev}"

    def root_qdisc(self) -> tuple[str, str]:
        """(kind, handle) of the device's root qdisc, e.g. ('noqueue', '0:')."""
        for line in self._tc("qdisc", "show", "dev", self.dev, "root").splitlines():
            m = re.match(r"qdisc (\S+) (\S+) root", line)
            if m:
                return m.group(1), m.group(2)
        return "", ""

    def setup(self) -> None:
        """Install the HTB root and link class (journalled first); idempotent."""
        if self._ready:
            return
        kind, handle = self.root_qdisc()
        ours = kind == "htb" and handle == f"{HANDLE}:"
        if not ours and kind not in DEFAULT_QDISCS and kind and not self.replace_existing:
            raise HwInputError(
                f"{self.dev} has a {kind} root qdisc that coloc could not restore; remove it "
                "(tc qdisc del dev DEV root) or set net.replace_existing: true"
            )
        if self.journal is not None:
            self.journal.record(JournalEntry("tc_root", self.key, {"dev": self.dev, "netns": self.netns}))
        if not ours:
            self._tc(
                "qdisc",
                "replace",
                "dev",
                self.dev,
                "root",
                "handle",
                f"{HANDLE}:",
                "htb",
                "default",
                f"{DEFAULT_MINOR:x}",
            )
        link = format_rate(self.link_gbps)
        self._tc(
            "class",
            "replace",
            "dev",
            self.dev,
            "parent",
            f"{HANDLE}:",
            "classid",
            classid(LINK_MINOR),
            "htb",
            "rate",
            link,
            "ceil",
            link,
        )
        self._tc(
            "class", "replace", "dev", self.dev, "parent", classid(LINK_MINOR), "classid", classid(DEFAULT_MINOR),
            "htb", "rate", "1mbit", "ceil", link,
        )  # fmt: skip
        self._ready = True

    def classes(self) -> dict[str, HtbClass]:
        return parse_classes(self._tc("-s", "class", "show", "dev", self.dev))

    def set_limit(self, minor: int, gbps: float) -> float:
        """Set app class 1:<minor> to rate=ceil=`gbps`; returns the read-back ceil in Gbit/s."""
        if not FIRST_APP_MINOR <= minor < DEFAULT_MINOR:
            raise HwInputError(
                f"tc class minor {minor:#x} outside {FIRST_APP_MINOR:#x}..{DEFAULT_MINOR - 1:#x}"
            )
        if not 0 < gbps <= self.link_gbps + 1e-9:
            raise HwInputError(f"net limit {gbps} Gbit/s outside (0, {self.link_gbps}] on {self.dev}")
        self.setup()
        cid = classid(minor)
        cur = self.classes().get(cid)
        want = round(gbps * 1e9)
        if cur is None or abs(cur.ceil_bps - want) > want * 1e-3 or abs(cur.rate_bps - want) > want * 1e-3:
            r = format_rate(gbps)
            self._tc(
                "class",
                "replace",
                "dev",
                self.dev,
                "parent",
                classid(LINK_MINOR),
                "classid",
                cid,
                "htb",
                "rate",
                r,
                "ceil",
                r,
            )
        got = self.classes().get(cid)
        if got is None:
            raise TargetGone(f"tc class {cid} on {self.dev} vanished after being set")
        return got.ceil_bps / 1e9

    def add_port_filters(self, minor: int, ports: Iterable[int]) -> None:
        """u32 filters sending traffic from local `ports` (TCP/UDP source port) to class 1:<minor>."""
        self.setup()
        existing = self._tc("filter", "show", "dev", self.dev, "parent", f"{HANDLE}:")
        for port in ports:
            if not 0 < port < 65536:
                raise HwInputError(f"port {port} outside 1..65535")
            if re.search(
                rf"flowid {re.escape(classid(minor))}\b[\s\S]*?match {port:04x}0000/ffff0000", existing
            ):
                continue
            self._tc(
                "filter", "add", "dev", self.dev, "parent", f"{HANDLE}:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "sport", str(port), "0xffff", "flowid", classid(minor),
            )  # fmt: skip

    def add_cgroup_filter(self) -> None:
        """The cgroup classifier: packets go to the class in their socket's net_cls.classid."""
        self.setup()
        if "cgroup" in self._tc("filter", "show", "dev", self.dev, "parent", f"{HANDLE}:"):
            return
        self._tc(
            "filter",
            "add",
            "dev",
            self.dev,
            "parent",
            f"{HANDLE}:",
            "protocol",
            "all",
            "prio",
            "10",
            "handle",
            "1:",
            "cgroup",
        )

    def sent_bytes(self, minor: int) -> int | None:
        c = self.classes().get(classid(minor))
        return None if c is None else c.sent_bytes


def net_cls_classid(minor: int) -> int:
    """The v1 net_cls.classid value (0xMMMMmmmm) that the cgroup classifier maps to 1:<minor>."""
    return (HANDLE << 16) | minor


def restore_handler(runner: Runner):
    """Journal handler for `tc_root` entries: delete our root qdisc (the device's default returns)."""

    def _restore(entry: JournalEntry) -> None:
        dev, netns = entry.data["dev"], entry.data.get("netns")
        argv = ["tc", *(["-n", netns] if netns else []), "qdisc", "del", "dev", dev, "root"]
        r = runner.run(argv, check=False)
        if r.returncode != 0:
            err = r.stderr
            if re.search(r"Cannot find device|Cannot open network namespace", err):
                raise TargetGone(f"tc restore: {dev} is gone")
            if re.search(r"Cannot delete qdisc with handle of zero|No such file|Invalid handle", err):
                return  # already the default qdisc
            raise CommandError(f"{' '.join(argv)} failed: {err.strip()}", argv, r.returncode, err)

    return _restore
