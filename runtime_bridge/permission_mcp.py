"""``amux permission-prompt``: the stdio MCP server Claude asks before a tool runs under ``ask``.

A Claude launch under the ``ask`` policy names this server's one tool with
``--permission-prompt-tool mcp__amux__permission_prompt``. Whenever Claude's own permission
system would ask a person (a file edit, a changing shell command, a network tool), Claude calls
the tool with ``{"tool_name": ..., "input": {...}, "tool_use_id": ...}`` instead, and runs the
tool only on the answer ``{"behavior": "allow", "updatedInput": <input>}``; the answer
``{"behavior": "deny", "message": <reason>}`` reaches the model as the tool's result. Claude never
offers this tool to the model.

The server runs inside the sandbox beside the Agent, holds no Hub credential, and decides
nothing: each request goes to the worker over the Unix socket named by ``AMUX_APPROVAL_SOCKET``
(``runtime_bridge.approvals``). Without that socket, or without an answer, it denies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from runtime_bridge.approvals import SOCKET_ENV, ApprovalAnswer, ask_over_socket

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

logger = logging.getLogger("amux.permission_prompt")

SERVER_NAME = "amux"
TOOL_NAME = "permission_prompt"
# How Claude addresses the tool when the launch's MCP config names this server SERVER_NAME.
PROMPT_TOOL = f"mcp__{SERVER_NAME}__{TOOL_NAME}"

NO_SOCKET = "amux has nobody to ask for permission in this launch"
DENIED = "permission was denied"

_DESCRIPTION = (
    "Asks amux whether a tool call may run. Claude Code calls this itself as its "
    "permission prompt; it is not a tool for the model."
)


def claude_decision(answer: ApprovalAnswer, tool_input: dict[str, Any]) -> dict[str, Any]:
    """The permission result Claude expects for ``answer`` (the input is never changed)."""
    if answer.allowed:
        return {"behavior": "allow", "updatedInput": tool_input}
    # Claude requires a message, and it is all the model learns of the refusal.
    return {"behavior": "deny", "message": answer.message or DENIED}


async def decide(socket_path: str | None, tool_name: str, tool_input: dict[str, Any]) -> str:
    """Ask the worker about one request; the JSON text Claude reads as the decision."""
    if not socket_path:
        answer = ApprovalAnswer(False, NO_SOCKET)
    else:
        answer = await ask_over_socket(socket_path, tool_name, tool_input)
    return json.dumps(claude_decision(answer, tool_input), ensure_ascii=False)


def build_server(socket_path: str | None) -> MCPServer:
    """The server with its one tool, asking on ``socket_path`` (None: denying everything)."""
    # Imported here: launch planning reads this module's names, and must not pay for the SDK.
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(SERVER_NAME)

    @server.tool(name=TOOL_NAME, description=_DESCRIPTION, structured_output=False)
    async def permission_prompt(
        tool_name: str, input: dict[str, Any], tool_use_id: str | None = None
    ) -> str:
        return await decide(socket_path, tool_name, input)

    return server


def main() -> None:
    """Entry point of ``amux permission-prompt``: MCP on stdio, logs on stderr."""
    # stdout carries the protocol; configured before MCPServer so its own set-up leaves ours.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    server = build_server(os.environ.get(SOCKET_ENV) or None)
    try:
        asyncio.run(server.run_stdio_async())
    except KeyboardInterrupt:
        pass
    except Exception as error:
        if not _client_went_away(error):
            logger.exception("amux permission-prompt stopped on an unexpected error")
            raise SystemExit(1) from None


def _client_went_away(error: BaseException) -> bool:
    # The Agent exiting while a reply is on its way is an ordinary end.
    if isinstance(error, BaseExceptionGroup):
        return all(_client_went_away(inner) for inner in error.exceptions)
    return isinstance(error, BrokenPipeError | ConnectionResetError)


if __name__ == "__main__":
    main()
