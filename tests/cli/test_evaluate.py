"""evaluate.py smoke runs on tiny scenarios and grids, and its handling of bad input (exit 2, no
output directory left behind)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import evaluate  # the CLI module: the repository root is on pytest's pythonpath (pyproject.toml)
from harness import compare, maxload

ROOT = Path(__file__).resolve().parents[2]

ROW_KEYS = {
    "controller",
    "seed",
    "qos_guarantee",
    "mean_tardiness",
    "lc_emu",
    "emu",
    "be_throughput",
    "convergence_s",
    "violations",
    "decide_ms_p50",
    "decide_ms_p99",
}


def write_scenario(tmp_path: Path, **over) -> Path:
    data = {
        "name": "tiny",
        "description": "two apps, 6 s",
        "platform": "parties",
        "duration_s": 6,
        "warmup_s": 2,
        "seed": 5,
        "apps": [{"app": "memcached", "load": 0.2}, {"app": "nginx", "load": 0.2}],
        "be": ["be_parties"],
    }
    data.update(over)
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def leftovers(parent: Path, name: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(name) or p.name.startswith(f".{name}")]


def test_search_table_reports_samples_to_qos_of_every_search():
    """The search-cost table (CLITE's measure): per controller reporting searches, the searches
    that found a QoS-meeting sample and the samples to the first (median, most); controllers that
    report none are left out, and with none at all there is no table."""

    def row(controller, firsts):
        searches = [{"samples": 9, "first_qos_sample": f} for f in firsts]
        return {"controller": controller, "controller_stats": {"searches": searches}}

    results = [
        row("bo", [2, None]),
        row("bo", [5]),
        row("bo:other.yaml", [None]),
        {"controller": "static"},
        {"controller": "parties", "controller_stats": {}},
    ]
    table = compare.search_table(results, ["static", "bo", "bo:other.yaml", "parties"])
    assert table is not None
    lines = table.splitlines()
    assert lines[2:] == ["| bo | 2 of 3 | 3.5 | 5 |", "| bo:other.yaml | 0 of 1 | - | - |"]
    assert compare.search_table(results[3:], ["static", "parties"]) is None


def test_compare_writes_summary_table_config_and_records(tmp_path, capsys):
    scn = write_scenario(tmp_path)
    out = tmp_path / "cmp"
    rc = evaluate.main(
        [
            "compare",
            "--scenario",
            str(scn),
            "--controllers",
            "unmanaged,static",
            "--seeds",
            "2",
            "--out",
            str(out),
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == "tiny"
    rows = summary["results"]
    assert [(r["controller"], r["seed"]) for r in rows] == [
        ("unmanaged", 5),
        ("unmanaged", 6),
        ("static", 5),
        ("static", 6),
    ]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert all(r["lc_emu"] in (0.0, pytest.approx(0.4)) for r in rows)  # constant load: aggregate or 0
    md = (out / "summary.md").read_text()
    assert "| unmanaged | 2 |" in md and "| static | 2 |" in md and "±" in md
    assert "| unmanaged | 2 |" in capsys.readouterr().out
    # resources held: the static controller keeps its allocation, so the mean is the one it applied
    held = {r["seed"]: r["mean_allocation"] for r in rows if r["controller"] == "static"}
    first = json.loads((out / "runs" / "static-seed5.jsonl").read_text().splitlines()[-1])
    for a in first["alloc"]:
        assert held[5][a["name"]]["cores"] == pytest.approx(a["cores"])
        assert held[5][a["name"]]["llc_ways"] == pytest.approx(a["llc_ways"])
    assert set(held[5]) == {"memcached", "nginx", "be_parties"}
    mc = held[5]["memcached"]
    cell = f"{mc['cores']:.2f} / {mc['llc_ways']:.1f} / {mc['freq_mhz'] / 1000:.2f}"
    assert "| memcached | " in md and cell in md.split("Resources held")[1]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["scenario"]["name"] == "tiny" and cfg["seeds"] == [5, 6] and cfg["guards"]["clamp"] is True
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == [
        "static-seed5.jsonl",
        "static-seed6.jsonl",
        "unmanaged-seed5.jsonl",
        "unmanaged-seed6.jsonl",
    ]
    lines = (out / "runs" / "static-seed5.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[-1])["time_s"] == pytest.approx(6.0)
    assert (out / "compare.png").stat().st_size > 0
    assert leftovers(tmp_path, "cmp") == [out]


def test_parallel_results_equal_serial(tmp_path):
    scn = write_scenario(tmp_path, duration_s=4)

    def results(workers, name):
        out = tmp_path / name
        args = ["compare", "--scenario", str(scn), "--controllers", "unmanaged,static", "--seeds", "2"]
        assert evaluate.main([*args, "--out", str(out), "--workers", str(workers)]) == 0
        rows = json.loads((out / "summary.json").read_text())["results"]
        return [{k: v for k, v in r.items() if not k.startswith("decide_ms")} for r in rows]

    assert results(2, "par") == results(1, "ser")


def test_timeline_plots_and_records_every_tick(tmp_path):
    scn = write_scenario(
        tmp_path,
        apps=[
            {"app": "memcached", "load": {"kind": "step", "steps": [[0, 0.1], [3, 0.4]]}},
            {"app": "nginx", "load": 0.2},
        ],
    )
    out = tmp_path / "tl"
    rc = evaluate.main(
        [
            "timeline",
            "--scenario",
            str(scn),
            "--controllers",
            "static,unmanaged",
            "--out",
            str(out),
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    assert (out / "timeline.png").stat().st_size > 0
    assert len((out / "runs" / "unmanaged.jsonl").read_text().splitlines()) == 12
    rows = json.loads((out / "summary.json").read_text())["results"]
    assert [r["controller"] for r in rows] == ["static", "unmanaged"] and rows[0]["lc_emu"] is None


MAXLOAD_FAST = ["--warmup-s", "1", "--measure-s", "2", "--workers", "1"]


def test_maxload_two_apps_fig5_curve(tmp_path):
    out = tmp_path / "ml2"
    rc = evaluate.main(
        [
            "maxload",
            "--apps",
            "memcached,nginx",
            "--controllers",
            "static",
            "--loads",
            "10,40,70",
            "--out",
            str(out),
            *MAXLOAD_FAST,
        ]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    r = s["results"]["static"]
    curve = r["max_last_load_pct"]
    assert len(curve) == 3 and all(v in (0, 10, 40, 70) for v in curve)
    best = max((a + m for a, m in zip((10, 40, 70), curve) if m > 0), default=0)
    assert r["lc_emu"] == pytest.approx(best / 100)
    assert (out / "maxload.png").stat().st_size > 0 and "LC EMU" in (out / "summary.md").read_text()


def test_maxload_page_cache_warm_keeps_mongodb_cache_outside_the_fair_limit(tmp_path):
    """--page-cache warm: the points start as services that ran before the manager (model step 4).
    Under PARTIES' fair start MongoDB's limit is 60 GB; started cold that caps its load beside
    Memcached at 10%, started warm its cache keeps the rest of the node and it reaches 100%."""
    best = {}
    for start in ("cold", "warm"):
        out = tmp_path / start
        args = ["maxload", "--apps", "memcached,mongodb", "--controllers", "static", "--loads", "10,60,100"]
        assert evaluate.main([*args, "--page-cache", start, "--out", str(out), *MAXLOAD_FAST]) == 0
        s = json.loads((out / "summary.json").read_text())
        assert s["protocol"]["page_cache"] == start
        best[start] = s["results"]["static"]["max_last_load_pct"][0]
    assert best["cold"] < 100.0 and best["warm"] == 100.0


def test_maxload_heatmap_for_three_apps_and_mixes(tmp_path):
    out = tmp_path / "ml3"
    rc = evaluate.main(
        [
            "maxload",
            "--apps",
            "memcached,mongodb,nginx",
            "--controllers",
            "static,unmanaged",
            "--loads",
            "10,50",
            "--mixes",
            "1",
            "--mix-sizes",
            "2,4",
            "--out",
            str(out),
            *MAXLOAD_FAST,
        ]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    grid = s["results"]["static"]["max_last_load_pct"]
    assert len(grid) == 2 and all(len(row) == 2 for row in grid)
    assert all(v in (0, 10, 50) for row in grid for v in row)
    cells = [(a, b) for a in (10, 50) for b in (10, 50)]
    best = max((a + b + m for (a, b), m in zip(cells, [v for row in grid for v in row]) if m > 0), default=0)
    assert s["results"]["static"]["lc_emu"] == pytest.approx(best / 100)
    mixes = s["mixes"]
    assert sorted((m["controller"], m["size"]) for m in mixes) == [
        ("static", 2),
        ("static", 4),
        ("unmanaged", 2),
        ("unmanaged", 4),
    ]
    assert {m["search"] for m in mixes if m["size"] == 4} == {"greedy"} and {
        m["search"] for m in mixes if m["size"] == 2
    } == {"grid"}
    assert (out / "maxload.png").exists() and (out / "emu_by_mix_size.png").exists()


def test_max_level_binary_search_and_greedy_search_on_a_known_oracle():
    levels = list(range(10, 101, 10))
    calls = []

    def ok(i):
        calls.append(i)
        return levels[i] <= 60

    assert maxload.max_level(ok, len(levels)) == 5 and len(calls) <= 4
    assert maxload.max_level(lambda i: False, 10) == -1
    assert maxload.max_level(lambda i: True, 10, hi=3) == 2


def test_greedy_search_with_a_fake_point_oracle(monkeypatch):
    # sustained iff the aggregate load is at most 150%, nobody above 60%
    def fake(spec, apps, loads, proto):
        return sum(loads) <= 150 and max(loads) <= 60

    monkeypatch.setattr(maxload, "point_sustained", fake)
    proto = maxload.MaxLoadProtocol()
    emu, pt, points = maxload.greedy_search("static", ["memcached", "xapian", "nginx", "moses"], proto)
    # equal load: 30% each (120%); then round-robin +10%: 40,40,40,30 = 150%
    assert emu == pytest.approx(1.5) and pt == {
        "memcached": 40.0,
        "xapian": 40.0,
        "nginx": 40.0,
        "moses": 30.0,
    }
    # 4 points for the equal-load binary search (50, 20, 30, 40 each), 3 new raises in round 1 and 3
    # in round 2 (moses to 40% is the all-40% point of the binary search: memoised)
    assert points == 10
    emu, pt, _, _ = maxload.serial_grid("static", ["memcached", "xapian", "nginx"], proto, [])
    assert emu == pytest.approx(1.5)
    # duplicate apps get distinct instance names
    assert maxload.instance_names(["mongodb", "nginx", "mongodb"]) == ["mongodb", "nginx", "mongodb-2"]


# ---- bad input ---------------------------------------------------------------------------------------
def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), *args], capture_output=True, text=True, cwd=cwd
    )


def test_unknown_controller_exits_2_with_a_hint_and_no_output(tmp_path):
    out = tmp_path / "deep" / "out"
    p = run_cli("compare", "--scenario", "mix3-const", "--controllers", "static,statik", "--out", str(out))
    assert p.returncode == 2
    assert "unknown controller 'statik'" in p.stderr and "did you mean 'static'" in p.stderr
    assert not (tmp_path / "deep").exists()


def test_scenario_with_an_unknown_app_exits_2(tmp_path, capsys):
    scn = write_scenario(tmp_path, apps=[{"app": "memcahced", "load": 0.2}])
    out = tmp_path / "o"
    assert (
        evaluate.main(["compare", "--scenario", str(scn), "--controllers", "static", "--out", str(out)]) == 2
    )
    assert "unknown app 'memcahced'" in capsys.readouterr().err
    assert leftovers(tmp_path, "o") == []


def test_trace_file_with_bad_rows_exits_2_and_leaves_nothing(tmp_path, capsys):
    csv = tmp_path / "trace.csv"
    csv.write_text("t_s,load\n0,0.2\n5,lots\n")
    scn = write_scenario(tmp_path, apps=[{"app": "memcached", "load": {"kind": "csv", "path": str(csv)}}])
    out = tmp_path / "new" / "o"
    assert (
        evaluate.main(["timeline", "--scenario", str(scn), "--controllers", "static", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert "trace.csv:3: not numbers" in err
    assert not (tmp_path / "new").exists()


def test_bad_maxload_input_exits_2(tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        evaluate.main(["maxload", "--apps", "memcached,ngnix", "--controllers", "static", "--out", str(out)])
        == 2
    )
    assert "did you mean 'nginx'" in capsys.readouterr().err
    assert evaluate.main(["maxload", "--controllers", "static", "--out", str(out)]) == 2
    args = [
        "maxload",
        "--apps",
        "memcached,xapian,moses,nginx",
        "--fixed-loads",
        "10,20",
        "--controllers",
        "static",
    ]
    assert evaluate.main([*args, "--out", str(out)]) == 2
    assert "--fixed-loads" in capsys.readouterr().err
    assert leftovers(tmp_path, "m") == []


def test_existing_output_is_kept_unless_overwrite(tmp_path, capsys):
    scn = write_scenario(tmp_path, duration_s=3, warmup_s=1)
    out = tmp_path / "res"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = [
        "compare",
        "--scenario",
        str(scn),
        "--controllers",
        "static",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--workers",
        "1",
    ]
    assert evaluate.main(args) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert evaluate.main([*args, "--overwrite"]) == 0
    assert not (out / "keep.txt").exists() and (out / "summary.json").exists()
    assert leftovers(tmp_path, "res") == [out]


def test_a_failure_during_the_runs_removes_the_staging_directory(tmp_path, monkeypatch):
    scn = write_scenario(tmp_path, duration_s=3, warmup_s=1)

    def boom(job):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(compare, "run_summary", boom)
    out = tmp_path / "x" / "y"
    with pytest.raises(RuntimeError):
        evaluate.main(
            [
                "compare",
                "--scenario",
                str(scn),
                "--controllers",
                "static",
                "--out",
                str(out),
                "--workers",
                "1",
            ]
        )
    assert not (tmp_path / "x").exists()


def test_help_lists_subcommands_and_controllers(capsys):
    p = run_cli("--help")
    assert p.returncode == 0
    for word in ("compare", "maxload", "timeline", "calibrate", "bench", "unmanaged", "static"):
        assert word in p.stdout
    for sub in ("compare", "maxload", "timeline"):
        with pytest.raises(SystemExit) as e:
            evaluate.main([sub, "--help"])
        assert e.value.code == 0 and "--out" in capsys.readouterr().out


def test_guards_file_is_used_and_saved_and_a_bad_one_exits_2(tmp_path, capsys):
    scn = write_scenario(tmp_path, duration_s=2, warmup_s=1)
    good = tmp_path / "guards.yaml"
    good.write_text("rate_limit: {max_core_decrease: 2}\nlc_floor: {min_cores: 2}\n")
    out = tmp_path / "g"
    args = ["compare", "--scenario", str(scn), "--controllers", "unmanaged", "--seeds", "1", "--workers", "1"]
    assert evaluate.main([*args, "--out", str(out), "--guards", str(good)]) == 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["guards"]["rate_limit"]["max_core_decrease"] == 2.0 and cfg["guards"]["cooldown"] is None
    # unmanaged regroups every app at its first decision: the rate limiter holds that, as documented
    first = json.loads((out / "runs" / "unmanaged-seed5.jsonl").read_text().splitlines()[0])
    assert (
        any(g.startswith("rate_limit: regrouping") for g in first["guards"])
        and not first["decision"]["changed"]
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("rate_limit: {max_cores: 2}\n")
    assert evaluate.main([*args, "--out", str(tmp_path / "b"), "--guards", str(bad)]) == 2
    assert "max_cores: unknown key" in capsys.readouterr().err and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs" / "scenarios").glob("**/*.yaml")), ids=lambda p: p.stem
)
def test_shipped_scenarios_load_and_run(path, monkeypatch):
    import numpy as np

    from baselines.simple import StaticController
    from env.loop import run_episode
    from env.sim.node import SimNode
    from env.sim.scenario import load_scenario

    monkeypatch.chdir("/")  # the CSV replay example names its trace relative to its own file
    scn = load_scenario(path)
    assert scn.name == path.stem and scn.description
    recs = run_episode(SimNode(scn), StaticController(), 2.0, rng=np.random.default_rng(0))
    assert [a.name for a in recs[-1].apps] == list(scn.app_names)


@pytest.mark.parametrize(
    "args",
    [
        ["timeline", "--scenario", "mix3-const", "--seed", "-3"],
        ["calibrate", "--seed", "-3"],
        ["maxload", "--apps", "memcached,xapian", "--measure-s", "nan"],
        ["maxload", "--apps", "memcached,xapian", "--warmup-s", "inf"],
        ["maxload", "--apps", "memcached,xapian", "--seed", "-3"],
    ],
    ids=["timeline-seed", "calibrate-seed", "measure-nan", "warmup-inf", "maxload-seed"],
)
def test_bad_numbers_on_the_command_line_exit_2(tmp_path, capsys, args):
    extra = [] if args[0] == "calibrate" else ["--controllers", "static"]
    with pytest.raises(SystemExit) as e:
        evaluate.main([*args, *extra, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _worker_pids(pid: int) -> list[int]:
    """The multiprocessing workers among the children of process `pid`."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_the_workers_removes_the_staging_directory_and_exits(tmp_path):
    import os
    import signal
    import time

    scn = write_scenario(tmp_path, duration_s=80000, warmup_s=2)
    out = tmp_path / "res"
    argv = ["compare", "--scenario", str(scn), "--controllers", "static,unmanaged", "--seeds", "1"]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "evaluate.py"), *argv, "--workers", "2", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".res.tmp-*/runs/*.jsonl")):  # the workers are writing
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        workers = _worker_pids(proc.pid)
        assert workers
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
        assert rc == 128 + signal.SIGTERM and "terminated (SIGTERM)" in err, err
        assert leftovers(tmp_path, "res") == []
        time.sleep(0.5)
        assert [w for w in workers if _running(w)] == []  # no orphan keeps writing
    finally:
        for w in workers:  # this test's own processes, by pid, in case the assertions failed
            if _running(w):
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("what", ["--scenario", "--guards"])
def test_a_binary_scenario_or_guard_file_exits_2(tmp_path, capsys, what):
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(bytes(range(256)))
    args = {"--scenario": "mix3-const", "--guards": None} | {what: str(blob)}
    argv = [x for k, v in args.items() if v for x in (k, v)]
    rc = evaluate.main(["compare", *argv, "--controllers", "static", "--out", str(tmp_path / "o")])
    assert rc == 2 and "not a text file" in capsys.readouterr().err and not (tmp_path / "o").exists()
