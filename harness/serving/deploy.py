"""serve.py's start-up and run (DESIGN §1 use 3): the node, the controllers, the run directory and
the supervisor, in the order serve.py's --help gives; and `--bench`. The command line fills a
`ServeOptions`; `main(options)` returns the exit status (0 done or stopped by a signal, 2 bad
input - a damaged or foreign journal too -, 1 an unexpected error after restoring the node, or a
node that could not be fully restored, naming the knobs left as they are).

Start-up fails fast and writes nothing to the node on bad input: the config and the controller
specs are checked first; the node is started (a LinuxNode replays the journal a killed run left,
then probes the host and resolves its apps); the controllers are built and checked against it;
the metrics endpoint is bound and the run directory gets the resolved config. Only then is the
start allocation applied - or, in a dry run, taken as in force (`DryRunNode`) - and the loop
started. A learned policy served under another guard chain than it was trained under is said
aloud (`guard_chain_warning`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy import RlController
from env.allocations import fair_allocation
from env.config import EXIT_BAD_INPUT, ConfigError, plain_data
from env.controller import Controller, ControllerContext
from env.guards import GuardsConfig, build_guards
from env.node import SimClock
from env.sim.node import SimNode
from harness.registry import make_controller, parse_spec
from harness.runs import sub_interval_s
from harness.serving.bench import run_bench
from harness.serving.config import ServeConfig, SimSection, load_serve_config, wants_fallback
from harness.serving.nodes import write_errors
from harness.serving.sinks import MetricsServer, default_sinks
from harness.serving.supervisor import SignalStop, Supervisor, make_run_dir, save_resolved_config
from hw.config import LinuxNodeConfig, load_linux_config
from hw.feed import LatencySource
from hw.linux_node import LinuxNode
from hw.probe import CapabilityError
from hw.procs import find_processes
from hw.runner import HwInputError
from hw.state import JournalBusy

log = logging.getLogger("coloc.serve")

EXIT_ERROR = 1


@dataclass(frozen=True)
class ServeOptions:
    """serve.py's command-line options (its --help)."""

    config: str
    controller: str
    dry_run: bool = False
    sim: bool = False
    scenario: str | None = None
    speed: float | None = None
    interval_ms: float | None = None
    duration_s: float | None = None
    out: str | None = None
    metrics_port: int | None = None
    no_metrics: bool = False
    quiet: bool = False
    bench: bool = False
    ticks: int = 300
    pace_ms: float = 20.0
    argv: tuple[str, ...] = ()


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


class BadInput(Exception):
    """Invalid input found at start-up: message to print, exit status 2."""


# ---- nodes --------------------------------------------------------------------------------------------------
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
        why += [
            f"linux.processes would move the processes {m.describe()} into {a}'s cgroup"
            for a, m in sec.processes.items()
        ]
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
                m = sec.processes[a.name]
                try:
                    pids = find_processes(pidfile=m.pidfile, cmdline=m.cmdline, proc_root=node_cfg.proc_root)
                except HwInputError as e:
                    raise BadInput(f"linux.processes.{a.name}: {e}") from None
                if not pids:
                    raise BadInput(
                        f"linux.processes.{a.name}: no running process {m.describe()} "
                        f"(under {node_cfg.proc_root}); start it first"
                    )
                a = dataclasses.replace(a, pids=tuple(pids), create=True)
            apps.append(a)
        node_cfg = dataclasses.replace(node_cfg, apps=tuple(apps))
    return node_cfg


def start_linux_node(node_cfg: LinuxNodeConfig, *, feed: LatencySource | None = None) -> LinuxNode:
    """Start the LinuxNode (journal replay first, probe, resolve); nothing else is written (a dry run
    never resets it). BadInput for a missing knob, app, cgroup or process, or a journal held by a
    live controller."""
    try:
        node = LinuxNode(node_cfg, feed=feed)
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


def sim_scenario(cfg: ServeConfig, scenario: str | None, interval_s: float | None) -> Any:
    """The scenario of a --sim rehearsal (--scenario, else the config's `sim.scenario`); BadInput when
    its platform's interval is not the one asked for."""
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


# ---- controllers --------------------------------------------------------------------------------------------
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


def apply_overrides(cfg: ServeConfig, opts: ServeOptions) -> ServeConfig:
    """The serve config with the command line's overrides (interval, duration, metrics, sim)."""
    if opts.interval_ms is not None and not opts.interval_ms > 0:
        raise ConfigError(f"--interval-ms {opts.interval_ms}: must be > 0")
    if opts.duration_s is not None and not opts.duration_s >= 0:
        raise ConfigError(f"--duration-s {opts.duration_s}: must be >= 0")
    if opts.speed is not None and not opts.speed >= 0:
        raise ConfigError(f"--speed {opts.speed}: must be >= 0")
    changes: dict[str, Any] = {}
    if opts.interval_ms is not None:
        changes["interval_s"] = opts.interval_ms / 1e3
    if opts.duration_s is not None:
        changes["duration_s"] = opts.duration_s
    m = cfg.metrics
    if opts.metrics_port is not None:
        if not 0 <= opts.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {opts.metrics_port}: outside 0..65535")
        m = dataclasses.replace(m, port=opts.metrics_port)
    if opts.no_metrics:
        m = dataclasses.replace(m, enabled=False)
    changes["metrics"] = m
    if opts.sim and (opts.speed is not None or opts.scenario is not None):
        s = cfg.sim or SimSection()
        changes["sim"] = dataclasses.replace(
            s, speed=s.speed if opts.speed is None else opts.speed, scenario=opts.scenario or s.scenario
        )
    return dataclasses.replace(cfg, **changes)


def close_node(node: Any) -> tuple[str, ...]:
    """Close (restore) `node`; what it could not restore (none for a node without a journal)."""
    try:
        node.close()
    except Exception as e:
        log.error("closing (restoring) the node failed: %s", e)
        return tuple(getattr(e, "failed", ())) or tuple(getattr(node, "unrestored", ())) or (str(e),)
    return tuple(getattr(node, "unrestored", ()))  # e.g. the supervisor closed it, and that failed


def restore_status(rc: int, unrestored: tuple[str, ...], node_cfg: LinuxNodeConfig | None) -> int:
    """`rc`, unless the node could not be restored: then say which knobs were not, and exit 1."""
    if not unrestored:
        return rc
    print(
        f"serve.py: error: the node is NOT fully restored: {'; '.join(unrestored)}. These stay in the "
        f"journal ({getattr(node_cfg, 'state_path', '?')}): the next start retries them, or restore them "
        "by hand",
        file=sys.stderr,
    )
    return EXIT_ERROR


def serve(
    cfg: ServeConfig,
    opts: ServeOptions,
    argv: list[str],
    spec: str,
    fb_spec: str | None,
    scenario: Any,
    node_cfg: LinuxNodeConfig | None,
    sig: SignalStop,
    started: list[Any],
) -> int:
    """Steps 2-4 of serve.py's start-up order; the node it starts is appended to `started`, and the
    caller closes (restores) it on every exit path (`main`)."""
    node: Any = None
    http: MetricsServer | None = None
    try:
        try:
            # 2. the node first (a LinuxNode replays a killed run's journal before anything else)
            node_seed = None
            if scenario is not None:
                sim = cfg.sim
                node_seed = sim.seed if sim is not None and sim.seed is not None else scenario.seed
                node = SimNode(
                    scenario,
                    seed=node_seed,
                    clock=SimClock(speed=sim.speed if sim else 1.0),
                    sub_interval_s=sub_interval_s(scenario),  # as in evaluation (harness.runs)
                )
            else:
                assert node_cfg is not None
                node = start_linux_node(node_cfg)
            started.append(node)
            caps = node.capabilities()
            # 3. the controllers, checked against the node; the metrics endpoint bound
            sim_node = node if scenario is not None else None
            primary = build_controller(spec, caps, scenario, sim_node, cfg.seed, "controller")
            warning = guard_chain_warning(primary, cfg.guards)
            if warning is not None:
                log.warning(warning)
                print(warning, flush=True)
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
            run_dir = make_run_dir(cfg.output.dir, spec, opts.out)
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
                    "dry_run": opts.dry_run,
                    "node_kind": "sim" if scenario is not None else "linux",
                    "serve": cfg.to_dict(),
                    "node": plain_data(node_cfg)
                    if node_cfg is not None
                    else {"scenario": plain_data(scenario), "seed": node_seed},
                    "capabilities": plain_data(caps),
                },
            )
            log.info("run directory %s", run_dir)
            if http is not None:
                print(f"metrics: {http.url}/metrics  health: {http.url}/healthz", flush=True)
            # ... and only now the first write: the start allocation
            start = None
            if scenario is None and not opts.dry_run:
                log.info("applying the start allocation (fair) and observing one interval")
                node.reset()
            elif scenario is None:
                start = fair_allocation(caps)  # the dry-run node (Supervisor) takes it as in force
                log.info("dry run: no writes; the start allocation is taken as in force")
            error_count = None
            if scenario is None:

                def error_count() -> int:  # knob writes the LinuxNode could not make (it keeps going)
                    return write_errors(node.errors)

            sup = Supervisor(
                node,
                primary,
                config=cfg,
                guards=build_guards(cfg.guards),
                fallback=fallback,
                controller_name=spec,
                fallback_name=fb_spec,
                start_allocation=start,
                sinks=default_sinks(run_dir, cfg.output, console=not opts.quiet),
                rng=np.random.default_rng(cfg.seed),
                error_count=error_count,
                dry_run=opts.dry_run,
                metrics_server=http,
            )
            http = None  # the supervisor stops it
            sig.attach(sup)
            mode = "dry run on node" if opts.dry_run else "serving node"
            fb = f" (fallback {fb_spec})" if fb_spec else ""
            print(f"{mode} {caps.node_name!r} with {spec}{fb}; run directory {run_dir}", flush=True)
            summary = sup.run(cfg.duration_s)
            (run_dir / "summary.json").write_text(
                json.dumps(summary.to_dict(), indent=2, allow_nan=False) + "\n"
            )
            print(summary.text(), flush=True)
            return 0
    except Exception:
        log.exception("serve.py failed; restoring the node")
        return EXIT_ERROR
    finally:
        if http is not None:
            http.stop()


# ---- --bench ------------------------------------------------------------------------------------------------
def bench(cfg: ServeConfig, opts: ServeOptions) -> int:
    """--bench: the loop's overhead for each comma-separated spec, on the simulated or the real node."""
    specs = [s.strip() for s in opts.controller.split(",") if s.strip()]
    if not specs:
        raise ConfigError("--controller: no spec given")
    for s in specs:
        parse_spec(s)
    if opts.ticks < 1:
        raise ConfigError("--ticks must be >= 1")
    scenario, start_node = None, None
    if opts.sim:
        scenario = sim_scenario(cfg, opts.scenario, cfg.interval_s)
    else:
        node_cfg = linux_node_config(cfg, cfg.interval_s, opts.dry_run)

        def start_node(feed: LatencySource) -> LinuxNode:
            return start_linux_node(node_cfg, feed=feed)

    run_bench(
        specs,
        lambda spec, caps, scn, node: build_controller(spec, caps, scn, node, cfg.seed, "controller"),
        config=cfg,
        scenario=scenario,
        start_node=start_node,
        ticks=opts.ticks,
        dry_run=opts.dry_run,
        pace_s=opts.pace_ms / 1e3,
        out=Path(opts.out) if opts.out else None,
    )
    return 0


def guard_chain_warning(controller: Controller, serving: GuardsConfig) -> str | None:
    """A line to print when a learned policy is served under another guard chain than it was
    trained under (recorded in its policy.pt): the guards on in each and the ones that differ
    (on or off, or their settings); None when they agree or nothing was recorded."""
    if not isinstance(controller, RlController):
        return None
    trained = controller.policy.meta.guards
    if trained is None or trained == serving:
        return None
    t, s = trained.to_dict(), serving.to_dict()

    def on(g: dict[str, Any]) -> str:
        return ",".join(k for k, v in g.items() if v) or "none"

    differ = ",".join(k for k in s if t.get(k) != s[k])
    return (
        f"warning: the policy was trained under the guard chain [{on(t)}] and is served under "
        f"[{on(s)}] (they differ in: {differ}); it may behave differently (set env.guards in "
        "training, or guards: here)"
    )


def main(options: ServeOptions) -> int:
    """Check the config and specs (exit 2 on bad input), then serve (or bench) until done; the node
    is restored on every exit path, and exit 1 says which knobs it could not restore."""
    try:
        cfg = apply_overrides(load_serve_config(options.config), options)
        if options.bench:
            return bench(cfg, options)
        spec, fb_spec = check_specs(options.controller.strip(), cfg)
        if options.sim:
            scenario = sim_scenario(cfg, None, cfg.interval_s)
            node_cfg = None
        else:
            scenario = None
            node_cfg = linux_node_config(cfg, cfg.interval_s, options.dry_run)
    except (ConfigError, BadInput) as e:
        print(f"serve.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    started: list[Any] = []  # the node, once started: restored on every exit path
    with SignalStop() as sig:
        try:
            rc = serve(cfg, options, list(options.argv), spec, fb_spec, scenario, node_cfg, sig, started)
        finally:
            unrestored = close_node(started[0]) if started else ()
    return restore_status(rc, unrestored, node_cfg)
