"""What operators see of a running service: readiness, metrics, request ids, redacted logs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from bot.service.app import create_app
from bot.service.logs import (
    AccessLogger,
    JsonFormatter,
    LogSettings,
    RedactionFilter,
    Redactor,
    configure,
)
from hub.config import HubSettings
from hub.metrics import METRICS
from hub.requestid import REQUEST_ID_HEADER
from hub.rpc import HUB
from hub.server import READINESS
from hub.state import State

Client = TestClient[Any, Any]


def memory_enabled_home(home: Path) -> HubSettings:
    settings = HubSettings(home=home)
    home.mkdir(parents=True, mode=0o700)
    # Saved before the first start, so it is the running value without a restart.
    state = State(settings.state_path)
    state.save_setting("memory.enabled", True)
    state.close()
    return settings


@pytest.fixture
async def service(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[tuple[Client, str]]:
    client: Client = await aiohttp_client(create_app(memory_enabled_home(tmp_path / "home")))
    token = (tmp_path / "home" / "owner.token").read_text().strip()
    yield client, token


async def rpc(client: Client, token: str, method: str, **params: Any) -> tuple[int, Any]:
    response = await client.post(
        f"/rpc/v1/{method}", json=params, headers={"Authorization": f"Bearer {token}"}
    )
    return response.status, await response.json()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return samples(await response.text())


# -- /metrics -------------------------------------------------------------------------------------


async def test_metrics_count_memory_operations_conflicts_and_rpc_latency(
    service: tuple[Client, str],
) -> None:
    client, token = service
    status, created = await rpc(
        client,
        token,
        "memory.upsert",
        path="MEMORY.md",
        content="- a\n",
        expected_revision="absent",
    )
    assert status == 200, created
    status, _ = await rpc(
        client,
        token,
        "memory.upsert",
        path="MEMORY.md",
        content="- b\n",
        expected_revision="absent",
    )
    assert status == 409
    status, _ = await rpc(client, token, "memory.search", query="a")
    assert status == 200
    status, _ = await rpc(client, token, "no.such.method")
    assert status == 404

    found = await scrape(client)
    upsert_ok = ("method", "memory.upsert"), ("outcome", "ok")
    upsert_conflict = ("method", "memory.upsert"), ("outcome", "conflict")
    assert found[("amux_memory_operations_total", upsert_ok)] == 1
    assert found[("amux_memory_operations_total", upsert_conflict)] == 1
    assert found[("amux_memory_conflicts_total", (("method", "memory.upsert"),))] == 1
    search = ("method", "memory.search"), ("status", "200")
    assert found[("amux_rpc_request_duration_seconds_count", search)] == 1
    # Whatever a caller names, unknown methods share one series.
    unknown = ("method", "unknown"), ("status", "404")
    assert found[("amux_rpc_request_duration_seconds_count", unknown)] == 1
    assert found[("amux_memory_search_incomplete_total", ())] == 0


async def test_metrics_show_executions_by_state_and_connected_workers(
    service: tuple[Client, str],
) -> None:
    client, token = service
    status, body = await rpc(client, token, "executions.submit", provider="claude", prompt="hi")
    assert status == 200, body
    found = await scrape(client)
    assert found[("amux_executions", (("state", "queued"),))] == 1
    assert found[("amux_executions", (("state", "running"),))] == 0
    assert found[("amux_connected_workers", ())] == 0


async def test_a_search_stopped_by_its_scan_budget_is_counted_incomplete(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    settings = memory_enabled_home(tmp_path / "home")
    topics = settings.memory_root / "global" / "topics"
    topics.mkdir(parents=True)
    # More documents than one search may scan (1,024), none matching, so the scan cannot finish.
    for i in range(1100):
        (topics / f"t{i:04}.md").write_text("nothing here\n")
    client: Client = await aiohttp_client(create_app(settings))
    token = (settings.home / "owner.token").read_text().strip()
    status, body = await rpc(client, token, "memory.search", query="absentword")
    assert status == 200
    assert body["incomplete"] is True
    found = await scrape(client)
    assert found[("amux_memory_search_incomplete_total", ())] == 1


async def test_two_apps_in_one_process_keep_separate_metrics(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    first: Client = await aiohttp_client(create_app(HubSettings(home=tmp_path / "one")))
    second: Client = await aiohttp_client(create_app(HubSettings(home=tmp_path / "two")))
    token = (tmp_path / "one" / "owner.token").read_text().strip()
    assert (await rpc(first, token, "system.whoami"))[0] == 200
    whoami = ("method", "system.whoami"), ("status", "200")
    assert (await scrape(first))[("amux_rpc_request_duration_seconds_count", whoami)] == 1
    assert ("amux_rpc_request_duration_seconds_count", whoami) not in await scrape(second)


async def test_feishu_recording_api_shows_up_in_the_scrape(service: tuple[Client, str]) -> None:
    client, _ = service
    metrics = client.app[METRICS]
    metrics.feishu_event("received")
    metrics.feishu_event("deduplicated")
    metrics.feishu_call("im.message.create", ok=True)
    metrics.feishu_retry("im.message.create")
    found = await scrape(client)
    assert found[("amux_feishu_events_total", (("outcome", "deduplicated"),))] == 1
    api = ("api", "im.message.create"), ("outcome", "ok")
    assert found[("amux_feishu_api_calls_total", api)] == 1
    assert found[("amux_feishu_api_retries_total", (("api", "im.message.create"),))] == 1


# -- /readyz --------------------------------------------------------------------------------------


async def test_readyz_lists_the_hub_checks_when_ready(service: tuple[Client, str]) -> None:
    client, _ = service
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 200, body
    assert body["status"] == "ready"
    assert {c["name"]: c["ok"] for c in body["checks"]} == {
        "state_db": True,
        "memory_root_lock": True,
    }


async def test_readyz_is_503_naming_a_failed_registered_check(
    service: tuple[Client, str],
) -> None:
    client, _ = service

    async def feishu_down() -> tuple[bool, str]:
        return False, "long connection not established"

    client.app[READINESS].add("feishu", feishu_down)
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 503
    failed = [c for c in body["checks"] if not c["ok"]]
    assert failed == [{"name": "feishu", "ok": False, "detail": "long connection not established"}]


async def test_readyz_fails_when_the_memory_root_lock_file_is_gone(
    service: tuple[Client, str],
) -> None:
    client, _ = service
    client.app[HUB].root_lock.path.unlink()
    response = await client.get("/readyz")
    assert response.status == 503
    checks = {c["name"]: c for c in (await response.json())["checks"]}
    assert not checks["memory_root_lock"]["ok"]
    assert "restart" in checks["memory_root_lock"]["detail"]


# -- request ids and log lines -------------------------------------------------------------------


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """JSON log lines of the ``amux`` loggers, captured without touching the root logger."""
    stream = io.StringIO()
    redact = Redactor(["s3cret-app-value"])
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactionFilter(redact))
    handler.setFormatter(JsonFormatter(redact))
    logger = logging.getLogger("amux")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_a_valid_request_id_is_echoed_and_carried_into_log_lines(
    service: tuple[Client, str], json_log: io.StringIO
) -> None:
    client, token = service
    response = await client.post(
        "/rpc/v1/system.config.set",
        json={"key": "memory.isolation", "value": "on"},
        headers={"Authorization": f"Bearer {token}", REQUEST_ID_HEADER: "feishu-ev-42"},
    )
    assert response.status == 200
    assert response.headers[REQUEST_ID_HEADER] == "feishu-ev-42"
    saved = [line for line in lines(json_log) if "saved" in line["message"]]
    assert saved, json_log.getvalue()
    assert saved[0]["request_id"] == "feishu-ev-42"
    assert saved[0]["logger"] == "amux.hub.rpc"
    assert {"time", "level", "logger", "message", "request_id"} <= saved[0].keys()


async def test_a_malformed_request_id_is_replaced_by_a_fresh_one(
    service: tuple[Client, str],
) -> None:
    client, _ = service
    first = await client.get("/healthz", headers={REQUEST_ID_HEADER: "bad id\twith spaces"})
    second = await client.get("/healthz")
    echoed = first.headers[REQUEST_ID_HEADER]
    assert echoed != "bad id\twith spaces"
    assert len(echoed) == 32
    assert second.headers[REQUEST_ID_HEADER] != echoed
    token_like = "amux_" + "k" * 43
    third = await client.get("/healthz", headers={REQUEST_ID_HEADER: token_like})
    assert third.headers[REQUEST_ID_HEADER] != token_like


async def test_errors_outside_rpc_also_carry_the_request_id(service: tuple[Client, str]) -> None:
    client, _ = service
    response = await client.get("/no-such-page", headers={REQUEST_ID_HEADER: "trace-7"})
    assert response.status == 404
    assert response.headers[REQUEST_ID_HEADER] == "trace-7"


def test_redaction_removes_tokens_secrets_in_extras_and_tracebacks(
    json_log: io.StringIO,
) -> None:
    token = "amux_" + "Ab3-_x" * 8
    log = logging.getLogger("amux.test")
    log.info("calling with Authorization: Bearer %s", token)
    log.info("app secret is %s", "s3cret-app-value", extra={"header": f"Bearer {token}"})
    try:
        raise ValueError(f"rejected {token}")
    except ValueError:
        log.exception("failed")
    text = json_log.getvalue()
    assert token not in text
    assert "s3cret-app-value" not in text
    records = lines(json_log)
    assert records[0]["message"] == "calling with Authorization: Bearer [redacted]"
    assert records[1]["header"] == "Bearer [redacted]"
    assert "ValueError: rejected amux_[redacted]" in records[2]["exception"]


def test_ordinary_words_that_start_with_amux_are_kept() -> None:
    assert Redactor()("AMUX_HOME and amux_memory_root") == "AMUX_HOME and amux_memory_root"


@pytest.mark.parametrize(
    ("path", "status", "level"),
    [
        ("/rpc/v1/executions.claim", 200, logging.DEBUG),
        ("/rpc/v1/executions.watch", 200, logging.DEBUG),
        ("/rpc/v1/executions.claim", 401, logging.INFO),
        ("/rpc/v1/executions.submit", 200, logging.INFO),
        ("/healthz", 200, logging.INFO),
    ],
)
def test_access_lines_of_answered_long_polls_are_debug_and_every_other_line_is_info(
    path: str, status: int, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    access = AccessLogger(logging.getLogger("amux.test.access"), "")
    with caplog.at_level(logging.DEBUG, logger="amux.test.access"):
        access.log(make_mocked_request("POST", path), web.Response(status=status), 20.0)
    [record] = caplog.records
    assert record.levelno == level
    assert record.getMessage() == f"POST {path} {status}"


def test_configure_replaces_root_handlers_and_writes_json(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    try:
        configure(LogSettings(format="json", level="WARNING"), stream=stream)
        logging.getLogger("amux.test").info("not shown")
        logging.getLogger("amux.test").warning("shown", extra={"execution_id": "e1"})
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)
    records = lines(stream)
    assert [r["message"] for r in records] == ["shown"]
    assert records[0]["execution_id"] == "e1"
    assert records[0]["request_id"] is None
