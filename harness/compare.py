"""`compare` and `timeline` (DESIGN §5): controllers x one scenario x seeds -> a table, and the
per-interval view of PARTIES Fig. 9. See `evaluate.py` for the command-line contract."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from env.guards import GuardsConfig
from env.loop import read_jsonl
from env.outdir import check_out, staged_output
from env.sim.scenario import Scenario
from harness.output import pmap, safe_name, write_config, write_json
from harness.plots import plot_compare, plot_timeline
from harness.registry import parse_specs
from harness.runs import RunJob, load_guards_arg, load_scenario_arg, probe, run_summary

_COLUMNS = (  # key, header, scale, decimals
    ("qos_guarantee", "QoS guarantee (%)", 100.0, 1),
    ("window_sustained", "window met (% of seeds)", 100.0, 0),
    ("window_tail_ratio", "window p99/target", 1.0, 2),
    ("mean_tardiness", "tardiness (p99/target)", 1.0, 2),
    ("lc_emu", "LC EMU (%)", 100.0, 0),
    ("emu", "EMU (%)", 100.0, 1),
    ("be_throughput", "BE throughput (%)", 100.0, 1),
    ("convergence_s", "convergence (s)", 1.0, 1),
    ("unconverged", "unconverged", 1.0, 1),
    ("violations", "violations", 1.0, 1),
    ("decide_ms_p50", "decide p50 (ms)", 1.0, 3),
    ("decide_ms_p99", "decide p99 (ms)", 1.0, 3),
)


def _fmt_stat(vals: list[float | None], scale: float, digits: int) -> str:
    """'mean ± sample std' over seeds (just the mean for one seed; n/a when undefined)."""
    xs = [v * scale for v in vals if v is not None]
    if not xs:
        return "n/a"
    mean = float(np.mean(xs))
    if len(xs) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {float(np.std(xs, ddof=1)):.{digits}f}"


def summary_table(results: list[dict[str, Any]], controllers: Sequence[str]) -> str:
    """Markdown table: one row per controller, mean ± sample standard deviation over seeds."""
    head = "| controller | seeds | " + " | ".join(h for _, h, _, _ in _COLUMNS) + " |"
    sep = "|" + "---|" * (len(_COLUMNS) + 2)
    lines = [head, sep]
    for c in controllers:
        rows = [r for r in results if r["controller"] == c]
        cells = [_fmt_stat([r[k] for r in rows], scale, d) for k, _, scale, d in _COLUMNS]
        lines.append(f"| {c} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def allocation_table(results: list[dict[str, Any]], controllers: Sequence[str]) -> str:
    """Markdown table of the resources held (`env.metrics.mean_allocation`): one row per app and BE
    job, one column per controller, "cores / LLC ways / GHz", each the mean over its seeds' runs."""
    apps: list[str] = []
    for r in results:
        apps += [a for a in r.get("mean_allocation", {}) if a not in apps]
    lines = ["| app | " + " | ".join(controllers) + " |", "|" + "---|" * (len(controllers) + 1)]
    for app in apps:
        cells = []
        for c in controllers:
            held = [
                r["mean_allocation"][app]
                for r in results
                if r["controller"] == c and app in r.get("mean_allocation", {})
            ]
            if not held:
                cells.append("-")
                continue
            cores, ways, mhz = (
                float(np.mean([h[k] for h in held])) for k in ("cores", "llc_ways", "freq_mhz")
            )
            cells.append(f"{cores:.2f} / {ways:.1f} / {mhz / 1000:.2f}")
        lines.append(f"| {app} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def search_table(results: list[dict[str, Any]], controllers: Sequence[str]) -> str | None:
    """Markdown table of what the searching controllers' searches cost (CLITE's measure of a search:
    samples until a configuration meets every QoS target): per controller that reports searches in
    its `run_stats` (`controller_stats.searches`, each with `first_qos_sample`, None when the search
    found none), the searches that found a QoS-meeting sample of all its seeds' searches, and the
    samples to the first one (median, most). None when no controller reports searches."""
    lines = []
    for c in controllers:
        searches = [
            s
            for r in results
            if r["controller"] == c
            for s in (r.get("controller_stats") or {}).get("searches", [])
        ]
        if not searches:
            continue
        firsts = [s["first_qos_sample"] for s in searches if s.get("first_qos_sample") is not None]
        cost = f"{float(np.median(firsts)):g} | {max(firsts)}" if firsts else "- | -"
        lines.append(f"| {c} | {len(firsts)} of {len(searches)} | {cost} |")
    if not lines:
        return None
    head = "| controller | searches finding QoS | samples to QoS (median) | samples to QoS (most) |"
    return "\n".join([head, "|---|---|---|---|", *lines])


def _tables(results: list[dict[str, Any]], controllers: Sequence[str]) -> str:
    searches = search_table(results, controllers)
    cost = (
        ""
        if searches is None
        else f"\nSearches (one per start or load shift; a sample is one allocation measured):\n\n{searches}\n"
    )
    return (
        f"{summary_table(results, controllers)}\n\nResources held, mean over the measured intervals "
        f"(cores / LLC ways / GHz; apps sharing a core group each count its cores):\n\n"
        f"{allocation_table(results, controllers)}\n{cost}"
    )


UNITS = {
    "qos_guarantee": "fraction of measured intervals with every LC target met (per-interval p99; Q-PRM's metric)",
    "window_sustained": "after the warm-up, every LC app's p99 over all requests to the end of the run meets "
    "its target (PARTIES Sec. 5.1's verdict; true/false)",
    "window_tail_ratio": "largest over the LC apps of p99 over all requests after the warm-up / target",
    "window_per_app": "per LC app over all requests after the warm-up: p99_us, p999_us, over_target "
    "(fraction of requests over the target), goodput_rps (requests within target per s), requests, "
    "approximated (intervals without a latency histogram)",
    "mean_tardiness": "p99 / target, mean over measured samples",
    "lc_emu": "aggregate load (sum of load / max load) if window_sustained, else 0; null when the load varies",
    "emu": "Heracles EMU: load of the LC apps meeting QoS + normalised BE throughput, per interval, mean",
    "be_throughput": "BE throughput normalised to the BE job alone, mean",
    "convergence_s": "mean over converged events (start, detected load changes) of the time to 5 met intervals",
    "unconverged": "events (start, load changes) not converged before the next event or the end",
    "violations": "measured intervals with at least one LC target missed",
    "decide_ms_p50": "ms",
    "decide_ms_p99": "ms",
    "mean_allocation": "per app and BE job, the mean over the measured intervals of each resource held: "
    "cores, llc_ways, freq_mhz, memory_gb, disk_mbps",
}


def run_compare(
    scenario: Scenario,
    scenario_file: str,
    specs: list[str],
    n_seeds: int,
    out: Path,
    *,
    workers: int,
    guards: GuardsConfig,
    overwrite: bool,
    argv: Sequence[str],
    plot: bool = True,
) -> list[dict[str, Any]]:
    """`evaluate.py compare`: every controller in `specs` on `scenario` for `n_seeds` seeds (node seed
    `scenario.seed + i`), under `guards`; writes the runs, summary.json/.md, config.yaml and a plot into
    `out` and returns one summary row per run."""
    seeds = [scenario.seed + i for i in range(n_seeds)]
    check_out(out, overwrite)
    probe(scenario, specs, seeds[0])
    with staged_output(out, overwrite) as tmp:
        (tmp / "runs").mkdir()
        jobs = [
            RunJob(s, scenario, seed, guards, str(tmp / "runs" / f"{safe_name(s)}-seed{seed}.jsonl"))
            for s in specs
            for seed in seeds
        ]
        results = pmap(run_summary, jobs, workers, "compare")
        write_json(
            tmp / "summary.json",
            {"scenario": scenario.name, "scenario_file": scenario_file, "units": UNITS, "results": results},
        )
        (tmp / "summary.md").write_text(
            f"# compare: {scenario.name}\n\n{scenario.description}\n\n"
            f"Seeds {seeds}; warm-up {scenario.warmup_s:g} s of {scenario.duration_s:g} s; "
            f"mean ± standard deviation over seeds.\n\n{_tables(results, specs)}"
        )
        write_config(
            tmp / "config.yaml",
            {
                "command": "compare",
                "argv": list(argv),
                "scenario_file": scenario_file,
                "scenario": scenario,
                "controllers": specs,
                "seeds": seeds,
                "guards": guards,
                "workers": workers,
            },
        )
        if plot:
            plot_compare(results, specs, tmp / "compare.png", scenario.name)
    return results


def run_timeline(
    scenario: Scenario,
    scenario_file: str,
    specs: list[str],
    seed: int,
    out: Path,
    *,
    workers: int,
    guards: GuardsConfig,
    overwrite: bool,
    argv: Sequence[str],
) -> list[dict[str, Any]]:
    """`evaluate.py timeline`: every controller on `scenario` for one seed, with the per-interval records
    kept for PARTIES Fig. 9's view; writes the runs, summary, config and timeline plot into `out`."""
    check_out(out, overwrite)
    probe(scenario, specs, seed)
    with staged_output(out, overwrite) as tmp:
        (tmp / "runs").mkdir()
        paths = {s: tmp / "runs" / f"{safe_name(s)}.jsonl" for s in specs}
        jobs = [RunJob(s, scenario, seed, guards, str(paths[s])) for s in specs]
        results = pmap(run_summary, jobs, workers, "timeline")
        write_json(
            tmp / "summary.json",
            {"scenario": scenario.name, "scenario_file": scenario_file, "units": UNITS, "results": results},
        )
        (tmp / "summary.md").write_text(
            f"# timeline: {scenario.name}\n\n{scenario.description}\n\nSeed {seed}.\n\n"
            f"{_tables(results, specs)}"
        )
        write_config(
            tmp / "config.yaml",
            {
                "command": "timeline",
                "argv": list(argv),
                "scenario_file": scenario_file,
                "scenario": scenario,
                "controllers": specs,
                "seed": seed,
                "guards": guards,
            },
        )
        plot_timeline({s: read_jsonl(paths[s]) for s in specs}, tmp / "timeline.png", scenario)
    return results


def compare(
    *,
    scenario: str,
    controllers: str,
    n_seeds: int,
    out: Path,
    workers: int = 2,
    guards: str | None = None,
    overwrite: bool = False,
    argv: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`evaluate.py compare` (its --help): the arguments as on the command line (a scenario name
    or file, comma-separated specs, a guards YAML path or None); prints the table."""
    scn, path = load_scenario_arg(scenario)
    specs = parse_specs(controllers)
    results = run_compare(
        scn,
        path,
        specs,
        n_seeds,
        out,
        workers=workers,
        guards=load_guards_arg(guards),
        overwrite=overwrite,
        argv=argv,
    )
    print(summary_table(results, specs))
    searches = search_table(results, specs)
    if searches is not None:
        print(f"\n{searches}")
    print(f"wrote {out}/")
    return results


def timeline(
    *,
    scenario: str,
    controllers: str,
    out: Path,
    seed: int | None = None,
    workers: int = 2,
    guards: str | None = None,
    overwrite: bool = False,
    argv: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`evaluate.py timeline` (its --help); `seed` None = the scenario's own."""
    scn, path = load_scenario_arg(scenario)
    results = run_timeline(
        scn,
        path,
        parse_specs(controllers),
        scn.seed if seed is None else seed,
        out,
        workers=workers,
        guards=load_guards_arg(guards),
        overwrite=overwrite,
        argv=argv,
    )
    print(f"wrote {out}/timeline.png")
    return results
