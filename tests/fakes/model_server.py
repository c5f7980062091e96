"""A scripted fake of the model APIs the agent CLIs call, on a random loopback port.

One aiohttp server speaks the three wire formats the CLIs use, all streamed as SSE:

    POST /v1/messages          Anthropic Messages      (claude)
    POST /v1/responses         OpenAI Responses        (codex)
    POST /v1/chat/completions  OpenAI chat completions (pi)

A script is a list of steps, each ``CallTool(name, arguments)`` or ``Answer(text)``; a
``CallTool(name, {}, freeform=text)`` calls a freeform tool (Codex's ``apply_patch``) with that
input text. Every *main
conversation* request (one that offers the model tools) gets the next step; a repeat of a request
just answered (a client retry) gets the same step again. Side requests (titles, summaries,
probes: no tools offered) get a short plain answer (``side_answer``) and consume nothing. Once the
script runs out, main requests get ``Answer("done")``. With the pinned CLIs run as the tests run
them, all three send only main requests but for Codex's compaction (a summary); side requests are
still answered so that a CLI adding one (a title, a summary, a quota probe, Codex's native-memory
consolidation) cannot eat a step. Anything else
(e.g. a probe of the base URL) gets a 404 and is listed in ``unhandled``.

Every request body and its headers are recorded, so tests assert on what the CLI sent (and with
which key): the system prompt or
developer instructions, the tools offered, and the tool results that came back from the client.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Api = Literal["anthropic", "responses", "chat"]


@dataclass(frozen=True)
class CallTool:
    """Ask the client to call the tool the model sees as ``name`` with ``arguments``.

    For the Responses API a name ``mcp__server__tool`` is sent as namespace ``mcp__server`` and
    name ``tool``, which is how codex addresses MCP tools.
    """

    name: str
    arguments: dict[str, Any]
    hold: asyncio.Event | None = field(default=None, compare=False)
    # A freeform ("custom") tool's input text, such as Codex's ``apply_patch`` patch: the
    # Responses API then sends a ``custom_tool_call`` carrying it instead of JSON arguments.
    freeform: str | None = None


@dataclass(frozen=True)
class Answer:
    """Finish the turn with this assistant text.

    With ``hold``, the fake keeps the request open until the event is set: an Agent that is
    mid-turn for as long as a test needs (to kill its worker, or to cancel it).
    """

    text: str
    hold: asyncio.Event | None = field(default=None, compare=False)


Step = CallTool | Answer

SIDE_ANSWER = "ok"
# The usage every answer reports, in each API's own fields (Anthropic's split between
# message_start and message_delta, as the real API sends it).
INPUT_TOKENS = 11
OUTPUT_TOKENS = 7


@dataclass
class RecordedRequest:
    """One request as the fake received it."""

    api: Api
    path: str
    body: dict[str, Any]
    main: bool
    step: Step | None
    # time.perf_counter() when the request arrived, for benchmarks in the same process.
    arrived: float = 0.0
    # The headers as received (names in the client's spelling), so tests see the credential.
    headers: dict[str, str] = field(default_factory=dict)

    def credential(self) -> str | None:
        """The key the request carried: ``x-api-key``, else an ``Authorization: Bearer`` token."""
        lowered = {k.lower(): v for k, v in self.headers.items()}
        if lowered.get("x-api-key"):
            return lowered["x-api-key"]
        scheme, _, token = lowered.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools offered to the model (namespaced as the model sees them)."""
        names: list[str] = []
        for tool in self.body.get("tools") or []:
            names.extend(_tool_names(tool))
        return names

    @property
    def system_text(self) -> str:
        """Everything the client sent as system prompt or developer/system instructions."""
        parts: list[str] = []
        if self.api == "anthropic":
            parts.append(_text_of(self.body.get("system")))
        elif self.api == "responses":
            parts.append(_text_of(self.body.get("instructions")))
            for item in self.body.get("input") or []:
                if isinstance(item, dict) and item.get("role") in ("developer", "system"):
                    parts.append(_text_of(item.get("content")))
        else:
            for message in self.body.get("messages") or []:
                if message.get("role") in ("developer", "system"):
                    parts.append(_text_of(message.get("content")))
        return "\n".join(p for p in parts if p)

    def role_text(self, role: str) -> str:
        """The text of every message with this role (``developer``, ``user``…), joined."""
        key = "input" if self.api == "responses" else "messages"
        return "\n".join(
            _text_of(m.get("content"))
            for m in self.body.get(key) or []
            if isinstance(m, dict) and m.get("role") == role
        )

    @property
    def tool_results(self) -> list[tuple[str, str]]:
        """``(call id, output text)`` for every tool result carried in this request."""
        results: list[tuple[str, str]] = []
        if self.api == "anthropic":
            for message in self.body.get("messages") or []:
                content = message.get("content")
                if not isinstance(content, list):
                    continue
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        results.append(
                            (str(block.get("tool_use_id")), _text_of(block.get("content")))
                        )
        elif self.api == "responses":
            for item in self.body.get("input") or []:
                if isinstance(item, dict) and item.get("type") in (
                    "function_call_output",
                    "custom_tool_call_output",
                ):
                    results.append((str(item.get("call_id")), _text_of(item.get("output"))))
        else:
            for message in self.body.get("messages") or []:
                if message.get("role") == "tool":
                    results.append(
                        (str(message.get("tool_call_id")), _text_of(message.get("content")))
                    )
        return results


def _tool_names(tool: Any) -> list[str]:
    if not isinstance(tool, dict):
        return []
    if tool.get("type") == "namespace":
        prefix = str(tool.get("name", ""))
        return [f"{prefix}__{name}" for t in tool.get("tools") or [] for name in _tool_names(t)]
    if isinstance(tool.get("function"), dict):
        return [str(tool["function"].get("name"))]
    if "name" in tool:
        return [str(tool["name"])]
    return []


def _text_of(value: Any) -> str:
    """Flatten the string-or-blocks content shapes of the three APIs into plain text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"])
        if "content" in value:
            return _text_of(value["content"])
        if "output" in value:
            return _text_of(value["output"])
    return json.dumps(value)


def _sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class FakeModelServer:
    """The fake; use ``async with FakeModelServer(script) as server`` and ``server.base_url``."""

    def __init__(self, script: Sequence[Step] = (), side_answer: str = SIDE_ANSWER) -> None:
        self._script: list[Step] = list(script)
        # What side requests are answered: a test of a summary (Codex's compaction) scripts it.
        self._side_answer = side_answer
        self._next = 0
        # A client retry repeats the previous main request; it gets that request's step again.
        self._last: tuple[str, Step] | None = None
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.requests: list[RecordedRequest] = []
        self.unhandled: list[str] = []

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (clients add ``/v1`` as their API expects)."""
        return f"http://127.0.0.1:{self.port}"

    def add_steps(self, steps: Iterable[Step]) -> None:
        """Append steps, e.g. for a resumed conversation."""
        self._script.extend(steps)

    @property
    def main_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.main]

    @property
    def tool_results(self) -> list[tuple[str, str]]:
        """Every distinct tool result the client sent back, in order of arrival."""
        seen: dict[str, str] = {}
        for request in self.requests:
            for call_id, text in request.tool_results:
                seen.setdefault(call_id, text)
        return list(seen.items())

    @property
    def steps_left(self) -> int:
        return len(self._script) - self._next

    async def __aenter__(self) -> FakeModelServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None)
        assert sockets
        self.port = int(sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- step selection ------------------------------------------------------------------------

    async def _take(self, api: Api, request: web.Request) -> tuple[dict[str, Any], Step | None]:
        arrived = time.perf_counter()
        body: dict[str, Any] = await request.json()
        main = bool(body.get("tools"))
        step: Step | None = None
        if main:
            key = self._fingerprint(api, body)
            if self._last is not None and self._last[0] == key:
                step = self._last[1]
            else:
                if self._next < len(self._script):
                    step = self._script[self._next]
                    self._next += 1
                else:
                    step = Answer("done")
                self._last = (key, step)
        self.requests.append(
            RecordedRequest(api, request.path_qs, body, main, step, arrived, dict(request.headers))
        )
        if step is not None and step.hold is not None:
            await step.hold.wait()
        return body, step

    @staticmethod
    def _fingerprint(api: Api, body: dict[str, Any]) -> str:
        conversation = body.get("input") if api == "responses" else body.get("messages")
        return hashlib.sha256(json.dumps(conversation, sort_keys=True).encode()).hexdigest()

    async def _other(self, request: web.Request) -> web.Response:
        self.unhandled.append(f"{request.method} {request.path_qs}")
        return web.json_response({"error": {"message": "not faked"}}, status=404)

    # -- Anthropic Messages --------------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body, step = await self._take("anthropic", request)
        step = step or Answer(self._side_answer)
        n = next(self._ids)
        model = str(body.get("model", "fake"))
        if isinstance(step, CallTool):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{n:04d}",
                "name": step.name,
                "input": {},
            }
            delta = {"type": "input_json_delta", "partial_json": json.dumps(step.arguments)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": step.text}
            stop = "end_turn"
        usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
        if not body.get("stream"):
            full = dict(block)
            if isinstance(step, CallTool):
                full["input"] = step.arguments
            else:
                full["text"] = step.text
            return web.json_response(
                {
                    "id": f"msg_{n:04d}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [full],
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                }
            )
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_{n:04d}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1},
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": OUTPUT_TOKENS},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return await self._stream(request, [_sse(e, d) for e, d in events])

    # -- OpenAI Responses ----------------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        _, step = await self._take("responses", request)
        step = step or Answer(self._side_answer)
        n = next(self._ids)
        if isinstance(step, CallTool) and step.freeform is not None:
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": f"ctc_{n:04d}",
                "name": step.name,
                "input": step.freeform,
                "call_id": f"call_{n:04d}",
            }
        elif isinstance(step, CallTool):
            namespace, _, name = step.name.rpartition("__")
            item = {
                "type": "function_call",
                "id": f"fc_{n:04d}",
                "name": name,
                "arguments": json.dumps(step.arguments),
                "call_id": f"call_{n:04d}",
            }
            if namespace:
                item["namespace"] = namespace
        else:
            item = {
                "type": "message",
                "id": f"msg_{n:04d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        response = {"id": f"resp_{n:04d}", "object": "response", "status": "in_progress"}
        done = {
            **response,
            "status": "completed",
            "output": [item],
            "usage": {
                "input_tokens": INPUT_TOKENS,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": OUTPUT_TOKENS,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            },
        }
        chunks = [
            _sse("response.created", {"type": "response.created", "response": response}),
            _sse(
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            ),
            _sse("response.completed", {"type": "response.completed", "response": done}),
        ]
        return await self._stream(request, chunks)

    # -- OpenAI chat completions ---------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, step = await self._take("chat", request)
        step = step or Answer(self._side_answer)
        n = next(self._ids)
        base = {
            "id": f"chatcmpl-{n:04d}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": str(body.get("model", "fake-model")),
        }
        if isinstance(step, CallTool):
            delta: dict[str, Any] = {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"call_{n:04d}",
                        "type": "function",
                        "function": {"name": step.name, "arguments": json.dumps(step.arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            delta = {"role": "assistant", "content": step.text}
            finish = "stop"
        usage = {
            "prompt_tokens": INPUT_TOKENS,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        }
        chunks = [
            _sse(None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            _sse(
                None,
                {
                    **base,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                    "usage": usage,
                },
            ),
            _sse(None, "[DONE]"),
        ]
        return await self._stream(request, chunks)

    @staticmethod
    async def _stream(request: web.Request, chunks: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response
