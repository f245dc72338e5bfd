"""A training run (`train.py`): planning, RLlib iterations, TensorBoard, checkpoints, resume, the
warm start from a teacher controller, export and the final comparison with the baselines.
`make demo` is `train.py --config demo` (configs/train/demo.yaml: a short run, then every
baseline).

Run directory (`--out OUT`):

    OUT/config.yaml             the resolved config (runs again with `--config OUT/config.yaml`)
    OUT/progress.jsonl          one line per iteration: iteration, env steps, wall time, the scalars below
    OUT/tb/                     TensorBoard event files (tags train/, qos/, be/, selection/)
    OUT/checkpoints/iter_NNNNNN RLlib checkpoints (`Algorithm.save_to_path`) + coloc.json (layout, iteration)
    OUT/checkpoints.sha256      the SHA-256 of every checkpoint file written (resume refuses others)
    OUT/policy.pt               the policy: of the imitated network and every checkpoint, the best on
                                validation episodes, or the mean of the `selection.average_best` best;
                                with `selection.rescore_best` > 1, the best of those few (and the mean)
                                on more episodes at the end of the session
                                (`agents.rllib.selection`; torch alone; spec `rl:OUT/policy.pt` or `rl:OUT`)
    OUT/networks/iter_NNNNNN.pt with `selection.average_best` or `rescore_best` > 1: the best networks
    OUT/policy_last.pt          the last checkpoint's network, exported the same way
    OUT/selection.json          every scored network's validation score and the one chosen
    OUT/eval/<scenario>/        `evaluate.py compare` output of the policy vs the baselines (summary.json, ...)
    OUT/eval/summary.md         every comparison table
    OUT/run.json                how the run was started (argv, Ray address, resources); at the end
                                also iterations, env steps, wall times and where things are
    OUT/demonstrations.npz      with `ppo.imitation_weight`: the warm start's labels PPO keeps
                                imitating (plain arrays; `--resume` gives them to the learner again)

Everything is validated before anything is created (config, output directory: somewhere a
directory can be made, and never the working directory with --overwrite; the checkpoint to resume,
its files against the run's SHA-256 manifest and its layout; the Ray cluster's CPUs); a bad input is
a `ConfigError` (exit 2). Files are written atomically (checkpoints are saved to a temporary
directory, recorded in `OUT/checkpoints.sha256` and renamed), so an interrupted run leaves complete
checkpoints to resume from and no half-written file.

Resume (`--resume DIR`, DIR = a run directory or one checkpoint): the latest complete checkpoint
restores the algorithm (weights, optimiser, iteration count) and training continues up to
`iterations`. Its network layout (algorithm, action mode, `max_apps`, width, feature layout) must
match the config, else a ConfigError says which differs. `--out` may be DIR itself (continue in
place) or a new directory.

The guard chain (`guards:` in the config, `env.guards.GuardsConfig`; clamp only by default) is
chosen once per run: the training env applies it to every action, the final comparison runs the
policy and the baselines under it, and the exported policy records it (`PolicyMeta.guards`), so
`serve.py` can say when it serves the policy under another chain.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from agents.policy import LAST_POLICY_FILE, POLICY_FILE, atomic_write_bytes
from agents.rllib.config import ResourcesConfig, TrainConfig, build_train_config, load_train_config, resolved
from agents.rllib.imitation import Demonstrations, EpisodeRunner, collect_demonstrations, pretrain
from agents.rllib.learner import DEMOS_FILE, keep_imitating, load_demonstrations, save_demonstrations
from agents.rllib.runtime import (
    CHECKPOINT_META,
    check_compatible,
    checkpoints_in,
    export_from_algo,
    find_checkpoint,
    module_state,
    net_from_module_state,
    quiet_ray_logs,
    save_checkpoint,
    set_module_weights,
    start_ray,
)
from agents.rllib.selection import Selection, adopt_last, describe, rescore, select
from env.config import ConfigError
from env.outdir import check_creatable, refuse_to_replace
from harness.compare import run_compare, summary_table
from harness.registry import factory_of, parse_specs
from harness.runs import load_scenario_arg


@dataclass(frozen=True)
class RunOptions:
    """Command-line options of a run (train.py's flags)."""

    out: Path
    ray_address: str | None = None
    num_env_runners: int | None = None
    resume: Path | None = None
    overwrite: bool = False
    argv: tuple[str, ...] = ()
    log: TextIO | None = None  # progress lines (default: stdout)

    def __post_init__(self) -> None:
        # absolute paths: RLlib's save_to_path/restore_from_path read a relative path as a URI
        # ("URI has empty scheme"), and Ray's workers do not share the driver's directory
        object.__setattr__(self, "out", Path(self.out).absolute())
        if self.resume is not None:
            object.__setattr__(self, "resume", Path(self.resume).absolute())


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from, with its iteration and env steps."""

    checkpoint: Path
    iteration: int
    env_steps: int


@dataclass(frozen=True)
class RunPlan:
    """Everything a run was validated to need before anything is created: the config, the options, the
    Ray resources and where it resumes from."""

    config: TrainConfig
    options: RunOptions
    resources: ResourcesConfig
    resume: ResumePoint | None
    in_place: bool  # resuming into the directory being resumed


@dataclass(frozen=True)
class TrainOutcome:
    """What a finished run produced."""

    out: Path
    policy: Path
    iterations: int
    env_steps: int
    wall_s: float  # this session's training wall time (without the final evaluation)
    eval_s: float
    evaluation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def plan_run(config: TrainConfig, options: RunOptions) -> RunPlan:
    """Validate a run without side effects (ConfigError on bad input)."""
    out = options.out
    res = config.resources
    if options.num_env_runners is not None:
        if options.num_env_runners < 0:
            raise ConfigError("--num-env-runners must be >= 0")
        res = dataclasses.replace(res, num_env_runners=options.num_env_runners)
    resume = None
    in_place = False
    if options.resume is not None:
        ckpt, meta = find_checkpoint(options.resume)
        check_compatible(config, meta, str(ckpt))
        it = int(meta.get("iteration", 0))
        if it >= config.iterations:
            raise ConfigError(
                f"--resume {ckpt}: already trained {it} iterations and the config asks for {config.iterations} "
                f"(raise it, e.g. --set iterations={it + 10})"
            )
        resume = ResumePoint(ckpt, it, int(meta.get("env_steps", 0)))
        in_place = out.resolve() == options.resume.resolve() or out.resolve() in ckpt.resolve().parents
        if config.algo == "ppo" and config.ppo.imitation_weight > 0 and not _demos_of(ckpt).is_file():
            raise ConfigError(
                f"--resume {ckpt}: ppo.imitation_weight keeps imitating the warm start's labels, and its run "
                f"has no {_demos_of(ckpt)} (trained without imitation_weight? set ppo.imitation_weight=0)"
            )
        if in_place and options.overwrite:
            raise ConfigError(
                "--overwrite would delete the run being resumed; drop it or choose another --out"
            )
    for key in ("baselines", "single_app_baselines"):
        specs = getattr(config.eval, key)
        if config.eval.enabled and specs:
            try:
                parse_specs(",".join(specs))
            except ConfigError as e:
                raise ConfigError(f"eval.{key}: {e}") from None
    if config.warm_start.teacher is not None and resume is None:
        try:
            parse_specs(config.warm_start.teacher)
        except ConfigError as e:
            raise ConfigError(f"warm_start.teacher: {e}") from None
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if not in_place and out.is_dir() and any(out.iterdir()):
        if not options.overwrite:
            raise ConfigError(
                f"--out {out}: exists and is not empty; pass --overwrite to replace it, or --resume {out} to continue it"
            )
        refuse_to_replace(out)
    check_creatable(out)
    return RunPlan(config, dataclasses.replace(options), res, resume, in_place)


PROGRESS_EVERY_S = 60.0  # the warm start's episode count, at most once a minute (and at the end)


def episode_progress(
    log: Callable[[str], None], what: str, every_s: float = PROGRESS_EVERY_S
) -> Callable[[int, int], None]:
    """A `progress(done, total)` for `collect_demonstrations` that logs "warm start: 37/100 episodes
    of WHAT (4m12s)" at most once every `every_s` and when the last episode is done (the first
    round of `full.yaml` runs for 10-15 minutes here)."""
    t0 = time.perf_counter()
    last = t0

    def progress(done: int, total: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if done == total or now - last >= every_s:
            last = now
            log(f"warm start: {done}/{total} episodes of {what} ({fmt_duration(now - t0)})")

    return progress


def warm_start(algo: Any, config: TrainConfig, log: Callable[[str], None], started: float) -> Demonstrations:
    """Imitate `warm_start.teacher`, then start RL from that network (agents.rllib.imitation).

    With a time budget (`max_train_minutes`, counted from `started`, a `time.perf_counter()` time),
    no DAgger round starts once `warm_start.dagger_budget_share` of it is spent: the rest is PPO's.
    On a slow day the first imitation alone can take most of a short budget (`make demo`'s 5
    minutes), and the rounds after it would leave PPO none."""
    import torch

    warm = config.warm_start
    t0 = time.perf_counter()
    dagger_until_s = (
        None
        if config.max_train_minutes is None
        else 60.0 * config.max_train_minutes * warm.dagger_budget_share
    )
    log(f"warm start: {warm.teacher} drives {warm.episodes} training episodes ...")
    assert warm.teacher is not None
    make_teacher = factory_of(warm.teacher)
    first = 10_000 + config.seed  # the episodes' seeds: DAgger replays them (`dagger_episodes: same`)
    with EpisodeRunner(warm.workers) as runner:  # its processes keep the teacher's caches between rounds
        demos = collect_demonstrations(
            config,
            warm,
            config.ppo.gamma,
            first,
            make_teacher,
            runner=runner,
            progress=episode_progress(log, "the first round"),
        )
        torch.manual_seed(config.seed)
        net = net_from_module_state(config.net_spec(), module_state(algo))
        net.train()
        stats = pretrain(net, demos, warm, seed=config.seed)
        for r in range(1, warm.dagger_rounds + 1):
            spent_s = time.perf_counter() - started
            if dagger_until_s is not None and spent_s >= dagger_until_s:
                skipped = f"round {r}" if r == warm.dagger_rounds else f"rounds {r}-{warm.dagger_rounds}"
                log(
                    f"warm start: {fmt_duration(spent_s)} of the {config.max_train_minutes:g}-min time budget spent "
                    f"({100 * warm.dagger_budget_share:.0f}% or more): skipping DAgger {skipped}, the rest is PPO's"
                )
                break
            log(
                f"warm start: DAgger round {r}/{warm.dagger_rounds} (accuracy so far {100 * stats.accuracy:.1f}%): "
                f"the network acts in {100 * warm.dagger_student_frac:.0f}% of the intervals, {warm.teacher} "
                f"labels ({warm.dagger_episodes} episodes) ..."
            )
            demos = demos + collect_demonstrations(
                config,
                warm,
                config.ppo.gamma,
                first if warm.dagger_episodes == "same" else first + 1_000 * r,
                make_teacher,
                net,
                warm.dagger_student_frac,
                runner=runner,
                progress=episode_progress(log, f"DAgger round {r}"),
            )
            stats = pretrain(net, demos, warm, seed=config.seed + r)
    set_module_weights(algo, net)
    log(
        f"warm start: {len(demos):,} decisions ({demos.moves:,} moves, {demos.unexpressed:,} not expressible); "
        f"imitation accuracy {100 * stats.accuracy:.1f}% (moves {100 * stats.move_accuracy:.1f}%"
        + (
            f", or {100 * stats.own_move_accuracy:.1f}% by the teacher's own move alone"
            if warm.labels == "options"
            else ""
        )
        + "), critic R2 "
        f"{stats.value_r2:.2f}; {fmt_duration(time.perf_counter() - t0)}"
    )
    return demos


def _keep_imitating(
    algo: Any,
    config: TrainConfig,
    out: Path,
    demos: Demonstrations | None,
    plan: RunPlan,
    log: Callable[[str], None],
) -> None:
    """With `ppo.imitation_weight`, give the learner the warm start's labels for PPO to keep
    imitating (`agents.rllib.learner`), kept in the run directory for `--resume`."""
    if config.algo != "ppo" or config.ppo.imitation_weight <= 0:
        return
    if demos is not None:
        arrays = demos.imitated()
    else:  # resumed: the labels of the warm start that run had (checked by plan_run)
        assert plan.resume is not None
        arrays = load_demonstrations(_demos_of(plan.resume.checkpoint))
    if demos is not None or not plan.in_place:
        save_demonstrations(out / DEMOS_FILE, *arrays)
    n = keep_imitating(algo, *arrays)
    log(
        f"PPO keeps imitating the warm start's {n:,} labels (imitation weight {config.ppo.imitation_weight:g})"
    )


def _demos_of(checkpoint: Path) -> Path:
    """The demonstrations file of the run a checkpoint belongs to (OUT/checkpoints/iter_N)."""
    return checkpoint.parent.parent / DEMOS_FILE


def write_run_json(out: Path, data: dict[str, Any]) -> None:
    """Write `OUT/run.json` (module docstring) atomically."""
    atomic_write_bytes(out / "run.json", (json.dumps(data, indent=2) + "\n").encode())


def write_yaml_atomic(path: Path, data: Any) -> None:
    """Write `data` as YAML to `path` atomically (the resolved config beside the run)."""
    atomic_write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())


def fmt_duration(seconds: float) -> str:
    """Seconds as `1h02m03s` or `2m03s` for progress lines; "?" when unknown."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def progress_line(
    iteration: int,
    total: int,
    env_steps: int,
    steps_per_s: float,
    scalars: dict[str, float],
    elapsed_s: float,
    eta_s: float,
) -> str:
    """`iter 12/100  49,152 steps (812/s)  return -35.2  QoS met 78.5%  BE 21.3%  2m31s, ETA 18m40s`."""

    def pct(key: str) -> str:
        v = scalars.get(key)
        return "  n/a" if v is None else f"{100 * v:5.1f}%"

    ret = scalars.get("train/episode_return_mean")
    return (
        f"iter {iteration}/{total}  {env_steps:,} steps ({steps_per_s:,.0f}/s)  "
        f"return {'n/a' if ret is None else f'{ret:8.1f}'}  QoS met {pct('qos/met_frac')}  "
        f"BE {pct('be/throughput_mean')}  {fmt_duration(elapsed_s)}, ETA {fmt_duration(eta_s)}"
    )


def eval_specs(policy: Path, config: TrainConfig, n_lc_apps: int) -> list[str]:
    """The controllers compared on a scenario with `n_lc_apps` LC apps: the policy, the baselines
    and, on a one-app scenario, the single-app baselines (`EvalConfig`)."""
    single = config.eval.single_app_baselines if n_lc_apps == 1 else ()
    return [f"rl:{policy}", *config.eval.baselines, *single]


def evaluate_policy(
    policy: Path, config: TrainConfig, out: Path, argv: Sequence[str], log: Callable[[str], None]
) -> dict[str, list[dict[str, Any]]]:
    """`evaluate.py compare` of `rl:policy` and the baselines on each `eval.scenarios`, into
    `out/<scenario>/`, tables printed and gathered in `out/summary.md`."""
    workers = config.eval.workers
    results: dict[str, list[dict[str, Any]]] = {}
    tables = ["# Trained policy vs baselines", ""]
    for name in config.eval.scenarios:
        scenario, path = load_scenario_arg(name)
        specs = eval_specs(policy, config, n_lc_apps=len(scenario.apps))
        log(f"evaluate: {', '.join(specs)} on {scenario.name}, {config.eval.seeds} seed(s)")
        rows = run_compare(
            scenario,
            path,
            specs,
            config.eval.seeds,
            out / scenario.name,
            workers=workers,
            guards=config.guards,
            overwrite=True,
            argv=list(argv),
        )
        table = summary_table(rows, specs)
        log(table)
        results[scenario.name] = rows
        tables += [f"## {scenario.name}", "", scenario.description, "", table, ""]
    atomic_write_bytes(out / "summary.md", "\n".join(tables).encode())
    return results


def train(config: TrainConfig, options: RunOptions) -> TrainOutcome:
    """Run (or resume) training as planned; returns where the policy is (module docstring)."""
    plan = plan_run(config, options)
    stream = options.log or sys.stdout

    def log(text: str) -> None:
        print(text, file=stream, flush=True)

    import torch

    threads = torch.get_num_threads()
    if plan.resources.driver_torch_threads is not None:
        torch.set_num_threads(plan.resources.driver_torch_threads)
    started = start_ray(options.ray_address, plan.resources)
    algo = None
    try:
        from agents.rllib.algos import build_algo_config
        from agents.rllib.callbacks import tensorboard_scalars

        # a resumed run seeds its envs afresh (seed + iteration), so it does not replay the scenarios
        # of the first iterations
        seed = config.seed + (plan.resume.iteration if plan.resume else 0)
        res = plan.resources
        log(
            f"train: {config.algo} {config.env.action_mode} max_apps={config.env.max_apps}, {config.iterations} "
            f"iterations; {res.num_env_runners} env runner(s) x {res.num_envs_per_env_runner} simulated nodes on "
            f"{options.ray_address or 'a local Ray session'}; output {options.out}"
        )
        run_info = {
            "argv": list(options.argv),
            "ray_address": options.ray_address,
            "resources": dataclasses.asdict(plan.resources),
            "resumed_from": str(plan.resume.checkpoint) if plan.resume else None,
        }
        t_setup = time.perf_counter()
        demos: Demonstrations | None = None
        algo = build_algo_config(dataclasses.replace(config, seed=seed), plan.resources).build_algo()
        first = 0
        steps_offset = 0
        if plan.resume is not None:
            try:
                algo.restore_from_path(str(plan.resume.checkpoint))
            except Exception as e:  # RLlib raises many kinds on a damaged checkpoint
                raise ConfigError(
                    f"--resume {plan.resume.checkpoint}: cannot restore ({type(e).__name__}: {e})"
                ) from None
            first = plan.resume.iteration
            steps_offset = plan.resume.env_steps
            log(f"resumed from {plan.resume.checkpoint} (iteration {first}, {steps_offset:,} env steps)")
        elif config.warm_start.teacher is not None:
            demos = warm_start(algo, config, log, started=t_setup)
        warm_s = time.perf_counter() - t_setup
        out = options.out
        if out.exists() and options.overwrite and not plan.in_place:
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(out / "config.yaml", resolved(config))
        write_run_json(out, {"status": "training", **run_info})
        _keep_imitating(algo, config, out, demos, plan, log)
        deadline = None if config.max_train_minutes is None else t_setup + 60.0 * config.max_train_minutes
        selection = None
        if config.selection.episodes > 0:
            n = config.selection.episodes
            selection = Selection.load(out, n) if plan.in_place else Selection(n)
        if selection is None or not selection.scores:  # the network PPO starts from is a candidate too
            export_from_algo(algo, config, out / LAST_POLICY_FILE, first, steps_offset)
            _select_exported(config, out, first, selection, log)
        outcome = _loop(algo, config, out, first, steps_offset, log, tensorboard_scalars, deadline, selection)
    finally:
        if algo is not None:
            algo.stop()
        if started:
            import ray

            ray.shutdown()
        torch.set_num_threads(threads)
    iterations, env_steps, loop_s = outcome
    t0 = time.perf_counter()
    if selection is not None and config.selection.rescore_best > 1:
        rescore(config, out, selection, log)
    rescore_s = time.perf_counter() - t0
    wall_s = warm_s + loop_s + rescore_s
    evaluation: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    if config.eval.enabled:
        evaluation = evaluate_policy(out / POLICY_FILE, config, out / "eval", options.argv, log)
    eval_s = time.perf_counter() - t0
    result = TrainOutcome(out, out / POLICY_FILE, iterations, env_steps, wall_s, eval_s, evaluation)
    summary = {
        "status": "done",
        **run_info,
        "iterations": iterations,
        "env_steps": env_steps,
        "train_wall_s": round(wall_s, 1),
        "setup_and_warm_start_s": round(warm_s, 1),
        "rescore_wall_s": round(rescore_s, 1),
        "eval_wall_s": round(eval_s, 1),
        "policy": str(result.policy),
        "policy_iteration": None if selection is None else selection.policy_iteration,
        "policy_averaged_iterations": [] if selection is None else selection.policy_averaged,
        "checkpoints": [str(p) for p in checkpoints_in(out)],
        "evaluation": {k: str(out / "eval" / k / "summary.json") for k in evaluation},
    }
    write_run_json(out, summary)
    log(
        f"trained {iterations} iterations, {env_steps:,} env steps in {fmt_duration(wall_s)}; policy: {result.policy}"
    )
    if evaluation:
        log(
            f"comparison with the baselines: {out / 'eval' / 'summary.md'} (and eval/<scenario>/summary.json)"
        )
    return result


def _select_exported(
    config: TrainConfig,
    out: Path,
    iteration: int,
    selection: Selection | None,
    log: Callable[[str], None],
) -> dict[str, float]:
    """Let the selection decide whether the network just exported as
    `OUT/policy_last.pt` becomes `OUT/policy.pt` (`agents.rllib.selection`); its validation
    scalars for TensorBoard (none without a selection: the last network is the policy)."""
    if selection is None:
        adopt_last(out)
        return {}
    score = select(config, out, iteration, selection)
    policy_iteration = selection.policy_iteration
    assert policy_iteration is not None  # `score` was just added
    log(describe(score, selection))
    return {
        "selection/reward_per_interval": score.reward_per_interval,
        "selection/qos_met": score.qos_met,
        "selection/be_throughput": score.be_throughput,
        "selection/policy_iteration": float(policy_iteration),
    }


def _loop(
    algo: Any,
    config: TrainConfig,
    out: Path,
    first: int,
    steps_offset: int,
    log: Callable[[str], None],
    scalars_of: Callable[[dict[str, Any]], dict[str, float]],
    deadline: float | None = None,
    selection: Selection | None = None,
) -> tuple[int, int, float]:
    """Iterate until `config.iterations`, or until the next iteration would end after `deadline`
    (`time.perf_counter()` time; `max_train_minutes`); checkpoint on schedule and at the end, each
    checkpoint's network scored by `selection` (None: the last is the policy)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(out / "tb"))
    t0 = time.perf_counter()
    iteration, env_steps, saved = first, steps_offset, first
    try:
        with (out / "progress.jsonl").open("a") as progress:
            while iteration < config.iterations:
                t_iter = time.perf_counter()
                result = algo.train()
                iteration += 1
                scalars = scalars_of(result)
                lifetime = int(scalars.get("train/env_steps", 0))  # RLlib restores it on resume
                env_steps = lifetime if lifetime >= steps_offset else steps_offset + lifetime
                now = time.perf_counter()
                elapsed = now - t0
                per_iter = elapsed / (iteration - first)
                remaining = config.iterations - iteration
                eta = per_iter * remaining
                out_of_time = deadline is not None and remaining > 0 and now + per_iter > deadline
                if deadline is not None:
                    eta = min(eta, max(0.0, deadline - now))
                rate = (env_steps - steps_offset) / elapsed if elapsed > 0 else 0.0
                scalars["train/iteration_s"] = now - t_iter
                scalars["train/env_steps_per_s"] = rate
                scalars["train/env_steps"] = float(env_steps)
                log(progress_line(iteration, config.iterations, env_steps, rate, scalars, elapsed, eta))
                if iteration % config.checkpoint_every == 0 or iteration == config.iterations or out_of_time:
                    save_checkpoint(algo, config, out, iteration, env_steps)
                    saved = iteration
                    scalars.update(_select_exported(config, out, iteration, selection, log))
                for tag, value in scalars.items():
                    writer.add_scalar(tag, value, iteration)
                writer.flush()
                record = {
                    "iteration": iteration,
                    "env_steps": env_steps,
                    "wall_s": round(elapsed, 2),
                    **scalars,
                }
                progress.write(json.dumps(record) + "\n")
                progress.flush()
                if out_of_time:
                    log(
                        f"time budget of {config.max_train_minutes:g} min reached: stopping after {iteration} of "
                        f"{config.iterations} iterations (continue with --resume {out})"
                    )
                    break
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (Ray's driver handler exits)
        if iteration > saved:
            save_checkpoint(algo, config, out, iteration, env_steps)
            if selection is None:  # the last network is the policy (no time to score it now)
                adopt_last(out)
            log(f"interrupted: checkpoint of iteration {iteration} saved; continue with --resume {out}")
        raise
    finally:
        writer.close()
    return iteration, env_steps, time.perf_counter() - t0


def load_config_for(config: str | Path | None, overrides: Sequence[str], resume: Path | None) -> TrainConfig:
    """The run's config: `config` (a configs/train name or path) with overrides; when resuming
    without one, the config the checkpoint was trained with (saved in its coloc.json)."""
    if config is not None:
        return load_train_config(config, overrides)
    if resume is None:
        raise ConfigError("--config is required (unless --resume names a run, whose config is reused)")
    ckpt, meta = find_checkpoint(resume)
    data = meta.get("config")
    if not isinstance(data, dict):
        raise ConfigError(f"--resume {ckpt}: {CHECKPOINT_META} holds no config; pass --config")
    return build_train_config(data, overrides, where=f"{ckpt / CHECKPOINT_META}:config")


def run_training(
    *,
    config: str | Path | None,
    overrides: Sequence[str],
    out: Path,
    ray_address: str | None = None,
    num_env_runners: int | None = None,
    resume: Path | None = None,
    overwrite: bool = False,
    verbose: bool = False,
    argv: Sequence[str] = (),
) -> TrainOutcome:
    """`train.py` (its --help): load the config (or the resumed run's), plan and run."""
    if not verbose:  # the progress lines are the output; Ray's INFO/WARNING chatter buries them
        quiet_ray_logs()
    options = RunOptions(
        out=out,
        ray_address=ray_address,
        num_env_runners=num_env_runners,
        resume=resume,
        overwrite=overwrite,
        argv=tuple(argv),
    )
    return train(load_config_for(config, overrides, resume), options)
