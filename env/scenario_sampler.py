"""Random training scenarios: mixes of 1..6 shipped LC apps, loads and load traces (DESIGN §4).

`ScenarioSampler(config).sample(rng)` draws one `Scenario`:

1. a mix size uniformly in `[min_apps, max_apps]`, then a mix of that size uniformly among the
   combinations of `config.apps` that are not held out (sizes whose mixes are all held out are
   skipped);
2. per app a peak load uniform in `[load_min, load_max]` (fraction of its max load) and a trace
   kind uniformly from `trace_kinds`, shaped over the episode (below); when the peaks add up to
   more than `max_total_load` every load is scaled down to that total, so most episodes have an
   allocation that meets every target (PARTIES' LC EMU tops out near 200-250%, Fig. 7); with
   `total_load_min` that cap is itself drawn per episode, uniform in `[total_load_min,
   max_total_load]`, so large mixes also run at a modest total (e.g. five apps at 10-15% of their
   max loads each, where five uniform peaks almost always add up past a fixed cap); with
   `primary_load` one app of the mix (uniformly) is the *primary*: its peak is drawn from that
   range instead and left unscaled, and only the others are scaled, to what is left of the total
   (PARTIES Sec. 5.2.1, Fig. 5-6: an app near its max load beside co-runners at a modest fraction
   of theirs, e.g. MongoDB at 100% beside five apps at 10%, a mix the total cap alone never draws);
3. the BE jobs with probability `be_probability` (none otherwise, so the policy also learns a
   node where DOWN moves leave resources idle), and a duration uniform in `duration_s`.

`also` adds other kinds of node: each `AlsoDraw` is drawn instead, with its `probability`, by its
own sampler config (its platform, apps, BE jobs, loads), so one policy learns nodes of different
sizes (e.g. the Q-PRM thesis' 9-core node, Sec. 6.1, beside PARTIES' 14 cores). A config without
`also` draws exactly what it drew before.

Trace shapes, with peak p, trough b = p * U(0.2, 0.8) and episode length D:

| kind       | shape                                                                     |
|------------|---------------------------------------------------------------------------|
| `constant` | p                                                                         |
| `step`     | 1-3 steps at random times, each level U(load_min, p); one level is p      |
| `ramp`     | b, up to p, hold, back down to b, at random times (PARTIES Fig. 9 shape)  |
| `sinusoid` | b..p, period U(D/4, D), random phase (Q-PRM Sec. 3.3)                     |
| `diurnal`  | b..p, one "day" per episode, random phase                                 |
| `bursty`   | base b with bursts to p, mean gap U(D/6, D/2), mean burst U(3, 15) s      |

Held-out mixes (`HELDOUT_MIXES`) are never drawn when `exclude_heldout` is true, so that
evaluation can report performance on mixes a policy never trained on (use `is_heldout`). Loads
are continuous, so held-out *loads* are evaluated on these held-out mixes by the `maxload` grid.
Everything is drawn from the injected `numpy.random.Generator`: same generator state, same scenario.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from env.config import ConfigError
from env.sim.profiles import BatchProfile, LcProfile, load_profile
from env.sim.scenario import AppEntry, Scenario

SHIPPED_LC_APPS: tuple[str, ...] = ("memcached", "xapian", "nginx", "moses", "mongodb", "sphinx")
TRACE_KINDS: tuple[str, ...] = ("constant", "step", "ramp", "sinusoid", "diurnal", "bursty")

# Mixes kept for evaluation: two pairs, two triples (one is PARTIES Fig. 9's memcached + xapian +
# moses), one quadruple and one quintuple. Singles and the full six-app mix stay in training (there
# is only one six-app mix; every single app must be seen).
HELDOUT_MIXES: tuple[frozenset[str], ...] = (
    frozenset({"memcached", "xapian"}),
    frozenset({"nginx", "moses"}),
    frozenset({"memcached", "xapian", "moses"}),
    frozenset({"nginx", "mongodb", "sphinx"}),
    frozenset({"memcached", "xapian", "nginx", "moses"}),
    frozenset({"memcached", "xapian", "nginx", "moses", "mongodb"}),
)


def mix_of(scenario: Scenario) -> frozenset[str]:
    """The set of app profiles a scenario runs."""
    return frozenset(e.app for e in scenario.apps)


def is_heldout(scenario: Scenario, heldout: tuple[frozenset[str], ...] = HELDOUT_MIXES) -> bool:
    """Whether the scenario's mix of apps is kept out of training for evaluation (`HELDOUT_MIXES`)."""
    return mix_of(scenario) in heldout


@dataclass(frozen=True)
class SamplerConfig:
    """What `ScenarioSampler` draws from (module docstring). Loads are fractions of max load."""

    apps: tuple[str, ...] = SHIPPED_LC_APPS
    min_apps: int = 1
    max_apps: int | None = None  # None: up to every app of `apps`
    trace_kinds: tuple[str, ...] = TRACE_KINDS
    load_min: float = 0.05
    load_max: float = 0.9
    max_total_load: float = 2.5
    total_load_min: float | None = None  # the cap drawn per episode from [this, max_total_load]
    primary_load: tuple[float, float] | None = None  # one app's peak from this range, unscaled
    be_jobs: tuple[str, ...] = ("be_parties",)
    be_probability: float = 0.9
    duration_s: tuple[float, float] = (60.0, 180.0)
    platform: str = "parties"
    exclude_heldout: bool = True
    also: tuple[AlsoDraw, ...] = ()  # other node kinds, drawn instead with their probabilities

    def __post_init__(self) -> None:
        where = "sampler"
        if not self.apps:
            raise ConfigError(f"{where}.apps: needs at least one app")
        if len(set(self.apps)) != len(self.apps):
            raise ConfigError(f"{where}.apps: duplicate apps {list(self.apps)}")
        for a in self.apps:
            if not isinstance(load_profile(a), LcProfile):
                raise ConfigError(f"{where}.apps: {a!r} is not an LC app")
        for b in self.be_jobs:
            if not isinstance(load_profile(b), BatchProfile):
                raise ConfigError(f"{where}.be_jobs: {b!r} is not a batch job")
        if not (1 <= self.min_apps <= self.mix_max <= len(self.apps)):
            raise ConfigError(
                f"{where}: need 1 <= min_apps <= max_apps <= {len(self.apps)} (the number of apps)"
            )
        bad = [k for k in self.trace_kinds if k not in TRACE_KINDS]
        if bad or not self.trace_kinds:
            raise ConfigError(f"{where}.trace_kinds: {bad or 'empty'}; choose from {list(TRACE_KINDS)}")
        if not (0 < self.load_min <= self.load_max <= 5.0):
            raise ConfigError(f"{where}: need 0 < load_min <= load_max <= 5")
        if self.max_total_load < self.load_min:
            raise ConfigError(f"{where}.max_total_load must be >= load_min")
        if self.total_load_min is not None and not (
            self.load_min <= self.total_load_min <= self.max_total_load
        ):
            raise ConfigError(
                f"{where}.total_load_min: need load_min <= total_load_min <= max_total_load, got {self.total_load_min}"
            )
        if self.primary_load is not None:
            lo, hi = self.primary_load
            if not (0 < lo <= hi <= 5.0):
                raise ConfigError(f"{where}.primary_load: need 0 < low <= high <= 5, got {self.primary_load}")
        if not (0.0 <= self.be_probability <= 1.0):
            raise ConfigError(f"{where}.be_probability must be in [0, 1]")
        lo, hi = self.duration_s
        if not (0 < lo <= hi):
            raise ConfigError(f"{where}.duration_s: need 0 < low <= high, got {self.duration_s}")
        if sum(a.probability for a in self.also) > 1.0:
            raise ConfigError(f"{where}.also: the probabilities add up to more than 1")

    @property
    def mix_max(self) -> int:
        """The largest mix drawn (here; an `also` draw may draw larger ones)."""
        return len(self.apps) if self.max_apps is None else self.max_apps

    def capped(self, max_apps: int) -> SamplerConfig:
        """This config with no mix, its own or an `also` draw's, larger than `max_apps`."""
        also = tuple(dataclasses.replace(a, sampler=a.sampler.capped(max_apps)) for a in self.also)
        mine = self.max_apps if self.mix_max <= max_apps else max_apps
        return dataclasses.replace(self, max_apps=mine, also=also)


@dataclass(frozen=True)
class AlsoDraw:
    """Another kind of node a `SamplerConfig` draws, with `probability`, from `sampler`."""

    probability: float
    sampler: SamplerConfig

    def __post_init__(self) -> None:
        if not (0.0 < self.probability <= 1.0):
            raise ConfigError("sampler.also[].probability must be in (0, 1]")
        if self.sampler.also:
            raise ConfigError("sampler.also[].sampler: no nested `also`")


class ScenarioSampler:
    """Draws training scenarios (module docstring)."""

    def __init__(
        self, config: SamplerConfig | None = None, heldout: tuple[frozenset[str], ...] = HELDOUT_MIXES
    ) -> None:
        self.config = c = config or SamplerConfig()
        self.heldout = heldout
        excluded = set(heldout) if c.exclude_heldout else set()
        self.mixes: dict[int, list[tuple[str, ...]]] = {}
        for n in range(c.min_apps, c.mix_max + 1):
            mixes = [m for m in itertools.combinations(c.apps, n) if frozenset(m) not in excluded]
            if mixes:
                self.mixes[n] = mixes
        if not self.mixes:
            raise ConfigError("sampler: every mix of the allowed sizes is held out")
        self.also = [(a.probability, ScenarioSampler(a.sampler, heldout)) for a in c.also]

    @property
    def max_be_components(self) -> int:
        """Kernel components the BE jobs need at most (sizes the batched simulator)."""
        own = sum(
            len(p.classes)
            for p in (load_profile(b) for b in self.config.be_jobs)
            if isinstance(p, BatchProfile)
        )
        return max([own] + [s.max_be_components for _, s in self.also])

    def sample(self, rng: np.random.Generator) -> Scenario:
        if self.also:
            u = float(rng.random())
            for probability, other in self.also:
                if u < probability:
                    return other.sample(rng)
                u -= probability
        c = self.config
        sizes = sorted(self.mixes)
        n = sizes[int(rng.integers(len(sizes)))]
        mix = self.mixes[n][int(rng.integers(len(self.mixes[n])))]
        duration = float(rng.uniform(*c.duration_s)) if c.duration_s[1] > c.duration_s[0] else c.duration_s[0]
        duration = round(duration, 1)
        peaks = rng.uniform(c.load_min, c.load_max, size=n)
        cap = c.max_total_load
        if c.total_load_min is not None:  # drawn only then: a config without it draws what it drew
            cap = float(rng.uniform(c.total_load_min, c.max_total_load))
        scales = np.full(n, min(1.0, cap / float(peaks.sum())))
        primary = None
        if c.primary_load is not None:  # drawn only then: a config without it draws what it drew
            primary = int(rng.integers(n))
            peaks[primary] = rng.uniform(*c.primary_load)
            others = float(peaks.sum() - peaks[primary])
            room = max(cap - peaks[primary], c.load_min * (n - 1))
            scales[:] = min(1.0, room / others) if others > 0.0 else 1.0
            scales[primary] = 1.0
        apps = []
        for app, peak, scale in zip(mix, peaks, scales):
            kind = c.trace_kinds[int(rng.integers(len(c.trace_kinds)))]
            trace = self._trace(kind, float(peak * scale), duration, float(scale), rng)
            apps.append(AppEntry(app=app, load=trace))
        scale = float(scales.min())
        lead = "" if primary is None else f", {mix[primary]} the primary at {peaks[primary]:.3f}"
        be = tuple(c.be_jobs) if rng.random() < c.be_probability else ()
        return Scenario(
            name="sampled:" + "+".join(mix),
            description=f"sampled {n}-app mix, loads scaled by {scale:.3f}{lead}",
            apps=tuple(apps),
            platform=c.platform,
            be=be,
            duration_s=duration,
            warmup_s=0.0,
            seed=int(rng.integers(2**31)),
        )

    def _trace(self, kind: str, peak: float, duration: float, scale: float, rng: np.random.Generator) -> Any:
        """A YAML-shaped trace spec (what a scenario file would hold), loads rounded to 1e-4."""
        lo = self.config.load_min * scale

        def r(x: float) -> float:
            return round(float(x), 4)

        trough = peak * rng.uniform(0.2, 0.8)
        if kind == "constant":
            return r(peak)
        if kind == "step":
            k = int(rng.integers(1, 4))
            times = np.sort(rng.uniform(0.0, duration, size=k))
            levels = rng.uniform(lo, peak, size=k + 1)
            levels[int(rng.integers(k + 1))] = peak
            steps = [[0.0, r(levels[0])]] + [[r(t), r(v)] for t, v in zip(times, levels[1:])]
            return {"kind": "step", "steps": steps}
        if kind == "ramp":
            t = np.sort(rng.uniform(0.0, duration, size=4))
            points = [
                [0.0, r(trough)],
                [r(t[0]), r(trough)],
                [r(t[1]), r(peak)],
                [r(t[2]), r(peak)],
                [r(t[3]), r(trough)],
            ]
            return {"kind": "ramp", "points": points}
        if kind == "sinusoid":
            period = rng.uniform(duration / 4, duration)
            return {
                "kind": "sinusoid",
                "low": r(trough),
                "high": r(peak),
                "period_s": r(period),
                "phase_s": r(rng.uniform(0, period)),
            }
        if kind == "diurnal":
            return {
                "kind": "diurnal",
                "low": r(trough),
                "high": r(peak),
                "period_s": r(duration),
                "phase_s": r(rng.uniform(0, duration)),
            }
        if kind == "bursty":
            return {
                "kind": "bursty",
                "base": r(trough),
                "burst": r(peak),
                "mean_gap_s": r(rng.uniform(duration / 6, duration / 2)),
                "mean_burst_s": r(rng.uniform(3.0, 15.0)),
                "ramp_s": 1.0,
                "horizon_s": r(duration + 60.0),
            }
        raise ValueError(f"unknown trace kind {kind!r}")
