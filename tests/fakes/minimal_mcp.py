"""The least an MCP stdio server can be: one tool, every answer at once, the standard library only.

Run as ``python -I -S minimal_mcp.py``. The launch benchmark starts an agent CLI with this server
to measure what the CLI's own MCP start-up costs (spawning a server, the initialize handshake,
listing tools) apart from anything amux does.
"""

import json
import sys

TOOL = {
    "name": "echo",
    "description": "Returns its text.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def answer(request: dict) -> dict | None:
    method = request.get("method")
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        version = request.get("params", {}).get("protocolVersion", "2025-06-18")
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "minimal", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "ping":
        result = {}
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": request["id"], "error": error}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
