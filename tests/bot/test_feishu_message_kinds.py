"""Every kind of Feishu message is understood: what the sender wrote or shared is text, files are
attachments, what others wrote (a forwarded card) is kept apart, and only what cannot be read at
all (a sticker) is unreadable. Payloads as Feishu delivers them (``im.message.receive_v1``)."""

from __future__ import annotations

from typing import Any

import pytest

from bot.feishu.events import Attachment, MessageEvent, parse_event
from tests.fakes.feishu_events import FeishuSigner

signer = FeishuSigner()
# 2024-12-04 16:13:20 in Beijing, where the SDK's renderings tell time.
START_MS = "1733300000000"
END_MS = "1733303600000"


def received(message_type: str, content: dict[str, Any]) -> MessageEvent:
    event = parse_event(signer.message("", message_type=message_type, content=content))
    assert isinstance(event, MessageEvent)
    return event


def test_a_forwarded_chat_is_readable_though_the_event_carries_none_of_its_messages() -> None:
    event = received("merge_forward", {"content": "Merged and Forwarded Message"})
    assert event.is_forward and event.readable
    assert event.text == "" and event.forwarded == () and event.attachments == ()


def test_a_forwarded_card_is_its_words_kept_apart_from_the_senders_own() -> None:
    # As Feishu delivers a card to a receiver: a title and rows of post-like elements.
    event = received(
        "interactive",
        {
            "title": "CI failed: main",
            "elements": [
                [{"tag": "text", "text": "Build #42 failed at "}, {"tag": "text", "text": "test"}],
                [{"tag": "a", "text": "the log", "href": "https://ci.invalid/42"}],
                [{"tag": "button", "text": "Retry"}],
            ],
        },
    )
    assert event.text == "" and event.readable
    (card,) = event.forwarded
    assert card.message_type == "interactive" and card.sender_open_id == ""
    assert card.text.splitlines() == [
        "CI failed: main",
        "Build #42 failed at test",
        "the log",
        "Retry",
    ]


def test_a_card_in_an_apps_own_shape_is_read_by_the_sdks_walk() -> None:
    event = received(
        "interactive",
        {
            "schema": "2.0",
            "header": {"title": {"tag": "plain_text", "content": "Deploy done"}},
            "body": {"elements": [{"tag": "markdown", "content": "**api** is on v7"}]},
        },
    )
    (card,) = event.forwarded
    assert card.text == "Deploy done\n**api** is on v7"


@pytest.mark.parametrize(
    ("message_type", "content", "expected"),
    [
        ("share_chat", {"chat_id": "oc_release"}, ['<group_card id="oc_release"/>']),
        ("share_user", {"user_id": "ou_carol"}, ['<contact_card id="ou_carol"/>']),
        (
            "location",
            {"name": "Feishu Tower", "longitude": "116.307", "latitude": "39.984"},
            ['<location name="Feishu Tower" lng="116.307" lat="39.984"/>'],
        ),
        (
            "todo",
            {
                "task_id": "t_1",
                "summary": {
                    "title": "Ship 1.0",
                    "content": [[{"tag": "text", "text": "before Friday"}]],
                },
                "due_time": START_MS,
            },
            ["<todo>", "Ship 1.0", "before Friday", "Due: 2024-12-04 16:13:20", "</todo>"],
        ),
        (
            "share_calendar_event",
            {"summary": "Retro", "start_time": START_MS, "end_time": END_MS},
            [
                "<calendar_share>",
                "📅 Retro",
                "🕙 2024-12-04 16:13:20 ~ 2024-12-04 17:13:20",
                "</calendar_share>",
            ],
        ),
        (
            "calendar",
            {"summary": "Planning", "start_time": START_MS, "end_time": END_MS},
            [
                "<calendar_invite>",
                "📅 Planning",
                "🕙 2024-12-04 16:13:20 ~ 2024-12-04 17:13:20",
                "</calendar_invite>",
            ],
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_shares_locations_todos_and_calendar_events_are_read_as_text(
    message_type: str, content: dict[str, Any], expected: list[str]
) -> None:
    event = received(message_type, content)
    assert event.text.splitlines() == expected
    assert event.readable and event.forwarded == () and event.attachments == ()


def test_voice_messages_and_videos_are_attachments_fetched_as_files() -> None:
    audio = received("audio", {"file_key": "file_v3_voice", "duration": 2000})
    assert audio.attachments == (Attachment("audio", "file_v3_voice"),)
    video = received(
        "media",
        {
            "file_key": "file_v3_video",
            "image_key": "img_v3_cover",
            "file_name": "demo.mp4",
            "duration": 5000,
        },
    )
    assert video.attachments == (Attachment("video", "file_v3_video", "demo.mp4"),)
    assert {a.resource_type for a in (*audio.attachments, *video.attachments)} == {"file"}
    assert audio.readable and video.readable and audio.text == video.text == ""


def test_a_sticker_alone_has_nothing_to_read() -> None:
    event = received("sticker", {"file_key": "file_v3_sticker"})
    assert not event.readable
    assert event.text == "" and event.attachments == () and event.forwarded == ()


def test_rich_text_keeps_markdown_and_emoji_and_brings_its_videos() -> None:
    post = {
        "zh_cn": {
            "title": "",
            "content": [
                [
                    {"tag": "md", "text": "**Fix** the `login` bug"},
                    {"tag": "emotion", "emoji_type": "THUMBSUP"},
                ],
                [{"tag": "media", "file_key": "file_v3_clip", "image_key": "img_v3_cover"}],
            ],
        }
    }
    event = received("post", post)
    assert event.text == "**Fix** the `login` bug:THUMBSUP:"
    assert event.attachments == (Attachment("video", "file_v3_clip"),)
