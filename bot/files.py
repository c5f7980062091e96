"""Files in and out of a turn, through the workspace of the Session's Principal.

Rules:

- In: a message's images and files are downloaded (``im.v1.message_resource.get``) into
  ``<workspace>/inbox/<message id>/`` before the turn is queued, at most ``MAX_IN_BYTES`` per
  turn; names are sanitized (no directories, no hidden names, a safe character set). The prompt
  names each saved path relative to the workspace (the Agent's working directory). Kinds the bot
  does not read (audio, video, stickers) and what would exceed the budget are refused, and the
  sender is told which and why.
- Out: files the Agent writes to ``<workspace>/outbox/`` during the turn (modified after it
  started) are uploaded and posted in the topic after the answer, at most ``MAX_OUT_FILES``, each
  at most ``MAX_OUT_BYTES``; symbolic links and anything that is not a regular file are skipped.
  They are owed in the outbox like the answer, so they are posted once, after it.
- The workspace is computed as the Runtime worker computes it (``LaunchSite.workspace``). The
  bot can reach it only when the worker runs in the Hub's process; with remote workers only, files
  are not brought in or sent out, and the sender is told. A file that cannot be written (a
  workspace the bot may not write to) is refused the same way.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import MessageEvent
from hub.contract import Session
from hub.errors import AmuxError
from runtime_bridge.launch import LaunchSite
from runtime_bridge.providers.confined import open_dir, open_root, write_file
from runtime_bridge.worker import run_as_ids

logger = logging.getLogger("amux.bot")

MAX_IN_BYTES = 20 * 1024 * 1024
MAX_OUT_FILES = 10
MAX_OUT_BYTES = 20 * 1024 * 1024
INBOX = "inbox"
OUTBOX = "outbox"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize(name: str, fallback: str) -> str:
    """A file name safe to create: its last path part, safe characters only, never hidden."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", base).strip("._")[:100]
    return cleaned or fallback


def image_suffix(content: bytes) -> str:
    if content.startswith(b"\x89PNG"):
        return ".png"
    if content.startswith(b"\xff\xd8"):
        return ".jpg"
    if content.startswith((b"GIF87a", b"GIF89a")):
        return ".gif"
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return ".webp"
    return ".img"


@contextlib.contextmanager
def _outbox(workspace: Path) -> Iterator[int]:
    """``<workspace>/outbox`` as a descriptor, refused if it is a link or not a directory."""
    with open_root(workspace) as root:
        fd = os.open(
            OUTBOX, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root
        )
    try:
        yield fd
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Saved:
    path: str  # relative to the workspace
    size: int


@dataclass(frozen=True)
class Refused:
    name: str
    reason: str


def with_files(prompt: str, saved: list[Saved]) -> str:
    if not saved:
        return prompt
    listed = "\n".join(f"- {item.path} ({item.size} bytes)" for item in saved)
    head = prompt or "Please look at the attached files."
    return f"{head}\n\nFiles attached to this message, saved in your working directory:\n{listed}"


class TurnFiles:
    """Brings a message's files into the workspace, and finds the files a turn left to send."""

    def __init__(self, client: FeishuClient, site: LaunchSite) -> None:
        self._client = client
        self._site = site
        # Files brought in belong to the Agent's user (AMUX_RUNTIME_RUN_AS), else to the service.
        self._owner = run_as_ids(site.settings.run_as) if site.settings.run_as else None

    def workspace(self, session: Session) -> Path:
        return self._site.workspace(session)

    async def bring_in(
        self, event: MessageEvent, workspace: Path
    ) -> tuple[list[Saved], list[Refused]]:
        saved: list[Saved] = []
        refused: list[Refused] = []
        budget = MAX_IN_BYTES
        inbox = workspace / INBOX / sanitize(event.message_id, "message")
        for n, item in enumerate(event.attachments, 1):
            label = item.name or f"{item.kind} {n}"
            if item.kind not in ("image", "file"):
                refused.append(Refused(label, f"{item.kind} messages are not read"))
                continue
            try:
                content = await self._client.message_resource(event.message_id, item.key, item.kind)
            except AmuxError as error:
                refused.append(Refused(label, f"download failed: {error.message}"))
                continue
            if len(content) > budget:
                refused.append(Refused(label, "over the 20 MiB per message limit"))
                continue
            budget -= len(content)
            name = (
                f"image-{n}{image_suffix(content)}"
                if item.kind == "image"
                else sanitize(item.name, f"file-{n}")
            )
            target = inbox / name
            try:
                # The Agent owns the workspace's content: every directory below it is opened
                # without following links (a planted `inbox -> /etc` is replaced, not followed),
                # and the file is created afresh. The Agent's user owns what is made.
                with (
                    open_root(workspace) as root,
                    open_dir(root, inbox.relative_to(workspace), self._owner) as directory,
                ):
                    write_file(directory, name, content, 0o644, self._owner)
            except OSError as error:
                logger.warning("could not save %s in the workspace: %s", name, error.strerror)
                refused.append(Refused(label, "it could not be saved in the Agent's workspace"))
                continue
            saved.append(Saved(str(target.relative_to(workspace)), len(content)))
        return saved, refused

    @staticmethod
    def left_to_send(workspace: Path, since: float) -> tuple[list[Path], list[Refused]]:
        """Regular files in ``<workspace>/outbox`` modified at or after ``since``, bounded.

        ``outbox`` and its files are the Agent's: a link there (say ``outbox -> AMUX_HOME``,
        made inside the sandbox but resolving on the host) is never followed, so nothing
        outside the workspace is ever posted.
        """
        try:
            with _outbox(workspace) as outbox:
                names = sorted(os.listdir(outbox))
                infos = [(n, os.stat(n, dir_fd=outbox, follow_symlinks=False)) for n in names]
        except OSError:
            return [], []
        chosen: list[Path] = []
        refused: list[Refused] = []
        for name, info in infos:
            if not stat.S_ISREG(info.st_mode) or info.st_mtime < since:
                continue
            if info.st_size > MAX_OUT_BYTES:
                refused.append(Refused(name, "over the 20 MiB per file limit"))
            elif len(chosen) >= MAX_OUT_FILES:
                refused.append(Refused(name, f"more than {MAX_OUT_FILES} files"))
            else:
                chosen.append(workspace / OUTBOX / name)
        return chosen, refused

    async def post(self, reply_to: str, path: str, key: str) -> None:
        """Upload one outbox file and post it in the topic (``key`` makes the post idempotent).

        Raises:
            FeishuApiError: the file is gone or is no longer a regular file (nothing to post).
        """
        target = Path(path)
        try:
            if target.parent.name != OUTBOX:
                raise FileNotFoundError(errno.ENOENT, "not an outbox file")
            with _outbox(target.parent.parent) as outbox:
                fd = os.open(target.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=outbox)
            with os.fdopen(fd, "rb") as source:
                if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                    raise FileNotFoundError(errno.ENOENT, "not a regular file")
                content = source.read(MAX_OUT_BYTES + 1)
        except OSError as error:
            raise FeishuApiError(f"outbox file {target.name} is gone ({error.strerror})") from None
        if len(content) > MAX_OUT_BYTES:
            raise FeishuApiError(f"outbox file {target.name} grew over the limit")
        image = target.suffix.lower() in IMAGE_SUFFIXES
        uploaded = await self._client.upload(sanitize(target.name, "file"), content, image=image)
        await self._client.reply_upload(reply_to, uploaded, image=image, idempotency_key=key)
