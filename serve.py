#!/usr/bin/env python
"""serve.py: run a controller as the live controller of a node, safely (DESIGN §1 use 3).

    serve.py --config FILE --controller SPEC [--dry-run] [--sim] [--interval-ms MS] [--duration-s N]

SPEC is any controller spec of `baselines.registry` (`parties`, `heracles`, `prm`, `qprm-*`, `bo`,
`rl:PATH`, ...). The node comes from the config (configs/serve/*.yaml, `env.serving.ServeConfig`):
its `linux` section names a LinuxNode config (cgroups, resctrl, cpufreq, tc, Docker; hw/), or, with
--sim, its `sim` section a scenario for a SimNode rehearsal (real time, or faster with `speed`).
Every tick is one `env.loop` tick through the guard chain (`GuardsConfig.serving()` by default)
under the supervisor of `env.serving`: safe mode on a stale or silent latency feed, handover of a
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
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from baselines.registry import REGISTRY, ControllerContext, make_controller, parse_spec, spec_form
from env.allocations import fair_allocation
from env.config import EXIT_BAD_INPUT, ConfigError
from env.guards import build_guards
from env.node import SimClock
from env.serving import (
    LEARNED_SPECS,
    MetricsServer,
    ServeConfig,
    SignalStop,
    Supervisor,
    bench_overhead,
    bench_text,
    default_sinks,
    load_serve_config,
    make_run_dir,
    plain,
    save_resolved_config,
    wants_fallback,
)
from env.sim.node import SimNode
from env.types import Allocation
from hw.config import LinuxNodeConfig, load_linux_config
from hw.linux_node import LinuxNode
from hw.probe import CapabilityError
from hw.runner import HwInputError
from hw.state import JournalBusy

EXIT_ERROR = 1
log = logging.getLogger("coloc.serve")


class BadInput(Exception):
    """Invalid input found at start-up: message to print, exit status 2."""


# ======================================================================================================
# Nodes
# ======================================================================================================
def find_processes(name: str, proc_root: str | Path = "/proc") -> list[int]:
    """Pids of the processes called `name` (/proc/PID/comm) and of all their descendants."""
    root = Path(proc_root)
    comm: dict[int, str] = {}
    parent: dict[int, int] = {}
    for d in root.iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        try:
            comm[pid] = (d / "comm").read_text().strip()
            stat = (d / "stat").read_text()
            parent[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found = {p for p, c in comm.items() if c == name and p != os.getpid()}
    children: dict[int, list[int]] = {}
    for p, pp in parent.items():
        children.setdefault(pp, []).append(p)
    out, todo = set(found), list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return sorted(out)


def linux_node_config(cfg: ServeConfig, interval_s: float | None, dry_run: bool) -> LinuxNodeConfig:
    """The LinuxNode config the serve config names, with its overrides (interval, feed, processes
    found by name); BadInput for what cannot be served. Reads only."""
    sec = cfg.linux
    if sec is None:
        raise BadInput(
            "the config has no `linux` node section; add one, or pass --sim to rehearse on its `sim` scenario"
        )
    node_cfg = load_linux_config(sec.config)
    if interval_s is not None:
        node_cfg = dataclasses.replace(node_cfg, interval_s=interval_s)
    if sec.feed is not None:
        node_cfg = dataclasses.replace(node_cfg, feed=dataclasses.replace(node_cfg.feed, url=sec.feed))
    names = [a.name for a in node_cfg.apps]
    unknown = sorted(set(sec.processes) - set(names))
    if unknown:
        raise BadInput(f"linux.processes names {unknown}, not apps of node {node_cfg.name} ({names})")
    if dry_run:
        why = [
            f"app {a.name} is created or gets processes moved in at start (create/pids)"
            for a in node_cfg.apps
            if a.create or a.pids
        ]
        why += [f"linux.processes would move {p!r} into {a}'s cgroup" for a, p in sec.processes.items()]
        if "net" in node_cfg.knobs:
            why.append("knob net sets up tc classes at start")
        if why:
            raise BadInput(
                "--dry-run makes no writes, but this node changes the machine at start: "
                + "; ".join(why)
                + ". Point the apps at existing cgroups (cgroup: PATH) or containers to dry-run."
            )
        return node_cfg
    if sec.processes:
        apps = []
        for a in node_cfg.apps:
            if a.name in sec.processes:
                if a.container or a.label:
                    raise BadInput(
                        f"linux.processes.{a.name}: the app is a container; processes apply to cgroups"
                    )
                pids = find_processes(sec.processes[a.name], node_cfg.proc_root)
                if not pids:
                    raise BadInput(
                        f"linux.processes.{a.name}: no running process named {sec.processes[a.name]!r} "
                        f"(under {node_cfg.proc_root}); start it first"
                    )
                a = dataclasses.replace(a, pids=tuple(pids), create=True)
            apps.append(a)
        node_cfg = dataclasses.replace(node_cfg, apps=tuple(apps))
    return node_cfg


def start_linux_node(node_cfg: LinuxNodeConfig, *, dry_run: bool, feed: Any = None) -> LinuxNode:
    """Start the LinuxNode (journal replay first, probe, resolve). BadInput for a missing knob,
    app, cgroup or process, or a journal held by a live controller."""
    cls = AssumingLinuxNode if dry_run else LinuxNode
    try:
        node = cls(node_cfg, feed=feed)
    except (CapabilityError, HwInputError, JournalBusy, ConfigError) as e:
        raise BadInput(str(e)) from None
    except OSError as e:  # e.g. the latency feed's port is taken
        raise BadInput(f"cannot start node {node_cfg.name}: {e}") from None
    if node.restored_at_start is not None:
        r = node.restored_at_start
        msg = f"restored the node from {node_cfg.state_path}: a previous run did not finish ({r.restored} entries replayed, {r.skipped} gone)"
        log.warning(msg)
        print(msg, flush=True)
    return node


class AssumingLinuxNode(LinuxNode):
    """A LinuxNode for --dry-run: it is never reset (reset applies the start allocation), so once
    told `assume(allocation)` it takes that allocation as in force for its observations."""

    _assumed: Allocation | None = None

    def assume(self, allocation: Allocation) -> None:
        self._assumed = allocation

    def current_allocation(self) -> Allocation:
        try:
            return super().current_allocation()
        except RuntimeError:
            if self._assumed is None:
                raise
            return self._assumed


def sim_scenario(cfg: ServeConfig, scenario: str | None, interval_s: float | None) -> Any:
    from env.sim.scenario import load_scenario

    if cfg.sim is None and scenario is None:
        raise BadInput("--sim: the config has no `sim` section (scenario, speed); add one or pass --scenario")
    scn = load_scenario(scenario or (cfg.sim.scenario if cfg.sim else "mix3-const"))
    dt = scn.platform_spec.interval_s
    if interval_s is not None and abs(interval_s - dt) > 1e-9:
        raise BadInput(
            f"--sim: platform {scn.platform!r} of scenario {scn.name!r} simulates {dt * 1e3:g} ms intervals; "
            f"the interval cannot be {interval_s * 1e3:g} ms (leave --interval-ms out, or use a platform with "
            "that interval_s)"
        )
    return scn


# ======================================================================================================
# Controllers
# ======================================================================================================
def check_specs(spec: str, cfg: ServeConfig) -> tuple[str, str | None]:
    """(controller spec, fallback spec or None), both validated by the registry (ConfigError)."""
    parse_spec(spec)
    fb = cfg.fallback.controller if wants_fallback(spec, cfg.fallback) else None
    if fb is not None:
        try:
            parse_spec(fb)
        except ConfigError as e:
            raise ConfigError(f"fallback.controller: {e}") from None
    return spec, fb


def build_controller(spec: str, caps: Any, scenario: Any, sim: Any, seed: int, what: str) -> Any:
    """A controller from the registry, reset once on the node's capabilities so that a checkpoint
    that does not fit the node fails now, before anything is written."""
    try:
        ctl = make_controller(spec, ControllerContext(caps, scenario, sim, seed))
        ctl.reset(caps, np.random.default_rng(seed))
    except ConfigError as e:
        raise BadInput(f"{what} {spec!r}: {e}") from None
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise BadInput(
            f"{what} {spec!r} cannot run on node {caps.node_name!r}: {type(e).__name__}: {e}"
        ) from None
    return ctl


# ======================================================================================================
# CLI
# ======================================================================================================
def _controllers_help() -> str:
    lines = [f"  {spec_form(n, e):<20} {e.help}" for n, e in REGISTRY.items()]
    missing = [s for s in LEARNED_SPECS if s not in REGISTRY]
    if missing:
        lines.append(f"  ({', '.join(missing)}: not registered in this checkout yet)")
    return "controller specs:\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="serve.py",
        description=__doc__.split("\n\n")[0],
        epilog=_controllers_help(),
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
    p.add_argument("--speed", type=float, help="with --sim: simulated seconds per real second (0 = flat out)")
    p.add_argument("--interval-ms", type=float, help="control interval (default: the node's, 500 ms)")
    p.add_argument("--duration-s", type=float, help="stop after this long (default: until SIGTERM/SIGINT)")
    p.add_argument("--out", help="run directory (default: output.dir/<UTC time>-<controller>)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics and /healthz port (0 = a free port)")
    p.add_argument("--no-metrics", action="store_true", help="no /metrics endpoint")
    p.add_argument("--quiet", action="store_true", help="no per-tick status line")
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.add_argument("--bench", action="store_true", help="measure the loop's overhead and exit (see above)")
    p.add_argument("--ticks", type=int, default=300, help="with --bench: ticks per controller (default 300)")
    p.add_argument(
        "--pace-ms",
        type=float,
        default=20.0,
        help="with --bench: real time between ticks (default 20; 0 = back to back)",
    )
    return p


def apply_overrides(cfg: ServeConfig, args: argparse.Namespace) -> ServeConfig:
    if args.interval_ms is not None and not args.interval_ms > 0:
        raise ConfigError(f"--interval-ms {args.interval_ms}: must be > 0")
    if args.duration_s is not None and not args.duration_s >= 0:
        raise ConfigError(f"--duration-s {args.duration_s}: must be >= 0")
    if args.speed is not None and not args.speed >= 0:
        raise ConfigError(f"--speed {args.speed}: must be >= 0")
    changes: dict[str, Any] = {}
    if args.interval_ms is not None:
        changes["interval_s"] = args.interval_ms / 1e3
    if args.duration_s is not None:
        changes["duration_s"] = args.duration_s
    m = cfg.metrics
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {args.metrics_port}: outside 0..65535")
        m = dataclasses.replace(m, port=args.metrics_port)
    if args.no_metrics:
        m = dataclasses.replace(m, enabled=False)
    changes["metrics"] = m
    if args.sim and (args.speed is not None or args.scenario is not None):
        from env.serving import SimSection

        s = cfg.sim or SimSection()
        changes["sim"] = dataclasses.replace(
            s, speed=s.speed if args.speed is None else args.speed, scenario=args.scenario or s.scenario
        )
    return dataclasses.replace(cfg, **changes)


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


@contextlib.contextmanager
def _log_file(path: Path) -> Iterator[None]:
    h = logging.FileHandler(path)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(h)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(h)
        h.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        cfg = apply_overrides(load_serve_config(args.config), args)
        if args.bench:
            return run_bench(cfg, args)
        spec, fb_spec = check_specs(args.controller.strip(), cfg)
        if args.sim:
            scenario = sim_scenario(cfg, None, cfg.interval_s)
            node_cfg = None
        else:
            scenario = None
            node_cfg = linux_node_config(cfg, cfg.interval_s, args.dry_run)
    except (ConfigError, BadInput) as e:
        print(f"serve.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with SignalStop() as sig:
        return serve(cfg, args, argv, spec, fb_spec, scenario, node_cfg, sig)


def serve(
    cfg: ServeConfig,
    args: argparse.Namespace,
    argv: list[str],
    spec: str,
    fb_spec: str | None,
    scenario: Any,
    node_cfg: LinuxNodeConfig | None,
    sig: SignalStop,
) -> int:
    """Steps 2-4 of the module docstring; the node is closed (restored) on every exit path."""
    node: Any = None
    http: MetricsServer | None = None
    try:
        try:
            # 2. the node first (a LinuxNode replays a killed run's journal before anything else)
            node_seed = None
            if scenario is not None:
                sim = cfg.sim
                node_seed = sim.seed if sim is not None and sim.seed is not None else scenario.seed
                node = SimNode(scenario, seed=node_seed, clock=SimClock(speed=sim.speed if sim else 1.0))
            else:
                assert node_cfg is not None
                node = start_linux_node(node_cfg, dry_run=args.dry_run)
            caps = node.capabilities()
            # 3. the controllers, checked against the node; the metrics endpoint bound
            sim_node = node if scenario is not None else None
            primary = build_controller(spec, caps, scenario, sim_node, cfg.seed, "controller")
            fallback = None
            if fb_spec is not None:
                fallback = build_controller(
                    fb_spec, caps, scenario, sim_node, cfg.seed, "fallback controller"
                )
            if cfg.metrics.enabled:
                http = MetricsServer(cfg.metrics)
                try:
                    http.start()
                except OSError as e:
                    http = None
                    raise BadInput(str(e)) from None
            # 4. the run directory with the resolved config
            run_dir = make_run_dir(cfg.output.dir, spec, args.out)
        except (ConfigError, BadInput) as e:
            print(f"serve.py: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        with _log_file(run_dir / "serve.log"):
            save_resolved_config(
                run_dir,
                {
                    "command": ["serve.py", *argv],
                    "controller": spec,
                    "fallback": fb_spec,
                    "dry_run": args.dry_run,
                    "node_kind": "sim" if scenario is not None else "linux",
                    "serve": cfg.to_dict(),
                    "node": plain(node_cfg)
                    if node_cfg is not None
                    else {"scenario": plain(scenario), "seed": node_seed},
                    "capabilities": plain(caps),
                },
            )
            log.info("run directory %s", run_dir)
            if http is not None:
                print(f"metrics: {http.url}/metrics  health: {http.url}/healthz", flush=True)
            # ... and only now the first write: the start allocation
            start = None
            if scenario is None and not args.dry_run:
                log.info("applying the start allocation (fair) and observing one interval")
                node.reset()
            elif scenario is None:
                start = fair_allocation(caps)
                node.assume(start)
                log.info("dry run: no writes; the start allocation is taken as in force")
            error_count = None
            if scenario is None:

                def error_count() -> int:  # knob writes the LinuxNode could not make (it keeps going)
                    return sum(v for k, v in node.errors.items() if k != "usage")

            sup = Supervisor(
                node,
                primary,
                config=cfg,
                guards=build_guards(cfg.guards),
                fallback=fallback,
                controller_name=spec,
                fallback_name=fb_spec,
                start_allocation=start,
                sinks=default_sinks(run_dir, cfg.output, console=not args.quiet),
                rng=np.random.default_rng(cfg.seed),
                error_count=error_count,
                dry_run=args.dry_run,
                metrics_server=http,
            )
            http = None  # the supervisor stops it
            sig.attach(sup)
            mode = "dry run on node" if args.dry_run else "serving node"
            fb = f" (fallback {fb_spec})" if fb_spec else ""
            print(f"{mode} {caps.node_name!r} with {spec}{fb}; run directory {run_dir}", flush=True)
            summary = sup.run(cfg.duration_s)
            (run_dir / "summary.json").write_text(
                json.dumps(summary.to_dict(), indent=2, allow_nan=False) + "\n"
            )
            print(summary.text(), flush=True)
            return 0
    except Exception:
        log.exception("serve.py failed (the node is restored)")
        return EXIT_ERROR
    finally:
        if http is not None:
            http.stop()
        if node is not None:
            try:
                node.close()
            except Exception:
                log.exception("closing the node failed")


# ======================================================================================================
# --bench
# ======================================================================================================
def run_bench(cfg: ServeConfig, args: argparse.Namespace) -> int:
    specs = [s.strip() for s in args.controller.split(",") if s.strip()]
    if not specs:
        raise ConfigError("--controller: no spec given")
    for s in specs:
        parse_spec(s)
    if args.ticks < 1:
        raise ConfigError("--ticks must be >= 1")
    results = []
    if args.sim:
        scn = sim_scenario(cfg, args.scenario, cfg.interval_s)
        for s in specs:
            node = SimNode(scn, seed=scn.seed)  # a SimClock at speed 0: no waiting
            ctl = build_controller(s, node.capabilities(), scn, node, cfg.seed, "controller")
            results.append(
                bench_overhead(
                    node,
                    ctl,
                    pace_s=args.pace_ms / 1e3,
                    ticks=args.ticks,
                    guards=build_guards(cfg.guards),
                    config=cfg,
                    label=f"sim {scn.name} {s}",
                )
            )
    else:
        from hw.feed import MemoryFeed

        node_cfg = linux_node_config(cfg, cfg.interval_s, args.dry_run)
        for s in specs:
            feed = MemoryFeed()
            node = start_linux_node(node_cfg, dry_run=args.dry_run, feed=feed)
            try:
                caps = node.capabilities()
                ctl = build_controller(s, caps, None, None, cfg.seed, "controller")
                if args.dry_run:
                    node.assume(fair_allocation(caps))
                else:
                    node.reset()
                k = [0]

                def publish(caps: Any = caps, feed: Any = feed, k: list[int] = k) -> None:
                    k[0] += 1  # synthetic p99: swings between 40% and 160% of the target
                    for i, a in enumerate(caps.lc_apps):
                        frac = 1.0 + 0.6 * math.sin(k[0] / 6.0 + i)
                        feed.publish(a.name, a.qos_target_us * frac, 0.5 * a.max_load_rps, requests=1000)

                def errs(node: Any = node) -> int:
                    return sum(v for key, v in node.errors.items() if key != "usage")

                label = f"linux {caps.node_name} {s}" + (" (dry run)" if args.dry_run else "")
                results.append(
                    bench_overhead(
                        node,
                        ctl,
                        pace_s=args.pace_ms / 1e3,
                        ticks=args.ticks,
                        guards=build_guards(cfg.guards),
                        config=cfg,
                        before_observe=publish,
                        error_count=errs,
                        label=label,
                    )
                )
            finally:
                node.close()
    print(bench_text(results))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
