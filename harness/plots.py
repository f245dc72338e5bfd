"""The evaluation protocols' plots (matplotlib, Agg backend): compare bars, the PARTIES Fig. 9
timeline, the Fig. 5/6/8 max-load heatmaps and the Fig. 7 LC EMU violins."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from env.loop import TickRecord
from env.sim.scenario import Scenario


def plot_compare(results: list[dict[str, Any]], specs: Sequence[str], path: Path, title: str) -> None:
    """compare.png: QoS guarantee, BE throughput and EMU per controller (mean, standard deviation over seeds)."""
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
        assert im is not None  # one panel per spec; subplots() refuses zero columns
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
                # matplotlib types "bodies" as one Collection; it is a list of PolyCollection
                for b in parts["bodies"]:  # type: ignore[attr-defined]
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


def plot_affordable(summary: dict[str, Any], specs: Sequence[str], path: Path) -> None:
    """affordable.png (CoCo Fig. 2): per controller, the affordable load of every container and of
    all of them together, in % of each container's SL_full (100 = no interference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = list(summary["sl_full"])
    groups = [*apps, "all"]
    width = 0.8 / max(len(specs), 1)
    fig, ax = plt.subplots(figsize=(1.3 * len(groups) + 2, 3.4))
    for k, s in enumerate(specs):
        r = summary["results"][s]
        vals = [r["per_app_pct"][a] for a in apps] + [r["affordable_pct"]]
        ax.bar(np.arange(len(groups)) + (k - (len(specs) - 1) / 2) * width, vals, width, label=s)
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right")
    ax.set_ylabel("affordable load (% of SL_full)")
    ax.set_title(f"Affordable load without SLO violations ({summary['scenario']})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
