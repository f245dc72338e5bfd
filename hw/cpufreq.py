"""Per-core frequency caps through cpufreq (PARTIES Table 3, "Power isolation").

PARTIES runs the ACPI driver's *userspace* governor to pin cores to 1.2-2.2 GHz in 100 MHz steps,
or the *performance* governor for turbo. Two modes:

* `max_freq` (default; works with intel_pstate and acpi-cpufreq): write the cap to
  `cpu<N>/cpufreq/scaling_max_freq`; the governor stays in charge below it. The top level is
  `cpuinfo_max_freq` (turbo).
* `userspace`: switch each managed core to the userspace governor at start (journalled) and write
  `scaling_setspeed`.

Values in sysfs are kHz; this module speaks MHz. Each write is validated against the core's range,
diffed against the read-back value, journalled, written and read back (drivers round to a
supported frequency, and the read-back value is what the node reports).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hw.runner import HwInputError, Sysfs
from hw.state import Journal

FreqMode = Literal["max_freq", "userspace"]


@dataclass(frozen=True)
class CpuFreqInfo:
    """The frequency range of the managed cores (the intersection over cores)."""

    cpus: tuple[int, ...]
    min_mhz: int
    max_mhz: int  # cpuinfo_max_freq: turbo where the CPU has it
    base_mhz: int  # base (nominal) frequency where the driver says it, else max_mhz
    available_mhz: tuple[int, ...]  # scaling_available_frequencies (acpi-cpufreq), else ()
    governors: tuple[str, ...]
    driver: str

    def levels_mhz(self, step_mhz: int = 100, nominal_mhz: int | None = None) -> tuple[int, ...]:
        """PARTIES levels: min..nominal in `step_mhz`, then turbo (max) when it exceeds nominal."""
        nominal = min(nominal_mhz or self.base_mhz, self.max_mhz)
        first = int(math.ceil(self.min_mhz / step_mhz) * step_mhz)
        levels = list(range(first, nominal + 1, step_mhz)) or [nominal]
        if self.max_mhz > levels[-1]:
            levels.append(self.max_mhz)
        return tuple(levels)


def read_info(root: str | Path, cpus: Iterable[int], fs: Sysfs | None = None) -> CpuFreqInfo | None:
    """None when any managed core has no cpufreq directory (no driver, or a VM)."""
    fs = fs or Sysfs()
    root = Path(root)
    cpus = tuple(sorted(cpus))
    if not cpus:
        return None
    lo, hi, base = 0, 1 << 62, 1 << 62
    avail: set[int] | None = None
    govs: set[str] | None = None
    driver = ""
    for c in cpus:
        d = root / f"cpu{c}" / "cpufreq"
        if not fs.exists(d / "cpuinfo_max_freq"):
            return None
        lo = max(lo, int(fs.read(d / "cpuinfo_min_freq")) // 1000)
        hi = min(hi, int(fs.read(d / "cpuinfo_max_freq")) // 1000)
        if fs.exists(d / "base_frequency"):
            base = min(base, int(fs.read(d / "base_frequency")) // 1000)
        if fs.exists(d / "scaling_available_frequencies"):
            a = {int(x) // 1000 for x in fs.read(d / "scaling_available_frequencies").split()}
            avail = a if avail is None else avail & a
        g = (
            set(fs.read(d / "scaling_available_governors").split())
            if fs.exists(d / "scaling_available_governors")
            else set()
        )
        govs = g if govs is None else govs & g
        if fs.exists(d / "scaling_driver"):
            driver = fs.read(d / "scaling_driver").strip()
    if base >= 1 << 62:
        base = hi
    return CpuFreqInfo(cpus, lo, hi, base, tuple(sorted(avail or ())), tuple(sorted(govs or ())), driver)


class CpuFreq:
    """Per-core frequency actuator over `<root>/cpu<N>/cpufreq` (root injectable)."""

    def __init__(
        self,
        root: str | Path = "/sys/devices/system/cpu",
        cpus: Iterable[int] = (),
        *,
        mode: FreqMode = "max_freq",
        fs: Sysfs | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.fs = fs or Sysfs()
        self.root = Path(root)
        self.mode = mode
        self.journal = journal
        info = read_info(self.root, cpus, self.fs)
        if info is None:
            raise HwInputError(
                f"no cpufreq under {self.root} for CPUs {sorted(cpus)}: load a cpufreq driver "
                "(acpi-cpufreq or intel_pstate); VMs usually have none"
            )
        if mode == "userspace" and "userspace" not in info.governors:
            raise HwInputError(
                f"the userspace governor is not available (have {list(info.governors)}): use "
                "freq.mode: max_freq, or boot with intel_pstate=passive / load acpi-cpufreq"
            )
        self.info = info
        self._started = False

    def _d(self, cpu: int) -> Path:
        return self.root / f"cpu{cpu}" / "cpufreq"

    def _write(self, path: Path, value: str) -> None:
        if self.journal is not None and not self.journal.recorded("file", str(path)):
            self.journal.record_file(path, [self.fs.read(path).strip()])
        self.fs.write(path, value)

    def start(self) -> None:
        """userspace mode: switch the managed cores to the userspace governor (journalled)."""
        if self._started:
            return
        if self.mode == "userspace":
            for c in self.info.cpus:
                gov = self._d(c) / "scaling_governor"
                if self.fs.read(gov).strip() != "userspace":
                    self._write(gov, "userspace")
        self._started = True

    def limit_mhz(self, cpu: int) -> int:
        """The cap (max_freq mode) or set speed (userspace mode) in force, read back."""
        knob = "scaling_setspeed" if self.mode == "userspace" else "scaling_max_freq"
        v = self.fs.read(self._d(cpu) / knob).strip()
        return int(v) // 1000 if v.isdigit() else 0

    def set(self, mhz_by_cpu: Mapping[int, int]) -> dict[int, int]:
        """Set each core's frequency; returns the read-back MHz per core."""
        for cpu, mhz in mhz_by_cpu.items():
            if cpu not in self.info.cpus:
                raise HwInputError(f"CPU {cpu} is not managed (managed: {list(self.info.cpus)})")
            if not self.info.min_mhz <= mhz <= self.info.max_mhz:
                raise HwInputError(
                    f"CPU {cpu}: {mhz} MHz outside {self.info.min_mhz}..{self.info.max_mhz} MHz"
                )
        self.start()
        for cpu, mhz in mhz_by_cpu.items():
            if self.limit_mhz(cpu) == mhz:
                continue
            d = self._d(cpu)
            if self.mode == "userspace":
                self._write(d / "scaling_setspeed", str(mhz * 1000))
            else:
                if int(self.fs.read(d / "scaling_min_freq")) // 1000 > mhz:
                    self._write(d / "scaling_min_freq", str(self.info.min_mhz * 1000))
                self._write(d / "scaling_max_freq", str(mhz * 1000))
        return {cpu: self.limit_mhz(cpu) for cpu in mhz_by_cpu}

    def cur_mhz(self, cpus: Iterable[int]) -> float:
        """Mean achieved frequency of `cpus` (scaling_cur_freq); NaN when unreadable."""
        vals = []
        for c in cpus:
            f = self._d(c) / "scaling_cur_freq"
            if self.fs.exists(f):
                v = self.fs.read(f).strip()
                if v.isdigit():
                    vals.append(int(v) / 1000)
        return sum(vals) / len(vals) if vals else math.nan
