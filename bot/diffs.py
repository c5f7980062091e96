"""The diff of a project turn's branch, posted as a file in its topic.

A project turn's result carries its branch's unified diff against the default branch (at most
256 KiB, see ``hub.contract.BranchWork``). The bot writes it durably (temporary file, fsync,
rename, directory fsync) under ``<AMUX_HOME>/diffs/<execution id>/``, a directory no Agent can
reach, and owes it in the outbox like an outbox file of the workspace; once posted it is deleted.
Files the outbox owes from anywhere else are the workspace's, and go to the poster of those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from pathlib import Path

from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.outbox import PostFile

logger = logging.getLogger("amux.bot")

DIFFS_DIR = "diffs"
_EXECUTION_ID = re.compile(r"[0-9a-f]{1,64}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def diff_name(branch: str) -> str:
    """The posted file's name: ``amux-1a2b3c4d.diff`` for ``amux/1a2b3c4d``."""
    cleaned = _UNSAFE.sub("-", branch).strip(".-")[:80]
    return f"{cleaned or 'branch'}.diff"


def _write(directory: Path, name: str, content: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = directory / name
    temporary = directory / f".{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def _remove(target: Path) -> None:
    with contextlib.suppress(OSError):
        target.unlink()
        target.parent.rmdir()


class BranchDiffs:
    """Saves project turns' diffs and posts them; other owed files go to ``workspace_files``."""

    def __init__(
        self, root: Path, client: FeishuClient, workspace_files: PostFile | None = None
    ) -> None:
        self.root = root
        self._client = client
        self._workspace_files = workspace_files

    async def save(self, execution_id: str, branch: str, diff: str) -> Path:
        """Write one turn's diff; the path to owe.

        Raises: ValueError: not an execution id of the Hub's (never a path of anyone's).
        """
        if not _EXECUTION_ID.fullmatch(execution_id):
            raise ValueError("not an execution id")
        directory = self.root / execution_id
        return await asyncio.to_thread(
            _write, directory, diff_name(branch), diff.encode("utf-8", "replace")
        )

    def _is_ours(self, path: Path) -> bool:
        return path.parent.parent == self.root and path.parent.name.isalnum()

    async def post(self, reply_to: str, path: str, key: str) -> None:
        """Upload and post one owed file in the topic (``key`` makes the post idempotent).

        Raises:
            FeishuApiError: Feishu refused it, or the diff is gone (nothing to post).
        """
        target = Path(path)
        if not self._is_ours(target):
            if self._workspace_files is None:
                raise FeishuApiError("this bot posts no workspace files", operation="file")
            await self._workspace_files(reply_to, path, key)
            return
        try:
            content = await asyncio.to_thread(target.read_bytes)
        except OSError:
            raise FeishuApiError("the diff file is gone", operation="file") from None
        uploaded = await self._client.upload(target.name, content, image=False)
        await self._client.reply_upload(reply_to, uploaded, image=False, idempotency_key=key)
        await asyncio.to_thread(_remove, target)
