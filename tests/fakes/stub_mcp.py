"""A tiny stdio MCP server standing in for ``amux mcp`` in agent CLI tests.

Run as ``python -m tests.fakes.stub_mcp`` (or by path). Each tool call is appended as one JSON line
``{"tool", "arguments", "env"}`` to the file named by ``STUB_MCP_LOG``, where ``env`` holds the
AMUX_* connection variables the launch passed in, so a test proves a CLI reached the MCP server
with the right arguments and connection settings.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mcp.server.mcpserver import MCPServer

ENV_KEYS = ("AMUX_HUB_URL", "AMUX_TOKEN", "AMUX_MEMORY_BINDING")

server: MCPServer = MCPServer("amux-memory-stub")


def _record(tool: str, arguments: dict[str, Any]) -> None:
    entry = {
        "tool": tool,
        "arguments": arguments,
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
    }
    with open(os.environ["STUB_MCP_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


@server.tool(name="amux.memory_search", structured_output=False)
def memory_search(query: str, path_prefix: str | None = None, limit: int | None = None) -> str:
    """Search amux memory for literal keywords."""
    _record("amux.memory_search", {"query": query, "path_prefix": path_prefix, "limit": limit})
    return json.dumps(
        {
            "matches": [
                {
                    "path": "preferences/communication.md",
                    "line": 1,
                    "snippet": "STUB-MEMORY-HIT: answer in English",
                    "revision": "0" * 64,
                }
            ],
            "incomplete": False,
            "truncated": False,
        }
    )


@server.tool(name="amux.memory_upsert", structured_output=False)
def memory_upsert(path: str, content: str, expected_revision: str) -> str:
    """Replace or create one amux memory document."""
    _record(
        "amux.memory_upsert",
        {"path": path, "content": content, "expected_revision": expected_revision},
    )
    return json.dumps({"path": path, "revision": "1" * 64})


if __name__ == "__main__":
    server.run("stdio")
