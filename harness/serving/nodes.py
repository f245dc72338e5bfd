"""The node wrappers of serving (DESIGN §1 use 3): the supervisor's safety pieces that act on the node.

* `ResilientNode`: an actuation error (raised, or a knob the node could not write) is counted and
  retried with exponential backoff on the loop's clock; any exception becomes an `OSError` the loop
  survives (it keeps the last good allocation); a failed observe() becomes an explicit invalid
  observation (which sends the supervisor to safe mode). It also times the inner calls of a tick.
* `DryRunNode` (`serve.py --dry-run`): apply() validates, diffs and logs the writes it would make,
  writes nothing and returns the allocation in force. The node is never reset (reset applies the
  start allocation); the allocation taken as in force is told to a node that has applied nothing
  (`LinuxNode.assume`), so its observations are measured against it.

Both are `NodeWrapper`s: a `Node` that forwards to the node it wraps, overriding what it changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from env.allocations import allocation_diff
from env.node import Clock, Node
from env.types import (
    Allocation,
    AllocationError,
    AppSample,
    BeSample,
    Capabilities,
    Observation,
    Usage,
    validate_allocation,
)
from harness.serving.config import RetryConfig
from harness.serving.safety import _EPS, EventLog, feed_ok


class NodeWrapper:
    """A `Node` over `inner` that forwards every call of the Node protocol to it; a subclass overrides
    what it changes. Any other attribute is the inner node's too (a LinuxNode's `errors`, `assume`),
    so a stack of wrappers reads like the node it wraps."""

    def __init__(self, inner: Node) -> None:
        self.inner = inner

    @property
    def clock(self) -> Clock:
        return self.inner.clock

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def current_allocation(self) -> Allocation:
        return self.inner.current_allocation()

    def observe(self) -> Observation:
        return self.inner.observe()

    def apply(self, allocation: Allocation) -> Allocation:
        return self.inner.apply(allocation)

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation:
        return self.inner.reset(seed, scenario)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy under construction): no endless recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class ActuationError(OSError):
    """A node's apply() failed (any exception but invalid input); the loop keeps the last good
    allocation and the next attempt waits out the backoff."""


class ApplyDeferred(OSError):
    """apply() not attempted: backing off after failed attempts."""


@dataclass
class ActuationStats:
    """What `ResilientNode` counted over a run (in the summary and the Prometheus counters)."""

    attempts: int = 0
    failures: int = 0  # raised, or a knob the node reported it could not write
    partial: int = 0  # of which the node applied the rest and kept last good values
    deferred: int = 0
    refused: int = 0  # invalid input (AllocationError): not retried
    recovered: int = 0
    observe_failures: int = 0


class ResilientNode(NodeWrapper):
    """The supervisor's `Node` wrapper (module docstring): retries with backoff, fault containment, timing.

    `error_count`, when given, returns a running count of write errors the node swallowed (a
    `LinuxNode` keeps a knob's last good value, counts the error and returns the read-back instead
    of raising): an apply() during which it grows is a (partial) failure, backed off like a raised
    one. `observe_ms`/`apply_ms` time the inner calls of the current tick (`take_timings`)."""

    def __init__(
        self,
        inner: Node,
        *,
        clock: Clock,
        retry: RetryConfig | None = None,
        events: EventLog | None = None,
        error_count: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(inner)
        self._clock_loop = clock
        self.retry = retry or RetryConfig()
        self.events = events
        self.error_count = error_count
        self.stats = ActuationStats()
        self.consecutive_failures = 0
        self.retry_at_s: float | None = None
        self._last_ok: Allocation | None = None
        self._last_obs_s: float | None = None
        self._observe_s = 0.0
        self._observe_cpu_s = 0.0
        self._apply_s = 0.0

    def observe(self) -> Observation:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            obs = self.inner.observe()
            self._last_obs_s = obs.time_s if feed_ok(obs) else self._last_obs_s
        except Exception as e:  # a sensor failure is an explicit invalid observation, never a crash
            self.stats.observe_failures += 1
            now = self._clock_loop.now()
            self._emit(now, "observe_failed", f"observe() raised {type(e).__name__}: {e}")
            obs = self._invalid_observation(now)
        self._observe_s += time.perf_counter() - t0
        self._observe_cpu_s += time.thread_time() - c0
        return obs

    def apply(self, allocation: Allocation) -> Allocation:
        t0 = time.perf_counter()
        try:
            return self._apply(allocation)
        finally:
            self._apply_s += time.perf_counter() - t0

    # -- internals ----------------------------------------------------------------------------------
    def _apply(self, allocation: Allocation) -> Allocation:
        now = self._clock_loop.now()
        if self._last_ok is None:
            with contextlib.suppress(Exception):
                self._last_ok = self.inner.current_allocation()
        if self._last_ok is not None and allocation == self._last_ok:
            # a rollback to the last good allocation (env.loop after a failed apply): never deferred,
            # and it leaves the backoff of the failing target alone
            try:
                applied = self.inner.apply(allocation)
            except AllocationError:
                raise
            except Exception as e:
                self.stats.failures += 1
                raise ActuationError(f"rollback: {type(e).__name__}: {e}") from e
            self._last_ok = applied
            return applied
        if self.retry_at_s is not None and now < self.retry_at_s - _EPS:
            self.stats.deferred += 1
            msg = (
                f"backing off after {self.consecutive_failures} failed attempt(s); "
                f"next attempt in {self.retry_at_s - now:.1f} s"
            )
            self._emit(now, "apply_deferred", msg)
            raise ApplyDeferred(msg)
        self.stats.attempts += 1
        before = self.error_count() if self.error_count is not None else 0
        try:
            applied = self.inner.apply(allocation)
        except AllocationError as e:
            self.stats.refused += 1
            self._emit(now, "apply_refused", f"the node refused the allocation: {e}")
            raise
        except Exception as e:
            self._failed(now, f"{type(e).__name__}: {e}")
            raise ActuationError(f"{type(e).__name__}: {e}") from e
        errors = (self.error_count() if self.error_count is not None else 0) - before
        if errors > 0:
            self.stats.partial += 1
            self._failed(now, f"{errors} knob write(s) failed; those knobs keep their last good values")
        else:
            if self.consecutive_failures:
                self.stats.recovered += 1
                self._emit(
                    now, "apply_recovered", f"applied after {self.consecutive_failures} failed attempt(s)"
                )
            self.consecutive_failures = 0
            self.retry_at_s = None
        self._last_ok = applied
        return applied

    def _failed(self, now: float, what: str) -> None:
        self.stats.failures += 1
        self.consecutive_failures += 1
        delay = self.retry.delay_s(self.consecutive_failures)
        self.retry_at_s = now + delay
        kind = "apply_partial" if what[0].isdigit() else "apply_failed"
        self._emit(now, kind, f"{what} (failure {self.consecutive_failures} in a row; retry in {delay:g} s)")

    def _invalid_observation(self, now: float) -> Observation:
        caps = self.inner.capabilities()
        alloc: Allocation | None
        try:
            alloc = self.inner.current_allocation()
        except Exception:
            alloc = self._last_ok
        if alloc is None:
            raise RuntimeError("the node has neither an observation nor an allocation")  # before reset
        nan = math.nan
        usage = Usage(nan, nan, nan, nan, nan, nan, nan)
        stale = now - self._last_obs_s if self._last_obs_s is not None else caps.interval_s
        return Observation(
            time_s=now,
            interval_s=caps.interval_s,
            apps=tuple(
                AppSample(a.name, nan, a.qos_target_us, nan, nan, nan, nan, 0, usage, valid=False)
                for a in caps.lc_apps
            ),
            be=tuple(BeSample(a.name, nan, usage) for a in caps.be_apps),
            allocation=alloc,
            mem_bw_gbps=nan,
            power_w=nan,
            valid=False,
            stale_s=max(stale, caps.interval_s),
        )

    def take_timings(self) -> tuple[float, float, float]:
        """(observe_ms, apply_ms, observe CPU ms) of the inner node since the last call."""
        out = (self._observe_s * 1e3, self._apply_s * 1e3, self._observe_cpu_s * 1e3)
        self._observe_s = self._apply_s = self._observe_cpu_s = 0.0
        return out

    @property
    def backoff_s(self) -> float:
        if self.retry_at_s is None:
            return 0.0
        return max(0.0, self.retry_at_s - self._clock_loop.now())

    def _emit(self, t: float, kind: str, msg: str) -> None:
        if self.events is not None:
            self.events.emit(t, kind, msg)


class DryRunNode(NodeWrapper):
    """`--dry-run` (module docstring): apply() validates the allocation, diffs it against the one in
    force, logs the writes it would make and returns the allocation in force; nothing reaches the
    node, and reset() is refused. The observations are the node's, reported with the allocation in
    force: `assumed`, else the node's own. A node that has applied nothing (a LinuxNode never reset:
    its current_allocation() raises RuntimeError) needs `assumed`, which it is told (`assume`) so
    that it measures its observations (CPU use per core, BE share) against that allocation."""

    def __init__(
        self, inner: Node, *, events: EventLog | None = None, assumed: Allocation | None = None
    ) -> None:
        super().__init__(inner)
        self.events = events
        if assumed is None:
            try:
                assumed = inner.current_allocation()
            except RuntimeError as e:  # nothing applied yet
                raise RuntimeError(f"a dry run needs the allocation to take as in force: {e}") from None
        else:
            assume: Callable[[Allocation], None] | None = getattr(inner, "assume", None)
            if assume is not None:
                assume(assumed)
        self._alloc = assumed
        self.would_apply = 0
        self.last_writes: tuple[str, ...] = ()

    def current_allocation(self) -> Allocation:
        return self._alloc

    def reset(self, seed: int | None = None, scenario: Any = None) -> Observation:
        raise RuntimeError("a dry run never resets the node (reset applies the start allocation)")

    def observe(self) -> Observation:
        obs = self.inner.observe()
        return obs if obs.allocation == self._alloc else dataclasses.replace(obs, allocation=self._alloc)

    def apply(self, allocation: Allocation) -> Allocation:
        validate_allocation(allocation, self.capabilities())
        writes = tuple(allocation_diff(self._alloc, allocation))
        self.last_writes = writes
        if writes:
            self.would_apply += 1
            if self.events is not None:
                self.events.emit(self.clock.now(), "dry_run", "would write: " + ", ".join(writes))
        return self._alloc


def write_errors(errors: Mapping[str, int]) -> int:
    """The knob writes a LinuxNode could not make, from its `errors` counter (failed usage reads are
    not writes): what `ResilientNode`'s `error_count` returns for it."""
    return sum(v for k, v in errors.items() if k != "usage")
