"""The `Node` protocol (DESIGN §3) and the clocks that drive it.

A node is the thing being managed: `SimNode` (env/sim) or `LinuxNode` (hw/). The control loop
(`env.loop`) is the only caller in normal use:

    obs = node.observe()                  # the interval that just ended
    decision = controller.decide(obs)
    applied = node.apply(decision.allocation)   # validate -> diff -> apply -> read back
    clock.sleep_until(next_tick)          # a SimClock advances simulated time instantly

`apply` raises `AllocationError` for invalid input before anything is written and returns what was
really applied. `close` restores what the node found and is idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from env.types import Allocation, Capabilities, Observation


class Clock(Protocol):
    """Time source of the loop. `now()` in seconds since the clock's epoch."""

    def now(self) -> float: ...

    def sleep_until(self, t_s: float) -> None: ...


class RealClock:
    """Wall-clock time (monotonic); `sleep_until` really sleeps."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sleep_until(self, t_s: float) -> None:
        delay = t_s - self.now()
        if delay > 0:
            time.sleep(delay)


class SimClock:
    """Simulated time: `sleep_until` jumps forward at once. Optionally paced against the wall
    clock (`speed` = simulated seconds per real second; 0 means as fast as possible)."""

    def __init__(self, speed: float = 0.0) -> None:
        self._t = 0.0
        self._speed = speed
        self._wall0 = time.monotonic()

    def now(self) -> float:
        return self._t

    def sleep_until(self, t_s: float) -> None:
        if t_s > self._t:
            self._t = t_s
        if self._speed > 0:
            delay = self._wall0 + self._t / self._speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def reset(self) -> None:
        self._t = 0.0
        self._wall0 = time.monotonic()


@runtime_checkable
class Node(Protocol):
    """A managed server (DESIGN §3). Implemented by `SimNode` and `LinuxNode`."""

    @property
    def clock(self) -> Clock: ...

    def capabilities(self) -> Capabilities: ...

    def observe(self) -> Observation: ...

    def apply(self, allocation: Allocation) -> Allocation: ...

    def current_allocation(self) -> Allocation: ...

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation: ...

    def close(self) -> None: ...


def tail_at_target(node: Node) -> Mapping[str, float] | None:
    """The node's ground truth for its last interval, P(latency > target) per LC app, where it has
    one (the simulator's model: `SimNode.tail_at_target`); None on a real node, which only measures.
    For training rewards (`env.rewards`, `window_risk`), never for a controller."""
    truth = getattr(node, "tail_at_target", None)
    return truth() if callable(truth) else None
