"""CoCo Fig. 2's protocol (`evaluate.py affordable`, harness.affordable): the search over the load
grid, the ratios, and the figure itself on the coco-fig2 scenario."""

from __future__ import annotations

import json

import pytest

import evaluate
from harness import affordable as A
from harness.affordable import AffordableProtocol, ControllerTask, PointVerdict
from harness.runs import load_scenario_arg

APPS = ("m", "n")


def test_search_binary_for_all_and_walk_up_per_container(monkeypatch):
    """affordable_pct: the last level before the point stops being sustained; per container: the
    level before its first miss walking up, even when a later level happens to meet again."""
    levels = (10.0, 20.0, 30.0, 40.0, 50.0)
    m_ok = {10.0: True, 20.0: True, 30.0: False, 40.0: True, 50.0: True}  # non-monotone
    runs: list[float] = []

    def fake(task: ControllerTask, r: float) -> PointVerdict:
        runs.append(r)
        return PointVerdict({"m": m_ok[r], "n": r <= 40.0})

    monkeypatch.setattr(A, "point_verdict", fake)
    scn, _ = load_scenario_arg("coco-fig2")
    task = ControllerTask("coco", scn, {"m": 0.1, "n": 0.2}, AffordableProtocol(loads_pct=levels))
    r = A.search_controller(task)
    assert r["affordable_pct"] == 20.0 and not r["capped"]
    assert r["per_app_pct"] == {"m": 20.0, "n": 40.0}
    assert len(runs) == len(set(runs))  # every point is run once


def test_ratios_and_a_reference_that_affords_nothing():
    res = {
        "a": {"affordable_pct": 20.0, "per_app_pct": {"m": 20.0, "n": 60.0}},
        "b": {"affordable_pct": 5.0, "per_app_pct": {"m": 5.0, "n": 30.0}},
        "c": {"affordable_pct": 0.0, "per_app_pct": {"m": 0.0, "n": 30.0}},
    }
    r = A.ratios(res, ["a", "b", "c"])
    assert r["a/b"]["affordable"] == pytest.approx(4.0)
    assert r["a/b"]["per_app_range"] == pytest.approx([2.0, 4.0])
    assert r["a/c"]["affordable"] is None and r["a/c"]["per_app"]["m"] is None
    assert r["a/c"]["per_app_range"] == pytest.approx([2.0, 2.0])


def test_fig2_coco_affords_more_than_no_partitioning(tmp_path):
    """CoCo Fig. 2 on coco-fig2 (window verdict): CoCo's time-shared CLOSes afford a multiple of
    what no partitioning does (paper: 2.2-9.1x), where memcached is the container that limits both."""
    out = tmp_path / "fig2"
    rc = evaluate.main(
        ["affordable", "--controllers", "coco,coco-nopart", "--loads", "5,10,15,17.5", "--out", str(out)]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    coco, nopart = s["results"]["coco"], s["results"]["coco-nopart"]
    assert coco["affordable_pct"] >= 15.0 and 0.0 < nopart["affordable_pct"] <= 10.0
    assert s["ratios"]["coco/coco-nopart"]["affordable"] >= 1.5
    assert nopart["per_app_pct"]["memcached-1"] == nopart["affordable_pct"]
    assert set(s["sl_full"]) == {"memcached-1", "memcached-2", "nginx-1", "nginx-2", "mongodb-1", "mongodb-2"}
    assert (out / "affordable.png").stat().st_size > 0 and "coco/coco-nopart" in (
        out / "summary.md"
    ).read_text()
