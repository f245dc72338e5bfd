#!/usr/bin/env python
"""evaluate.py: run controllers through the same simulated scenarios and reproduce the papers'
experiments (DESIGN §1 use 2, §5).

Subcommands (each has --help):

  compare    controllers x one scenario x seeds -> summary.json, summary.md (mean and spread over
             seeds), compare.png, per-run JSONL records, the resolved config
  maxload    PARTIES Sec. 5 protocol: max sustained load heatmaps (Fig. 5/6/8) and, with --mixes,
             LC EMU by mix size (Fig. 7 violins)
  timeline   per-interval latency/target, allocations and BE throughput over time (Fig. 9)
  calibrate  the papers' tables reproduced in the simulator (env.sim.calibration)
  bench      simulator speed and serve.py's loop overhead (env.sim.bench, env.serving)

Every run is one `env.loop.run_episode` of a controller (a spec of `baselines.registry`) on a
`SimNode`, with the evaluation guard chain (clamp only, `env.guards`) unless --guards says
otherwise; every number comes from `env.metrics`. Every controller starts from PARTIES' fair
allocation (the node's initial state). Seeds: run i of a scenario uses seed `scenario.seed + i`
for the node; the controller's generator is `default_rng([seed, 1])`.

Output: everything is written into a temporary directory beside --out and moved into place at the
end, so a failed or interrupted run leaves no partial directory; an existing non-empty --out is
refused unless --overwrite. Bad input (an unknown controller spec, a scenario naming an unknown app,
a trace file with bad rows, ...) is reported before anything is created, with exit status 2.

Runs are independent and go to a pool of --workers processes (default 2); results are identical
to --workers 1 because each run is seeded by its own identity, never by the order it ran in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baselines.registry import REGISTRY, ControllerContext, make_controller, spec_form
from env import metrics as M
from env.config import ConfigError, run_cli
from env.evaluation import (
    MIX_SIZES,
    load_guards_arg,
    load_scenario_arg,
    maxload_markdown,
    parse_specs_arg,
    run_compare,
    run_maxload,
    run_timeline,
    summary_table,
)
from env.sim import bench, calibration


# ======================================================================================================
# CLI
# ======================================================================================================
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def _sizes(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected mix sizes like 2,3,4, got {text!r}") from None
    if not vals or any(not 2 <= v <= 12 for v in vals):
        raise argparse.ArgumentTypeError("mix sizes must be in 2..12")
    return vals


def _controllers_help() -> str:
    return "controller specs:\n" + "\n".join(f"  {spec_form(n, e):<20} {e.help}" for n, e in REGISTRY.items())


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="evaluate.py",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1].split("\n\nEvery run")[0],
        epilog=_controllers_help(),
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
        sp.add_argument("--workers", type=_positive_int, default=2, help="parallel processes (default 2)")
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
        "({scenario, results: [{controller, seed, qos_guarantee, mean_tardiness, lc_emu, emu, "
        "be_throughput, convergence_s, violations, decide_ms_p50, decide_ms_p99}]}), summary.md "
        "(mean ± std over seeds), compare.png, runs/<controller>-seed<k>.jsonl and config.yaml. "
        "Metrics are defined in env/metrics.py; lc_emu is the aggregate load if sustained, else 0, "
        "and null when the scenario's load varies.",
        epilog=_controllers_help(),
        formatter_class=fmt,
    )
    common(c)
    c.add_argument("--seeds", type=_positive_int, default=3, help="seeds per controller (default 3)")

    t = sub.add_parser(
        "timeline",
        help="latency, allocations and BE throughput over time (PARTIES Fig. 9)",
        description="Run every controller once on a scenario and plot, one column per controller: "
        "load, p99/target (log), cores, LLC ways, frequency per app and BE throughput per interval "
        "(timeline.png), with every tick in runs/<controller>.jsonl and summary.json/md.",
        epilog=_controllers_help(),
        formatter_class=fmt,
    )
    common(t)
    t.add_argument("--seed", type=int, default=None, help="node seed (default: the scenario's)")

    m = sub.add_parser(
        "maxload",
        help="max sustained load heatmaps (PARTIES Fig. 5/6/8) and EMU by mix size (Fig. 7)",
        description="PARTIES Sec. 5 protocol: each load point runs 30 s warm-up + 60 s measured; it is "
        "sustained when >= 95% of measured intervals meet every target (in every seed). With --apps "
        "A,B: for each load of A, the max sustained load of B (Fig. 5). With 3+ apps: for each (A, B) "
        "load pair, the max sustained load of the LAST app, middle apps at --fixed-loads (Fig. 6/8). "
        "The last app's load is found by binary search over the load grid (sustainability is "
        "monotone in load). LC EMU = max over the grid of the aggregate sustained load. --mixes N "
        "samples N mixes per size (--mix-sizes) and reports each mix's LC EMU (Fig. 7): by the grid "
        "for 2-3 apps and, for 4+ apps, by a greedy search identical for every controller (all apps at "
        "the largest equal sustained load, then round-robin +10% steps while sustained).",
        epilog=_controllers_help(),
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
        "--mixes", type=_count, default=0, help="sample N random mixes per mix size for Fig. 7 (default 0)"
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
        "--seeds", type=_positive_int, default=1, help="seeds per load point (PARTIES: 3; default 1)"
    )
    m.add_argument("--seed", type=int, default=0, help="first seed, also the mix sampling seed (default 0)")
    m.add_argument("--platform", default="parties", help="node platform (configs/node/); default parties")
    m.add_argument("--be", default="be_parties", help="comma-separated BE jobs, or none (default be_parties)")
    m.add_argument("--warmup-s", type=float, default=M.WARMUP_S, help="warm-up per point (default 30)")
    m.add_argument(
        "--measure-s", type=float, default=M.MEASURE_S, help="measured window per point (default 60)"
    )

    calibration.add_cli(sub)
    bench.add_cli(sub, extra={"serve_loop_overhead": _serve_loop_overhead})
    return p


def _serve_loop_overhead() -> list[dict[str, Any]]:
    """serve.py's loop overhead on the 6-app mix (issue 7 goal: decide + guards + apply <= 5 ms p99,
    the loop <= 2% of a core at 500 ms), for PARTIES and for a controller that never changes anything."""
    from env.serving import bench_sim

    def factory(spec: str):
        return lambda caps, scn, node: make_controller(spec, ControllerContext(caps, scn, node, 0))

    return [
        bench_sim(factory(s), scenario="mix6-const", label=f"serve loop, {s}") for s in ("parties", "static")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return run_cli(f"evaluate.py {args.command}", lambda: _run(args, argv))


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "compare":
        scenario, path = load_scenario_arg(args.scenario)
        results = run_compare(
            scenario,
            path,
            parse_specs_arg(args.controllers),
            args.seeds,
            Path(args.out),
            workers=args.workers,
            guards=load_guards_arg(args.guards),
            overwrite=args.overwrite,
            argv=argv,
        )
        print(summary_table(results, parse_specs_arg(args.controllers)))
        print(f"wrote {args.out}/")
        return 0
    if args.command == "timeline":
        scenario, path = load_scenario_arg(args.scenario)
        specs = parse_specs_arg(args.controllers)
        run_timeline(
            scenario,
            path,
            specs,
            scenario.seed if args.seed is None else args.seed,
            Path(args.out),
            workers=args.workers,
            guards=load_guards_arg(args.guards),
            overwrite=args.overwrite,
            argv=argv,
        )
        print(f"wrote {args.out}/timeline.png")
        return 0
    if args.command == "maxload":
        summary = run_maxload(args, argv)
        print(maxload_markdown(summary, parse_specs_arg(args.controllers)))
        print(f"wrote {args.out}/")
        return 0
    handler = getattr(args, "func", None)  # set by add_cli(subparsers) of the optional modules
    if handler is None:
        raise ConfigError(f"subcommand {args.command!r} registered no handler")
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
