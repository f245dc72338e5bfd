"""A training run: RLlib iterations, TensorBoard, checkpoints, resume, export and the final
comparison with the baselines. `train.py` is a thin CLI over `train`; `make demo` is
`train.py --config demo` (configs/train/demo.yaml: a short run, then every baseline).

Run directory (`--out OUT`):

    OUT/config.yaml             the resolved config (runs again with `--config OUT/config.yaml`)
    OUT/progress.jsonl          one line per iteration: iteration, env steps, wall time, the scalars below
    OUT/tb/                     TensorBoard event files (tags train/, qos/, be/)
    OUT/checkpoints/iter_NNNNNN RLlib checkpoints (`Algorithm.save_to_path`) + coloc.json (layout, iteration)
    OUT/policy.pt               the exported policy (torch alone; spec `rl:OUT/policy.pt` or `rl:OUT`)
    OUT/eval/<scenario>/        `evaluate.py compare` output of the policy vs the baselines (summary.json, ...)
    OUT/eval/summary.md         every comparison table
    OUT/run.json                how the run was started (argv, Ray address, resources); at the end
                                also iterations, env steps, wall times and where things are

Everything is validated before anything is created (config, output directory, the checkpoint to
resume and its layout, the Ray cluster's CPUs); a bad input is a `ConfigError` (exit 2). Files are
written atomically (checkpoints are saved to a temporary directory and renamed), so an interrupted
run leaves complete checkpoints to resume from and no half-written file.

Resume (`--resume DIR`, DIR = a run directory or one checkpoint): the latest complete checkpoint
restores the algorithm (weights, optimiser, iteration count) and training continues up to
`iterations`. Its network layout (algorithm, action mode, `max_apps`, width, feature layout) must
match the config, else a ConfigError says which differs. `--out` may be DIR itself (continue in
place) or a new directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from agents.policy import (
    POLICY_FILE,
    ColocNet,
    NetSpec,
    PolicyMeta,
    atomic_write_bytes,
    check_layout,
    export_policy,
    feature_layout,
)
from agents.rllib.config import ResourcesConfig, TrainConfig, build_train_config, load_train_config, resolved
from env.config import ConfigError

CHECKPOINT_META = "coloc.json"
CHECKPOINT_FORMAT = "coloc-rllib-checkpoint"
RL_REGISTRY_ENTRY = (
    "agents.policy:make",
    "a trained RL policy (train.py): PATH = OUT/policy.pt or the run dir OUT",
)


# ---- plan: everything validated before anything is created -------------------------------------------
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
    checkpoint: Path
    iteration: int
    env_steps: int


@dataclass(frozen=True)
class RunPlan:
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


def checkpoint_meta(config: TrainConfig, iteration: int, env_steps: int) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "algo": config.algo,
        "net": dataclasses.asdict(config.net_spec()),
        "feature_layout": feature_layout(),
        "iteration": iteration,
        "env_steps": env_steps,
        "config": resolved(config),
    }


def _read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        meta = json.loads((ckpt / CHECKPOINT_META).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"--resume {ckpt}: unreadable {CHECKPOINT_META} ({e}); the checkpoint is damaged"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"--resume {ckpt}: {CHECKPOINT_META} is not a coloc checkpoint description")
    return meta


def checkpoints_in(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run directory (with their metadata), oldest first."""
    return sorted(
        p for p in (run_dir / "checkpoints").glob("iter_*") if p.is_dir() and (p / CHECKPOINT_META).is_file()
    )


# RLlib restores whatever components a checkpoint holds and silently skips missing ones (a
# checkpoint without its learner state would resume with untrained weights): check they are there
CHECKPOINT_FILES = (
    "rllib_checkpoint.json",
    "algorithm_state.pkl",
    "learner_group/learner/rl_module/default_policy/module_state.pkl",
)


def find_checkpoint(path: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume: `path` itself, or the latest complete one of the run `path`."""
    if not path.is_dir():
        raise ConfigError(f"--resume {path}: no such directory")
    if (path / CHECKPOINT_META).is_file():
        ckpt = path
    else:
        found = checkpoints_in(path)
        if not found:
            raise ConfigError(
                f"--resume {path}: no checkpoint found (expected {path}/checkpoints/iter_*/{CHECKPOINT_META})"
            )
        ckpt = found[-1]
    meta = _read_meta(ckpt)
    missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
    if missing:
        raise ConfigError(f"--resume {ckpt}: damaged checkpoint, missing {missing}")
    return ckpt, meta


def check_compatible(config: TrainConfig, meta: dict[str, Any], where: str) -> None:
    """ConfigError unless the checkpoint's algorithm and network layout are the config's."""
    if meta.get("algo") != config.algo:
        raise ConfigError(
            f"{where}: the checkpoint was trained with algo {meta.get('algo')!r}, the config says {config.algo!r}"
        )
    try:
        saved = NetSpec(**meta["net"])
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{where}: bad network description in {CHECKPOINT_META} ({e})") from None
    want = config.net_spec()
    check_layout(saved, want.action_mode, want.max_apps, where)
    for key in ("hidden_units", "pressure_mask"):
        if getattr(saved, key) != getattr(want, key):
            raise ConfigError(
                f"{where}: the checkpoint's network has model.{key}={getattr(saved, key)}, the config "
                f"{getattr(want, key)}"
            )
    if meta.get("feature_layout") != feature_layout():
        raise ConfigError(
            f"{where}: the checkpoint was trained on another observation layout (env.features changed)"
        )


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
        if in_place and options.overwrite:
            raise ConfigError(
                "--overwrite would delete the run being resumed; drop it or choose another --out"
            )
    from env.evaluation import parse_specs_arg

    for key in ("baselines", "single_app_baselines"):
        specs = getattr(config.eval, key)
        if config.eval.enabled and specs:
            try:
                parse_specs_arg(",".join(specs))
            except ConfigError as e:
                raise ConfigError(f"eval.{key}: {e}") from None
    if config.warm_start.teacher is not None and resume is None:
        try:
            parse_specs_arg(config.warm_start.teacher)
        except ConfigError as e:
            raise ConfigError(f"warm_start.teacher: {e}") from None
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if not in_place and out.is_dir() and any(out.iterdir()) and not options.overwrite:
        raise ConfigError(
            f"--out {out}: exists and is not empty; pass --overwrite to replace it, or --resume {out} to continue it"
        )
    return RunPlan(config, dataclasses.replace(options), res, resume, in_place)


# ---- Ray ------------------------------------------------------------------------------------------------
def start_ray(plan: RunPlan) -> bool:
    """Join `--ray-address` or start a local session; True when this call started Ray (and must
    stop it). Checks the cluster has the CPUs the env runners ask for (else RLlib would wait)."""
    import ray

    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if plan.options.ray_address:
            check_reachable(plan.options.ray_address)
        try:
            if plan.options.ray_address:
                use_token_auth_if_available()
                ray.init(address=plan.options.ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=plan.resources.local_num_cpus, **kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = plan.options.ray_address or "a local session"
            raise ConfigError(
                f"--ray-address: cannot start or join Ray at {where}: {e} (is `ray start --head` running there? "
                "a cluster with token authentication needs its token: RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            ) from None
        started = True
    res = plan.resources
    need = res.num_env_runners * res.num_cpus_per_env_runner + res.num_learners * res.num_cpus_per_learner
    have = float(ray.cluster_resources().get("CPU", 0.0))
    if need > have:
        if started:
            ray.shutdown()
        raise ConfigError(
            f"the env runners and learners need {need:g} CPUs; the Ray cluster has {have:g} "
            "(lower resources.num_env_runners / --num-env-runners, or add nodes / resources.local_num_cpus)"
        )
    return started


def quiet_ray_logs() -> None:
    """Show only errors from Ray's and RLlib's loggers in this process (the CLI's default: the
    progress lines are the output). Ray sets its loggers up when imported, so import it first."""
    import ray  # noqa: F401 - configures the "ray" loggers, which this then quiets

    for name in ("ray", "ray.rllib", "ray.tune", "ray._common", "ray._private"):
        logging.getLogger(name).setLevel(logging.ERROR)


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConfigError at once when nothing listens at `HOST:PORT` (or `ray://HOST:PORT`): Ray itself
    keeps retrying an unreachable GCS for many minutes. `auto` (find a local cluster) is not checked."""
    hostport = address.split("://", 1)[-1]
    if hostport == "auto":
        return
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT (e.g. 10.0.0.1:6379) or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            f"--ray-address {address}: nothing answers there ({e}); start the head with `ray start --head --port={port}`"
        ) from None


def use_token_auth_if_available() -> None:
    """Clusters started with `ray start --head` use token authentication by default, but
    `ray.init(address=...)` only sends a token in token mode: turn it on when a token is at hand
    (RAY_AUTH_TOKEN, or ~/.ray/auth_token copied from the head) and RAY_AUTH_MODE is unset. A
    cluster without authentication accepts such a client too."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


# ---- checkpoints and export -----------------------------------------------------------------------------
def module_state(algo: Any) -> dict[str, Any]:
    """The learner's RLModule weights (numpy), whether the learner is local or remote."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    comp = f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}"
    state = algo.learner_group.get_state(components=comp, inference_only=True)
    return state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]


def net_from_module_state(spec: NetSpec, state: dict[str, Any]) -> ColocNet:
    """A `ColocNet` holding the `net.*` weights of an RLModule state."""
    import numpy as np
    import torch

    net = ColocNet(spec)
    weights = {
        k[len("net.") :]: torch.as_tensor(np.asarray(v)) for k, v in state.items() if k.startswith("net.")
    }
    net.load_state_dict(weights, strict=True)
    net.eval()
    return net


def export_from_algo(algo: Any, config: TrainConfig, path: Path, iteration: int, env_steps: int) -> Path:
    spec = config.net_spec()
    net = net_from_module_state(spec, module_state(algo))
    meta = PolicyMeta(spec, config.env.features, feature_layout(), config.algo, iteration, env_steps)
    return export_policy(path, net, meta)


def save_checkpoint(algo: Any, config: TrainConfig, out: Path, iteration: int, env_steps: int) -> Path:
    """`OUT/checkpoints/iter_NNNNNN` (saved under a temporary name, then renamed), the exported
    `OUT/policy.pt`, and only the newest `keep_checkpoints` checkpoints kept."""
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        algo.save_to_path(str(tmp))
        (tmp / CHECKPOINT_META).write_text(
            json.dumps(checkpoint_meta(config, iteration, env_steps), indent=2) + "\n"
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    export_from_algo(algo, config, out / POLICY_FILE, iteration, env_steps)
    for old in checkpoints_in(out)[: -config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def set_module_weights(algo: Any, net: ColocNet) -> None:
    """Load `net`'s weights into the learner's RLModule and sync them to the env runners."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    weights = {f"net.{k}": v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    current = module_state(algo)
    missing = sorted(set(weights) - set(current))
    if missing:
        raise RuntimeError(f"the RLModule has no parameters {missing[:3]}...; network layouts differ")
    algo.learner_group.set_state({COMPONENT_LEARNER: {COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: weights}}})
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)


def warm_start(algo: Any, config: TrainConfig, log: Callable[[str], None]) -> None:
    """Imitate `warm_start.teacher`, then start RL from that network (agents.rllib.imitation)."""
    import torch

    from agents.rllib.imitation import collect_demonstrations, pretrain

    warm = config.warm_start
    t0 = time.perf_counter()
    log(f"warm start: {warm.teacher} drives {warm.episodes} training episodes ...")
    demos = collect_demonstrations(config, warm, config.ppo.gamma, seed=10_000 + config.seed)
    torch.manual_seed(config.seed)
    net = net_from_module_state(config.net_spec(), module_state(algo))
    net.train()
    stats = pretrain(net, demos, warm, seed=config.seed)
    for r in range(1, warm.dagger_rounds + 1):
        log(
            f"warm start: DAgger round {r}/{warm.dagger_rounds} (accuracy so far {100 * stats.accuracy:.1f}%): "
            f"the network acts in {100 * warm.dagger_student_frac:.0f}% of the intervals, {warm.teacher} labels ..."
        )
        demos = demos + collect_demonstrations(
            config, warm, config.ppo.gamma, 10_000 + config.seed + 1_000 * r, net, warm.dagger_student_frac
        )
        stats = pretrain(net, demos, warm, seed=config.seed + r)
    set_module_weights(algo, net)
    log(
        f"warm start: {len(demos):,} decisions ({demos.moves:,} moves, {demos.unexpressed:,} not expressible); "
        f"imitation accuracy {100 * stats.accuracy:.1f}% (moves {100 * stats.move_accuracy:.1f}%), critic R2 "
        f"{stats.value_r2:.2f}; {fmt_duration(time.perf_counter() - t0)}"
    )


def write_run_json(out: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(out / "run.json", (json.dumps(data, indent=2) + "\n").encode())


def write_yaml_atomic(path: Path, data: Any) -> None:
    atomic_write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())


# ---- progress -------------------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
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


# ---- the registry entry rl:PATH ---------------------------------------------------------------------
def ensure_rl_registered() -> bool:
    """Make the controller spec `rl:PATH` resolvable in this process. True when the registry
    already has it (then spawned evaluation workers have it too); False when it was added here,
    in-process only (then the evaluation runs in this process: workers = 1)."""
    from baselines import registry

    if "rl" in registry.REGISTRY:
        return True
    factory, help_text = RL_REGISTRY_ENTRY
    registry.REGISTRY["rl"] = registry.Entry(factory, help_text, arg="PATH", contract_spec=None)
    return False


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
    from env.evaluation import load_scenario_arg, run_compare, summary_table
    from env.guards import GuardsConfig

    native = ensure_rl_registered()
    workers = config.eval.workers if native else 1
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
            guards=GuardsConfig(),
            overwrite=True,
            argv=list(argv),
        )
        table = summary_table(rows, specs)
        log(table)
        results[scenario.name] = rows
        tables += [f"## {scenario.name}", "", scenario.description, "", table, ""]
    atomic_write_bytes(out / "summary.md", "\n".join(tables).encode())
    return results


# ---- the run ---------------------------------------------------------------------------------------------
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
    started = start_ray(plan)
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
            warm_start(algo, config, log)
        warm_s = time.perf_counter() - t_setup
        out = options.out
        if out.exists() and options.overwrite and not plan.in_place:
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(out / "config.yaml", resolved(config))
        write_run_json(out, {"status": "training", **run_info})
        deadline = None if config.max_train_minutes is None else t_setup + 60.0 * config.max_train_minutes
        outcome = _loop(algo, config, out, first, steps_offset, log, tensorboard_scalars, deadline)
    finally:
        if algo is not None:
            algo.stop()
        if started:
            import ray

            ray.shutdown()
        torch.set_num_threads(threads)
    iterations, env_steps, loop_s = outcome
    wall_s = warm_s + loop_s
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
        "eval_wall_s": round(eval_s, 1),
        "policy": str(result.policy),
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


def _loop(
    algo: Any,
    config: TrainConfig,
    out: Path,
    first: int,
    steps_offset: int,
    log: Callable[[str], None],
    scalars_of: Callable[[dict[str, Any]], dict[str, float]],
    deadline: float | None = None,
) -> tuple[int, int, float]:
    """Iterate until `config.iterations`, or until the next iteration would end after `deadline`
    (`time.perf_counter()` time; `max_train_minutes`); checkpoint on schedule and at the end."""
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
                log(progress_line(iteration, config.iterations, env_steps, rate, scalars, elapsed, eta))
                if iteration % config.checkpoint_every == 0 or iteration == config.iterations or out_of_time:
                    save_checkpoint(algo, config, out, iteration, env_steps)
                    saved = iteration
                if out_of_time:
                    log(
                        f"time budget of {config.max_train_minutes:g} min reached: stopping after {iteration} of "
                        f"{config.iterations} iterations (continue with --resume {out})"
                    )
                    break
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (Ray's driver handler exits)
        if iteration > saved:
            save_checkpoint(algo, config, out, iteration, env_steps)
            log(f"interrupted: checkpoint of iteration {iteration} saved; continue with --resume {out}")
        raise
    finally:
        writer.close()
    return iteration, env_steps, time.perf_counter() - t0


# ---- entry points for other tools ------------------------------------------------------------------------
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
