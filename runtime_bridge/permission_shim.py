"""Claude's permission prompt under ``ask``: a stdio MCP server of one tool, standard library only.

A Claude launch under the ``ask`` policy names this server's tool with
``--permission-prompt-tool mcp__amux__permission_prompt``. Whenever Claude's own permission
system would ask a person (a file edit, a changing shell command, a network tool), Claude calls
the tool with ``{"tool_name": ..., "input": {...}, "tool_use_id": ...}`` instead, and runs the
tool only on the answer ``{"behavior": "allow", "updatedInput": <input>}``; the answer
``{"behavior": "deny", "message": <reason>}`` reaches the model as the tool's result. Claude never
offers this tool to the model.

Claude waits for every MCP server before its first model request, so this one must start in
milliseconds: it is run as ``python -I -S permission_shim.py`` and imports nothing outside the
standard library (a server on the MCP SDK spends most of a second importing it). It speaks the
few MCP methods a tool server needs, newline-delimited JSON-RPC on stdin and stdout.

It runs inside the sandbox beside the Agent, holds no Hub credential, and decides nothing: each
request goes to the worker over the Unix socket named by ``AMUX_APPROVAL_SOCKET``, one JSON line
``{"tool": ..., "input": {...}}`` answered by one line ``{"allow": ..., "message": ...}``
(``runtime_bridge.approvals`` serves it). Without that socket, or without an answer, it denies.
"""

import json
import os
import socket
import sys
import threading
from typing import Any

SOCKET_ENV = "AMUX_APPROVAL_SOCKET"
SERVER_NAME = "amux"
TOOL_NAME = "permission_prompt"
# How Claude addresses the tool when the launch's MCP config names this server SERVER_NAME.
PROMPT_TOOL = f"mcp__{SERVER_NAME}__{TOOL_NAME}"

NO_SOCKET = "amux has nobody to ask for permission in this launch"
NO_ANSWER = "amux gave no answer to this permission request"
DENIED = "permission was denied"
# Unix socket addresses are limited to about 108 bytes; a longer path goes by its directory.
MAX_ADDRESS_BYTES = 100
MAX_ANSWER_BYTES = 1 << 20
# The versions whose tool methods this server's answers match; another is answered with the
# newest of these, as the protocol's negotiation asks.
PROTOCOL_VERSIONS = ("2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

DESCRIPTION = (
    "Asks amux whether a tool call may run. Claude Code calls this itself as its "
    "permission prompt; it is not a tool for the model."
)
INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string"},
        "input": {"type": "object"},
        "tool_use_id": {"type": ["string", "null"]},
    },
    "required": ["tool_name", "input"],
}


def ask(socket_path: str | None, tool: str, tool_input: dict[str, Any]) -> tuple[bool, str]:
    """Ask the worker about one request and wait for the person: (allowed, message).

    Anything short of a clear answer (no socket, a closed connection) is a denial.
    """
    if not socket_path:
        return False, NO_SOCKET
    address, directory = socket_path, -1
    try:
        if len(os.fsencode(socket_path)) > MAX_ADDRESS_BYTES:
            parent, name = os.path.split(socket_path)
            directory = os.open(parent, os.O_PATH | os.O_DIRECTORY)
            address = f"/proc/self/fd/{directory}/{name}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(address)
            request = {"tool": tool, "input": tool_input}
            conn.sendall(json.dumps(request).encode("utf-8") + b"\n")
            line = _read_line(conn)
    except OSError as error:
        return False, f"amux could not be asked for permission ({error.strerror or error})"
    finally:
        if directory >= 0:
            os.close(directory)
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return False, NO_ANSWER
    return answer.get("allow") is True, str(answer.get("message") or "")


def _read_line(conn: socket.socket) -> bytes:
    received = bytearray()
    while b"\n" not in received and len(received) <= MAX_ANSWER_BYTES:
        chunk = conn.recv(65536)
        if not chunk:
            break
        received += chunk
    return bytes(received.split(b"\n", 1)[0])


def decision(allowed: bool, message: str, tool_input: dict[str, Any]) -> str:
    """The permission result Claude expects, as the JSON text it reads (input never changed)."""
    if allowed:
        return json.dumps({"behavior": "allow", "updatedInput": tool_input}, ensure_ascii=False)
    # Claude requires a message, and it is all the model learns of the refusal.
    return json.dumps({"behavior": "deny", "message": message or DENIED}, ensure_ascii=False)


class Server:
    """One MCP session on a pair of binary streams; tool calls are answered as people decide,
    each in a thread of its own, so a ping or a second request is never held behind one."""

    def __init__(self, socket_path: str | None, out: Any) -> None:
        self._socket_path = socket_path
        self._out = out
        self._write_lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"
        with self._write_lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError):
                pass  # the Agent went away; nothing is waiting for this answer

    def handle(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self.send(_error(None, -32600, "not a JSON-RPC 2.0 message"))
            return
        method, ident = message.get("method"), message.get("id")
        if not isinstance(method, str):
            return  # a response or an error from the client: this server sends no requests
        if ident is None:
            return  # a notification: initialized, cancelled, progress; none needs an answer
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "initialize":
            self.send(_result(ident, _initialized(params)))
        elif method == "ping":
            self.send(_result(ident, {}))
        elif method == "tools/list":
            tool = {"name": TOOL_NAME, "description": DESCRIPTION, "inputSchema": INPUT_SCHEMA}
            self.send(_result(ident, {"tools": [tool]}))
        elif method == "tools/call":
            threading.Thread(target=self._call, args=(ident, params), daemon=True).start()
        else:
            self.send(_error(ident, -32601, f"method not found: {method}"))

    def _call(self, ident: Any, params: dict[str, Any]) -> None:
        arguments = params.get("arguments")
        arguments = arguments if isinstance(arguments, dict) else {}
        tool_name, tool_input = arguments.get("tool_name"), arguments.get("input")
        if params.get("name") != TOOL_NAME:
            text, failed = f"unknown tool: {params.get('name')}", True
        elif not isinstance(tool_name, str) or not isinstance(tool_input, dict):
            text, failed = "tool_name (a string) and input (an object) are required", True
        else:
            allowed, message = ask(self._socket_path, tool_name, tool_input)
            text, failed = decision(allowed, message, tool_input), False
        content = [{"type": "text", "text": text}]
        self.send(_result(ident, {"content": content, "isError": failed}))

    def serve(self, lines: Any) -> None:
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                self.send(_error(None, -32700, "not JSON"))
                continue
            self.handle(message)


def _initialized(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": SERVER_NAME, "version": "1"},
    }


def _result(ident: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _error(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def main() -> None:
    server = Server(os.environ.get(SOCKET_ENV) or None, sys.stdout.buffer)
    try:
        server.serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
