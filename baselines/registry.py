"""Controller spec strings -> controllers, for `evaluate.py`, `serve.py` and the contract tests.

A spec is `name` or `name:ARG` (e.g. `unmanaged`, `static`, later `parties`,
`parties:my-parties.yaml`, `qprm-step`, `rl:runs/ppo/policy`). Each entry of `REGISTRY` names a
factory by import path, so listing the specs imports nothing heavy (RLlib, BoTorch) and adding a
controller is one line, e.g.

    "parties": Entry("baselines.parties:make", "PARTIES (ASPLOS'19) Alg. 1-4", arg="CONFIG", optional_arg=True),
    "rl": Entry("<module>:<factory>", "a trained RL policy", arg="PATH", contract_spec=None),

A factory is `factory(context: ControllerContext, arg: str | None) -> Controller`. The context
carries the node's capabilities and, in simulation, the scenario and the `SimNode`, because some
controllers need the simulator (an oracle searches it offline, Heracles fits its offline DRAM
bandwidth model, CoCo profiles); a factory that needs them declares `needs_sim=True` and gets a
`ConfigError` on a real node. A factory must not step the context's node: it is the node under
evaluation; build a fresh `SimNode(context.scenario, seed=...)` to experiment.

`contract_spec` is the spec the shared controller contract tests build (None when the controller
cannot be built without external files, e.g. `rl:` without a trained policy).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from env.config import ConfigError
from env.controller import Controller
from env.types import Capabilities


@dataclass(frozen=True)
class ControllerContext:
    """What a factory may use. `sim` is the node under evaluation (SimNode) or None on a real node."""

    capabilities: Capabilities
    scenario: Any = None  # env.sim.scenario.Scenario
    sim: Any = None  # env.sim.node.SimNode
    seed: int = 0


@dataclass(frozen=True)
class Entry:
    factory: str  # "module:attribute", imported on first use
    help: str
    arg: str | None = None  # name of the `:ARG` (None: the spec takes no argument)
    optional_arg: bool = False  # True: both `name` and `name:ARG` (e.g. parties[:CONFIG.yaml])
    needs_sim: bool = False
    contract_spec: str | None = ""  # "" = the entry's own name

    def load(self) -> Callable[[ControllerContext, str | None], Controller]:
        mod, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(mod), attr)


def _heracles(ctx: ControllerContext, arg: str | None) -> Controller:
    """Heracles with its offline LC DRAM-bandwidth model profiled in the simulator (Sec. 4.4); on a
    real node without one, the controller falls back to the measured bandwidth (documented there)."""
    from baselines import heracles

    model = None
    if ctx.scenario is not None and ctx.capabilities.lc_apps:
        from env.sim.offline import lc_bandwidth_model

        lc_job = min(ctx.capabilities.lc_apps, key=lambda a: a.qos_target_us).name
        model = lc_bandwidth_model(ctx.scenario, lc_job)
    return heracles.make(ctx, arg, lc_bw_model=model)


def _unmanaged(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines.simple import UnmanagedController

    return UnmanagedController()


def _static(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines.simple import StaticController

    return StaticController()


REGISTRY: dict[str, Entry] = {
    "unmanaged": Entry("baselines.registry:_unmanaged", "no isolation, OS-managed (PARTIES Sec. 5.2.3)"),
    "static": Entry(
        "baselines.registry:_static", "PARTIES' fair start held for ever (Alg. 1 initialization)"
    ),
    "parties": Entry(
        "baselines.parties:make", "PARTIES (ASPLOS'19) Sec. 4, Alg. 1-4", arg="CONFIG", optional_arg=True
    ),
    "heracles": Entry(
        "baselines.registry:_heracles",
        "Heracles (ISCA'15) Sec. 4.5, Alg. 1-4; LC job = strictest QoS (PARTIES Sec. 5.2.2); offline DRAM model from the simulator",
        arg="CONFIG",
        optional_arg=True,
    ),
    "prm": Entry(
        "baselines.prm:make_prm", "Intel PRM NaiveController, CPU quota + CAT (Q-PRM thesis Sec. 4.1)"
    ),
    "prm-nocat": Entry(
        "baselines.prm:make_prm_nocat", "Intel PRM NaiveController, CPU quota only (Q-PRM Table 6.1)"
    ),
    "qprm-step": Entry("baselines.prm:make_qprm_step", "Q-PRM Step (Q-PRM thesis Sec. 4.2.2)"),
    "qprm-prop": Entry("baselines.prm:make_qprm_prop", "Q-PRM Proportional (Sec. 4.2.2)"),
    "qprm-prop2": Entry("baselines.prm:make_qprm_prop2", "Q-PRM Proportional v2 (Sec. 4.2.2)"),
    "qprm-basic": Entry("baselines.prm:make_qprm_basic", "Q-PRM Basic (Sec. 4.2.2)"),
    "coco": Entry(
        "baselines.coco:make",
        "CoCo (Sec. 3): profiled slowdowns, MQ-WRR CLOS time-sharing, admission control",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "coco-rr": Entry(
        "baselines.coco:make_rr",
        "CoCo's CLOSes time-shared round-robin (CoCo Fig. 2)",
        arg="CONFIG",
        optional_arg=True,
    ),
    "coco-nopart": Entry(
        "baselines.coco:make_nopart",
        "CoCo's core pinning, no CAT/MBA (CoCo Fig. 2)",
        arg="CONFIG",
        optional_arg=True,
    ),
    "oracle": Entry(
        "baselines.oracle:make",
        "best static allocation with full knowledge of the simulator (PARTIES Fig. 8)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "bo": Entry(
        "agents.bo:make",
        "CLITE-style BoTorch constrained BO over allocations",
        arg="CONFIG",
        optional_arg=True,
    ),
    "rl": Entry(
        "agents.policy:make", "a trained RL policy (train.py), torch only", arg="PATH", contract_spec=None
    ),
}


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'name' or 'name:ARG' -> (name, ARG); validates the name and whether ARG is required."""
    spec = spec.strip()
    name, sep, arg = spec.partition(":")
    if name not in REGISTRY:
        hint = difflib.get_close_matches(name, list(REGISTRY), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"unknown controller {spec!r}{extra}; known: {describe_specs()}")
    entry = REGISTRY[name]
    if entry.arg is not None and not entry.optional_arg and not (sep and arg):
        raise ConfigError(f"controller {name!r} needs an argument: {name}:{entry.arg}")
    if sep and not arg:
        raise ConfigError(f"controller {spec!r}: empty argument after ':'")
    if entry.arg is None and sep:
        raise ConfigError(f"controller {name!r} takes no argument (got {spec!r})")
    return name, (arg if sep else None)


def parse_specs(text: str) -> list[str]:
    """A comma-separated list of specs, each validated (duplicates and empty items refused)."""
    specs = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in specs):
        raise ConfigError(
            f"--controllers: expected a comma-separated list of specs; known: {describe_specs()}"
        )
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise ConfigError(f"--controllers: {dup} given twice")
    for s in specs:
        parse_spec(s)
    return specs


def known_specs() -> list[str]:
    """The registered names (spec forms with their argument placeholder)."""
    return [spec_form(n, e) for n, e in REGISTRY.items()]


def spec_form(name: str, entry: Entry) -> str:
    """How the spec is written: `name`, `name:ARG` or `name[:ARG]`."""
    if entry.arg is None:
        return name
    return f"{name}[:{entry.arg}]" if entry.optional_arg else f"{name}:{entry.arg}"


def describe_specs() -> str:
    return ", ".join(known_specs())


def contract_specs() -> list[str]:
    """Specs the controller contract tests build on a simulated node."""
    out = []
    for name, e in REGISTRY.items():
        if e.contract_spec is None:
            continue
        out.append(e.contract_spec or name)
    return out


def make_controller(spec: str, context: ControllerContext) -> Controller:
    """Build the controller named by `spec`; `ConfigError` on an unknown or malformed spec."""
    name, arg = parse_spec(spec)
    entry = REGISTRY[name]
    if entry.needs_sim and context.sim is None:
        raise ConfigError(
            f"controller {name!r} needs the simulator (a SimNode); it cannot run on a real node"
        )
    return entry.load()(context, arg)


def build_for_run(spec: str, capabilities: Capabilities, scenario: Any, node: Any, seed: int) -> Controller:
    """The factory `env.evaluation` imports by path: a controller for a run on `node`."""
    return make_controller(spec, ControllerContext(capabilities, scenario, node, seed))
