"""Controller spec strings -> controllers, for `evaluate.py`, `train.py`, `serve.py` and the tests.

A spec is `name` or `name:ARG` (e.g. `unmanaged`, `parties`, `parties:code`, `parties:my-parties.yaml`,
`qprm-step`, `rl:runs/ppo/policy.pt`). Each entry of `REGISTRY` holds a factory
`factory(context: ControllerContext, arg: str | None) -> Controller` (env.controller). The
factories import their controller's module when called, so listing the specs (`--help`) imports
nothing heavy (RLlib, BoTorch, the simulator's kernels); adding a controller is one function and
one line here.

The context carries the node's capabilities and, in simulation, the scenario and the `SimNode`,
because some controllers need the simulator (an oracle searches it offline, Heracles fits its
offline DRAM bandwidth model, CoCo profiles); an entry that needs them declares `needs_sim=True` and
building it on a real node is a `ConfigError`.

`contract_spec` is the spec the shared controller contract tests build (None when the controller
cannot be built without external files, e.g. `rl:` without a trained policy). A wrapper's ARG holds
other specs (`handoff:SECONDS:FIRST+SECOND`, `be-dvfs:SPEC`); its `inner` names them, so they are
checked when the wrapper's spec is parsed and `is_learned` sees a learned policy inside it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from env.config import ConfigError
from env.controller import Controller, ControllerContext, ControllerFactory


@dataclass(frozen=True)
class Entry:
    """One registered controller: its factory, a one-line help and how its spec is written."""

    factory: ControllerFactory
    help: str
    arg: str | None = None  # name of the `:ARG` (None: the spec takes no argument)
    optional_arg: bool = False  # True: both `name` and `name:ARG` (e.g. parties[:CONFIG.yaml])
    needs_sim: bool = False
    contract_spec: str | None = ""  # "" = the entry's own name
    inner: Callable[[str], tuple[str, ...]] | None = None  # a wrapper: the specs in its ARG


# ---- factories: each imports its controller's module on first use --------------------------------------
def _unmanaged(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines.simple import UnmanagedController

    return UnmanagedController()


def _static(ctx: ControllerContext, arg: str | None) -> Controller:
    """`static`: the fair start; `static:FILE.yaml`: with the file's per-app values, checked
    against the node here, so that a bad file fails before any run."""
    from baselines.simple import StaticController, load_static_overrides, static_allocation

    if arg is None:
        return StaticController()
    overrides = load_static_overrides(arg)
    static_allocation(ctx.capabilities, overrides, where=arg)
    return StaticController(overrides, where=arg)


def _parties(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines import parties

    return parties.make(ctx, arg)


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


def _prm(variant: str) -> ControllerFactory:
    def factory(ctx: ControllerContext, arg: str | None) -> Controller:
        from baselines import prm

        return prm.make(variant if arg is None else f"{variant}:{arg}", ctx)

    return factory


def _coco(variant: str) -> ControllerFactory:
    def factory(ctx: ControllerContext, arg: str | None) -> Controller:
        from baselines import coco

        return coco.build_coco(variant, ctx.capabilities, ctx.scenario, arg)

    return factory


def _oracle(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines import oracle

    return oracle.make(ctx, arg)


def _oracle_guided(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines import oracle_guided

    return oracle_guided.make(ctx, arg)


def _oracle_guided_per_app(ctx: ControllerContext, arg: str | None) -> Controller:
    from baselines import oracle_guided

    return oracle_guided.make(ctx, arg, per_app=True)


def _bo(ctx: ControllerContext, arg: str | None) -> Controller:
    from agents.bo import controller

    return controller.make(ctx, arg)


def _rl(ctx: ControllerContext, arg: str | None) -> Controller:
    from agents import policy

    return policy.make(ctx, arg)


def _handoff(ctx: ControllerContext, arg: str | None) -> Controller:
    from harness.handoff import HandoffController, parse_handoff

    spec = parse_handoff(arg or "")
    return HandoffController(
        make_controller(spec.first, ctx), make_controller(spec.second, ctx), spec.switch_s
    )


def _be_dvfs(ctx: ControllerContext, arg: str | None) -> Controller:
    from harness.be_dvfs import BeDvfsController

    return BeDvfsController(make_controller(arg or "", ctx))


def _handoff_parts(arg: str) -> tuple[str, ...]:
    """A handoff's two specs (its time checked on the way: ConfigError)."""
    from harness.handoff import parse_handoff

    spec = parse_handoff(arg)
    return (spec.first, spec.second)


REGISTRY: dict[str, Entry] = {
    "unmanaged": Entry(_unmanaged, "no isolation, OS-managed (PARTIES Sec. 5.2.3)"),
    "static": Entry(
        _static,
        "PARTIES' fair start held for ever (Alg. 1 initialization); :FILE.yaml = with per-app values, e.g. nginx: {cores: 1.5}",
        arg="FILE",
        optional_arg=True,
    ),
    "parties": Entry(
        _parties,
        "PARTIES (ASPLOS'19) Sec. 4, Alg. 1-4; :code = as the authors' code runs it, :code-stats = its statistics only",
        arg="CONFIG",
        optional_arg=True,
    ),
    "heracles": Entry(
        _heracles,
        "Heracles (ISCA'15) Sec. 4.5, Alg. 1-4; LC job = strictest QoS (PARTIES Sec. 5.2.2); offline DRAM model from the simulator",
        arg="CONFIG",
        optional_arg=True,
    ),
    "prm": Entry(
        _prm("prm"),
        "Intel PRM NaiveController, CPU quota + CAT (Q-PRM thesis Sec. 4.1); prm:exclusive-cat = --exclusive-cat",
        arg="VARIANT",
        optional_arg=True,
    ),
    "prm-nocat": Entry(_prm("prm-nocat"), "Intel PRM NaiveController, CPU quota only (Q-PRM Table 6.1)"),
    "qprm-step": Entry(_prm("qprm-step"), "Q-PRM Step (Q-PRM thesis Sec. 4.2.2)"),
    "qprm-prop": Entry(_prm("qprm-prop"), "Q-PRM Proportional (Sec. 4.2.2)"),
    "qprm-prop2": Entry(_prm("qprm-prop2"), "Q-PRM Proportional v2 (Sec. 4.2.2)"),
    "qprm-basic": Entry(_prm("qprm-basic"), "Q-PRM Basic (Sec. 4.2.2)"),
    "coco": Entry(
        _coco("coco"),
        "CoCo (Sec. 3): profiled slowdowns, MQ-WRR CLOS time-sharing, admission control",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "coco-rr": Entry(
        _coco("coco-rr"),
        "CoCo's CLOSes time-shared round-robin (CoCo Fig. 2)",
        arg="CONFIG",
        optional_arg=True,
    ),
    "coco-nopart": Entry(
        _coco("coco-nopart"), "CoCo's core pinning, no CAT/MBA (CoCo Fig. 2)", arg="CONFIG", optional_arg=True
    ),
    "coco-cat": Entry(
        _coco("coco-cat"),
        "CoCo with CAT only, no MBA (CoCo Fig. 2)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "coco-conflict": Entry(
        _coco("coco-conflict"),
        "CoCo with CAT and MBA in conflict: most ways, least bandwidth (CoCo Fig. 2, Sec. 3.3)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "oracle": Entry(
        _oracle,
        "best allocation per load step, with full knowledge of the simulator (PARTIES Fig. 8)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "oracle-guided": Entry(
        _oracle_guided,
        "the Oracle's plan reached one PARTIES move per interval (the learned policy's teacher)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "oracle-guided-per-app": Entry(
        _oracle_guided_per_app,
        "the Oracle's plan reached one PARTIES move per app and interval (the per-app policy's teacher)",
        arg="CONFIG",
        optional_arg=True,
        needs_sim=True,
    ),
    "bo": Entry(_bo, "CLITE-style BoTorch constrained BO over allocations", arg="CONFIG", optional_arg=True),
    "rl": Entry(
        _rl,
        "a trained RL policy (train.py), no Ray needed: PATH = OUT/policy.pt or the run dir OUT",
        arg="PATH",
        contract_spec=None,
    ),
    "handoff": Entry(
        _handoff,
        "FIRST decides until SECONDS, SECOND from then on (does a policy keep what another reached?)",
        arg="SECONDS:FIRST+SECOND",
        contract_spec="handoff:10:parties+static",
        inner=_handoff_parts,
    ),
    "be-dvfs": Entry(
        _be_dvfs,
        "SPEC's decisions, the BE cores' frequency set by Heracles' power sub-controller (Alg. 3: up a level below 90% TDP)",
        arg="SPEC",
        contract_spec="be-dvfs:parties",
        inner=lambda arg: (arg,),
    ),
}

LEARNED_SPECS = ("rl", "bo")
"""Spec names of the learned controllers (serve.py gives them a fallback under `applies_to: auto`)."""


def is_learned(spec: str) -> bool:
    """Whether `spec` runs a learned controller (`LEARNED_SPECS`), itself or inside a wrapper
    (`be-dvfs:rl:OUT`, either part of a `handoff:`); `ConfigError` on a malformed spec."""
    name, arg = parse_spec(spec)
    if name in LEARNED_SPECS:
        return True
    inner = REGISTRY[name].inner
    return inner is not None and arg is not None and any(is_learned(s) for s in inner(arg))


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
    if entry.inner is not None and sep:  # a wrapper's specs, checked before any output
        for part in entry.inner(arg):
            parse_spec(part)
    return name, (arg if sep else None)


def parse_specs(text: str, flag: str = "--controllers") -> list[str]:
    """A comma-separated list of specs, each validated (duplicates and empty items refused)."""
    specs = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in specs):
        raise ConfigError(f"{flag}: expected a comma-separated list of specs; known: {describe_specs()}")
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise ConfigError(f"{flag}: {dup} given twice")
    for s in specs:
        parse_spec(s)
    return specs


def spec_form(name: str, entry: Entry) -> str:
    """How the spec is written: `name`, `name:ARG` or `name[:ARG]`."""
    if entry.arg is None:
        return name
    return f"{name}[:{entry.arg}]" if entry.optional_arg else f"{name}:{entry.arg}"


def known_specs() -> list[str]:
    """The registered names (spec forms with their argument placeholder)."""
    return [spec_form(n, e) for n, e in REGISTRY.items()]


def describe_specs() -> str:
    """The known spec forms, comma-separated (for error messages)."""
    return ", ".join(known_specs())


def specs_help() -> str:
    """The `--help` epilog of the CLIs: every spec form with its one-line help."""
    return "controller specs:\n" + "\n".join(f"  {spec_form(n, e):<20} {e.help}" for n, e in REGISTRY.items())


def contract_specs() -> list[str]:
    """Specs the controller contract tests build on a simulated node."""
    return [e.contract_spec or name for name, e in REGISTRY.items() if e.contract_spec is not None]


def make_controller(spec: str, context: ControllerContext) -> Controller:
    """Build the controller named by `spec`; `ConfigError` on an unknown or malformed spec, or on a
    simulator-only controller without a simulated node."""
    name, arg = parse_spec(spec)
    entry = REGISTRY[name]
    if entry.needs_sim and context.sim is None:
        raise ConfigError(
            f"controller {name!r} needs the simulator (a SimNode); it cannot run on a real node"
        )
    return entry.factory(context, arg)


@dataclass(frozen=True)
class SpecFactory:
    """Builds the controller of `spec` for any context (a `ControllerFactory`); picklable, so that
    worker processes can build it too (the warm start's parallel teacher episodes)."""

    spec: str

    def __call__(self, context: ControllerContext, arg: str | None = None) -> Controller:
        return make_controller(self.spec, context)


def factory_of(spec: str) -> ControllerFactory:
    """The factory that builds `spec` for any context (e.g. a teacher controller built afresh for
    each training episode's node); the spec is checked now, the controller built on each call."""
    parse_spec(spec)
    return SpecFactory(spec)
