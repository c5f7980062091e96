"""The diff of a project turn's branch, posted as a file in its topic.

A project turn's result carries its branch's unified diff against the default branch (at most
256 KiB, see ``hub.contract.BranchWork``). The bot writes it durably (temporary file, fsync,
rename, directory fsync) under ``<AMUX_HOME>/diffs/<execution id>/``, a directory no Agent can
reach, and owes it in the outbox like an outbox file of the workspace; once posted it is deleted.
Files the outbox owes from anywhere else are the workspace's, and go to the poster of those.

A diff is owed only when it differs from the last one owed for the same branch: a turn that
left the branch as it was posts no file again. The digest of the last one is kept per branch
under ``<AMUX_HOME>/diffs/.posted/``, written as durably as the diffs themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path

from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.outbox import PostFile

logger = logging.getLogger("amux.bot")

DIFFS_DIR = "diffs"
# Not an execution id: never taken for a diff to post.
_POSTED_DIR = ".posted"
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


def _branch_key(project: str, branch: str) -> str:
    return hashlib.sha256(f"{project}\0{branch}".encode()).hexdigest()[:32]


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

    async def save(self, execution_id: str, project: str, branch: str, diff: str) -> Path | None:
        """Write one turn's diff; the path to owe, or None when the branch's last diff owed was
        the same (nothing changed since).

        Raises: ValueError: not an execution id of the Hub's (never a path of anyone's).
        """
        if not _EXECUTION_ID.fullmatch(execution_id):
            raise ValueError("not an execution id")
        content = diff.encode("utf-8", "replace")
        digest = hashlib.sha256(content).hexdigest()
        return await asyncio.to_thread(
            self._save_changed, execution_id, _branch_key(project, branch), branch, content, digest
        )

    def _save_changed(
        self, execution_id: str, key: str, branch: str, content: bytes, digest: str
    ) -> Path | None:
        posted = self.root / _POSTED_DIR
        with contextlib.suppress(OSError):
            if (posted / key).read_text(encoding="ascii") == digest:
                return None
        saved = _write(self.root / execution_id, diff_name(branch), content)
        # Recorded once the diff is saved to be owed: a later turn with the same diff is not.
        _write(posted, key, digest.encode("ascii"))
        return saved

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
