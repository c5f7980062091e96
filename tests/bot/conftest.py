"""Fixtures of the bot's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.files import TurnFiles
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite
from tests.fakes.feishu import FakeFeishu


@pytest.fixture
async def files(feishu: FakeFeishu, tmp_path: Path) -> AsyncIterator[TurnFiles]:
    """A message's files fetched from the module's ``feishu`` fake by the real lark-oapi client,
    into workspaces under ``tmp_path`` (no sandbox)."""
    settings = FeishuSettings(
        app_id=feishu.app_id, app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    client = FeishuClient(settings, backoff=lambda state: 0.01)
    site = LaunchSite(RuntimeSettings(sandbox="off"), tmp_path / "runtime", tmp_path / "home")
    yield TurnFiles(client, site)
    await client.close()
