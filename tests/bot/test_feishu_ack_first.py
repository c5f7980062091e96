"""Feishu's answer to a message event waits for nothing but the signature and the
de-duplication record: a newcomer's enrolment and their reply card come after it.

The service runs as ``amux serve`` builds it, on an event loop thread of its own, so a write
held up in the Hub's state database stalls only the server while the test goes on to read the
answer. Feishu's servers are the fake, on the test's own loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from bot.feishu.dedup import SqliteEventDedup
from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.ingress import EVENTS_PATH
from bot.service.app import create_app
from bot.service.feishu_app import FEISHU
from hub.config import HubSettings
from tests.conftest import until
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import FeishuSigner, RecordingSink

pytestmark = pytest.mark.timeout(120)

APP_ID = "cli_ack_first"
signer = FeishuSigner(encrypt_key="ek_ack", verification_token="vt_ack", app_id=APP_ID)
T = TypeVar("T")


class ServerLoop:
    """An event loop in a thread of its own; ``run`` waits there for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@asynccontextmanager
async def serving(home: Path, feishu: FakeFeishu) -> AsyncIterator[tuple[web.AppRunner, str]]:
    settings = signer.settings(feishu)
    app = create_app(HubSettings(home=home), feishu_settings=settings)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await asyncio.wait_for(app[FEISHU].identity_known.wait(), 30)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    server = ServerLoop()
    try:
        url = await server.run(start())
        yield runner, url
    finally:
        await server.run(runner.cleanup())
        server.close()


def principal_names(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM principals")}


async def test_a_first_contact_is_acked_while_its_enrolment_waits_for_the_state_database(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    async with FakeFeishu(app_id=APP_ID) as feishu, serving(home, feishu) as (runner, url):
        stored = feishu.add_message("oc_p2p_newcomer", "/amux")
        body, headers = signer.sign(
            signer.message(
                "/amux",
                chat_id=stored.chat_id,
                message_id=stored.message_id,
                sender_open_id="ou_newcomer",
                sender_union_id="on_newcomer",
                sender_user_id=None,
            )
        )
        # Another writer holds the state database's write lock, as a local command might:
        # the tenant's record and the newcomer's Principal can only wait for it.
        hold = sqlite3.connect(home / "state.sqlite3", isolation_level=None)
        try:
            before = principal_names(hold)
            hold.execute("BEGIN IMMEDIATE")
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}{EVENTS_PATH}", data=body, headers=headers) as answer:
                    assert (answer.status, await answer.json()) == (200, {"msg": "success"})
            # Answered, and nobody enrolled or replied to yet: that work is behind the hold.
            assert principal_names(hold) == before
            assert not feishu.calls("POST", f"/messages/{stored.message_id}/reply")
        finally:
            if hold.in_transaction:
                hold.execute("ROLLBACK")
            hold.close()

        replies = await until(lambda: feishu.calls("POST", f"/messages/{stored.message_id}/reply"))
        assert len(replies) == 1
        await until(lambda: runner.app[FEISHU].dispatcher.pending == 0)
        db = sqlite3.connect(home / "state.sqlite3")
        try:
            enrolled = principal_names(db) - before
        finally:
            db.close()
        assert enrolled == {"feishu-n_newcomer"}


async def test_handlers_start_in_the_order_their_events_were_accepted(tmp_path: Path) -> None:
    sink = RecordingSink()
    dedup = SqliteEventDedup(tmp_path / "events.sqlite3")
    dispatcher = EventDispatcher(sink, dedup)
    try:
        first = await dispatcher.accept(signer.message("first", event_id="ev_1"))
        second = await dispatcher.accept(signer.message("second", event_id="ev_2"))
        assert dispatcher.pending == 2
        # The second answer goes out first; its handler still waits for the first's.
        second.answered()
        first.answered()
        await sink.wait_for(lambda s: len(s.messages) == 2)
        assert [m.text for m in sink.messages] == ["first", "second"]
    finally:
        await dispatcher.drain()
        dedup.close()


async def test_the_drain_runs_handlers_whose_answers_were_never_confirmed(tmp_path: Path) -> None:
    sink = RecordingSink()
    dedup = SqliteEventDedup(tmp_path / "events.sqlite3")
    dispatcher = EventDispatcher(sink, dedup)
    try:
        accepted = await dispatcher.accept(signer.message("hello", event_id="ev_owed"))
        assert accepted.answer == {"msg": "success"}
        # Shutting down before the ingress said the answer went out: the event was recorded
        # as seen, so Feishu's retry would be dropped; this is its only run.
        await dispatcher.drain()
        assert [m.text for m in sink.messages] == ["hello"] and dispatcher.pending == 0
        retry = await dispatcher.accept(signer.message("hello", event_id="ev_owed"))
        retry.answered()
        await dispatcher.drain()
        assert len(sink.messages) == 1
    finally:
        dedup.close()
