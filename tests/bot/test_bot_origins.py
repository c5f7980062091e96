"""A topic's conversations are the bot's to open: a member's CLI token cannot claim the next one.

The bot of ``test_bot_flows`` (real lark-oapi against the fake Feishu, real Hub); no worker runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.contract import is_bot_origin
from tests.bot.test_bot_flows import ALICE, running_bot
from tests.bot.test_bot_topics import sessions
from tests.conftest import until

pytestmark = pytest.mark.timeout(120)


async def test_a_members_cli_token_cannot_take_the_topics_next_conversation(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        first = await bot.say("first question", ALICE)
        ((_, topic),) = await until(lambda: sessions(bot))
        assert is_bot_origin(topic)

        # Bob, an enrolled member, tries to be the one whose Session the topic continues next.
        token, _ = bot.hub.state.issue_credential(bot.ids["bob"], "cli")
        response = await bot.client.post(
            "/rpc/v1/executions.submit",
            json={"provider": "claude", "prompt": "as bob", "origin": f"{topic}#1"},
            headers={"Authorization": f"Bearer {token}"},
        )
        body = await response.json()
        assert response.status == 403 and body["error"]["code"] == "forbidden"
        assert len(sessions(bot)) == 1

        renewed = await bot.click({"action": "conversation.new", "origin": topic})
        assert "new conversation" in renewed["toast"]["content"]
        await bot.say("a fresh start", ALICE, root_id=first)
        ((new_id, origin),) = await until(lambda: sessions(bot)[1:])
        assert origin == f"{topic}#1" and is_bot_origin(origin)
        assert bot.hub.executions.session(new_id).principal_id == bot.ids["alice"]
