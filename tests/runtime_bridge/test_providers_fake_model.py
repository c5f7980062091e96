"""The fake model server's step selection, which every CLI test relies on."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.fakes.model_server import Answer, CallTool, FakeModelServer


async def post(server: FakeModelServer, path: str, body: dict[str, Any]) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}{path}", json=body) as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_side_requests_get_a_plain_answer_without_consuming_a_step() -> None:
    tools = [{"name": "Read", "input_schema": {}}]
    async with FakeModelServer([CallTool("Read", {"path": "a"}), Answer("bye")]) as server:
        side = await post(
            server,
            "/v1/messages",
            {"stream": True, "messages": [{"role": "user", "content": "title?"}]},
        )
        first = await post(
            server,
            "/v1/messages",
            {"stream": True, "tools": tools, "messages": [{"role": "user", "content": "go"}]},
        )
        retried = await post(
            server,
            "/v1/messages",
            {"stream": True, "tools": tools, "messages": [{"role": "user", "content": "go"}]},
        )
    assert '"text_delta", "text": "ok"' in side
    assert '"name": "Read"' in first and json.dumps(json.dumps({"path": "a"})) in first
    assert retried == first.replace("toolu_0002", "toolu_0003").replace("msg_0002", "msg_0003")
    assert [r.main for r in server.requests] == [False, True, True]
    assert server.steps_left == 1


async def test_chat_and_responses_apis_stream_the_scripted_steps() -> None:
    async with FakeModelServer(
        [Answer("hello"), CallTool("mcp__memory__amux_memory_get", {})]
    ) as server:
        chat = await post(
            server,
            "/v1/chat/completions",
            {
                "stream": True,
                "tools": [{"type": "function", "function": {"name": "bash"}}],
                "messages": [
                    {"role": "system", "content": "SYS"},
                    {"role": "user", "content": "hi"},
                ],
            },
        )
        responses = await post(
            server,
            "/v1/responses",
            {
                "stream": True,
                "tools": [{"type": "function", "name": "x"}],
                "input": [
                    {"role": "developer", "content": [{"type": "input_text", "text": "DEV"}]}
                ],
            },
        )
    assert '"content": "hello"' in chat and chat.rstrip().endswith("data: [DONE]")
    assert '"namespace": "mcp__memory"' in responses and '"name": "amux_memory_get"' in responses
    assert server.requests[0].system_text == "SYS"
    assert server.requests[1].role_text("developer") == "DEV"


async def test_a_second_identical_conversation_gets_the_next_step() -> None:
    body = {
        "stream": True,
        "tools": [{"name": "Read"}],
        "messages": [{"role": "user", "content": "go"}],
    }
    async with FakeModelServer([Answer("one"), Answer("two")]) as server:
        await post(server, "/v1/messages", body)
        await post(server, "/v1/messages", {**body, "messages": [{"role": "user", "content": "x"}]})
        await post(server, "/v1/messages", body)
    assert [r.step for r in server.requests] == [Answer("one"), Answer("two"), Answer("done")]
