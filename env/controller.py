"""The `Controller` protocol (DESIGN §3) and `BaseController`.

A controller is a tick function: `decide(observation) -> Decision`, called once per interval by
`env.loop`. It never sleeps and never does I/O; behaviour over several ticks (PARTIES'
measure-then-revert, Heracles' 15 s polling, cooldowns) is explicit state advanced by the
observations' timestamps. Baselines, RL policies and the BO agent all implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

import numpy as np

from env.types import Capabilities, Decision, Observation

if TYPE_CHECKING:
    from env.sim.node import SimNode
    from env.sim.scenario import Scenario


@runtime_checkable
class Controller(Protocol):
    """The tick function every controller implements (module docstring): `reset` once per run with
    the node's capabilities and an injected generator, then `decide` once per interval."""

    name: str

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None: ...

    def decide(self, observation: Observation) -> Decision: ...


@dataclass(frozen=True)
class ControllerContext:
    """What a controller factory may use to build a controller for one run.

    `capabilities` describe the node. In simulation, `scenario` is the scenario being run and `sim`
    the node under evaluation (a `SimNode`); both are None on a real node. Some controllers need the
    simulator offline (an oracle searches it, Heracles fits its DRAM bandwidth model, Sec. 4.4; CoCo
    profiles slowdowns, Sec. 3.1). A factory must not step `sim`: it is the node being evaluated;
    it builds a fresh `SimNode(scenario, seed=...)` to experiment."""

    capabilities: Capabilities
    scenario: Scenario | None = None
    sim: SimNode | None = None
    seed: int = 0


ControllerFactory: TypeAlias = Callable[[ControllerContext, "str | None"], Controller]
"""`factory(context, arg)`: the controller of a spec `name[:arg]` for one run."""


class BaseController(ABC):
    """Common plumbing: `decide` checks the observation and delegates to `_decide`.

    On an invalid observation (a failed latency feed) the default is to hold the current
    allocation; subclasses override `_on_invalid` to do otherwise.
    """

    name = "base"

    def __init__(self) -> None:
        self.caps: Capabilities | None = None
        self.rng: np.random.Generator = np.random.default_rng(0)

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None:
        self.caps = capabilities
        self.rng = rng
        self._reset()

    def run_stats(self) -> dict[str, object]:
        """What the controller reports about its run beyond the per-tick records (e.g. how many
        samples a search took to meet QoS), JSON-friendly; read once the run has ended. Empty by
        default."""
        return {}

    def decide(self, observation: Observation) -> Decision:
        if self.caps is None:
            raise RuntimeError(f"{self.name}: decide() called before reset()")
        if not observation.valid or any(not s.valid for s in observation.apps):
            return self._on_invalid(observation)
        return self._decide(observation)

    # -- for subclasses -------------------------------------------------------------------------
    def _reset(self) -> None:  # noqa: B027 - optional hook
        """Clear per-episode state (called by `reset`); stateless controllers need not override."""

    @abstractmethod
    def _decide(self, observation: Observation) -> Decision:
        """The controller's rule for one tick, given a valid observation."""

    def _on_invalid(self, observation: Observation) -> Decision:
        return Decision.hold("invalid observation: holding the last allocation")
