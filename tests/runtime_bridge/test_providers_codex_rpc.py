"""Codex control-protocol failure paths, against a scripted stand-in for an older app-server.

The real pinned Codex supports every call amux needs, so the refusals an older or different build
would give are played by a small executable speaking the same newline-delimited JSON-RPC on stdio.
"""

from __future__ import annotations

import dataclasses
import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
from tests.runtime_bridge.conftest import collect

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
for line in sys.stdin:
    message = json.loads(line)
    log.write(json.dumps(message) + "\\n")
    log.flush()
    method = message.get("method")
    if "id" not in message:
        continue
    if method in behaviour.get("refuse", []):
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
        send({{"id": 900, "method": "item/commandExecution/requestApproval", "params": {{}}}})
        send({{"id": message["id"], "result": {{"turn": {{"id": "u-1"}}}}}})
        send({{"method": "item/completed", "params": {{"threadId": "t-42",
              "item": {{"type": "agentMessage", "text": "hello"}}}}}})
        send({{"method": "turn/completed", "params": {{"threadId": "t-42",
              "turn": {{"status": "completed"}}}}}})
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
    # The approval request was declined rather than left hanging.
    decline = next(m for m in messages if m.get("id") == 900)
    assert decline["error"]["code"] == -32601


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
