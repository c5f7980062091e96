#!/usr/bin/env python3
"""A stand-in for ``claude -p --output-format stream-json`` that floods its warm MCP host: its
prompt (stdin) holds a line ``mcpflood COUNT``, and it connects COUNT times to the host socket
its ``--mcp-config`` names (sending each time the settings line the shim sends), keeps the
connections the host keeps, marks its workspace ``flooded``, waits for a ``release`` file there
and answers ``held HELD of COUNT``."""

import json
import os
import select
import socket
import sys
import time

count = 0
for line in sys.stdin.read().splitlines():
    words = line.split()
    if len(words) == 2 and words[0] == "mcpflood":
        count = int(words[1])
config = json.loads(open(sys.argv[sys.argv.index("--mcp-config") + 1]).read())
(server,) = [s for s in config["mcpServers"].values() if "mcp_shim.py" in " ".join(s["args"])]
path = server["args"][3]
settings = (json.dumps(server.get("env", {})) + "\n").encode()

held: list[socket.socket] = []


def sweep() -> None:
    """Let go of the connections the host closed (they read as ready, at their end)."""
    poll = select.poll()
    for conn in held:
        poll.register(conn, select.POLLIN)
    ended = {fd for fd, _ in poll.poll(0)}
    for conn in held:
        if conn.fileno() in ended:
            conn.close()
    held[:] = [conn for conn in held if conn.fileno() != -1]


deadline = time.monotonic() + 20
for n in range(count):
    if time.monotonic() > deadline:
        break
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(1)
    try:
        conn.connect(path)
        conn.sendall(settings)
    except OSError:
        conn.close()
    else:
        held.append(conn)
    if n % 50 == 49:
        sweep()
# The host may still be catching up with what waits to be accepted: until nothing changes.
settled = time.monotonic() + 10
while time.monotonic() < settled:
    before = len(held)
    time.sleep(0.5)
    sweep()
    if len(held) == before:
        break
open("flooded", "w").close()
deadline = time.monotonic() + 120
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.05)


def say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")


say({"type": "system", "subtype": "init", "session_id": "s-flood"})
say(
    {
        "type": "result",
        "subtype": "success",
        "session_id": "s-flood",
        "result": f"held {len(held)} of {count}",
        "usage": {},
    }
)
sys.stdout.flush()
