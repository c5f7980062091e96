"""Per-run memory tooling: a CLI wrapper and minimal connection config under the run directory.

The wrapper lets an Agent without MCP (Pi) run ``amux memory …`` as itself with this launch's
delegated credential and binding, and nothing of the service's own configuration. It lives in
``<run>/agent-config/memory/`` and disappears with the run.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.providers.confined import open_dir, open_root, write_file
from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.providers.plan import MEMORY_CONFIG_DIR


def memory_cli_dir(run_dir: Path) -> Path:
    return run_dir / MEMORY_CONFIG_DIR


def materialize_memory_cli(
    run_dir: Path,
    amux_executable: str,
    connection: Mapping[str, str],
    *,
    owner: tuple[int, int] | None = None,
) -> Path:
    """Write ``amux`` (0700) and ``connection.env`` (0600) and return their directory.

    ``connection`` is the launch's memory connection (Hub URL, credential, binding…). With
    ``owner`` (the Agent's user) that user owns both files and the directory.

    Raises:
        ExecutableMissing: the amux executable the wrapper should run does not exist.
    """
    if not (os.path.isfile(amux_executable) and os.access(amux_executable, os.X_OK)):
        raise ExecutableMissing(
            f"the amux executable {amux_executable!r} is missing; memory tools cannot be offered",
            executable=amux_executable,
            provider="amux",
        )
    directory = memory_cli_dir(run_dir)
    env_file = directory / "connection.env"
    # The owner token a Hub leaves under AMUX_HOME is never an Agent's fallback.
    values = {**connection, **NO_OWNER_TOKEN}
    lines = [f"{key}={shlex.quote(value)}" for key, value in values.items()]
    script = (
        "#!/bin/sh\n"
        "# amux memory tools for this launch only; removed with the run.\n"
        "set -a\n"
        f". {shlex.quote(str(env_file))}\n"
        "set +a\n"
        f'exec {shlex.quote(amux_executable)} "$@"\n'
    )
    with open_root(run_dir) as root, open_dir(root, MEMORY_CONFIG_DIR, owner) as config:
        write_file(config, env_file.name, "\n".join(lines).encode() + b"\n", 0o600, owner)
        write_file(config, "amux", script.encode(), 0o700, owner)
    return directory
