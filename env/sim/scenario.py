"""Scenarios: what runs on the node during an episode (DESIGN §4, §5).

A scenario YAML (`configs/scenarios/*.yaml`) names the platform, the LC apps with a load trace
each, the BE jobs, the duration and warm-up, and a seed:

```yaml
name: fig9-ramp
description: PARTIES Fig. 9 - memcached ramps 10% -> 60% and back; xapian 20%, moses 10%
platform: parties          # configs/node/<platform>.yaml
duration_s: 200
warmup_s: 0                # intervals before this are not scored
seed: 0
apps:                      # LC apps; `name` defaults to `app` and must be unique
  - app: memcached         # configs/apps/<app>.yaml
    load: {kind: ramp, points: [[0, 0.1], [25, 0.1], [55, 0.6], [115, 0.6], [145, 0.1]]}
  - {app: xapian, load: 0.2}          # a bare number is a constant load (fraction of max load)
  - {app: moses, load: 0.1}
be: [be_parties]           # best-effort jobs (batch profiles); [] for none
```

`page_cache` says how the apps' page caches start: `cold` (the default), as apps started inside
their cgroups under the first allocation, so the caches hold what that allocation lets them; or
`warm`, as services that ran unmanaged before the manager took them over: their cached pages stay
charged where they were faulted in, outside the cgroups the manager then moves them to, so no memory
limit reclaims them, only a shortage of the node's memory does (model step 4).

`duration_s` is at most a day of simulated time (`MAX_HORIZON_S`), `seed` is >= 0. Load traces are
documented in `env.sim.traces`. `overrides` on an app entry changes deployment
parameters only (`threads`, `dataset_gb`, `net_flows`): the app's intrinsic service time stays the
one derived at its reference deployment. `perturb` multiplies physical parameters by factors
(domain randomisation for training, e.g. `{service: 1.2, frac_mem: 0.8}`; see `PERTURBABLE`). `antagonists` (calibration only) adds PARTIES Table 3
interference: `{profile: llc_capacity, target: memcached}`; an antagonist that runs on an LC app's
own hyperthreads (`ant_cpu`, `ant_hyperthread`) needs that target, so it cannot be a BE job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from env.allocations import fair_allocation
from env.config import ConfigError, build, load_yaml, resolve_config
from env.sim.platform import Platform, load_platform
from env.sim.profiles import MAX_THREADS, BatchProfile, LcProfile, known_profiles, load_profile
from env.sim.traces import MAX_HORIZON_S, TraceSpec, parse_trace
from env.types import AppSpec

DEPLOYMENT_FIELDS = ("threads", "dataset_gb", "net_flows")
PAGE_CACHE_STARTS = ("warm", "cold")  # Scenario.page_cache (module docstring)
# domain randomisation: multiplicative factors on physical parameters (`service` scales the
# derived knee quantity: the service time, or the disk reads per request of an I/O-bound app)
PERTURBABLE = (
    "service",
    "frac_llc",
    "frac_mem",
    "smt_speed",
    "llc_kappa_mb",
    "llc_alpha",
    "base_latency_us",
    "service_cv2",
    "zipf",
)


@dataclass(frozen=True)
class AppEntry:
    """One LC app of a scenario: its profile, instance name, load trace (a fraction of max load or a
    trace spec, `env.sim.traces`), deployment overrides and domain-randomisation factors."""

    app: str
    name: str = ""
    load: Any = 0.5
    overrides: dict[str, float] = field(default_factory=dict)
    perturb: dict[str, float] = field(default_factory=dict)

    @property
    def instance(self) -> str:
        return self.name or self.app


@dataclass(frozen=True)
class AntagonistEntry:
    """A PARTIES Table 3 antagonist (a batch profile) and the LC app it stresses (calibration only)."""

    profile: str
    target: str = ""


@dataclass(frozen=True)
class Scenario:
    """What runs on the node for one episode (module docstring); validated when built."""

    name: str
    apps: tuple[AppEntry, ...]
    description: str = ""
    platform: str = "parties"
    be: tuple[str, ...] = ("be_parties",)
    antagonists: tuple[AntagonistEntry, ...] = ()
    duration_s: float = 120.0
    warmup_s: float = 30.0
    seed: int = 0
    page_cache: str = "cold"

    def __post_init__(self) -> None:
        validate_scenario(self)

    # -- resolved pieces ----------------------------------------------------------------------
    @cached_property
    def platform_spec(self) -> Platform:
        return load_platform(self.platform)

    @cached_property
    def lc_profiles(self) -> tuple[LcProfile, ...]:
        out = []
        for e in self.apps:
            prof = load_profile(e.app)
            assert isinstance(prof, LcProfile)
            out.append(prof)
        return tuple(out)

    @cached_property
    def traces(self) -> tuple[TraceSpec, ...]:
        return tuple(parse_trace(e.load, f"{self.name}.apps[{i}].load") for i, e in enumerate(self.apps))

    @property
    def app_names(self) -> tuple[str, ...]:
        return tuple(e.instance for e in self.apps)

    @property
    def be_names(self) -> tuple[str, ...]:
        return tuple(self.be)

    def with_loads(self, loads: dict[str, Any]) -> Scenario:
        """A copy with some apps' load traces replaced (a number is a constant load)."""
        apps = tuple(dataclasses.replace(e, load=loads.get(e.instance, e.load)) for e in self.apps)
        return dataclasses.replace(self, apps=apps)


def validate_scenario(s: Scenario) -> None:
    """Check `s` against the shipped platforms and profiles; a `ConfigError` names the bad field."""
    where = f"scenario {s.name!r}"
    try:
        s.platform_spec  # noqa: B018 - loads and validates the platform
    except ConfigError as err:
        raise ConfigError(f"{where}.platform: {err}") from None
    if not s.apps and not s.be:
        raise ConfigError(f"{where}: needs at least one app or BE job")
    names = [e.instance for e in s.apps] + list(s.be)
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"{where}: duplicate app/BE names {sorted(dup)}; give instances a `name`")
    for i, e in enumerate(s.apps):
        try:
            prof = load_profile(e.app)
        except ConfigError:
            raise ConfigError(
                f"{where}.apps[{i}].app: unknown app {e.app!r}; known: {known_profiles()}"
            ) from None
        if not isinstance(prof, LcProfile):
            raise ConfigError(
                f"{where}.apps[{i}].app: {e.app!r} is a batch job, not an LC app (put it under `be`)"
            )
        bad = set(e.overrides) - set(DEPLOYMENT_FIELDS)
        if bad:
            raise ConfigError(
                f"{where}.apps[{i}].overrides: {sorted(bad)} not allowed; allowed: {list(DEPLOYMENT_FIELDS)}"
            )
        _check_overrides(e.overrides, f"{where}.apps[{i}].overrides")
        bad = set(e.perturb) - set(PERTURBABLE)
        if bad:
            raise ConfigError(
                f"{where}.apps[{i}].perturb: {sorted(bad)} not allowed; allowed: {list(PERTURBABLE)}"
            )
        for k, v in e.perturb.items():
            if not 0.1 <= v <= 10.0:
                raise ConfigError(f"{where}.apps[{i}].perturb.{k} = {v}: a factor in [0.1, 10]")
        parse_trace(e.load, f"{where}.apps[{i}].load")
    for i, b in enumerate(s.be):
        try:
            prof = load_profile(b)
        except ConfigError:
            raise ConfigError(f"{where}.be[{i}]: unknown BE job {b!r}; known: {known_profiles()}") from None
        if not isinstance(prof, BatchProfile):
            raise ConfigError(f"{where}.be[{i}]: {b!r} is an LC app, not a batch job")
        if prof.placement in ("same_threads", "sibling_threads"):
            raise ConfigError(
                f"{where}.be[{i}]: {b!r} runs on an LC app's own hyperthreads (placement {prof.placement}), "
                "so it is an antagonist, not a BE job: list it under `antagonists` with a `target` app"
            )
    for i, a in enumerate(s.antagonists):
        try:
            prof = load_profile(a.profile)
        except ConfigError:
            raise ConfigError(f"{where}.antagonists[{i}].profile: unknown {a.profile!r}") from None
        if not isinstance(prof, BatchProfile):
            raise ConfigError(f"{where}.antagonists[{i}]: {a.profile!r} is not a batch profile")
        if prof.placement in ("same_threads", "sibling_threads") and a.target not in [
            e.instance for e in s.apps
        ]:
            raise ConfigError(
                f"{where}.antagonists[{i}].target: {a.target!r} is not an LC app of the scenario"
            )
    if not 0 <= s.warmup_s < s.duration_s:  # also false for NaN
        raise ConfigError(f"{where}: need duration_s > warmup_s >= 0 (got {s.duration_s}, {s.warmup_s})")
    if not s.duration_s <= MAX_HORIZON_S:
        raise ConfigError(f"{where}.duration_s = {s.duration_s:g}: at most {MAX_HORIZON_S:g} s (a day)")
    if s.seed < 0:
        raise ConfigError(f"{where}.seed = {s.seed}: a seed is an integer >= 0")
    if s.page_cache not in PAGE_CACHE_STARTS:
        raise ConfigError(f"{where}.page_cache = {s.page_cache!r}: one of {list(PAGE_CACHE_STARTS)}")
    _check_fits(s, where)


def _check_fits(s: Scenario, where: str) -> None:
    """The platform can give every app and BE job PARTIES' fair start (a core step, the minimum
    LLC ways and memory each), the allocation every run starts from."""
    apps = [AppSpec(e.instance, "lc") for e in s.apps] + [AppSpec(b, "be") for b in s.be]
    try:
        fair_allocation(s.platform_spec.capabilities(apps))
    except ValueError as e:
        raise ConfigError(
            f"{where}: {len(s.apps)} LC apps and {len(s.be)} BE jobs do not fit on platform "
            f"{s.platform_spec.name!r} ({e}); use fewer apps or a larger platform"
        ) from None


def _check_overrides(overrides: dict[str, float], where: str) -> None:
    """Deployment overrides (`DEPLOYMENT_FIELDS`): a whole number of threads, a positive data set
    size and number of client connections."""
    for k, v in overrides.items():
        if k == "threads" and not (float(v).is_integer() and 1 <= v <= MAX_THREADS):
            raise ConfigError(f"{where}.threads = {v}: a whole number of threads in 1..{MAX_THREADS}")
        if k != "threads" and not 0 < v <= 1e6:
            raise ConfigError(f"{where}.{k} = {v}: must be in (0, 1e6]")


def parse_scenario(data: Any, where: str) -> Scenario:
    """A `Scenario` from YAML data; an app may be a bare profile name. Strict (`env.config.build`)."""
    if isinstance(data, dict) and "apps" in data and isinstance(data["apps"], list):
        data = dict(data)
        apps = []
        for i, e in enumerate(data["apps"]):
            if isinstance(e, str):
                e = {"app": e}
            apps.append(build(AppEntry, e, f"{where}.apps[{i}]"))
        data["apps"] = [dataclasses.asdict(a) for a in apps]
    return build(Scenario, data, where)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A scenario by name (`configs/scenarios/<name>.yaml`) or by path. A relative CSV trace path is
    taken relative to the scenario file."""
    path = resolve_config("scenarios", name_or_path)
    data = load_yaml(path)
    apps = data.get("apps") if isinstance(data, dict) else None
    for e in apps if isinstance(apps, list) else []:
        load = e.get("load") if isinstance(e, dict) else None
        if isinstance(load, dict) and load.get("kind") == "csv" and isinstance(load.get("path"), str):
            p = Path(load["path"])
            if not p.is_absolute() and (path.parent / p).is_file():
                load["path"] = str(path.parent / p)
    return parse_scenario(data, path.name)


def simple_scenario(
    apps: dict[str, Any] | list[str],
    *,
    platform: str = "parties",
    be: tuple[str, ...] = ("be_parties",),
    duration_s: float = 90.0,
    warmup_s: float = 30.0,
    seed: int = 0,
    name: str = "adhoc",
    antagonists: tuple[AntagonistEntry, ...] = (),
    overrides: dict[str, dict[str, float]] | None = None,
    page_cache: str = "cold",
) -> Scenario:
    """A scenario from code: `apps` maps profile (or `profile:instance`) to a load."""
    if isinstance(apps, list):
        apps = {a: 0.5 for a in apps}
    entries = []
    for key, load in apps.items():
        prof, _, inst = key.partition(":")
        entries.append(
            AppEntry(app=prof, name=inst, load=load, overrides=(overrides or {}).get(inst or prof, {}))
        )
    return Scenario(
        name=name,
        apps=tuple(entries),
        platform=platform,
        be=tuple(be),
        antagonists=antagonists,
        duration_s=duration_s,
        warmup_s=warmup_s,
        seed=seed,
        page_cache=page_cache,
    )
