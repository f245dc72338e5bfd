#!/usr/bin/env python
"""serve.py: run a controller as the live controller of a node, safely (DESIGN §1 use 3).

    serve.py --config FILE --controller SPEC [--dry-run] [--sim] [--interval-ms MS] [--duration-s N]

SPEC is any controller spec of `harness.registry` (`parties`, `heracles`, `prm`, `qprm-*`, `bo`,
`rl:PATH`, ...). The node comes from the config (configs/serve/*.yaml, `harness.serving.ServeConfig`):
its `linux` section names a LinuxNode config (cgroups, resctrl, cpufreq, tc, Docker; hw/), or, with
--sim, its `sim` section a scenario for a SimNode rehearsal (real time, or faster with `speed`).
Every tick is one `env.loop` tick through the guard chain (`GuardsConfig.serving()` by default)
under the supervisor of `harness.serving`: safe mode on a stale or silent latency feed, handover of a
learned or BO controller to a fallback (PARTIES) when QoS violations persist, actuation retries
with backoff, SIGTERM/SIGINT = finish the tick, restore the node, exit 0.

Start-up order (fail fast, nothing written to the node on bad input):
  1. the config and the controller specs are checked (exit 2 when invalid);
  2. the node is started: a LinuxNode first replays the journal a killed run left (the node is put
     back as found before anything else), then probes the host (a missing knob: exit 2) and
     resolves the apps (a missing cgroup, container or process: exit 2);
  3. the controllers are built and checked against the node (an unknown controller, a missing,
     corrupt or mismatched checkpoint: exit 2, the node closed again untouched);
  4. the run directory gets the resolved config; only then is the start allocation applied and
     the loop started. The node is closed - everything restored - on every exit path.

--dry-run makes no writes: apply() validates, diffs and logs what it would write; the LinuxNode is
not reset (the start allocation is assumed in force) and configs that change the node at start
(created cgroups, moved processes, tc) are refused. One exception, on purpose: like every start,
it first replays the journal a killed run left (that only puts the node back as it was found).

Outputs (run directory: --out, or output.dir/<UTC time>-<controller>): config.yaml (resolved),
decisions.jsonl (one record per tick: env.loop's TickRecord plus a `serving` block), tb/
(TensorBoard), serve.log, summary.json. Prometheus /metrics and /healthz on metrics.host:port
(127.0.0.1:9178 by default; --metrics-port 0 picks a free port). A status line per tick on stdout
unless --quiet.

--bench measures the loop's overhead (decide + guards + apply per tick, and its CPU share of one
core at the interval) with every output on, back to back, for each of the comma-separated specs.
With --sim on the config's scenario (--scenario to change it, e.g. mix6-const); on a LinuxNode with
a synthetic in-process latency feed (it really applies allocations unless --dry-run).

Exit status: 0 done or stopped by a signal; 2 bad input; 1 an unexpected error (after restoring).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from harness.argtypes import non_negative, positive
from harness.registry import specs_help
from harness.serving import deploy


def build_parser() -> argparse.ArgumentParser:
    """serve.py's arguments (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="serve.py",
        description=__doc__.split("\n\n")[0],
        epilog=specs_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="serve config YAML (configs/serve/*.yaml)")
    p.add_argument(
        "--controller", required=True, help="controller spec (see below); with --bench a comma-separated list"
    )
    p.add_argument("--dry-run", action="store_true", help="log the writes it would make; make none")
    p.add_argument(
        "--sim", action="store_true", help="rehearse on the config's simulated scenario (a SimNode)"
    )
    p.add_argument("--scenario", help="with --sim: another scenario (name in configs/scenarios/ or a path)")
    p.add_argument(
        "--speed", type=non_negative, help="with --sim: simulated seconds per real second (0 = flat out)"
    )
    p.add_argument("--interval-ms", type=positive, help="control interval (default: the node's, 500 ms)")
    p.add_argument(
        "--duration-s", type=non_negative, help="stop after this long (default: until SIGTERM/SIGINT)"
    )
    p.add_argument("--out", help="run directory (default: output.dir/<UTC time>-<controller>)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics and /healthz port (0 = a free port)")
    p.add_argument("--no-metrics", action="store_true", help="no /metrics endpoint")
    p.add_argument("--quiet", action="store_true", help="no per-tick status line")
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.add_argument("--bench", action="store_true", help="measure the loop's overhead and exit (see above)")
    p.add_argument("--ticks", type=int, default=300, help="with --bench: ticks per controller (default 300)")
    p.add_argument(
        "--pace-ms",
        type=non_negative,
        default=20.0,
        help="with --bench: real time between ticks (default 20; 0 = back to back)",
    )
    return p


class _StderrHandler(logging.StreamHandler):
    """Logs to whatever sys.stderr is when a record is emitted (tests swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(h)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and serve; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    return deploy.main(
        deploy.ServeOptions(
            config=args.config,
            controller=args.controller,
            dry_run=args.dry_run,
            sim=args.sim,
            scenario=args.scenario,
            speed=args.speed,
            interval_ms=args.interval_ms,
            duration_s=args.duration_s,
            out=args.out,
            metrics_port=args.metrics_port,
            no_metrics=args.no_metrics,
            quiet=args.quiet,
            bench=args.bench,
            ticks=args.ticks,
            pace_ms=args.pace_ms,
            argv=tuple(argv),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
