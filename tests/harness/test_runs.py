"""harness.runs: the evaluation node reports 100 ms sub-interval p99s beside each interval's p99, so
`parties:code` reads what the authors' code reads (manager/PARTIES.py:20 INTERVAL = 0.1)."""

from __future__ import annotations

from pathlib import Path

from baselines.parties import PartiesController
from env.config import CONFIGS
from env.sim.scenario import simple_scenario
from harness.runs import RunJob, build_run, sub_interval_s


def test_evaluation_nodes_report_100ms_sub_intervals_and_parties_code_reads_them():
    scn = simple_scenario({"memcached": 0.2, "xapian": 0.2}, duration_s=5.0, warmup_s=0.0)
    node, ctrl = build_run(RunJob("parties:code", scn, seed=0))
    assert isinstance(ctrl, PartiesController) and ctrl.cfg.samples == "sub_interval"
    obs = node.step()
    assert all(len(s.sub_p99_us) == 5 for s in obs.apps)  # 500 ms / 100 ms


def test_sub_intervals_only_where_100ms_divides_the_interval(tmp_path: Path):
    assert sub_interval_s(simple_scenario({"memcached": 0.8}, platform="qprm")) == 0.1  # 1 s: 10 of them
    node = tmp_path / "quarter.yaml"
    node.write_text(
        (CONFIGS / "node" / "parties.yaml").read_text().replace("interval_s: 0.5", "interval_s: 0.25")
    )
    assert sub_interval_s(simple_scenario({"memcached": 0.2}, platform=str(node))) is None
