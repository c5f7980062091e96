"""People are shown by the names Feishu knows them by, not by amux handles.

The first test runs the whole service in-process behind the Feishu fake (the real lark-oapi
client reads names from its contact API) with a stand-in worker; the others drive
``DisplayNames`` with the real client against the fake and the Hub's real state database, with a
clock the test moves.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.commands.doctor import check_feishu_names
from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.events import UserIds
from bot.names import REFRESH_SECONDS, SCOPE_RETRY_SECONDS, DisplayNames
from hub.people import People
from hub.principals import clean_display_name
from hub.state import State
from tests.bot.test_bot_approvals import agent_asks, approve_buttons, request_card, stand_in
from tests.bot.test_bot_flows import BOB, GROUP, card_text, running_bot
from tests.conftest import until
from tests.fakes.feishu import FakeFeishu

pytestmark = pytest.mark.timeout(120)

CONTACT = "/open-apis/contact/v3/users/batch"


async def test_cards_and_the_prompt_name_a_member_by_their_feishu_name(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot, stand_in(bot) as worker:
        bot.feishu.user_names[BOB["sender_open_id"]] = "Bob Li"
        asked, _, approval = await agent_asks(bot, worker, BOB, "write the notes")
        (prompt,) = bot.hub.executions.db.execute(
            "SELECT prompt FROM executions WHERE id = ?", (approval.execution_id,)
        ).fetchone()
        assert prompt.startswith("Message from Bob Li (amux principal ")
        shown = await until(lambda: request_card(bot, asked))
        assert "For Bob Li to answer, or the Hub owner." in card_text(shown.card)
        assert "UTC+8;" in card_text(shown.card), "its expiry in the chat's zone, named"
        allow = approve_buttons(shown.card)["allow_once"]
        answered = await bot.click(allow, who=BOB, chat_id=GROUP)
        assert answered["toast"]["type"] == "success"
        await until(lambda: "Allowed once by Bob Li" in card_text(shown.card))
        assert "feishu-" not in card_text(shown.card) and "by bob" not in card_text(shown.card)
        # The handle stays what the CLI names the person by.
        assert bot.hub.people.principal(bot.ids["bob"]).name == "bob"  # type: ignore[union-attr]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    # lark-oapi caches tenant tokens per app id for the whole process: an app of its own keeps
    # another test's token from costing this one a refused call.
    async with FakeFeishu(app_id=f"cli_names_{secrets.token_hex(4)}") as fake:
        yield fake


@pytest.fixture
async def client(feishu: FakeFeishu) -> AsyncIterator[FeishuClient]:
    settings = FeishuSettings(
        app_id=feishu.app_id, app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    client = FeishuClient(settings, attempts=1, backoff=lambda state: 0.01)
    yield client
    await client.close()


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    state = State(tmp_path / "state.sqlite3")
    yield state
    state.close()


@pytest.fixture
def people(state: State) -> People:
    return People(state)


CAROL = UserIds(open_id="ou_carol", union_id="on_carol")


async def test_a_name_is_read_once_then_refreshed_after_a_day(
    feishu: FakeFeishu, client: FeishuClient, state: State, people: People
) -> None:
    clock = Clock()
    names = DisplayNames(people, client, clock=clock)
    carol = state.add_principal("carol")
    feishu.user_names["ou_carol"] = "Carol Wang"
    first = await names.named(carol, CAROL)
    assert first.display_name == "Carol Wang" and first.label == "Carol Wang"
    assert first.name == "carol"
    # Within the day: the stored name, and Feishu is not asked again.
    feishu.user_names["ou_carol"] = "Carol W."
    again = await names.named(people.principal(carol.id), CAROL)  # type: ignore[arg-type]
    assert again.label == "Carol Wang"
    assert len(feishu.calls("GET", CONTACT)) == 1
    # A day later the next message refreshes it behind the turn, which is not held up.
    clock.now += REFRESH_SECONDS + 1
    stale = await names.named(again, CAROL)
    assert stale.label == "Carol Wang"
    await until(lambda: people.principal(carol.id).label == "Carol W.")  # type: ignore[union-attr]
    assert len(feishu.calls("GET", CONTACT)) == 2
    await names.close()


async def test_without_the_contact_scope_people_keep_their_handle_and_it_is_said_once(
    feishu: FakeFeishu,
    client: FeishuClient,
    state: State,
    people: People,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    names = DisplayNames(people, client, clock=clock)
    carol = state.add_principal("carol")
    dave = state.add_principal("dave")
    feishu.contact_refused = True
    with caplog.at_level(logging.WARNING, logger="amux.bot"):
        assert (await names.named(carol, CAROL)).label == "carol"
        assert (await names.named(dave, UserIds(open_id="ou_dave"))).label == "dave"
    warnings = [r.getMessage() for r in caplog.records if "people's names" in r.getMessage()]
    assert len(warnings) == 1 and "contact:user.base:readonly" in warnings[0]
    # Not asked again for everyone's every message while the scope is missing…
    assert len(feishu.calls("GET", CONTACT)) == 1
    # …but once it may have been granted.
    feishu.contact_refused = False
    feishu.user_names["ou_dave"] = "Dave"
    clock.now += SCOPE_RETRY_SECONDS + 1
    assert (await names.named(dave, UserIds(open_id="ou_dave"))).label == "Dave"
    await names.close()


async def test_a_name_cannot_redraw_a_line_or_hide_characters(
    feishu: FakeFeishu, client: FeishuClient, state: State, people: People
) -> None:
    names = DisplayNames(people, client, clock=Clock())
    carol = state.add_principal("carol")
    feishu.user_names["ou_carol"] = "Carol\n\x1b[2JOwner\u202e \u200bWang" + "x" * 200
    named = await names.named(carol, CAROL)
    assert "\n" not in named.label and "\x1b" not in named.label
    assert "\u202e" not in named.label and "\u200b" not in named.label
    assert named.label.startswith("Carol [2JOwner Wang") and len(named.label) == 64
    assert clean_display_name("\u0000\u2066") == ""
    await names.close()


async def test_doctor_says_when_the_app_may_not_read_names(feishu: FakeFeishu) -> None:
    settings = FeishuSettings(
        app_id=feishu.app_id, app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    assert (await check_feishu_names(settings)).status == "ok"
    feishu.contact_refused = True
    refused = await check_feishu_names(settings)
    assert refused.status == "warn"
    assert "contact:user.base:readonly" in refused.fix
    assert feishu.app_secret not in refused.detail + refused.fix
