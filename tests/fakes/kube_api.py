"""A loopback Kubernetes API server, enough of one for the official ``kubernetes`` client to run
Agents in agent-sandbox pods: SandboxClaims (create, get, list by label or name, watch, delete),
the Sandboxes the fake controller binds to them, their pods, and pods/exec over a websocket
speaking the v5/v4 ``channel.k8s.io`` framing (a channel byte, then data: 0 stdin, 1 stdout,
2 stderr, 3 the command's status; v5's 255 closes a channel).

The "controller" binds a Sandbox and a pod to each new claim and marks the claim Ready, unless
told the pods never become ready. An exec runs its command as a real local subprocess; deleting
a claim deletes its Sandbox and pod, killing what runs there. Given the worker's ``work_dir``,
each pod has a file system of its own there, as a pod whose work directory is an emptyDir: the
command runs under bubblewrap with the pod's own empty directory bound at that path, so what
the worker did not stream into the pod is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp import WSMsgType, web

from tests.conftest import REPO

CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes"
PODS = "/api/v1/namespaces/{ns}/pods"
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
# The pinned excerpt of agent-sandbox's CRD the chart's tests use: a claim it refuses is refused
# here as the API server's strict field validation would.
CLAIM_SCHEMA = REPO / "deploy" / "helm" / "schemas" / "agent-sandbox-0.5.6-sandboxclaim.json"
CLAIM_VALIDATOR = jsonschema.Draft7Validator(json.loads(CLAIM_SCHEMA.read_text(encoding="utf-8")))


@dataclass
class Event:
    version: int
    kind: str
    obj: dict[str, Any]


@dataclass
class FakeKube:
    """The API server's state; tests read ``claims``, ``deleted``, ``execs`` and ``running``
    (each pod's exec'd processes still alive)."""

    # False: the controller reports every claim's pod as not ready, for ever.
    ready: bool = True
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    # Every exec's command, in order.
    execs: list[list[str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    running: dict[str, set[asyncio.subprocess.Process]] = field(default_factory=dict)
    # The worker's work directory, where each pod has an empty directory of its own; None: pods
    # see this host's files.
    work_dir: Path | None = None
    # Each pod's own work directory, by pod name (kept after the pod is deleted, for tests).
    roots: dict[str, Path] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        claims, sandboxes, pods = (path.format(ns="{ns}") for path in (CLAIMS, SANDBOXES, PODS))
        app.router.add_post(claims, self._create_claim)
        app.router.add_get(claims, self._list_claims)
        app.router.add_get(claims + "/{name}", self._get_claim)
        app.router.add_delete(claims + "/{name}", self._delete_claim)
        app.router.add_get(sandboxes + "/{name}", self._get_sandbox)
        app.router.add_get(pods + "/{name}", self._get_pod)
        app.router.add_get(pods + "/{name}/exec", self._exec)
        return app

    def add_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store a claim as the API server would (a test plants one left by a lost worker)."""
        metadata = body.setdefault("metadata", {})
        metadata.setdefault("namespace", "default")
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = "2026-01-01T00:00:00Z"
        self.claims[metadata["name"]] = body
        self._record("ADDED", body)
        return body

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(version)
        self.events.append(Event(version, kind, json.loads(json.dumps(obj))))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _create_claim(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            CLAIM_VALIDATOR.validate(body)
        except jsonschema.ValidationError as error:
            return _status(422, "Invalid", f"SandboxClaim is invalid: {error.message}")
        name = body["metadata"]["name"]
        if name in self.claims:
            return _status(409, "AlreadyExists", f'sandboxclaims "{name}" already exists')
        body["metadata"]["namespace"] = request.match_info["ns"]
        self.add_claim(body)
        await self._notify()
        asyncio.get_running_loop().call_later(0.05, self._bind, request.match_info["ns"], name)
        return web.json_response(body, status=201)

    def _bind(self, namespace: str, name: str) -> None:
        """The controller's work: a Sandbox and its pod for the claim, then the claim's
        readiness (the pod's name differs from the Sandbox's, as after a warm-pool adoption)."""
        claim = self.claims.get(name)
        if claim is None:
            return
        pod = f"{name}-pod"
        self.sandboxes[name] = {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {"agents.x-k8s.io/pod-name": pod},
            },
        }
        if self.work_dir is not None:
            self.roots[pod] = Path(tempfile.mkdtemp(prefix=f"{pod}-", dir=self.work_dir.parent))
        self.pods[pod] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace},
            "status": {"phase": "Running"},
        }
        condition = {
            "type": "Ready",
            "status": "True" if self.ready else "False",
            "reason": "SandboxReady" if self.ready else "SandboxNotReady",
            "message": "" if self.ready else "the pod is not ready",
            "lastTransitionTime": "2026-01-01T00:00:01Z",
        }
        claim["status"] = {"conditions": [condition], "sandbox": {"name": name}}
        self._record("MODIFIED", claim)
        asyncio.ensure_future(self._notify())

    async def _get_claim(self, request: web.Request) -> web.Response:
        claim = self.claims.get(request.match_info["name"])
        if claim is None:
            return _not_found("sandboxclaims", request.match_info["name"])
        return web.json_response(claim)

    async def _delete_claim(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        claim = self.claims.pop(name, None)
        if claim is None:
            return _not_found("sandboxclaims", name)
        self.deleted.append(name)
        self._record("DELETED", claim)
        sandbox = self.sandboxes.pop(name, None)
        if sandbox is not None:
            pod = sandbox["metadata"]["annotations"]["agents.x-k8s.io/pod-name"]
            self.pods.pop(pod, None)
            for process in self.running.pop(pod, set()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        await self._notify()
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    async def _get_sandbox(self, request: web.Request) -> web.Response:
        sandbox = self.sandboxes.get(request.match_info["name"])
        if sandbox is None:
            return _not_found("sandboxes", request.match_info["name"])
        return web.json_response(sandbox)

    async def _get_pod(self, request: web.Request) -> web.Response:
        pod = self.pods.get(request.match_info["name"])
        if pod is None:
            return _not_found("pods", request.match_info["name"])
        return web.json_response(pod)

    async def _list_claims(self, request: web.Request) -> web.StreamResponse:
        selected = [claim for claim in self.claims.values() if _selected(claim, request.query)]
        if request.query.get("watch") not in ("true", "1", "True"):
            return web.json_response(
                {
                    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                    "kind": "SandboxClaimList",
                    "metadata": {"resourceVersion": str(len(self.events))},
                    "items": selected,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = int(request.query.get("resourceVersion") or 0)
        if since == 0:
            for claim in selected:
                await _send(response, "ADDED", claim)
            since = self.events[-1].version if self.events else 0
        seconds = float(request.query.get("timeoutSeconds") or 30)
        async for event in self._events_after(since, seconds):
            if _selected(event.obj, request.query):
                await _send(response, event.kind, event.obj)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _events_after(self, since: int, seconds: float) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            for event in [e for e in self.events if e.version > since]:
                since = event.version
                yield event
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.pods:
            return _not_found("pods", name)
        command = request.query.getall("command")
        self.execs.append(command)
        socket = web.WebSocketResponse(protocols=(V5, V4))
        await socket.prepare(request)
        root = self.roots.get(name)
        if root is not None:
            assert self.work_dir is not None
            bwrap = shutil.which("bwrap")
            assert bwrap is not None
            # This host's files, but the pod's own at the work directory's path.
            command = [
                bwrap,
                "--dev-bind",
                "/",
                "/",
                "--bind",
                str(root),
                str(self.work_dir),
                "--",
                *command,
            ]
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.running.setdefault(name, set()).add(process)
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None

        async def forward(stream: asyncio.StreamReader, channel: int) -> None:
            while chunk := await stream.read(65536):
                with contextlib.suppress(ConnectionResetError):
                    await socket.send_bytes(bytes([channel]) + chunk)

        outputs = [
            asyncio.create_task(forward(process.stdout, 1)),
            asyncio.create_task(forward(process.stderr, 2)),
        ]
        reading = asyncio.create_task(self._stdin(socket, process.stdin))
        try:
            await asyncio.gather(*outputs)
            code = await process.wait()
            if not socket.closed and name in self.pods:
                await socket.send_bytes(bytes([3]) + json.dumps(_exit_status(code)).encode())
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            self.running.get(name, set()).discard(process)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
            await socket.close()
        return socket

    async def _stdin(self, socket: web.WebSocketResponse, stdin: asyncio.StreamWriter) -> None:
        async for message in socket:
            if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            data = message.data if isinstance(message.data, bytes) else message.data.encode()
            if not data:
                continue
            if data[0] == 255 and socket.ws_protocol == V5:
                if data[1:2] == b"\x00":
                    stdin.close()
                continue
            if data[0] == 0 and not stdin.is_closing():
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    stdin.write(data[1:])
                    await stdin.drain()


def _exit_status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def _selected(obj: dict[str, Any], query: Any) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (query.get("labelSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    for term in filter(None, (query.get("fieldSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value:
            return False
    return True


async def _send(response: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write((json.dumps({"type": kind, "object": obj}) + "\n").encode())


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _not_found(kind: str, name: str) -> web.Response:
    return _status(404, "NotFound", f'{kind} "{name}" not found')
