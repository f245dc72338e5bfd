"""Fuzzing the simulator's inputs: seeded mutations of every shipped scenario, platform and app
profile - of the parsed tree (values swapped for odd ones, numbers scaled, keys dropped or added,
list items repeated) and of the raw bytes (YAML punctuation and digits inserted, bytes flipped,
the file cut short) - must each load and run a few simulated intervals, or raise `ConfigError`.
Any other exception, or a case that takes more than a few seconds, is a bug: bad input must be a
clear error naming the field (exit 2 in the CLIs), never a traceback or a hang."""

from __future__ import annotations

import copy
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from baselines.simple import StaticController
from env.config import CONFIGS, ConfigError
from env.loop import run_episode
from env.sim.node import SimNode
from env.sim.scenario import load_scenario

MUTATIONS_PER_FILE = 16  # x 33 shipped files: ~530 cases, a few seconds in all
CASE_TIMEOUT_S = 10
ODD_VALUES: list[Any] = [0, -1, 1, 0.5, 1.5, 1e-9, 1e9, -1e9, 10**20, "", "x", None, True, [], {}]
ODD_VALUES += [float("nan"), float("inf")]
YAML_BYTES = b"0123456789-.e:[]{}, \n#x"
MIX = {"name": "fuzz", "duration_s": 6, "warmup_s": 2, "apps": [{"app": "memcached", "load": 0.3}]}


def shipped() -> list[Path]:
    node = [p for p in sorted((CONFIGS / "node").glob("*.yaml")) if not p.name.startswith("linux")]
    return sorted((CONFIGS / "scenarios").glob("*.yaml")) + node + sorted((CONFIGS / "apps").glob("*.yaml"))


def _walk(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, tree
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        yield from _walk(v, (*path, k))


def mutate_tree(data: Any, rng: random.Random) -> Any:
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        nodes = [(p, v) for p, v in _walk(data) if p]
        if not nodes:
            return rng.choice(ODD_VALUES)
        numbers = [(p, v) for p, v in nodes if isinstance(v, int | float) and not isinstance(v, bool)]
        path, value = rng.choice(numbers if numbers and rng.random() < 0.6 else nodes)
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        key, op = path[-1], rng.random()
        if op < 0.3:
            parent[key] = rng.choice(ODD_VALUES)
        elif op < 0.75 and (path, value) in numbers:
            parent[key] = value * rng.choice([0, -1, 1e-6, 0.1, 0.5, 2, 10, 100, 1e6])
        elif op < 0.8:
            del parent[key]
        elif op < 0.9 and isinstance(parent, list):
            parent.append(copy.deepcopy(value))
        elif isinstance(parent, dict):
            parent["unknown_key"] = 1
        else:
            parent[key] = {"unknown_key": value}
    return data


def mutate_bytes(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        alphabet = YAML_BYTES if rng.random() < 0.9 else bytes(range(256))
        i, op = rng.randrange(max(1, len(b))), rng.random()
        if op < 0.3 and b:
            b[i] = rng.choice(alphabet)
        elif op < 0.5:
            b[i:i] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        elif op < 0.7:
            del b[i : i + rng.randint(1, 16)]
        elif op < 0.85:
            del b[i:]
        else:
            b[i:i] = b[rng.randrange(max(1, len(b))) :][:32]
    return bytes(b)


def scenario_for(original: Path, mutated: Path, data: Any) -> dict[str, Any]:
    """A small scenario that runs the mutated platform or profile."""
    scn = copy.deepcopy(MIX)
    if original.parent.name == "node":
        scn["platform"] = str(mutated)
    elif isinstance(data, dict) and data.get("kind") == "lc":
        scn["apps"] = [{"app": str(mutated), "load": 0.3}]
    elif isinstance(data, dict) and data.get("placement", "allocated") != "allocated":
        scn["antagonists"] = [{"profile": str(mutated), "target": "memcached"}]
    else:
        scn["be"] = [str(mutated)]
    return scn


def _timeout(signum: int, frame: Any) -> None:
    raise TimeoutError(f"a case took more than {CASE_TIMEOUT_S} s")


@pytest.mark.parametrize("original", shipped(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_mutated_configs_load_and_run_or_are_config_errors(original, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = original.read_bytes().replace(b"traces/", str(original.parent / "traces").encode() + b"/")
    data = yaml.safe_load(raw)
    rng = random.Random(f"{original.parent.name}/{original.stem}")
    previous = signal.signal(signal.SIGALRM, _timeout)
    outcomes = {"ran": 0, "refused": 0}
    try:
        for i in range(MUTATIONS_PER_FILE):
            case = tmp_path / f"case{i}.yaml"
            if i % 2:
                case.write_bytes(mutate_bytes(raw, rng))
            else:
                case.write_text(yaml.safe_dump(mutate_tree(data, rng)))
            scenario = case
            if original.parent.name != "scenarios":
                scenario = tmp_path / f"scenario{i}.yaml"
                scenario.write_text(yaml.safe_dump(scenario_for(original, case, data)))
            signal.alarm(CASE_TIMEOUT_S)
            try:
                node = SimNode(load_scenario(scenario))
                records = run_episode(node, StaticController(), 2.0, rng=np.random.default_rng(0))
                assert records
                outcomes["ran"] += 1
            except ConfigError as e:
                assert str(e)
                outcomes["refused"] += 1
            except Exception as e:
                pytest.fail(f"{type(e).__name__}: {e} on this input ({case.name}):\n{case.read_bytes()!r}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert sum(outcomes.values()) == MUTATIONS_PER_FILE
