"""Chats bound to projects, as Feishu users notice them: the owner binds a chat with
``/amux project bind``; a bound group's turns share the project's memory and never a member's
own; the same member's private chat keeps theirs. The real ``claude`` CLI saves and reads through
the real ``amux mcp`` against the scripted model; the repository is a real git repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hub.client import HubClient
from hub.contract import BranchWork, ChangedFile, TurnOutcome, TurnResult
from hub.errors import Conflict
from hub.history import Author
from hub.paths import principal_scope
from runtime_bridge.checkouts import branch_of
from tests.bot.test_bot_flows import ALICE, BOB, GROUP, Bot, card_text, running_bot
from tests.bot.test_bot_turns import claude_worker
from tests.conftest import make_repo, until
from tests.fakes.model_server import Answer, CallTool, FakeModelServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TEAM_NOTE = "team/deploy.md"
TEAM_TEXT = "# Deploy\nthe team ships on Tuesdays\n"
OWN_NOTE = "me/secret.md"
OWN_TEXT = "# Mine\nBob's own reminder: dentist at four\n"
DIFF = (
    "diff --git a/CHANGELOG.md b/CHANGELOG.md\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/CHANGELOG.md\n@@ -0,0 +1,3 @@\n+# Changelog\n+\n+- first\n"
)
GET = "mcp__memory__amux_memory_get"
UPSERT = "mcp__memory__amux_memory_upsert"


async def said(bot: Bot, text: str, who: dict[str, str], *, group: bool) -> str:
    """What the bot answered to ``text`` as plain text or a card's text."""
    asked = await bot.say(text, who, group=group, mention=group)
    reply = await bot.reply_to(asked)
    return reply.text if reply.card is None else card_text(reply.card)


async def test_the_owner_binds_a_chat_and_bad_bindings_are_refused_readably(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "r")))
        assert "bound to no project" in await said(bot, "/amux project", BOB, group=True)

        refused = await said(bot, "/amux project bind web", BOB, group=True)
        assert "Owner only" in refused or "owner" in refused
        assert bot.hub.projects.binding_of(GROUP) is None

        unknown = await said(bot, "/amux project bind nope", ALICE, group=True)
        assert "not_found" in unknown and "no project named 'nope'" in unknown
        assert bot.hub.projects.binding_of(GROUP) is None

        bound = await said(bot, "/amux project bind web", ALICE, group=True)
        assert "bound to project web:" in bound and "share the project's memory" in bound
        assert "**" not in bound, "a plain-text reply shows Markdown as typed"
        again = await said(bot, "/amux project bind web", ALICE, group=True)
        assert "conflict" in again and "bound to project 'web'; unbind it first" in again
        assert "bound to project web (from main)." in await said(
            bot, "/amux project", BOB, group=True
        )

        # A project a chat is bound to cannot be removed; the refusal names the chat.
        with pytest.raises(Conflict, match=GROUP):
            await bot.hub.projects.remove("web")

        assert "no longer bound" in await said(bot, "/amux project unbind", ALICE, group=True)
        assert bot.hub.projects.binding_of(GROUP) is None
        assert "not_found" in await said(bot, "/amux project unbind", ALICE, group=True)


async def test_a_bound_groups_turn_keeps_the_projects_memory_apart_from_its_members_own(
    tmp_path: Path,
) -> None:
    script = [
        # Bob's turn in the bound group: his own note is not there; the team's is saved.
        CallTool(GET, {"path": OWN_NOTE}),
        CallTool(UPSERT, {"path": TEAM_NOTE, "content": TEAM_TEXT, "expected_revision": "absent"}),
        Answer("Noted for the team."),
        # Bob's private chat: the team's note is not in his memory.
        CallTool(GET, {"path": TEAM_NOTE}),
        Answer("Nothing about deploys here."),
    ]
    async with (
        FakeModelServer(script) as model,
        running_bot(tmp_path, memory=True, isolation=True) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        bob = bot.ids["bob"]
        await bot.hub.history.upsert(
            principal_scope(bob), OWN_NOTE, OWN_TEXT, "absent", Author(bob, "cli")
        )
        project = await bot.hub.projects.add(
            "web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "repo"))
        )
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)

        asked = await bot.say("Remember: we ship on Tuesdays", BOB, group=True, mention=True)
        progress = await bot.reply_to(asked)
        await until(lambda: "Noted for the team." in card_text(progress.card), seconds=120)
        team_scope = principal_scope(project.principal_id)
        saved = await bot.hub.store.get(team_scope, TEAM_NOTE)
        assert saved.content == TEAM_TEXT
        assert not (await bot.hub.store.get(principal_scope(bob), TEAM_NOTE)).exists
        session = bot.session_of(asked)
        assert session is not None
        assert (session.principal_id, session.project) == (project.principal_id, "web")
        (turn,) = bot.executions_of(session.id)
        # Quotas, approvals and audit still name the real sender.
        assert turn.submitted_by == bob

        private = await bot.say("What do you know about deploys?", BOB)
        reply = await bot.reply_to(private)
        await until(lambda: "Nothing about deploys here." in card_text(reply.card), seconds=120)
        private_session = bot.session_of(private)
        assert private_session is not None and private_session.principal_id == bob

        await until(lambda: all(e.finished for e in bot.executions_of(private_session.id)))
        results = [text for _, text in model.tool_results]
        assert len(results) == 3, results
        group_read, _, private_read = results
        assert "dentist" not in group_read
        assert "Tuesdays" not in private_read


async def test_a_project_turns_result_shows_its_branch_and_files_and_posts_the_diff(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "r")))
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        state = bot.hub.state
        service = state.add_principal("remote-runtime", "service")
        token, _ = state.issue_credential(service.id, "cli", label="remote worker")
        async with HubClient(bot.url, token) as worker:
            registered = await worker.register_worker("host-a")
            asked = await bot.say("Add a changelog", BOB, group=True, mention=True)
            progress = await bot.reply_to(asked)
            claim = await worker.claim(registered.worker_id, wait_seconds=10)
            assert claim is not None and claim.project is not None
            branch = branch_of(claim.session.id)
            # The chat's cards show the binding while the turn runs.
            assert f"Project **web** · branch `{branch}`" in card_text(progress.card)
            work = BranchWork(
                project="web",
                branch=branch,
                base="main",
                commit="0" * 40,
                files=(ChangedFile("CHANGELOG.md", 3, 0), ChangedFile("logo.png", None, None)),
                files_total=2,
                diff=DIFF,
                diff_truncated=False,
            )
            result = TurnResult(text="Added a changelog.", provider="claude", branch=work)
            await worker.complete(
                claim.execution_id, registered.worker_id, TurnOutcome(True, result)
            )

            await until(lambda: "Added a changelog." in card_text(progress.card))
            shown = card_text(progress.card)
            assert f"**Branch** `{branch}` from main: 2 file(s) changed" in shown
            assert "`CHANGELOG.md` +3 −0" in shown and "`logo.png` binary" in shown
            assert "The diff against main follows as a file." in shown
            posted = await until(lambda: [m for m in bot.replies_to(asked) if m.msg_type == "file"])
            file_key = json.loads(posted[0].content)["file_key"]
            name = branch.replace("/", "-") + ".diff"
            assert bot.feishu.uploads[file_key] == (name, DIFF.encode())
            # Posted once, the bot's copy is gone.
            diffs = bot.hub.settings.home / "diffs"
            await until(lambda: not any(diffs.rglob("*.diff")))


async def test_new_conversation_clicked_in_another_chat_leaves_the_groups_topic_as_it_was(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "r")))
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        asked = await bot.say("Add a changelog", BOB, group=True, mention=True)
        await bot.reply_to(asked)
        session = bot.session_of(asked)
        assert session is not None and session.origin is not None

        # The group card's value, copied into a click from Bob's private chat with the bot.
        value = {"action": "conversation.new", "origin": session.origin}
        refused = await bot.click(value, who=BOB)
        assert refused["toast"]["type"] == "error"
        assert "another chat; nothing was changed" in refused["toast"]["content"]

        # The group's topic goes on in the same conversation (once its turn ended: a message
        # sent while it runs waits for it).
        await bot.hub.executions.cancel(bot.executions_of(session.id)[0].id)
        await bot.idle()
        again = await bot.say("and a readme", ALICE, group=True, mention=True, root_id=asked)
        await bot.reply_to(again)
        assert [e.submitted_by for e in bot.executions_of(session.id)] == [
            bot.ids["bob"],
            bot.ids["alice"],
        ]
        # Clicked in the group itself, it renews the topic as before.
        renewed = await bot.click(value, who=BOB, chat_id=GROUP)
        assert renewed["toast"]["type"] == "info"


async def test_after_unbinding_a_projects_old_topic_goes_on_outside_the_project(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        project = await bot.hub.projects.add(
            "web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "r"))
        )
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        asked = await bot.say("Add a changelog", BOB, group=True, mention=True)
        await bot.reply_to(asked)
        old = bot.session_of(asked)
        assert old is not None and (old.project, old.principal_id) == ("web", project.principal_id)

        unbound = await said(bot, "/amux project unbind", ALICE, group=True)
        assert "no longer bound" in unbound and "outside the project" in unbound
        await bot.hub.executions.cancel(bot.executions_of(old.id)[0].id)
        await bot.idle()

        again = await bot.say("and a readme", BOB, group=True, mention=True, root_id=asked)
        progress = await bot.reply_to(again)
        await until(lambda: len(bot.executions_of(old.id)) == 1 and progress.card is not None)
        rows = bot.hub.executions.db.execute(
            "SELECT session_id FROM executions ORDER BY rowid"
        ).fetchall()
        fresh = bot.hub.executions.session(str(rows[-1][0]))
        # A new conversation: no project checkout, and Bob's own memory, not the project's.
        assert fresh.id != old.id and fresh.origin == f"{old.origin}#1"
        assert fresh.project is None and fresh.principal_id == bot.ids["bob"]
        note = "no longer bound to project web: this message starts a new conversation outside it"
        await until(lambda: note in card_text(progress.card))
