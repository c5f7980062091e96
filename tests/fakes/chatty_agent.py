#!/usr/bin/env python3
"""A stand-in for ``claude -p --output-format stream-json`` that reports without end: its
prompt (stdin) holds a line ``chatty COUNT SIZE``, and it prints COUNT assistant messages of
SIZE characters each (each one progress event of the turn), then answers
``answered after COUNT messages``."""

import json
import sys

count, size = 0, 0
for line in sys.stdin.read().splitlines():
    words = line.split()
    if len(words) == 3 and words[0] == "chatty":
        count, size = int(words[1]), int(words[2])


def say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")


say({"type": "system", "subtype": "init", "session_id": "s-chatty"})
for index in range(count):
    text = f"{index:06d} " + "x" * max(size - 7, 0)
    say(
        {
            "type": "assistant",
            "session_id": "s-chatty",
            "message": {"content": [{"type": "text", "text": text}]},
        }
    )
say(
    {
        "type": "result",
        "subtype": "success",
        "session_id": "s-chatty",
        "result": f"answered after {count} messages",
        "usage": {},
    }
)
sys.stdout.flush()
