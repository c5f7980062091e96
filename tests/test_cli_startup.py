"""What the ``amux`` entry point imports for the commands an Agent launch runs.

A Claude or Codex launch may start ``amux mcp`` (when its worker's warm host is not up) and waits
for its tool list before its first model request; Pi's bash tool runs ``amux memory``.
Those must not import the Hub, the service or the Feishu bot, which cost a second or more to
import. Structural, never timed: each command really runs in a fresh interpreter and the modules
it loaded are read at its exit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs the entry point as the `amux` script does and writes sys.modules at exit, whatever the
# command's exit status.
PROBE = """
import atexit, json, sys
path = sys.argv[1]
def dump():
    with open(path, "w") as out:
        json.dump(sorted(sys.modules), out)
atexit.register(dump)
sys.argv = ["amux", *sys.argv[2:]]
from bot.commands.cli import main
main()
"""

# The Hub, its state database and its server, the service, the Feishu bot, and the worker's
# launch machinery.
HEAVY = (
    "aiohttp.web",
    "hub.rpc",
    "hub.server",
    "hub.store",
    "hub.services",
    "hub.memory",
    "hub.state",
    "hub.migrations",
    "bot.service",
    "bot.feishu",
    "lark_oapi",
    "runtime_bridge.worker",
    "runtime_bridge.launch",
    "runtime_bridge.providers",
    "runtime_bridge.sandbox",
    "runtime_bridge.gateway",
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def loaded(tmp_path: Path, *args: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env.update(
        {
            "AMUX_HOME": str(tmp_path / "home"),
            "AMUX_HUB_URL": f"http://127.0.0.1:{closed_port()}",
            "AMUX_TOKEN": "startup-test",
        }
    )
    out = tmp_path / "modules.json"
    # stdin at its end: a stdio MCP server lists nothing and exits as its client went away.
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert out.is_file(), done.stderr.decode(errors="replace")
    return set(json.loads(out.read_text()))


def heavy_in(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


@pytest.mark.parametrize(
    ("args", "ran"),
    [
        (("--version",), None),
        (("--help",), None),
        (("mcp",), "runtime_bridge.mcp_server"),
        (("memory", "--help"), None),
    ],
)
def test_light_commands_import_no_http_client_nor_hub(
    tmp_path: Path, args: tuple[str, ...], ran: str | None
) -> None:
    modules = loaded(tmp_path, *args)
    if ran is not None:
        assert ran in modules, "the probe did not reach the command"
    # `amux mcp` makes its Hub client at the first tool call, after the tool list.
    assert heavy_in(modules, (*HEAVY, "aiohttp")) == []


def test_memory_commands_import_only_the_client(tmp_path: Path) -> None:
    # Against a Hub that is not there: the command runs its client, and fails to connect.
    modules = loaded(tmp_path, "memory", "search", "anything")
    assert "hub.client" in modules, "the probe did not reach the command"
    assert heavy_in(modules, HEAVY) == []
