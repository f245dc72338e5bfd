"""The `Controller` protocol (DESIGN §3) and `BaseController`.

A controller is a tick function: `decide(observation) -> Decision`, called once per interval by
`env.loop`. It never sleeps and never does I/O; behaviour over several ticks (PARTIES'
measure-then-revert, Heracles' 15 s polling, cooldowns) is explicit state advanced by the
observations' timestamps. Baselines, RL policies and the BO agent all implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, runtime_checkable

import numpy as np

from env.types import Capabilities, Decision, Observation


@runtime_checkable
class Controller(Protocol):
    name: str

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None: ...

    def decide(self, observation: Observation) -> Decision: ...


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
