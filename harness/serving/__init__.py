"""Serving: run one controller on one node for as long as the node runs, safely (DESIGN §1 use 3).

`serve.py` is the command line and `deploy` its start-up and run (`main(ServeOptions)`); the rest is
node- and controller-agnostic machinery (the node - a `LinuxNode` or a `SimNode` - and the
controllers are built by the caller and injected). Every tick is one `env.loop.ControlLoop` tick
(observe -> decide -> guards -> apply -> record); the supervisor adds its safety pieces *around*
that loop by composition, so evaluation, training and serving still share one tick:

| piece                  | module     | what it does                                                 |
|------------------------|------------|--------------------------------------------------------------|
| `SafeModeGuard`        | safety     | the last guard: a stale or silent latency feed freezes BE    |
|                        |            | growth and puts every LC app back to at least its start      |
|                        |            | allocation until the feed is back                            |
| `SupervisedController` | safety     | hands a controller that lets QoS violations persist (or      |
|                        |            | keeps raising) over to a fallback (PARTIES), and back        |
| `ResilientNode`        | nodes      | actuation errors counted and retried with backoff; a failed  |
|                        |            | observe() is an explicit invalid observation                 |
| `DryRunNode`           | nodes      | `--dry-run`: validates, diffs and logs the writes; makes none|
| `StoppableClock`       | supervisor | SIGTERM/SIGINT end the run between ticks                     |
| `Supervisor`           | supervisor | runs the loop with all of the above; restores the node on    |
|                        |            | every exit path                                              |
| sinks                  | sinks      | JSONL decision log, TensorBoard, console, Prometheus         |
|                        |            | `/metrics` and `/healthz`                                    |
| `bench_overhead`       | bench      | the loop's overhead per tick and its share of a core         |

`config` holds the typed serving config (configs/serve/*.yaml). The names below are the package's
API; `deploy` (which imports every controller family) is imported on its own.
"""

from harness.serving.bench import bench_overhead, bench_sim, bench_text
from harness.serving.config import (
    FallbackConfig,
    LinuxSection,
    MetricsConfig,
    OutputConfig,
    RetryConfig,
    SafeModeConfig,
    ServeConfig,
    SimSection,
    load_serve_config,
    parse_serve_config,
    wants_fallback,
)
from harness.serving.nodes import ActuationError, ApplyDeferred, DryRunNode, NodeWrapper, ResilientNode
from harness.serving.safety import (
    Active,
    EventLog,
    SafeModeGuard,
    ServeEvent,
    SupervisedController,
    feed_ok,
    safe_allocation,
)
from harness.serving.sinks import ConsoleSink, JsonlSink, MetricsServer, TensorBoardSink, format_status
from harness.serving.supervisor import (
    ServeRecord,
    ServeSummary,
    SignalStop,
    StoppableClock,
    StopServing,
    Supervisor,
    make_run_dir,
    save_resolved_config,
)

__all__ = [
    "Active",
    "ActuationError",
    "ApplyDeferred",
    "ConsoleSink",
    "DryRunNode",
    "EventLog",
    "FallbackConfig",
    "JsonlSink",
    "LinuxSection",
    "MetricsConfig",
    "MetricsServer",
    "NodeWrapper",
    "OutputConfig",
    "ResilientNode",
    "RetryConfig",
    "SafeModeConfig",
    "SafeModeGuard",
    "ServeConfig",
    "ServeEvent",
    "ServeRecord",
    "ServeSummary",
    "SignalStop",
    "SimSection",
    "StopServing",
    "StoppableClock",
    "SupervisedController",
    "Supervisor",
    "TensorBoardSink",
    "bench_overhead",
    "bench_sim",
    "bench_text",
    "feed_ok",
    "format_status",
    "load_serve_config",
    "make_run_dir",
    "parse_serve_config",
    "safe_allocation",
    "save_resolved_config",
    "wants_fallback",
]
