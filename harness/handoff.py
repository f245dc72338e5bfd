"""`handoff:SECONDS:FIRST+SECOND`: one controller drives until a time, another from then on.

A diagnostic for learned policies (and any controller): hand policy B the allocation that
controller A reached, and see whether B keeps it. If B holds an allocation it never reaches by
itself, what it lacks is the way there, not the judgement to stay; if it walks away from it, the
allocation itself scores worse by B's lights. Example:

    evaluate.py compare --scenario mix3-const --controllers handoff:30:oracle-guided+rl:OUT/policy.pt

Both controllers see every observation from the start, so each keeps its own state (PARTIES'
pending judgement, a policy's previous observation); only the decision of the one in charge is
applied: FIRST's while the observed interval ends before SECONDS, SECOND's from then on. Each is
reset with a generator spawned from the run's, so a handoff run is as reproducible as its parts.
FIRST and SECOND are any specs of `harness.registry` (nested handoffs included); FIRST must not
contain a `+`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from env.config import ConfigError
from env.controller import Controller
from env.types import Capabilities, Decision, Observation


@dataclass(frozen=True)
class HandoffSpec:
    """The parsed argument of a `handoff:` spec."""

    switch_s: float
    first: str
    second: str


def parse_handoff(arg: str) -> HandoffSpec:
    """`SECONDS:FIRST+SECOND` -> `HandoffSpec`; ConfigError when malformed (the specs themselves
    are checked by the registry when the controllers are built)."""
    form = "handoff:SECONDS:FIRST+SECOND, e.g. handoff:30:oracle-guided+rl:OUT/policy.pt"
    seconds, sep, rest = arg.partition(":")
    try:
        switch_s = float(seconds)
    except ValueError:
        raise ConfigError(f"handoff:{arg}: {seconds!r} is not a number of seconds; write {form}") from None
    if not sep or not math.isfinite(switch_s) or switch_s < 0:
        raise ConfigError(f"handoff:{arg}: needs a time >= 0 s and two specs; write {form}")
    first, plus, second = rest.partition("+")
    if not plus or not first.strip() or not second.strip():
        raise ConfigError(f"handoff:{arg}: needs two specs joined by '+'; write {form}")
    return HandoffSpec(switch_s, first.strip(), second.strip())


class HandoffController:
    """`first` decides while the observed interval ends before `switch_s`, `second` from then on;
    both see every observation (module docstring)."""

    def __init__(self, first: Controller, second: Controller, switch_s: float) -> None:
        self.first, self.second, self.switch_s = first, second, switch_s
        self.name = f"handoff:{switch_s:g}:{first.name}+{second.name}"

    def reset(self, capabilities: Capabilities, rng: np.random.Generator) -> None:
        rng_first, rng_second = rng.spawn(2)
        self.first.reset(capabilities, rng_first)
        self.second.reset(capabilities, rng_second)

    def decide(self, observation: Observation) -> Decision:
        by_first = self.first.decide(observation)
        by_second = self.second.decide(observation)
        return by_first if observation.time_s < self.switch_s - 1e-9 else by_second
