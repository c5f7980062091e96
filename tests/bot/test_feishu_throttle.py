import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.throttle import CardUpdateThrottle, Coalescer
from tests.fakes.feishu import FakeFeishu


def _card(n: int) -> dict[str, int]:
    return {"n": n}


def test_first_update_goes_at_once_then_one_per_interval_with_the_newest_state() -> None:
    core = Coalescer(interval=2.0)
    core.offer("m", _card(1))
    assert [d.card for d in core.take_due(now=100.0)] == [_card(1)]
    core.sent("m")
    for n in range(2, 10):
        core.offer("m", _card(n))
    assert core.take_due(now=101.0) == []
    assert core.next_deadline() == 102.0
    assert [d.card for d in core.take_due(now=102.0)] == [_card(9)]


def test_updates_of_one_message_never_overlap() -> None:
    core = Coalescer(interval=1.0)
    core.offer("m", _card(1))
    core.take_due(0.0)
    core.offer("m", _card(2))
    assert core.take_due(5.0) == []  # the first is still in flight
    assert core.next_deadline() is None
    core.sent("m")
    assert [d.card for d in core.take_due(5.0)] == [_card(2)]


def test_final_update_skips_the_interval_and_supersedes_pending_state() -> None:
    core = Coalescer(interval=10.0)
    core.offer("m", _card(1))
    core.take_due(0.0)
    core.sent("m")
    core.offer("m", _card(2))
    core.offer("m", _card(3), final=True)
    assert core.next_deadline() == float("-inf")
    (due,) = core.take_due(0.5)
    assert due.card == _card(3) and due.final
    core.sent("m")
    assert core.idle


def test_messages_are_throttled_independently() -> None:
    core = Coalescer(interval=5.0)
    core.offer("a", _card(1))
    core.offer("b", _card(1))
    assert {d.key for d in core.take_due(0.0)} == {"a", "b"}


def test_quiet_messages_are_forgotten() -> None:
    core = Coalescer(interval=1.0)
    core.offer("m", _card(1))
    core.take_due(0.0)
    core.sent("m")
    assert not core.idle
    core.take_due(2.0)
    assert core.idle


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, int]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.changed = asyncio.Condition()
        self.started = 0

    async def send(self, message_id: str, card: dict[str, int]) -> None:
        self.started += 1
        async with self.changed:
            self.changed.notify_all()
        await self.gate.wait()
        self.sent.append((message_id, card))
        async with self.changed:
            self.changed.notify_all()

    async def wait_sent(self, count: int) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(lambda: len(self.sent) >= count)


async def test_a_burst_sends_the_first_state_and_the_final_one_only() -> None:
    recorder = Recorder()
    throttle = CardUpdateThrottle(recorder.send, interval=60.0)
    throttle.update("m", _card(0))
    await recorder.wait_sent(1)
    for n in range(1, 100):
        throttle.update("m", _card(n))
    await throttle.finish("m", _card(100))
    assert recorder.sent == [("m", _card(0)), ("m", _card(100))]
    await throttle.close()


async def test_final_waits_for_the_update_in_flight_and_lands_last() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    throttle = CardUpdateThrottle(recorder.send, interval=60.0)
    throttle.update("m", _card(1))
    finishing = asyncio.ensure_future(throttle.finish("m", _card(2)))
    async with asyncio.timeout(5), recorder.changed:
        await recorder.changed.wait_for(lambda: recorder.started == 1)
    assert not finishing.done() and recorder.started == 1
    recorder.gate.set()
    await finishing
    assert recorder.sent == [("m", _card(1)), ("m", _card(2))]
    await throttle.close()


async def test_close_delivers_the_last_unsent_state() -> None:
    recorder = Recorder()
    throttle = CardUpdateThrottle(recorder.send, interval=60.0)
    throttle.update("m", _card(1))
    await recorder.wait_sent(1)
    throttle.update("m", _card(2))
    throttle.update("m", _card(3))
    await throttle.close()
    assert recorder.sent == [("m", _card(1)), ("m", _card(3))]
    with pytest.raises(RuntimeError):
        throttle.update("m", _card(4))


async def test_a_failed_update_does_not_stop_later_ones() -> None:
    sent: list[dict[str, int]] = []

    async def flaky(message_id: str, card: dict[str, int]) -> None:
        if card == _card(1):
            raise RuntimeError("boom")
        sent.append(card)

    throttle = CardUpdateThrottle(flaky, interval=60.0)
    throttle.update("m", _card(1))
    await throttle.finish("m", _card(2))
    assert sent == [_card(2)]
    await throttle.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as server:
        yield server


async def test_streaming_progress_through_the_real_client_patches_few_times(
    fake: FakeFeishu,
) -> None:
    settings = FeishuSettings(
        app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
    )
    client = FeishuClient(settings, backoff=lambda _state: 0.0)
    sent = await client.send_card("oc_chat1", _card(0))
    throttle = CardUpdateThrottle(client.update_card, interval=30.0)
    for n in range(1, 50):
        throttle.update(sent.message_id, _card(n))
    await throttle.finish(sent.message_id, _card(99))
    await throttle.close()
    patches = fake.calls("PATCH", f"/im/v1/messages/{sent.message_id}")
    assert len(patches) <= 3
    assert json.loads(patches[-1].body["content"]) == _card(99)
    assert fake.messages[sent.message_id].card == _card(99)
    await client.close()
