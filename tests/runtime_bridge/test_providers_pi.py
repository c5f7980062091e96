"""The real ``pi`` CLI, launched through the adapter against the fake chat completions API, and
the flags, files and permission reading each policy gives a Pi launch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge import approvals
from runtime_bridge.approvals import ApprovalRequest
from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers import (
    LaunchRequest,
    MemoryAttachment,
    PlannedFile,
    Result,
    build_plan,
    run,
)
from runtime_bridge.providers.pi import EXTENSION_FILE, describe
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    BINDING,
    CREDENTIAL,
    HUB_URL,
    StubCli,
    collect,
    offline_request,
)

pytestmark = [pytest.mark.timeout(90)]

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
    **options: Any,
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
        **options,
    )


@pytest.mark.e2e
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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


def planned(tmp_path: Path, permissions: str) -> LaunchRequest:
    """A Pi launch request under ``permissions``, for its plan alone (nothing runs)."""
    return offline_request(
        tmp_path,
        "http://127.0.0.1:9",
        "pi",
        "pi",
        None,
        prompt="Fix the build",
        extra_args=PI_ARGS,
        permissions=permissions,
    )


def test_auto_plans_pi_as_it_is_with_no_extension_and_no_socket(tmp_path: Path) -> None:
    plan = build_plan(planned(tmp_path, approvals.AUTO))
    assert plan.argv == ("pi", "-p", "--mode", "json", *PI_ARGS)
    assert plan.files == ()
    assert plan.approval_socket is None
    assert approvals.SOCKET_ENV not in plan.env
    assert plan.permissions == approvals.AUTO
    assert plan.warnings == ()


def test_read_only_offers_pi_no_edit_tools(tmp_path: Path) -> None:
    plan = build_plan(planned(tmp_path, approvals.READ_ONLY))
    # After the operator's arguments, so they cannot give the edit tools back.
    assert plan.argv == ("pi", "-p", "--mode", "json", *PI_ARGS, "--tools", "read,bash")
    assert plan.files == ()
    assert plan.approval_socket is None
    assert approvals.SOCKET_ENV not in plan.env
    assert plan.permissions == approvals.READ_ONLY


def test_ask_loads_only_the_permission_extension_and_names_the_socket(tmp_path: Path) -> None:
    request = planned(tmp_path, approvals.ASK)
    plan = build_plan(request)
    extension = request.run_dir / EXTENSION_FILE
    assert plan.argv == (
        "pi",
        "-p",
        "--mode",
        "json",
        *PI_ARGS,
        "--no-extensions",
        "--extension",
        str(extension),
    )
    shipped = Path(__file__).parents[2] / "runtime_bridge" / "providers" / "pi_permissions.js"
    assert plan.files == (PlannedFile(extension, shipped.read_text()),)
    socket = request.run_dir / approvals.SOCKET_NAME
    assert plan.approval_socket == socket
    assert plan.env[approvals.SOCKET_ENV] == str(socket)
    assert plan.permissions == approvals.ASK
    assert plan.warnings == ()
    shown = plan.to_json()
    assert shown["approval_socket"] == str(socket)
    assert shown["permissions"] == approvals.ASK


def test_pis_read_tools_need_nobody() -> None:
    for tool in ("read", "grep", "find", "ls"):
        assert describe(tool, {"path": "."}) is None


def test_a_write_is_asked_with_its_path_and_content() -> None:
    assert describe("write", {"path": "src/a.py", "content": "print(1)\n"}) == ApprovalRequest(
        "write", approvals.EDIT, "src/a.py", "print(1)\n"
    )
    # Never cut: one too long to show a person whole is denied without asking anyone.
    big = describe("write", {"path": "big.txt", "content": "x" * (approvals.DETAIL_CHARS * 2)})
    assert big is not None and len(big.detail) == approvals.DETAIL_CHARS * 2
    refused = big.refusal()
    assert refused is not None and not refused.allowed
    assert "smaller edits" in refused.message


def test_an_edit_is_asked_with_its_path_and_each_replacement() -> None:
    edits = [
        {"oldText": "a = 1\nb = 2", "newText": "a = 3"},
        {"oldText": "c", "newText": "d"},
    ]
    assert describe("edit", {"path": "m.py", "edits": edits}) == ApprovalRequest(
        "edit", approvals.EDIT, "m.py", "- a = 1\n- b = 2\n+ a = 3\n\n- c\n+ d"
    )


def test_a_tool_amux_does_not_know_is_asked_with_its_input() -> None:
    assert describe("deploy", {"target": "prod"}) == ApprovalRequest(
        "deploy", approvals.TOOL, "deploy", '{"target": "prod"}'
    )
