"""A git smart-HTTP server on loopback: real ``git http-backend`` behind a tiny CGI bridge that
answers 401 unless the request carries the expected token (then it may fetch and push), and
records what it was sent."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class GitServer:
    root: Path
    url: str
    token: str
    authorizations: list[str] = field(default_factory=list)

    def accepts(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        decoded = base64.b64decode(header[len("Basic ") :]).decode("utf-8", errors="replace")
        return decoded.partition(":")[2] == self.token


def _handler(server: GitServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            header = self.headers.get("Authorization")
            server.authorizations.append(header or "")
            if not server.accepts(header):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {
                "PATH": os.environ.get("PATH", os.defpath),
                "GIT_PROJECT_ROOT": str(server.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": "/dev/null",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type") or "",
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
                "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "",
                "REMOTE_ADDR": "127.0.0.1",
                # An authenticated caller may push, as on a forge (http-backend's own rule).
                "REMOTE_USER": "amux",
            }
            done = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
            )
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            status = 200
            headers: list[tuple[str, str]] = []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _serve
        do_POST = _serve

    return Handler


@contextmanager
def git_server(root: Path, token: str) -> Iterator[GitServer]:
    """Serve the repositories under ``root`` at ``http://127.0.0.1:<port>/``."""
    state = GitServer(root, "", token)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
