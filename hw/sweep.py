"""memcached's p99 against its CPU quota, on this machine and in the simulator, side by side.

Real half: Debian's memcached (started here, `-t 2`) in a cgroup a `LinuxNode` creates, driven by
the open-loop load generator (`python -m hw.loadgen`, under SCHED_FIFO when this process may use
it, so that on a small machine the generator's own scheduling delay is not counted as memcached's
latency). For each rate the quota is set through `LinuxNode.apply` to each value in turn (the node
reads it back from `cpu.cfs_quota_us`); after `settle_s` the p99 of every 500 ms interval of the
next `measure_s` comes from the generator's latency feed, and the point is their median (with the
quartiles). The generator times each request from when its open-loop schedule meant to send it, so
its own lateness is part of every latency; it publishes that lag with each interval, and a point
whose median lag p99 is over `GENERATOR_BOUND_MIN_LAG_US` and over `GENERATOR_BOUND_FRAC` of its
p99 is flagged generator-bound (`generator_bound`): it measured the generator (too high a rate for
this machine, or a busy one), not memcached. The floor is what separates a generator queueing behind
its schedule from scheduling jitter: on this project's 2-core VM, beside other work, a generator that
kept up showed lag p99s of 0.35-1.8 ms (p99s 0.85-5.6 ms), one that did not 12 ms at 12k rps and
0.4 s at 20k. The node restores the cgroups when it closes.

Sim half: the simulator's memcached profile (`configs/apps/memcached.yaml`, two worker threads
like the real one) on a platform file (default `configs/node/vm2.yaml`, this VM), the same rates
as a constant load, the same quotas as `AppAlloc.cpu_quota` within its core group, the same
interval statistics. The profile is calibrated to PARTIES' Xeon servers, not to this VM: the
comparison shows how far apart the two are, it does not fit anything.

    python -m hw.sweep --out out/sweep                      # real (root, memcached) and sim
    python -m hw.sweep --out out/sweep --sim-only           # the simulator's curve alone

Writes `DIR/sweep.json` (every point, the configuration and the machine), `DIR/sweep.png` and
prints a table. Exit status: 0 done, 1 the real half could not run (not root, no memcached, no
cgroup, a process or cgroup failed), 2 bad arguments.

The process helpers (`start_memcached`, `start_nginx`, `LoadgenProcess`, `rt_prefix`, ...) are shared
with the profiler (`hw.profile`) and the real-machine tests (tests/hw/test_real_experiments.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from env.allocations import unmanaged_allocation
from env.config import EXIT_BAD_INPUT, ConfigError
from hw.feed import FeedFormatError, LatencyReading, parse_line
from hw.linux_node import LinuxNode

ROOT = Path(__file__).resolve().parents[1]
QUOTA_STEP_CORES = 0.05  # the finest quota the sweep sets (every quota is a multiple of it)
RT_PRIORITY = 10
GENERATOR_BOUND_FRAC = 0.25  # of a real point's p99: its generator lag p99 above it (module docstring) ...
GENERATOR_BOUND_MIN_LAG_US = 5000.0  # ... and above this: queueing, not scheduling jitter (module docstring)


def generator_bound(lag_p99_us: float, p99_us: float) -> bool:
    """A point's latency is its generator's lateness (module docstring); False when no lag is known."""
    return bool(lag_p99_us > max(GENERATOR_BOUND_MIN_LAG_US, GENERATOR_BOUND_FRAC * p99_us))


def median_lag_us(lags_us: Sequence[float]) -> float:
    """A point's generator lag: the median of its intervals' lag p99s (us); NaN when none was published."""
    finite = [x for x in lags_us if math.isfinite(x)]
    return float(np.median(finite)) if finite else math.nan


# ---- processes shared with the real-machine tests ------------------------------------------------
def rt_prefix(priority: int = RT_PRIORITY) -> list[str]:
    """`chrt -f PRIORITY` when this process may use SCHED_FIFO (root and chrt), else nothing."""
    if os.geteuid() == 0 and shutil.which("chrt"):
        return ["chrt", "-f", str(priority)]
    return []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for the memcached the sweep starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout_s: float = 10.0) -> None:
    """Until something accepts on 127.0.0.1:`port` (raises if `proc` died or time ran out)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            cmd = proc.args
            prog = cmd if isinstance(cmd, str | bytes | os.PathLike) else cmd[0]
            raise RuntimeError(f"{os.fsdecode(prog)} exited with status {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


def start_memcached(port: int, threads: int = 2, memory_mb: int = 64) -> subprocess.Popen:
    """Debian's memcached on 127.0.0.1:`port` (as `nobody` when root), listening when this returns."""
    cmd = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-t", str(threads), "-m", str(memory_mb)]
    if os.geteuid() == 0:
        cmd += ["-u", "nobody"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc


NGINX_SSI_DIRECTIVES = 4000  # CPU work per nginx request (about 1.3-2 ms on the project's VM)


def child_pids(pid: int) -> list[int]:
    """The direct children of process `pid` (pgrep -P)."""
    r = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def start_nginx(
    tmp: Path, port: int, workers: int = 2, directives: int = NGINX_SSI_DIRECTIVES
) -> tuple[subprocess.Popen, list[int]]:
    """Debian's nginx on 127.0.0.1:`port` (configured and run below `tmp`), `workers` worker
    processes, serving one page (/index.html) of `directives` server-side-include `set` directives:
    CPU work per request, a 15-byte body. Returns (master, [master, workers])."""
    d = tmp / "nginx"
    (d / "www").mkdir(parents=True)
    ssi = "".join(f'<!--# set var="v{i % 50}" value="$uri {i}" -->' for i in range(directives))
    (d / "www" / "index.html").write_text(f"<html>{ssi}ok</html>")
    temp = "".join(
        f"  {k}_temp_path {d}/tmp_{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (d / "nginx.conf").write_text(
        # workers as root: pytest's temporary directories are private to root
        f"user root;\nworker_processes {workers};\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n"
        "events { worker_connections 256; }\n"
        f"http {{\n  access_log off;\n{temp}"
        f"  server {{ listen 127.0.0.1:{port}; root {d}/www; ssi on; keepalive_requests 100000000; }}\n}}\n"
    )
    proc = subprocess.Popen(
        ["nginx", "-c", str(d / "nginx.conf"), "-p", str(d), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        end = time.monotonic() + 10
        while len(child_pids(proc.pid)) < workers and time.monotonic() < end:
            time.sleep(0.05)
        return proc, [proc.pid, *child_pids(proc.pid)]
    except BaseException:
        stop_process(proc)
        raise


def start_be_in(node: LinuxNode, app: str = "be", threads: int = 2) -> subprocess.Popen:
    """`stress-ng --cpu THREADS` started inside `app`'s cgroups of `node`: a shell joins them (the
    freezer last: a frozen BE cgroup freezes it there until a controller gives the job a core), then
    execs it. Its own session, so that `stop_be` kills it whole."""
    dirs = node.target_ref(app).dirs
    order = sorted(set(dirs.values()), key=lambda d: d == dirs.get("freezer"))
    script = f'for f in "$@"; do echo $$ > "$f"; done; exec stress-ng --cpu {int(threads)} --timeout 3600s'
    return subprocess.Popen(
        ["sh", "-c", script, "sh", *(str(d / "cgroup.procs") for d in order)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_be(node: LinuxNode, proc: subprocess.Popen, app: str = "be") -> None:
    """Kill the BE job and wait until its cgroup is empty (a frozen task dies only once thawed, so
    the node first gives it cores), so that `node.close()` can remove the cgroup."""
    if node.current_allocation()[app].cores <= 0:
        node.apply(unmanaged_allocation(node.capabilities()))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    procs = node.target_ref(app).dir("cpu") / "cgroup.procs"
    end = time.monotonic() + 10
    while procs.read_text().split() and time.monotonic() < end:
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; waits (no zombie)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_readings(path: Path, app: str, t0: float = 0.0, t1: float = math.inf) -> list[LatencyReading]:
    """The intervals `app`'s generator published to the feed file with wall time in [t0, t1]."""
    out = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            try:
                r, t = parse_line(line, 0.0)
            except FeedFormatError:
                continue
            if r.app == app and t0 <= t <= t1:
                out.append(r)
    return out


def read_feed(path: Path, app: str, t0: float = 0.0, t1: float = math.inf) -> list[float]:
    """p99s (us) that `app`'s generator published to the feed file with wall time in [t0, t1]."""
    return [r.p99_us for r in read_readings(path, app, t0, t1)]


class LoadgenProcess:
    """`python -m hw.loadgen` in a subprocess (SCHED_FIFO when `rt`), publishing `app`'s intervals
    to the file feed `feed` (the LinuxNode reads it; `p99s` reads it back). A context manager."""

    def __init__(
        self, target: str, rate_rps: float, app: str, feed: Path, *, rt: bool = True, seed: int = 1
    ) -> None:
        self.app, self.feed = app, Path(feed)
        self.feed.touch()
        cmd = [
            sys.executable, "-m", "hw.loadgen", "--target", target, "--rate", f"{rate_rps:g}", "--app", app,
            "--publish", f"file:{self.feed}", "--quiet", "--seed", str(seed),
        ]  # fmt: skip
        self.rt = bool(rt and rt_prefix())
        # its warnings go to a file (a pipe could fill up and stall it); generators may share a feed
        self.log = self.feed.with_name(f"{self.feed.stem}-{app}.log")
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                (rt_prefix() if self.rt else []) + cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err
            )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the generator has published its first interval (it warms memcached up first)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:]
                raise RuntimeError(f"hw.loadgen exited with {self.proc.returncode}: {tail}")
            if read_feed(self.feed, self.app):
                return
            time.sleep(0.1)
        raise TimeoutError(f"hw.loadgen published nothing for {self.app} within {timeout_s} s")

    def p99s(self, t0: float, t1: float = math.inf) -> list[float]:
        return read_feed(self.feed, self.app, t0, t1)

    def window_readings(self, seconds: float, skip_s: float = 0.0) -> list[LatencyReading]:
        """Sleep `skip_s + seconds`; the intervals published in the last `seconds`."""
        time.sleep(skip_s)
        t0 = time.time()
        time.sleep(seconds)
        return read_readings(self.feed, self.app, t0 + 0.25, time.time() + 0.25)  # ended inside the window

    def window(self, seconds: float, skip_s: float = 0.0) -> list[float]:
        """Sleep `skip_s + seconds`; the p99s of the intervals published in the last `seconds`."""
        return [r.p99_us for r in self.window_readings(seconds, skip_s)]

    def close(self) -> None:
        stop_process(self.proc, timeout_s=30.0)

    def __enter__(self) -> LoadgenProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the sweep ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepConfig:
    """The sweep's grid (request rates x CPU quotas in cores), its timing (s), memcached's worker
    threads, the simulator platform, whether the generator runs under SCHED_FIFO, and the seed."""

    rates_rps: tuple[float, ...] = (5000.0, 20000.0)
    quotas_cores: tuple[float, ...] = (0.1, 0.15, 0.25, 0.5, 1.0, 2.0)
    measure_s: float = 5.0
    settle_s: float = 1.5
    threads: int = 2  # memcached worker threads (the simulator's deployment follows the platform's cores)
    platform: str = "vm2"
    rt: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rates_rps or any(not (r > 0) for r in self.rates_rps):
            raise ConfigError("sweep: rates must be positive")
        if not self.quotas_cores or any(not (q > 0) for q in self.quotas_cores):
            raise ConfigError("sweep: quotas must be positive numbers of cores")
        for q in self.quotas_cores:
            if abs(q / QUOTA_STEP_CORES - round(q / QUOTA_STEP_CORES)) > 1e-6:
                raise ConfigError(f"sweep: quota {q:g} is not a multiple of {QUOTA_STEP_CORES} core")
        if not (self.measure_s >= 1.0 and self.settle_s >= 0.0):
            raise ConfigError("sweep: measure_s must be >= 1 and settle_s >= 0")


@dataclass(frozen=True)
class Point:
    """One (source, rate, quota): the median interval p99 and its quartiles (us), and for a real
    point the median of the generator's interval lag p99s (us; NaN: not published)."""

    source: str  # "real" or "sim"
    rate_rps: float
    quota_cores: float
    p99_us: float
    p99_q25_us: float
    p99_q75_us: float
    intervals: int
    lag_p99_us: float = math.nan

    @property
    def generator_bound(self) -> bool:
        """The generator's own lateness is a large part of the p99 (module docstring)."""
        return generator_bound(self.lag_p99_us, self.p99_us)


def _point(
    source: str, rate: float, quota: float, p99s: Sequence[float], lags_us: Sequence[float] = ()
) -> Point:
    xs = np.asarray([p for p in p99s if math.isfinite(p)], dtype=float)
    lag = median_lag_us(lags_us)
    if xs.size == 0:
        return Point(source, rate, quota, math.nan, math.nan, math.nan, 0, lag)
    q25, q50, q75 = np.percentile(xs, [25, 50, 75])
    return Point(source, rate, quota, float(q50), float(q25), float(q75), int(xs.size), lag)


Progress = Callable[[str], None]


def sim_sweep(cfg: SweepConfig, progress: Progress | None = None) -> list[Point]:
    """The simulator's memcached alone on `cfg.platform` at each rate and quota."""
    from env.sim.node import SimNode
    from env.sim.profiles import load_lc_profile
    from env.sim.scenario import AppEntry, Scenario
    from env.sim.traces import MAX_HORIZON_S

    max_rps = load_lc_profile("memcached").max_load_rps
    out = []
    for rate in cfg.rates_rps:
        scn = Scenario(
            name="sweep",
            platform=cfg.platform,
            apps=(AppEntry("memcached", load=rate / max_rps),),
            be=(),
            duration_s=MAX_HORIZON_S,  # the longest scenario: the sweep never reaches it
            warmup_s=0.0,
            seed=cfg.seed,
        )
        node = SimNode(scn, seed=cfg.seed)
        caps = node.capabilities()
        base = node.current_allocation()
        for q in cfg.quotas_cores:
            quota = 0.0 if q >= caps.cores else q  # the whole node is no quota at all
            node.apply(base.replace_app("memcached", cpu_quota=quota))
            dt = caps.interval_s
            for _ in range(max(0, round(cfg.settle_s / dt))):
                node.clock.sleep_until(node.clock.now() + dt)
                node.observe()
            p99s = []
            for _ in range(max(1, round(cfg.measure_s / dt))):
                node.clock.sleep_until(node.clock.now() + dt)
                p99s.append(node.observe().app("memcached").p99_us)
            out.append(_point("sim", rate, q, p99s))
            if progress:
                progress(f"sim  {rate:8.0f} rps  quota {q:5.2f} cores  p99 {out[-1].p99_us:9.0f} us")
    return out


def real_capability() -> str | None:
    """Why the real half cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (it creates cgroups)"
    if not shutil.which("memcached"):
        return "needs Debian's memcached (apt install memcached)"
    if not Path("/sys/fs/cgroup/cpu").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "needs the cgroup cpu controller"
    return None


def real_sweep(
    cfg: SweepConfig, progress: Progress | None = None, workdir: Path | None = None
) -> list[Point]:
    """memcached on this machine at each rate and quota (module docstring)."""
    from hw.config import AppTarget, CoresConfig, FeedConfig, LinuxNodeConfig

    why = real_capability()
    if why:
        raise RuntimeError(f"the real sweep {why}")
    out: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="coloc-sweep-", dir=workdir) as tmp:
        port = free_port()
        mc = start_memcached(port, cfg.threads)
        try:
            for i, rate in enumerate(cfg.rates_rps):
                feed = Path(tmp) / f"feed-{i}.jsonl"
                node_cfg = LinuxNodeConfig(
                    name="sweep",
                    apps=(
                        AppTarget("memcached", "lc", qos_target_us=1e6, max_load_rps=rate, pids=(mc.pid,)),
                    ),
                    knobs=("core",),
                    cgroup_parent=f"coloc_sweep_{uuid.uuid4().hex[:8]}",
                    state_path=str(Path(tmp) / f"journal-{i}.jsonl"),
                    cores=CoresConfig(mode="quota", quota_step_cores=QUOTA_STEP_CORES),
                    feed=FeedConfig(url=f"file:{feed}"),
                )
                with (
                    LoadgenProcess(f"memcached://127.0.0.1:{port}", rate, "memcached", feed, rt=cfg.rt) as lg,
                    LinuxNode(node_cfg) as node,
                ):
                    lg.wait_ready()
                    node.reset()
                    base = node.current_allocation()
                    cores = node.capabilities().cores
                    if max(cfg.quotas_cores) > cores:
                        raise ConfigError(
                            f"sweep: quota {max(cfg.quotas_cores):g} exceeds this node's {cores:g} cores"
                        )
                    for q in cfg.quotas_cores:
                        got = node.apply(base.replace_app("memcached", cores=q))["memcached"].cores
                        if abs(got - q) > 1e-6:
                            raise RuntimeError(f"asked for a quota of {q:g} cores, the cgroup holds {got:g}")
                        window = lg.window_readings(cfg.measure_s, skip_s=cfg.settle_s)
                        pt = _point(
                            "real", rate, q, [r.p99_us for r in window], [r.lag_p99_us for r in window]
                        )
                        out.append(pt)
                        if progress:
                            progress(
                                f"real {rate:8.0f} rps  quota {q:5.2f} cores  p99 {pt.p99_us:9.0f} us  "
                                f"({pt.intervals} intervals; generator lag p99 {pt.lag_p99_us:.0f} us"
                                + (", GENERATOR-BOUND)" if pt.generator_bound else ")")
                                + ("  no interval ended in the window" if not pt.intervals else "")
                            )
        finally:
            stop_process(mc)
    return out


# ---- report ----------------------------------------------------------------------------------------
def compare(points: Sequence[Point]) -> list[dict]:
    """Rows rate x quota with both p99s and real / sim."""
    sim = {(p.rate_rps, p.quota_cores): p for p in points if p.source == "sim"}
    rows = []
    for p in points:
        if p.source != "real":
            continue
        s = sim.get((p.rate_rps, p.quota_cores))
        ratio = p.p99_us / s.p99_us if s and s.p99_us > 0 else math.nan
        rows.append(
            {
                "rate_rps": p.rate_rps,
                "quota_cores": p.quota_cores,
                "real_p99_us": p.p99_us,
                "sim_p99_us": s.p99_us if s else math.nan,
                "real_over_sim": ratio,
                "generator_lag_p99_us": p.lag_p99_us,
                "generator_bound": p.generator_bound,
            }
        )
    return rows


def table(points: Sequence[Point]) -> str:
    """The points as a text table: the simulator's p99 per rate and quota, beside the real p99, its
    quartiles, the real/sim ratio and the generator's lag when the real half ran (generator-bound
    points marked, with a footnote)."""
    have_real = any(p.source == "real" for p in points)
    lines = [
        f"{'rate rps':>9} {'quota':>6} {'sim p99 us':>11}"
        + (f" {'real p99 us':>12} {'IQR':>17} {'real/sim':>8} {'gen lag us':>11}" if have_real else "")
    ]
    real = {(p.rate_rps, p.quota_cores): p for p in points if p.source == "real"}
    for s in (p for p in points if p.source == "sim"):
        line = f"{s.rate_rps:9.0f} {s.quota_cores:6.2f} {s.p99_us:11.0f}"
        r = real.get((s.rate_rps, s.quota_cores))
        if have_real and r is not None:
            iqr = f"{r.p99_q25_us:.0f}-{r.p99_q75_us:.0f}"
            line += f" {r.p99_us:12.0f} {iqr:>17} {r.p99_us / s.p99_us:8.2f} {r.lag_p99_us:11.0f}"
            line += " *" if r.generator_bound else ""
        lines.append(line)
    if any(p.generator_bound for p in points):
        lines.append(generator_bound_note(points))
    return "\n".join(lines)


def generator_bound_note(points: Sequence[Point]) -> str:
    """What the generator-bound points (marked *) mean and what to do about them."""
    n = sum(p.generator_bound for p in points)
    return (
        f"* {n} real point(s) generator-bound: the load generator's own lag p99 is over "
        f"{GENERATOR_BOUND_MIN_LAG_US / 1000:g} ms and {GENERATOR_BOUND_FRAC:.0%} of the p99, so they measure "
        "this machine's generator, not memcached; "
        "lower --rates, or measure on a quieter machine"
    )


def plot(points: Sequence[Point], path: Path, title: str) -> None:
    """p99 against CPU quota, one colour per rate, real (circles) and simulated (squares), to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rates = sorted({p.rate_rps for p in points})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, rate in enumerate(rates):
        c = colors[i % len(colors)]
        for source, style in (("real", "o-"), ("sim", "s--")):
            ps = sorted(
                (p for p in points if p.source == source and p.rate_rps == rate), key=lambda p: p.quota_cores
            )
            if not ps:
                continue
            x = [p.quota_cores for p in ps]
            y = [p.p99_us for p in ps]
            if source == "real":
                err = [[p.p99_us - p.p99_q25_us for p in ps], [p.p99_q75_us - p.p99_us for p in ps]]
                ax.errorbar(x, y, yerr=err, fmt=style, color=c, capsize=3, label=f"{source} {rate:g} rps")
                bound = [p for p in ps if p.generator_bound]
                if bound:
                    ax.plot(
                        [p.quota_cores for p in bound], [p.p99_us for p in bound], "x", color="red",
                        markersize=10, label="generator-bound" if i == 0 else None,
                    )  # fmt: skip
            else:
                ax.plot(x, y, style, color=c, label=f"{source} {rate:g} rps", alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memcached CPU quota (cores)")
    ax.set_ylabel("p99 per 500 ms interval, median (us)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(out: Path, cfg: SweepConfig, points: Sequence[Point], notes: dict) -> None:
    """DIR/sweep.json and DIR/sweep.png."""
    out.mkdir(parents=True, exist_ok=True)

    def num(x):
        return x if not isinstance(x, float) or math.isfinite(x) else None

    data = {
        "config": asdict(cfg),
        "machine": {"node": os.uname().nodename, "cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        **notes,
        "points": [
            {**{k: num(v) for k, v in asdict(p).items()}, "generator_bound": p.generator_bound}
            for p in points
        ],
        "comparison": [{k: num(v) for k, v in row.items()} for row in compare(points)],
    }
    (out / "sweep.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(
        points,
        out / "sweep.png",
        f"memcached p99 vs CPU quota: this machine vs the simulator ({cfg.platform})",
    )


# ---- CLI ------------------------------------------------------------------------------------------
def floats_arg(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated numbers."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m hw.sweep` (its --help)."""
    d = SweepConfig()
    ap = argparse.ArgumentParser(
        prog="python -m hw.sweep",
        description=(
            "memcached's p99 against its CPU quota on this machine (a LinuxNode sets the quota; the open-loop "
            "load generator measures) and in the simulator (the memcached profile on a platform file), "
            "plotted together. Writes DIR/sweep.json and DIR/sweep.png."
        ),
    )
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument(
        "--rates", type=floats_arg, default=d.rates_rps, help="requests/s, comma-separated (5000,20000)"
    )
    ap.add_argument(
        "--quotas",
        type=floats_arg,
        default=d.quotas_cores,
        help=f"CPU quotas in cores, multiples of {QUOTA_STEP_CORES} (0.1,0.15,0.25,0.5,1,2)",
    )
    ap.add_argument("--measure-s", type=float, default=d.measure_s, help="measured seconds per point (5)")
    ap.add_argument("--settle-s", type=float, default=d.settle_s, help="seconds after each change (1.5)")
    ap.add_argument("--platform", default=d.platform, help="simulator platform, configs/node/NAME.yaml (vm2)")
    ap.add_argument("--sim-only", action="store_true", help="only the simulator's curve (no root needed)")
    ap.add_argument("--no-rt", action="store_true", help="do not run the load generator under SCHED_FIFO")
    ap.add_argument("--seed", type=int, default=d.seed, help="simulator seed (0)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hw.sweep` (module docstring): exit 0 when done, 1 when the real half cannot run or failed,
    2 on bad arguments."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        cfg = SweepConfig(
            rates_rps=args.rates,
            quotas_cores=args.quotas,
            measure_s=args.measure_s,
            settle_s=args.settle_s,
            platform=args.platform,
            rt=not args.no_rt,
            seed=args.seed,
        )
        from env.sim.platform import load_platform

        load_platform(cfg.platform)
    except ConfigError as e:
        ap.print_usage(sys.stderr)
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    points = sim_sweep(cfg, progress)
    notes: dict = {"real": "not run (--sim-only)" if args.sim_only else "ran"}
    if not args.sim_only:
        why = real_capability()
        if why:
            print(
                f"{ap.prog}: error: the real half {why}; use --sim-only for the simulator alone",
                file=sys.stderr,
            )
            return 1
        notes["load_generator"] = "SCHED_FIFO" if cfg.rt and rt_prefix() else "normal priority"
        try:
            points += real_sweep(cfg, progress)
        except ConfigError as e:
            print(f"{ap.prog}: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except (RuntimeError, OSError) as e:  # memcached, the generator or a cgroup failed
            print(f"{ap.prog}: error: the real half failed: {e}", file=sys.stderr)
            return 1
    write_results(args.out, cfg, points, notes)
    print(table(points))
    if any(p.generator_bound for p in points):
        print(f"{ap.prog}: warning: {generator_bound_note(points)[2:]}", file=sys.stderr)
    empty = [p for p in points if p.source == "real" and not p.intervals]
    if empty:
        print(
            f"{ap.prog}: warning: {len(empty)} real point(s) got no interval from the generator in their window "
            f"({', '.join(f'{p.rate_rps:g} rps at {p.quota_cores:g} cores' for p in empty)}): it fell behind "
            "its schedule or memcached stopped answering",
            file=sys.stderr,
        )
    print(f"wrote {args.out / 'sweep.json'} and {args.out / 'sweep.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
