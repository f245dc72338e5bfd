"""The RLlib side of a training run: the Ray session, checkpoints (save, find, check against the
config), and moving weights between an RLlib algorithm and the torch-only `ColocNet` that
`agents.policy` exports and serves. The run itself (planning, the iteration loop, the warm start,
the final comparison with the baselines) is driven from `harness.training`.

Checkpoint directory (`OUT/checkpoints/iter_NNNNNN`): RLlib's `Algorithm.save_to_path` output plus
`coloc.json` (format, algorithm, network layout, feature layout, iteration, env steps and the
resolved config), saved under a temporary name and renamed, so a checkpoint is complete or absent.

RLlib's checkpoints are pickles: restoring one runs whatever code it names, so a checkpoint must be
trusted like code. The run directory holds the SHA-256 of every checkpoint file train.py wrote
(`OUT/checkpoints.sha256`, recorded before the checkpoint is renamed into place, in `sha256sum`'s
format), and `find_checkpoint` refuses a checkpoint with a file that is missing from it, differs
from it or is not a regular file, naming the file, before anything is unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from agents.policy import (
    LAST_POLICY_FILE,
    ColocNet,
    NetSpec,
    PolicyMeta,
    atomic_write_bytes,
    check_layout,
    export_policy,
    feature_layout,
)
from agents.rllib.config import ResourcesConfig, TrainConfig, resolved
from env.config import ConfigError

CHECKPOINT_META = "coloc.json"
CHECKPOINT_FORMAT = "coloc-rllib-checkpoint"
MANIFEST = "checkpoints.sha256"  # in the run directory; `sha256sum -c checkpoints.sha256` checks it too


def checkpoint_meta(config: TrainConfig, iteration: int, env_steps: int) -> dict[str, Any]:
    """The `coloc.json` of a checkpoint (module docstring): what `check_compatible` compares on resume."""
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
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
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
    """The checkpoint to resume: `path` itself, or the latest complete one of the run `path`,
    checked against its run's manifest (`verify_checkpoint`) before anything in it is read."""
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
    verify_checkpoint(ckpt)
    meta = _read_meta(ckpt)
    missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
    if missing:
        raise ConfigError(f"--resume {ckpt}: damaged checkpoint, missing {missing}")
    return ckpt, meta


# ---- the manifest of checkpoint files (module docstring) ------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(run_dir: Path) -> dict[str, str]:
    """The run's manifest: path relative to `run_dir` -> SHA-256 ({} when there is none)."""
    path = run_dir / MANIFEST
    if not path.is_file():
        return {}
    out = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable ({e})") from None
    for i, line in enumerate(lines, start=1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise ConfigError(f"{path}:{i}: not a `SHA256  PATH` line")
        out[rel] = digest
    return out


def _write_manifest(run_dir: Path, entries: dict[str, str]) -> None:
    text = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(entries.items()))
    atomic_write_bytes(run_dir / MANIFEST, text.encode())


def _checkpoint_of(rel: str) -> str:
    return rel.split("/")[1] if rel.startswith("checkpoints/") and rel.count("/") >= 2 else ""


def record_checkpoint(run_dir: Path, name: str, files: Path) -> None:
    """Record the SHA-256 of every file under `files` as checkpoint `name` of `run_dir` (before
    `files` is renamed to `run_dir/checkpoints/name`); entries of checkpoints no longer in the run
    are dropped."""
    entries = {rel: digest for rel, digest in _present(run_dir).items() if _checkpoint_of(rel) != name}
    for f in sorted(files.rglob("*")):
        if f.is_file():
            entries[f"checkpoints/{name}/{f.relative_to(files).as_posix()}"] = _sha256(f)
    _write_manifest(run_dir, entries)


def _present(run_dir: Path) -> dict[str, str]:
    """The manifest's entries of the checkpoints still in the run directory."""
    return {
        rel: digest
        for rel, digest in read_manifest(run_dir).items()
        if _checkpoint_of(rel) and (run_dir / "checkpoints" / _checkpoint_of(rel)).is_dir()
    }


def verify_checkpoint(ckpt: Path) -> None:
    """ConfigError unless every file of checkpoint `ckpt` is a regular file recorded with its SHA-256
    in its run's manifest, and every recorded file is there (module docstring: why)."""
    run_dir = ckpt.parent.parent
    trust = (
        "a checkpoint is unpickled when it is resumed, so it runs code: resume only from checkpoints you "
        "trust (written by your own train.py)"
    )
    if ckpt.parent.name != "checkpoints" or not (run_dir / MANIFEST).is_file():
        raise ConfigError(
            f"--resume {ckpt}: no {MANIFEST} beside its checkpoints/, so its files cannot be checked against "
            f"what train.py wrote; {trust}. If you trust it, record it: cd {run_dir} && find checkpoints "
            f"-type f -exec sha256sum {{}} + > {MANIFEST}"
        )
    recorded = {k: v for k, v in read_manifest(run_dir).items() if _checkpoint_of(k) == ckpt.name}
    for f in sorted(ckpt.rglob("*")):
        rel = f.relative_to(run_dir).as_posix()
        if f.is_symlink() or not (f.is_file() or f.is_dir()):
            raise ConfigError(f"--resume {ckpt}: {rel} is not a regular file; {trust}")
        if f.is_dir():
            continue
        if rel not in recorded:
            raise ConfigError(f"--resume {ckpt}: {rel} is not in {run_dir / MANIFEST} (added later); {trust}")
        if _sha256(f) != recorded.pop(rel):
            raise ConfigError(
                f"--resume {ckpt}: {rel} does not match its SHA-256 in {run_dir / MANIFEST} (changed after "
                f"train.py wrote it); {trust}"
            )
    if recorded:
        raise ConfigError(f"--resume {ckpt}: {sorted(recorded)[0]} is missing; the checkpoint is damaged")


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
    for key in (f.name for f in dataclasses.fields(NetSpec)):
        if key in ("action_mode", "max_apps", "with_value"):
            continue  # checked above: check_layout, and the algorithm (a critic for PPO)
        if getattr(saved, key) != getattr(want, key):
            raise ConfigError(
                f"{where}: the checkpoint's network has model.{key}={getattr(saved, key)}, the config "
                f"{getattr(want, key)}"
            )
    if meta.get("feature_layout") != feature_layout():
        raise ConfigError(
            f"{where}: the checkpoint was trained on another observation layout (env.features changed)"
        )


def start_ray(ray_address: str | None, resources: ResourcesConfig) -> bool:
    """Join `--ray-address` or start a local session; True when this call started Ray (and must
    stop it). Checks the cluster has the CPUs the env runners ask for (else RLlib would wait)."""
    import ray

    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if ray_address:
            check_reachable(ray_address)
        try:
            if ray_address:
                use_token_auth_if_available()
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=resources.local_num_cpus, **kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = ray_address or "a local session"
            raise ConfigError(
                f"--ray-address: cannot start or join Ray at {where}: {e} (is `ray start --head` running there? "
                "a cluster with token authentication needs its token: RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            ) from None
        started = True
    res = resources
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
    """Export the algorithm's current weights as a torch-only policy (`agents.policy`) at `path`."""
    spec = config.net_spec()
    net = net_from_module_state(spec, module_state(algo))
    meta = PolicyMeta(
        spec, config.env.features, feature_layout(), config.algo, iteration, env_steps, guards=config.guards
    )
    return export_policy(path, net, meta)


def save_checkpoint(algo: Any, config: TrainConfig, out: Path, iteration: int, env_steps: int) -> Path:
    """`OUT/checkpoints/iter_NNNNNN` (saved under a temporary name, its files recorded in the
    manifest, then renamed), its network exported as `OUT/policy_last.pt` (which network becomes
    `OUT/policy.pt` is `agents.rllib.selection`'s call), and only the newest `keep_checkpoints`
    checkpoints kept."""
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        algo.save_to_path(str(tmp))
        (tmp / CHECKPOINT_META).write_text(
            json.dumps(checkpoint_meta(config, iteration, env_steps), indent=2) + "\n"
        )
        record_checkpoint(out, final.name, tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    export_from_algo(algo, config, out / LAST_POLICY_FILE, iteration, env_steps)
    for old in checkpoints_in(out)[: -config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    _write_manifest(out, _present(out))
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
