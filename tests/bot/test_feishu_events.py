import json

import pytest

from bot.feishu.events import (
    CardAction,
    CardResponse,
    CommentEvent,
    MalformedEvent,
    MessageEvent,
    OtherEvent,
    Recall,
    UrlVerification,
    message_text,
    parse_event,
    recall_of,
)
from tests.fakes.feishu_events import FeishuSigner

signer = FeishuSigner()


def test_private_text_message_is_parsed_with_all_sender_ids() -> None:
    payload = signer.message("hello", event_id="ev1", message_id="om_1")
    event = parse_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, MessageEvent)
    assert event.event_id == "ev1"
    assert event.sender.open_id == "ou_user1"
    assert event.sender.union_id == "on_user1"
    assert event.sender.user_id == "u_user1"
    assert event.is_private and event.text == "hello"
    assert event.conversation_key == "om_1"


def test_group_mention_of_the_bot_is_stripped_and_others_spelled_out() -> None:
    payload = signer.message(
        "@_user_1 ask @_user_2 about it",
        chat_type="group",
        mentions=[
            signer.mention("@_user_1", "ou_bot", "amux"),
            signer.mention("@_user_2", "ou_carol", "Carol"),
        ],
    )
    event = parse_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, MessageEvent)
    assert event.mentions_bot is True
    assert event.text == "ask @Carol about it"
    assert [m.name for m in event.mentions] == ["Carol"]


def test_group_message_without_the_bot_mention_says_so() -> None:
    payload = signer.message(
        "@_user_1 hi", chat_type="group", mentions=[signer.mention("@_user_1", "ou_x", "X")]
    )
    event = parse_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, MessageEvent)
    assert event.mentions_bot is False and event.text == "@X hi"


def test_topic_messages_are_keyed_by_thread() -> None:
    payload = signer.message("more", root_id="om_root", thread_id="omt_1")
    event = parse_event(payload)
    assert isinstance(event, MessageEvent)
    assert event.conversation_key == "omt_1"
    assert event.root_id == "om_root"
    no_thread = parse_event(signer.message("x", root_id="om_root"))
    assert isinstance(no_thread, MessageEvent) and no_thread.conversation_key == "om_root"


def test_rich_text_post_becomes_plain_text() -> None:
    content = {
        "title": "Plan",
        "content": [
            [{"tag": "at", "user_id": "@_user_1"}, {"tag": "text", "text": " step one"}],
            [{"tag": "a", "text": "link", "href": "https://example.invalid"}],
        ],
    }
    payload = signer.message(
        "",
        message_type="post",
        content=content,
        mentions=[signer.mention("@_user_1", "ou_bot", "amux")],
    )
    event = parse_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, MessageEvent)
    assert event.text == "Plan\nstep one\nlink"
    assert event.mentions_bot


def test_non_text_message_has_empty_text() -> None:
    assert message_text("image", json.dumps({"image_key": "img_1"})) == ""
    assert message_text("text", "not json") == ""


def test_card_action_carries_operator_context_value_form_and_token() -> None:
    payload = signer.card_action(
        {"action": "memory.search"},
        form_value={"query": "review"},
        open_message_id="om_card",
        open_chat_id="oc_9",
        event_id="ev_card",
    )
    action = parse_event(payload)
    assert isinstance(action, CardAction)
    assert action.action == "memory.search"
    assert action.form_value == {"query": "review"}
    assert action.open_message_id == "om_card" and action.chat_id == "oc_9"
    assert action.operator.union_id == "on_user1"
    assert action.token == "c-callback-token"
    assert "c-callback-token" not in repr(action)


def test_events_keep_the_tenant_and_app_they_came_for_and_the_senders_tenant() -> None:
    foreign = FeishuSigner(app_id="cli_9", tenant_key="tenant_9")
    message = parse_event(foreign.message("hi"))
    assert isinstance(message, MessageEvent)
    assert (message.tenant_key, message.app_id, message.sender.tenant_key) == (
        "tenant_9",
        "cli_9",
        "tenant_9",
    )
    click = parse_event(foreign.card_action({"action": "manage.open"}))
    assert isinstance(click, CardAction)
    assert (click.tenant_key, click.app_id, click.operator.tenant_key) == (
        "tenant_9",
        "cli_9",
        "tenant_9",
    )
    legacy = parse_event(
        {
            "open_id": "ou_1",
            "tenant_key": "tenant_old",
            "token": "c-1",
            "action": {"value": {"action": "manage.open"}},
        }
    )
    assert isinstance(legacy, CardAction)
    assert (legacy.tenant_key, legacy.app_id, legacy.operator.tenant_key) == (
        "tenant_old",
        "",
        "tenant_old",
    )


def test_checker_click_reports_checked() -> None:
    payload = signer.card_action({"action": "memory.toggle"}, tag="checker", checked=True)
    action = parse_event(payload)
    assert isinstance(action, CardAction) and action.checked is True


def test_url_verification_and_other_events() -> None:
    assert parse_event(signer.url_verification("abc")) == UrlVerification("abc")
    other = {
        "schema": "2.0",
        "header": {"event_id": "ev_o", "event_type": "im.chat.member.bot.added_v1"},
        "event": {"chat_id": "oc_1"},
    }
    assert parse_event(other) == OtherEvent(
        "ev_o", "im.chat.member.bot.added_v1", {"chat_id": "oc_1"}
    )


def test_a_recall_names_the_message_and_whether_its_sender_recalled_it() -> None:
    parsed = parse_event(signer.recall("om_1", chat_id="oc_g", recall_type="group_manager"))
    assert isinstance(parsed, OtherEvent)
    recall = recall_of(parsed)
    assert recall == Recall("om_1", "oc_g", "group_manager")
    assert not recall.by_sender
    own = recall_of(
        OtherEvent(
            "e", "im.message.recalled_v1", {"message_id": "om_2", "recall_type": "message_owner"}
        )
    )
    assert own is not None and own.by_sender
    # Only a recall naming a message counts; other events are no recall.
    assert recall_of(OtherEvent("e", "im.message.recalled_v1", {"message_id": 7})) is None
    assert recall_of(OtherEvent("e", "im.chat.disbanded_v1", {"message_id": "om_1"})) is None


@pytest.mark.parametrize(
    "payload",
    [
        {"schema": "2.0", "header": {"event_type": "im.message.receive_v1"}, "event": {}},
        {"schema": "2.0", "header": {"event_id": "e", "event_type": "im.message.receive_v1"}},
        {
            "schema": "2.0",
            "header": {"event_id": "e", "event_type": "im.message.receive_v1"},
            "event": {"message": {}, "sender": {}},
        },
        {
            "schema": "2.0",
            "header": {"event_id": "e", "event_type": "card.action.trigger"},
            "event": {},
        },
    ],
)
def test_malformed_events_are_rejected(payload: dict[str, object]) -> None:
    with pytest.raises(MalformedEvent):
        parse_event(payload)


def test_card_response_wire_shape() -> None:
    response = CardResponse(card={"schema": "2.0"}, toast="Saved", toast_type="success")
    assert response.to_wire() == {
        "toast": {"type": "success", "content": "Saved"},
        "card": {"type": "raw", "data": {"schema": "2.0"}},
    }
    assert CardResponse().to_wire() == {}


def test_a_document_comment_names_its_thread_reply_author_and_whether_it_mentions_the_bot() -> None:
    payload = signer.comment(
        "DocPlan0001", "cm_7", "rp_9", author_open_id="ou_dave", event_id="ev_c1"
    )
    event = parse_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, CommentEvent)
    assert (event.file_token, event.file_type) == ("DocPlan0001", "docx")
    assert (event.comment_id, event.reply_id) == ("cm_7", "rp_9")
    assert event.author.open_id == "ou_dave" and event.author.union_id == "on_user1"
    assert event.mentions_bot is True
    # Delivered for the app's tenant, which the sink admits as it admits messages.
    assert (event.tenant_key, event.app_id) == ("tenant_1", "cli_test")
    # One conversation per thread; one run per reply, whatever event carried it.
    assert event.conversation_key == "DocPlan0001:cm_7"
    assert event.seen_key == "comment:DocPlan0001:cm_7:rp_9"

    quiet = parse_event(signer.comment("DocPlan0001", "cm_7", "rp_10", mentioned=False))
    assert isinstance(quiet, CommentEvent) and quiet.mentions_bot is False


def test_an_older_comment_shape_with_its_fields_at_the_top_level_is_read_too() -> None:
    payload = signer.comment("DocPlan0001", "cm_7", "rp_9")
    meta = payload["event"].pop("notice_meta")
    del payload["event"]["is_mentioned"]
    payload["event"].update(
        file_token=meta["file_token"],
        file_type="sheet",
        user_id={"open_id": "ou_erin"},
        is_mention=True,
    )
    event = parse_event(payload)
    assert isinstance(event, CommentEvent)
    assert (event.file_type, event.author.open_id, event.mentions_bot) == ("sheet", "ou_erin", True)


@pytest.mark.parametrize("missing", ["file_token", "comment_id", "from_user_id"])
def test_a_comment_without_its_document_thread_or_author_is_malformed(missing: str) -> None:
    payload = signer.comment("DocPlan0001", "cm_7", "rp_9")
    event = payload["event"]
    event.pop(missing, None)
    event["notice_meta"].pop(missing, None)
    with pytest.raises(MalformedEvent):
        parse_event(payload)
