"""A chatty Agent's turn through the whole service: the in-process worker reads a stand-in for
Claude (``tests/fakes/chatty_agent.py``) printing 6,000 messages of 16 KB, reports each as a
progress event, and the Hub keeps only its bound of them; the turn finishes with its answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.config import HubSettings
from hub.eventbudget import DEFAULT_MAX_BYTES
from hub.rpc import HUB
from hub.services import Hub
from runtime_bridge.config import RuntimeSettings
from tests.conftest import free_port, stand_in, until

pytestmark = pytest.mark.timeout(300)

CHATTY_AGENT = "chatty_agent.py"
MESSAGES = 6000
MESSAGE_CHARS = 16 * 1024


def logical_size(hub: Hub) -> int:
    """The state database's size as its pages, the write-ahead log's included."""
    pages = hub.state.db.execute("PRAGMA page_count").fetchone()[0]
    page_size = hub.state.db.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(page_size)


async def test_an_agent_printing_6000_messages_of_16_kb_keeps_its_bound_and_answers(
    tmp_path: Path,
) -> None:
    runtime = RuntimeSettings(
        claude=str(stand_in(CHATTY_AGENT)), sandbox="off", work_dir=tmp_path / "rt"
    )
    port = free_port()
    app = create_app(
        HubSettings(home=tmp_path / "amux-home"),
        runtime_settings=runtime,
        worker_url=f"http://127.0.0.1:{port}",
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        hub: Hub = app[HUB]
        owner = hub.state.owner()
        assert owner is not None
        before = logical_size(hub)
        execution, _ = await hub.executions.submit(
            principal_id=owner.id,
            submitted_by=owner.id,
            provider="claude",
            prompt=f"chatty {MESSAGES} {MESSAGE_CHARS}",
        )
        await until(lambda: hub.executions.describe(execution.id).finished, seconds=240)

        finished = hub.executions.describe(execution.id)
        assert finished.state == "succeeded", finished.error
        assert finished.result is not None
        assert finished.result.text == f"answered after {MESSAGES} messages"
        events = hub.executions.events(execution.id)
        progress = [e for e in events if e.kind == "progress"]
        kept = sum(len(e.text.encode()) for e in progress)
        assert 0 < kept <= DEFAULT_MAX_BYTES
        assert len(progress) < MESSAGES // 20
        # What was kept is the start of what the Agent said, in order.
        assert [e.text[:6] for e in progress] == [f"{n:06d}" for n in range(len(progress))]
        assert logical_size(hub) - before <= DEFAULT_MAX_BYTES * 5 // 4
        warnings = [e.text for e in events if e.kind == "warning"]
        assert any("reached its bound" in text for text in warnings)
        assert warnings[-1].startswith(f"{MESSAGES - len(progress)} more event(s), ")
