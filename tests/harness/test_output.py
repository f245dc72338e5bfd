"""env.outdir, as the harness protocols use it: where --out may be (checked before any work), and what staging removes (only
what it created) when a run fails."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest

from env.config import ConfigError
from env.outdir import check_out, staged_output
from harness import bench as harness_bench
from harness import calibrate as harness_calibrate


def test_out_under_a_file_or_in_proc_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_out(afile / "sub" / "out", overwrite=False)
    with pytest.raises(ConfigError, match="cannot create a directory in /proc"):
        check_out(Path("/proc/coloc-out"), overwrite=False)
    assert afile.read_text() == "mine"


def test_out_on_a_read_only_file_system_is_refused(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(ConfigError, match="Read-only file system"):
        check_out(tmp_path / "out", overwrite=False)


def test_overwrite_never_replaces_the_working_directory_or_a_parent(tmp_path, monkeypatch):
    here = tmp_path / "work"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    for out in (Path("."), tmp_path):
        with pytest.raises(ConfigError, match="the directory you are in"):
            check_out(out, overwrite=True)
    assert (here / "notes.txt").read_text() == "mine"


def test_a_failed_run_removes_only_what_it_created(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "mine.txt").write_text("mine")
    with pytest.raises(RuntimeError), staged_output(keep / "a" / "b" / "out", overwrite=False) as tmp:
        (tmp / "partial.json").write_text("{")
        raise RuntimeError("crash")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["keep", "mine.txt"]


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_bench_and_calibrate_check_out_before_any_work(tmp_path, monkeypatch, command):
    def no_work(*args, **kwargs):
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr(harness_bench.bench, "run", no_work)
    monkeypatch.setattr(harness_calibrate.calibration, "run", no_work)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    full = tmp_path / "full"
    full.mkdir()
    (full / "result.json").write_text("an hour of work")
    run = harness_bench.run_bench if command == "bench" else harness_calibrate.run_calibrate
    for out, needle in ((afile, "not a directory"), (afile / "sub", "is a file"), (full, "not empty")):
        with pytest.raises(ConfigError, match=needle):
            run(out)
    assert afile.read_text() == "mine" and (full / "result.json").read_text() == "an hour of work"
