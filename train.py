#!/usr/bin/env python
"""train.py: train an RL resource manager in simulation with RLlib (DESIGN §1, use 1).

The policy is one network for any mix of up to env.max_apps LC apps (agents/policy.py), trained
with PPO (action modes single and per_app) or DQN (single) on random mixes of 1..6 apps, loads and
load traces drawn by the scenario sampler (held-out mixes excluded), with the apps' physical
parameters perturbed every episode (domain randomisation), optionally after imitating PARTIES
(warm_start). At the end the trained policy is compared with the baselines (PARTIES) on held-out
scenarios, as `evaluate.py compare` does.

  train.py --config demo --out runs/demo                      # a few minutes (configs/train/demo.yaml)
  train.py --config full --out runs/full                      # the full-length run (<= 30 min here)
  train.py --config ppo-single --out runs/ppo --set ppo.lr=1e-4   # --set KEY=VALUE, validated
  train.py --resume runs/full --out runs/full --set iterations=400 --set max_train_minutes=null
  train.py --config full --out runs/full --ray-address 10.0.0.1:6379 --num-env-runners 30

Ctrl-C (or SIGTERM) saves a checkpoint of the last finished iteration; --resume continues from it.
During the warm start it stops the teacher's episode processes at once (no checkpoint yet).

Output (--out DIR): config.yaml (the resolved config), progress.jsonl, tb/ (TensorBoard: train/,
qos/, be/, selection/), checkpoints/iter_NNNNNN/ and checkpoints.sha256 (their files' SHA-256: a
checkpoint is a pickle, so --resume refuses files that do not match it), policy.pt (of the imitated
network and every checkpoint's, the best on selection.episodes validation episodes, or with
selection.average_best=K the mean of the weights of the K best, kept in networks/; with
selection.rescore_best=K the K best (and that mean) are scored again on selection.rescore_episodes
episodes at the end, and the highest is the policy; load with torch alone; evaluate it with
`evaluate.py compare --controllers rl:DIR/policy.pt,parties ...`),
policy_last.pt (the last checkpoint's network), selection.json (the validation scores),
eval/<scenario>/summary.json (schema of `evaluate.py compare`), eval/summary.md, run.json.

Bad input - an unknown config key (in the file or a --set), a checkpoint to resume from another
algorithm, action layout or max_apps, a missing, damaged or changed checkpoint (not matching
checkpoints.sha256), a non-empty --out without --overwrite, an --out that cannot be created, a Ray
cluster that cannot be reached or is too small - is reported before anything is created, with
exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from env.config import run_cli
from harness.argtypes import count


def build_parser() -> argparse.ArgumentParser:
    """train.py's arguments (see the module docstring)."""
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="train.py",
        description=doc.split("\n\nBad input")[0],
        epilog="Bad input" + doc.split("\n\nBad input")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        help="training config: a name in configs/train/ (ppo-single, ppo-per-app, dqn-single, demo, full) "
        "or a YAML path; optional with --resume (the config saved with the checkpoint is reused)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by its dotted path, e.g. --set ppo.lr=1e-4 --set env.max_apps=4 "
        "(validated like the file; repeatable)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="run directory (created; must be empty unless --overwrite or resuming it)",
    )
    p.add_argument(
        "--ray-address",
        help="join an existing Ray cluster (e.g. HEAD_IP:6379, as printed by `ray start --head`); default: "
        "start a local session with resources.local_num_cpus CPUs",
    )
    p.add_argument(
        "--num-env-runners",
        type=count,
        help="sampling actors (overrides resources.num_env_runners; 0 = sample in this process)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="continue from the latest checkpoint of run DIR (or from checkpoint DIR itself)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty --out (not with --resume of it)"
    )
    p.add_argument(
        "--verbose", action="store_true", help="show Ray's and RLlib's own log messages (hidden below errors)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and train; the exit status (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return run_cli("train.py", lambda: _run(args, argv))


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.training import run_training  # imports torch and RLlib: after argument parsing

    run_training(
        config=args.config,
        overrides=args.overrides,
        out=Path(args.out),
        ray_address=args.ray_address,
        num_env_runners=args.num_env_runners,
        resume=args.resume,
        overwrite=args.overwrite,
        verbose=args.verbose,
        argv=argv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
