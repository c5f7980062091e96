"""Codex control-protocol failure paths, against a scripted stand-in for an older app-server.

The real pinned Codex supports every call amux needs, so the refusals an older or different build
would give are played by a small executable speaking the same newline-delimited JSON-RPC on stdio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.approvals import ASK, COMMAND, EDIT, ApprovalAnswer, ApprovalRequest
from runtime_bridge.codex_rpc import CodexRpc, Unhandled
from runtime_bridge.providers import (
    AgentProtocolError,
    LaunchRequest,
    MemoryAttachment,
    NativeMemoryUnconfirmed,
    Progress,
    Result,
    build_plan,
    run,
)
from runtime_bridge.providers.plan import MASK
from tests.runtime_bridge.conftest import CREDENTIAL, collect

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

MEMORY_OFF = {
    "features": {"memories": False},
    "memories": {"use_memories": False, "generate_memories": False},
}

APP_SERVER = """#!{python}
import json, sys
behaviour = json.loads({behaviour!r})
log = open({log!r}, "a", encoding="utf-8")
if behaviour.get("die"):
    sys.stderr.write(behaviour["die"] + "\\n")
    sys.exit(1)
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
def finish():
    send({{"method": "item/completed", "params": {{"threadId": "t-42",
          "item": {{"type": "agentMessage", "text": "hello"}}}}}})
    send({{"method": "turn/completed", "params": {{"threadId": "t-42",
          "turn": {{"status": "completed"}}}}}})
default = [{{"id": 900, "method": "item/commandExecution/requestApproval", "params": {{}}}}]
awaited = set()
for line in sys.stdin:
    message = json.loads(line)
    log.write(json.dumps(message) + "\\n")
    log.flush()
    method = message.get("method")
    if "id" not in message:
        continue
    if method is None:
        # The client's answer to one of the stand-in's requests; the turn ends after the last.
        awaited.discard(message["id"])
        if not awaited:
            finish()
    elif method in behaviour.get("refuse", []):
        send({{"id": message["id"], "error": {{"code": -32601, "message": "unknown method"}}}})
    elif method == "initialize":
        send({{"id": message["id"], "result": {{"userAgent": "stand-in"}}}})
    elif method == "config/read":
        send({{"id": message["id"], "result": {{"config": behaviour["config"]}}}})
    elif method in ("thread/start", "thread/resume"):
        send({{"id": message["id"], "result": {{"thread": {{"id": "t-42"}}}}}})
    elif method == "thread/memoryMode/set":
        send({{"id": message["id"], "result": {{}}}})
    elif method == "turn/start":
        send({{"id": message["id"], "result": {{"turn": {{"id": "u-1"}}}}}})
        for sent in behaviour.get("send", default):
            if "id" in sent:
                awaited.add(sent["id"])
            send(sent)
        if not awaited:
            finish()
"""


def stand_in(tmp_path: Path, **behaviour: Any) -> tuple[str, Path]:
    log = tmp_path / "app-server.jsonl"
    script = tmp_path / "codex"
    script.write_text(
        APP_SERVER.format(python=sys.executable, behaviour=json.dumps(behaviour), log=str(log))
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), log


def received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def request_for(tmp_path: Path, executable: str, memory: MemoryAttachment | None) -> LaunchRequest:
    return LaunchRequest(
        provider="codex",
        prompt="hi",
        cwd=tmp_path,
        run_dir=tmp_path / "run",
        developer_instructions="Be brief.",
        memory=memory,
        executable=executable,
        base_env={"PATH": "/usr/bin:/bin"},
    )


async def test_the_control_sequence_of_a_bound_launch(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    executable, log = stand_in(tmp_path, config=MEMORY_OFF)
    events = await collect(run(build_plan(request_for(tmp_path, executable, attachment_for()))))

    assert events == [Progress("hello"), Result("hello", "t-42", {})]
    messages = received(log)
    assert [m.get("method") for m in messages if "method" in m] == [
        "initialize",
        "initialized",
        "config/read",
        "thread/start",
        "thread/memoryMode/set",
        "turn/start",
    ]
    assert messages[0]["params"]["capabilities"] == {"experimentalApi": True}
    start = next(m for m in messages if m.get("method") == "thread/start")
    assert start["params"]["developerInstructions"].startswith("Be brief.\n\n# amux memory")
    assert next(m for m in messages if m.get("method") == "thread/memoryMode/set")["params"] == {
        "threadId": "t-42",
        "mode": "disabled",
    }
    assert start["params"]["approvalPolicy"] == "never"
    assert start["params"]["sandbox"] == "danger-full-access"
    # With nobody to ask, the approval request was declined rather than left hanging.
    decline = next(m for m in messages if m.get("id") == 900 and "method" not in m)
    assert decline["result"] == {"decision": "decline"}


async def test_an_unbound_launch_makes_no_memory_calls_and_keeps_the_configured_instructions(
    tmp_path: Path,
) -> None:
    executable, log = stand_in(tmp_path, config={"developer_instructions": "Operator first."})
    events = await collect(run(build_plan(request_for(tmp_path, executable, None))))
    assert isinstance(events[-1], Result)
    methods = [m.get("method") for m in received(log) if "method" in m]
    assert "thread/memoryMode/set" not in methods
    # Sent developer instructions replace the configured ones, so both are sent, in order.
    start = next(m for m in received(log) if m.get("method") == "thread/start")
    assert start["params"]["developerInstructions"] == "Operator first.\n\nBe brief."


async def test_a_launch_with_no_instructions_of_its_own_reads_no_config(tmp_path: Path) -> None:
    executable, log = stand_in(tmp_path, config={"developer_instructions": "Operator first."})
    request = dataclasses.replace(
        request_for(tmp_path, executable, None), developer_instructions=None
    )
    events = await collect(run(build_plan(request)))
    assert isinstance(events[-1], Result)
    methods = [m.get("method") for m in received(log) if "method" in m]
    assert "config/read" not in methods
    start = next(m for m in received(log) if m.get("method") == "thread/start")
    assert "developerInstructions" not in start["params"]


async def test_unsupported_thread_memory_mode_fails_the_launch_by_name(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    executable, log = stand_in(tmp_path, config=MEMORY_OFF, refuse=["thread/memoryMode/set"])
    with pytest.raises(NativeMemoryUnconfirmed, match="thread/memoryMode/set") as caught:
        await collect(run(build_plan(request_for(tmp_path, executable, attachment_for()))))
    assert caught.value.code == "native_memory_unconfirmed"
    assert "turn/start" not in [m.get("method") for m in received(log)]


async def test_unsupported_config_read_fails_the_launch_by_name(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    executable, log = stand_in(tmp_path, config=MEMORY_OFF, refuse=["config/read"])
    with pytest.raises(NativeMemoryUnconfirmed, match="config/read"):
        await collect(run(build_plan(request_for(tmp_path, executable, attachment_for()))))
    assert "thread/start" not in [m.get("method") for m in received(log)]


async def test_missing_memory_settings_fail_the_launch_naming_each(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    executable, _ = stand_in(tmp_path, config={"features": {"memories": False}})
    with pytest.raises(
        NativeMemoryUnconfirmed,
        match=r"memories\.use_memories=null, memories\.generate_memories=null",
    ):
        await collect(run(build_plan(request_for(tmp_path, executable, attachment_for()))))


async def test_an_app_server_that_dies_at_start_reports_its_last_words(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    executable, _ = stand_in(tmp_path, die="Error: unknown configuration key `memories.bogus`")
    with pytest.raises(AgentProtocolError, match="unknown configuration key"):
        await collect(run(build_plan(request_for(tmp_path, executable, attachment_for()))))


def server_request(request_id: int, method: str, **params: Any) -> dict[str, Any]:
    return {"id": request_id, "method": method, "params": {"threadId": "t-42", **params}}


def answers_by_id(log: Path) -> dict[int, dict[str, Any]]:
    return {m["id"]: m for m in received(log) if "id" in m and "method" not in m}


async def test_approval_requests_reach_the_approver_as_a_person_reads_them_and_get_its_decision(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    patch_change = {"path": "/w/a.txt", "kind": {"type": "add"}, "diff": "hello\n"}
    sent = [
        # The changes of a file change come in its item's item/started, before the request.
        {
            "method": "item/started",
            "params": {
                "threadId": "t-42",
                "item": {"type": "fileChange", "id": "fc1", "changes": [patch_change]},
            },
        },
        server_request(901, "item/fileChange/requestApproval", itemId="fc1", reason=None),
        server_request(
            902,
            "item/commandExecution/requestApproval",
            itemId="c2",
            command=f"/bin/bash -lc 'curl -H \"x-token: {CREDENTIAL}\" -o out http://h'",
            cwd="/w",
            reason="fetch it",
        ),
        server_request(903, "item/commandExecution/requestApproval", command="/bin/bash -lc ls"),
        server_request(904, "mcpServer/elicitation/request", serverName="x", message="?"),
        {
            "id": 905,
            "method": "execCommandApproval",
            "params": {
                "conversationId": "t-42",
                "callId": "c5",
                "command": ["rm", "-rf", "build"],
                "cwd": "/w",
                "parsedCmd": [],
            },
        },
        {
            "id": 906,
            "method": "applyPatchApproval",
            "params": {
                "conversationId": "t-42",
                "callId": "c6",
                "fileChanges": {"/w/b.txt": {"type": "update", "unified_diff": "-a\n+b\n"}},
            },
        },
    ]
    executable, log = stand_in(tmp_path, config=MEMORY_OFF, send=sent)
    asked: list[ApprovalRequest] = []

    async def person(request: ApprovalRequest) -> ApprovalAnswer:
        asked.append(request)
        return ApprovalAnswer(request.action == EDIT, "not today")

    request = dataclasses.replace(
        request_for(tmp_path, executable, attachment_for()), permissions=ASK
    )
    events = await collect(run(build_plan(request), person))

    assert isinstance(events[-1], Result), events
    assert asked == [
        ApprovalRequest("fileChange", EDIT, "/w/a.txt", "add /w/a.txt\nhello"),
        ApprovalRequest(
            "commandExecution",
            COMMAND,
            f"/bin/bash -lc 'curl -H \"x-token: {MASK}\" -o out http://h'",
            "cwd: /w\nreason: fetch it",
        ),
        ApprovalRequest("commandExecution", COMMAND, "rm -rf build", "cwd: /w"),
        ApprovalRequest("fileChange", EDIT, "/w/b.txt", "update /w/b.txt\n-a\n+b"),
    ]
    answers = answers_by_id(log)
    assert answers[901]["result"] == {"decision": "accept"}
    assert answers[902]["result"] == {"decision": "decline"}
    # A plainly read-only command runs without anyone being asked.
    assert answers[903]["result"] == {"decision": "accept"}
    assert answers[904]["error"]["code"] == -32601
    assert answers[905]["result"] == {"decision": {"denied": {"rejection": "not today"}}}
    assert answers[906]["result"] == {"decision": "approved"}
    start = next(m for m in received(log) if m.get("method") == "thread/start")
    assert start["params"]["approvalPolicy"] == "untrusted"
    assert start["params"]["sandbox"] == "danger-full-access"


async def test_a_large_file_change_reaches_the_approver_whole_and_a_larger_one_nobody(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    # Its harmful line past the 6,000 characters a request used to keep.
    diff = "+x = 1\n" * 1500 + "+os.system('rm -rf ~')\n"
    huge = "+y = 2\n" * 10_000
    sent: list[dict[str, Any]] = []
    for number, (item, body) in enumerate((("fc1", diff), ("fc2", huge))):
        change = {"path": "/w/a.py", "kind": {"type": "update"}, "diff": body}
        item_fields = {"type": "fileChange", "id": item, "changes": [change]}
        sent.append({"method": "item/started", "params": {"threadId": "t-42", "item": item_fields}})
        sent.append(server_request(910 + number, "item/fileChange/requestApproval", itemId=item))
    executable, log = stand_in(tmp_path, config=MEMORY_OFF, send=sent)
    asked: list[ApprovalRequest] = []

    async def person(request: ApprovalRequest) -> ApprovalAnswer:
        asked.append(request)
        return ApprovalAnswer(True)

    request = dataclasses.replace(
        request_for(tmp_path, executable, attachment_for()), permissions=ASK
    )
    events = await collect(run(build_plan(request), person))

    assert isinstance(events[-1], Result), events
    assert [r.detail for r in asked] == ["update /w/a.py\n" + diff.rstrip("\n")]
    answers = answers_by_id(log)
    assert answers[910]["result"] == {"decision": "accept"}
    assert answers[911]["result"] == {"decision": "decline"}


async def pipe_pair() -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamWriter
]:
    """Streams over a real socket pair: the client's, and the server's ends."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    server_reader, server_writer = await asyncio.open_connection(sock=theirs)
    return reader, writer, server_reader, server_writer


async def test_a_request_waiting_on_a_person_does_not_stop_notifications_being_read() -> None:
    reader, writer, server_reader, server_writer = await pipe_pair()
    decided = asyncio.Event()
    seen: list[str] = []

    async def slow_person(method: str, params: dict[str, Any]) -> Any:
        if method != "item/commandExecution/requestApproval":
            raise Unhandled(method)
        await decided.wait()
        return {"decision": "accept"}

    rpc = CodexRpc(reader, writer, on_request=slow_person, observe=lambda n: seen.append(n.method))
    try:
        for message in (
            {"id": 7, "method": "item/commandExecution/requestApproval", "params": {}},
            {"id": 8, "method": "item/tool/requestUserInput", "params": {}},
            {"method": "item/started", "params": {"n": 1}},
        ):
            server_writer.write((json.dumps(message) + "\n").encode())
        await server_writer.drain()
        notes = rpc.notifications()
        async with asyncio.timeout(5):
            note = await anext(notes)
            # Read while the first request still waits; the second was declined meanwhile.
            assert note.params == {"n": 1} and seen == ["item/started"]
            declined = json.loads(await server_reader.readline())
            assert declined["id"] == 8 and declined["error"]["code"] == -32601
            decided.set()
            accepted = json.loads(await server_reader.readline())
        assert accepted == {"id": 7, "result": {"decision": "accept"}}
    finally:
        await rpc.close()
        server_writer.close()
        writer.close()


async def test_a_handler_that_fails_answers_with_an_error_rather_than_never() -> None:
    reader, writer, server_reader, server_writer = await pipe_pair()

    async def broken(method: str, params: dict[str, Any]) -> Any:
        raise RuntimeError("boom")

    rpc = CodexRpc(reader, writer, on_request=broken)
    try:
        server_writer.write(b'{"id": "a", "method": "item/fileChange/requestApproval"}\n')
        await server_writer.drain()
        async with asyncio.timeout(5):
            answer = json.loads(await server_reader.readline())
        assert answer["id"] == "a" and answer["error"]["code"] == -32603
    finally:
        await rpc.close()
        server_writer.close()
        writer.close()


async def test_closing_cancels_a_request_still_waiting_on_a_person() -> None:
    reader, writer, _, server_writer = await pipe_pair()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def waits(method: str, params: dict[str, Any]) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rpc = CodexRpc(reader, writer, on_request=waits)
    server_writer.write(b'{"id": 1, "method": "item/commandExecution/requestApproval"}\n')
    await server_writer.drain()
    async with asyncio.timeout(5):
        await started.wait()
    await rpc.close()
    assert cancelled.is_set()
    server_writer.close()
    writer.close()
