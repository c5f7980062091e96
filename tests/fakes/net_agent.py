#!/usr/bin/env python3
"""A stand-in Agent for the network tests: it tries what a prompt-injected Agent would and
reports, one line each, what happened. Commands arrive on stdin (the prompt), one per line:

  nonce X            echo X back (proves this probe really ran)
  secret X           X in its own environment, any visible process's, or a readable file
                     under HOME, the workspace or /tmp  -> secret-hit WHERE | secret-none
  connect HOST PORT  a TCP connection, no proxy                      -> connect-ok | connect-failed
  get URL            GET through the environment's proxies           -> get STATUS FIRST-LINE
  proxied URL        GET through $HTTP_PROXY even for loopback       -> proxied STATUS FIRST-LINE
  hub                GET $AMUX_HUB_URL/healthz                       -> hub STATUS
  rpc URL            POST {} to URL, no credential, no proxy
                                                      -> rpc STATUS FIRST-LINE
  flood N            open N connections straight to its hub door's socket, each with a request
                     head that never ends, keeping those the door keeps; mark the workspace
                     `flooded`, wait for a `release` file there -> flood HELD of N
  model              POST a message to $ANTHROPIC_BASE_URL with $ANTHROPIC_API_KEY
                                                      -> model STATUS
  env NAME           a variable's value               -> env NAME=VALUE | env NAME unset
"""

import http.client
import json
import os
import select
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def secret(needle: str) -> str:
    if needle in "\n".join(os.environ.values()):
        return "secret-hit own-environment"
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if needle.encode() in handle.read():
                        return f"secret-hit /proc/{pid}/environ"
            except OSError:
                pass
    roots = [os.environ.get("HOME", ""), os.getcwd(), "/tmp", *sys.argv[1:]]
    for root in filter(None, roots):
        for directory, _, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    with open(path, "rb") as handle:
                        if needle.encode() in handle.read(1 << 20):
                            return f"secret-hit {path}"
                except OSError:
                    pass
    return "secret-none"


def connect(host: str, port: str) -> str:
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        return f"connect-failed {error.strerror or error}"
    return "connect-ok"


def proxied(url: str) -> tuple[int, str]:
    """An absolute-form request to $HTTP_PROXY itself (urllib would skip it for loopback)."""
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    connection = http.client.HTTPConnection(proxy.hostname or "", proxy.port, timeout=20)
    try:
        connection.request("GET", url)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)
    finally:
        connection.close()


def fetch(request: urllib.request.Request | str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as error:
        return 0, str(error)


def hub_door() -> str:
    """The hub door's socket, as its relay was told it."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                words = handle.read().decode().split("\0")
        except (OSError, ValueError):
            continue
        for word in words:
            if word.startswith("7802="):
                return word.removeprefix("7802=")
    raise SystemExit("no hub door")


def flood(count: int) -> int:
    """How many of ``count`` unfinished requests its hub door still holds."""
    # A deep path is reached through its directory, as the relay does.
    directory = os.open(os.path.dirname(hub_door()), os.O_PATH | os.O_DIRECTORY)
    path, held = f"/proc/self/fd/{directory}/hub.sock", []

    def sweep() -> None:
        # A connection the door closed reads as ready (at its end): let it go.
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
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:  # out of files of its own
            break
        conn.settimeout(1)
        try:
            conn.connect(path)
            conn.sendall(b"POST /rpc/v1/system.whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        except OSError:
            conn.close()
        else:
            held.append(conn)
        if n % 50 == 49:
            sweep()
    time.sleep(0.5)
    sweep()
    return len(held)


def main() -> None:
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        if verb == "nonce":
            print(f"nonce {arg}")
        elif verb == "secret":
            print(secret(arg))
        elif verb == "connect":
            print(connect(*arg.split()))
        elif verb == "get":
            status, body = fetch(arg)
            print(f"get {status} {(body.splitlines() or [''])[0]}")
        elif verb == "proxied":
            status, body = proxied(arg)
            print(f"proxied {status} {(body.splitlines() or [''])[0]}")
        elif verb == "hub":
            status, _ = fetch(os.environ["AMUX_HUB_URL"] + "/healthz")
            print(f"hub {status}")
        elif verb == "rpc":
            request = urllib.request.Request(
                arg,
                data=b"{}",
                headers={"content-type": "application/json"},
            )
            status, body = fetch(request)
            print(f"rpc {status} {(body.splitlines() or [''])[0]}")
        elif verb == "flood":
            held = flood(int(arg))
            open("flooded", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists("release") and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"flood {held} of {arg}")
        elif verb == "model":
            body = {
                "model": "claude-sonnet-4-5",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "hello"}],
            }
            request = urllib.request.Request(
                os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
                data=json.dumps(body).encode(),
                headers={
                    "content-type": "application/json",
                    "x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""),
                    "anthropic-version": "2023-06-01",
                },
            )
            status, _ = fetch(request)
            print(f"model {status}")
        elif verb == "env":
            value = os.environ.get(arg)
            print(f"env {arg}={value}" if value is not None else f"env {arg} unset")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
