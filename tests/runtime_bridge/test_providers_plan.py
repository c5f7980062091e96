"""Pure plan builders: exact argv and environment, masking, and the other-provider rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hub.errors import InvalidArgument
from hub.eventbudget import MAX_EVENT_BYTES
from runtime_bridge.launch_env import DEFAULT_PASS_ENV, NO_OWNER_TOKEN
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers import (
    LaunchRequest,
    MemoryAttachment,
    PlanUpdate,
    Progress,
    Result,
    ToolStep,
    build_plan,
)
from runtime_bridge.providers.claude import ClaudeStream
from runtime_bridge.providers.codex import CodexTurn, unconfirmed_memory_settings
from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.providers.pi import PiStream
from runtime_bridge.providers.plan import MASK, STEP_SUBJECT_CHARS, Failure
from runtime_bridge.providers.process import resolve_executable

SECRET = "tok-very-secret"
MEMORY = MemoryAttachment(
    hub_url="http://hub.internal:7800",
    credential=SECRET,
    binding="principal:p1",
    mcp_argv=("/opt/amux/bin/amux", "mcp"),
    cli_dir=Path("/run/amux/r1/agent-config/memory/bin"),
)
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/usr/local/bin",
    "Path": "/should/not/survive",
    "HOME": "/home/svc",
    "ANTHROPIC_API_KEY": "sk-ant",
    "OPENAI_API_KEY": "sk-oai",
    "CLAUDE_CONFIG_DIR": "/home/svc/.claude-alt",
    "CODEX_HOME": "/home/svc/.codex",
    "PI_CODING_AGENT_DIR": "/home/svc/.pi/agent",
    "AMUX_TOKEN": "service-token",
    "DATABASE_URL": "postgres://svc",
    "LC_ALL": "C.UTF-8",
}


def request(provider: str, memory: MemoryAttachment | None = MEMORY, **kw: object) -> LaunchRequest:
    fields: dict[str, object] = {
        "provider": provider,
        "prompt": "hello",
        "cwd": Path("/work/repo"),
        "run_dir": Path("/run/amux/r1"),
        "memory": memory,
        "base_env": BASE_ENV,
    }
    fields.update(kw)
    return LaunchRequest(**fields)  # type: ignore[arg-type]


def test_bound_claude_plan_is_exact() -> None:
    plan = build_plan(request("claude", append_instructions="Be brief.", resume_id="s-1"))
    config = Path("/run/amux/r1/agent-config/memory/claude-mcp.json")
    assert plan.argv == (
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--resume",
        "s-1",
        "--mcp-config",
        str(config),
        "--strict-mcp-config",
        "--allowedTools",
        "mcp__memory__*",
        "--append-system-prompt",
        merge_instructions("Be brief.", protocol_text("mcp")),
        # The request's policy (auto): amux's sandbox is the boundary.
        "--permission-mode",
        "bypassPermissions",
    )
    assert plan.stdin == "hello"
    assert plan.env == {
        **NO_OWNER_TOKEN,
        "ANTHROPIC_API_KEY": "sk-ant",
        "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
        "ENABLE_TOOL_SEARCH": "false",
        "HOME": "/home/svc",
        "IS_SANDBOX": "1",
        "LC_ALL": "C.UTF-8",
        "OPENAI_API_KEY": "sk-oai",
        "PATH": "/usr/local/bin:/usr/bin",
    }
    (planned,) = plan.files
    assert planned.path == config and planned.mode == 0o600
    assert json.loads(planned.content) == {
        "mcpServers": {
            "memory": {
                "type": "stdio",
                "command": "/opt/amux/bin/amux",
                "args": ["mcp"],
                "env": {
                    "AMUX_HUB_URL": "http://hub.internal:7800",
                    "AMUX_TOKEN": SECRET,
                    "AMUX_MEMORY_BINDING": "principal:p1",
                    **NO_OWNER_TOKEN,
                },
            }
        }
    }
    assert plan.binding == "principal:p1"
    assert plan.warnings == ()


def test_unbound_claude_plan_has_only_the_configured_append_text() -> None:
    plan = build_plan(request("claude", memory=None, append_instructions="Be brief."))
    assert plan.argv == (
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--append-system-prompt",
        "Be brief.",
        "--permission-mode",
        "bypassPermissions",
    )
    assert "CLAUDE_CODE_DISABLE_AUTO_MEMORY" not in plan.env
    assert plan.files == () and plan.binding is None


def test_bound_codex_plan_sets_memory_off_launch_locally_and_keeps_the_token_out_of_argv() -> None:
    plan = build_plan(
        request("codex", developer_instructions="Use tabs.", state_dir=Path("/var/amux/s1"))
    )
    assert plan.argv == (
        "codex",
        # Codex's plan tool, which the cards show the plan of.
        "-c",
        "tools.update_plan.enabled=true",
        "-c",
        "features.memories=false",
        "-c",
        "memories.use_memories=false",
        "-c",
        "memories.generate_memories=false",
        "-c",
        'mcp_servers.memory.command="/opt/amux/bin/amux"',
        "-c",
        'mcp_servers.memory.args=["mcp"]',
        "-c",
        "mcp_servers.memory.env_vars="
        '["AMUX_HUB_URL", "AMUX_MEMORY_BINDING", "AMUX_TOKEN", "AMUX_OWNER_TOKEN_FALLBACK"]',
        "-c",
        'mcp_servers.memory.default_tools_approval_mode="approve"',
        "-c",
        "mcp_servers.memory.required=true",
        "-c",
        "mcp_servers.memory.startup_timeout_sec=30",
        # The request's policy (auto): Codex's own sandbox is off inside amux's.
        "-c",
        'sandbox_mode="danger-full-access"',
        "-c",
        'approval_policy="never"',
        "app-server",
    )
    assert SECRET not in " ".join(plan.argv)
    assert plan.env["CODEX_HOME"] == "/var/amux/s1/codex-home"
    assert plan.env["AMUX_TOKEN"] == SECRET
    assert plan.codex is not None and plan.codex.memory_disabled
    assert plan.codex.developer_instructions == merge_instructions(
        "Use tabs.", protocol_text("mcp")
    )
    assert plan.stdin is None


def test_unbound_codex_plan_makes_no_memory_changes() -> None:
    plan = build_plan(request("codex", memory=None, developer_instructions="Use tabs."))
    assert plan.argv == (
        "codex",
        # Codex's plan tool, which the cards show the plan of.
        "-c",
        "tools.update_plan.enabled=true",
        "-c",
        'sandbox_mode="danger-full-access"',
        "-c",
        'approval_policy="never"',
        "app-server",
    )
    assert plan.codex is not None
    assert plan.codex.developer_instructions == "Use tabs."
    assert not plan.codex.memory_disabled
    assert {key for key in plan.env if key.startswith("AMUX_")} == set(NO_OWNER_TOKEN)
    assert plan.env["CODEX_HOME"] == "/run/amux/r1/codex-home"


def test_codex_plan_provisions_only_the_configured_config_file() -> None:
    plan = build_plan(request("codex", provider_home_source=Path("/etc/amux/codex.toml")))
    (copy,) = plan.copies
    assert copy.source == Path("/etc/amux/codex.toml")
    assert copy.destination == Path("/run/amux/r1/codex-home/config.toml")


def test_bound_pi_plan_puts_the_cli_first_on_path_with_the_cli_protocol() -> None:
    plan = build_plan(request("pi", resume_id="abc", extra_args=("--model", "m")))
    assert plan.argv == (
        "pi",
        "-p",
        "--mode",
        "json",
        "--session",
        "abc",
        "--append-system-prompt",
        protocol_text("cli"),
        "--model",
        "m",
    )
    assert plan.env["PATH"] == "/run/amux/r1/agent-config/memory/bin:/usr/local/bin:/usr/bin"
    assert plan.env["PI_CODING_AGENT_DIR"] == "/run/amux/r1/pi-agent"
    assert plan.env["AMUX_MEMORY_BINDING"] == "principal:p1"
    assert plan.env["AMUX_HUB_URL"] == "http://hub.internal:7800"
    assert plan.stdin == "hello"


@pytest.mark.parametrize("provider", ["aider", "gemini"])
def test_other_provider_reports_missing_memory_and_gets_no_protocol(provider: str) -> None:
    plan = build_plan(request(provider, append_instructions="x", executable="/usr/bin/" + provider))
    assert plan.warnings == (f"memory capability missing for provider {provider}",)
    assert plan.argv == (f"/usr/bin/{provider}",)
    assert plan.stdin == "hello"
    assert plan.binding is None
    assert {key for key in plan.env if key.startswith("AMUX_")} == set(NO_OWNER_TOKEN)
    assert "amux" not in json.dumps(plan.to_json()).replace(f"/usr/bin/{provider}", "")


def test_other_provider_unbound_has_no_warning() -> None:
    plan = build_plan(request("aider", memory=None, executable="/usr/bin/aider"))
    assert plan.warnings == ()


def test_a_provider_without_a_declared_executable_is_never_looked_up_by_its_name() -> None:
    with pytest.raises(InvalidArgument, match="not declared"):
        build_plan(request("sh", memory=None))


def test_masking_covers_urls_with_passwords_and_secret_named_variables() -> None:
    env = {**BASE_ENV, "HTTPS_PROXY": "http://ops:hunter22@proxy:3128", "GH_TOKEN": "ghp_abcdef"}
    plan = build_plan(request("claude", base_env=env, pass_env=(*DEFAULT_PASS_ENV, "GH_*")))
    text = "fetched via http://ops:hunter22@proxy:3128 with ghp_abcdef and " + SECRET
    assert plan.mask(text) == f"fetched via http://ops:{MASK}@proxy:3128 with {MASK} and {MASK}"
    shown = json.dumps(plan.to_json())
    assert "hunter22" not in shown and "ghp_abcdef" not in shown


@pytest.mark.parametrize("provider", ["claude", "codex", "pi"])
def test_plan_json_masks_credentials_and_key_values(provider: str) -> None:
    plan = build_plan(request(provider))
    shown = json.dumps(plan.to_json())
    assert SECRET not in shown
    assert "sk-ant" not in shown and "sk-oai" not in shown
    view = plan.to_json()
    assert view["env"]["ANTHROPIC_API_KEY"] == MASK
    assert view["binding"] == "principal:p1"
    assert view["provider"] == provider
    unmasked = plan.to_json(mask_secrets=False)
    assert unmasked["env"]["OPENAI_API_KEY"] == "sk-oai"


@pytest.mark.parametrize("provider", ["claude", "codex", "pi"])
def test_plans_never_inherit_service_homes_or_tokens(provider: str) -> None:
    env = build_plan(request(provider, memory=None)).env
    assert "CLAUDE_CONFIG_DIR" not in env
    assert env.get("CODEX_HOME") != "/home/svc/.codex"
    assert env.get("PI_CODING_AGENT_DIR") != "/home/svc/.pi/agent"
    assert "AMUX_TOKEN" not in env
    assert "DATABASE_URL" not in env
    assert "Path" not in env


def test_claude_stream_yields_progress_then_result_with_session() -> None:
    stream = ClaudeStream()
    events = [
        *stream.feed({"type": "system", "subtype": "init", "session_id": "s-9"}),
        *stream.feed(
            {
                "type": "assistant",
                "message": {
                    "content": [
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "name": "mcp__memory__amux_memory_search"},
                    ]
                },
            }
        ),
        *stream.feed(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "Done.",
                "session_id": "s-9",
                "usage": {"output_tokens": 3},
            }
        ),
        *stream.finish(0, ""),
    ]
    assert events == [
        Progress("Looking."),
        ToolStep("tool", "mcp__memory__amux_memory_search"),
        Result("Done.", "s-9", {"output_tokens": 3}),
    ]


def test_claude_stream_error_result_is_a_failure() -> None:
    stream = ClaudeStream()
    stream.feed({"type": "result", "subtype": "error_during_execution", "is_error": True})
    (event,) = stream.finish(1, "")
    assert isinstance(event, Failure) and "error_during_execution" in event.message


def test_stream_without_result_fails_with_the_last_stderr_line() -> None:
    (event,) = PiStream().finish(2, "starting\nError: Unknown option: --bogus")
    assert event == Failure(
        "agent exited with status 2 before finishing: Error: Unknown option: --bogus"
    )


def test_pi_stream_reports_model_errors() -> None:
    stream = PiStream()
    stream.feed({"type": "session", "id": "p-1"})
    stream.feed(
        {
            "type": "message_end",
            "message": {"role": "assistant", "stopReason": "error", "errorMessage": "429"},
        }
    )
    stream.feed({"type": "agent_end"})
    assert stream.finish(0, "") == [Failure("pi failed: 429")]


def test_codex_turn_failure_names_the_error() -> None:
    turn = CodexTurn("t-1")
    turn.feed("error", {"threadId": "t-1", "error": {"message": "quota"}, "willRetry": False})
    (event,) = turn.feed(
        "turn/completed", {"threadId": "t-1", "turn": {"status": "failed", "error": None}}
    )
    assert event == Failure("codex turn failed: quota")
    assert turn.feed("item/completed", {"threadId": "other", "item": {}}) == []


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        (
            {
                "features": {"memories": False},
                "memories": {"use_memories": False, "generate_memories": False},
            },
            [],
        ),
        (
            {
                "features": {"memories": True},
                "memories": {"use_memories": False, "generate_memories": None},
            },
            ["features.memories=true", "memories.generate_memories=null"],
        ),
        (
            {},
            [
                "features.memories=null",
                "memories.use_memories=null",
                "memories.generate_memories=null",
            ],
        ),
        (
            None,
            [
                "features.memories=null",
                "memories.use_memories=null",
                "memories.generate_memories=null",
            ],
        ),
    ],
)
def test_unconfirmed_memory_settings_names_each_setting_not_false(
    config: object, missing: list[str]
) -> None:
    assert unconfirmed_memory_settings(config) == missing


@pytest.mark.parametrize(
    ("provider", "setting"),
    [
        ("claude", "set AMUX_RUNTIME_CLAUDE to its path"),
        ("codex", "set AMUX_RUNTIME_CODEX to its path"),
        ("pi", "set AMUX_RUNTIME_PI to its path"),
        ("aider", "correct the 'aider' entry of AMUX_RUNTIME_PROVIDERS"),
    ],
)
def test_a_missing_executable_names_the_setting_that_chooses_it(
    provider: str, setting: str, tmp_path: Path
) -> None:
    plan = build_plan(
        request(
            provider,
            memory=None,
            executable=f"{provider}-absent",
            base_env={**BASE_ENV, "PATH": str(tmp_path)},
        )
    )
    with pytest.raises(ExecutableMissing) as caught:
        resolve_executable(plan)
    assert caught.value.message == (
        f"{provider} executable '{provider}-absent' was not found on the launch PATH; "
        f"install it, or {setting}"
    )


def test_claude_todo_list_becomes_the_plan_with_each_steps_status() -> None:
    stream = ClaudeStream()
    todos = [
        {"content": "Read the parser", "status": "completed", "activeForm": "Reading"},
        {"content": "Fix the bug", "status": "in_progress", "activeForm": "Fixing"},
        {"content": "Run the tests", "status": "pending", "activeForm": "Running"},
        {"content": "Odd one", "status": "blocked", "activeForm": "?"},
    ]
    events = stream.feed(
        {
            "type": "assistant",
            "message": {
                "content": [
                    {"type": "text", "text": "Planning."},
                    {"type": "tool_use", "name": "TodoWrite", "input": {"todos": todos}},
                ]
            },
        }
    )
    assert events == [
        Progress("Planning."),
        PlanUpdate(
            (
                ("Read the parser", "completed"),
                ("Fix the bug", "in_progress"),
                ("Run the tests", "pending"),
                # A status the card does not know is shown as still to do.
                ("Odd one", "pending"),
            )
        ),
    ]


def test_a_huge_todo_list_is_bounded_so_its_event_stays_whole_json() -> None:
    stream = ClaudeStream()
    todos = [{"content": "中" * 5000, "status": "pending"} for _ in range(500)]
    (event,) = stream.feed(
        {
            "type": "assistant",
            "message": {
                "content": [{"type": "tool_use", "name": "TodoWrite", "input": {"todos": todos}}]
            },
        }
    )
    assert isinstance(event, PlanUpdate)
    assert len(event.to_json().encode()) < MAX_EVENT_BYTES
    assert json.loads(event.to_json())[0]["status"] == "pending"


def test_codex_plan_updates_become_the_plan() -> None:
    turn = CodexTurn("t-1")
    (event,) = turn.feed(
        "turn/plan/updated",
        {
            "threadId": "t-1",
            "turnId": "u-1",
            "explanation": None,
            "plan": [
                {"step": "Inspect", "status": "completed"},
                {"step": "Patch", "status": "inProgress"},
                {"step": "Verify", "status": "pending"},
            ],
        },
    )
    assert event == PlanUpdate(
        (("Inspect", "completed"), ("Patch", "in_progress"), ("Verify", "pending"))
    )
    assert turn.feed("turn/plan/updated", {"threadId": "other", "plan": []}) == []


def test_a_codex_compact_turn_compacts_the_resumed_thread_and_a_forks_first_turn_forks_it() -> None:
    compact = build_plan(request("codex", memory=None, prompt="/compact", resume_id="t-1"))
    assert compact.codex is not None and compact.codex.compact and not compact.codex.fork
    # Nothing to compact without a thread: the words go to a new thread as a prompt.
    fresh = build_plan(request("codex", memory=None, prompt="/compact"))
    assert fresh.codex is not None and not fresh.codex.compact
    # A person's words are never the command, and Claude keeps its own /compact prompt.
    worded = build_plan(request("codex", memory=None, prompt="/compact now", resume_id="t-1"))
    assert worded.codex is not None and not worded.codex.compact
    claude = build_plan(request("claude", memory=None, prompt="/compact", resume_id="s-1"))
    assert claude.stdin == "/compact" and claude.codex is None
    side = build_plan(request("codex", memory=None, resume_id="t-1", fork=True))
    assert side.codex is not None and side.codex.fork and not side.codex.compact
    # ``amux runtime plan`` shows which the launch is.
    assert compact.to_json()["codex"]["compact"] and side.to_json()["codex"]["fork"]


def test_codex_names_its_model_with_its_usage_and_its_compaction_as_a_step() -> None:
    turn = CodexTurn("t-1", "gpt-5.5")
    item = {"type": "contextCompaction", "id": "c-1"}
    assert turn.feed("item/started", {"threadId": "t-1", "item": item}) == []
    (step,) = turn.feed("item/completed", {"threadId": "t-1", "item": item})
    assert step == ToolStep("compact", "")
    turn.feed(
        "thread/tokenUsage/updated",
        {
            "threadId": "t-1",
            "tokenUsage": {
                "total": {"inputTokens": 11, "outputTokens": 7},
                "last": {"inputTokens": 11},
                "modelContextWindow": 1000,
            },
        },
    )
    (done,) = turn.feed("turn/completed", {"threadId": "t-1", "turn": {"status": "completed"}})
    assert isinstance(done, Result)
    assert done.usage == {
        "model": "gpt-5.5",
        "inputTokens": 11,
        "outputTokens": 7,
        "context_tokens": 11,
        "context_window": 1000,
    }


@pytest.mark.parametrize(
    ("name", "tool_input", "step"),
    [
        ("Read", {"file_path": "src/app.py"}, ToolStep("read", "src/app.py")),
        ("Edit", {"file_path": "src/app.py", "old_string": "a"}, ToolStep("edit", "src/app.py")),
        ("Write", {"file_path": "new.md", "content": "x"}, ToolStep("edit", "new.md")),
        # A command shows its first words, on one line.
        (
            "Bash",
            {"command": "pytest -x -q tests/a.py\n--maxfail 1 -k slow --no-header"},
            ToolStep("run", "pytest -x -q tests/a.py --maxfail 1 …"),
        ),
        ("Grep", {"pattern": "TODO", "path": "src"}, ToolStep("search", "src")),
        ("Glob", {"pattern": "**/*.py"}, ToolStep("search", "**/*.py")),
        ("WebFetch", {"url": "https://example.com/x"}, ToolStep("read", "https://example.com/x")),
        (
            "mcp__memory__amux_memory_get",
            {"path": "a.md"},
            ToolStep("tool", "mcp__memory__amux_memory_get"),
        ),
    ],
)
def test_claude_tool_calls_become_steps_naming_what_they_act_on(
    name: str, tool_input: dict[str, Any], step: ToolStep
) -> None:
    stream = ClaudeStream()
    block = {"type": "tool_use", "name": name, "input": tool_input}
    events = stream.feed({"type": "assistant", "message": {"content": [block]}})
    assert events == [step]


def test_a_steps_subject_is_bounded() -> None:
    stream = ClaudeStream()
    block = {"type": "tool_use", "name": "Read", "input": {"file_path": "/" + "a" * 5000}}
    (event,) = stream.feed({"type": "assistant", "message": {"content": [block]}})
    assert isinstance(event, ToolStep) and len(event.subject) == STEP_SUBJECT_CHARS


def test_codex_items_become_steps() -> None:
    turn = CodexTurn("t-1")
    command = {"type": "commandExecution", "command": "cargo test --all -- --nocapture x y z"}
    change = {"type": "fileChange", "changes": [{"path": "a.rs"}, {"path": "b.rs"}]}
    tool = {"type": "mcpToolCall", "server": "memory", "tool": "amux_memory_get"}
    events = [
        *turn.feed("item/started", {"threadId": "t-1", "item": command}),
        *turn.feed("item/started", {"threadId": "t-1", "item": change}),
        *turn.feed("item/started", {"threadId": "t-1", "item": tool}),
    ]
    assert events == [
        ToolStep("run", "cargo test --all -- --nocapture x …"),
        ToolStep("edit", "a.rs, b.rs"),
        ToolStep("tool", "memory.amux_memory_get"),
    ]


def test_pi_tool_calls_become_steps() -> None:
    stream = PiStream()
    events = stream.feed(
        {"type": "tool_execution_start", "toolName": "bash", "args": {"command": "ls -la"}}
    )
    assert events == [ToolStep("run", "ls -la")]


def test_claude_reports_its_model_and_the_context_its_last_request_held() -> None:
    stream = ClaudeStream()
    stream.feed({"type": "system", "subtype": "init", "model": "claude-x", "session_id": "s"})
    usage = {"input_tokens": 10, "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 90}
    message = {"model": "claude-y", "usage": usage, "content": [{"type": "text", "text": "hi"}]}
    stream.feed({"type": "assistant", "message": message})
    stream.feed(
        {"type": "result", "subtype": "success", "is_error": False, "result": "ok", "usage": {}}
    )
    (result,) = stream.finish(0, "")
    assert isinstance(result, Result)
    assert result.usage == {"model": "claude-y", "context_tokens": 5100}


def test_codex_reports_the_context_its_last_request_held_of_its_window() -> None:
    turn = CodexTurn("t-1")
    usage = {
        "total": {"inputTokens": 900, "outputTokens": 30},
        "last": {"inputTokens": 300, "outputTokens": 10},
        "modelContextWindow": 272_000,
    }
    turn.feed("thread/tokenUsage/updated", {"threadId": "t-1", "tokenUsage": usage})
    (done,) = turn.feed("turn/completed", {"threadId": "t-1", "turn": {"status": "completed"}})
    assert isinstance(done, Result)
    assert done.usage["context_tokens"] == 300 and done.usage["context_window"] == 272_000


@pytest.mark.parametrize(
    ("provider", "words"),
    [
        ("claude", ["--model", "chosen-model"]),
        ("codex", ["-c", 'model="chosen-model"']),
        ("pi", ["--model", "chosen-model"]),
    ],
)
def test_a_conversations_chosen_model_follows_the_operators_arguments(
    provider: str, words: list[str]
) -> None:
    plan = build_plan(request(provider, extra_args=("--model", "operators-model")))
    chosen = build_plan(
        request(provider, extra_args=("--model", "operators-model"), model="chosen-model")
    )
    argv = list(chosen.argv)
    at = next(i for i in range(len(argv)) if argv[i : i + len(words)] == words)
    assert at > argv.index("operators-model")
    assert "chosen-model" not in plan.argv
