"""The warm start's share of a run's time budget (`harness.training.warm_start`)."""

from __future__ import annotations

import time

import pytest

from agents.policy import ColocNet
from agents.rllib.config import build_train_config
from env.config import ConfigError
from harness import training


@pytest.fixture
def no_rllib(monkeypatch):
    """`warm_start` without an RLlib algorithm: a fresh network in, its weights dropped out."""
    monkeypatch.setattr(training, "module_state", lambda algo: None)
    monkeypatch.setattr(training, "net_from_module_state", lambda spec, state: ColocNet(spec))
    monkeypatch.setattr(training, "set_module_weights", lambda algo, net: None)


def _config(*extra: str):
    return build_train_config(
        {},
        [
            "warm_start.teacher=parties",
            "warm_start.episodes=1",
            "warm_start.epochs=1",
            "warm_start.dagger_rounds=2",
            "env.sampler.duration_s=[10, 12]",
            "model.hidden_units=16",
            *extra,
        ],
    )


def test_dagger_rounds_run_while_less_than_their_share_of_the_budget_is_spent(no_rllib):
    for budget in ("max_train_minutes=null", "max_train_minutes=60"):
        lines: list[str] = []
        training.warm_start(None, _config(budget), lines.append, started=time.perf_counter())
        text = "\n".join(lines)
        assert "DAgger round 1/2" in text and "DAgger round 2/2" in text, text
        assert "skipping" not in text


def test_no_dagger_round_starts_once_its_share_of_the_budget_is_spent(no_rllib):
    lines: list[str] = []
    ten_minutes_ago = time.perf_counter() - 600.0
    training.warm_start(None, _config("max_train_minutes=20"), lines.append, started=ten_minutes_ago)
    text = "\n".join(lines)
    assert "DAgger round 1/2" not in text
    assert (
        "10m00s of the 20-min time budget spent (50% or more): skipping DAgger rounds 1-2, the rest is PPO's"
        in text
    )
    assert "imitation accuracy" in text  # the first imitation still ran and was reported


def test_a_larger_dagger_share_lets_the_rounds_start_later(no_rllib):
    ten_minutes_ago = time.perf_counter() - 600.0
    lines: list[str] = []
    config = _config("max_train_minutes=20", "warm_start.dagger_budget_share=0.75")
    training.warm_start(None, config, lines.append, started=ten_minutes_ago)
    text = "\n".join(lines)
    assert "DAgger round 1/2" in text and "DAgger round 2/2" in text, text
    lines.clear()
    config = _config("max_train_minutes=12", "warm_start.dagger_budget_share=0.75")
    training.warm_start(None, config, lines.append, started=ten_minutes_ago)
    assert "(75% or more): skipping DAgger rounds 1-2" in "\n".join(lines)


@pytest.mark.parametrize("share", ["-0.1", "1.5"])
def test_a_dagger_share_outside_0_1_is_refused(share):
    with pytest.raises(ConfigError, match="dagger_budget_share"):
        _config(f"warm_start.dagger_budget_share={share}")


@pytest.mark.parametrize("labels", ["teacher", "options"])
def test_the_log_gives_the_accuracy_by_the_teachers_own_move_when_options_are_accepted(no_rllib, labels):
    lines: list[str] = []
    config = _config(
        "warm_start.teacher=oracle-guided", "warm_start.dagger_rounds=0", f"warm_start.labels={labels}"
    )
    training.warm_start(None, config, lines.append, started=time.perf_counter())
    text = "\n".join(lines)
    assert "imitation accuracy" in text
    assert ("by the teacher's own move alone" in text) == (labels == "options"), text


def test_imitation_labels_other_than_teacher_or_options_are_refused():
    assert _config("warm_start.labels=options").warm_start.labels == "options"
    with pytest.raises(ConfigError, match=r"warm_start\.labels must be 'teacher' or 'options'"):
        _config("warm_start.labels=all")
