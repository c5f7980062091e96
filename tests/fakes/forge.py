"""A fake of GitHub's and GitLab's pull request APIs on a random loopback port.

It speaks the shapes amux uses:

    GitHub  GET   /repos/{owner}/{repo}/pulls?head=owner:branch&state=open
            POST  /repos/{owner}/{repo}/pulls            {head, base, title, body}
            PATCH /repos/{owner}/{repo}/pulls/{number}   {title, body}
    GitLab  POST  /api/v4/projects/{id}/merge_requests         {source_branch, target_branch, ...}
            PUT   /api/v4/projects/{id}/merge_requests/{iid}   {title, description}

A request without the expected token (``Authorization: Bearer`` for GitHub, ``PRIVATE-TOKEN``
for GitLab) gets a 401 whose message echoes the token it was sent, as a careless forge might; a
second open pull request from the same head gets GitHub's 422. Every request is recorded.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class ForgeCall:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class FakeForge:
    token: str
    calls: list[ForgeCall] = field(default_factory=list)
    # Open pull requests by (repo, number): their fields as last set.
    pulls: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def __aenter__(self) -> FakeForge:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def writes(self) -> list[ForgeCall]:
        return [c for c in self.calls if c.method != "GET"]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.calls.append(ForgeCall(request.method, request.path, dict(request.query), body))
        # Raw: GitLab's project id is the URL-encoded path, slashes and all.
        parts = request.raw_path.split("?", 1)[0].strip("/").split("/")
        if parts[:2] == ["api", "v4"]:
            sent = request.headers.get("PRIVATE-TOKEN", "")
            if sent != self.token:
                return web.json_response({"message": f"401 Unauthorized {sent}"}, status=401)
            return self._gitlab(request.method, parts[2:], body)
        sent = request.headers.get("Authorization", "")
        if sent != f"Bearer {self.token}":
            return web.json_response({"message": f"Bad credentials: {sent}"}, status=401)
        return self._github(request, parts, body)

    def _github(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        if len(parts) < 4 or parts[0] != "repos" or parts[3] != "pulls":
            return web.json_response({"message": "Not Found"}, status=404)
        repo = f"{parts[1]}/{parts[2]}"
        if request.method == "GET":
            head = request.query.get("head", "")
            found = [
                p
                for (r, _), p in self.pulls.items()
                if r == repo and head.endswith(":" + p["head"])
            ]
            return web.json_response(found)
        if request.method == "POST" and len(parts) == 4:
            if any(r == repo and p["head"] == body["head"] for (r, _), p in self.pulls.items()):
                return web.json_response({"message": "A pull request already exists"}, status=422)
            number = len(self.pulls) + 1
            pull = {
                "number": number,
                "html_url": f"https://forge.example/{repo}/pull/{number}",
                **body,
            }
            self.pulls[(repo, number)] = pull
            return web.json_response(pull, status=201)
        if request.method == "PATCH" and len(parts) == 5:
            pull = self.pulls.get((repo, int(parts[4])))
            if pull is None:
                return web.json_response({"message": "Not Found"}, status=404)
            pull.update(body)
            return web.json_response(pull)
        return web.json_response({"message": "Not Found"}, status=404)

    def _gitlab(self, method: str, parts: list[str], body: Any) -> web.Response:
        if len(parts) < 3 or parts[0] != "projects" or parts[2] != "merge_requests":
            return web.json_response({"message": "404 Not Found"}, status=404)
        repo = parts[1]
        if method == "POST" and len(parts) == 3:
            iid = len(self.pulls) + 1
            mr = {"iid": iid, "web_url": f"https://forge.example/{repo}/-/merge_requests/{iid}"}
            mr.update(body)
            self.pulls[(repo, iid)] = mr
            return web.json_response(mr, status=201)
        if method == "PUT" and len(parts) == 4:
            mr = self.pulls.get((repo, int(parts[3])))
            if mr is None:
                return web.json_response({"message": "404 Not Found"}, status=404)
            mr.update(body)
            return web.json_response(mr)
        return web.json_response({"message": "404 Not Found"}, status=404)
