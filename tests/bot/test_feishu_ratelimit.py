import asyncio
import uuid

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.ratelimit import Pacer, SlidingWindow
from tests.fakes.feishu import FakeFeishu


def test_calls_within_the_limit_go_at_once() -> None:
    window = SlidingWindow(limit=3, period=1.0)
    assert [window.reserve("chat", 10.0) for _ in range(3)] == [10.0, 10.0, 10.0]


def test_the_call_over_the_limit_waits_for_the_window_to_slide() -> None:
    window = SlidingWindow(limit=2, period=1.0)
    starts = [window.reserve("chat", 10.0) for _ in range(5)]
    assert starts == [10.0, 10.0, 11.0, 11.0, 12.0]
    for i in range(len(starts) - 2):
        assert starts[i + 2] - starts[i] >= 1.0


def test_keys_are_independent_and_old_calls_expire() -> None:
    window = SlidingWindow(limit=1, period=1.0)
    assert window.reserve("a", 0.0) == 0.0
    assert window.reserve("b", 0.0) == 0.0
    assert window.reserve("a", 0.5) == 1.0
    assert window.reserve("a", 5.0) == 5.0


def test_idle_keys_are_forgotten() -> None:
    window = SlidingWindow(limit=1, period=1.0, max_keys=2)
    for n in range(3):
        window.reserve(f"k{n}", float(n * 10))
    assert len(window._calls) <= 2


def test_nonsense_limits_are_rejected() -> None:
    with pytest.raises(ValueError):
        SlidingWindow(0, 1.0)


async def test_a_burst_to_one_chat_is_paced_under_the_per_chat_limit() -> None:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
        )
        period = 0.3
        pacer = Pacer(per_receiver=SlidingWindow(3, period), app_wide=SlidingWindow(100, period))
        client = FeishuClient(settings, pacer=pacer)
        try:
            await client.bot_info()  # fetch the token first: its latency would skew arrivals
            for n in range(7):
                await client.send_text("oc_busy", f"m{n}")
        finally:
            await client.close()
        times = [c.at for c in fake.calls("POST", "/im/v1/messages")]
        assert len(times) == 7
        # Pacing fixes departures; arrivals carry some latency jitter, hence the margin.
        for i in range(len(times) - 3):
            assert times[i + 3] - times[i] >= period * 0.8
        assert times[-1] - times[0] >= 2 * period * 0.8


async def test_a_burst_of_one_api_never_holds_back_another() -> None:
    # Feishu counts each API apart: a flood of card updates leaves a new turn's reply free to go.
    pacer = Pacer(per_receiver=SlidingWindow(100, 60.0), app_wide=SlidingWindow(2, 60.0))
    for chat in ("oc_a", "oc_b"):
        await pacer.wait(chat, api="update_card")
    await asyncio.wait_for(pacer.wait("om_new", api="reply"), 5.0)
    # The third update of the same minute waits for its own window (60 s here).
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pacer.wait("oc_c", api="update_card"), 0.05)


async def test_an_api_is_held_to_a_thousand_calls_a_minute() -> None:
    now = [0.0]
    pacer = Pacer(
        per_receiver=SlidingWindow(10_000, 1.0),
        app_wide=SlidingWindow(10_000, 1.0),
        clock=lambda: now[0],
        app_per_minute=SlidingWindow(3, 60.0),
    )
    for _ in range(3):
        await pacer.wait(api="reply")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pacer.wait(api="reply"), 0.05)
