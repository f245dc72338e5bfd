"""The two reference points every comparison includes (PARTIES Sec. 5.2.3): no management at all,
and PARTIES' fair starting partition held for ever.

* `UnmanagedController` ("unmanaged"): no isolation. Every LC app and BE job shares all cores (one
  core group, the OS scheduler time-shares them), the whole LLC (one CLOS), memory, disk and network;
  frequency is left to the governor (the top level = turbo when busy;
  `env.allocations.unmanaged_allocation`). PARTIES Sec. 5.2.3: "No isolation mechanisms are used
  ... relies on the OS to schedule applications and manage resources".
* `StaticController` ("static"): PARTIES' start (Alg. 1 `initialization()`, Sec. 4.2.1): each
  app an equal partition of every resource at nominal frequency (`env.allocations.fair_allocation`),
  never changed: what a careful operator would configure by hand. `static:FILE.yaml` holds another
  partition: the fair one with the file's per-app values (`load_static_overrides`), e.g. a split
  measured on a real node, run again in the simulator to compare the two on the same allocation.

Both ignore measurements, so an invalid observation changes nothing: they keep asserting their
allocation. Every controller starts from the fair allocation in `evaluate.py` (the node's
initial state); `unmanaged` switches to its allocation at its first decision.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env.allocations import fair_allocation, unmanaged_allocation
from env.config import ConfigError, build, load_yaml
from env.controller import BaseController
from env.types import Allocation, AllocationError, Capabilities, Decision, Observation, validate_allocation


@dataclass(frozen=True)
class StaticAppValues:
    """The `AppAlloc` fields a `static:FILE.yaml` may set for one app (None: the fair share)."""

    cores: float | None = None
    llc_ways: int | None = None
    freq_mhz: int | None = None
    memory_gb: float | None = None
    disk_mbps: float | None = None
    net_gbps: float | None = None
    mba_pct: int | None = None
    cpu_quota: float | None = None
    cpu_shares: int | None = None


StaticOverrides = Mapping[str, Mapping[str, float | int]]
"""app name -> {field: value} (`StaticAppValues`)."""


class _FixedController(BaseController):
    """Holds one allocation computed from the capabilities at reset."""

    name = "fixed"

    def _reset(self) -> None:
        assert self.caps is not None
        self._target: Allocation = self._allocation()

    @abstractmethod
    def _allocation(self) -> Allocation:
        """The allocation to hold, for `self.caps`."""

    def _decide(self, observation: Observation) -> Decision:
        if observation.allocation == self._target:
            return Decision.hold(f"{self.name}: allocation unchanged")
        return Decision(allocation=self._target, reason=f"{self.name}: set the {self.name} allocation")

    def _on_invalid(self, observation: Observation) -> Decision:
        return self._decide(observation)


class UnmanagedController(_FixedController):
    """No isolation, OS-managed (module docstring; PARTIES Sec. 5.2.3)."""

    name = "unmanaged"

    def _allocation(self) -> Allocation:
        assert self.caps is not None
        return unmanaged_allocation(self.caps)


class StaticController(_FixedController):
    """PARTIES' fair start held for ever (module docstring; Alg. 1 `initialization()`), or with
    `overrides` the fair start with those per-app values (`static_allocation`)."""

    name = "static"

    def __init__(self, overrides: StaticOverrides | None = None, where: str = "static") -> None:
        super().__init__()
        self._overrides: StaticOverrides = overrides or {}
        self._where = where

    def _allocation(self) -> Allocation:
        assert self.caps is not None
        return static_allocation(self.caps, self._overrides, self._where)


def load_static_overrides(path: str | Path) -> dict[str, dict[str, float | int]]:
    """The YAML file of a `static:FILE.yaml` spec: a mapping of app names to mappings of
    `StaticAppValues` fields to numbers, e.g. `{nginx: {cores: 1.5}, be: {cores: 0.25, cpu_shares: 2}}`.
    Anything else is a `ConfigError` naming the entry (`env.config.build`); apps and values are
    checked against a node by `static_allocation`."""
    data: Any = load_yaml(path)
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(
            f"{path}: expected a mapping of app names to {{field: value}}, e.g. nginx: {{cores: 1.5}}"
        )
    out: dict[str, dict[str, float | int]] = {}
    for app, fields in data.items():
        if not isinstance(fields, Mapping) or not fields:
            raise ConfigError(f"{path}: {app}: expected a mapping of fields to values, e.g. {{cores: 1.5}}")
        values = build(StaticAppValues, fields, f"{path}: {app}")
        out[str(app)] = {k: v for k, v in dataclasses.asdict(values).items() if v is not None}
    return out


def static_allocation(caps: Capabilities, overrides: StaticOverrides, where: str = "static") -> Allocation:
    """PARTIES' fair start (`fair_allocation`) with `overrides` applied app by app
    (`Allocation.replace_app`: a core-group or CLOS field changes for every app sharing it), checked
    against the node (`validate_allocation`). An app the node does not run, or an allocation it
    cannot hold, is a `ConfigError` naming `where`."""
    alloc = fair_allocation(caps)
    names = [a.name for a in alloc]
    for app, changes in overrides.items():
        if app not in names:
            raise ConfigError(f"{where}: no app {app!r} on this node; its apps: {', '.join(names)}")
        alloc = alloc.replace_app(app, **changes)
    try:
        validate_allocation(alloc, caps)
    except AllocationError as e:
        raise ConfigError(f"{where}: the node cannot hold this allocation: {e}") from None
    return alloc
