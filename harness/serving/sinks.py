"""Serving's outputs (DESIGN §6.7): one `ServeRecord` per tick to each sink, and the live endpoints.

* `JsonlSink`: the decision log, decisions.jsonl (`env.loop.read_jsonl` reads it back, so
  `env.metrics` applies);
* `TensorBoardSink`: scalars in the fixed namespaces (`qos/`, `alloc/`, `be/`, `loop/`);
* `ConsoleSink`: one status line per tick on stdout (`format_status`);
* `MetricsServer`: Prometheus `/metrics` and `/healthz`, read from the supervisor's state at scrape
  time (bound to 127.0.0.1 unless configured; port 0 = a free port).

A failing sink never stops control: the supervisor counts the error and logs it once.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.serving.config import MetricsConfig, OutputConfig
from harness.serving.safety import Active

if TYPE_CHECKING:
    from harness.serving.supervisor import ServeRecord, Supervisor


# ---- sinks -------------------------------------------------------------------------------------------------
class Sink(Protocol):
    """Where the supervisor writes each tick's record."""

    def write(self, rec: ServeRecord) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """The decision log: one line per tick, flushed at once (a killed run leaves whole lines)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def write(self, rec: ServeRecord) -> None:
        self._f.write(rec.to_json() + "\n")

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class TensorBoardSink:
    """TensorBoard scalars (`ServeRecord.scalars`): one event per tick holding every scalar, step =
    tick. Written by TensorBoard's own event writer (a background thread), no torch needed."""

    def __init__(self, logdir: str | Path, flush_secs: float = 5.0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._Event, self._Summary = Event, Summary
        self._w = EventFileWriter(str(logdir), flush_secs=flush_secs)

    def write(self, rec: ServeRecord) -> None:
        S = self._Summary
        values = [S.Value(tag=k, simple_value=v) for k, v in rec.scalars().items() if math.isfinite(v)]
        self._w.add_event(self._Event(wall_time=time.time(), step=rec.serving.tick, summary=S(value=values)))

    def close(self) -> None:
        self._w.close()


class ConsoleSink:
    """The live view: one compact status line per tick (`format_status`)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    def write(self, rec: ServeRecord) -> None:
        print(format_status(rec), file=self.stream, flush=True)

    def close(self) -> None:
        pass


def _lat(us: float) -> str:
    if not math.isfinite(us):
        return "--"
    return f"{us / 1000:.1f}ms" if us >= 10_000 else f"{us:.0f}us"


def format_status(rec: ServeRecord) -> str:
    """`t=  12.0s #24 normal parties  QoS ok   memcached 412us/600us 50%  | BE 0.42 | <UP,CORE> memcached | 0.4 ms`"""
    t, s = rec.tick, rec.serving
    if not t.apps:
        qos = "NO DATA"
    elif not t.valid:
        qos = "FEED?  "
    else:
        qos = "QoS ok " if t.all_qos_met else "QoS MISS"
    apps = "  ".join(
        f"{a.name} {_lat(a.p99_us)}/{_lat(a.target_us)}"
        + (f" {a.load_frac:.0%}" if math.isfinite(a.load_frac) else "")
        for a in t.apps
    )
    mode = "SAFE  " if s.mode == "safe" else "normal"
    ctl = f"{s.controller}{'*' if s.fallback_active else ''}"
    if t.move and t.move != "HOLD":
        what = f"{t.move} {t.app or ''}".strip()
    elif t.changed:
        what = "would apply" if s.dry_run else "applied"
    else:
        what = "hold"
    be = f"BE {t.be_throughput:.2f}" if t.be and math.isfinite(t.be_throughput) else "BE --"
    ev = f" ! {s.events[-1].kind}" if s.events else ""
    return f"t={t.time_s:7.1f}s #{s.tick:<5d} {mode} {ctl:<10} {qos} {apps} | {be} | {what} | {s.control_ms:.1f} ms{ev}"


def default_sinks(run_dir: Path, output: OutputConfig, console: bool) -> list[Sink]:
    """The sinks `output` turns on, writing into `run_dir` (the console only when `console`)."""
    sinks: list[Sink] = []
    if output.jsonl:
        sinks.append(JsonlSink(run_dir / "decisions.jsonl"))
    if output.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if console and output.console:
        sinks.append(ConsoleSink())
    return sinks


# ---- Prometheus /metrics and /healthz ---------------------------------------------------------------------
class _Collector:
    """Reads the supervisor's state at scrape time (nothing is updated per tick)."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sup = self.server.sup
        if sup is None:  # bound before the node's first write; the supervisor comes later
            return
        st, ls, ns = sup.stats, sup.loop.stats, sup.node.stats
        counters = {
            "ticks": ("control ticks run", st.ticks),
            "applied": ("allocations applied", ls.applied),
            "apply_errors": ("apply() calls that failed or were deferred (env.loop)", ls.apply_errors),
            "actuation_failures": ("failed actuations (raised or a knob not written)", ns.failures),
            "actuation_deferred": ("apply() calls deferred by the retry backoff", ns.deferred),
            "actuation_refused": ("allocations the node refused as invalid", ns.refused),
            "observe_errors": ("observations that failed", ls.observe_errors + ns.observe_failures),
            "controller_errors": ("decide() errors", ls.controller_errors + sup.controller.errors_absorbed),
            "restore_errors": ("failed rollbacks to the last good allocation", ls.restore_errors),
            "safe_mode_entries": (
                "times safe mode was entered",
                sup.safe_guard.state.entries if sup.safe_guard else 0,
            ),
            "handovers": ("handovers to the fallback controller", sup.controller.state.handovers),
            "hand_backs": ("hand-backs to the primary controller", sup.controller.state.hand_backs),
            "qos_met_intervals": ("valid intervals in which every LC app met its target", st.qos_met_ticks),
            "valid_intervals": ("intervals with a valid observation", st.valid_ticks),
            "output_errors": ("failed writes to the decision log / TensorBoard / console", st.sink_errors),
        }
        for name, (doc, v) in counters.items():
            yield CounterMetricFamily(f"coloc_serve_{name}", doc, value=v)
        safe = sup.safe_guard is not None and sup.safe_guard.active
        yield GaugeMetricFamily("coloc_serve_safe_mode", "1 while in safe mode", value=float(safe))
        fb = sup.controller.active is Active.FALLBACK
        yield GaugeMetricFamily(
            "coloc_serve_fallback_active", "1 while the fallback controller acts", value=float(fb)
        )
        g = GaugeMetricFamily(
            "coloc_serve_active_controller", "the controller in charge", labels=["controller"]
        )
        g.add_metric([sup.controller.active_name], 1.0)
        yield g
        yield GaugeMetricFamily(
            "coloc_serve_backoff_seconds", "time until the next actuation attempt", value=sup.node.backoff_s
        )
        yield GaugeMetricFamily("coloc_serve_dry_run", "1 in a dry run (no writes)", value=float(sup.dry_run))
        rec = sup.last
        if rec is None:
            return
        yield GaugeMetricFamily(
            "coloc_serve_last_tick_time_seconds", "node time of the last tick", value=rec.tick.time_s
        )
        yield GaugeMetricFamily(
            "coloc_serve_control_ms", "decide + guards + apply of the last tick", value=rec.serving.control_ms
        )
        yield GaugeMetricFamily(
            "coloc_serve_decide_ms", "decide() of the last tick", value=rec.tick.decide_ms
        )
        yield GaugeMetricFamily(
            "coloc_serve_qos_met", "1 when every LC app met its target", value=float(rec.tick.all_qos_met)
        )
        yield GaugeMetricFamily(
            "coloc_serve_be_throughput", "BE throughput (normalised)", value=rec.tick.be_throughput
        )
        p99 = GaugeMetricFamily("coloc_serve_p99_us", "p99 latency of the last interval", labels=["app"])
        tgt = GaugeMetricFamily("coloc_serve_target_us", "QoS target", labels=["app"])
        slack = GaugeMetricFamily("coloc_serve_slack", "(target - p99) / target", labels=["app"])
        load = GaugeMetricFamily("coloc_serve_load_frac", "offered load / max load", labels=["app"])
        for a in rec.tick.apps:
            p99.add_metric([a.name], a.p99_us)
            tgt.add_metric([a.name], a.target_us)
            slack.add_metric([a.name], a.slack)
            load.add_metric([a.name], a.load_frac)
        yield from (p99, tgt, slack, load)
        wt = sup.last_minute()
        yield GaugeMetricFamily(
            "coloc_serve_window_tail_ratio",
            "largest over the LC apps of the p99 of all requests of the last minute / target",
            value=wt.tail_ratio,
        )
        wp99 = GaugeMetricFamily(
            "coloc_serve_window_p99_us", "p99 latency of all requests of the last minute", labels=["app"]
        )
        wover = GaugeMetricFamily(
            "coloc_serve_window_over_target",
            "fraction of the last minute's requests over the QoS target",
            labels=["app"],
        )
        for aw in wt.apps:
            wp99.add_metric([aw.name], aw.p99_us)
            wover.add_metric([aw.name], aw.over_target)
        yield from (wp99, wover)
        alloc = GaugeMetricFamily("coloc_serve_allocation", "allocation in force", labels=["app", "resource"])
        for al in rec.tick.alloc:
            for res in ("cores", "llc_ways", "freq_mhz", "memory_gb", "disk_mbps", "net_gbps", "cpu_quota"):
                alloc.add_metric([al.name, res], float(getattr(al, res)))
        yield alloc


class MetricsServer:
    """`/metrics` (Prometheus text format, `prometheus_client`) and `/healthz` (JSON; 200 when
    healthy, 503 otherwise) on `host:port` in a daemon thread. Port 0 picks a free port (`port`).
    It can be started before the supervisor exists (serve.py binds it before the node's first
    write, so a port in use is bad input that changed nothing) and `attach`ed to it later."""

    def __init__(self, config: MetricsConfig, sup: Supervisor | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.sup = sup
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = config.port

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        import socket
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict, start_response: Callable) -> list[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                if self.sup is None:
                    ok, details = True, {"status": "starting", "ticks": 0}
                else:
                    ok, details = self.sup.health()
                body = json.dumps(details).encode()
                start_response(
                    "200 OK" if ok else "503 Service Unavailable",
                    [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
                )
                return [body]
            if path == "/metrics":
                return metrics_app(environ, start_response)
            body = b"coloc serve: see /metrics and /healthz\n"
            start_response(
                "404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
            )
            return [body]

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        server_cls: type[ThreadingWSGIServer] = ThreadingWSGIServer
        if ":" in self.config.host:

            class V6Server(ThreadingWSGIServer):
                address_family = socket.AF_INET6

            server_cls = V6Server
        try:
            self._server = make_server(
                self.config.host, self.config.port, app, server_cls, handler_class=Quiet
            )
        except OSError as e:
            raise OSError(
                e.errno, f"cannot serve metrics on {self.config.host}:{self.config.port}: {e.strerror}"
            ) from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="coloc-metrics", daemon=True)
        self._thread.start()

    def attach(self, sup: Supervisor) -> None:
        self.sup = sup

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
