"""Each RPC method's parameter model: what it refuses, and the one message a caller reads."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.errors import InvalidArgument
from hub.rpc import MEMORY_METHODS, combine, parse_params
from hub.rpc_executions import MAX_WAIT_SECONDS, ClaimParams, WatchParams
from hub.server import HUB_METHODS

Client = TestClient[Any, Any]
TOO_LONG_ID = "e" * 65


def owner_headers(settings: HubSettings) -> dict[str, str]:
    token = (settings.home / OWNER_TOKEN_FILE).read_text().strip()
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        (
            "system.config.set",
            {"key": "memory.enabled", "value": "true", "extra": 1, "another": None},
            "unknown parameter(s): another, extra",
        ),
        ("system.whoami", {"who": "me"}, "unknown parameter(s): who"),
        ("executions.watch", {"after": 0}, "missing parameter: execution_id"),
        ("executions.watch", {"execution_id": None}, "missing parameter: execution_id"),
        (
            "memory.upsert",
            {"path": "a.md", "expected_revision": "absent"},
            "missing parameter: content",
        ),
        ("system.config.set", {"key": "memory.enabled"}, "missing parameter: value"),
        (
            "executions.watch",
            {"execution_id": 7},
            "execution_id must be a string of at most 64 characters",
        ),
        (
            "executions.watch",
            {"execution_id": TOO_LONG_ID},
            "execution_id must be a string of at most 64 characters",
        ),
        (
            "executions.submit",
            {"provider": "claude", "prompt": "hi", "origin": "o" * 513},
            "origin must be a string of at most 512 characters",
        ),
        (
            "executions.submit",
            {"provider": "claude", "prompt": ["hi"]},
            f"prompt must be a string of at most {1 << 20} characters",
        ),
        (
            "executions.watch",
            {"execution_id": "e", "after": -1},
            "after must be a non-negative integer",
        ),
        (
            "executions.watch",
            {"execution_id": "e", "after": True},
            "after must be a non-negative integer",
        ),
        (
            "executions.watch",
            {"execution_id": "e", "after": 1.0},
            "after must be a non-negative integer",
        ),
        (
            "executions.watch",
            {"execution_id": "e", "after": "1"},
            "after must be a non-negative integer",
        ),
        (
            "executions.claim",
            {"worker_id": "w", "wait_seconds": -0.5},
            "wait_seconds must be a non-negative number",
        ),
        (
            "executions.claim",
            {"worker_id": "w", "wait_seconds": True},
            "wait_seconds must be a non-negative number",
        ),
        (
            "executions.claim",
            {"worker_id": "w", "wait_seconds": "5"},
            "wait_seconds must be a non-negative number",
        ),
        (
            "executions.claim",
            {"worker_id": "w", "wait_seconds": 10**400},
            "wait_seconds must be a non-negative number",
        ),
        (
            "executions.complete",
            {"execution_id": "e", "worker_id": "w", "succeeded": "yes"},
            "succeeded must be true or false",
        ),
        (
            "executions.complete",
            {"execution_id": "e", "worker_id": "w", "succeeded": True, "result": [1]},
            "result must be an object",
        ),
        ("sessions.memory", {"session_id": "s", "capable": 1}, "capable must be true or false"),
        (
            "credentials.delegate",
            {"binding": "global", "ttl_seconds": 0},
            "ttl_seconds must be between 1 and 604800",
        ),
        (
            "credentials.delegate",
            {"binding": "global", "ttl_seconds": True},
            "ttl_seconds must be between 1 and 604800",
        ),
        (
            "credentials.delegate",
            {"binding": "global", "label": "l" * 201},
            "label must be a short string",
        ),
        ("credentials.delegate", {"binding": 1}, "binding must be a string"),
        ("credentials.revoke", {"id": ["c"]}, "id must be a string"),
    ],
)
async def test_a_refused_parameter_gets_invalid_argument_with_its_message(
    hub_client: Client,
    hub_settings: HubSettings,
    method: str,
    params: dict[str, Any],
    message: str,
) -> None:
    response = await hub_client.post(
        f"/rpc/v1/{method}", json=params, headers=owner_headers(hub_settings)
    )
    assert response.status == 400
    assert (await response.json()) == {"error": {"code": "invalid_argument", "message": message}}


async def test_a_string_with_a_lone_surrogate_is_refused_not_a_500(
    hub_client: Client, hub_settings: HubSettings
) -> None:
    response = await hub_client.post(
        "/rpc/v1/executions.submit",
        data=b'{"provider": "claude", "prompt": "\\ud800"}',
        headers=owner_headers(hub_settings),
    )
    assert response.status == 400
    assert (await response.json())["error"]["message"].startswith("prompt must be a string")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_wait_is_refused_by_the_model_itself(value: float) -> None:
    # JSON bodies never carry one (the body parser refuses them first); the model stands alone.
    with pytest.raises(InvalidArgument, match="^wait_seconds must be a non-negative number$"):
        parse_params(ClaimParams, {"worker_id": "w", "wait_seconds": value})


def test_a_longer_wait_is_shortened_to_the_most_the_hub_holds_a_poll() -> None:
    assert parse_params(ClaimParams, {"worker_id": "w", "wait_seconds": 3600}).wait_seconds == (
        MAX_WAIT_SECONDS
    )
    assert parse_params(ClaimParams, {"worker_id": "w", "wait_seconds": 2}).wait_seconds == 2.0


def test_left_out_and_null_parameters_take_their_defaults() -> None:
    watch = parse_params(WatchParams, {"execution_id": "e", "after": None})
    assert (watch.after, watch.wait_seconds) == (0, 0.0)


def test_every_parameter_a_model_checks_states_its_rule() -> None:
    # The rule is the refusal's wording; without one a caller would read pydantic's text instead.
    unstated = [
        f"{name}.{field_name}"
        for name, spec in HUB_METHODS.items()
        for field_name, field in spec.params.model_fields.items()
        if field.annotation is not object and not field.description
    ]
    assert unstated == []


def test_a_method_declared_in_two_tables_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="memory.get is declared twice"):
        combine(MEMORY_METHODS, {"memory.get": MEMORY_METHODS["memory.get"]})
