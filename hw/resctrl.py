"""Intel RDT through resctrl: CAT (LLC ways) and MBA per CLOS, and CMT/MBM monitoring.

PARTIES Table 3 ("LLC isolation: Intel's Cache Allocation Technology is used for LLC way
partitioning"). One resctrl group per CLOS of the allocation, `<root>/<prefix><clos>`, created on
first use (journalled, so it is removed on restore: the kernel moves its tasks back to the
default group). Each CLOS gets a *contiguous* capacity bitmask (CAT requires contiguous bits), CLOS
i packed after CLOS i-1 from bit 0 up; the ways no CLOS holds (the idle pool) stay with the
default group, where the OS and unmanaged tasks run. When no way is idle, the default group keeps
the top `min_cbm_bits` ways (it may not be empty), shared with the highest CLOS.

The hardware has `num_closids` CLOSes, one of which is the default group's, so the allocation may
use `num_closids - 1`; creating one more fails with ENOSPC, reported as the CLOS limit. A rejected
schemata write is reported with the kernel's own reason (`info/last_cmd_status`).

Monitoring (`mon_data/mon_L3_*/llc_occupancy`, `mbm_total_bytes`) is read when present.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hw.runner import HwInputError, KnobError, Sysfs, TargetGone
from hw.state import Journal, JournalEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResctrlInfo:
    """What `info/` says: L3 ways and CLOS count, MBA range, monitoring features."""

    ways: int
    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    l3_ids: tuple[int, ...]
    mba_min_pct: int = 0  # 0 = no MBA
    mba_gran_pct: int = 10
    mba_ids: tuple[int, ...] = ()
    mon_features: frozenset[str] = frozenset()

    @property
    def mba(self) -> bool:
        return self.mba_min_pct > 0

    @property
    def mba_levels_pct(self) -> tuple[int, ...]:
        if not self.mba:
            return ()
        levels = list(range(self.mba_min_pct, 101, self.mba_gran_pct))
        if levels[-1] != 100:
            levels.append(100)
        return tuple(levels)

    @property
    def clos_available(self) -> int:
        """CLOSes an allocation may use: the default group holds one."""
        return max(self.num_closids - 1, 0)


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """'L3:0=fff;1=fff\\nMB:0=100' -> {'L3': {0: 'fff', 1: 'fff'}, 'MB': {0: '100'}}."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if ":" not in line:
            continue
        res, rest = line.split(":", 1)
        doms = {}
        for part in rest.split(";"):
            if "=" in part:
                k, v = part.split("=", 1)
                doms[int(k)] = v.strip()
        out[res.strip()] = doms
    return out


def read_info(root: str | Path = "/sys/fs/resctrl", fs: Sysfs | None = None) -> ResctrlInfo | None:
    """None when resctrl is not mounted or has no L3 CAT."""
    fs = fs or Sysfs()
    root = Path(root)
    l3 = root / "info" / "L3"
    if not fs.exists(l3 / "cbm_mask"):
        return None
    mask = int(fs.read(l3 / "cbm_mask").strip(), 16)
    sch = parse_schemata(fs.read(root / "schemata"))
    mb = root / "info" / "MB"
    mba_min = mba_gran = 0
    if fs.exists(mb / "min_bandwidth"):
        mba_min = int(fs.read(mb / "min_bandwidth"))
        mba_gran = int(fs.read(mb / "bandwidth_gran"))
    mon: frozenset[str] = frozenset()
    if fs.exists(root / "info" / "L3_MON" / "mon_features"):
        mon = frozenset(fs.read(root / "info" / "L3_MON" / "mon_features").split())
    return ResctrlInfo(
        ways=bin(mask).count("1"),
        cbm_mask=mask,
        min_cbm_bits=int(fs.read(l3 / "min_cbm_bits")),
        num_closids=int(fs.read(l3 / "num_closids")),
        l3_ids=tuple(sorted(sch.get("L3", {}))),
        mba_min_pct=mba_min,
        mba_gran_pct=mba_gran or 10,
        mba_ids=tuple(sorted(sch.get("MB", {}))),
        mon_features=mon,
    )


def contiguous_mask(first_way: int, ways: int) -> int:
    """The capacity bitmask of `ways` ways starting at way `first_way` (CAT needs contiguous bits)."""
    return ((1 << ways) - 1) << first_way


def mask_ways(mask: int) -> int:
    """Number of ways of a contiguous mask; raises ValueError for a non-contiguous one."""
    if mask == 0:
        return 0
    low = (mask & -mask).bit_length() - 1
    n = bin(mask).count("1")
    if mask != contiguous_mask(low, n):
        raise ValueError(f"capacity mask {mask:x} is not contiguous")
    return n


class Resctrl:
    """CAT/MBA actuator and CMT/MBM sensor over the resctrl filesystem at `root`."""

    def __init__(
        self,
        root: str | Path = "/sys/fs/resctrl",
        *,
        fs: Sysfs | None = None,
        journal: Journal | None = None,
        prefix: str = "coloc_clos",
        restrict_default_group: bool = True,
    ) -> None:
        self.fs = fs or Sysfs()
        self.root = Path(root)
        self.journal = journal
        self.prefix = prefix
        self.restrict_default_group = restrict_default_group
        info = read_info(self.root, self.fs)
        if info is None:
            raise HwInputError(
                f"resctrl is not mounted at {self.root} (mount -t resctrl resctrl {self.root}; needs a CPU "
                "with CAT, 'cat_l3' in /proc/cpuinfo, and a kernel with CONFIG_X86_CPU_RESCTRL)"
            )
        self.info = info
        self._created: set[Path] = set()

    def group_dir(self, clos: int) -> Path:
        return self.root / f"{self.prefix}{clos}"

    # ---- groups ------------------------------------------------------------------------------------
    def ensure_group(self, clos: int) -> Path:
        if not 0 <= clos < self.info.clos_available:
            raise HwInputError(
                f"CLOS {clos} outside 0..{self.info.clos_available - 1} (num_closids={self.info.num_closids})"
            )
        d = self.group_dir(clos)
        if self.fs.is_dir(d):
            return d
        if self.journal is not None:
            self.journal.record(JournalEntry("mkdir", str(d)))
        try:
            self.fs.mkdir(d)
        except KnobError as e:
            if e.errno == errno.ENOSPC:
                raise KnobError(
                    f"cannot create resctrl group for CLOS {clos}: the CLOS limit is reached "
                    f"(num_closids={self.info.num_closids}, other groups exist under {self.root}: "
                    f"{self._other_groups()})",
                    e.path,
                    e.errno,
                ) from None
            raise
        self._created.add(d)
        return d

    def _other_groups(self) -> list[str]:
        skip = {"info", "mon_groups", "mon_data"}
        return [n for n in self.fs.listdir(self.root) if self.fs.is_dir(self.root / n) and n not in skip]

    # ---- allocation ---------------------------------------------------------------------------------
    def plan(self, ways_by_clos: Mapping[int, int]) -> tuple[dict[int, int], int]:
        """Contiguous masks per CLOS (packed from bit 0 in CLOS order) and the default group's mask."""
        info = self.info
        total = sum(ways_by_clos.values())
        if total > info.ways:
            raise HwInputError(f"CLOSes ask for {total} LLC ways; the cache has {info.ways}")
        if len(ways_by_clos) > info.clos_available:
            raise HwInputError(
                f"{len(ways_by_clos)} CLOSes used; this CPU has {info.clos_available} for apps"
            )
        masks = {}
        first = 0
        for clos in sorted(ways_by_clos):
            w = ways_by_clos[clos]
            if w < info.min_cbm_bits:
                raise HwInputError(f"CLOS {clos}: {w} ways is below the hardware minimum {info.min_cbm_bits}")
            masks[clos] = contiguous_mask(first, w)
            first += w
        idle = info.ways - first
        default_ways = max(idle, info.min_cbm_bits)
        default = contiguous_mask(info.ways - default_ways, default_ways)
        low = (info.cbm_mask & -info.cbm_mask).bit_length() - 1  # masks are relative to cbm_mask
        return {c: m << low for c, m in masks.items()}, default << low

    def apply(
        self, ways_by_clos: Mapping[int, int], mba_by_clos: Mapping[int, int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """Set every CLOS's ways (and MBA %); write only schemata lines that change. Returns the
        read-back (ways, MBA %) per CLOS."""
        mba_by_clos = dict(mba_by_clos or {})
        for clos, pct in mba_by_clos.items():
            if self.info.mba:
                if pct not in self.info.mba_levels_pct:
                    raise HwInputError(f"CLOS {clos}: MBA {pct}% not in {list(self.info.mba_levels_pct)}")
            elif pct != 100:
                raise HwInputError(f"CLOS {clos}: MBA {pct}% requested but this CPU has no MBA")
        masks, default = self.plan(ways_by_clos)
        # shrink first, then grow, so that two CLOSes never hold the same ways longer than needed
        order = sorted(masks, key=lambda c: bin(masks[c]).count("1") - self._current_ways(c))
        for clos in order:
            d = self.ensure_group(clos)
            self._set(d, "L3", {i: f"{masks[clos]:x}" for i in self.info.l3_ids})
            if self.info.mba and clos in mba_by_clos:
                self._set(d, "MB", {i: str(mba_by_clos[clos]) for i in self.info.mba_ids})
        if self.restrict_default_group:
            self._set(self.root, "L3", {i: f"{default:x}" for i in self.info.l3_ids})
        return {c: self.read_clos(c) for c in masks}

    def _current_ways(self, clos: int) -> int:
        d = self.group_dir(clos)
        if not self.fs.is_dir(d):
            return 0
        return self._ways_of(parse_schemata(self.fs.read(d / "schemata")))

    def _ways_of(self, sch: dict[str, dict[int, str]]) -> int:
        vals = sch.get("L3", {})
        return max((mask_ways(int(v, 16)) for v in vals.values()), default=0)

    def _set(self, d: Path, res: str, doms: Mapping[int, str]) -> None:
        path = d / "schemata"
        cur = parse_schemata(self.fs.read(path)).get(res, {})
        if all(_norm(res, cur.get(i, "")) == _norm(res, v) for i, v in doms.items()):
            return
        if self.journal is not None and d not in self._created:
            key = f"{path}#{res}"
            if not self.journal.recorded("file", key):
                orig = ";".join(f"{i}={v}" for i, v in sorted(cur.items()))
                self.journal.record(
                    JournalEntry("file", key, {"path": str(path), "values": [f"{res}:{orig}\n"]})
                )
        line = f"{res}:" + ";".join(f"{i}={v}" for i, v in sorted(doms.items())) + "\n"
        try:
            self.fs.write(path, line)
        except KnobError as e:
            raise type(e)(f"{e} ({self.last_status()})", e.path, e.errno) from None

    def last_status(self) -> str:
        f = self.root / "info" / "last_cmd_status"
        try:
            return "kernel says: " + self.fs.read(f).strip()
        except KnobError:
            return "no info/last_cmd_status"

    def read_clos(self, clos: int) -> tuple[int, int]:
        """(ways, MBA %) of a CLOS, read back from its schemata."""
        sch = parse_schemata(self.fs.read(self.group_dir(clos) / "schemata"))
        mb = sch.get("MB", {})
        pct = min((int(v) for v in mb.values()), default=100)
        return self._ways_of(sch), pct

    # ---- tasks ---------------------------------------------------------------------------------------
    def assign(self, clos: int, tids: Iterable[int]) -> int:
        """Put threads into the CLOS's group (the kernel takes one id per write). Threads that have
        exited meanwhile are skipped. Returns how many were moved."""
        d = self.ensure_group(clos)
        have = {int(x) for x in self.fs.read(d / "tasks").split()}
        moved = 0
        for tid in tids:
            if tid in have:
                continue
            try:
                self.fs.write(d / "tasks", f"{tid}\n")
                moved += 1
            except TargetGone:
                continue  # ESRCH: the thread exited
            except KnobError as e:
                if e.errno == errno.ESRCH:
                    continue
                raise
        return moved

    # ---- monitoring -------------------------------------------------------------------------------------
    def monitor(self, clos: int) -> tuple[float, float]:
        """(LLC occupancy bytes, cumulative memory-bandwidth bytes) summed over L3 domains; NaN for
        a feature this CPU lacks. Bandwidth is a counter: the caller differentiates it."""
        mon = self.group_dir(clos) / "mon_data"
        if not self.fs.is_dir(mon):
            return float("nan"), float("nan")
        llc = mbm = 0.0
        have_llc = have_mbm = False
        for dom in self.fs.listdir(mon):
            dd = mon / dom
            if self.fs.exists(dd / "llc_occupancy"):
                v = self.fs.read(dd / "llc_occupancy").strip()
                if v.isdigit():
                    llc += int(v)
                    have_llc = True
            if self.fs.exists(dd / "mbm_total_bytes"):
                v = self.fs.read(dd / "mbm_total_bytes").strip()
                if v.isdigit():  # "Unavailable" while the counter is not yet valid
                    mbm += int(v)
                    have_mbm = True
        return (llc if have_llc else float("nan")), (mbm if have_mbm else float("nan"))


def _norm(res: str, v: str) -> int | str:
    """Schemata values as numbers: L3 masks are hex (zero-padded by the kernel), MB percentages decimal."""
    try:
        return int(v.strip(), 16 if res.startswith("L") else 10)
    except ValueError:
        return v.strip()
