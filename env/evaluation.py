"""The evaluation protocols behind `evaluate.py` and `train.py` (DESIGN §5): `compare`, `timeline`
and the PARTIES Sec. 5 `maxload` protocol, their summaries and their plots.

Every run is one `env.loop.run_episode` of a controller on a `SimNode` with the evaluation guard
chain, and every number comes from `env.metrics`. Controllers are named by spec strings; they are
built by a factory found by import path (`CONTROLLER_FACTORY`, `baselines.registry:build_for_run`
by default), so `env` does not import `baselines` (DESIGN §2: dependencies point one way). See
`evaluate.py` for the command-line contract (staged output, exit status 2, seeds, workers).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from env import metrics as M
from env.config import ConfigError, load_yaml, resolve_config
from env.guards import GuardsConfig, build_guards
from env.loop import TickRecord, read_jsonl, run_episode
from env.sim.node import SimNode
from env.sim.profiles import LcProfile, known_profiles, load_profile
from env.sim.scenario import Scenario, load_scenario, simple_scenario

CONTROLLER_FACTORY = "baselines.registry:build_for_run"


@cache
def controller_factory() -> Callable[..., Any]:
    """`factory(spec, capabilities, scenario, node, seed) -> Controller`, imported on first use."""
    mod, _, attr = CONTROLLER_FACTORY.partition(":")
    return getattr(importlib.import_module(mod), attr)


def parse_specs_arg(text: str) -> list[str]:
    """Comma-separated controller specs, validated by the registry (ConfigError when unknown)."""
    mod, _, _ = CONTROLLER_FACTORY.partition(":")
    return importlib.import_module(mod).parse_specs(text)


DEFAULT_LOADS_PCT = tuple(range(10, 101, 10))  # PARTIES Sec. 5.1: 10% to 100% in 10% steps
MIX_SIZES = (2, 3, 4, 5, 6)


# ======================================================================================================
# Output directory: validate first, write to a temp dir, move into place at the end
# ======================================================================================================
def check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out}: exists and is not empty; pass --overwrite to replace it")


@contextmanager
def staged_output(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out`, on any failure it
    is removed (with any parent directories this created), so nothing partial is left behind."""
    check_out(out, overwrite)
    created: list[Path] = []
    p = out.parent.resolve()
    while not p.exists():
        created.append(p)
        p = p.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        raise
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def _write_config(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(plain_data(data), sort_keys=False))


def plain_data(x: Any) -> Any:
    """Data structures YAML can dump (tuples -> lists, NaN -> null)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return plain_data(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): plain_data(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain_data(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ======================================================================================================
# Parallel map
# ======================================================================================================
def pmap(fn: Callable[[Any], Any], items: Sequence[Any], workers: int, desc: str) -> list[Any]:
    """`[fn(x) for x in items]` in order, on `workers` processes (spawned: no state leaks from the
    parent) with a progress bar. Results do not depend on `workers`."""
    from tqdm import tqdm

    bar = tqdm(total=len(items), desc=desc, unit="run", disable=None, leave=False)
    try:
        if workers <= 1 or len(items) <= 1:
            out = []
            for x in items:
                out.append(fn(x))
                bar.update(1)
            return out
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(workers, len(items))) as pool:
            out = []
            for r in pool.imap(fn, items):
                out.append(r)
                bar.update(1)
            return out
    finally:
        bar.close()


# ======================================================================================================
# One run
# ======================================================================================================
@dataclass(frozen=True)
class RunJob:
    """One controller on one scenario with one seed (picklable: it crosses to worker processes)."""

    controller: str
    scenario: Scenario
    seed: int
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    jsonl: str | None = None  # write every tick here
    duration_s: float | None = None  # default: the scenario's
    stop_when_unsustained: bool = False  # max-load search: stop once the verdict is known
    warmup_s: float = M.WARMUP_S
    measure_s: float = M.MEASURE_S


def controller_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 1])


def build_run(job: RunJob) -> tuple[SimNode, Any]:
    node = SimNode(job.scenario, seed=job.seed)
    return node, controller_factory()(job.controller, node.capabilities(), job.scenario, node, job.seed)


def execute(job: RunJob) -> list[TickRecord]:
    """Run the job; the records (also written to `job.jsonl` line by line when set)."""
    node, ctrl = build_run(job)
    duration = job.duration_s if job.duration_s is not None else job.scenario.duration_s
    stop = M.unsustained_stop(job.warmup_s, job.measure_s) if job.stop_when_unsustained else None
    with open(job.jsonl, "w") if job.jsonl else nullcontext() as f:
        return run_episode(
            node,
            ctrl,
            duration,
            guards=build_guards(job.guards),
            rng=controller_rng(job.seed),
            on_tick=None if f is None else (lambda rec: f.write(rec.to_json() + "\n")),
            stop_when=stop,
        )


def run_summary(job: RunJob) -> dict[str, Any]:
    """Worker of compare/timeline: run and summarise (the compare row plus details)."""
    recs = execute(job)
    s = M.summarize(recs, job.scenario.warmup_s)
    row = {"controller": job.controller, "seed": job.seed, **s.row()}
    row["invalid_intervals"] = s.invalid_intervals
    row["qos_guarantee_per_app"] = M.json_safe(s.qos_guarantee_per_app)
    return row


# ======================================================================================================
# Input validation (everything before any output is created)
# ======================================================================================================
def lc_app_names() -> list[str]:
    return [p for p in known_profiles() if isinstance(load_profile(p), LcProfile)]


def load_scenario_arg(text: str) -> tuple[Scenario, str]:
    path = resolve_config("scenarios", text)
    return load_scenario(path), str(path)


def load_guards_arg(path: str | None) -> GuardsConfig:
    if path is None:
        return GuardsConfig()
    return GuardsConfig.from_dict(load_yaml(path), Path(path).name)


def probe(scenario: Scenario, specs: Sequence[str], seed: int) -> None:
    """Build the node (which reads trace files) and every controller once, so that bad input
    fails here with a clear message and not in a worker after the output dir exists."""
    node = SimNode(scenario, seed=seed)
    make = controller_factory()
    for s in specs:
        make(s, node.capabilities(), scenario, node, seed).reset(node.capabilities(), controller_rng(seed))


# ======================================================================================================
# compare
# ======================================================================================================
_COLUMNS = (  # key, header, scale, decimals
    ("qos_guarantee", "QoS guarantee (%)", 100.0, 1),
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


UNITS = {
    "qos_guarantee": "fraction of measured intervals with every LC target met",
    "mean_tardiness": "p99 / target, mean over measured samples",
    "lc_emu": "aggregate load (sum of load / max load) if sustained, else 0; null when the load varies",
    "emu": "Heracles EMU: load of the LC apps meeting QoS + normalised BE throughput, per interval, mean",
    "be_throughput": "BE throughput normalised to the BE job alone, mean",
    "convergence_s": "mean over converged events (start, detected load changes) of the time to 5 met intervals",
    "unconverged": "events (start, load changes) not converged before the next event or the end",
    "violations": "measured intervals with at least one LC target missed",
    "decide_ms_p50": "ms",
    "decide_ms_p99": "ms",
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
    seeds = [scenario.seed + i for i in range(n_seeds)]
    check_out(out, overwrite)
    probe(scenario, specs, seeds[0])
    with staged_output(out, overwrite) as tmp:
        (tmp / "runs").mkdir()
        jobs = [
            RunJob(s, scenario, seed, guards, str(tmp / "runs" / f"{_safe(s)}-seed{seed}.jsonl"))
            for s in specs
            for seed in seeds
        ]
        results = pmap(run_summary, jobs, workers, "compare")
        _write_json(
            tmp / "summary.json",
            {"scenario": scenario.name, "scenario_file": scenario_file, "units": UNITS, "results": results},
        )
        table = summary_table(results, specs)
        (tmp / "summary.md").write_text(
            f"# compare: {scenario.name}\n\n{scenario.description}\n\n"
            f"Seeds {seeds}; warm-up {scenario.warmup_s:g} s of {scenario.duration_s:g} s; "
            f"mean ± standard deviation over seeds.\n\n{table}\n"
        )
        _write_config(
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


def plot_compare(results: list[dict[str, Any]], specs: Sequence[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [
        ("qos_guarantee", "QoS guarantee (fraction)"),
        ("be_throughput", "BE throughput (x alone)"),
        ("emu", "EMU (Heracles)"),
    ]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, (k, label) in zip(axes, keys):
        means, errs = [], []
        for c in specs:
            xs = [r[k] for r in results if r["controller"] == c and r[k] is not None]
            means.append(float(np.mean(xs)) if xs else 0.0)
            errs.append(float(np.std(xs)) if len(xs) > 1 else 0.0)
        ax.bar(range(len(specs)), means, yerr=errs, color="tab:blue", capsize=3)
        ax.set_xticks(range(len(specs)), specs, rotation=30, ha="right")
        ax.set_title(label)
        ax.set_ylim(0, max(1.05, max(m + e for m, e in zip(means, errs)) * 1.05))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ======================================================================================================
# timeline
# ======================================================================================================
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
    check_out(out, overwrite)
    probe(scenario, specs, seed)
    with staged_output(out, overwrite) as tmp:
        (tmp / "runs").mkdir()
        paths = {s: tmp / "runs" / f"{_safe(s)}.jsonl" for s in specs}
        jobs = [RunJob(s, scenario, seed, guards, str(paths[s])) for s in specs]
        results = pmap(run_summary, jobs, workers, "timeline")
        _write_json(
            tmp / "summary.json",
            {"scenario": scenario.name, "scenario_file": scenario_file, "units": UNITS, "results": results},
        )
        (tmp / "summary.md").write_text(
            f"# timeline: {scenario.name}\n\n{scenario.description}\n\nSeed {seed}.\n\n"
            f"{summary_table(results, specs)}\n"
        )
        _write_config(
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


def plot_timeline(runs: dict[str, list[TickRecord]], path: Path, scenario: Scenario) -> None:
    """PARTIES Fig. 9 layout: one column per controller; rows: load, latency / target (log y, the
    QoS line at 1), cores, LLC ways, frequency (per LC app and the BE job), BE throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lc = list(scenario.app_names)
    be = list(scenario.be_names)
    names = lc + be
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    rows = ["load (% of max)", "p99 / target", "cores", "LLC ways", "frequency (GHz)", "BE throughput (%)"]
    ncol = len(runs)
    fig, axes = plt.subplots(
        len(rows), ncol, figsize=(4.2 * ncol + 1, 11), sharex="col", sharey="row", squeeze=False
    )
    for j, (spec, recs) in enumerate(runs.items()):
        t = np.array([r.time_s for r in recs])
        col = axes[:, j]
        col[0].set_title(spec)
        for n in lc:
            load = [r.app_tick(n).load_frac * 100 for r in recs]
            col[0].plot(t, load, color=colors[n], label=n)
            lat = [r.app_tick(n).tardiness for r in recs]
            col[1].plot(t, lat, color=colors[n], lw=0.9)
        col[1].axhline(1.0, color="k", ls="--", lw=0.8)
        col[1].set_yscale("log")
        for i, n in enumerate(names):
            # thicker lines first, so that apps holding the same amount stay visible
            style = {"color": colors[n], "lw": max(3.2 - 0.6 * i, 0.8), "ls": ":" if n in be else "-"}
            col[2].step(t, [r.alloc_of(n).cores for r in recs], where="post", **style)
            col[3].step(t, [r.alloc_of(n).llc_ways for r in recs], where="post", **style)
            col[4].step(t, [r.alloc_of(n).freq_mhz / 1000 for r in recs], where="post", **style)
        col[5].plot(t, [r.be_throughput * 100 for r in recs], color="tab:gray")
        col[-1].set_xlabel("time (s)")
        for ax in col:
            ax.grid(alpha=0.3)
    for i, label in enumerate(rows):
        axes[i, 0].set_ylabel(label)
    handles = [plt.Line2D([], [], color=colors[n], ls=":" if n in be else "-") for n in names]
    fig.suptitle(f"{scenario.name}: {scenario.description}", y=0.995, fontsize=9)
    fig.legend(
        handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.975), ncol=len(names), frameon=False
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ======================================================================================================
# maxload: PARTIES Sec. 5 protocol
# ======================================================================================================
@dataclass(frozen=True)
class MaxLoadProtocol:
    """PARTIES Sec. 5.1: loads 10..100% in 10% steps; 30 s warm-up, 60 s measured; a load point
    is sustained when >= 95% of the measured intervals meet every target, in every seed."""

    loads_pct: tuple[int, ...] = DEFAULT_LOADS_PCT
    warmup_s: float = M.WARMUP_S
    measure_s: float = M.MEASURE_S
    seeds: tuple[int, ...] = (0,)
    platform: str = "parties"
    be: tuple[str, ...] = ("be_parties",)
    guards: GuardsConfig = field(default_factory=GuardsConfig)


def instance_names(apps: Sequence[str]) -> list[str]:
    """Unique instance names: a repeated app gets -2, -3, ... (PARTIES mixes two MongoDBs)."""
    seen: dict[str, int] = {}
    out = []
    for a in apps:
        seen[a] = seen.get(a, 0) + 1
        out.append(a if seen[a] == 1 else f"{a}-{seen[a]}")
    return out


def point_scenario(
    apps: Sequence[str], loads_pct: Sequence[float], proto: MaxLoadProtocol, seed: int
) -> Scenario:
    names = instance_names(apps)
    loads = {f"{a}:{n}" if n != a else a: p / 100.0 for a, n, p in zip(apps, names, loads_pct)}
    return simple_scenario(
        loads,
        platform=proto.platform,
        be=proto.be,
        duration_s=proto.warmup_s + proto.measure_s,
        warmup_s=proto.warmup_s,
        seed=seed,
        name="maxload-" + "-".join(f"{n}{p:g}" for n, p in zip(names, loads_pct)),
    )


def point_sustained(
    spec: str, apps: Sequence[str], loads_pct: Sequence[float], proto: MaxLoadProtocol
) -> bool:
    """One load point under the protocol: sustained in every seed (stops at the first failure;
    each run stops as soon as its verdict is known)."""
    for seed in proto.seeds:
        job = RunJob(
            spec,
            point_scenario(apps, loads_pct, proto, seed),
            seed,
            proto.guards,
            stop_when_unsustained=True,
            warmup_s=proto.warmup_s,
            measure_s=proto.measure_s,
        )
        if not M.sustained(execute(job), proto.warmup_s, proto.measure_s):
            return False
    return True


class PointOracle:
    """Memoised `point_sustained` for one controller and mix, counting runs."""

    def __init__(self, spec: str, apps: Sequence[str], proto: MaxLoadProtocol) -> None:
        self.spec, self.apps, self.proto = spec, list(apps), proto
        self.cache: dict[tuple[float, ...], bool] = {}

    def __call__(self, loads_pct: Sequence[float]) -> bool:
        key = tuple(float(x) for x in loads_pct)
        if key not in self.cache:
            self.cache[key] = point_sustained(self.spec, self.apps, key, self.proto)
        return self.cache[key]

    @property
    def points(self) -> int:
        return len(self.cache)


def max_level(ok: Callable[[int], bool], n: int, hi: int | None = None) -> int:
    """Largest index i in [0, hi) with ok(i), assuming ok is monotone (true then false): binary
    search; -1 when ok(0) is false. Sustainability is monotone in load (PARTIES Sec. 5.1)."""
    lo, hi = -1, n if hi is None else hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class CellTask:
    """Max sustained load of the last app, all other apps' loads fixed (one heatmap cell or one
    point of a Fig. 5 curve). `hi` bounds the search (exclusive level index)."""

    spec: str
    apps: tuple[str, ...]
    loads_pct: tuple[float, ...]  # all but the last app
    proto: MaxLoadProtocol
    hi: int | None = None


def search_cell(task: CellTask) -> tuple[float, int]:
    """Worker: (max sustained load % of the last app or 0, load points run)."""
    oracle = PointOracle(task.spec, task.apps, task.proto)
    levels = task.proto.loads_pct
    i = max_level(lambda k: oracle([*task.loads_pct, levels[k]]), len(levels), task.hi)
    return (float(levels[i]) if i >= 0 else 0.0), oracle.points


def grid_cells(
    apps: Sequence[str], fixed_pct: Sequence[float], levels: Sequence[int]
) -> list[tuple[float, ...]]:
    """The (app1[, app2]) load pairs of the grid with the middle apps fixed (empty for 1 app)."""
    if len(apps) == 2:
        return [(float(a),) for a in levels]
    return [(float(a), float(b), *fixed_pct) for a in levels for b in levels]


def grid_emu(
    apps: Sequence[str], cells: Sequence[tuple[float, ...]], maxes: Sequence[float]
) -> tuple[float, dict]:
    """LC EMU of a grid (fraction) and its best point (percent per instance)."""
    best, best_pt = 0.0, {}
    for cell, m in zip(cells, maxes):
        if m <= 0:
            continue
        agg = (sum(cell) + m) / 100.0
        if agg > best + 1e-12:
            best, best_pt = agg, dict(zip(instance_names(apps), [*cell, m]))
    return best, best_pt


def serial_grid(
    spec: str, apps: Sequence[str], proto: MaxLoadProtocol, fixed_pct: Sequence[float]
) -> tuple[float, dict, int]:
    """The full grid for a 2- or 3-app mix in one process, each cell's search bounded by its
    already-searched neighbours (the max load is non-increasing in the other apps' loads)."""
    oracle = PointOracle(spec, apps, proto)
    levels = proto.loads_pct
    n = len(levels)
    pairs = [(a,) for a in range(n)] if len(apps) == 2 else [(a, b) for a in range(n) for b in range(n)]
    res: dict[tuple[int, ...], int] = {}
    cells, maxes = [], []
    for pair in pairs:
        bound = n
        for d in range(len(pair)):
            if pair[d] > 0:
                prev = tuple(x - 1 if e == d else x for e, x in enumerate(pair))
                bound = min(bound, res[prev] + 1)
        cell = (*(float(levels[x]) for x in pair), *fixed_pct)
        i = max_level(lambda k, c=cell: oracle([*c, levels[k]]), n, bound)
        res[pair] = i
        cells.append(cell)
        maxes.append(float(levels[i]) if i >= 0 else 0.0)
    emu, pt = grid_emu(apps, cells, maxes)
    return emu, pt, oracle.points


def greedy_search(spec: str, apps: Sequence[str], proto: MaxLoadProtocol) -> tuple[float, dict, int]:
    """LC EMU search for mixes too large for the grid, identical for every controller:
    1. the largest equal load (a level of the grid) at which all apps together are sustained
       (binary search; none -> LC EMU 0);
    2. from there, round-robin over the apps in mix order: raise one app by one level and keep the
       raise if the point is still sustained; stop after a full round without a raise.
    LC EMU = the aggregate load reached. A lower bound of the grid's LC EMU."""
    oracle = PointOracle(spec, apps, proto)
    levels = proto.loads_pct
    n = len(apps)
    i = max_level(lambda k: oracle([levels[k]] * n), len(levels))
    if i < 0:
        return 0.0, {}, oracle.points
    idx = [i] * n
    raised = True
    while raised:
        raised = False
        for a in range(n):
            if idx[a] + 1 >= len(levels):
                continue
            trial = list(idx)
            trial[a] += 1
            if oracle([levels[k] for k in trial]):
                idx, raised = trial, True
    loads = [float(levels[k]) for k in idx]
    return sum(loads) / 100.0, dict(zip(instance_names(apps), loads)), oracle.points


@dataclass(frozen=True)
class MixTask:
    spec: str
    apps: tuple[str, ...]
    proto: MaxLoadProtocol
    search: str  # "grid" | "greedy"


def search_mix(task: MixTask) -> dict[str, Any]:
    """Worker: LC EMU of one mix for one controller."""
    if task.search == "grid":
        fixed = [float(task.proto.loads_pct[0])] * max(0, len(task.apps) - 3)
        emu, pt, runs = serial_grid(task.spec, task.apps, task.proto, fixed)
    else:
        emu, pt, runs = greedy_search(task.spec, task.apps, task.proto)
    return {
        "controller": task.spec,
        "size": len(task.apps),
        "apps": list(task.apps),
        "lc_emu": emu,
        "best_point_pct": pt,
        "search": task.search,
        "points": runs,
    }


def sample_mixes(n: int, sizes: Sequence[int], seed: int, apps: Sequence[str]) -> list[tuple[str, ...]]:
    """N mixes per size: multisets of the LC apps drawn with replacement (PARTIES mixes include two
    MongoDBs), distinct where the number of possible mixes allows, sorted by name."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, ...]] = []
    for size in sizes:
        seen: set[tuple[str, ...]] = set()
        for _ in range(n):
            mix: tuple[str, ...] = ()
            for _attempt in range(100):
                mix = tuple(sorted(rng.choice(list(apps), size=size, replace=True)))
                if mix not in seen:
                    break
            seen.add(mix)
            out.append(tuple(str(x) for x in mix))
    return out


def run_maxload(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    specs = parse_specs_arg(args.controllers)
    known = lc_app_names()
    apps = _parse_apps(args.apps, known) if args.apps else []
    if not apps and not args.mixes:
        raise ConfigError("maxload: give --apps (the heatmap) and/or --mixes N (the Fig. 7 violins)")
    if apps and len(apps) < 2:
        raise ConfigError("--apps: need at least 2 apps")
    loads = _parse_pcts(args.loads, "--loads") if args.loads else list(DEFAULT_LOADS_PCT)
    if loads != sorted(set(loads)):
        raise ConfigError("--loads: must be increasing")
    be = tuple(b for b in args.be.split(",") if b and b != "none")
    proto = MaxLoadProtocol(
        loads_pct=tuple(int(x) if float(x).is_integer() else x for x in loads),
        warmup_s=args.warmup_s,
        measure_s=args.measure_s,
        seeds=tuple(range(args.seed, args.seed + args.seeds)),
        platform=args.platform,
        be=be,
        guards=load_guards_arg(args.guards),
    )
    fixed: list[float] = []
    if len(apps) > 2:
        fixed = _parse_pcts(args.fixed_loads, "--fixed-loads")
        if len(fixed) == 1:
            fixed = fixed * (len(apps) - 3)
        if len(fixed) != len(apps) - 3:
            raise ConfigError(
                f"--fixed-loads: give one load or {len(apps) - 3} (for {apps[2:-1]}), got {len(fixed)}"
            )
    # mixes draw from the apps characterised on this platform (e.g. not memcached_qprm, the Q-PRM
    # node's deployment of memcached, on the PARTIES node)
    native = [a for a in known if load_profile(a).reference.platform == args.platform] or known
    mixes = sample_mixes(args.mixes, args.mix_sizes, args.seed, native) if args.mixes else []
    check_out(Path(args.out), args.overwrite)
    probe_apps = apps or list(mixes[0])
    probe(
        point_scenario(probe_apps, [loads[0]] * len(probe_apps), proto, proto.seeds[0]), specs, proto.seeds[0]
    )

    summary: dict[str, Any] = {
        "kind": "maxload",
        "protocol": plain_data(proto),
        "apps": apps,
        "instances": instance_names(apps),
        "fixed_loads_pct": dict(zip(instance_names(apps)[2:-1], fixed)),
        "units": {"lc_emu": "fraction (1.0 = 100% of one app's max load)", "*_pct": "percent of max load"},
        "results": {},
        "mixes": [],
    }
    out = Path(args.out)
    with staged_output(out, args.overwrite) as tmp:
        if apps:
            cells = grid_cells(apps, fixed, proto.loads_pct)
            tasks = [CellTask(s, tuple(apps), c, proto) for s in specs for c in cells]
            found = pmap(search_cell, tasks, args.workers, "maxload cells")
            for k, s in enumerate(specs):
                part = found[k * len(cells) : (k + 1) * len(cells)]
                maxes = [m for m, _ in part]
                emu, pt = grid_emu(apps, cells, maxes)
                n = len(proto.loads_pct)
                grid: Any = maxes if len(apps) == 2 else [maxes[r * n : (r + 1) * n] for r in range(n)]
                summary["results"][s] = {
                    "lc_emu": emu,
                    "best_point_pct": pt,
                    "max_last_load_pct": grid,
                    "points": sum(p for _, p in part),
                }
            plot_maxload(summary, specs, tmp / "maxload.png")
        if mixes:
            auto = {k: ("grid" if k <= 3 else "greedy") for k in MIX_SIZES}
            mtasks = [
                MixTask(
                    s, m, proto, args.mix_search if args.mix_search != "auto" else auto.get(len(m), "greedy")
                )
                for s in specs
                for m in mixes
            ]
            summary["mixes"] = pmap(search_mix, mtasks, args.workers, "maxload mixes")
            plot_violins(summary["mixes"], specs, tmp / "emu_by_mix_size.png")
        _write_json(tmp / "summary.json", plain_data(summary))
        (tmp / "summary.md").write_text(maxload_markdown(summary, specs))
        _write_config(
            tmp / "config.yaml",
            {
                "command": "maxload",
                "argv": list(argv),
                "protocol": proto,
                "apps": apps,
                "fixed_loads_pct": fixed,
                "controllers": specs,
                "mixes": [list(m) for m in mixes],
                "mix_search": args.mix_search,
                "workers": args.workers,
            },
        )
    return summary


def _parse_apps(text: str, known: Sequence[str]) -> list[str]:
    import difflib

    apps = [a.strip() for a in text.split(",")]
    for a in apps:
        if a not in known:
            hint = difflib.get_close_matches(a, list(known), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"--apps: unknown app {a!r}{extra}; known LC apps: {list(known)}")
    return apps


def _parse_pcts(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated percentages, got {text!r}") from None
    if not vals or any(not (0 < v <= 500) for v in vals):
        raise ConfigError(f"{flag}: loads are percentages of max load in (0, 500], got {text!r}")
    return vals


def maxload_markdown(summary: dict[str, Any], specs: Sequence[str]) -> str:
    lines = ["# maxload (PARTIES Sec. 5 protocol)", ""]
    p = summary["protocol"]
    lines.append(
        f"Loads {p['loads_pct']} % of max load; warm-up {p['warmup_s']:g} s, measured {p['measure_s']:g} s; "
        f"sustained = >= 95% of measured intervals meet every target, in every seed of {p['seeds']}."
    )
    if summary["apps"]:
        apps = summary["instances"]
        lines += ["", f"## Mix {apps}", ""]
        if summary["fixed_loads_pct"]:
            lines.append(f"Fixed loads: {summary['fixed_loads_pct']} (%).")
            lines.append("")
        lines += ["| controller | LC EMU (%) | best point (%) | points run |", "|---|---|---|---|"]
        for s in specs:
            r = summary["results"][s]
            lines.append(f"| {s} | {r['lc_emu'] * 100:.0f} | {r['best_point_pct'] or '-'} | {r['points']} |")
        for s in specs:
            r = summary["results"][s]
            lines += ["", f"### {s}: max sustained load of {apps[-1]} (%)", ""]
            levels = p["loads_pct"]
            if len(apps) == 2:
                lines += [f"| {apps[0]} load | " + " | ".join(str(x) for x in levels) + " |"]
                lines += ["|---|" + "---|" * len(levels)]
                lines += [f"| {apps[1]} max | " + " | ".join(f"{v:g}" for v in r["max_last_load_pct"]) + " |"]
            else:
                lines += [f"| {apps[0]} \\ {apps[1]} | " + " | ".join(str(x) for x in levels) + " |"]
                lines += ["|---|" + "---|" * len(levels)]
                for lv, row in zip(levels, r["max_last_load_pct"]):
                    lines += [f"| {lv} | " + " | ".join(f"{v:g}" for v in row) + " |"]
    if summary["mixes"]:
        lines += ["", "## LC EMU by mix size (Fig. 7)", "", "| controller | size | n | min | mean | max |"]
        lines += ["|---|---|---|---|---|---|"]
        for s in specs:
            for k in sorted({m["size"] for m in summary["mixes"]}):
                xs = [m["lc_emu"] * 100 for m in summary["mixes"] if m["controller"] == s and m["size"] == k]
                lines.append(f"| {s} | {k} | {len(xs)} | {min(xs):.0f} | {np.mean(xs):.0f} | {max(xs):.0f} |")
    return "\n".join(lines) + "\n"


def plot_maxload(summary: dict[str, Any], specs: Sequence[str], path: Path) -> None:
    """2 apps: Fig. 5 (max load of app 2 vs load of app 1, a line per controller). 3+ apps: Fig. 6/8
    heatmaps, one panel per controller on one colour scale (0..100%)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = summary["instances"]
    levels = summary["protocol"]["loads_pct"]
    if len(apps) == 2:
        fig, ax = plt.subplots(figsize=(5, 4))
        for s in specs:
            r = summary["results"][s]
            ax.plot(
                levels, r["max_last_load_pct"], marker="o", label=f"{s} (LC EMU {r['lc_emu'] * 100:.0f}%)"
            )
        ax.set_xlabel(f"{apps[0]} load (% of max)")
        ax.set_ylabel(f"max {apps[1]} load sustained (%)")
        ax.set_ylim(-5, max(105, max(levels) + 5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"{apps[0]} + {apps[1]} (PARTIES Fig. 5)")
    else:
        fig, axes = plt.subplots(1, len(specs), figsize=(4.2 * len(specs) + 1, 4.2), squeeze=False)
        im = None
        vmax = max(100, max(levels))
        for ax, s in zip(axes[0], specs):
            r = summary["results"][s]
            grid = np.array(r["max_last_load_pct"], dtype=float)
            im = ax.imshow(grid, origin="lower", cmap="RdYlGn", vmin=0, vmax=vmax, aspect="auto")
            for (i, j), v in np.ndenumerate(grid):
                ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(levels)), [str(x) for x in levels], fontsize=7)
            ax.set_yticks(range(len(levels)), [str(x) for x in levels], fontsize=7)
            ax.set_xlabel(f"{apps[1]} load (%)")
            ax.set_ylabel(f"{apps[0]} load (%)")
            ax.set_title(f"{s}: LC EMU {r['lc_emu'] * 100:.0f}%", fontsize=9)
        fig.colorbar(im, ax=axes[0].tolist(), label=f"max {apps[-1]} load sustained (%)")
        fixed = summary["fixed_loads_pct"]
        fig.suptitle(
            f"max {apps[-1]} load (PARTIES Fig. 6/8)" + (f"; fixed {fixed}" if fixed else ""), fontsize=9
        )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_violins(mixes: list[dict[str, Any]], specs: Sequence[str], path: Path) -> None:
    """PARTIES Fig. 7: LC EMU by number of apps, a violin per controller, min/mean/max markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({m["size"] for m in mixes})
    fig, ax = plt.subplots(figsize=(1.6 * len(sizes) * max(1, len(specs)) / 2 + 3, 4))
    width = 0.8 / len(specs)
    for j, s in enumerate(specs):
        color = plt.get_cmap("tab10")(j % 10)
        for i, k in enumerate(sizes):
            xs = [m["lc_emu"] * 100 for m in mixes if m["controller"] == s and m["size"] == k]
            pos = i + (j - (len(specs) - 1) / 2) * width
            if len(set(xs)) > 1:
                parts = ax.violinplot([xs], positions=[pos], widths=width * 0.9, showextrema=False)
                for b in parts["bodies"]:
                    b.set_facecolor(color)
                    b.set_alpha(0.5)
            ax.scatter(
                [pos] * 3, [min(xs), float(np.mean(xs)), max(xs)], color="red", marker="_", s=80, zorder=3
            )
        ax.plot([], [], color=color, lw=6, alpha=0.5, label=s)
    ax.set_xticks(range(len(sizes)), [f"{k} apps" for k in sizes])
    ax.set_ylabel("LC EMU (%)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("EMU by mix size (PARTIES Fig. 7); red: min, mean, max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ======================================================================================================
# demo
# ======================================================================================================
