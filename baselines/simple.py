"""The two reference points every comparison includes (PARTIES Sec. 5.2.3): no management at all,
and PARTIES' fair starting partition held for ever.

* `UnmanagedController` ("unmanaged"): no isolation. Every LC app and BE job shares all cores (one
  core group, the OS scheduler time-shares them), the whole LLC (one CLOS), memory, disk and network;
  frequency is left to the governor (the top level = turbo when busy;
  `env.allocations.unmanaged_allocation`). PARTIES Sec. 5.2.3: "No isolation mechanisms are used
  ... relies on the OS to schedule applications and manage resources".
* `StaticController` ("static"): PARTIES' start (Alg. 1 `initialization()`, Sec. 4.2.1): each
  app an equal partition of every resource at nominal frequency (`env.allocations.fair_allocation`),
  never changed: what a careful operator would configure by hand.

Both ignore measurements, so an invalid observation changes nothing: they keep asserting their
allocation. Every controller starts from the fair allocation in `evaluate.py` (the node's
initial state); `unmanaged` switches to its allocation at its first decision.
"""

from __future__ import annotations

from abc import abstractmethod

from env.allocations import fair_allocation, unmanaged_allocation
from env.controller import BaseController
from env.types import Allocation, Decision, Observation


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
    """PARTIES' fair start held for ever (module docstring; Alg. 1 `initialization()`)."""

    name = "static"

    def _allocation(self) -> Allocation:
        assert self.caps is not None
        return fair_allocation(self.caps)
