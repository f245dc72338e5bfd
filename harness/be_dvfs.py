"""`be-dvfs:SPEC`: any controller, with Heracles' power sub-controller setting the BE cores' frequency.

The ten PARTIES moves change an LC app's frequency, never the BE jobs': PARTIES' code sets every
core to the nominal 2.2 GHz at start (`cpupower frequency-set -f 2200MHz`) and moves only the LC
apps from there, so under PARTIES, and under a policy acting through its moves, the BE job runs at
the nominal frequency for good. Heracles (Sec. 4.5, Alg. 3) manages exactly that knob: every 2 s it
raises the BE cores' frequency one level while the socket draws at most 90% of its TDP and the LC
cores run at their guaranteed frequency, and lowers it one level when the socket draws more while
they do not. This wrapper adds that sub-controller to SPEC's decisions, leaving SPEC's LC apps as
SPEC decides them:

- each decision's allocation (the observed one when SPEC holds) gets the BE jobs' frequency this
  wrapper keeps; it starts at the BE jobs' frequency in the first observation;
- one Alg. 3 cycle every `CYCLE_S` of observed time, on the mean socket power of the intervals
  since the last cycle (`Observation.power_w`, RAPL on a real node) and on whether the LC apps ran
  below their guaranteed frequency (the slowest app's shortfall, mean over those intervals):
  Heracles' guaranteed frequency is the nominal one (its LC job is never capped); here an LC app
  that its controller set lower is guaranteed what it was set to;
- nothing changes on a node without BE jobs, without the FREQ knob or without a TDP (NaN: no RAPL).

A decision that changes only the BE jobs' frequency is a HOLD of SPEC's moves (`move` is SPEC's).
Example: `evaluate.py compare --controllers parties,be-dvfs:parties,rl:OUT,be-dvfs:rl:OUT`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from baselines.heracles import HeraclesConfig, be_frequency_step
from env.controller import Controller
from env.types import Capabilities, Decision, Observation, Resource

CYCLE_S = HeraclesConfig().power_cycle_s  # Alg. 3 runs every 2 s
TDP_FRAC = HeraclesConfig().power_tdp_frac  # the power budget: 90% of TDP


class BeDvfsController:
    """`inner`'s decisions with the BE jobs' frequency set by Heracles' Alg. 3 (module docstring)."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = f"be-dvfs:{inner.name}"
        self._caps: Capabilities | None = None
        self._active = False
        self._be_freq_mhz: int | None = None
        self._next_cycle_s = math.inf
        self._window: list[tuple[float, float]] = []  # (socket power W, LC frequency margin MHz)

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None:
        self.inner.reset(capabilities, rng)
        self._caps = caps = capabilities
        self._active = bool(caps.be_apps) and Resource.FREQ in caps.knobs and math.isfinite(caps.tdp_w)
        self._be_freq_mhz = None
        self._next_cycle_s = math.inf
        self._window = []

    def decide(self, observation: Observation) -> Decision:
        decision = self.inner.decide(observation)
        if not self._active:
            return decision
        caps = self._caps
        assert caps is not None
        alloc = observation.allocation
        be = [b.name for b in caps.be_apps if b.name in alloc]
        if not be:
            return decision
        if self._be_freq_mhz is None:
            self._be_freq_mhz = alloc[be[0]].freq_mhz
            self._next_cycle_s = observation.time_s + CYCLE_S
        note = self._cycle(observation)
        target = decision.allocation if decision.allocation is not None else alloc
        for b in be:
            if b in target and target[b].freq_mhz != self._be_freq_mhz:
                target = target.replace_app(b, freq_mhz=self._be_freq_mhz)
        reason = decision.reason + (f"; be-dvfs: {note}" if note else "")
        return dataclasses.replace(decision, allocation=None if target == alloc else target, reason=reason)

    @property
    def be_freq_mhz(self) -> int | None:
        """The BE jobs' frequency this wrapper sets (None before the first observation)."""
        return self._be_freq_mhz

    def _cycle(self, obs: Observation) -> str:
        """Record this interval; run Alg. 3 when its cycle is due. Returns a note when it moved."""
        caps = self._caps
        assert caps is not None and self._be_freq_mhz is not None
        nominal = caps.nominal_freq_mhz
        margins = [  # each LC app's frequency over the one it is guaranteed
            s.usage.freq_mhz - min(obs.allocation[s.name].freq_mhz, nominal)
            for s in obs.apps
            if s.valid and s.name in obs.allocation and math.isfinite(s.usage.freq_mhz)
        ]
        if math.isfinite(obs.power_w):
            self._window.append((obs.power_w, min(margins, default=0.0)))
        if obs.time_s + 1e-9 < self._next_cycle_s or not self._window:
            return ""
        self._next_cycle_s += CYCLE_S * max(1, math.floor((obs.time_s - self._next_cycle_s) / CYCLE_S) + 1)
        power = sum(p for p, _ in self._window) / len(self._window)
        short = sum(m for _, m in self._window) / len(self._window) < -0.5  # PollFrequency(ls_cores)
        self._window = []
        budget = TDP_FRAC * caps.tdp_w
        new = be_frequency_step(caps.freq_levels_mhz, self._be_freq_mhz, power, budget, short)
        if new == self._be_freq_mhz:
            return ""
        old, self._be_freq_mhz = self._be_freq_mhz, new
        return f"Heracles Alg. 3: {power:.0f} W against {budget:.0f} W -> BE {old} -> {new} MHz"
