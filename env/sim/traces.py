"""Load traces: an app's offered load over time, as a fraction of its max load (DESIGN §4).

Each kind is a small frozen spec (what the scenario YAML holds) whose `build(rng)` returns a
`Trace`: a vectorised function of time. Randomness (bursts) is drawn once at build time from the
injected generator, so a trace is a fixed function for the whole episode.

| kind       | keys                                              | shape                                        |
|------------|---------------------------------------------------|----------------------------------------------|
| `constant` | `load`                                            | flat                                         |
| `step`     | `steps: [[t_s, load], ...]`                       | piecewise constant, each load from its t_s   |
| `ramp`     | `points: [[t_s, load], ...]`                      | piecewise linear (PARTIES Fig. 9)            |
| `sinusoid` | `low, high, period_s, phase_s`                    | low..high sine (Q-PRM Sec. 3.3 load curve)   |
| `diurnal`  | `low, high, period_s, phase_s`                    | day shape: trough at night, evening peak     |
| `bursty`   | `base, burst, mean_gap_s, mean_burst_s, ramp_s`   | base load with random bursts (Poisson gaps)  |
| `csv`      | `path, time_scale, load_scale`                    | replay of `t_s,load` rows, linear in between |

A spec is checked when it is parsed: loads in [0, `MAX_LOAD_MULTIPLE`], periods and scales > 0,
and a bursty trace draws its bursts over at most a day (`MAX_HORIZON_S`, the longest scenario) and
at most `MAX_BURSTS` of them, so that no spec makes building its trace take unbounded time.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from env.config import ConfigError, build


class Trace(Protocol):
    """An offered load over time: `values(t_s)` gives the fraction of max load at each time (s)."""

    def values(self, t_s: np.ndarray) -> np.ndarray: ...


class _Piecewise:
    def __init__(self, t: np.ndarray, v: np.ndarray, linear: bool) -> None:
        self.t, self.v, self.linear = t, v, linear

    def values(self, t_s: np.ndarray) -> np.ndarray:
        t_s = np.asarray(t_s, dtype=float)
        if self.linear:
            return np.interp(t_s, self.t, self.v)
        idx = np.searchsorted(self.t, t_s, side="right") - 1
        return self.v[np.clip(idx, 0, len(self.v) - 1)]


class _Func:
    def __init__(self, f) -> None:
        self.f = f

    def values(self, t_s: np.ndarray) -> np.ndarray:
        return self.f(np.asarray(t_s, dtype=float))


MAX_HORIZON_S = 86_400.0  # a day of simulated time: the longest scenario, and a bursty trace's horizon
MAX_BURSTS = 100_000  # bursts a bursty trace may draw (ten a minute for a week is not a load trace)
MAX_LOAD_MULTIPLE = 1000.0  # loads are fractions of the profile's max load on its reference node; on
# another platform an app can sustain far more (CoCo's in-memory MongoDB: ~150x its disk-bound max load)


def _check_load(x: float, where: str) -> None:
    if not (0.0 <= x <= MAX_LOAD_MULTIPLE) or not math.isfinite(x):
        raise ConfigError(f"{where}: load {x} must be a fraction of max load in [0, {MAX_LOAD_MULTIPLE:g}]")


def _points(rows: tuple[tuple[float, float], ...], where: str) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        raise ConfigError(f"{where}: needs at least one [t_s, load] row")
    t = np.array([r[0] for r in rows], dtype=float)
    v = np.array([r[1] for r in rows], dtype=float)
    if np.any(np.diff(t) < 0):
        raise ConfigError(f"{where}: times must be non-decreasing")
    for x in v:
        _check_load(float(x), where)
    return t, v


@dataclass(frozen=True)
class Constant:
    """A flat load."""

    kind: Literal["constant"]
    load: float

    def __post_init__(self) -> None:
        _check_load(self.load, "constant.load")

    def build(self, rng: np.random.Generator) -> Trace:
        return _Piecewise(np.array([0.0]), np.array([self.load]), linear=False)


@dataclass(frozen=True)
class Step:
    """Piecewise constant: each `[t_s, load]` row holds from its time on."""

    kind: Literal["step"]
    steps: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        _points(self.steps, "step.steps")

    def build(self, rng: np.random.Generator) -> Trace:
        t, v = _points(self.steps, "step.steps")
        return _Piecewise(t, v, linear=False)


@dataclass(frozen=True)
class Ramp:
    """Piecewise linear through the `[t_s, load]` points (PARTIES Fig. 9)."""

    kind: Literal["ramp"]
    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        _points(self.points, "ramp.points")

    def build(self, rng: np.random.Generator) -> Trace:
        t, v = _points(self.points, "ramp.points")
        return _Piecewise(t, v, linear=True)


@dataclass(frozen=True)
class Sinusoid:
    """A sine between `low` and `high` with period `period_s` (Q-PRM thesis Sec. 3.3 load curve)."""

    kind: Literal["sinusoid"]
    low: float
    high: float
    period_s: float
    phase_s: float = 0.0

    def __post_init__(self) -> None:
        _check_load(self.low, "sinusoid.low")
        _check_load(self.high, "sinusoid.high")
        if self.period_s <= 0:
            raise ConfigError("sinusoid.period_s must be positive")

    def build(self, rng: np.random.Generator) -> Trace:
        mid, amp = (self.high + self.low) / 2, (self.high - self.low) / 2
        return _Func(lambda t: mid + amp * np.sin(2 * np.pi * (t + self.phase_s) / self.period_s))


_grid = np.linspace(0, 2 * np.pi, 100_001)
_shape = 0.5 - 0.5 * np.cos(_grid) + 0.15 * np.sin(2 * _grid)
_DIURNAL_MIN, _DIURNAL_MAX = float(_shape.min()), float(_shape.max())
del _grid, _shape


@dataclass(frozen=True)
class Diurnal:
    """A day's shape between `low` and `high`: trough early in the morning, peak in the evening."""

    kind: Literal["diurnal"]
    low: float
    high: float
    period_s: float = 86400.0
    phase_s: float = 0.0

    def __post_init__(self) -> None:
        _check_load(self.low, "diurnal.low")
        _check_load(self.high, "diurnal.high")
        if self.period_s <= 0:
            raise ConfigError("diurnal.period_s must be positive")

    def build(self, rng: np.random.Generator) -> Trace:
        def f(t: np.ndarray) -> np.ndarray:
            x = 2 * np.pi * (t + self.phase_s) / self.period_s
            # a day: trough early morning, slow climb, peak in the evening (two harmonics)
            shape = (0.5 - 0.5 * np.cos(x) + 0.15 * np.sin(2 * x) - _DIURNAL_MIN) / (
                _DIURNAL_MAX - _DIURNAL_MIN
            )
            return self.low + (self.high - self.low) * np.clip(shape, 0.0, 1.0)

        return _Func(f)


@dataclass(frozen=True)
class Bursty:
    """`base` load with bursts to `burst`: exponential gaps and lengths, linear `ramp_s` edges, drawn
    once at build time up to `horizon_s` (at most a day) and `MAX_BURSTS` bursts."""

    kind: Literal["bursty"]
    base: float
    burst: float
    mean_gap_s: float = 60.0
    mean_burst_s: float = 10.0
    ramp_s: float = 2.0
    horizon_s: float = MAX_HORIZON_S

    def __post_init__(self) -> None:
        _check_load(self.base, "bursty.base")
        _check_load(self.burst, "bursty.burst")
        if self.mean_gap_s <= 0 or self.mean_burst_s <= 0:
            raise ConfigError("bursty.mean_gap_s and mean_burst_s must be positive")
        if self.ramp_s < 0:
            raise ConfigError(f"bursty.ramp_s = {self.ramp_s}: must be >= 0")
        if not 0 < self.horizon_s <= MAX_HORIZON_S:
            raise ConfigError(
                f"bursty.horizon_s = {self.horizon_s}: must be in (0, {MAX_HORIZON_S:g}] (a day)"
            )
        expected = self.horizon_s / (self.mean_gap_s + self.mean_burst_s)
        if expected > MAX_BURSTS / 2:
            raise ConfigError(
                f"bursty: {expected:,.0f} bursts expected over horizon_s = {self.horizon_s:g} s; at most "
                f"{MAX_BURSTS // 2:,} (raise mean_gap_s or mean_burst_s, or lower horizon_s)"
            )

    def build(self, rng: np.random.Generator) -> Trace:
        ts, vs, t = [0.0], [self.base], 0.0
        r = max(self.ramp_s, 1e-3)
        while t < self.horizon_s and len(ts) < 4 * MAX_BURSTS:
            t += rng.exponential(self.mean_gap_s)
            length = rng.exponential(self.mean_burst_s)
            ts += [t, t + r, t + r + length, t + 2 * r + length]
            vs += [self.base, self.burst, self.burst, self.base]
            t += 2 * r + length
        return _Piecewise(np.array(ts), np.array(vs), linear=True)


@dataclass(frozen=True)
class Replay:
    """Replay of a CSV file of `t_s,load` rows, linear in between, scaled in time and load."""

    kind: Literal["csv"]
    path: str
    time_scale: float = 1.0
    load_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ConfigError(f"csv.time_scale = {self.time_scale}: must be > 0 (time runs forwards)")
        if not self.load_scale >= 0:
            raise ConfigError(f"csv.load_scale = {self.load_scale}: must be >= 0")

    def build(self, rng: np.random.Generator) -> Trace:
        t, v = read_trace_csv(self.path)
        v = v * self.load_scale
        for x in v:
            _check_load(float(x), f"csv {self.path}")
        return _Piecewise(t * self.time_scale, v, linear=True)


def read_trace_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows `t_s,load` (a header row is allowed); times non-decreasing. Errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trace file {path}: no such file")
    try:
        return _read_rows(path)
    except UnicodeDecodeError as e:
        raise ConfigError(f"trace file {path}: not a text file (byte {e.start} is not UTF-8)") from None
    except csv.Error as e:
        raise ConfigError(f"trace file {path}: not CSV ({e})") from None
    except OSError as e:
        raise ConfigError(f"trace file {path}: cannot read it ({e.strerror})") from None


def _read_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    ts: list[float] = []
    vs: list[float] = []
    with path.open(newline="", encoding="utf-8") as f:
        for lineno, row in enumerate(csv.reader(f), start=1):
            if not row or (row[0].strip().startswith("#")):
                continue
            if len(row) < 2:
                raise ConfigError(f"{path}:{lineno}: expected `t_s,load`, got {row!r}")
            try:
                t, v = float(row[0]), float(row[1])
            except ValueError:
                if lineno == 1:
                    continue  # header
                raise ConfigError(f"{path}:{lineno}: not numbers: {row!r}") from None
            if not (math.isfinite(t) and math.isfinite(v)) or v < 0:
                raise ConfigError(f"{path}:{lineno}: time and load must be finite and load >= 0: {row!r}")
            if ts and t < ts[-1]:
                raise ConfigError(f"{path}:{lineno}: time {t} goes backwards (previous {ts[-1]})")
            ts.append(t)
            vs.append(v)
    if not ts:
        raise ConfigError(f"{path}: no data rows")
    return np.array(ts), np.array(vs)


TraceSpec = Constant | Step | Ramp | Sinusoid | Diurnal | Bursty | Replay
_KINDS: dict[str, type] = {
    "constant": Constant,
    "step": Step,
    "ramp": Ramp,
    "sinusoid": Sinusoid,
    "diurnal": Diurnal,
    "bursty": Bursty,
    "csv": Replay,
}


def parse_trace(data: object, where: str) -> TraceSpec:
    """A trace spec from YAML data; a bare number means a constant load. Errors name `where`."""
    if isinstance(data, int | float) and not isinstance(data, bool):
        _check_load(data, where)
        return Constant("constant", float(data))
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"{where}: a load trace is a number or a mapping with `kind` in {sorted(_KINDS)}")
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ConfigError(f"{where}.kind: unknown trace kind {kind!r}; choose one of {sorted(_KINDS)}")
    try:
        return build(_KINDS[kind], data, where)
    except ConfigError as e:
        raise ConfigError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
