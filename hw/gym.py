"""`ColocLinux-v0`: the Gymnasium env (env.gym_env.NodeEnv) over a real `LinuxNode`.

Nondeterministic by nature: the node's load and latency are whatever the real machine does. The
env closes the node (restoring everything it changed) when it is closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hw.config import LinuxNodeConfig
from hw.feed import LatencySource
from hw.linux_node import LinuxNode


def make_linux_env(
    config_path: str | Path | LinuxNodeConfig,
    env_config: Any = None,
    *,
    feed: LatencySource | None = None,
    render_mode: str | None = None,
    node_kwargs: Mapping[str, Any] | None = None,
    **fields: Any,
):
    """Build the `LinuxNode` from `config_path` (configs/node/linux-*.yaml, by name or path) and
    wrap it in `NodeEnv`. `env_config`/`fields` configure the env (`EnvConfig`); `feed` overrides the
    node config's latency feed; `node_kwargs` go to `LinuxNode` (clock, fs, runner, ...)."""
    from env.gym_env import EnvConfig, NodeEnv

    node = LinuxNode(config_path, feed=feed, **dict(node_kwargs or {}))
    try:
        return NodeEnv(EnvConfig.resolve(env_config, **fields), node=node, render_mode=render_mode)
    except BaseException:
        node.close()
        raise
