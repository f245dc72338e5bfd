"""train.py: --help, bad input (exit 2, nothing created) and, with a Ray session, a tiny end-to-end
run: TensorBoard tags, checkpoints, the resolved config, the exported policy, the comparison with
PARTIES in the schema of `evaluate.py compare`, and resume (in place; refused across layouts)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

import train
from agents.rllib.config import build_train_config, load_train_config, resolved
from agents.rllib.runtime import (
    CHECKPOINT_FILES,
    CHECKPOINT_META,
    MANIFEST,
    checkpoint_meta,
    read_manifest,
    record_checkpoint,
)

TINY = [
    "iterations=2",
    "checkpoint_every=1",
    "keep_checkpoints=2",
    "model.hidden_units=32",
    "env.sampler.duration_s=[10, 20]",
    "ppo.train_batch_size=128",
    "ppo.minibatch_size=64",
    "ppo.num_epochs=1",
    "resources.num_env_runners=0",
    "resources.num_envs_per_env_runner=2",
    "selection.episodes=2",
]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = train.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def fake_checkpoint(root: Path, overrides: list[str], iteration: int = 3) -> Path:
    """A run directory with one checkpoint whose coloc.json describes the given config."""
    ckpt = root / "checkpoints" / f"iter_{iteration:06d}"
    ckpt.mkdir(parents=True)
    config = load_train_config("ppo-single", overrides)
    for name in CHECKPOINT_FILES:  # RLlib's files, empty: these tests stop before they are read
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).touch()
    (ckpt / CHECKPOINT_META).write_text(json.dumps(checkpoint_meta(config, iteration, 100)))
    record_checkpoint(root, ckpt.name, ckpt)  # as save_checkpoint does
    (root / "config.yaml").write_text(yaml.safe_dump(resolved(config)))
    return ckpt


def test_help_explains_the_flags(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--config",
        "--set",
        "--out",
        "--ray-address",
        "--num-env-runners",
        "--resume",
        "exit status 2",
    ):
        assert flag in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "nope"], "unknown train 'nope'"),
        (["--config", "ppo-single", "--set", "ppo.lrr=1"], "ppo.lrr: unknown key"),
        (["--config", "ppo-single", "--set", "iterations=many"], "iterations: expected an integer"),
        (
            ["--config", "ppo-single", "--set", "algo=dqn", "--set", "env.action_mode=per_app"],
            "env.action_mode",
        ),
        (
            ["--config", "full", "--set", "warm_start.teacher=oracle-guided-per-app"],
            "its labels need env.action_mode: per_app",
        ),
        (["--config", "ppo-single", "--set", "novalue"], "expected key=value"),
        (["--config", "ppo-single", "--set", "seed=-3"], "seed must be >= 0"),
        (["--config", "ppo-single", "--set", "selection.episodes=-1"], "selection.episodes must be >= 0"),
        (
            ["--config", "ppo-single", "--set", "selection.average_best=0"],
            "selection.average_best must be >= 1",
        ),
        (
            ["--config", "ppo-single", "--set", "selection.episodes=0", "--set", "selection.average_best=2"],
            "needs validation scores",
        ),
        (["--config", "full", "--set", "selection.rescore_best=0"], "selection.rescore_best must be >= 1"),
        (
            ["--config", "full", "--set", "selection.episodes=0"],
            "selection.rescore_best > 1 needs validation scores",
        ),
        (
            ["--config", "full", "--set", "selection.rescore_episodes=16"],
            "selection.rescore_episodes must be > selection.episodes (16), got 16",
        ),
        (["--config", "ppo-single", "--set", "model.down_slack_min=1.5"], "model.down_slack_min must be in"),
        (["--config", "ppo-single", "--set", "model.spare_core_util=0"], "model.spare_core_util must be in"),
        (["--config", "ppo-single", "--set", "model.idle_core_util=1"], "model.idle_core_util must be in"),
        (
            ["--config", "ppo-single", "--num-env-runners", "0", "--set", "eval.scenarios=[nope]"],
            "eval.scenarios",
        ),
        (
            ["--config", "ppo-single", "--num-env-runners", "0", "--set", "eval.single_app_baselines=[nope]"],
            "eval.single_app_baselines: unknown controller 'nope'",
        ),
        ([], "--config is required"),
    ],
)
def test_bad_config_exits_2_and_creates_nothing(capsys, tmp_path, args, needle):
    out = tmp_path / "run"
    rc, _, err = run(capsys, *args, "--out", str(out))
    assert rc == 2 and "train.py: error:" in err and needle in err
    assert not out.exists()


def test_unknown_key_in_a_config_file_names_the_field(capsys, tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("algo: ppo\nppo:\n  lr: 0.001\n  epochs: 3\n")
    rc, _, err = run(capsys, "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert rc == 2 and "mine.yaml.ppo.epochs: unknown key" in err and not (tmp_path / "run").exists()


def test_a_non_empty_out_is_refused_without_overwrite(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, _, err = run(capsys, "--config", "ppo-single", "--out", str(out))
    assert rc == 2 and "not empty" in err and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("ckpt_overrides", "extra", "needle"),
    [
        (["env.action_mode=per_app"], [], "action_mode='per_app'"),
        (["env.max_apps=4"], [], "max_apps=4"),
        (["model.hidden_units=32"], [], "hidden_units=32"),
        (["model.pressure_mask=false"], [], "model.pressure_mask=False"),
        (["model.spare_core_util=0.15"], [], "model.spare_core_util=0.15"),
        (["model.idle_core_util=0.25"], [], "model.idle_core_util=0.25"),
        (["algo=dqn"], [], "algo 'dqn'"),
        ([], ["--set", "iterations=2"], "already trained 3 iterations"),
    ],
)
def test_resuming_an_incompatible_checkpoint_exits_2(capsys, tmp_path, ckpt_overrides, extra, needle):
    old = tmp_path / "old"
    fake_checkpoint(old, ckpt_overrides)
    out = tmp_path / "new"
    rc, _, err = run(capsys, "--config", "ppo-single", "--resume", str(old), "--out", str(out), *extra)
    assert rc == 2 and needle in err and not out.exists()


@pytest.mark.parametrize("damage", ["missing_dir", "no_checkpoint", "corrupt_meta"])
def test_resuming_a_missing_or_damaged_checkpoint_exits_2(capsys, tmp_path, damage):
    old = tmp_path / "old"
    if damage == "no_checkpoint":
        (old / "checkpoints").mkdir(parents=True)
    elif damage == "corrupt_meta":
        ckpt = fake_checkpoint(old, [])
        (ckpt / CHECKPOINT_META).write_text("{not json")
    rc, _, err = run(capsys, "--config", "ppo-single", "--resume", str(old), "--out", str(tmp_path / "new"))
    assert rc == 2 and "--resume" in err and not (tmp_path / "new").exists()


def test_resume_without_config_reuses_the_runs_config(capsys, tmp_path):
    old = tmp_path / "old"
    fake_checkpoint(old, ["env.max_apps=4", "iterations=3"])
    # the config saved with the checkpoint asks for 3 iterations, as many as done: refused, so it was read
    rc, _, err = run(capsys, "--resume", str(old), "--out", str(old))
    assert rc == 2 and "already trained 3 iterations and the config asks for 3" in err


def _tamper(ckpt: Path, how: str) -> str:
    """Change checkpoint `ckpt` after it was recorded; the file named in the error."""
    state = ckpt / "algorithm_state.pkl"
    if how == "changed":
        state.write_bytes(b"cos\nsystem\n(S'echo owned'\ntR.")  # a pickle that runs a command
    elif how == "added":
        (ckpt / "extra.pkl").write_bytes(b"x")
        return "extra.pkl"
    elif how == "symlink":
        state.unlink()
        state.symlink_to("/etc/hostname")
    elif how == "no_manifest":
        (ckpt.parent.parent / MANIFEST).unlink()
        return MANIFEST
    elif how == "removed":
        (ckpt / CHECKPOINT_FILES[2]).unlink()
        return "module_state.pkl"
    return "algorithm_state.pkl"


@pytest.mark.parametrize("how", ["changed", "added", "symlink", "no_manifest", "removed"])
def test_resume_refuses_checkpoint_files_that_do_not_match_the_manifest(capsys, tmp_path, how):
    old = tmp_path / "old"
    ckpt = fake_checkpoint(old, [])
    assert set(read_manifest(old)) == {
        f"checkpoints/{ckpt.name}/{f}" for f in (*CHECKPOINT_FILES, CHECKPOINT_META)
    }
    needle = _tamper(ckpt, how)
    rc, _, err = run(capsys, "--config", "ppo-single", "--resume", str(old), "--out", str(tmp_path / "new"))
    assert rc == 2 and needle in err and "--resume" in err and not (tmp_path / "new").exists()


def test_set_merges_a_mapping_into_its_section_and_max_apps_is_bounded(capsys, tmp_path):
    base = load_train_config("full")
    merged = load_train_config("full", ["ppo={lr: 0.001}"])
    assert merged.ppo.lr == 0.001 and merged.ppo.entropy_coeff == base.ppo.entropy_coeff != 0.01
    assert dataclasses.replace(merged.ppo, lr=base.ppo.lr) == base.ppo
    rc, _, err = run(
        capsys, "--config", "ppo-single", "--set", "env.max_apps=1000000", "--out", str(tmp_path / "r")
    )
    assert rc == 2 and "env.max_apps must be in 1..64" in err


def test_a_binary_config_or_an_out_under_a_file_exits_2(capsys, tmp_path):
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(bytes(range(256)))
    rc, _, err = run(capsys, "--config", str(blob), "--out", str(tmp_path / "r"))
    assert rc == 2 and "not a text file" in err
    afile = tmp_path / "afile"
    afile.write_text("mine")
    rc, _, err = run(capsys, "--config", "ppo-single", "--out", str(afile / "run"))
    assert rc == 2 and "is a file" in err and afile.read_text() == "mine"


# ---- end to end (Ray) -------------------------------------------------------------------------------------
def tb_tags(logdir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for f in logdir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


@pytest.mark.ray
@pytest.mark.slow
def test_train_checkpoint_export_evaluate_and_resume(ray_session, capsys, tmp_path):
    from agents.policy import load_policy

    out = tmp_path / "run"
    overrides = [a for o in TINY for a in ("--set", o)]
    eval_set = ["--set", "eval.scenarios=[mix3-const]", "--set", "eval.seeds=1"]
    rc, stdout, err = run(capsys, "--config", "ppo-single", "--out", str(out), *overrides, *eval_set)
    assert rc == 0, err
    assert "iter 1/2" in stdout and "iter 2/2" in stdout and "ETA" in stdout
    # the resolved config loads back into the config that ran
    saved = yaml.safe_load((out / "config.yaml").read_text())
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["argv"][:2] == ["--config", "ppo-single"] and run_json["status"] == "done"
    expected = load_train_config("ppo-single", [*TINY, "eval.scenarios=[mix3-const]", "eval.seeds=1"])
    assert build_train_config(saved) == expected == load_train_config(out / "config.yaml")
    # progress, TensorBoard in the fixed namespaces, checkpoints, the policy
    lines = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2] and lines[1]["env_steps"] >= 256
    tags = tb_tags(out / "tb")
    assert {"train/episode_return_mean", "train/policy_loss", "qos/met_frac", "be/throughput_mean"} <= tags
    assert {t.split("/")[0] for t in tags} <= {"train", "qos", "be", "selection"}
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["iter_000001", "iter_000002"]
    last = load_policy(out / "policy_last.pt", expect_mode="single", expect_max_apps=6)
    assert last.meta.trained_iterations == 2 and last.meta.algo == "ppo"
    # the policy: the best of the starting network and every checkpoint on the validation episodes
    selection = json.loads((out / "selection.json").read_text())
    scores = {s["iteration"]: s["reward_per_interval"] for s in selection["scores"]}
    assert sorted(scores) == [0, 1, 2] and scores[selection["best_iteration"]] == max(scores.values())
    policy = load_policy(out / "policy.pt", expect_mode="single", expect_max_apps=6)
    assert policy.meta.trained_iterations == selection["best_iteration"] == run_json["policy_iteration"]
    assert all("selection/reward_per_interval" in x for x in lines) and "validation (2 episodes)" in stdout
    # the comparison with PARTIES, in the schema of `evaluate.py compare`
    summary = json.loads((out / "eval" / "mix3-const" / "summary.json").read_text())
    assert summary["scenario"] == "mix3-const" and set(summary) >= {"scenario_file", "units", "results"}
    assert {r["controller"] for r in summary["results"]} == {f"rl:{out / 'policy.pt'}", "parties"}
    for row in summary["results"]:
        assert {"qos_guarantee", "lc_emu", "be_throughput", "convergence_s", "decide_ms_p50"} <= set(row)
    assert "| parties |" in stdout and (out / "eval" / "summary.md").is_file()
    assert json.loads((out / "run.json").read_text())["iterations"] == 2

    # resume in place for one more iteration: the counter continues, the oldest checkpoint rotates out
    rc, stdout, err = run(
        capsys,
        "--resume",
        str(out),
        "--out",
        str(out),
        "--set",
        "iterations=3",
        "--set",
        "eval.enabled=false",
    )
    assert rc == 0, err
    assert "resumed from" in stdout and "iter 3/3" in stdout
    lines = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2, 3] and lines[2]["env_steps"] > lines[1]["env_steps"]
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["iter_000002", "iter_000003"]
    assert load_policy(out / "policy_last.pt").meta.trained_iterations == 3
    # the resumed run went on comparing with the networks before it
    selection = json.loads((out / "selection.json").read_text())
    assert [s["iteration"] for s in selection["scores"]] == [0, 1, 2, 3]
    assert load_policy(out).meta.trained_iterations == selection["best_iteration"]
    # the manifest holds every file of the kept checkpoints, and only those
    recorded = read_manifest(out)
    on_disk = {p.relative_to(out).as_posix() for p in (out / "checkpoints").rglob("*") if p.is_file()}
    assert set(recorded) == on_disk and {r.split("/")[1] for r in recorded} == {"iter_000002", "iter_000003"}

    # a checkpoint changed after it was written: refused by the manifest before RLlib unpickles it;
    # once re-recorded (its owner trusts it), RLlib's own errors on a damaged or missing state: exit 2
    broken_run = tmp_path / "broken"
    broken = broken_run / "checkpoints" / "iter_000003"
    shutil.copytree(out / "checkpoints" / "iter_000003", broken)
    shutil.copy(out / MANIFEST, broken_run / MANIFEST)
    weights = broken / "learner_group" / "learner" / "rl_module" / "default_policy" / "module_state.pkl"
    weights.write_bytes(weights.read_bytes()[:100])
    fresh = tmp_path / "fresh"
    rc, _, err = run(capsys, "--resume", str(broken), "--out", str(fresh), "--set", "iterations=5")
    assert rc == 2 and "module_state.pkl does not match its SHA-256" in err and not fresh.exists()
    record_checkpoint(broken_run, broken.name, broken)
    rc, _, err = run(capsys, "--resume", str(broken), "--out", str(fresh), "--set", "iterations=5")
    assert rc == 2 and "cannot restore" in err and not fresh.exists()
    shutil.rmtree(broken / "learner_group")
    record_checkpoint(broken_run, broken.name, broken)
    rc, _, err = run(capsys, "--resume", str(broken), "--out", str(fresh), "--set", "iterations=5")
    assert rc == 2 and "damaged checkpoint, missing" in err and not fresh.exists()


def test_ppo_keeps_imitating_the_warm_start_and_a_resumed_run_its_labels(ray_session, capsys, tmp_path):
    from agents.rllib.learner import DEMOS_FILE, load_demonstrations

    out = tmp_path / "run"
    keep = [
        *TINY,
        "iterations=1",
        "warm_start.teacher=parties",
        "warm_start.episodes=2",
        "warm_start.epochs=1",
        "ppo.imitation_weight=1.0",
        "eval.enabled=false",
    ]
    rc, stdout, err = run(
        capsys, "--config", "ppo-single", "--out", str(out), *(a for o in keep for a in ("--set", o))
    )
    assert rc == 0, err
    assert "PPO keeps imitating the warm start's" in stdout
    features, masks, accepted = load_demonstrations(out / DEMOS_FILE)
    assert len(features) == len(masks) == len(accepted) > 0
    # every kept label accepts an action, and only actions the mask allows
    assert accepted.any(axis=1).all() and not (accepted & (masks < 0.5)).any()
    assert "train/imitation_loss" in tb_tags(out / "tb")
    n = len(features)
    assert f"imitating the warm start's {n:,} labels" in stdout

    # resumed in place, the learner gets the run's labels back; without them, the resume is refused
    rc, stdout, err = run(capsys, "--resume", str(out), "--out", str(out), "--set", "iterations=2")
    assert rc == 0, err
    assert f"imitating the warm start's {n:,} labels" in stdout and "iter 2/2" in stdout
    (out / DEMOS_FILE).unlink()
    rc, _, err = run(capsys, "--resume", str(out), "--out", str(tmp_path / "again"), "--set", "iterations=3")
    assert rc == 2 and DEMOS_FILE in err and not (tmp_path / "again").exists()


def test_the_demo_compares_the_policy_with_every_baseline():
    """`make demo` is `train.py --config demo`: its evaluation lists every baseline of the issue,
    the single-app controllers (Intel PRM, Q-PRM) on the scenarios with one LC app."""
    config = load_train_config("demo")
    assert config.eval.enabled
    every = {"unmanaged", "static", "parties", "heracles", "oracle", "coco", "bo"}
    assert every <= set(config.eval.baselines)
    assert {"prm", "qprm-step"} <= set(config.eval.single_app_baselines)
    assert "qprm-sinusoid" in config.eval.scenarios  # a one-app scenario, where PRM and Q-PRM run
    assert config.max_train_minutes is not None and config.max_train_minutes <= 5


def test_eval_specs_add_single_app_baselines_only_to_one_app_scenarios(tmp_path):
    from harness.training import eval_specs

    config = load_train_config("demo", ["eval.baselines=[parties]", "eval.single_app_baselines=[prm]"])
    policy = tmp_path / "policy.pt"
    assert eval_specs(policy, config, n_lc_apps=1) == [f"rl:{policy}", "parties", "prm"]
    assert eval_specs(policy, config, n_lc_apps=3) == [f"rl:{policy}", "parties"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_keeps_to_its_time_budget_and_returns_a_servable_policy(ray_session, tmp_path, monkeypatch):
    """...and, with selection.rescore_best, the policy is the better of its networks on more
    validation episodes, as run.json and selection.json say."""
    import io

    from agents.policy import load_policy
    from harness.training import RunOptions, train

    log = io.StringIO()
    budget = ["iterations=3", "checkpoint_every=10", "max_train_minutes=0.001", "eval.enabled=false"]
    short_warm_start = ["warm_start.episodes=8"]  # the demo's 80 take most of a minute here
    rescoring = ["selection.rescore_best=2", "selection.rescore_episodes=4"]
    config = load_train_config("demo", [*TINY, *budget, *short_warm_start, *rescoring])
    monkeypatch.chdir(tmp_path)  # a relative --out, as `make demo` gives (RLlib wants absolute paths)
    outcome = train(config, RunOptions(out=Path("demo"), log=log))
    assert outcome.policy == tmp_path / "demo" / "policy.pt"
    # half the budget (demo.yaml's dagger_budget_share, 0.5) was gone before the first DAgger round:
    # PPO got the rest
    assert "(50% or more): skipping DAgger rounds 1-2, the rest is PPO's" in log.getvalue()
    # the budget ran out during the first iteration: it stopped there, with a checkpoint
    assert "time budget of 0.001 min reached: stopping after 1 of 3 iterations" in log.getvalue()
    assert load_policy(tmp_path / "demo" / "policy_last.pt").meta.trained_iterations == 1
    assert [p.name for p in (tmp_path / "demo" / "checkpoints").iterdir()] == ["iter_000001"]
    # the two networks (imitated, iteration 1) ranked on 2 episodes, rescored on 4: the higher wins
    selection = json.loads((tmp_path / "demo" / "selection.json").read_text())
    assert selection["best_iteration"] in (0, 1)
    rescored = {s["iteration"]: s["reward_per_interval"] for s in selection["rescored"]}
    assert sorted(rescored) == [0, 1] and {s["episodes"] for s in selection["rescored"]} == {4}
    chosen = selection["rescore_chose_iteration"]
    assert rescored[chosen] == max(rescored.values())
    run_json = json.loads((tmp_path / "demo" / "run.json").read_text())
    assert load_policy(outcome.policy).meta.trained_iterations == chosen == run_json["policy_iteration"]
    assert (
        run_json["rescore_wall_s"] > 0
        and "rescoring the 2 best networks on 4 validation episodes" in log.getvalue()
    )
