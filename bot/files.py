"""Files in and out of a turn, through the workspace of the Session's Principal.

Rules:

- In: a message's images, files, voice messages and videos are downloaded
  (``im.v1.message_resource.get``; voice and video are files to it) into
  ``<workspace>/inbox/<message id>/`` before the turn is queued, at most ``MAX_IN_BYTES`` per
  turn. The budget counts bytes downloaded: each download is streamed and cut off past what is
  left of it (a file cut off spends what was read), and once it is spent the rest are refused
  without being downloaded. Names are sanitized (no directories, no hidden names, a safe
  character set). The prompt names each saved path relative to the workspace (the Agent's working
  directory). What would exceed the budget is refused, and the sender is told which and why
  (stickers never get here: Feishu serves no sticker's file to an app).
- Out: files the Agent writes to ``<workspace>/outbox/`` during the turn (modified after it
  started) are uploaded and posted in the topic after the answer, at most ``MAX_OUT_FILES``, each
  at most ``MAX_OUT_BYTES``; symbolic links and anything that is not a regular file are skipped.
  At most ``MAX_OUTBOX_ENTRIES`` entries of ``outbox/`` are looked at; when it holds more, the
  sender is told the rest were not. They are owed in the outbox like the answer, so they are
  posted once, after it.
- The workspace is computed as the Runtime worker computes it (``LaunchSite.workspace``). The
  bot can reach it only when the worker runs in the Hub's process; with remote workers only, files
  are not brought in or sent out, and the sender is told. A file that cannot be written (a
  workspace the bot may not write to) is refused the same way.

Everything in the workspace is the Agent's, and the Agent is hostile: between two looks it can
swap a file for a link, a directory or a FIFO (whose ``open`` waits for a writer, forever). So:

- Directories are opened with ``O_DIRECTORY | O_NOFOLLOW`` and entries are named relative to
  their descriptor; no path below the workspace is ever resolved.
- A file is opened once, with ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`` (an open that cannot wait,
  of the entry itself), then judged by ``fstat`` of that descriptor (a regular file, at most
  ``MAX_OUT_BYTES``) and read from it, never more than ``MAX_OUT_BYTES + 1`` bytes. Inbox files
  are created with ``O_CREAT | O_EXCL`` as well: what stood at the name is unlinked, not followed
  or descended into.
- Listing and reading are bounded (``MAX_OUTBOX_ENTRIES``, ``MAX_OUT_BYTES``), and all of this
  file work runs in a worker thread, so a slow or hostile workspace never stalls the event loop
  that serves ``/healthz`` and every webhook.
"""

from __future__ import annotations

import asyncio
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
from bot.feishu.errors import FeishuApiError, ResourceTooLarge
from bot.feishu.events import MessageEvent
from hub.contract import Session
from hub.errors import AmuxError
from runtime_bridge.launch import LaunchSite, Workplace
from runtime_bridge.providers.confined import Owner, open_dir, open_root

logger = logging.getLogger("amux.bot")

MAX_IN_BYTES = 20 * 1024 * 1024
OVER_BUDGET = "over the 20 MiB per message limit"
MAX_OUT_FILES = 10
MAX_OUT_BYTES = 20 * 1024 * 1024
MAX_OUTBOX_ENTRIES = 256
INBOX = "inbox"
OUTBOX = "outbox"
# Linked Feishu documents too long for the prompt, saved beside the message's files.
DOCUMENTS = "feishu"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_READ = os.O_RDONLY | _SAFE
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE
_CHUNK = 1024 * 1024


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


@contextlib.contextmanager
def _opened_file(directory: int, name: str) -> Iterator[tuple[int, os.stat_result]]:
    """The regular file ``name`` in ``directory``, opened once, with what ``fstat`` says of it.

    Raises:
        OSError: ``name`` is a link (``ELOOP``), a socket (``ENXIO``), gone, or opened but not a
            regular file (``ENOENT``: there is no file to read).
    """
    fd = os.open(name, _READ, dir_fd=directory)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file")
        yield fd, info
    finally:
        os.close(fd)


def _read_bounded(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``, however much the file holds or grows meanwhile."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _first_entries(directory: int, limit: int) -> tuple[list[str], bool]:
    """Up to ``limit`` names of regular-looking entries in ``directory``, and whether it holds more.

    The directory is read lazily and only so far: the Agent can fill it with millions of names.
    The kind read here is a hint to skip directories, links and FIFOs without opening them;
    what decides is the ``fstat`` of the opened file.
    """
    names: list[str] = []
    seen = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if seen == limit:
                return names, True
            seen += 1
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    names.append(entry.name)
    return names, False


def _list_outbox(workspace: Path, since: float) -> tuple[list[Path], list[Refused]]:
    try:
        with _outbox(workspace) as outbox:
            names, more = _first_entries(outbox, MAX_OUTBOX_ENTRIES)
            infos: list[tuple[str, os.stat_result]] = []
            for name in sorted(names):
                try:
                    with _opened_file(outbox, name) as (_, info):
                        infos.append((name, info))
                except OSError:
                    continue  # Not a regular file once opened, or gone: nothing to post.
    except OSError:
        return [], []
    chosen: list[Path] = []
    refused: list[Refused] = []
    for name, info in infos:
        if info.st_mtime < since:
            continue
        if info.st_size > MAX_OUT_BYTES:
            refused.append(Refused(name, "over the 20 MiB per file limit"))
        elif len(chosen) >= MAX_OUT_FILES:
            refused.append(Refused(name, f"more than {MAX_OUT_FILES} files"))
        else:
            chosen.append(workspace / OUTBOX / name)
    if more:
        refused.append(
            Refused(f"the rest of {OUTBOX}/", f"more than {MAX_OUTBOX_ENTRIES} entries in it")
        )
    return chosen, refused


def _read_outbox_file(target: Path) -> bytes:
    """The content of one outbox file, read from the one descriptor its checks were made on.

    Raises:
        FeishuApiError: the file is gone, is no longer a regular file, or grew over the limit.
    """
    try:
        if target.parent.name != OUTBOX:
            raise FileNotFoundError(errno.ENOENT, "not an outbox file")
        with _outbox(target.parent.parent) as outbox, _opened_file(outbox, target.name) as opened:
            fd, info = opened
            if info.st_size > MAX_OUT_BYTES:
                raise FeishuApiError(f"outbox file {target.name} grew over the limit")
            content = _read_bounded(fd, MAX_OUT_BYTES + 1)
    except OSError as error:
        raise FeishuApiError(f"outbox file {target.name} is gone ({error.strerror})") from None
    if len(content) > MAX_OUT_BYTES:
        raise FeishuApiError(f"outbox file {target.name} grew over the limit")
    return content


def _create(directory: int, name: str, mode: int) -> int:
    """``name`` created afresh in ``directory``; a non-directory standing there is unlinked.

    ``O_EXCL`` never opens what stood at the name, so nothing the Agent planted is followed or
    written through; a directory there is refused rather than walked (it could be unbounded).
    """
    for _ in range(2):
        try:
            return os.open(name, _CREATE, mode, dir_fd=directory)
        except FileExistsError:
            os.unlink(name, dir_fd=directory)
    raise OSError(errno.EEXIST, f"{name} keeps being replaced")


def _save(workspace: Path, relative: Path, name: str, content: bytes, owner: Owner) -> None:
    with open_root(workspace) as root, open_dir(root, relative, owner) as directory:
        fd = _create(directory, name, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EEXIST, f"{name} is not a regular file")
            os.fchmod(fd, 0o644)
            if owner is not None:
                os.fchown(fd, *owner)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


class TurnFiles:
    """Brings a message's files into the workspace, and finds the files a turn left to send."""

    def __init__(self, client: FeishuClient, site: LaunchSite) -> None:
        self._client = client
        self._site = site

    def workspace(self, session: Session | Workplace) -> Path:
        return self._site.workspace(session)

    async def bring_in(
        self, event: MessageEvent, session: Session | Workplace
    ) -> tuple[list[Saved], list[Refused]]:
        """Save ``event``'s files in ``session``'s workspace (a group topic's own, else its
        Principal's), owned by the uid its Agents run as on a root worker, else the service's."""
        workspace = self.workspace(session)
        owner = await asyncio.to_thread(self._site.identity_of, session)
        saved: list[Saved] = []
        refused: list[Refused] = []
        budget = MAX_IN_BYTES
        inbox = workspace / INBOX / sanitize(event.message_id, "message")
        for n, item in enumerate(event.attachments, 1):
            label = item.name or f"{item.kind} {n}"
            if budget <= 0:
                refused.append(Refused(label, OVER_BUDGET))
                continue
            try:
                content = await self._client.message_resource(
                    event.message_id, item.key, item.resource_type, limit=budget
                )
            except ResourceTooLarge as error:
                # The budget counts bytes downloaded: what was read before the cut is spent.
                budget -= min(budget, error.received)
                refused.append(Refused(label, OVER_BUDGET))
                continue
            except AmuxError as error:
                refused.append(Refused(label, f"download failed: {error.message}"))
                continue
            budget -= len(content)
            if item.kind == "image":
                name = f"image-{n}{image_suffix(content)}"
            elif item.kind == "audio":
                # Feishu keeps voice messages as Opus (in an Ogg container).
                name = f"voice-{n}.opus"
            else:
                name = sanitize(
                    item.name, f"{item.kind}-{n}" + (".mp4" if item.kind == "video" else "")
                )
            target = inbox / name
            try:
                # Every directory below the workspace is opened without following links (a
                # planted `inbox -> /etc` is replaced, not followed); the Agent's user owns
                # what is made.
                await asyncio.to_thread(
                    _save, workspace, inbox.relative_to(workspace), name, content, owner
                )
            except OSError as error:
                logger.warning("could not save %s in the workspace: %s", name, error.strerror)
                refused.append(Refused(label, "it could not be saved in the Agent's workspace"))
                continue
            saved.append(Saved(str(target.relative_to(workspace)), len(content)))
        return saved, refused

    async def save_document(
        self, message_id: str, session: Session | Workplace, name: str, markdown: str
    ) -> Saved | None:
        """Save a linked document's Markdown in ``session``'s workspace, as ``bring_in`` saves
        a message's files (``inbox/<message id>/feishu/<name>``); None when it cannot be."""
        try:
            workspace = self.workspace(session)
            owner = await asyncio.to_thread(self._site.identity_of, session)
        except AmuxError as error:
            logger.warning("no workspace to save a linked document in: %s", error.message)
            return None
        directory = workspace / INBOX / sanitize(message_id, "message") / DOCUMENTS
        file_name = sanitize(name, "document.md")
        content = markdown.encode()
        try:
            await asyncio.to_thread(
                _save, workspace, directory.relative_to(workspace), file_name, content, owner
            )
        except OSError as error:
            logger.warning("could not save a linked document in the workspace: %s", error.strerror)
            return None
        return Saved(str((directory / file_name).relative_to(workspace)), len(content))

    @staticmethod
    async def left_to_send(workspace: Path, since: float) -> tuple[list[Path], list[Refused]]:
        """Regular files in ``<workspace>/outbox`` modified at or after ``since``, bounded.

        ``outbox`` and its files are the Agent's: a link there (say ``outbox -> AMUX_HOME``,
        made inside the sandbox but resolving on the host) is never followed, so nothing
        outside the workspace is ever posted.
        """
        return await asyncio.to_thread(_list_outbox, workspace, since)

    async def post(self, reply_to: str, path: str, key: str) -> None:
        """Upload one outbox file and post it in the topic (``key`` makes the post idempotent).

        Raises:
            FeishuApiError: the file is gone, is no longer a regular file, or grew over the limit
                (nothing to post).
        """
        target = Path(path)
        content = await asyncio.to_thread(_read_outbox_file, target)
        image = target.suffix.lower() in IMAGE_SUFFIXES
        uploaded = await self._client.upload(sanitize(target.name, "file"), content, image=image)
        await self._client.reply_upload(reply_to, uploaded, image=image, idempotency_key=key)
