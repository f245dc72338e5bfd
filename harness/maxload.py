"""The PARTIES Sec. 5 max-load protocol behind `evaluate.py maxload`: max sustained load heatmaps
(Fig. 5/6/8) and LC EMU by mix size (Fig. 7 violins)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from env import metrics as M
from env.config import ConfigError, plain_data
from env.guards import GuardsConfig
from env.outdir import check_out, staged_output
from env.sim.profiles import load_lc_profile
from env.sim.scenario import PAGE_CACHE_STARTS, Scenario, simple_scenario
from harness.output import pmap, write_config, write_json
from harness.plots import plot_maxload, plot_violins
from harness.registry import parse_specs
from harness.runs import RunJob, execute, lc_app_names, load_guards_arg, probe

DEFAULT_LOADS_PCT = tuple(range(10, 101, 10))  # PARTIES Sec. 5.1: 10% to 100% in 10% steps
MIX_SIZES = (2, 3, 4, 5, 6)


@dataclass(frozen=True)
class MaxLoadProtocol:
    """PARTIES Sec. 5.1: loads 10..100% in 10% steps; 30 s warm-up, 60 s measured; a load point
    is sustained, in every seed, by `verdict` (env.metrics: "window" = every app's p99 over the
    measured window meets its target, "intervals" = >= 95% of the measured intervals meet every
    target)."""

    loads_pct: tuple[float, ...] = DEFAULT_LOADS_PCT  # % of max load; whole numbers kept as int
    warmup_s: float = M.WARMUP_S
    measure_s: float = M.MEASURE_S
    seeds: tuple[int, ...] = (0,)
    platform: str = "parties"
    be: tuple[str, ...] = ("be_parties",)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    verdict: str = "window"
    page_cache: str = "cold"  # Scenario.page_cache: how each point's apps start (env.sim.scenario)


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
    """The scenario of one load point (loads in % of max load): `warmup_s + measure_s` long, the
    protocol's platform and BE jobs (PARTIES Sec. 5.1)."""
    names = instance_names(apps)
    loads = {f"{a}:{n}" if n != a else a: p / 100.0 for a, n, p in zip(apps, names, loads_pct)}
    return simple_scenario(
        loads,
        platform=proto.platform,
        be=proto.be,
        duration_s=proto.warmup_s + proto.measure_s,
        warmup_s=proto.warmup_s,
        seed=seed,
        page_cache=proto.page_cache,
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
            verdict=proto.verdict,
        )
        if not M.sustained(execute(job), proto.warmup_s, proto.measure_s, verdict=proto.verdict):
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
    apps: Sequence[str], fixed_pct: Sequence[float], levels: Sequence[float]
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
) -> tuple[float, dict, int, list[float]]:
    """The full grid for a 2- or 3-app mix in one process, each cell's search bounded by its
    already-searched neighbours (the max load is non-increasing in the other apps' loads)."""
    oracle = PointOracle(spec, apps, proto)
    levels = proto.loads_pct
    n = len(levels)
    pairs: list[tuple[int, ...]] = (
        [(a,) for a in range(n)] if len(apps) == 2 else [(a, b) for a in range(n) for b in range(n)]
    )
    res: dict[tuple[int, ...], int] = {}
    cells, maxes = [], []
    for pair in pairs:
        bound = n
        for d in range(len(pair)):
            if pair[d] > 0:
                prev = tuple(x - 1 if e == d else x for e, x in enumerate(pair))
                bound = min(bound, res[prev] + 1)
        cell = (*(float(levels[x]) for x in pair), *fixed_pct)

        def sustained(k: int, c: tuple[float, ...] = cell) -> bool:
            return oracle([*c, levels[k]])

        i = max_level(sustained, n, bound)
        res[pair] = i
        cells.append(cell)
        maxes.append(float(levels[i]) if i >= 0 else 0.0)
    emu, pt = grid_emu(apps, cells, maxes)
    return emu, pt, oracle.points, maxes


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
    """One worker task: the LC EMU of mix `apps` for controller `spec`, by the full grid or the greedy search."""

    spec: str
    apps: tuple[str, ...]
    proto: MaxLoadProtocol
    search: str  # "grid" | "greedy"


def search_mix(task: MixTask) -> dict[str, Any]:
    """Worker: LC EMU of one mix for one controller."""
    if task.search == "grid":
        fixed = [float(task.proto.loads_pct[0])] * max(0, len(task.apps) - 3)
        emu, pt, runs, _ = serial_grid(task.spec, task.apps, task.proto, fixed)
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


def run_maxload(
    *,
    controllers: str,
    out: Path,
    apps: str | None = None,
    fixed_loads: str = "10",
    loads: str | None = None,
    mixes: int = 0,
    mix_sizes: Sequence[int] = MIX_SIZES,
    mix_search: str = "auto",
    seeds: int = 1,
    seed: int = 0,
    platform: str = "parties",
    be: str = "be_parties",
    warmup_s: float = M.WARMUP_S,
    measure_s: float = M.MEASURE_S,
    verdict: str = "window",
    page_cache: str = "cold",
    guards: str | None = None,
    workers: int = 2,
    overwrite: bool = False,
    argv: Sequence[str] = (),
) -> dict[str, Any]:
    """`evaluate.py maxload` (its --help): the heatmap of `apps` and/or the LC EMU of `mixes`
    sampled mixes per size; everything validated before `out` is created. Text arguments are as
    on the command line (comma-separated lists); bad input is a `ConfigError`."""
    specs = parse_specs(controllers)
    known = lc_app_names()
    app_list = _parse_apps(apps, known) if apps else []
    if not app_list and not mixes:
        raise ConfigError("maxload: give --apps (the heatmap) and/or --mixes N (the Fig. 7 violins)")
    if app_list and len(app_list) < 2:
        raise ConfigError("--apps: need at least 2 apps")
    load_list = parse_pcts(loads, "--loads") if loads else list(DEFAULT_LOADS_PCT)
    if load_list != sorted(set(load_list)):
        raise ConfigError("--loads: must be increasing")
    be_jobs = tuple(b for b in be.split(",") if b and b != "none")
    if verdict not in M.VERDICTS:
        raise ConfigError(f"--verdict: one of {list(M.VERDICTS)}, got {verdict!r}")
    if page_cache not in PAGE_CACHE_STARTS:
        raise ConfigError(f"--page-cache: one of {list(PAGE_CACHE_STARTS)}, got {page_cache!r}")
    proto = MaxLoadProtocol(
        loads_pct=tuple(int(x) if float(x).is_integer() else x for x in load_list),
        warmup_s=warmup_s,
        measure_s=measure_s,
        seeds=tuple(range(seed, seed + seeds)),
        platform=platform,
        be=be_jobs,
        guards=load_guards_arg(guards),
        verdict=verdict,
        page_cache=page_cache,
    )
    fixed: list[float] = []
    if len(app_list) > 2:
        fixed = parse_pcts(fixed_loads, "--fixed-loads")
        if len(fixed) == 1:
            fixed = fixed * (len(app_list) - 3)
        if len(fixed) != len(app_list) - 3:
            raise ConfigError(
                f"--fixed-loads: give one load or {len(app_list) - 3} (for {app_list[2:-1]}), got {len(fixed)}"
            )
    # mixes draw from the apps characterised on this platform (e.g. not memcached_qprm, the Q-PRM
    # node's deployment of memcached, on the PARTIES node)
    native = [a for a in known if load_lc_profile(a).reference.platform == platform] or known
    mix_list = sample_mixes(mixes, mix_sizes, seed, native) if mixes else []
    check_out(Path(out), overwrite)
    probe_apps = app_list or list(mix_list[0])
    probe(
        point_scenario(probe_apps, [load_list[0]] * len(probe_apps), proto, proto.seeds[0]),
        specs,
        proto.seeds[0],
    )

    summary: dict[str, Any] = {
        "kind": "maxload",
        "protocol": plain_data(proto),
        "apps": app_list,
        "instances": instance_names(app_list),
        "fixed_loads_pct": dict(zip(instance_names(app_list)[2:-1], fixed)),
        "units": {"lc_emu": "fraction (1.0 = 100% of one app's max load)", "*_pct": "percent of max load"},
        "results": {},
        "mixes": [],
    }
    with staged_output(Path(out), overwrite) as tmp:
        if app_list:
            cells = grid_cells(app_list, fixed, proto.loads_pct)
            tasks = [CellTask(s, tuple(app_list), c, proto) for s in specs for c in cells]
            found = pmap(search_cell, tasks, workers, "maxload cells")
            for k, s in enumerate(specs):
                part = found[k * len(cells) : (k + 1) * len(cells)]
                maxes = [m for m, _ in part]
                emu, pt = grid_emu(app_list, cells, maxes)
                n = len(proto.loads_pct)
                grid: Any = maxes if len(app_list) == 2 else [maxes[r * n : (r + 1) * n] for r in range(n)]
                summary["results"][s] = {
                    "lc_emu": emu,
                    "best_point_pct": pt,
                    "max_last_load_pct": grid,
                    "points": sum(p for _, p in part),
                }
            plot_maxload(summary, specs, tmp / "maxload.png")
        if mix_list:
            auto = {k: ("grid" if k <= 3 else "greedy") for k in MIX_SIZES}
            mtasks = [
                MixTask(s, m, proto, mix_search if mix_search != "auto" else auto.get(len(m), "greedy"))
                for s in specs
                for m in mix_list
            ]
            summary["mixes"] = pmap(search_mix, mtasks, workers, "maxload mixes")
            plot_violins(summary["mixes"], specs, tmp / "emu_by_mix_size.png")
        write_json(tmp / "summary.json", plain_data(summary))
        (tmp / "summary.md").write_text(maxload_markdown(summary, specs))
        write_config(
            tmp / "config.yaml",
            {
                "command": "maxload",
                "argv": list(argv),
                "protocol": proto,
                "apps": app_list,
                "fixed_loads_pct": fixed,
                "controllers": specs,
                "mixes": [list(m) for m in mix_list],
                "mix_search": mix_search,
                "workers": workers,
            },
        )
    print(maxload_markdown(summary, specs))
    print(f"wrote {out}/")
    return summary


def _parse_apps(text: str, known: Sequence[str]) -> list[str]:
    apps = [a.strip() for a in text.split(",")]
    for a in apps:
        if a not in known:
            hint = difflib.get_close_matches(a, list(known), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"--apps: unknown app {a!r}{extra}; known LC apps: {list(known)}")
    return apps


def parse_pcts(text: str, flag: str) -> list[float]:
    """A comma-separated list of load percentages in (0, 500] given to `flag`; a `ConfigError` otherwise."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated percentages, got {text!r}") from None
    if not vals or any(not (0 < v <= 500) for v in vals):
        raise ConfigError(f"{flag}: loads are percentages of max load in (0, 500], got {text!r}")
    return vals


def maxload_markdown(summary: dict[str, Any], specs: Sequence[str]) -> str:
    """summary.md of `evaluate.py maxload`: the protocol; for a heatmap mix, each controller's LC EMU,
    best point and max-load table (PARTIES Fig. 5/6/8); the LC EMU by mix size (Fig. 7)."""
    lines = ["# maxload (PARTIES Sec. 5 protocol)", ""]
    p = summary["protocol"]
    rule = (
        "every app's p99 over all requests of the measured window meets its target"
        if p["verdict"] == "window"
        else ">= 95% of measured intervals meet every target"
    )
    lines.append(
        f"Loads {p['loads_pct']} % of max load; warm-up {p['warmup_s']:g} s, measured {p['measure_s']:g} s; "
        f"sustained (verdict `{p['verdict']}`) = {rule}, in every seed of {p['seeds']}."
        + (" Page caches start warm (env.sim.scenario)." if p.get("page_cache") == "warm" else "")
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
