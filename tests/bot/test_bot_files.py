"""Files in and out of a turn: real lark-oapi against the fake Feishu, and a real workspace.

The workspace is the Agent's, so the Agent is the adversary here: it leaves FIFOs, links and
folders where the bot expects files, and swaps them in between the bot's looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from bot.feishu.errors import FeishuApiError
from bot.feishu.events import Attachment, MessageEvent, UserIds, attachments_of
from bot.files import (
    MAX_IN_BYTES,
    MAX_OUT_BYTES,
    MAX_OUT_FILES,
    MAX_OUTBOX_ENTRIES,
    TurnFiles,
    sanitize,
    with_files,
)
from hub.contract import Session
from tests.conftest import HubProcess, free_port, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
# Long enough for a blocked call to stand out, far below the test's own timeout.
DEADLINE = 5.0
T = TypeVar("T")


async def promptly(call: Awaitable[T]) -> T:
    """``call``, failed if it takes longer than ``DEADLINE``.

    A call that blocked the event loop would not even let the deadline fire: the test's own
    timeout then fails it instead.
    """
    return await asyncio.wait_for(call, DEADLINE)


def session_in(workspace: Path) -> Session:
    """A Session working in ``workspace`` (as ``amux agent run --cwd`` would make)."""
    return Session("s", "principal", "claude", str(workspace), None, None, "pending", None)


def release_readers(fifo: Path) -> None:
    """Let go whoever may wait on ``fifo`` for a writer, so a failing test cannot hang."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def nobody_reads(fifo: Path) -> bool:
    """No process holds ``fifo`` open for reading (a non-blocking writer open says ``ENXIO``)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as error:
        return error.errno == errno.ENXIO
    return False


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id="cli_files") as fake:
        yield fake


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
        Attachment("file", "file_gone", "gone.txt"),
        Attachment("file", "file_2", "over.bin"),
    )
    workspace = tmp_path / "workspace"
    saved, refused = await files.bring_in(event, session_in(workspace))

    inbox = f"inbox/{message.message_id}"
    assert [s.path for s in saved] == [
        f"{inbox}/image-1.png",
        f"{inbox}/notes_1.txt",
        f"{inbox}/big.bin",
    ]
    assert (workspace / inbox / "notes_1.txt").read_bytes() == b"first line\nsecond line\n"
    assert (workspace / inbox / "image-1.png").read_bytes() == PNG
    assert refused[0].name == "gone.txt" and "download failed" in refused[0].reason
    assert [(r.name, r.reason) for r in refused][1] == (
        "over.bin",
        "over the 20 MiB per message limit",
    )
    assert sorted(p.name for p in workspace.rglob("*") if p.is_file()) == [
        "big.bin",
        "image-1.png",
        "notes_1.txt",
    ]
    prompt = with_files("summarise", saved)
    assert prompt.startswith("summarise\n\nFiles attached to this message")
    assert f"- {inbox}/notes_1.txt (23 bytes)" in prompt


async def test_voice_messages_and_videos_are_saved_as_files_for_the_agent(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    message = feishu.add_message("oc_chat", "")
    feishu.resources[(message.message_id, "file_v3_voice")] = b"OggS voice"
    feishu.resources[(message.message_id, "file_v3_video")] = b"\0\0\0 ftypmp42"
    feishu.resources[(message.message_id, "file_v3_clip")] = b"\0\0\0 ftypisom"
    event = event_with(
        message.message_id,
        Attachment("audio", "file_v3_voice"),
        Attachment("video", "file_v3_video", "demo day.mp4"),
        Attachment("video", "file_v3_clip"),
    )
    workspace = tmp_path / "workspace"
    saved, refused = await files.bring_in(event, session_in(workspace))
    inbox = f"inbox/{message.message_id}"
    assert refused == []
    assert [s.path for s in saved] == [
        f"{inbox}/voice-1.opus",
        f"{inbox}/demo_day.mp4",
        f"{inbox}/video-3.mp4",
    ]
    assert (workspace / inbox / "voice-1.opus").read_bytes() == b"OggS voice"
    # Feishu serves voice and video as files.
    fetched = feishu.calls("GET", f"/messages/{message.message_id}/resources/")
    assert {call.query["type"] for call in fetched} == {"file"}


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

    chosen, refused = await files.left_to_send(workspace, started)
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

    chosen, refused = await files.left_to_send(workspace, time.time() - 3600)
    assert chosen == [] and refused == []
    with pytest.raises(FeishuApiError, match="gone"):
        await files.post("om_1", str(workspace / "outbox" / "owner.token"), "k1")
    assert feishu.uploads == {}

    message = feishu.add_message("oc_chat", "")
    feishu.resources[(message.message_id, "img_1")] = PNG
    saved, _ = await files.bring_in(
        event_with(message.message_id, Attachment("image", "img_1")), session_in(workspace)
    )
    assert [s.path for s in saved] == [f"inbox/{message.message_id}/image-1.png"]
    assert not (workspace / "inbox").is_symlink()
    assert os.listdir(elsewhere) == []


def hostile_outbox(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace whose outbox holds a FIFO, a link out of it, a folder and one real file."""
    secret = tmp_path / "amux-home" / "owner.token"
    secret.parent.mkdir()
    secret.write_text("amux_owner_secret")
    workspace = tmp_path / "workspace"
    outbox = workspace / "outbox"
    (outbox / "folder").mkdir(parents=True)
    (outbox / "folder" / "inner.txt").write_text("inside a folder")
    os.mkfifo(outbox / "pipe")
    (outbox / "link.txt").symlink_to(secret)
    (outbox / "report.txt").write_text("the report")
    return workspace, outbox


async def test_a_fifo_a_link_and_a_folder_in_the_outbox_are_skipped_and_never_waited_on(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    workspace, outbox = hostile_outbox(tmp_path)
    try:
        chosen, refused = await promptly(files.left_to_send(workspace, time.time() - 60))
        assert chosen == [outbox / "report.txt"] and refused == []

        question = feishu.add_message("oc_chat", "make a report")
        for n, name in enumerate(["pipe", "link.txt", "folder"]):
            with pytest.raises(FeishuApiError, match=f"outbox file {name} is gone"):
                await promptly(files.post(question.message_id, str(outbox / name), f"k{n}"))
        await promptly(files.post(question.message_id, str(outbox / "report.txt"), "k-report"))
        assert list(feishu.uploads.values()) == [("report.txt", b"the report")]
        posted = [m for m in feishu.messages.values() if m.root_id == question.message_id]
        assert [m.msg_type for m in posted] == ["file"]
        assert nobody_reads(outbox / "pipe")
    finally:
        release_readers(outbox / "pipe")


def swap(target: Path, kind: str, secret: Path) -> None:
    """Replace ``target`` as the Agent's next turn would: a FIFO, a link out, or a folder."""
    staged = target.with_name(".staged")
    if kind == "fifo":
        os.mkfifo(staged)
    elif kind == "link":
        staged.symlink_to(secret)
    else:
        staged.mkdir()
        (staged / "inner.txt").write_text("inside a folder")
        target.unlink()
    os.replace(staged, target)


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
async def test_a_file_swapped_after_it_was_chosen_fails_its_post_at_once_and_others_still_go(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path, kind: str
) -> None:
    workspace, outbox = hostile_outbox(tmp_path)
    late = outbox / "late.txt"
    late.write_text("chosen, then swapped")
    chosen, _ = await files.left_to_send(workspace, time.time() - 60)
    assert chosen == [late, outbox / "report.txt"]

    swap(late, kind, tmp_path / "amux-home" / "owner.token")
    question = feishu.add_message("oc_chat", "make a report")
    try:
        # The report's upload is served by the fake Feishu on this same event loop: it only
        # lands if the swapped file's post leaves the loop free.
        failed, posted = await promptly(
            asyncio.gather(
                files.post(question.message_id, str(late), "k-late"),
                files.post(question.message_id, str(outbox / "report.txt"), "k-report"),
                return_exceptions=True,
            )
        )
    finally:
        if kind == "fifo":
            release_readers(late)
    assert isinstance(failed, FeishuApiError) and "late.txt is gone" in failed.message
    assert posted is None
    assert list(feishu.uploads.values()) == [("report.txt", b"the report")]


async def test_a_file_that_grows_over_the_limit_after_it_was_chosen_is_not_posted(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    workspace, outbox = hostile_outbox(tmp_path)
    chosen, _ = await files.left_to_send(workspace, time.time() - 60)
    assert chosen == [outbox / "report.txt"]
    with (outbox / "report.txt").open("r+b") as report:
        report.truncate(MAX_OUT_BYTES + 1)
    with pytest.raises(FeishuApiError, match="grew over the limit"):
        await promptly(files.post("om_1", str(outbox / "report.txt"), "k1"))
    assert feishu.uploads == {}


async def test_an_outbox_with_too_many_entries_is_read_only_so_far_and_the_sender_is_told(
    files: TurnFiles, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    outbox = workspace / "outbox"
    outbox.mkdir(parents=True)
    for n in range(MAX_OUTBOX_ENTRIES + 50):
        (outbox / f"part-{n:04}.txt").write_text(str(n))
    chosen, refused = await promptly(files.left_to_send(workspace, time.time() - 60))
    assert len(chosen) == MAX_OUT_FILES
    assert [r.reason for r in refused].count(f"more than {MAX_OUT_FILES} files") == (
        MAX_OUTBOX_ENTRIES - MAX_OUT_FILES
    )
    assert refused[-1].name == "the rest of outbox/"
    assert refused[-1].reason == f"more than {MAX_OUTBOX_ENTRIES} entries in it"


async def test_a_fifo_or_a_link_where_an_inbox_file_goes_is_replaced_and_a_folder_refused(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not the Agent's")
    message = feishu.add_message("oc_chat", "")
    workspace = tmp_path / "workspace"
    inbox = workspace / "inbox" / message.message_id
    inbox.mkdir(parents=True)
    os.mkfifo(inbox / "image-1.png")
    (inbox / "notes.txt").symlink_to(elsewhere)
    (inbox / "kept.txt").mkdir()
    (inbox / "kept.txt" / "inner.txt").write_text("the Agent's own")
    feishu.resources[(message.message_id, "img_1")] = PNG
    feishu.resources[(message.message_id, "file_1")] = b"the notes"
    feishu.resources[(message.message_id, "file_2")] = b"never saved"
    event = event_with(
        message.message_id,
        Attachment("image", "img_1"),
        Attachment("file", "file_1", "notes.txt"),
        Attachment("file", "file_2", "kept.txt"),
    )
    saved, refused = await promptly(files.bring_in(event, session_in(workspace)))
    assert [s.path for s in saved] == [
        f"inbox/{message.message_id}/image-1.png",
        f"inbox/{message.message_id}/notes.txt",
    ]
    assert (inbox / "image-1.png").read_bytes() == PNG
    assert not (inbox / "notes.txt").is_symlink()
    assert (inbox / "notes.txt").read_bytes() == b"the notes"
    assert elsewhere.read_text() == "not the Agent's"
    assert [(r.name, r.reason) for r in refused] == [
        ("kept.txt", "it could not be saved in the Agent's workspace")
    ]
    assert (inbox / "kept.txt" / "inner.txt").read_text() == "the Agent's own"


# -- through `amux serve` ---------------------------------------------------------------------

E2E_APP = "cli_files_e2e"
e2e_signer = FeishuSigner(encrypt_key="ek_files", verification_token="vt_files", app_id=E2E_APP)
ALICE: dict[str, Any] = {
    "sender_open_id": "ou_alice",
    "sender_union_id": "on_alice",
    "sender_user_id": "u_alice",
}

# A stand-in Agent: once the test opens its gate it leaves a FIFO, a link out of the workspace,
# a folder and two real files in its outbox, then answers.
HOSTILE_AGENT = """#!/bin/sh
cat > /dev/null
i=0
while [ ! -e "{gate}" ]; do
  i=$((i + 1))
  [ "$i" -gt 1200 ] && exit 1
  sleep 0.1
done
rm -rf outbox
mkdir -p outbox/folder
echo "inside a folder" > outbox/folder/inner.txt
ln -s "{secret}" outbox/link.txt
mkfifo outbox/pipe
printf 'the report\\n' > outbox/report.txt
printf 'chosen, then swapped\\n' > outbox/late.txt
echo "answer with files"
"""


async def answers_health(http: aiohttp.ClientSession, hub: HubProcess) -> bool:
    try:
        async with http.get(f"{hub.url}/healthz", timeout=aiohttp.ClientTimeout(2)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def watch_health(
    http: aiohttp.ClientSession, hub: HubProcess, missed: list[float], stop: asyncio.Event
) -> None:
    """Ask ``/healthz`` over and over until ``stop``; note when it did not answer."""
    while not stop.is_set():
        if not await answers_health(http, hub):
            missed.append(time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


def shown(message: StoredMessage) -> str:
    return json.dumps(message.card, ensure_ascii=False)


def hostile_hub(tmp_path: Path, feishu: FakeFeishu, agent: Path) -> HubProcess:
    """``amux serve`` with the Feishu bot, its worker in-process launching ``agent``."""
    return HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_FEISHU_APP_ID": E2E_APP,
            "AMUX_FEISHU_APP_SECRET": "secret",
            "AMUX_FEISHU_ENCRYPT_KEY": e2e_signer.encrypt_key,
            "AMUX_FEISHU_VERIFICATION_TOKEN": e2e_signer.verification_token,
            "AMUX_FEISHU_DOMAIN": feishu.url,
            "AMUX_FEISHU_LANGUAGE": "en_us",
            "AMUX_FEISHU_CARD_UPDATE_INTERVAL_SECONDS": "0.2",
            "AMUX_FEISHU_PROVIDER": "hostile",
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"hostile": str(agent)}),
            "AMUX_RUNTIME_SANDBOX": "off",
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
        },
    )


async def say(http: aiohttp.ClientSession, hub: HubProcess, feishu: FakeFeishu, text: str) -> str:
    asked = feishu.add_message("oc_chat1", text)
    body, headers = e2e_signer.sign(e2e_signer.message(text, **ALICE, message_id=asked.message_id))
    async with http.post(
        f"{hub.url}/feishu/events", data=io.BytesIO(body), headers=headers
    ) as response:
        assert response.status == 200
    return asked.message_id


@pytest.mark.e2e
@pytest.mark.timeout(180)
async def test_only_the_agents_real_outbox_files_are_posted_and_the_bot_never_stalls(
    tmp_path: Path, shared_dir: Path
) -> None:
    secret = tmp_path / "owner.token"
    secret.write_text("amux_owner_secret")
    gate = shared_dir / "gate"
    agent = shared_dir / "hostile-agent.sh"
    agent.write_text(HOSTILE_AGENT.format(gate=gate, secret=secret))
    agent.chmod(0o755)
    swapped = tmp_path / "not-yet"
    async with FakeFeishu(app_id=E2E_APP) as feishu, aiohttp.ClientSession() as http:
        hub = hostile_hub(tmp_path, feishu, agent)
        await asyncio.to_thread(hub.start)
        stop = asyncio.Event()
        missed: list[float] = []
        watcher = asyncio.create_task(watch_health(http, hub, missed, stop))
        try:
            await until(lambda: feishu.calls("GET", "/bot/v3/info"))
            asked = await say(http, hub, feishu, "make me a report")

            def replies() -> list[StoredMessage]:
                return [m for m in feishu.messages.values() if m.root_id == asked]

            card = (await until(replies))[0]
            # Feishu is down when the turn ends, so its files stay owed once chosen; meanwhile
            # the Agent (its next turn, say) swaps one of them for a FIFO.
            await feishu.go_down()
            gate.write_text("go")
            await until(lambda: "stays owed and is retried" in hub.log(), seconds=90)
            (swapped,) = (tmp_path / "runtime").rglob("outbox/late.txt")
            os.mkfifo(swapped.with_name(".staged"))
            os.replace(swapped.with_name(".staged"), swapped)
            await feishu.come_back()

            await until(lambda: "answer with files" in shown(card), seconds=90)
            await until(lambda: "outbox file late.txt is gone" in hub.log(), seconds=90)
            posted = await until(lambda: [m for m in replies() if m.msg_type == "file"])
            (file_key,) = [json.loads(m.content)["file_key"] for m in posted]
            assert feishu.uploads[file_key] == ("report.txt", b"the report\n")
            assert list(feishu.uploads.values()) == [("report.txt", b"the report\n")]
            assert nobody_reads(swapped)
            assert await answers_health(http, hub)
        finally:
            stop.set()
            await watcher
            release_readers(swapped)
            await asyncio.to_thread(hub.stop)
        assert missed == []
