"""The model gateway: the real CLIs reach the scripted model through it with the operator's key,
while the Agent's own environment holds only its launch's placeholder."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from runtime_bridge.approvals import AUTO
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.doors import LaunchDoors
from runtime_bridge.egress import Egress
from runtime_bridge.gateway import (
    PLACEHOLDER_PREFIX,
    Gateway,
    Grant,
    UsageReader,
    launch_routes,
    operator_upstreams,
)
from runtime_bridge.launch import LaunchSite
from runtime_bridge.network import MODEL, AllowList, door_url
from runtime_bridge.providers import Event, Result, build_plan, run
from tests.fakes.model_server import (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    Answer,
    CallTool,
    FakeModelServer,
    Step,
)
from tests.runtime_bridge.conftest import TEST_PASS_ENV, collect, sandboxed_launch
from tests.runtime_bridge.test_codex_permissions import config_for
from tests.runtime_bridge.test_providers_pi import PI_ARGS, pi_agent_source

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

sandboxed = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="needs bwrap and root: the Agent runs sandboxed, as a uid of its own",
)

ANTHROPIC_KEY = "sk-operator-anthropic-5f1c0d9e"
OPENAI_KEY = "sk-operator-openai-8a2b7c31"
OAUTH_TOKEN = "sk-operator-oauth-44e1aa90"
PI_KEY = "sk-operator-pi-0b9d3e72"
OPERATOR_KEYS = (ANTHROPIC_KEY, OPENAI_KEY, OAUTH_TOKEN, PI_KEY)
# What the Agent runs: its shell's environment and every environment /proc shows it (the CLI's
# own among them: Codex leaves keys out of its commands' environment, not out of its own).
SHOW_ENV = "env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null | sort -u"
# Pi's key is in its models configuration, not its environment.
SHOW_PI = SHOW_ENV + '; cat "$PI_CODING_AGENT_DIR/models.json"'


def worker_env(tmp_path: Path, model: FakeModelServer) -> dict[str, str]:
    """The worker's own environment: the operator's keys, the upstream is the scripted model."""
    home = tmp_path / "worker-home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": model.base_url,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "CLAUDE_CODE_OAUTH_TOKEN": OAUTH_TOKEN,
        "OPENAI_API_KEY": OPENAI_KEY,
        "OPERATOR_PI_KEY": PI_KEY,
    }


def pi_source_with_key(tmp_path: Path, model: FakeModelServer) -> Path:
    """The operator's Pi agent directory, its provider's key named by a variable of the worker."""
    source = pi_agent_source(tmp_path, model)
    models = json.loads((source / "models.json").read_text())
    models["providers"]["fake"]["apiKey"] = "OPERATOR_PI_KEY"
    (source / "models.json").write_text(json.dumps(models))
    return source


def settings_for(
    tmp_path: Path, model: FakeModelServer, provider: str, cli: str
) -> RuntimeSettings:
    options: dict[str, Any] = {provider: cli}
    pass_env = list(TEST_PASS_ENV)
    if provider == "codex":
        options["codex_config"] = config_for(tmp_path, model)
    if provider == "pi":
        options["pi_args"] = list(PI_ARGS)
        options["pi_agent_dir"] = pi_source_with_key(tmp_path, model)
        # Named by the operator's glob, yet kept out: the gateway reads the key from it.
        pass_env.append("OPERATOR_*")
    return RuntimeSettings(
        name="test",
        pass_env=pass_env,
        work_dir=tmp_path / "runtime",
        sandbox="bwrap",
        **options,
    )


async def launch_through(
    gateway: Gateway, settings: RuntimeSettings, provider: str, env: Mapping[str, str]
) -> tuple[list[Event], Grant, dict[str, Any]]:
    """One launch as the worker makes it: its routes, its grant, then plan, sandbox and run."""
    routes = launch_routes(provider, gateway.defaults, env, settings.home_source(provider))
    with gateway.open(routes) as grant:
        bare, request = sandboxed_launch(settings, provider, dict(env), AUTO)
        assert settings.work_dir is not None
        site = LaunchSite(settings, settings.work_dir, amux_home=settings.work_dir.parent / "h")
        # In a network namespace of its own, the CLI reaches the gateway through its door.
        request = dataclasses.replace(request, gateway=site.agent_gateway(grant.access))
        plan = dataclasses.replace(build_plan(request), run_as=bare.run_as)
        plan = site.sandbox(plan, request)
        assert "--unshare-net" in plan.sandbox and plan.doors

        refused: list[str] = []

        async def nowhere(host: str, port: int, reason: str) -> None:
            refused.append(f"{host}:{port}")

        doors = LaunchDoors(
            plan.doors,
            gateway_url=gateway.url,
            hub_url="http://127.0.0.1:9",
            egress=Egress(AllowList(), nowhere),
            owner=plan.run_as,
        )
        async with doors:
            events = await collect(run(plan))
        # Telemetry and update checks are off in a launch: nothing else was reached for.
        assert refused == []
        shown = plan.to_json(mask_secrets=False)
    return events, grant, shown


SCRIPTS: dict[str, tuple[str, list[Step], str]] = {
    "claude": (
        "claude",
        [CallTool("Bash", {"command": SHOW_ENV, "description": "Show env"}), Answer("Shown.")],
        ANTHROPIC_KEY,
    ),
    "codex": ("codex", [CallTool("exec_command", {"cmd": SHOW_ENV}), Answer("Shown.")], OPENAI_KEY),
    "pi": ("pi", [CallTool("bash", {"command": SHOW_PI}), Answer("Shown.")], PI_KEY),
}


@sandboxed
@pytest.mark.parametrize("provider", ["claude", "codex", "pi"])
async def test_the_real_cli_reaches_the_model_with_the_operators_key_and_holds_only_a_placeholder(
    tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:
    cli = request.getfixturevalue(f"{provider}_bin")
    _, script, operator_key = SCRIPTS[provider]
    async with FakeModelServer(script) as model:
        env = worker_env(tmp_path, model)
        settings = settings_for(tmp_path, model, provider, cli)
        async with Gateway(operator_upstreams(env)) as gateway:
            events, grant, shown = await launch_through(gateway, settings, provider, env)
            assert isinstance(events[-1], Result), events
            assert events[-1].text == "Shown."

            # Every request reached the model with the operator's key, and no placeholder.
            assert model.requests and model.unhandled == []
            assert {r.credential() for r in model.requests} == {operator_key}
            assert not any(PLACEHOLDER_PREFIX in json.dumps(r.headers) for r in model.requests)

            # What the Agent's command saw: the placeholder and the gateway, no operator key.
            ((_, seen),) = model.tool_results
            assert PLACEHOLDER_PREFIX in seen
            if provider != "codex":  # Codex is given the gateway's URL in its argv.
                assert door_url(MODEL) in seen
            assert any(key in seen for key in grant.keys.values())
            for key in OPERATOR_KEYS:
                assert key not in seen
                assert key not in json.dumps(shown)
            assert "CLAUDE_CODE_OAUTH_TOKEN" not in seen

            # Usage counted as the answers streamed past, per launch.
            count = len(model.requests)
            assert grant.usage.to_dict() == {
                "input_tokens": INPUT_TOKENS * count,
                "output_tokens": OUTPUT_TOKENS * count,
                "requests": count,
            }

            # The launch ended: its placeholder is refused, and nothing more reaches the model.
            path = "/v1/messages" if provider == "claude" else "/v1/chat/completions"
            status, _ = await post(gateway, path, next(iter(grant.keys.values())))
            assert status == 401
            assert len(model.requests) == count


async def post(
    gateway: Gateway, path: str, key: str, body: dict[str, Any] | None = None, **headers: str
) -> tuple[int, str]:
    sent = {"x-api-key": key} if path.startswith("/v1/messages") else {}
    sent.setdefault("Authorization", f"Bearer {key}")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.url}{path}", json=body or {"stream": True}, headers={**sent, **headers}
        ) as response,
    ):
        return response.status, await response.text()


TOOLS = [{"name": "Read", "input_schema": {}}]


async def test_only_a_live_placeholder_and_a_model_endpoint_get_through(tmp_path: Path) -> None:
    body = {"stream": True, "tools": TOOLS, "messages": [{"role": "user", "content": "go"}]}
    async with (
        FakeModelServer([Answer("hi")]) as direct,
        FakeModelServer([Answer("hi")]) as model,
    ):
        env = {"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": ANTHROPIC_KEY}
        async with Gateway(operator_upstreams(env)) as gateway:
            grant = gateway.open()
            key = grant.keys["anthropic"]

            unknown = await post(gateway, "/v1/messages", "amux-placeholder-guessed", body)
            assert unknown[0] == 401
            assert json.loads(unknown[1])["error"]["type"] == "authentication_error"
            openai = await post(gateway, "/v1/responses", "sk-wrong", body)
            assert openai[0] == 401 and json.loads(openai[1])["error"]["code"] == "invalid_api_key"
            for path in ("/v1/complete", "/v1/files", "/admin"):
                refused = await post(gateway, path, key, body)
                assert refused[0] == 404
                assert refused[1].count("\n") == 1 and "only model endpoints" in refused[1]
            assert model.requests == [] and model.unhandled == []

            status, streamed = await post(
                gateway,
                "/v1/messages?beta=true",
                key,
                body,
                **{"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024"},
            )
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{direct.base_url}/v1/messages?beta=true", json=body) as answer,
            ):
                expected = await answer.text()
            grant.close()
            ended = await post(gateway, "/v1/messages", key, body)
    assert status == 200 and streamed == expected
    (forwarded,) = model.requests
    assert forwarded.path == "/v1/messages?beta=true"
    assert forwarded.credential() == ANTHROPIC_KEY
    headers = {k.lower(): v for k, v in forwarded.headers.items()}
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "tools-2024"
    assert "authorization" not in headers
    assert grant.usage.to_dict() == {
        "input_tokens": INPUT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "requests": 1,
    }
    assert ended[0] == 401


def test_usage_is_read_from_a_stream_however_it_is_cut() -> None:
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"text": 'a "usage" look-alike'}},
        {"type": "message_delta", "usage": {"output_tokens": 12, "cache_read_input_tokens": 5}},
    ]
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    reader = UsageReader("anthropic", streamed=True)
    for index in range(len(stream)):
        reader.feed(stream[index : index + 1])
    assert reader.counted() == {
        "input_tokens": 30,
        "output_tokens": 12,
        "cache_read_input_tokens": 5,
        "cache_creation_input_tokens": 0,
    }
    chat = UsageReader("chat", streamed=True)
    chat.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}')
    assert chat.counted() == {"input_tokens": 3, "output_tokens": 4}
    silent = UsageReader("responses", streamed=True)
    silent.feed(b'data: {"type": "response.created", "response": {"usage": null}}\n\n')
    assert silent.counted() is None


def test_no_plan_behind_the_gateway_carries_a_credential_even_when_pass_env_names_it(
    tmp_path: Path,
) -> None:
    from runtime_bridge.providers import LaunchRequest
    from runtime_bridge.providers.plan import GatewayPass

    base_env = {
        "PATH": "/usr/bin",
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "ANTHROPIC_AUTH_TOKEN": OAUTH_TOKEN,
        "CLAUDE_CODE_OAUTH_TOKEN": OAUTH_TOKEN,
        "OPENAI_API_KEY": OPENAI_KEY,
        "OPENAI_ORG_SECRET": OPENAI_KEY,
        "OPERATOR_PI_KEY": PI_KEY,
        "ANTHROPIC_BASE_URL": "https://user:pw@upstream.example",
    }
    access = GatewayPass(
        url="http://127.0.0.1:4711",
        keys={"anthropic": "amux-placeholder-a", "openai": "amux-placeholder-o", "pi:fake": "p"},
        hidden=("OPERATOR_PI_KEY",),
        pi_providers={"fake": {"baseUrl": "http://up/v1", "api": "openai-completions"}},
    )
    for provider in ("claude", "codex", "pi", "aider"):
        plan = build_plan(
            LaunchRequest(
                provider=provider,
                prompt="p",
                cwd=tmp_path,
                run_dir=tmp_path / "run",
                executable="/usr/bin/true",
                base_env=base_env,
                pass_env=("*",),
                gateway=access,
            )
        )
        shown = json.dumps(plan.to_json(mask_secrets=False))
        for secret in (*OPERATOR_KEYS, "upstream.example"):
            assert secret not in shown, provider
        assert "amux-placeholder-" in shown and "127.0.0.1:4711" in shown


async def test_past_its_budget_a_launch_is_refused_in_a_shape_its_cli_takes_as_final() -> None:
    body = {"stream": True, "input": "go", "messages": [{"role": "user", "content": "go"}]}
    async with FakeModelServer([Answer("hi"), Answer("hi")]) as model:
        env = {"ANTHROPIC_BASE_URL": model.base_url, "OPENAI_BASE_URL": model.base_url + "/v1"}
        async with Gateway(operator_upstreams(env)) as gateway:
            grant = gateway.open(budget=INPUT_TOKENS + OUTPUT_TOKENS)
            assert (await post(gateway, "/v1/responses", grant.keys["openai"], body))[0] == 200
            assert grant.warn_due() and not grant.warn_due()
            openai = await post(gateway, "/v1/responses", grant.keys["openai"], body)
            anthropic = await post(gateway, "/v1/messages", grant.keys["anthropic"], body)
    assert len(model.requests) == 1 and grant.budget_reached
    assert openai[0] == 429
    assert json.loads(openai[1])["error"]["code"] == "insufficient_quota"
    assert anthropic[0] == 400
    refused = json.loads(anthropic[1])["error"]
    assert refused["type"] == "invalid_request_error"
    assert refused["message"] == "amux budget reached: 18/18 tokens used by this turn"
