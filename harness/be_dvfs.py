"""`be-dvfs:SPEC`: any controller, with Heracles' power sub-controller setting the BE cores' frequency.

The ten PARTIES moves change an LC app's frequency, never the BE jobs': PARTIES' code sets every
core to the nominal 2.2 GHz at start (`cpupower frequency-set -f 2200MHz`) and moves only the LC
apps from there, so under PARTIES, and under a policy acting through its moves, the BE job runs at
the nominal frequency for good. Heracles (Sec. 4.5, Alg. 3) manages exactly that knob: every 2 s it
raises the BE cores' frequency one level while the socket draws at most 90% of its TDP and the LC
cores run at their guaranteed frequency, and lowers it one level when the socket draws more while
they do not. This wrapper puts that sub-controller (the `be_dvfs` guard, `env.guards.BeDvfsGuard`,
with its defaults) after SPEC's decisions, leaving SPEC's LC apps as SPEC decides them, so that an
evaluation that runs every controller under clamp only can still compare SPEC with and without it.
The guard gives way to an LC app running below its guaranteed frequency (the nominal one, or what
SPEC set it to when lower) and changes nothing on a node without BE jobs, without the FREQ knob or without a TDP (NaN:
no RAPL). A policy trained with the guard in its env (`env.guards.be_dvfs`) has seen what this
wrapper does; one trained without it has not.

A decision that changes only the BE jobs' frequency is a HOLD of SPEC's moves (`move` is SPEC's).
Example: `evaluate.py compare --controllers parties,be-dvfs:parties,rl:OUT,be-dvfs:rl:OUT`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from env.controller import Controller
from env.guards import BeDvfsConfig, BeDvfsGuard
from env.types import Capabilities, Decision, Observation

CYCLE_S = BeDvfsConfig().cycle_s  # Alg. 3 runs every 2 s


class BeDvfsController:
    """`inner`'s decisions with the BE jobs' frequency set by Heracles' Alg. 3 (module docstring)."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = f"be-dvfs:{inner.name}"
        self._guard = BeDvfsGuard(BeDvfsConfig())
        self._caps: Capabilities | None = None

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None:
        self.inner.reset(capabilities, rng)
        self._caps = capabilities
        self._guard.reset(capabilities)

    def decide(self, observation: Observation) -> Decision:
        decision = self.inner.decide(observation)
        assert self._caps is not None, "reset() before decide()"
        out, note = self._guard.check(decision, observation, self._caps)
        return dataclasses.replace(out, reason=out.reason + f"; be-dvfs: {note}") if note else out

    @property
    def be_freq_mhz(self) -> int | None:
        """The BE jobs' frequency this wrapper sets (None before the first observation)."""
        return self._guard.be_freq_mhz
