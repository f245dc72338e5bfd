"""Which network becomes a run's policy: validation episodes and the selection (agents.rllib.selection)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agents.policy import (
    LAST_POLICY_FILE,
    POLICY_FILE,
    ColocNet,
    PolicyMeta,
    export_policy,
    feature_layout,
    load_policy,
)
from agents.rllib import selection as S
from agents.rllib.config import load_train_config
from env.types import Move

# one LC app at 5-10% of its max load beside the BE job, 20 s episodes of 40 intervals
SMALL = [
    "env.sampler.min_apps=1",
    "env.sampler.max_apps=1",
    "env.sampler.load_min=0.05",
    "env.sampler.load_max=0.1",
    "env.sampler.duration_s=[20, 20]",
    "env.sampler.be_probability=1.0",
    "domain_randomization.enabled=false",
]


class FixedAction:
    """A stand-in network: always the same single-mode action where the mask allows it, else HOLD."""

    def __init__(self, action: int) -> None:
        self.action = action

    def eval(self) -> FixedAction:
        return self

    def greedy(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        allowed = mask[:, self.action] > 0
        return torch.where(allowed, torch.tensor(self.action), torch.tensor(int(Move.HOLD)))


def test_validation_is_deterministic_and_scores_every_interval_of_every_episode():
    config = load_train_config("ppo-single", SMALL)
    torch.manual_seed(0)
    net = ColocNet(config.net_spec())
    a = S.validate(net, config, episodes=3, iteration=7)
    b = S.validate(net, config, episodes=3, iteration=7)
    assert a == b
    assert a.iteration == 7 and a.episodes == 3 and a.intervals == 3 * 40
    assert 0.0 <= a.qos_met <= 1.0 and 0.0 <= a.be_throughput <= 1.0
    assert list(a.qos_met_by_node) == ["parties"]  # one node type
    assert a.qos_met_by_node["parties"] == a.qos_met
    assert np.isfinite(a.reward_per_interval)


def test_validation_reports_the_qos_share_per_node_type():
    """full.yaml draws the Q-PRM thesis' node in a fifth of its episodes: the score splits the share
    of met intervals by node type, pooled over that type's intervals."""
    config = load_train_config(
        "full", ["env.sampler.duration_s=[10, 10]", "domain_randomization.enabled=false"]
    )
    torch.manual_seed(0)
    score = S.validate(ColocNet(config.net_spec()), config, episodes=16, iteration=0)
    assert set(score.qos_met_by_node) == {"parties", "qprm"}
    assert all(0.0 <= v <= 1.0 for v in score.qos_met_by_node.values())
    lo, hi = sorted(score.qos_met_by_node.values())
    assert lo - 1e-12 <= score.qos_met <= hi + 1e-12  # the pooled share lies between them
    assert "; parties " in S.describe(score) and "; qprm " in S.describe(score)


def test_validation_ranks_a_network_that_leaves_the_be_job_nothing_below_one_that_feeds_it():
    """PARTIES' fair start gives the LC apps the node; at 5-10% load a network that hands the BE job
    cores (<DOWN,CORE>) meets every target as one that holds does, and leaves the BE job more: it
    must score higher."""
    config = load_train_config("ppo-single", SMALL)
    down_core = 1 + (int(Move.DOWN_CORE) - 1)  # slot 0's <DOWN,CORE> (env.gym_env.ActionCodec, single mode)
    hold = S.validate(FixedAction(int(Move.HOLD)), config, episodes=2, iteration=0)
    feed = S.validate(FixedAction(down_core), config, episodes=2, iteration=1)
    assert hold.qos_met == pytest.approx(1.0) and feed.qos_met == pytest.approx(1.0)
    assert hold.be_throughput == 0.0 and feed.be_throughput > 0.5
    assert feed.reward_per_interval > hold.reward_per_interval + 0.5


def score(iteration: int, reward: float, episodes: int = 4) -> S.ValidationScore:
    return S.ValidationScore(iteration, reward, 0.9, 0.2, episodes, 100)


def test_the_best_score_wins_and_the_earliest_among_equals():
    sel = S.Selection(episodes=4)
    assert sel.best is None
    assert sel.add(score(0, 1.0))
    assert sel.add(score(10, 1.5))
    assert not sel.add(score(20, 0.5))
    assert not sel.add(score(30, 1.5))  # a tie keeps the earlier network
    assert sel.best is not None and sel.best.iteration == 10
    with pytest.raises(ValueError, match="over 8 episodes"):
        sel.add(score(40, 9.0, episodes=8))


def test_a_selection_survives_a_resume_unless_it_was_scored_on_other_episodes(tmp_path):
    sel = S.Selection(episodes=4, scores=[score(0, 1.0), score(10, 2.0)])
    sel.save(tmp_path)
    data = json.loads((tmp_path / S.SELECTION_FILE).read_text())
    assert data["best_iteration"] == 10 and data["first_seed"] == S.VALIDATION_SEED
    assert S.Selection.load(tmp_path, 4) == sel
    assert S.Selection.load(tmp_path, 8).scores == []  # other episodes: not comparable
    assert S.Selection.load(tmp_path / "nowhere", 4).scores == []


def test_select_makes_the_exported_network_the_policy_only_when_it_is_the_best(tmp_path, monkeypatch):
    rewards = iter([1.0, 3.0, 2.0])
    monkeypatch.setattr(
        S, "validate", lambda net, config, episodes, iteration: score(iteration, next(rewards))
    )
    monkeypatch.setattr(S, "load_policy", lambda path: SimpleNamespace(net=path.read_bytes()))
    sel = S.Selection(episodes=4)
    config = load_train_config("ppo-single", SMALL)
    for iteration in (0, 10, 20):
        (tmp_path / LAST_POLICY_FILE).write_bytes(f"network {iteration}".encode())
        S.select(config, tmp_path, iteration, sel)
    assert (tmp_path / POLICY_FILE).read_bytes() == b"network 10"
    assert json.loads((tmp_path / S.SELECTION_FILE).read_text())["best_iteration"] == 10


def test_with_average_best_the_policy_is_the_mean_of_the_best_networks_and_only_they_are_kept(
    tmp_path, monkeypatch
):
    """selection.average_best = 3: after each scored network, OUT/policy.pt holds the mean of the
    weights of the three best-scoring networks (networks/ keeps exactly those), and the log and
    selection.json name them and the average's own score; a resumed selection goes on averaging
    over the kept files."""
    config = load_train_config("ppo-single", [*SMALL, "selection.average_best=3"])
    spec = config.net_spec()
    rewards = {0: 1.0, 10: 3.0, 20: 2.0, 30: 0.5, 40: 2.5}
    scored: list[tuple[int, tuple[int, ...]]] = []  # (iteration, averaged iterations of the network scored)

    def fake_validate(net, config, episodes, iteration):
        averaged = load_policy(tmp_path / POLICY_FILE).meta.averaged_iterations if scored else ()
        is_average = bool(scored) and scored[-1][0] == iteration  # the second call of an iteration
        scored.append((iteration, averaged if is_average else ()))
        return score(iteration, rewards[iteration] + (0.01 * len(averaged) if is_average else 0.0))

    monkeypatch.setattr(S, "validate", fake_validate)
    nets = {}
    sel = S.Selection(episodes=4)
    for iteration in (0, 10, 20, 30):
        torch.manual_seed(iteration)
        nets[iteration] = ColocNet(spec)
        export_policy(
            tmp_path / LAST_POLICY_FILE,
            nets[iteration],
            PolicyMeta(spec, config.env.features, feature_layout(), "ppo", iteration, 0),
        )
        S.select(config, tmp_path, iteration, sel)
    assert sorted(S.kept_networks(tmp_path)) == [0, 10, 20]  # 30 scored below all three
    assert sel.averaged == [10, 20, 0]
    policy = load_policy(tmp_path / POLICY_FILE)
    assert policy.meta.averaged_iterations == (0, 10, 20)
    for name, w in policy.net.state_dict().items():
        mean = sum(nets[i].state_dict()[name] for i in (0, 10, 20)) / 3
        torch.testing.assert_close(w, mean)
    # the average is scored each time it changes (not after iteration 30, which stayed out of it)
    assert [i for i, _ in scored] == [0, 0, 10, 10, 20, 20, 30]
    assert scored[5] == (20, (0, 10, 20)) and sel.average_score == pytest.approx(2.03)
    line = S.describe(sel.scores[-1], sel)
    assert "the mean of the networks of iterations 10, 20, 0 (it scores 2.030)" in line
    saved = json.loads((tmp_path / S.SELECTION_FILE).read_text())
    assert saved["best_iteration"] == 10 and saved["averaged_iterations"] == [10, 20, 0]
    assert saved["average_reward_per_interval"] == pytest.approx(2.03)

    # resumed: a better network replaces the worst of the three
    again = S.Selection.load(tmp_path, 4)
    assert again.averaged == [10, 20, 0] and again.average_score == pytest.approx(2.03)
    torch.manual_seed(40)
    nets[40] = ColocNet(spec)
    export_policy(
        tmp_path / LAST_POLICY_FILE,
        nets[40],
        PolicyMeta(spec, config.env.features, feature_layout(), "ppo", 40, 0),
    )
    S.select(config, tmp_path, 40, again)
    assert sorted(S.kept_networks(tmp_path)) == [10, 20, 40] and again.averaged == [10, 40, 20]
    assert load_policy(tmp_path / POLICY_FILE).meta.averaged_iterations == (10, 20, 40)
    assert (tmp_path / LAST_POLICY_FILE).is_file()  # the last network stays exported beside it


def test_top_ranks_by_score_then_by_the_earlier_network():
    sel = S.Selection(4, [score(0, 1.0), score(10, 2.0), score(20, 2.0), score(30, 3.0)])
    assert [s.iteration for s in sel.top(3)] == [30, 10, 20]
    assert [s.iteration for s in sel.top(2, among={0, 20})] == [20, 0]
    assert sel.top(5, among=set()) == []


def export_seeded(path, config, iteration: int) -> ColocNet:
    """Export a network initialised from `iteration` as the run's last network; return it."""
    spec = config.net_spec()
    torch.manual_seed(iteration)
    net = ColocNet(spec)
    export_policy(path, net, PolicyMeta(spec, config.env.features, feature_layout(), "ppo", iteration, 0))
    return net


def test_rescoring_makes_the_best_of_the_kept_networks_on_more_episodes_the_policy(tmp_path, monkeypatch):
    """selection.rescore_best = 3: the three best on the ranking's episodes are kept; at the end they
    are scored on rescore_episodes, and the highest there becomes OUT/policy.pt even when it ranked
    lower; selection.json and a resumed selection say so, and a resumed rescoring scores only the
    networks it has not scored before."""
    config = load_train_config(
        "ppo-single", [*SMALL, "selection.rescore_best=3", "selection.rescore_episodes=32"]
    )
    ranked = {0: 1.0, 10: 3.0, 20: 2.0, 30: 2.5, 40: 0.5}  # on 4 episodes
    rescored = {10: 2.0, 20: 2.4, 30: 2.2, 50: 2.6}  # on 32 episodes
    calls: list[tuple[int, int]] = []

    def fake_validate(net, config, episodes, iteration):
        calls.append((iteration, episodes))
        return score(iteration, (ranked if episodes == 4 else rescored)[iteration], episodes)

    monkeypatch.setattr(S, "validate", fake_validate)
    sel = S.Selection(episodes=4)
    for iteration in (0, 10, 20, 30, 40):
        export_seeded(tmp_path / LAST_POLICY_FILE, config, iteration)
        S.select(config, tmp_path, iteration, sel)
    assert sorted(S.kept_networks(tmp_path)) == [10, 20, 30]
    assert load_policy(tmp_path / POLICY_FILE).meta.trained_iterations == 10  # the ranking's best
    lines: list[str] = []
    calls.clear()
    S.rescore(config, tmp_path, sel, lines.append)
    assert calls == [(10, 32), (30, 32), (20, 32)]  # in the ranking's order
    assert load_policy(tmp_path / POLICY_FILE).meta.trained_iterations == 20
    assert sel.best is not None and sel.best.iteration == 10  # the ranking is unchanged
    assert sel.policy_iteration == 20 and sel.policy_averaged == []
    assert "rescoring the 3 best networks on 32 validation episodes" in lines[0]
    assert "iteration 20 scores 2.400" in lines[3] and "(ranked 3 on 4 episodes)" in lines[3]
    assert lines[-1] == "the policy: the network of iteration 20"
    saved = json.loads((tmp_path / S.SELECTION_FILE).read_text())
    assert saved["best_iteration"] == 10 and saved["policy_iteration"] == 20
    assert saved["rescore_chose_iteration"] == 20
    assert {s["iteration"]: s["reward_per_interval"] for s in saved["rescored"]} == {
        10: 2.0,
        20: 2.4,
        30: 2.2,
    }

    # resumed: a network ranked below the best leaves the policy alone, and the end of the session
    # rescores only it (the others' scores are reused); it wins there
    again = S.Selection.load(tmp_path, 4)
    assert again == sel
    ranked[50] = 2.8
    export_seeded(tmp_path / LAST_POLICY_FILE, config, 50)
    calls.clear()
    S.select(config, tmp_path, 50, again)
    assert load_policy(tmp_path / POLICY_FILE).meta.trained_iterations == 20  # still rescoring's choice
    assert S.describe(again.scores[-1], again).endswith(
        "; the policy stays iteration 20 (chosen on more episodes)"
    )
    assert sorted(S.kept_networks(tmp_path)) == [10, 30, 50]
    S.rescore(config, tmp_path, again)
    assert calls == [(50, 4), (50, 32)]
    assert again.chosen == 50 and load_policy(tmp_path / POLICY_FILE).meta.trained_iterations == 50

    # a new best on the ranking replaces the policy: the rescoring's choice no longer holds
    ranked[60] = 9.0
    export_seeded(tmp_path / LAST_POLICY_FILE, config, 60)
    S.select(config, tmp_path, 60, again)
    assert again.chosen is None and again.policy_iteration == 60
    assert S.describe(again.scores[-1], again).endswith("; the best so far, now the policy")
    assert load_policy(tmp_path / POLICY_FILE).meta.trained_iterations == 60


def test_rescoring_weighs_the_mean_of_the_averaged_networks_against_each_of_them(tmp_path, monkeypatch):
    """With selection.average_best = 2 and rescore_best = 3, the mean of the two best is a candidate
    too: it stays the policy when it scores highest (the mean among equals), else the best network
    replaces it; with fewer than two candidates nothing is rescored."""
    config = load_train_config(
        "ppo-single",
        [*SMALL, "selection.average_best=2", "selection.rescore_best=3", "selection.rescore_episodes=32"],
    )
    ranked = {0: 1.0, 10: 3.0, 20: 2.0}
    rescored = {0: 2.0, 10: 2.1, 20: 2.2}
    mean_score = [2.2]

    rescorings: list[int] = []  # the iterations scored on 32 episodes: the three networks, then the mean

    def fake_validate(net, config, episodes, iteration):
        if episodes == 4:
            return score(iteration, ranked[iteration], episodes)
        rescorings.append(iteration)
        is_mean = len(rescorings) % 4 == 0
        return score(iteration, mean_score[0] if is_mean else rescored[iteration], episodes)

    monkeypatch.setattr(S, "validate", fake_validate)
    sel = S.Selection(episodes=4)
    for iteration in (0, 10, 20):
        export_seeded(tmp_path / LAST_POLICY_FILE, config, iteration)
        S.select(config, tmp_path, iteration, sel)
    assert sorted(S.kept_networks(tmp_path)) == [0, 10, 20] and sel.averaged == [10, 20]
    lines: list[str] = []
    S.rescore(config, tmp_path, sel, lines.append)
    assert rescorings == [10, 20, 0, 20]  # the mean carries its newest network's iteration
    assert "and their mean" in lines[0] and "the mean of iterations 10, 20 scores 2.200" in lines[-2]
    assert lines[-1] == "the policy: the mean of iterations 10, 20"  # level with iteration 20: the mean
    assert sel.chosen is None and sel.policy_averaged == [10, 20] and sel.rescored_mean == pytest.approx(2.2)
    assert load_policy(tmp_path / POLICY_FILE).meta.averaged_iterations == (10, 20)

    mean_score[0] = 2.15
    sel.rescored = []
    S.rescore(config, tmp_path, sel, lines.append)
    assert lines[-1] == "the policy: the network of iteration 20"
    assert sel.policy_iteration == 20 and sel.policy_averaged == []
    assert load_policy(tmp_path / POLICY_FILE).meta.averaged_iterations == ()

    lone = tmp_path / "lone"
    lone.mkdir()
    one = S.Selection(episodes=4)
    export_seeded(lone / LAST_POLICY_FILE, config, 10)
    S.select(config, lone, 10, one)
    before = (lone / S.SELECTION_FILE).read_text()
    S.rescore(config, lone, one, lines.append)
    assert (lone / S.SELECTION_FILE).read_text() == before and one.chosen is None
