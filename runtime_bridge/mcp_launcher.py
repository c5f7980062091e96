"""How launches start ``amux mcp``: through the worker's warm host when it runs, else cold.

The host is started in the background when the worker starts, so it is warm by the first turn;
if it is not ready, or has died, a launch simply gets the cold ``amux mcp`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.mcp_shim import HOST_HUB_URL

logger = logging.getLogger("amux.worker")

SHIM = Path(__file__).with_name("mcp_shim.py")
READY_SECONDS = 30.0
SOCKET_NAME = "mcp.sock"
HOST_ENV = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "PYTHONPATH"})


def warm_socket(mcp_argv: tuple[str, ...]) -> tuple[Path, ...]:
    """The host socket an MCP command from ``WarmMcp.argv`` connects to (none for a cold one)."""
    return (Path(mcp_argv[4]),) if len(mcp_argv) > 4 and mcp_argv[3] == str(SHIM) else ()


class WarmMcp:
    """One ``runtime_bridge.mcp_host`` process listening on a private socket."""

    def __init__(self, amux: str, hub_url: str | None = None) -> None:
        self._directory: Path | None = None
        self._amux = amux
        # The Hub its servers reach, whatever URL a launch sends (an Agent with a network of
        # its own knows the Hub by its door, which is nothing outside its namespace).
        self._hub_url = hub_url
        self._process: asyncio.subprocess.Process | None = None
        self._ready = False

    async def start(self) -> None:
        """Start the host and wait until it listens; on failure launches stay cold."""
        # Socket paths are limited to about 100 bytes, so not under a (long) work directory.
        self._directory = Path(tempfile.mkdtemp(prefix="amux-mcp-"))
        setpriv = shutil.which("setpriv")
        prefix = (setpriv, "--pdeathsig", "TERM", "--") if setpriv else ()
        try:
            self._process = await asyncio.create_subprocess_exec(
                *prefix,
                sys.executable,
                "-m",
                "runtime_bridge.mcp_host",
                str(self._directory / SOCKET_NAME),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                # Each launch brings its own connection variables; nothing of the worker's
                # (its service token, the bot's secrets) is inherited by the servers.
                env={
                    **{k: v for k, v in os.environ.items() if k in HOST_ENV},
                    # Its servers answer with each launch's credential or not at all.
                    **NO_OWNER_TOKEN,
                    **({HOST_HUB_URL: self._hub_url} if self._hub_url else {}),
                },
            )
            assert self._process.stdout is not None
            line = await asyncio.wait_for(self._process.stdout.readline(), READY_SECONDS)
            self._ready = line.strip() == b"ready"
        except (OSError, TimeoutError) as error:
            logger.warning("the warm MCP host did not start (%s); using amux mcp", error)
            self._ready = False
        if not self._ready:
            await self.stop()

    def argv(self) -> tuple[str, ...]:
        """The MCP server command for a launch of the worker's own user."""
        process = self._process
        directory = self._directory
        if self._ready and process and process.returncode is None and directory is not None:
            socket_path = directory / SOCKET_NAME
            return (sys.executable, "-I", "-S", str(SHIM), str(socket_path), self._amux)
        return (self._amux, "mcp")

    async def stop(self) -> None:
        process, self._process = self._process, None
        self._ready = False
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await process.wait()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
