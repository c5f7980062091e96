#!/usr/bin/env python3
"""A stand-in Agent that spends through its model gateway, line by line of its prompt (stdin):

- ``spend``: one model request to ``$ANTHROPIC_BASE_URL`` with the launch's placeholder key,
  answered "spent STATUS" or "refused STATUS";
- ``wait PATH``: wait (up to 120 s) until PATH exists, so a test decides when it goes on.

Its answer is one line per request.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

REQUEST = {
    "model": "claude-test",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "spend"}],
}


def spend() -> str:
    request = urllib.request.Request(
        os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
        data=json.dumps(REQUEST).encode(),
        headers={
            "x-api-key": os.environ["ANTHROPIC_API_KEY"],
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return f"spent {answer.status}"
    except urllib.error.HTTPError as refusal:
        return f"refused {refusal.code}"


def wait(path: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)


said = []
for line in sys.stdin.read().splitlines():
    if line == "spend":
        said.append(spend())
    elif line.startswith("wait "):
        wait(line.removeprefix("wait "))
print("\n".join(said))
