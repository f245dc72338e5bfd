"""The serving config (configs/serve/*.yaml, `serve.py --config`): typed, documented where each
setting is declared, strictly checked (an unknown key is an error that names the field).

`ServeConfig` holds the node to serve (`linux`, or `sim` for a rehearsal), the guard chain in front
of it (the serving defaults, `GuardsConfig.serving()`, unless the YAML turns a guard off), and the
settings of the supervisor's safety pieces: safe mode on a stale or silent latency feed, the
handover of a learned controller to a rule-based fallback, actuation retries, the metrics endpoint
and the run's outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from env.config import ConfigError, build, load_yaml
from env.guards import GuardsConfig
from harness.registry import is_learned


@dataclass(frozen=True)
class SimSection:
    """`--sim`: a SimNode on a scenario, for a rehearsal. `speed` is simulated seconds per real
    second (1 = real time; 0 = as fast as the machine goes)."""

    scenario: str = "mix3-const"  # configs/scenarios/<name>.yaml or a path
    speed: float = 1.0
    seed: int | None = None  # None: the scenario's

    def __post_init__(self) -> None:
        if not (self.speed >= 0):
            raise ConfigError(f"sim.speed: {self.speed} must be >= 0")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"sim.seed: {self.seed} must be >= 0")


@dataclass(frozen=True)
class ProcessMatch:
    """How the processes of an app are found (`hw.procs`): exactly one of `pidfile` (the pid a
    service manager wrote; refused when users other than its owner, root or this one, can write
    it) or `cmdline` (the exact command line, arguments joined by single spaces as `ps -o args`
    shows them). Never the process name alone: any user can name a process `memcached`. To manage
    processes by cgroup, point the app at that cgroup in the node config (`cgroup: PATH`)."""

    pidfile: str | None = None
    cmdline: str | None = None

    def __post_init__(self) -> None:
        if (self.pidfile is None) == (self.cmdline is None) or not (self.pidfile or self.cmdline):
            raise ConfigError("give exactly one of pidfile or cmdline (not empty)")

    def describe(self) -> str:
        return f"with pid file {self.pidfile}" if self.pidfile else f"with command line {self.cmdline!r}"


@dataclass(frozen=True)
class LinuxSection:
    """The real node: a LinuxNode config (hw/config.py, configs/node/linux-*.yaml).

    `processes` maps an app to its running processes (`ProcessMatch`: a pid file or an exact command
    line): at start-up they and their descendants are moved into the app's cgroup (created by the
    node and removed again on close; the processes go back where they were). `feed` overrides the
    node config's latency feed URL."""

    config: str
    processes: dict[str, ProcessMatch] = field(default_factory=dict)
    feed: str | None = None


@dataclass(frozen=True)
class SafeModeConfig:
    """Safe mode on a stale or silent latency feed (an invalid observation)."""

    enabled: bool = True
    enter_after_ticks: int = 1  # consecutive invalid ticks before entering
    exit_after_ticks: int = 2  # consecutive valid ticks before leaving

    def __post_init__(self) -> None:
        if self.enter_after_ticks < 1 or self.exit_after_ticks < 1:
            raise ConfigError("safe_mode: enter_after_ticks and exit_after_ticks must be >= 1")


@dataclass(frozen=True)
class FallbackConfig:
    """Handing a learned controller over to a rule-based one when it lets QoS violations persist.

    `applies_to`: `auto` supervises learned and BO controllers (specs `rl:*`, `bo`), `always`
    any controller, `never` none. Hand over when, over the trailing `window_s` (the active
    controller having been in charge at least that long), QoS was missed in at least
    `min_violation_frac` of the valid intervals, or after `max_controller_errors` decide() errors in
    a row. `hand_back: after_stable` returns control once the fallback has met every target in
    every valid interval of the last `stable_s`; after `max_handovers` handovers the fallback
    keeps control for good (no flapping). Invalid intervals (a dead feed) count neither way: that
    is safe mode's business."""

    controller: str = "parties"
    applies_to: Literal["auto", "always", "never"] = "auto"
    window_s: float = 10.0
    min_violation_frac: float = 0.8
    max_controller_errors: int = 3
    hand_back: Literal["never", "after_stable"] = "after_stable"
    stable_s: float = 60.0
    max_handovers: int = 3

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not self.stable_s > 0:
            raise ConfigError("fallback: window_s and stable_s must be > 0")
        if not 0 < self.min_violation_frac <= 1:
            raise ConfigError(f"fallback.min_violation_frac: {self.min_violation_frac} outside (0, 1]")
        if self.max_controller_errors < 1 or self.max_handovers < 1:
            raise ConfigError("fallback: max_controller_errors and max_handovers must be >= 1")


@dataclass(frozen=True)
class RetryConfig:
    """Backoff after a failed actuation: the k-th consecutive failure defers the next attempt by
    min(base_s x factor^(k-1), max_s) on the loop's clock (a rollback to the last good allocation
    is never deferred)."""

    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.factor >= 1 and self.max_s >= self.base_s):
            raise ConfigError("retry: need base_s >= 0, factor >= 1 and max_s >= base_s")

    def delay_s(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.base_s * self.factor ** (failures - 1), self.max_s)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus `/metrics` and `/healthz`. `/healthz` answers 503 when the last tick is older
    than `stale_after_intervals` intervals (a hung loop) or the supervisor is not running."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9178  # 0 = any free port (tests)
    stale_after_intervals: float = 4.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"metrics.port: {self.port} outside 0..65535")
        if not self.stale_after_intervals > 0:
            raise ConfigError("metrics.stale_after_intervals must be > 0")


@dataclass(frozen=True)
class OutputConfig:
    """Where a run writes: `dir/<UTC time>-<controller>/` (or serve.py --out) holding config.yaml
    (the resolved config), decisions.jsonl, tb/ (TensorBoard), serve.log and summary.json."""

    dir: str = "runs/serve"
    jsonl: bool = True
    tensorboard: bool = True
    console: bool = True  # one status line per tick on stdout (serve.py --quiet turns it off)


@dataclass(frozen=True)
class ServeConfig:
    """A serving run (configs/serve/*.yaml). Exactly the sections below; unknown keys are errors.

    `linux` is the real node, `sim` the rehearsal node (`serve.py --sim`); a config may have both.
    `interval_s` None keeps the node's interval (serve.py --interval-ms overrides); `duration_s`
    None serves until SIGTERM/SIGINT. `gc_between_ticks`: the heap built at start-up is frozen
    (`gc.freeze`) and automatic collection is replaced by one young collection after every tick's
    outputs (older generations every minute / ten minutes): measured here, automatic collections
    cost 5-10 ms (young) and 80-90 ms (full) at random points inside a tick. `guards` is the chain in front of the node: keys not given
    keep the serving defaults (`GuardsConfig.serving()`: every guard on), null turns a guard off."""

    name: str = "serve"
    description: str = ""
    linux: LinuxSection | None = None
    sim: SimSection | None = None
    interval_s: float | None = None
    duration_s: float | None = None
    seed: int = 0
    gc_between_ticks: bool = True  # Python's GC in the idle gap after each tick, never inside one
    guards: GuardsConfig = field(default_factory=GuardsConfig.serving)
    safe_mode: SafeModeConfig = field(default_factory=SafeModeConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.interval_s is not None and not self.interval_s > 0:
            raise ConfigError(f"interval_s: {self.interval_s} must be > 0")
        if self.duration_s is not None and not self.duration_s >= 0:
            raise ConfigError(f"duration_s: {self.duration_s} must be >= 0")
        if self.seed < 0:
            raise ConfigError(f"seed: {self.seed} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_serve_config(data: Any, where: str) -> ServeConfig:
    """`ServeConfig` from YAML data, strictly (`env.config.build`; guards merged over the serving
    defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of serve settings, got {type(data).__name__}")
    data = dict(data)
    _refuse_process_names(data.get("linux"), where)
    g = data.get("guards")
    if isinstance(g, Mapping):
        data["guards"] = {**GuardsConfig.serving().to_dict(), **g}
    elif "guards" in data and g is None:
        data["guards"] = GuardsConfig.serving().to_dict()
    return build(ServeConfig, data, where)


def _refuse_process_names(linux: Any, where: str) -> None:
    """A process given by name alone (`memcached: memcached`, the old form) is refused with the why."""
    procs = linux.get("processes") if isinstance(linux, Mapping) else None
    for app, match in procs.items() if isinstance(procs, Mapping) else ():
        if isinstance(match, str):
            raise ConfigError(
                f"{where}.linux.processes.{app}: {match!r} is a process name, and any user can start a "
                "process of that name; give {pidfile: PATH} or {cmdline: 'THE EXACT COMMAND LINE'}, or "
                "point the app at its cgroup in the node config (cgroup: PATH)"
            )


def load_serve_config(path: str | Path) -> ServeConfig:
    """The serving config at `path` (configs/serve/*.yaml), strictly checked (`parse_serve_config`)."""
    p = Path(path)
    return parse_serve_config(load_yaml(p), p.name)


def wants_fallback(spec: str, cfg: FallbackConfig) -> bool:
    """Whether controller `spec` runs under a fallback (FallbackConfig.applies_to; `auto`: a learned
    controller, itself or inside a wrapper, `harness.registry.is_learned`)."""
    if cfg.applies_to == "never" or spec.strip() == cfg.controller.strip():
        return False
    if cfg.applies_to == "always":
        return True
    return is_learned(spec)
