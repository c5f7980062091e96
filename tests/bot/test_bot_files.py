"""Files in and out of a turn: real lark-oapi against the fake Feishu, and a real workspace."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import Attachment, MessageEvent, UserIds, attachments_of
from bot.files import MAX_IN_BYTES, MAX_OUT_BYTES, TurnFiles, sanitize, with_files
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite
from tests.fakes.feishu import FakeFeishu

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id="cli_files") as fake:
        yield fake


@pytest.fixture
async def files(feishu: FakeFeishu, tmp_path: Path) -> AsyncIterator[TurnFiles]:
    settings = FeishuSettings(
        app_id="cli_files", app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    client = FeishuClient(settings, backoff=lambda state: 0.01)
    site = LaunchSite(RuntimeSettings(sandbox="off"), tmp_path / "runtime", tmp_path / "home")
    yield TurnFiles(client, site)
    await client.close()


def event_with(message_id: str, *attachments: Attachment) -> MessageEvent:
    return MessageEvent(
        event_id="ev1",
        sender=UserIds(open_id="ou_alice"),
        sender_type="user",
        chat_id="oc_chat",
        chat_type="p2p",
        message_id=message_id,
        message_type="post",
        text="",
        attachments=attachments,
    )


def test_a_message_names_its_images_and_files_and_names_are_made_safe() -> None:
    post = '{"content": [[{"tag": "text", "text": "look"}], [{"tag": "img", "image_key": "i1"}]]}'
    assert attachments_of("post", post) == (Attachment("image", "i1"),)
    assert attachments_of("file", '{"file_key": "f1", "file_name": "a.pdf"}') == (
        Attachment("file", "f1", "a.pdf"),
    )
    assert attachments_of("sticker", '{"file_key": "s1"}') == ()
    assert sanitize("../../etc/pass wd", "x") == "pass_wd"
    assert sanitize("..hidden", "x") == "hidden"
    assert sanitize("///", "fallback") == "fallback"
    assert with_files("", []) == ""


async def test_images_and_files_are_saved_in_the_workspace_within_the_budget(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    message = feishu.add_message("oc_chat", "")
    feishu.resources[(message.message_id, "img_1")] = PNG
    feishu.resources[(message.message_id, "file_1")] = b"first line\nsecond line\n"
    feishu.resources[(message.message_id, "file_big")] = b"x" * (MAX_IN_BYTES - len(PNG) - 23 - 10)
    feishu.resources[(message.message_id, "file_2")] = b"y" * 20
    event = event_with(
        message.message_id,
        Attachment("image", "img_1"),
        Attachment("file", "file_1", "../../notes 1.txt"),
        Attachment("file", "file_big", "big.bin"),
        Attachment("file", "file_2", "over.bin"),
        Attachment("file", "file_gone", "gone.txt"),
    )
    workspace = tmp_path / "workspace"
    saved, refused = await files.bring_in(event, workspace)

    inbox = f"inbox/{message.message_id}"
    assert [s.path for s in saved] == [
        f"{inbox}/image-1.png",
        f"{inbox}/notes_1.txt",
        f"{inbox}/big.bin",
    ]
    assert (workspace / inbox / "notes_1.txt").read_bytes() == b"first line\nsecond line\n"
    assert (workspace / inbox / "image-1.png").read_bytes() == PNG
    assert [(r.name, r.reason) for r in refused][0] == (
        "over.bin",
        "over the 20 MiB per message limit",
    )
    assert refused[1].name == "gone.txt" and "download failed" in refused[1].reason
    assert sorted(p.name for p in workspace.rglob("*") if p.is_file()) == [
        "big.bin",
        "image-1.png",
        "notes_1.txt",
    ]
    prompt = with_files("summarise", saved)
    assert prompt.startswith("summarise\n\nFiles attached to this message")
    assert f"- {inbox}/notes_1.txt (23 bytes)" in prompt


async def test_files_left_in_the_outbox_during_the_turn_are_posted_once_and_bounded(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    outbox = workspace / "outbox"
    outbox.mkdir(parents=True)
    old = outbox / "old.txt"
    old.write_text("from an earlier turn")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    started = time.time() - 1
    (outbox / "report.txt").write_text("the report")
    (outbox / "chart.png").write_bytes(PNG)
    with (outbox / "huge.bin").open("wb") as huge:
        huge.truncate(MAX_OUT_BYTES + 1)
    (outbox / "link.txt").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("not for Feishu")

    chosen, refused = files.left_to_send(workspace, started)
    assert [p.name for p in chosen] == ["chart.png", "report.txt"]
    assert [r.name for r in refused] == ["huge.bin"]

    question = feishu.add_message("oc_chat", "make a report")
    for _ in range(2):  # a retry after a post that landed shows it once
        await files.post(question.message_id, str(outbox / "report.txt"), "key-report")
    await files.post(question.message_id, str(outbox / "chart.png"), "key-chart")
    posted = [m for m in feishu.messages.values() if m.root_id == question.message_id]
    assert [m.msg_type for m in posted] == ["file", "image"]
    assert sorted(feishu.uploads.values()) == sorted(
        [("report.txt", b"the report"), ("report.txt", b"the report"), ("chart.png", PNG)]
    )
    with pytest.raises(FeishuApiError):
        await files.post(question.message_id, str(outbox / "link.txt"), "key-link")


async def test_links_the_agent_plants_in_its_workspace_are_never_followed(
    files: TurnFiles, feishu: FakeFeishu, tmp_path: Path
) -> None:
    # Made inside the sandbox, these links resolve on the host, where the bot reads and writes.
    secrets = tmp_path / "amux-home"
    secrets.mkdir()
    (secrets / "owner.token").write_text("amux_owner_secret")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "outbox").symlink_to(secrets)
    (workspace / "inbox").symlink_to(elsewhere)

    chosen, refused = files.left_to_send(workspace, time.time() - 3600)
    assert chosen == [] and refused == []
    with pytest.raises(FeishuApiError, match="gone"):
        await files.post("om_1", str(workspace / "outbox" / "owner.token"), "k1")
    assert feishu.uploads == {}

    message = feishu.add_message("oc_chat", "")
    feishu.resources[(message.message_id, "img_1")] = PNG
    saved, _ = await files.bring_in(
        event_with(message.message_id, Attachment("image", "img_1")), workspace
    )
    assert [s.path for s in saved] == [f"inbox/{message.message_id}/image-1.png"]
    assert not (workspace / "inbox").is_symlink()
    assert os.listdir(elsewhere) == []
