"""CoCo Fig. 2 behind `evaluate.py affordable`: the affordable client load of each controller,
normalised to no interference.

CoCo Sec. 4.2 / Fig. 2 ("Affordable client load without SLO violations (normalized to
no-interference, which is 100%)"): every container of the scenario runs at r x its no-interference
load SL_full, the load it sustains alone on its cores with the full LLC and MBA (Sec. 3.1, Eq. 1;
measured by CoCo's own profile, `baselines.coco.profile_scenario`, on the scenario's deployment).
For each controller the protocol finds

* `affordable_pct`: the largest r of the grid at which the point is sustained (DESIGN §5: every
  container's p99 over the measured window after the warm-up meets its target, in every seed);
* `per_app_pct`: per container, the largest r before that container first misses its target walking
  up the grid (the others at the same r), the per-workload bars of Fig. 2.

`affordable_pct` by binary search over the grid (`harness.maxload.max_level`: sustainability is
taken to be monotone in load, as in PARTIES Sec. 5.1); `per_app_pct` by walking up, because one
container's own verdict need not be monotone (admission control may reject another one and free
its partition). Each load point runs the whole window in every seed, memoised, so that one point
gives every container's verdict. Ratios between controllers (CoCo
claims 2.2-9.1x no partitioning and up to 1.2x round-robin) are reported for `affordable_pct` and
per container; a ratio over a reference that affords nothing is null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env import metrics as M
from env.config import ConfigError, plain_data
from env.guards import GuardsConfig
from env.outdir import check_out, staged_output
from env.sim.node import SimNode
from env.sim.scenario import Scenario
from harness.maxload import max_level, parse_pcts
from harness.output import pmap, write_config, write_json
from harness.plots import plot_affordable
from harness.registry import parse_specs
from harness.runs import RunJob, execute, load_guards_arg, load_scenario_arg, probe

DEFAULT_LOADS_PCT = tuple(2.5 * k for k in range(1, 41))  # 2.5 .. 100 % of SL_full
DEFAULT_CONTROLLERS = "coco,coco-rr,coco-nopart"


@dataclass(frozen=True)
class AffordableProtocol:
    """Fig. 2's protocol (module docstring): the r grid in % of each container's SL_full, the
    window of each point and the seeds that must all sustain it."""

    loads_pct: tuple[float, ...] = DEFAULT_LOADS_PCT
    warmup_s: float = M.WARMUP_S
    measure_s: float = M.MEASURE_S
    seeds: tuple[int, ...] = (0,)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    verdict: str = "window"


def sl_full_fractions(scenario: Scenario) -> dict[str, float]:
    """Each container's SL_full (fraction of its profile's max load): CoCo's profile of it alone on
    the cores CoCo pins it to, full LLC and MBA (Sec. 3.1)."""
    from baselines.coco import load_coco_config, profile_scenario

    caps = SimNode(scenario, seed=scenario.seed).capabilities()
    profiles, _ = profile_scenario(scenario, caps, load_coco_config("coco"))
    return {a: p.sl_full for a, p in profiles.items()}


def scaled_scenario(
    scenario: Scenario, sl_full: dict[str, float], r_pct: float, proto: AffordableProtocol, seed: int
) -> Scenario:
    """The scenario with every container at `r_pct` % of its SL_full, `warmup_s + measure_s` long."""
    loaded = scenario.with_loads({a: r_pct / 100.0 * x for a, x in sl_full.items()})
    return dataclasses.replace(
        loaded,
        name=f"{scenario.name}-r{r_pct:g}",
        duration_s=proto.warmup_s + proto.measure_s,
        warmup_s=proto.warmup_s,
        seed=seed,
    )


@dataclass(frozen=True)
class ControllerTask:
    """One worker task: the whole search of one controller."""

    spec: str
    scenario: Scenario
    sl_full: dict[str, float]
    proto: AffordableProtocol


@dataclass(frozen=True)
class PointVerdict:
    """One load point over every seed: each container sustained in every seed, and all of them."""

    per_app: dict[str, bool]

    @property
    def sustained(self) -> bool:
        return all(self.per_app.values())


def point_verdict(task: ControllerTask, r_pct: float) -> PointVerdict:
    """Run every seed of the point to the end of its window; per container, sustained in all seeds."""
    ok: dict[str, bool] = {}
    for seed in task.proto.seeds:
        scn = scaled_scenario(task.scenario, task.sl_full, r_pct, task.proto, seed)
        recs = execute(RunJob(task.spec, scn, seed, task.proto.guards))
        per = M.sustained_per_app(recs, task.proto.warmup_s, task.proto.measure_s, verdict=task.proto.verdict)
        for a, v in per.items():
            ok[a] = ok.get(a, True) and v
    return PointVerdict(ok)


def search_controller(task: ControllerTask) -> dict[str, Any]:
    """Worker: `affordable_pct` and `per_app_pct` of one controller (module docstring)."""
    levels = task.proto.loads_pct
    cache: dict[int, PointVerdict] = {}

    def at(i: int) -> PointVerdict:
        if i not in cache:
            cache[i] = point_verdict(task, levels[i])
        return cache[i]

    def pct(i: int) -> float:
        return float(levels[i]) if i >= 0 else 0.0

    top = max_level(lambda i: at(i).sustained, len(levels))
    first_miss: dict[str, int] = {}
    for i in range(len(levels)):  # walk up until every container has missed once
        for a, ok in at(i).per_app.items():
            if not ok:
                first_miss.setdefault(a, i)
        if len(first_miss) == len(task.sl_full):
            break
    per_app = {a: pct(first_miss.get(a, len(levels)) - 1) for a in task.sl_full}
    return {
        "affordable_pct": pct(top),
        "per_app_pct": per_app,
        "capped": top == len(levels) - 1,  # sustained at the top of the grid: a lower bound
        "points": {f"{levels[i]:g}": cache[i].per_app for i in sorted(cache)},
    }


def ratio(a: float, b: float) -> float | None:
    """a / b, None when the reference b affords nothing."""
    return a / b if b > 0 else None


def ratios(results: dict[str, dict[str, Any]], specs: Sequence[str]) -> dict[str, Any]:
    """For every ordered pair of controllers: the ratio of `affordable_pct` and, per container, of
    `per_app_pct` with its range over the containers (Fig. 2's "2.2-9.1x")."""
    out: dict[str, Any] = {}
    for a in specs:
        for b in specs:
            if a == b:
                continue
            ra, rb = results[a], results[b]
            per = {x: ratio(ra["per_app_pct"][x], rb["per_app_pct"][x]) for x in ra["per_app_pct"]}
            finite = [v for v in per.values() if v is not None]
            out[f"{a}/{b}"] = {
                "affordable": ratio(ra["affordable_pct"], rb["affordable_pct"]),
                "per_app": per,
                "per_app_range": [min(finite), max(finite)] if finite else None,
            }
    return out


def run_affordable(
    *,
    scenario: str,
    controllers: str = DEFAULT_CONTROLLERS,
    out: Path,
    loads: str | None = None,
    seeds: int = 1,
    warmup_s: float = M.WARMUP_S,
    measure_s: float = M.MEASURE_S,
    verdict: str = "window",
    guards: str | None = None,
    workers: int = 2,
    overwrite: bool = False,
    argv: Sequence[str] = (),
) -> dict[str, Any]:
    """`evaluate.py affordable` (its --help); everything validated before `out` is created. Text
    arguments are as on the command line; bad input is a `ConfigError`."""
    specs = parse_specs(controllers)
    scn, scn_path = load_scenario_arg(scenario)
    load_list = parse_pcts(loads, "--loads") if loads else list(DEFAULT_LOADS_PCT)
    if load_list != sorted(set(load_list)):
        raise ConfigError("--loads: must be increasing")
    if verdict not in M.VERDICTS:
        raise ConfigError(f"--verdict: one of {list(M.VERDICTS)}, got {verdict!r}")
    proto = AffordableProtocol(
        loads_pct=tuple(load_list),
        warmup_s=warmup_s,
        measure_s=measure_s,
        seeds=tuple(range(scn.seed, scn.seed + seeds)),
        guards=load_guards_arg(guards),
        verdict=verdict,
    )
    sl_full = sl_full_fractions(scn)
    check_out(Path(out), overwrite)
    probe(scaled_scenario(scn, sl_full, load_list[0], proto, proto.seeds[0]), specs, proto.seeds[0])
    tasks = [ControllerTask(s, scn, sl_full, proto) for s in specs]
    found = pmap(search_controller, tasks, workers, "affordable load")
    results = dict(zip(specs, found))
    summary: dict[str, Any] = {
        "kind": "affordable",
        "scenario": scn.name,
        "protocol": plain_data(proto),
        "sl_full": sl_full,
        "units": {
            "sl_full": "fraction of the profile's max load (CoCo's profile: alone on its cores, full LLC and MBA)",
            "*_pct": "percent of each container's SL_full (100 = no interference)",
        },
        "results": results,
        "ratios": ratios(results, specs),
    }
    with staged_output(Path(out), overwrite) as tmp:
        write_json(tmp / "summary.json", plain_data(summary))
        (tmp / "summary.md").write_text(affordable_markdown(summary, specs))
        plot_affordable(summary, specs, tmp / "affordable.png")
        write_config(
            tmp / "config.yaml",
            {
                "command": "affordable",
                "argv": list(argv),
                "scenario": scn_path,
                "protocol": proto,
                "controllers": specs,
            },
        )
    print(affordable_markdown(summary, specs))
    print(f"wrote {out}/")
    return summary


def _fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def affordable_markdown(summary: dict[str, Any], specs: Sequence[str]) -> str:
    """summary.md: the protocol, affordable load per controller and container, and the ratios."""
    p = summary["protocol"]
    rule = (
        "every container's p99 over all requests of the measured window meets its target"
        if p["verdict"] == "window"
        else ">= 95% of measured intervals meet every target"
    )
    apps = list(summary["sl_full"])
    lines = [
        f"# Affordable load (CoCo Fig. 2), scenario `{summary['scenario']}`",
        "",
        f"Every container at r x its SL_full (CoCo's profile); r on {p['loads_pct'][0]:g}..{p['loads_pct'][-1]:g} % "
        f"({len(p['loads_pct'])} levels); warm-up {p['warmup_s']:g} s, measured {p['measure_s']:g} s; "
        f"sustained (verdict `{p['verdict']}`) = {rule}, in every seed of {p['seeds']}.",
        "",
        "| controller | affordable (% of SL_full) | " + " | ".join(apps) + " | points run |",
        "|---|---|" + "---|" * len(apps) + "---|",
    ]
    for s in specs:
        r = summary["results"][s]
        top = f"{r['affordable_pct']:g}" + (" (grid top)" if r["capped"] else "")
        cells = " | ".join(f"{r['per_app_pct'][a]:g}" for a in apps)
        lines.append(f"| {s} | {top} | {cells} | {len(r['points'])} |")
    lines += ["", "| ratio | affordable | per container (min-max) |", "|---|---|---|"]
    for k, v in summary["ratios"].items():
        rng = v["per_app_range"]
        span = "n/a" if rng is None else f"{rng[0]:.2f}-{rng[1]:.2f}x"
        lines.append(f"| {k} | {_fmt_ratio(v['affordable'])} | {span} |")
    return "\n".join(lines) + "\n"
