"""hw.profile: the profiler on a synthetic service (tests.fakes.SyntheticBench: the simulator with a
known profile, jittered), its plan, its files and its errors; and (slow, root) a short real profile
of Debian's memcached on this machine. No latency figure of the real machine is asserted."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from env.config import EXIT_BAD_INPUT, ConfigError
from env.sim.engine import reference_knee
from env.sim.platform import load_platform
from env.sim.profiles import LcProfile, Reference, load_profile
from hw import profile as P
from tests.fakes import SyntheticBench

FAST = ["--measure-s", "2", "--settle-s", "0", "--passes", "1"]


def true_service() -> tuple[LcProfile, object]:
    """The synthetic service: a memcached-like app on the 2-core VM in quota mode, with a node whose
    quota strands 1 ms per further CPU."""
    platform = dataclasses.replace(load_platform("vm2"), core_mode="quota", cfs_stranded_ms=1.0)
    prof = LcProfile(
        name="synthetic", description="synthetic", qos_target_us=3000.0, max_load_rps=60_000.0, threads=2,
        queue="per_thread", frac_llc=0.0, frac_mem=0.0, smt_speed=1.0, base_latency_us=250.0,
        llc_kappa_mb=1.0, llc_miss_min=0.0, llc_accesses_per_req=0.0, dram_bytes_per_req=0.0,
        dataset_gb=0.01, zipf=0.9, pages_per_req=0.0, io_kb=4.0, net_bytes_per_req=0.0,
        threads_follow_cores=False, service_cv2=3.0, service_det=0.3, reference=Reference("vm2", 2),
    )  # fmt: skip
    return prof, platform


@pytest.fixture
def configs(tmp_path):
    d = tmp_path / "configs"
    (d / "apps").mkdir(parents=True)
    (d / "node").mkdir()
    return d


def run_fake(configs: Path, out: Path, *extra: str, bench: SyntheticBench | None = None) -> tuple[int, list]:
    """`python -m hw.profile` on the synthetic service; returns (exit status, the benches made)."""
    made: list[SyntheticBench] = []
    prof, platform = true_service()

    def factory(name, info):
        made.append(bench or SyntheticBench(prof, platform))
        return made[-1]

    argv = ["--name", "syn", "--out", str(out), "--configs", str(configs), "--pid", "1"]
    argv += ["--target", "memcached://127.0.0.1:11211", "--threads", "2", *FAST, *extra]
    try:
        rc = P.run(argv, bench_factory=factory)
    except ConfigError:
        rc = EXIT_BAD_INPUT
    return rc, made


def test_the_profiler_recovers_a_synthetic_service_and_writes_files_the_simulator_loads(tmp_path, configs):
    out = tmp_path / "report"
    rc, made = run_fake(configs, out)
    assert rc == 0 and made[0].closed
    data = json.loads((out / "profile.json").read_text())
    assert {"profile.json", "report.md", "profile.png"} <= {p.name for p in out.iterdir()}
    held = data["summary"]["heldout"]
    assert held["points"] >= 3 and held["median"] < 0.10  # 5% jitter: the fit finds the service again
    # the files load, as the simulator will load them, and carry the fitted values
    prof = load_profile(configs / "apps" / "syn.yaml")
    platform = load_platform(configs / "node" / "syn.yaml")
    assert isinstance(prof, LcProfile) and load_platform(prof.reference.platform) == platform
    assert (
        platform.core_mode == "quota" and platform.knobs == ("core",) and "cfs_stranded_ms" in platform.fitted
    )
    assert set(P.FITTED_APP) <= set(prof.fitted) and P.MARKER in prof.source
    truth, truth_pl = true_service()
    svc, svc_true = reference_knee(prof, platform)[0], reference_knee(truth, truth_pl)[0]
    assert svc == pytest.approx(svc_true, rel=0.2)  # its service time (the knee: its target is its own)
    # every point's simulation is what the written files give
    rows = [r for r in data["points"] if r["role"] == "heldout"]
    from env.sim.fit import MeasuredPoint, simulate_points

    sim = simulate_points(
        prof, platform, [MeasuredPoint(r["rate_rps"], r["quota_cores"], r["p99_us"]) for r in rows]
    )
    assert np.allclose(sim, [r["sim_p99_us"] for r in rows], rtol=1e-9)


def test_points_where_the_generator_fell_behind_are_left_out_of_the_fit_and_reported(tmp_path, configs):
    prof, platform = true_service()
    bench = SyntheticBench(prof, platform, generator_max_rps=10_000.0)
    out = tmp_path / "report"
    assert run_fake(configs, out, bench=bench)[0] == 0
    data = json.loads((out / "profile.json").read_text())
    bound = [r for r in data["points"] if r["generator_bound"]]
    assert bound and all(r["rate_rps"] > 10_000.0 for r in bound)
    assert all(not r["generator_bound"] for r in data["points"] if r["rate_rps"] <= 10_000.0)
    # the lagging points would cost the fit its accuracy: left out, it finds the service again
    assert data["summary"]["heldout"]["median"] < 0.10
    assert data["summary"]["fit"]["points"] + data["summary"]["heldout"]["points"] == len(
        data["points"]
    ) - len(bound)
    assert "Generator-bound, left out of the fit" in (out / "report.md").read_text()
    # and a refit from the measurements keeps them out
    refit = tmp_path / "refit"
    args = ["--from-measurements", str(out / "profile.json"), "--name", "syn", "--out", str(refit)]
    rc = P.run([*args, "--configs", str(configs), "--overwrite"])
    assert rc == 0
    again = json.loads((refit / "profile.json").read_text())
    assert [r["generator_bound"] for r in again["points"]] == [r["generator_bound"] for r in data["points"]]


@pytest.mark.parametrize("loadavg, busy", [(0.6, False), (1.0, False), (1.1, True), (6.0, True)])
def test_a_busy_node_is_warned_about_before_measuring_and_in_the_report(
    tmp_path, configs, monkeypatch, capsys, loadavg, busy
):
    """Other work spreads the p99s (README: memcached's held-out error 36% at a load average of 4-8,
    15% on a quiet node): above half a load per CPU (2 CPUs here) the run says so, and the report."""
    monkeypatch.setattr(P.os, "getloadavg", lambda: (loadavg, loadavg, loadavg))
    monkeypatch.setattr(P.os, "cpu_count", lambda: 2)
    out = tmp_path / "report"
    assert run_fake(configs, out)[0] == 0
    printed, report = capsys.readouterr().err, (out / "report.md").read_text()
    assert f"load average {loadavg:.2f} before measuring" in report
    assert ("warning: load average" in printed) is busy
    assert ("**Busy: load average" in report) is busy
    assert (P.busy_warning(loadavg, 2) is not None) is busy


def test_the_plan_holds_out_rates_and_quotas_the_fit_never_sees_and_skips_overload():
    probe = P.Probe(cores=2.0, rate_rps=200.0, cpu_s_per_request=1e-3, p99_us=5000.0, memory_gb=0.01)
    cfg = P.PlanConfig(be_threads=2)
    points, skipped = P.plan_points(cfg, probe)
    fit = [p for p in points if p.role == "fit"]
    held = [p for p in points if p.role == "heldout"]
    assert {p.rate_rps for p in fit}.isdisjoint({p.rate_rps for p in held})
    alone = [p for p in points if not p.be_threads]
    assert {p.quota_cores for p in alone if p.role == "fit"}.isdisjoint(
        {p.quota_cores for p in alone if p.role == "heldout"}
    )
    assert all(p.rate_rps * 1e-3 <= cfg.max_quota_load * p.quota_cores for p in alone)
    assert skipped  # the light quotas cannot serve the heavy rates
    with_be = [p for p in points if p.be_threads]
    assert with_be and all(p.be_threads == 2 for p in with_be)
    assert all(
        p.be_quota_cores == pytest.approx(2.0 - p.quota_cores) or p.quota_cores == 2.0 for p in with_be
    )
    runs = P.schedule(points, passes=2, seed=0)
    assert sorted(p.key for r in runs for p in r) == sorted(2 * [p.key for p in points])
    assert all(len({p.rate_rps for p in r}) == 1 for r in runs)  # one generator per run
    assert runs == P.schedule(points, passes=2, seed=0)


def test_a_node_file_gets_the_kernels_resume_wait_unless_its_platform_gives_one():
    """A co-runner resuming from CFS throttling holds a CPU for about Linux's default slice, 0.75 ms
    x (1 + log2 min(CPUs, 8)): a node file starts from half of it (the mean wait of a request that
    arrives meanwhile, `env.sim.model` step 1) unless the platform it starts from gives its own."""
    assert [P.linux_base_slice_ms(n) for n in (1, 2, 4, 8, 64)] == [0.75, 1.5, 2.25, 3.0, 3.0]
    bare = dataclasses.replace(load_platform("vm2"), cfs_resume_wait_ms=0.0)
    assert P.base_platform(bare, "x", 2.0, ("core",), 0.25, 100.0).cfs_resume_wait_ms == 0.75
    given = dataclasses.replace(bare, cfs_resume_wait_ms=2.0)
    assert P.base_platform(given, "x", 2.0, ("core",), 0.25, 100.0).cfs_resume_wait_ms == 2.0


def test_a_refit_from_the_measurements_reproduces_the_files(tmp_path, configs):
    out = tmp_path / "report"
    assert run_fake(configs, out)[0] == 0
    files = (configs / "apps" / "syn.yaml", configs / "node" / "syn.yaml")
    first = [_data_lines(p) for p in files]
    rc, made = run_fake(
        configs, tmp_path / "refit", "--from-measurements", str(out / "profile.json"), "--overwrite"
    )
    assert rc == 0 and not made  # nothing measured
    assert [_data_lines(p) for p in files] == first  # the same seed and data: the same fit


def test_a_refit_reads_an_earlier_runs_plan_and_refuses_a_broken_file(tmp_path, configs):
    """An earlier version's plan (rates as a list of load fractions) is read as its range; a file
    that is not a profile.json of this tool exits 2 with nothing written."""
    out = tmp_path / "report"
    assert run_fake(configs, out)[0] == 0
    data = json.loads((out / "profile.json").read_text())
    lo, hi = data["plan"].pop("load_range")
    data["plan"].pop("n_rates")
    data["plan"]["load_fracs"] = [lo, (lo + hi) / 2, hi]
    for x in data["measurements"]:
        del x["background_cores"]  # not measured then: "n/a", not 0
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert run_fake(configs, tmp_path / "refit", "--from-measurements", str(old), "--overwrite")[0] == 0
    refit = json.loads((tmp_path / "refit" / "profile.json").read_text())
    assert refit["plan"]["load_range"] == [lo, hi] and refit["plan"]["n_rates"] == 3
    assert (
        "| 0.00 |" in (out / "report.md").read_text()
        and "| 0.00 |" not in (tmp_path / "refit" / "report.md").read_text()
    )
    assert "| n/a |" in (tmp_path / "refit" / "report.md").read_text()
    before = [p.read_text() for p in (configs / "apps" / "syn.yaml", configs / "node" / "syn.yaml")]
    for broken in (
        {**data, "plan": {**data["plan"], "passes": 0}},
        {**data, "service": {"threads": 2}},
        "[]",
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(broken if isinstance(broken, str) else json.dumps(broken))
        rc, _ = run_fake(configs, tmp_path / "bad", "--from-measurements", str(bad), "--overwrite")
        assert rc == EXIT_BAD_INPUT and not (tmp_path / "bad").exists()
        assert [
            p.read_text() for p in (configs / "apps" / "syn.yaml", configs / "node" / "syn.yaml")
        ] == before


def _data_lines(path: Path) -> list[str]:
    """The YAML without its comments (they name the report directory)."""
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


@pytest.mark.parametrize(
    "extra, why",
    [
        (["--budget", "0.5"], "a budget one pass of the plan does not fit"),
        (["--platform", "parties"], "a platform of another machine (14 cores)"),
        (["--platform", "nowhere"], "an unknown platform"),
        (["--load-cmd", "true {rate} {feed}"], "both --target and --load-cmd"),
        (["--quotas", "0.125,2"], "a quota finer than a hundredth of a core"),
        (["--knobs", "core,turbo"], "an unknown knob"),
        (["--load-range", "0.9,1.0", "--quotas", "0.1,0.2"], "every point overloaded"),
        (["--load-range", "0.5"], "a load range of one number"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, configs, extra, why):
    out = tmp_path / "report"
    rc, made = run_fake(configs, out, *extra)
    assert rc == EXIT_BAD_INPUT, why
    assert (
        not out.exists() and not list((configs / "apps").iterdir()) and not list((configs / "node").iterdir())
    )
    assert all(b.closed and len(b.measured) <= 2 for b in made)  # at most the probe (the plan needs it)


def test_files_it_did_not_write_are_never_replaced(tmp_path, configs):
    shipped = configs / "apps" / "syn.yaml"
    shipped.write_text("kind: lc\nname: syn\n")  # a hand-written profile
    rc, made = run_fake(configs, tmp_path / "report", "--overwrite")
    assert rc == EXIT_BAD_INPUT and not made and shipped.read_text() == "kind: lc\nname: syn\n"
    shipped.unlink()
    assert run_fake(configs, tmp_path / "report")[0] == 0
    rc, _ = run_fake(configs, tmp_path / "again")
    assert rc == EXIT_BAD_INPUT  # its own files too, unless --overwrite
    assert run_fake(configs, tmp_path / "report", "--overwrite")[0] == 0
    for name in ("../x", "a/b", ""):
        assert run_fake(configs, tmp_path / "r2", "--name", name)[0] == EXIT_BAD_INPUT


def test_overwrite_never_replaces_the_working_directory(tmp_path, configs, monkeypatch):
    here = tmp_path / "work"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    rc, made = run_fake(configs, Path("."), "--overwrite")
    assert rc == EXIT_BAD_INPUT and not made  # refused before any measurement
    assert (here / "notes.txt").read_text() == "mine"


def test_a_service_that_dies_mid_run_exits_1_restores_the_node_and_writes_nothing(tmp_path, configs):
    prof, platform = true_service()
    bench = SyntheticBench(prof, platform, fail_after=5)
    out = tmp_path / "report"
    rc, made = run_fake(configs, out, bench=bench)
    assert rc == 1 and made[0].closed
    assert (
        not out.exists() and not list((configs / "apps").iterdir()) and not list((configs / "node").iterdir())
    )


def test_help_explains_the_plan_the_outputs_and_the_exit_status(capsys):
    with pytest.raises(SystemExit) as e:
        P.build_parser().parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for words in ("configs/apps/NAME.yaml", "held out", "--budget", "--load-cmd", "Exit status", "{rate}"):
        assert words in text, words


# ---- this machine ----------------------------------------------------------------------------------
def _real_node() -> bool:
    return os.geteuid() == 0 and Path("/sys/fs/cgroup/cpu").is_dir() and bool(shutil.which("memcached"))


@pytest.mark.linux
@pytest.mark.slow
@pytest.mark.skipif(not _real_node(), reason="needs root, cgroup v1 cpu and Debian's memcached")
def test_a_short_real_profile_of_memcached(tmp_path, configs, capsys):
    """About 90 s: one pass of a small plan. The mechanics are asserted (the files load, every
    point was measured and simulated, the cgroups are gone, memcached stopped), not the latencies.

    A node whose vCPUs are stolen or busy delays even the SCHED_FIFO generator by milliseconds; the
    profiler then refuses to fit generator-bound points and exits 1 with its measurements kept. That
    refusal is a correct outcome, not this test's failure: its mechanics are asserted (nothing written,
    the measurements kept and every fitted point flagged, the node restored), the run is tried once
    more, and a second refusal skips the test with the generator's lag quoted."""
    memcached_before = _memcached_pids()
    cgroups_before = _profile_cgroups()  # an earlier run killed outright may have left its own
    out = tmp_path / "report"
    argv = [
        "--service", "memcached", "--name", "mc-test", "--out", str(out), "--configs", str(configs),
        "--n-rates", "5", "--quotas", "0.1,0.15,0.25,0.4,0.7,2",
        "--passes", "1", "--measure-s", "2", "--settle-s", "1",
    ]  # fmt: skip
    refusals = []
    for _attempt in range(2):
        rc = P.run(argv)
        assert _profile_cgroups() <= cgroups_before  # its own cgroups are gone
        assert _memcached_pids() <= memcached_before  # the one it started is stopped
        if rc == 0:
            break
        refusals.append(_generator_bound_refusal(capsys.readouterr().err, out, configs))
    else:
        pytest.skip(f"this node was too busy to measure, twice: {refusals}")
    data = json.loads((out / "profile.json").read_text())
    prof = load_profile(configs / "apps" / "mc-test.yaml")
    assert isinstance(prof, LcProfile) and prof.threads == 2
    assert load_platform(prof.reference.platform).core_mode == "quota"
    for role in ("fit", "heldout"):
        rows = [r for r in data["points"] if r["role"] == role]
        assert len(rows) >= 3 and all(r["intervals"] >= 2 for r in rows), role
        assert all(np.isfinite(r["p99_us"]) and np.isfinite(r["sim_p99_us"]) for r in rows)
    print("\n" + (out / "report.md").read_text())


def _generator_bound_refusal(stderr: str, out: Path, configs: Path) -> str:
    """Asserts that a real run exited 1 only because its generator was too late to fit (and wrote
    nothing); returns the generator's lag per fitted point, from the measurements it kept."""
    kept = re.search(r"the measurements are kept in (\S+)", stderr)
    assert kept and "generator-bound): too few to fit" in stderr, stderr
    assert (
        not out.exists() and not list((configs / "apps").iterdir()) and not list((configs / "node").iterdir())
    )
    path = Path(kept.group(1))
    try:
        measured = P.load_measurements(path)[0].measured  # what --from-measurements reads
    finally:
        path.unlink()
    lags = [x.lag_p99_us for x in measured if x.point.role == "fit"]
    return f"generator lag p99 {min(lags):.0f}-{max(lags):.0f} us at the fitted points"


def _profile_cgroups() -> set[str]:
    return {p.name for p in Path("/sys/fs/cgroup/cpu").iterdir() if p.name.startswith("coloc_profile_")}


def _memcached_pids() -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "memcached":
                    out.add(int(d.name))
            except OSError:
                pass
    return out
