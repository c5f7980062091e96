"""The real ``pi`` CLI, launched through the adapter against the fake chat completions API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers import (
    LaunchRequest,
    MemoryAttachment,
    Result,
    build_plan,
    run,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    BINDING,
    CREDENTIAL,
    HUB_URL,
    StubCli,
    collect,
    offline_request,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PI_ARGS = ("--provider", "fake", "--model", "fake-model")


def pi_agent_source(tmp_path: Path, model: FakeModelServer) -> Path:
    """An operator's Pi agent directory: the fake provider, plus history that must not be copied."""
    source = tmp_path / "operator-pi-agent"
    (source / "sessions").mkdir(parents=True, exist_ok=True)
    (source / "sessions" / "private.jsonl").write_text("{}\n")
    models = {
        "providers": {
            "fake": {
                "baseUrl": f"{model.base_url}/v1",
                "api": "openai-completions",
                "apiKey": "FAKE_KEY",
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [
                    {
                        "id": "fake-model",
                        "reasoning": False,
                        "contextWindow": 128000,
                        "maxTokens": 4096,
                    }
                ],
            }
        }
    }
    (source / "models.json").write_text(json.dumps(models))
    return source


def request_for(
    tmp_path: Path,
    model: FakeModelServer,
    executable: str,
    memory: MemoryAttachment | None,
    resume_id: str | None = None,
    prompt: str = "-Which language do I prefer?",
) -> LaunchRequest:
    return offline_request(
        tmp_path,
        model.base_url,
        "pi",
        executable,
        memory,
        resume_id=resume_id,
        prompt=prompt,
        state_dir=tmp_path / "state",
        append_instructions="Answer briefly.",
        extra_args=PI_ARGS,
        provider_home_source=pi_agent_source(tmp_path, model),
    )


async def test_bound_pi_uses_the_amux_cli_and_gets_the_cli_protocol(
    tmp_path: Path,
    pi_bin: str,
    stub_cli: StubCli,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    script: list[Step] = [
        CallTool("bash", {"command": "amux memory search language"}),
        CallTool(
            "bash",
            {
                "command": "printf '%s\\n' '- Prefers English.' | "
                "amux memory upsert preferences/communication.md --expected-revision absent"
            },
        ),
        Answer("You prefer English."),
    ]
    memory = attachment_for(cli_dir=stub_cli.directory)
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, pi_bin, memory))
        events = await collect(run(plan))

    result = events[-1]
    assert isinstance(result, Result), events
    assert result.text == "You prefer English."
    assert result.native_session_id
    connection = {"AMUX_HUB_URL": HUB_URL, "AMUX_TOKEN": CREDENTIAL, "AMUX_MEMORY_BINDING": BINDING}
    assert stub_cli.calls() == [
        {"argv": ["memory", "search", "language"], "stdin": None, "env": connection},
        {
            "argv": [
                "memory",
                "upsert",
                "preferences/communication.md",
                "--expected-revision",
                "absent",
            ],
            "stdin": "- Prefers English.\n",
            "env": connection,
        },
    ]
    assert any("STUB-CLI-HIT" in text for _, text in model.tool_results)
    first = model.main_requests[0]
    merged = merge_instructions("Answer briefly.", protocol_text("cli"))
    assert merged.strip() in first.system_text
    assert "amux.memory_search" not in first.system_text
    # The prompt arrived intact although it starts like a flag.
    assert "-Which language do I prefer?" in str(first.body["messages"])
    # Only configuration was provisioned into the launch's own agent dir, not history.
    agent_dir = tmp_path / "state" / "pi-agent"
    assert (agent_dir / "models.json").is_file()
    assert not (agent_dir / "sessions" / "private.jsonl").exists()


async def test_resumed_pi_continues_the_native_session(
    tmp_path: Path,
    pi_bin: str,
    stub_cli: StubCli,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    memory = attachment_for(cli_dir=stub_cli.directory)
    async with FakeModelServer([Answer("First answer.")]) as model:
        first = await collect(run(build_plan(request_for(tmp_path, model, pi_bin, memory))))
        session = first[-1]
        assert isinstance(session, Result) and session.native_session_id
        model.add_steps([Answer("Second answer.")])
        second = await collect(
            run(
                build_plan(
                    request_for(
                        tmp_path,
                        model,
                        pi_bin,
                        memory,
                        resume_id=session.native_session_id,
                        prompt="And before?",
                    )
                )
            )
        )

    resumed = second[-1]
    assert isinstance(resumed, Result), second
    assert resumed.text == "Second answer."
    assert resumed.native_session_id == session.native_session_id
    last = model.main_requests[-1]
    assert "First answer." in str(last.body["messages"])
    assert protocol_text("cli").strip() in last.system_text


async def test_unbound_pi_has_no_protocol_and_no_memory_connection(
    tmp_path: Path, pi_bin: str
) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        plan = build_plan(request_for(tmp_path, model, pi_bin, memory=None))
        events = await collect(run(plan))

    assert isinstance(events[-1], Result), events
    system = model.main_requests[0].system_text
    assert "Answer briefly." in system
    assert "amux memory" not in system
    assert {key for key in plan.env if key.startswith("AMUX_")} == set(NO_OWNER_TOKEN)
