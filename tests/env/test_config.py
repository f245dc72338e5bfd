"""env.config: what a config file may be (size, text, plain YAML), finite numbers, and how the CLIs
exit on bad input and on SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest

from env.config import EXIT_BAD_INPUT, MAX_YAML_BYTES, ConfigError, build, load_yaml, run_cli


@dataclasses.dataclass(frozen=True)
class Knobs:
    rate: float = 1.0
    count: int = 1


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (bytes(range(256)), "not a text file"),
        (b"a: 1\n" + b"# padding\n" * (MAX_YAML_BYTES // 10), "larger than"),
        (b"[" * 50_000, "nested too deeply"),
        (b"a: &x [1, 2]\nb: *x\n", "aliases"),
        (b"a: [1\n", "not valid YAML"),
    ],
    ids=["binary", "oversized", "deep", "alias", "broken"],
)
def test_files_that_are_not_configs_are_config_errors(tmp_path, content, needle):
    p = tmp_path / "c.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError, match=needle) as e:
        load_yaml(p)
    assert str(p) in str(e.value)


def test_a_plain_config_loads():
    from env.config import CONFIGS

    assert load_yaml(CONFIGS / "scenarios" / "mix3-const.yaml")["name"] == "mix3-const"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400])
def test_numbers_must_be_finite(value):
    with pytest.raises(ConfigError, match=r"knobs.rate: expected a finite number"):
        build(Knobs, {"rate": value}, "knobs")
    assert build(Knobs, {"rate": 2, "count": 3.0}, "knobs") == Knobs(2.0, 3)


def test_run_cli_exits_2_on_a_config_error(capsys):
    def bad() -> int:
        raise ConfigError("nope")

    assert run_cli("prog", bad) == EXIT_BAD_INPUT
    assert "prog: error: nope" in capsys.readouterr().err


def test_sigterm_unwinds_like_ctrl_c_and_the_handler_is_put_back(capsys):
    cleaned = []

    def body() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler to run at
            return 0
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert run_cli("prog", body) == 128 + signal.SIGTERM
    assert cleaned == [True] and "terminated (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
