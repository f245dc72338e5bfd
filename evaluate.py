#!/usr/bin/env python
"""evaluate.py: run controllers through the same simulated scenarios and reproduce the papers'
experiments (DESIGN §1 use 2, §5).

Subcommands (each has --help):

  compare    controllers x one scenario x seeds -> summary.json, summary.md (mean and spread over
             seeds), compare.png, per-run JSONL records, the resolved config
  maxload    PARTIES Sec. 5 protocol: max sustained load heatmaps (Fig. 5/6/8) and, with --mixes,
             LC EMU by mix size (Fig. 7 violins)
  timeline   per-interval latency/target, allocations and BE throughput over time (Fig. 9)
  affordable CoCo Fig. 2: each controller's affordable load (every container at r x its
             no-interference load), per container and together, and the ratios between controllers
  calibrate  the papers' tables reproduced in the simulator (env.sim.calibration)
  bench      simulator speed and serve.py's loop overhead (env.sim.bench, harness.serving)

Every run is one `env.loop.run_episode` of a controller (a spec of `harness.registry`) on a
`SimNode`, with the evaluation guard chain (clamp only, `env.guards`) unless --guards says
otherwise; every number comes from `env.metrics`. Every controller starts from PARTIES' fair
allocation (the node's initial state). Seeds: run i of a scenario uses seed `scenario.seed + i`
for the node; the controller's generator is `default_rng([seed, 1])`.

Output: --out is checked before any work (not a file, not under one, somewhere a directory can be
made; an existing non-empty --out is refused unless --overwrite, which never replaces the working
directory or a parent of it); everything is written into a temporary directory beside --out and
moved into place at the end, so a failed or interrupted run leaves no partial directory. Ctrl-C and
SIGTERM stop the worker processes, remove that directory and exit (130, 143). Bad input (an unknown controller spec, a scenario naming an unknown app,
a trace file with bad rows, ...) is reported before anything is created, with exit status 2.

Runs are independent and go to a pool of --workers processes (default 2); results are identical
to --workers 1 because each run is seeded by its own identity, never by the order it ran in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from env import metrics as M
from env.config import run_cli
from env.sim.scenario import PAGE_CACHE_STARTS
from harness.affordable import DEFAULT_CONTROLLERS, run_affordable
from harness.argtypes import count, non_negative, positive, positive_int
from harness.bench import run_bench
from harness.calibrate import run_calibrate
from harness.compare import compare, timeline
from harness.maxload import MIX_SIZES, run_maxload
from harness.registry import specs_help


# ======================================================================================================
# CLI
# ======================================================================================================
def _sizes(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected mix sizes like 2,3,4, got {text!r}") from None
    if not vals or any(not 2 <= v <= 12 for v in vals):
        raise argparse.ArgumentTypeError("mix sizes must be in 2..12")
    return vals


def build_parser() -> argparse.ArgumentParser:
    """evaluate.py's subcommands and their arguments (see the module docstring)."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="evaluate.py",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1].split("\n\nEvery run")[0],
        epilog=specs_help(),
        formatter_class=fmt,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(sp: argparse.ArgumentParser, scenario: bool = True) -> None:
        if scenario:
            sp.add_argument(
                "--scenario",
                required=True,
                help="scenario YAML file, or the name of one in configs/scenarios/ (e.g. mix3-const)",
            )
        sp.add_argument("--controllers", required=True, help="comma-separated controller specs (see below)")
        sp.add_argument(
            "--out", required=True, help="output directory (created; must not exist unless --overwrite)"
        )
        sp.add_argument("--workers", type=positive_int, default=2, help="parallel processes (default 2)")
        sp.add_argument(
            "--guards",
            metavar="FILE",
            help="guard chain YAML (env.guards.GuardsConfig); default: clamp only, as in evaluation",
        )
        sp.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    c = sub.add_parser(
        "compare",
        help="controllers x scenario x seeds -> summary table",
        description="Run every controller on one scenario for --seeds seeds. Writes summary.json "
        "({scenario, results: [{controller, seed, qos_guarantee, window_sustained, window_tail_ratio, "
        "window_per_app, mean_tardiness, lc_emu, emu, be_throughput, convergence_s, violations, "
        "decide_ms_p50, decide_ms_p99, mean_allocation, ...}]}), summary.md (mean ± std over seeds, "
        "the resources each app held and, for a searching controller such as bo, the samples each "
        "search took to meet every target), compare.png, "
        "runs/<controller>-seed<k>.jsonl and config.yaml. Metrics are defined in env/metrics.py: the "
        "window verdict (every app's p99 over all requests of the measured window meets its target, "
        "PARTIES Sec. 5.1) and the per-interval QoS guarantee; lc_emu is the aggregate load if "
        "sustained, else 0, and null when the scenario's load varies.",
        epilog=specs_help(),
        formatter_class=fmt,
    )
    common(c)
    c.add_argument("--seeds", type=positive_int, default=3, help="seeds per controller (default 3)")

    t = sub.add_parser(
        "timeline",
        help="latency, allocations and BE throughput over time (PARTIES Fig. 9)",
        description="Run every controller once on a scenario and plot, one column per controller: "
        "load, p99/target (log), cores, LLC ways, frequency per app and BE throughput per interval "
        "(timeline.png), with every tick in runs/<controller>.jsonl and summary.json/md.",
        epilog=specs_help(),
        formatter_class=fmt,
    )
    common(t)
    t.add_argument("--seed", type=count, default=None, help="node seed (default: the scenario's)")

    m = sub.add_parser(
        "maxload",
        help="max sustained load heatmaps (PARTIES Fig. 5/6/8) and EMU by mix size (Fig. 7)",
        description="PARTIES Sec. 5 protocol: each load point runs 30 s warm-up + 60 s measured; it is "
        "sustained (in every seed) when every app's p99 over all requests of the measured window meets "
        "its target (--verdict window, PARTIES Sec. 5.1: the load generators' tail of the whole minute), "
        "or, with --verdict intervals, when >= 95%% of the measured intervals meet every target. With --apps "
        "A,B: for each load of A, the max sustained load of B (Fig. 5). With 3+ apps: for each (A, B) "
        "load pair, the max sustained load of the LAST app, middle apps at --fixed-loads (Fig. 6/8). "
        "The last app's load is found by binary search over the load grid (sustainability is "
        "monotone in load). LC EMU = max over the grid of the aggregate sustained load. --mixes N "
        "samples N mixes per size (--mix-sizes) and reports each mix's LC EMU (Fig. 7): by the grid "
        "for 2-3 apps and, for 4+ apps, by a greedy search identical for every controller (all apps at "
        "the largest equal sustained load, then round-robin +10% steps while sustained).",
        epilog=specs_help(),
        formatter_class=fmt,
    )
    common(m, scenario=False)
    m.add_argument(
        "--apps", help="comma-separated LC apps, e.g. memcached,xapian,nginx (the last one is searched)"
    )
    m.add_argument(
        "--fixed-loads",
        default="10",
        help="loads (%% of max) of the apps between the second and the last: one value for all, or one each "
        "(default 10, PARTIES Fig. 6 uses 10,10,100 for moses,sphinx,mongodb)",
    )
    m.add_argument("--loads", help="load grid in %% (default 10,20,...,100)")
    m.add_argument(
        "--mixes", type=count, default=0, help="sample N random mixes per mix size for Fig. 7 (default 0)"
    )
    m.add_argument(
        "--mix-sizes", type=_sizes, default=list(MIX_SIZES), help="mix sizes for --mixes (default 2,3,4,5,6)"
    )
    m.add_argument(
        "--mix-search",
        choices=("auto", "grid", "greedy"),
        default="auto",
        help="LC EMU search per mix: auto = grid for 2-3 apps, greedy for 4+ (default)",
    )
    m.add_argument(
        "--seeds", type=positive_int, default=1, help="seeds per load point (PARTIES: 3; default 1)"
    )
    m.add_argument("--seed", type=count, default=0, help="first seed, also the mix sampling seed (default 0)")
    m.add_argument("--platform", default="parties", help="node platform (configs/node/); default parties")
    m.add_argument("--be", default="be_parties", help="comma-separated BE jobs, or none (default be_parties)")
    m.add_argument("--warmup-s", type=non_negative, default=M.WARMUP_S, help="warm-up per point (default 30)")
    m.add_argument(
        "--measure-s", type=positive, default=M.MEASURE_S, help="measured window per point (default 60)"
    )
    m.add_argument(
        "--verdict",
        choices=M.VERDICTS,
        default="window",
        help="when a point is sustained: window = every app's p99 over the measured window meets its "
        "target (PARTIES Sec. 5.1, default); intervals = >= 95%% of the measured intervals meet every target",
    )
    m.add_argument(
        "--page-cache",
        choices=PAGE_CACHE_STARTS,
        default="cold",
        help="how each point's apps start: cold = inside their cgroups under the first allocation "
        "(default); warm = as services that ran unmanaged before the manager took them over, their "
        "cached pages outside its memory limits (a scenario's page_cache, env.sim.scenario)",
    )

    af = sub.add_parser(
        "affordable",
        help="CoCo Fig. 2: affordable load normalised to no interference, per controller",
        description="CoCo Sec. 4.2 / Fig. 2 (harness.affordable): every container of --scenario runs at "
        "r x its SL_full (the load it sustains alone on its cores with the full LLC and MBA, by CoCo's "
        "profile); for each controller, the largest r of the --loads grid at which every container's "
        "p99 over the measured window meets its target in every seed (--verdict window; intervals = "
        ">= 95%% of intervals), and per container the largest r at which it alone meets its target. "
        "Binary search over the grid. Writes summary.json ({sl_full, results: {controller: "
        "{affordable_pct, per_app_pct, capped, points}}, ratios: {'a/b': {affordable, per_app, "
        "per_app_range}}}), summary.md, affordable.png and config.yaml.",
        epilog=specs_help(),
        formatter_class=fmt,
    )
    af.add_argument(
        "--scenario",
        default="coco-fig2",
        help="scenario YAML file or name in configs/scenarios/ (default coco-fig2; its loads are replaced)",
    )
    af.add_argument(
        "--controllers",
        default=DEFAULT_CONTROLLERS,
        help=f"comma-separated controller specs (default {DEFAULT_CONTROLLERS})",
    )
    af.add_argument(
        "--out", required=True, help="output directory (created; must not exist unless --overwrite)"
    )
    af.add_argument("--workers", type=positive_int, default=2, help="parallel processes (default 2)")
    af.add_argument(
        "--guards", metavar="FILE", help="guard chain YAML; default: clamp only, as in evaluation"
    )
    af.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    af.add_argument("--loads", help="r grid in %% of SL_full, increasing (default 2.5,5,...,100)")
    af.add_argument("--seeds", type=positive_int, default=1, help="seeds per load point (default 1)")
    af.add_argument(
        "--warmup-s", type=non_negative, default=M.WARMUP_S, help="warm-up per point (default 30)"
    )
    af.add_argument(
        "--measure-s", type=positive, default=M.MEASURE_S, help="measured window per point (default 60)"
    )
    af.add_argument(
        "--verdict",
        choices=M.VERDICTS,
        default="window",
        help="window = every container's p99 over the measured window meets its target (default); "
        "intervals = >= 95%% of the measured intervals meet it",
    )

    cal = sub.add_parser(
        "calibrate",
        help="reproduce the papers' tables in the simulator (PARTIES Tables 2 and 4, CoCo Table 1, facts)",
        description=calibration_doc(),
        formatter_class=fmt,
    )
    cal.add_argument(
        "--out", required=True, type=Path, help="output directory (must not exist unless --overwrite)"
    )
    cal.add_argument("--seed", type=count, default=0, help="seed of the simulated runs (default 0)")
    cal.add_argument("--workers", type=positive_int, default=2, help="worker processes (default 2)")
    cal.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    b = sub.add_parser(
        "bench",
        help="simulator speed (steps/s) on one core, and serve.py's loop overhead",
        description=bench_doc(),
        formatter_class=fmt,
    )
    b.add_argument("--out", required=True, type=Path, help="output directory (bench.json)")
    b.add_argument("--repeats", type=positive_int, default=5, help="timed runs per figure (default 5)")
    b.add_argument("--batch", type=positive_int, default=4096, help="nodes in the batched measurement")
    b.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    return p


def calibration_doc() -> str:
    """The calibration report's description (the simulator's module docstring)."""
    from env.sim import calibration

    return calibration.__doc__ or ""


def bench_doc() -> str:
    """The benchmark's description (the simulator bench's module docstring, then the layers above it)."""
    from env.sim import bench
    from harness import bench as layers

    return (bench.__doc__ or "") + "\n" + (layers.__doc__ or "")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and run the subcommand; the exit status (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return run_cli(f"evaluate.py {args.command}", lambda: _run(args, argv))


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    """One call into the harness per subcommand."""
    if args.command == "compare":
        compare(
            scenario=args.scenario,
            controllers=args.controllers,
            n_seeds=args.seeds,
            out=Path(args.out),
            workers=args.workers,
            guards=args.guards,
            overwrite=args.overwrite,
            argv=argv,
        )
    elif args.command == "timeline":
        timeline(
            scenario=args.scenario,
            controllers=args.controllers,
            seed=args.seed,
            out=Path(args.out),
            workers=args.workers,
            guards=args.guards,
            overwrite=args.overwrite,
            argv=argv,
        )
    elif args.command == "maxload":
        run_maxload(
            controllers=args.controllers,
            out=Path(args.out),
            apps=args.apps,
            fixed_loads=args.fixed_loads,
            loads=args.loads,
            mixes=args.mixes,
            mix_sizes=args.mix_sizes,
            mix_search=args.mix_search,
            seeds=args.seeds,
            seed=args.seed,
            platform=args.platform,
            be=args.be,
            warmup_s=args.warmup_s,
            measure_s=args.measure_s,
            verdict=args.verdict,
            page_cache=args.page_cache,
            guards=args.guards,
            workers=args.workers,
            overwrite=args.overwrite,
            argv=argv,
        )
    elif args.command == "affordable":
        run_affordable(
            scenario=args.scenario,
            controllers=args.controllers,
            out=Path(args.out),
            loads=args.loads,
            seeds=args.seeds,
            warmup_s=args.warmup_s,
            measure_s=args.measure_s,
            verdict=args.verdict,
            guards=args.guards,
            workers=args.workers,
            overwrite=args.overwrite,
            argv=argv,
        )
    elif args.command == "calibrate":
        run_calibrate(args.out, seed=args.seed, workers=args.workers, overwrite=args.overwrite)
    else:
        run_bench(args.out, repeats=args.repeats, batch=args.batch, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
