"""Feishu conversations: one Session per topic, one progress card per turn, results in the topic.

A private message or a group message that @mentions the bot is a turn. The bot answers in the
message's topic (``reply_in_thread``), so the topic is the conversation: later messages in it
resume the same Session, and so the same frozen memory binding.

Every turn the bot follows is recorded in the :class:`~bot.outbox.Outbox` once its progress card
is out, and its final cards are owed there before the first attempt to post them: a restarted
bot re-attaches to each unfinished turn (``resume``) and its card is updated to the end, and no
answer is lost to a Feishu outage. When Feishu cannot take the progress card at all, the turn
still runs and its answer is owed as a reply in the topic.

The progress is streamed into a CardKit card when Feishu allows it (``bot.streaming``), else shown
on an ordinary card updated in place (throttled PATCH); either way the end of the turn replaces
that card with the first result card.

A turn started by a group message inside a topic carries the topic's messages the Agent has not
seen, ahead of the request, as marked context (``bot.topic_context``); when the topic cannot be
read the turn runs anyway and its card says so.

Under the ``ask`` permission policy an Agent's risky action waits for its person's answer
(``hub.approvals``). A pending request is shown with Allow once / Allow for this conversation /
Deny: on the progress card itself when it is an ordinary card, or, when the progress streams
into a CardKit card, on a card of its own posted in the topic (keyed by the request, so a
re-attached bot finds it again) and updated in place once it is settled. Feishu applies no card
a click answers with while a card streams, and an ordinary card's update is immediate, so the
streaming card never carries the buttons. The first result card lists what was allowed and
denied, and the rules the conversation keeps for the turn's person.

A message recalled in Feishu is never answered as if it stood: its turn is cancelled before it
starts, or stopped while it runs, and its card says who recalled it; a recalled message of a
group topic is left out of later turns' context (``recall``).

A finished turn's card shows the Provider's token totals and the elapsed time in its title, and a
"New conversation" button: the topic's next message then starts a new Session (the old one stays
as it was). The progress card's Stop cancels the running turn; the Session stays resumable.

Images and files of the message are saved in the workspace and named in the prompt; files the
Agent leaves in ``outbox/`` are posted after the answer (``bot.files``).

What a message forwards, a chat's messages (``bot.forwards``) or a card, goes in the same fence
as a topic's context, with its original senders, never as the requester's words; a forward with
no words of the requester's is a turn too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bot.diffs import BranchDiffs
from bot.feishu.client import FeishuClient
from bot.feishu.events import Forwarded, MessageEvent, Recall
from bot.files import Refused, Saved, TurnFiles, with_files
from bot.forwards import ForwardReader
from bot.linked_docs import Keep, Linked, LinkedDocs
from bot.outbox import Followed, Outbox, Owed
from bot.quotas import refusal_card
from bot.streaming import StreamingCard, open_streaming
from bot.topic_context import SeenTopics, TopicContext, TopicReader, with_context
from cards.approvals import (
    approval_card,
    outcome,
    request_file_text,
    request_line,
    shows_whole,
    subject_file_name,
)
from cards.catalogue import text as catalogue_text
from cards.models import (
    ApprovalView,
    BranchView,
    BudgetView,
    ChangedFileView,
    FinishView,
    Lang,
    MemoryNote,
    ProgressView,
    TurnApprovals,
    TurnMemory,
)
from cards.notices import (
    budget_reached_card,
    budget_request_card,
    error_card,
    own_topic_card,
    warning_card,
)
from cards.progress import progress_card, pull_request_card, result_cards
from cards.streaming import stream_text
from cards.times import DEFAULT_TIME_ZONE
from hub.aliases import UNION_ID_KIND, alias_kind
from hub.contract import (
    APPROVAL,
    BY_RULE,
    CANCELLED,
    EGRESS,
    MEMORY,
    PLAN,
    RUNNING,
    STEP,
    SUCCEEDED,
    WARNING,
    Approval,
    BranchWork,
    Execution,
    MemoryUse,
    Session,
    WatchResult,
    visible,
)
from hub.errors import (
    AmuxError,
    Conflict,
    Forbidden,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
)
from hub.executions import Recorder
from hub.people import PRIVATE_CHAT_ALIAS
from hub.principals import Principal
from hub.projects import Project
from hub.services import Hub
from hub.usage import DAILY_TOKENS
from runtime_bridge.checkouts import branch_of
from runtime_bridge.gateway import WARN_SHARE
from runtime_bridge.launch import Workplace
from runtime_bridge.worker import BUDGET_WARNING

logger = logging.getLogger("amux.bot")

WATCH_SECONDS = 20.0
Toast = Literal["success", "warning", "error"]
# How a "New conversation" click ended: done, not the clicker's, or a topic of another chat.
Renewed = Literal["renewed", "not_yours", "elsewhere"]
TITLE_CHARS = 60
# What of a turn's answer a pull request's body carries; the rest stays in the chat.
PULL_REQUEST_ANSWER_CHARS = 6000
# Recalls of messages whose turn is not submitted yet (or never will be), remembered so the
# turn is not started after all; bounded, as anyone's recalls of any message arrive here.
MAX_EARLY_RECALLS = 1000


@dataclass(frozen=True)
class Turn:
    execution_id: str
    session_id: str
    progress_message_id: str


def origin_of(event: MessageEvent) -> str:
    """The topic's key: its root message (a topic's first message is its own root)."""
    return f"feishu:{event.chat_id}:{event.root_id or event.message_id}"


def topic_workspace(topic: str) -> str:
    """A group topic's own workspace key: the same across its New conversations, so its files
    stay with the topic; nobody's personal workspace."""
    return "topic-" + hashlib.sha256(topic.encode("utf-8")).hexdigest()[:32]


def project_of(session: Session) -> tuple[str, str]:
    """What a progress card shows of a project conversation: its project and branch (empty
    for any other conversation)."""
    if session.project is None:
        return "", ""
    return session.project, branch_of(session.id)


def branch_view(
    work: BranchWork,
    diff_attached: bool,
    diff_unchanged: bool = False,
    pull_request_run: str = "",
    pull_request_url: str = "",
) -> BranchView:
    return BranchView(
        branch=work.branch,
        base=work.base,
        files=tuple(ChangedFileView(f.path, f.added, f.removed, f.too_large) for f in work.files),
        files_total=work.files_total,
        diff_attached=diff_attached,
        diff_truncated=work.diff_truncated and diff_attached,
        diff_unchanged=diff_unchanged,
        pull_request_run=pull_request_run,
        pull_request_url=pull_request_url,
    )


def is_team(session: Session) -> bool:
    """Whether ``session`` is a bound group's conversation: the project's, which any member of
    the group may continue."""
    return session.project is not None and session.workspace is not None


def request_card_key(execution_id: str, request_id: str) -> str:
    """The idempotency key of a permission request's own card: Feishu takes at most 50
    characters, more than the two ids together."""
    digest = hashlib.sha256(f"{execution_id}:{request_id}".encode()).hexdigest()
    return "approval-" + digest[:32]


def request_file_key(execution_id: str, request_id: str) -> str:
    """The idempotency key of the file holding a request's whole command."""
    digest = hashlib.sha256(f"{execution_id}:{request_id}".encode()).hexdigest()
    return "request-file-" + digest[:32]


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\[\]()]")


@dataclass(frozen=True)
class Started:
    """A turn no Feishu message of a person asked for (a schedule's run, a trigger's request):
    ``record`` writes what started it in the commit that queues it, and ``queued`` learns the
    turn's id, or the refusal that queued nothing."""

    record: Recorder
    queued: asyncio.Future[str]
    # What its progress and result cards are titled: the schedule's name and the run's time.
    title: str = ""


@dataclass(frozen=True)
class Prepared:
    """A message read for its turn: where it runs, as whom, and the whole prompt."""

    event: MessageEvent
    sender: Principal
    topic: str
    origin: str
    principal_id: str
    workspace: str | None
    project: Project | None
    prompt: str
    title: str
    note: str
    until_ms: int


def by_sender(held: list[Prepared]) -> list[list[Prepared]]:
    """Messages that waited for a turn, oldest first, as the turns they make: one per person,
    each person's in the order sent, the turns in the order of each person's first message.
    Every turn runs as its real sender, so one person's words never run as another's (nor
    reach a topic its sender may not continue by riding on someone else's message)."""
    turns: dict[str, list[Prepared]] = {}
    for prepared in held:
        turns.setdefault(prepared.sender.id, []).append(prepared)
    return list(turns.values())


def joined(held: list[Prepared]) -> Prepared:
    """One person's messages that waited for a turn, as one turn: oldest first, with the first
    one's card and place."""
    first = held[0]
    if len(held) == 1:
        return first
    heading = f"({len(held)} messages were sent while the previous turn ran, oldest first.)"
    notes = " ".join(p.note for p in held if p.note)
    return replace(
        first,
        prompt="\n\n".join([heading, *(p.prompt for p in held)]),
        note=notes,
        until_ms=max(p.until_ms for p in held),
    )


def with_sender(prompt: str, sender: Principal) -> str:
    """``prompt`` headed by who sent it: the Agent always knows whose turn this is, and a name
    cannot break the header line."""
    name = _UNPRINTABLE.sub("", sender.label).strip()[:64] or "someone"
    return f"Message from {name} (amux principal {sender.id}):\n{prompt}"


class Conversations:
    """Starts Agent turns for Feishu messages and reports them back into the topic."""

    def __init__(
        self,
        hub: Hub,
        client: FeishuClient,
        update_card: Callable[[str, dict[str, object]], None],
        outbox: Outbox,
        *,
        provider_of: Callable[[str], str],
        lang: Lang,
        stream_interval: float = 1.0,
        topics: TopicReader | None = None,
        seen: SeenTopics | None = None,
        files: TurnFiles | None = None,
        diffs: BranchDiffs | None = None,
        zone: str = DEFAULT_TIME_ZONE,
        forwards: ForwardReader | None = None,
        documents: LinkedDocs | None = None,
    ) -> None:
        self._hub = hub
        self._documents = documents
        self._forwards = forwards
        self._zone = zone
        self._files = files
        self._diffs = diffs
        self._topics = topics
        self._seen = seen
        self._stream_interval = stream_interval
        self._client = client
        self._update = update_card
        self._outbox = outbox
        self._provider_of = provider_of
        self._lang = lang
        self._resumed: set[asyncio.Task[None]] = set()
        # Message id -> its turn, from its submission until it is followed to its end (the
        # outbox's follows hold the same once the progress card is out, across restarts).
        self._turns: dict[str, str] = {}
        # Message ids recalled before their turn was submitted, and who recalled them.
        self._early: OrderedDict[str, str] = OrderedDict()
        # Turns stopped by a recall of their message: who recalled it, for the card.
        self._recalled: dict[str, str] = {}
        # Conversations (by origin) with a turn of a person's message being read, run or
        # followed here, and the messages sent meanwhile that wait to be their next turn.
        # The conversations whose turns this bot is reading, running or reporting: the messages
        # that asked for them (their turns, once queued, are in ``_turns``).
        self._busy: dict[str, list[str]] = {}
        self._waiting: dict[str, list[tuple[str, asyncio.Future[Prepared | None]]]] = {}

    def _origin(self, topic: str) -> str:
        """The conversation a topic's next message continues (a new one after each renewal)."""
        generation = self._seen.generation(topic) if self._seen is not None else 0
        return f"{topic}#{generation}" if generation else topic

    async def renew(self, topic: str, by: Principal, chat_id: str) -> Renewed:
        """Make ``topic``'s next message start a new conversation, for a click in ``chat_id``
        (the chat Feishu says it came from)."""
        # The topic comes from the button's value, which a member may copy from another chat's
        # card: only a topic of the chat clicked in is renewed there.
        if not chat_id or not topic.startswith(f"feishu:{chat_id}:"):
            logger.warning("refused a New conversation for another chat's topic from %s", by.label)
            return "elsewhere"
        session = self._hub.executions.session_by_origin(self._origin(topic))
        mine = session is None or session.principal_id == by.id or is_team(session)
        if (not mine and not by.is_owner) or self._seen is None:
            return "not_yours"
        self._seen.renew(topic)
        return "renewed"

    async def handle(
        self, event: MessageEvent, sender: Principal, started: Started | None = None
    ) -> Turn | None:
        """Queue the message as a turn and follow it to its result in the topic; ``started``
        when no person's message asked for it (``event`` is then the run's own card)."""
        try:
            return await self._handle(event, sender, started)
        finally:
            if started is not None and not started.queued.done():
                # Refused before the Hub was asked (a topic of someone else's, nothing to run).
                started.queued.set_exception(InvalidArgument("this run could not be queued"))

    async def _handle(
        self, event: MessageEvent, sender: Principal, started: Started | None
    ) -> Turn | None:
        # The conversation the topic continues: after a New conversation, not the running one.
        conversation = self._origin(origin_of(event))
        if started is None and self._turn_runs(conversation):
            # Decided before anything is awaited: a message the turn has not read yet waits.
            await self._hold(event, sender, conversation)
            return None
        ours = started is None
        if ours:
            self._busy.setdefault(conversation, []).append(event.message_id)
        try:
            prepared = await self._prepare(event, sender, started)
            turn = await self._start(prepared, started) if prepared is not None else None
            if ours:
                await self._run_waiting(conversation)
            return turn
        finally:
            if ours:
                self._unbusy(conversation, event.message_id)

    def _turn_runs(self, conversation: str) -> bool:
        """Whether a turn of ``conversation`` is being read, queued or run, or messages already
        wait for one. A turn whose Agent has finished, its cards still being written, no longer
        holds the next message back."""
        if self._waiting.get(conversation):
            return True
        for message_id in self._busy.get(conversation, ()):
            execution_id = self._turns.get(message_id)
            if execution_id is None:
                return True
            with contextlib.suppress(NotFound):
                if not self._hub.executions.describe(execution_id).finished:
                    return True
        return False

    def _unbusy(self, conversation: str, message_id: str) -> None:
        asking = self._busy.get(conversation, [])
        with contextlib.suppress(ValueError):
            asking.remove(message_id)
        if not asking:
            self._busy.pop(conversation, None)

    async def _hold(self, event: MessageEvent, sender: Principal, conversation: str) -> None:
        """A message sent in a topic while its turn runs waits, read as its own message would
        be, to run with the others waiting there as the conversation's next turn."""
        slot: asyncio.Future[Prepared | None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(conversation, [])
        waiting.append((event.message_id, slot))
        try:
            prepared = await self._prepare(event, sender, None)
        except BaseException:
            slot.set_result(None)
            raise
        slot.set_result(prepared)
        if prepared is None:
            return
        if self._seen is not None and event.create_time_ms:
            # The next waiting message's context need not repeat this one: it is in the turn.
            self._seen.mark(prepared.origin, event.create_time_ms)
        count = len(self._waiting.get(conversation, ()))
        said = catalogue_text(self._lang, "turn.waiting", count=max(count, 1))
        try:
            await self._client.reply(event.message_id, text=said)
        except AmuxError as error:
            logger.warning("no waiting note for %s: %s", event.message_id, error.message)

    async def _run_waiting(self, conversation: str) -> None:
        """Run the messages that waited for the conversation's turn, one turn per person, each
        time it ends, until none are left (a Stop ends the turn, not what was asked after it)."""
        while True:
            slots = self._waiting.pop(conversation, [])
            if not slots:
                return
            held: list[Prepared] = []
            for message_id, slot in slots:
                prepared = await slot
                if prepared is None:
                    continue
                if self._early.pop(message_id, None) is not None:
                    logger.info("waiting message %s was recalled", message_id)
                    continue
                held.append(prepared)
            if held:
                # In the order they were sent: who is known sooner is read sooner.
                held.sort(key=lambda p: p.until_ms)
                for theirs in by_sender(held):
                    logger.info("%d messages that waited in a topic run as one turn", len(theirs))
                    asking = theirs[0].event.message_id
                    self._busy.setdefault(conversation, []).append(asking)
                    try:
                        await self._start(joined(theirs), None)
                    finally:
                        self._unbusy(conversation, asking)

    async def _prepare(
        self, event: MessageEvent, sender: Principal, started: Started | None
    ) -> Prepared | None:
        """What a message asks for, read (its files saved, what it forwards, links and the
        topic's unseen messages) for a turn; None when it is refused or asks nothing (said)."""
        topic = origin_of(event)
        origin = self._origin(topic)
        executions = self._hub.executions
        session = executions.session_by_origin(origin)
        left = self._left_project(event.chat_id, session)
        if left:
            if self._seen is None:
                await self._client.reply(event.message_id, card=warning_card(left, self._lang))
                return None
            # The chat was unbound from the conversation's project: the project's checkout and
            # memory are no longer this chat's, so the topic goes on in a new conversation.
            self._seen.renew(topic)
            origin = self._origin(topic)
            session = executions.session_by_origin(origin)
        # A group topic is a shared conversation with a workspace of its own; a private chat
        # works in its Principal's personal workspace.
        workspace = None if event.is_private else topic_workspace(topic)
        # A chat bound to a project works in checkouts of its repository. A bound group's
        # conversations are the project's service Principal's, so the group shares the
        # project's memory and nobody's own; a bound private chat keeps its person's memory.
        project = self._hub.projects.binding_of(event.chat_id) if session is None else None
        if self._not_theirs(session, sender):
            await self._client.reply(event.message_id, card=own_topic_card(self._lang))
            return None
        # The Session keeps its starter (who may stop or renew it); each turn runs as its sender.
        if session is not None:
            principal_id = session.principal_id
        elif project is not None and not event.is_private:
            principal_id = project.principal_id
        else:
            principal_id = sender.id
        prompt = event.text.strip()
        # Where this turn works: a message's files and long linked documents are saved there.
        target = session or Workplace(
            principal_id,
            workspace,
            project=project.name if project is not None else None,
            origin=origin,
        )
        if event.attachments:
            prompt = await self._bring_in(event, target, prompt)
        forwarded, request = await self._forwarded(event, prompt)
        if not request:
            return None
        context = TopicContext()
        if self._topics is not None and self._seen is not None:
            context = await self._topics.context(
                event, self._seen.seen_until(origin), self._seen.recalled
            )
        if self._early.pop(event.message_id, None) is not None:
            logger.info("message %s was recalled before its turn started", event.message_id)
            return None
        linked = Linked()
        if self._documents is not None:
            # As the sender, whoever's conversation this is: what they link is what they can open.
            linked = await self._documents.read(
                event.text, sender.id, self._document_keeper(event.message_id, target)
            )
        documents = [document.line() for document in linked.documents]
        note = left
        if context.unavailable is not None:
            unread = catalogue_text(self._lang, "context.unavailable", reason=context.unavailable)
            note = f"{note} {unread}".strip()
        for unread in linked.unread:
            note = f"{note} {unread}".strip()
        title = prompt or catalogue_text(self._lang, "forward.title")
        if started is not None and started.title:
            title = started.title
        return Prepared(
            event=event,
            sender=sender,
            topic=topic,
            origin=origin,
            principal_id=principal_id,
            workspace=workspace,
            project=project,
            prompt=with_context(
                with_sender(request, sender), context, forwarded, self._zone, documents
            ),
            title=title,
            note=note,
            until_ms=event.create_time_ms,
        )

    def conversation_for(
        self, event: MessageEvent, sender: Principal
    ) -> Session | Literal["none", "not_yours"]:
        """The conversation ``event``'s topic continues, when ``sender`` may continue it."""
        session = self._hub.executions.session_by_origin(self._origin(origin_of(event)))
        if session is None:
            return "none"
        if self._not_theirs(session, sender):
            return "not_yours"
        return session

    async def run_command(
        self, event: MessageEvent, sender: Principal, session: Session, prompt: str, title: str
    ) -> Turn | None:
        """Run a turn of ``session`` reading nothing of the topic: the Agent's own command
        (``/compact``, the whole prompt, so no person's words can pass for one) or a side
        question in a fork (``/btw``); its card in reply to ``event``."""
        executions = self._hub.executions
        try:
            submitted, session = await executions.submit(
                principal_id=session.principal_id,
                submitted_by=sender.id,
                provider=session.provider,
                prompt=prompt,
                session_id=session.id,
            )
        except AmuxError as error:
            await self._client.reply(event.message_id, card=refusal_card(error, self._lang))
            return None
        self._turns[event.message_id] = submitted.id
        try:
            return await self._report_turn(
                event, submitted, session, ("", origin_of(event)), title, "", 0
            )
        finally:
            self._turns.pop(event.message_id, None)

    def _not_theirs(self, session: Session | None, sender: Principal) -> bool:
        """Whether ``sender`` may not continue ``session``: under isolation a topic runs with
        its starter's memory only, and a topic whose conversation works in its starter's
        personal workspace stays the starter's."""
        if session is None or session.principal_id == sender.id or is_team(session):
            return False
        return self._hub.config.isolation or session.workspace is None

    async def _start(self, prepared: Prepared, started: Started | None) -> Turn | None:
        """Queue a prepared turn and follow it to its end."""
        event, sender, origin = prepared.event, prepared.sender, prepared.origin
        executions = self._hub.executions
        project = prepared.project
        principal_id = prepared.principal_id
        # A turn that waited was read before the topic's conversation may have been made.
        session = executions.session_by_origin(origin)
        if session is not None:
            if self._not_theirs(session, sender):
                await self._client.reply(event.message_id, card=own_topic_card(self._lang))
                return None
            principal_id, project = session.principal_id, None
        try:
            submitted, session = await executions.submit(
                principal_id=principal_id,
                submitted_by=sender.id,
                provider=self._provider_for(event.chat_id, session, project),
                prompt=prepared.prompt,
                origin=origin,
                workspace=prepared.workspace,
                project=project.name if project is not None else None,
                record=None if started is None else started.record,
            )
        except AmuxError as error:
            if started is not None:
                started.queued.set_exception(error)
                if isinstance(error, Conflict):
                    # Another loop queued this very run: its card says so, not this one.
                    return None
            if isinstance(error, QuotaExceeded) and error.limit == DAILY_TOKENS:
                await self._refuse_for_budget(event, error)
                return None
            card = refusal_card(error, self._lang)
            await self._client.reply(event.message_id, card=card)
            return None
        if started is not None:
            started.queued.set_result(submitted.id)
        self._turns[event.message_id] = submitted.id
        try:
            return await self._report_turn(
                event,
                submitted,
                session,
                (origin, prepared.topic),
                prepared.title,
                prepared.note,
                prepared.until_ms,
            )
        finally:
            self._turns.pop(event.message_id, None)

    async def _report_turn(
        self,
        event: MessageEvent,
        submitted: Execution,
        session: Session,
        where: tuple[str, str],
        prompt: str,
        note: str,
        until_ms: int = 0,
    ) -> Turn:
        """Show a submitted turn's progress card and follow the turn to its end; ``where`` is
        the turn's origin (empty: a turn that reads none of the topic) and its topic, ``until_ms``
        the time of the last message it read."""
        origin, topic = where
        recalled = self._early.pop(event.message_id, None)
        if recalled is not None:
            # Recalled while its turn was being submitted: it never runs.
            self._recalled[submitted.id] = recalled
            await self._hub.executions.cancel(submitted.id)
        if self._seen is not None and origin:
            self._seen.mark(origin, until_ms or int(time.time() * 1000))
        title = prompt.splitlines()[0][:TITLE_CHARS]
        project_name, branch = project_of(session)
        view = ProgressView(
            title=title,
            status="queued",
            run_id=submitted.id,
            project=project_name,
            branch=branch,
        )
        card_id = ""
        try:
            opened = await open_streaming(self._client, event.message_id, view, self._lang)
            if opened is not None:
                progress_message_id, card_id = opened.message_id, opened.card_id
            else:
                sent = await self._client.reply(
                    event.message_id, card=progress_card(view, self._lang)
                )
                progress_message_id = sent.message_id
        except AmuxError as error:
            # The turn is queued already: it runs, and its answer is owed as a topic reply.
            logger.warning("no progress card for turn %s: %s", submitted.id, error.message)
            progress_message_id, card_id = "", ""
        followed = Followed(
            submitted.id,
            progress_message_id,
            event.message_id,
            title,
            time.time(),
            card_id,
            note,
            topic,
        )
        self._outbox.follow(followed)
        try:
            await self._follow(followed)
        finally:
            self._recalled.pop(submitted.id, None)
        return Turn(submitted.id, session.id, progress_message_id)

    async def recall(self, recall: Recall) -> None:
        """A message was recalled in Feishu: its turn, if it has one, is cancelled before it
        starts or stopped while it runs, and no later turn's context shows the message.

        What is stopped is found from the recalled message's id alone (the turn the bot
        submitted for it), and the Stop is recorded as its sender's when the sender recalled it.
        """
        if self._seen is not None:
            self._seen.recall(recall.message_id)
        execution_id = self._turns.get(recall.message_id) or next(
            (f.execution_id for f in self._outbox.followed() if f.reply_to == recall.message_id),
            None,
        )
        if execution_id is None:
            # Not submitted yet (its topic or files still being read), or never a turn.
            self._early[recall.message_id] = self._recaller(recall, "")
            self._early.move_to_end(recall.message_id)
            while len(self._early) > MAX_EARLY_RECALLS:
                self._early.popitem(last=False)
            return
        executions = self._hub.executions
        execution = executions.describe(execution_id)
        if execution.finished:
            return
        self._recalled[execution_id] = self._recaller(recall, execution.submitted_by or "")
        by = execution.submitted_by if recall.by_sender and execution.submitted_by else None
        logger.info("turn %s stopped: its message was recalled", execution_id)
        await executions.cancel(execution_id, by)

    def _recaller(self, recall: Recall, sender_id: str) -> str:
        """Who recalled a message, as its card names them: its sender by name, else the chat's
        administrators (Feishu says no more)."""
        if recall.by_sender:
            found = self._hub.people.principal(sender_id) if sender_id else None
            if found is not None:
                return found.label
            return catalogue_text(self._lang, "recall.by_sender")
        return catalogue_text(self._lang, "recall.by_admin")

    def _left_project(self, chat_id: str, session: Session | None) -> str:
        """The note for a topic whose conversation works in a project the chat is no longer
        bound to (unbound, or bound to another since); empty for any other topic."""
        if session is None or session.project is None:
            return ""
        bound = self._hub.projects.binding_of(chat_id)
        if bound is not None and bound.name == session.project:
            return ""
        logger.info(
            "a topic of project %s goes on outside it: its chat was unbound", session.project
        )
        return catalogue_text(self._lang, "conversation.left_project", project=session.project)

    def _provider_for(self, chat_id: str, session: Session | None, project: Project | None) -> str:
        """A conversation keeps its Agent; a new one runs the chat's choice, else its project's
        Agent, else the bot's default."""
        if session is not None:
            return session.provider
        if project is not None and self._hub.chats.provider(chat_id) is None:
            return project.provider
        return self._provider_of(chat_id)

    async def _forwarded(
        self, event: MessageEvent, prompt: str
    ) -> tuple[tuple[Forwarded, ...], str]:
        """What ``event`` forwards (a forwarded chat read from Feishu), and the request to put
        after it: ``prompt``, or a line saying the sender only forwarded; empty when there is
        nothing to ask. A forward that cannot be read is told."""
        forwarded = event.forwarded
        left_out = 0
        if event.is_forward and self._forwards is not None:
            read = await self._forwards.read(event)
            if read.unavailable is not None:
                unread = catalogue_text(self._lang, "forward.unavailable", reason=read.unavailable)
                await self._client.reply(event.message_id, text=unread)
            forwarded += read.messages
            left_out = read.left_out
        if not forwarded:
            return (), prompt
        request = prompt or "(No words of their own: they forwarded what is quoted above.)"
        if left_out:
            request += (
                f"\n({left_out} more forwarded messages were left out: too many or too long.)"
            )
        return forwarded, request

    def _document_keeper(self, message_id: str, target: Session | Workplace) -> Keep | None:
        """Saves a linked document too long for the prompt where the turn works; None when
        the bot cannot reach the workspace (its beginning alone is then read)."""
        files = self._files
        if files is None:
            return None

        async def keep(name: str, markdown: str) -> str | None:
            saved = await files.save_document(message_id, target, name, markdown)
            return None if saved is None else saved.path

        return keep

    async def _bring_in(self, event: MessageEvent, target: Session | Workplace, prompt: str) -> str:
        """Save the message's files where ``target``'s turns work (a new project
        conversation's wait for its checkout, see ``LaunchSite.workspace``); the prompt naming
        them. Refusals are told."""
        if self._files is None:
            saved: list[Saved] = []
            refused = [
                Refused(a.name or a.kind, "files are read only when Agents run on the Hub's host")
                for a in event.attachments
            ]
        else:
            saved, refused = await self._files.bring_in(event, target)
        if refused:
            items = "; ".join(f"{r.name}: {r.reason}" for r in refused)
            await self._client.reply(
                event.message_id, text=catalogue_text(self._lang, "files.refused", items=items)
            )
        return with_files(prompt, saved)

    def resume(self) -> int:
        """Re-attach to every turn an earlier process was following; returns how many."""
        followed = self._outbox.followed()
        for turn in followed:
            task = asyncio.get_running_loop().create_task(
                self._follow(turn), name=f"feishu-follow-{turn.execution_id}"
            )
            self._resumed.add(task)
            task.add_done_callback(self._resumed.discard)
        if followed:
            logger.info("following %d turns again after a restart", len(followed))
        return len(followed)

    async def stop(self) -> None:
        """Stop following resumed turns; they stay recorded for the next process."""
        for task in list(self._resumed):
            task.cancel()
        await asyncio.gather(*self._resumed, return_exceptions=True)

    async def _follow(self, followed: Followed) -> None:
        streaming = (
            StreamingCard(
                self._client, followed.card_id, followed.started_at, self._stream_interval
            )
            if followed.card_id
            else None
        )
        try:
            await self._follow_events(followed, streaming)
        finally:
            if streaming is not None:
                await streaming.close()

    async def _follow_events(self, followed: Followed, streaming: StreamingCard | None) -> None:
        executions = self._hub.executions
        lines: list[str] = []
        warnings: list[str] = []
        memory: list[MemoryUse] = []
        # The Agent's plan as it last reported it (each report is the whole checklist).
        plan: tuple[tuple[str, str], ...] = ()
        # The Agent's tool calls so far, oldest first.
        steps: list[tuple[str, str]] = []
        if followed.note:
            warnings.append(followed.note)
            lines.append("⚠ " + followed.note)
        # The turn's permission requests by id, folded from their events (each carries the whole
        # request as it stands), and the cards that show them beside a streaming card.
        requests: dict[str, Approval] = {}
        request_cards: dict[str, str] = {}
        # Requests too long for a card whose whole command was posted as a file (``files``), and
        # every one such a post was tried for.
        files: set[str] = set()
        tried: set[str] = set()
        after = 0
        while True:
            try:
                answer = await executions.watch(followed.execution_id, after, WATCH_SECONDS)
            except AmuxError as error:
                # Gone from the Hub's state (a fresh state directory): nothing left to report.
                logger.warning("stopped following %s: %s", followed.execution_id, error.message)
                self._outbox.owe(followed, [])
                return
            after = max(after, answer.last_seq)
            changed: dict[str, Approval] = {}
            for event in answer.events:
                use = event.memory_use()
                approval = event.approval()
                checklist = event.plan_steps()
                step = event.tool_step()
                if checklist is not None:
                    plan = checklist
                elif step is not None:
                    steps.append(step)
                elif use is not None:
                    memory.append(use)
                    lines.append(f"memory: {use.op} {use.path}".rstrip())
                elif approval is not None:
                    requests[approval.request_id] = changed[approval.request_id] = approval
                elif event.kind in (MEMORY, APPROVAL, PLAN, STEP):
                    continue
                elif event.kind == WARNING:
                    # The budget's share is told on the result card, in the chat's language
                    # and naming the budget that binds (see ``_budget_warning``).
                    if event.text == BUDGET_WARNING:
                        lines.append(catalogue_text(self._lang, "budget.warning.running"))
                        continue
                    warnings.append(event.text)
                    lines.append("⚠ " + event.text)
                elif event.kind == EGRESS:
                    # Kept for the result too, once each however often the Agent retried.
                    if event.text not in warnings:
                        warnings.append(event.text)
                    lines.append("⛔ " + event.text)
                else:
                    lines.append(event.text)
            for approval in changed.values():
                # Before any card asks about it: the file a card too small for it points to.
                if approval.pending and approval.request_id not in tried:
                    tried.add(approval.request_id)
                    if await self._post_subject(followed, approval):
                        files.add(approval.request_id)
            if streaming is not None:
                # Before the end is reported: a request settled as the turn ended shows so.
                for approval in changed.values():
                    await self._show_request(followed, approval, request_cards, lines, files)
            state = answer.execution.state
            elapsed = max(0.0, time.time() - followed.started_at)
            finished = answer.execution.finished
            if finished:
                if streaming is not None:
                    await streaming.close()
                # A streaming card ends under a sequence above every update sent to it.
                sequence = streaming.next_sequence() if streaming is not None else 0
                await self._report(
                    followed, answer, warnings, elapsed, memory, sequence, plan, tuple(steps)
                )
                return
            restarting = executions.closing
            if restarting:
                # The next process re-attaches (see ``resume``); say so on the card meanwhile.
                lines.append(catalogue_text(self._lang, "progress.restarting"))
            view = ProgressView(
                followed.title,
                "running" if state == RUNNING else "queued",
                tuple(lines),
                elapsed,
                followed.execution_id,
                tuple(self._approval_view(a, files) for a in requests.values()),
                *project_of(executions.session(answer.execution.session_id)),
                plan=plan,
                steps=tuple(steps),
            )
            if streaming is not None:
                streaming.push(stream_text(lines, plan, self._lang, tuple(steps)))
                if restarting:
                    await streaming.flush()
            elif followed.progress_message_id:
                self._update(followed.progress_message_id, progress_card(view, self._lang))
            if restarting:
                return

    def _approval_view(self, approval: Approval, files: set[str] | None = None) -> ApprovalView:
        """The request as cards show it: what an Agent or a person wrote with its controls
        escaped (``visible``), so no command can redraw or reorder itself on a card; ``files``
        holds the requests whose whole command was posted as a file."""
        asked_of = self._hub.people.principal(approval.runs_as)
        return ApprovalView(
            run_id=approval.execution_id,
            request_id=approval.request_id,
            tool=visible(approval.tool),
            action=approval.action,
            subject=visible(approval.subject),
            detail=visible(approval.detail),
            expires_at=approval.expires_at,
            decision=approval.decision,
            via=approval.via,
            decided_by=visible(approval.decided_by_name) if approval.decided_by_name else None,
            decided_at=approval.decided_at,
            reason=visible(approval.reason) if approval.reason else approval.reason,
            asked_of=visible(asked_of.label) if asked_of is not None else "",
            zone=self._zone,
            subject_file=files is not None and approval.request_id in files,
        )

    async def _post_subject(self, followed: Followed, approval: Approval) -> bool:
        """Post a request's whole command and detail in its topic as a file when no card can
        show them whole; whether the file is there for a person to read (False also when none was
        needed)."""
        view = self._approval_view(approval)
        if shows_whole(view):
            return False
        key = request_file_key(approval.execution_id, approval.request_id)
        try:
            uploaded = await self._client.upload(
                subject_file_name(view), request_file_text(view, self._lang).encode(), image=False
            )
            await self._client.reply_upload(
                followed.reply_to, uploaded, image=False, idempotency_key=key
            )
        except AmuxError as error:
            # Its card then offers Deny alone: nobody allows what they could not read.
            logger.warning(
                "no file for a long permission request of %s: %s",
                approval.execution_id,
                error.message,
            )
            return False
        return True

    async def _show_request(
        self,
        followed: Followed,
        approval: Approval,
        request_cards: dict[str, str],
        lines: list[str],
        files: set[str],
    ) -> None:
        """Beside a streaming card: a request's own card in the topic, posted while it waits and
        updated once settled, and a line in the streamed progress."""
        view = self._approval_view(approval, files)
        request = request_line(view)
        if approval.pending:
            lines.append(catalogue_text(self._lang, "progress.approval.asked", request=request))
        else:
            said = outcome(view, self._lang)
            lines.append(
                catalogue_text(
                    self._lang, "progress.approval.settled", request=request, outcome=said
                )
            )
            if approval.via == BY_RULE:
                return  # Nobody was asked: no card to show it on.
        card = approval_card(view, self._lang, followed.title)
        message_id = request_cards.get(approval.request_id)
        if message_id is not None:
            self._update(message_id, card)
            return
        # Keyed by the request: a re-attached bot gets the card it posted before (Feishu keeps
        # the key an hour), and a request settled meanwhile is shown settled on it.
        key = request_card_key(approval.execution_id, approval.request_id)
        try:
            sent = await self._client.reply(followed.reply_to, card=card, idempotency_key=key)
        except AmuxError as error:
            # The request stays answerable from `amux agent run`, and its turn's end says how
            # it was settled.
            logger.warning(
                "no card for a permission request of %s: %s", approval.execution_id, error.message
            )
            return
        request_cards[approval.request_id] = sent.message_id
        if not approval.pending:
            self._update(sent.message_id, card)

    def _turn_approvals(self, execution: Execution) -> TurnApprovals:
        """The turn's requests as its end lists them, and the rules the conversation keeps for
        whom it ran as (the Hub's record, so a request before a restart counts too)."""
        approvals = self._hub.approvals
        requests = approvals.of_execution(execution.id)
        session = self._hub.executions.session(execution.session_id)
        # Whom the turn ran as: a group topic's sender, a personal conversation's Principal.
        runs_as = (
            requests[0].runs_as
            if requests
            else (session.principal_id if session.workspace is None else execution.submitted_by)
        )
        rules = approvals.rules(session.id, runs_as) if runs_as else []
        return TurnApprovals(
            tuple(self._approval_view(a) for a in requests),
            tuple(visible(rule.describe()) for rule in rules),
        )

    async def _report(
        self,
        followed: Followed,
        answer: WatchResult,
        warnings: list[str],
        elapsed: float,
        memory: list[MemoryUse] | None = None,
        sequence: int = 0,
        plan: tuple[tuple[str, str], ...] = (),
        steps: tuple[tuple[str, str], ...] = (),
    ) -> None:
        execution = answer.execution
        state = execution.state
        title = followed.title
        text = execution.result.text if execution.result is not None else None
        owed: list[Owed] = []
        approvals = self._turn_approvals(execution)
        work = execution.result.branch if execution.result is not None else None
        diff_file, diff_unchanged = await self._save_diff(execution.id, work)
        if state == SUCCEEDED and text is not None:
            usage = execution.result.usage if execution.result is not None else {}
            # A follow recorded before topics were kept shows no conversation controls.
            finish = (
                FinishView(usage, elapsed, followed.topic, self._budget_warning(execution))
                if followed.topic
                else None
            )
            parts = result_cards(
                text,
                self._lang,
                title=title,
                memory=self._turn_memory(execution, memory or []),
                approvals=approvals,
                branch=(
                    branch_view(
                        work,
                        diff_file is not None,
                        diff_unchanged,
                        *self._pull_request_of(execution, work),
                    )
                    if work is not None
                    else None
                ),
                finish=finish,
                plan=plan,
                steps=steps,
            )
            owed.append(Owed("card", parts[0], sequence))
            owed.extend(Owed("reply", extra) for extra in parts[1:])
        elif state == CANCELLED:
            # One card, saying who stopped it: a Stop is no failure to report.
            stopper = execution.cancelled_by
            found = self._hub.people.principal(stopper) if stopper else None
            view = ProgressView(
                title,
                "cancelled",
                (),
                elapsed,
                approvals=approvals.requests,
                stopped_by=found.label if found is not None else "",
                recalled_by=self._recalled.pop(execution.id, ""),
                plan=plan,
            )
            owed.append(Owed("card", progress_card(view, self._lang), sequence))
        else:
            view = ProgressView(
                title, "failed", (), elapsed, approvals=approvals.requests, plan=plan
            )
            owed.append(Owed("card", progress_card(view, self._lang), sequence))
            reason = execution.error or "the Agent ended without an answer"
            result = execution.result
            if result is not None and result.budget_reached:
                reached = self._budget_reached(execution)
                asked = await self._ask_owner(self._runs_as(execution), reached)
                owed.append(Owed("reply", budget_reached_card(reached, asked, self._lang)))
            else:
                owed.append(Owed("reply", error_card(state, reason, self._lang)))
        if state == SUCCEEDED and self._files is not None:
            session = self._hub.executions.session(execution.session_id)
            # A little slack: file times and the bot's clock may disagree by a tick.
            chosen, skipped = await self._files.left_to_send(
                self._files.workspace(session), followed.started_at - 2.0
            )
            owed.extend(Owed.file(str(path)) for path in chosen)
            warnings = warnings + [f"not posted: {r.name} ({r.reason})" for r in skipped]
        if diff_file is not None:
            owed.append(Owed.file(str(diff_file)))
        owed.extend(Owed("reply", warning_card(warning, self._lang)) for warning in warnings)
        self._outbox.owe(followed, owed)

    def _pull_request_of(self, execution: Execution, work: BranchWork) -> tuple[str, str]:
        """The turn a pull request button carries (when the project has a forge) and the
        conversation's pull request already opened, if any."""
        forges = self._hub.forges
        if forges.of(work.project) is None:
            return "", ""
        opened = forges.pull_request(execution.session_id)
        return execution.id, opened.url if opened is not None else ""

    async def pull_request(
        self, run_id: str, principal: Principal, message_id: str, chat_id: str
    ) -> tuple[str, bool]:
        """Open the conversation's pull request from its branch with ``run_id``'s answer, or
        update the one it opened; its URL and whether it was opened now. Who may is the Hub's
        record of the conversation, never the card's.

        Raises:
            AmuxError: no such turn, someone taking no part in it, or the forge's refusal.
        """
        execution = self._hub.executions.describe(run_id)
        work = execution.result.branch if execution.result is not None else None
        if work is None:
            raise NotFound("this turn left no branch")
        answer = execution.result.text if execution.result is not None else None
        lines = (answer or "").strip().splitlines()
        title = lines[0].lstrip("# ") if lines else work.branch
        link = f"https://applink.feishu.cn/client/chat/open?openChatId={chat_id}"
        body = (
            f"{(answer or '').strip()[:PULL_REQUEST_ANSWER_CHARS]}\n\n---\n"
            f"From an amux conversation in Feishu: [the chat]({link}), message {message_id}; "
            f"branch `{work.branch}`."
        )
        opened, created = await self._hub.forges.open_or_update(
            execution.session_id, principal, branch=work.branch, title=title, body=body
        )
        try:
            await self._client.reply(
                message_id, card=pull_request_card(opened.url, created, self._lang)
            )
        except AmuxError as error:
            # The pull request is there either way; the toast says so.
            logger.warning("the pull request card was not posted: %s", error.message)
        return opened.url, created

    async def _save_diff(
        self, execution_id: str, work: BranchWork | None
    ) -> tuple[Path | None, bool]:
        """The turn's diff saved to be posted after its answer (None when it has none), and
        whether it is left out for being the same as the last one posted for its branch."""
        if work is None or not work.diff or self._diffs is None:
            return None, False
        try:
            saved = await self._diffs.save(execution_id, work.project, work.branch, work.diff)
        except OSError as error:
            logger.warning("the diff of %s was not saved: %s", execution_id, error.strerror)
            return None, False
        return saved, saved is None

    def _turn_memory(self, execution: Execution, uses: list[MemoryUse]) -> TurnMemory | None:
        """What the result card shows of the turn's memory; None when it ran without memory."""
        session = self._hub.executions.session(execution.session_id)
        if session.memory != "bound":
            return None
        notes = tuple(
            MemoryNote(use.op, use.path, use.revision, use.previous_revision) for use in uses
        )
        return TurnMemory(session.principal_id, notes)

    async def approve(
        self, execution_id: str, request_id: str, decision: str, by: Principal
    ) -> tuple[str, Toast]:
        """Answer a permission request as ``by``; returns the toast to show and its kind
        (success: the answer was taken). Nothing changes unless ``by`` is the turn's person or
        the owner and the request is still pending.

        Raises:
            InvalidArgument: an unknown decision.
        """
        approvals = self._hub.approvals
        lang = self._lang
        try:
            await approvals.decide(execution_id, request_id, decision, by)
        except Forbidden:
            logger.warning("refused an answer to a permission request from %s", by.label)
            return catalogue_text(lang, "approval.toast.not_yours"), "error"
        except NotFound:
            return catalogue_text(lang, "approval.toast.gone"), "error"
        except Conflict:
            settled = self._approval_view(approvals.get(execution_id, request_id))
            said = outcome(settled, lang, markup=False)
            return catalogue_text(lang, "approval.toast.answered", outcome=said), "warning"
        logger.info(
            "a permission request of %s answered %s by %s", execution_id, decision, by.label
        )
        return catalogue_text(lang, f"approval.toast.{decision}"), "success"

    async def cancel(self, execution_id: str, by: Principal) -> bool:
        """Stop a turn for whoever sent it, its topic's starter or the Hub owner (as the Hub
        records them, whatever the card carried); False for anyone else."""
        executions = self._hub.executions
        execution = executions.describe(execution_id)
        session = executions.session(execution.session_id)
        sent = execution.submitted_by == by.id
        if session.principal_id != by.id and not sent and not by.is_owner:
            return False
        await executions.cancel(execution_id, by.id)
        return True

    # -- token budgets ---------------------------------------------------------------------

    def _runs_as(self, execution: Execution) -> str:
        """Whose budget a turn spends: a group topic's sender, a personal conversation's
        Principal."""
        session = self._hub.executions.session(execution.session_id)
        if session.workspace is None:
            return session.principal_id
        return execution.submitted_by or session.principal_id

    def _budget_warning(self, execution: Execution) -> BudgetView | None:
        """The budget most of which is spent once the turn is recorded: the day's when it
        binds, else the turn's; None while both have room."""
        config = self._hub.config
        now = self._hub.usage.standing(
            self._runs_as(execution), config.daily_tokens, config.turn_tokens
        )
        if now.day_allowance and now.day_used >= WARN_SHARE * now.day_allowance:
            return BudgetView("day", now.day_used, now.day_allowance)
        used = _tokens_of(execution.result.usage if execution.result is not None else {})
        if now.turn_allowance and used >= WARN_SHARE * now.turn_allowance:
            return BudgetView("turn", used, now.turn_allowance)
        return None

    def _budget_reached(self, execution: Execution) -> BudgetView:
        """The budget a turn that reached one ran out of, with its figures."""
        config = self._hub.config
        now = self._hub.usage.standing(
            self._runs_as(execution), config.daily_tokens, config.turn_tokens
        )
        if now.day_allowance is not None and now.day_used >= now.day_allowance:
            return BudgetView("day", now.day_used, now.day_allowance)
        result = execution.result
        used = _tokens_of(result.usage if result is not None else {})
        allowance = now.turn_allowance or (result.budget if result is not None else None) or 0
        return BudgetView("turn", used, allowance)

    async def _refuse_for_budget(self, event: MessageEvent, error: QuotaExceeded) -> None:
        """A message whose turn could not start for want of its sender's day: the figures in
        the topic, and the owner asked to extend it."""
        details = error.details
        used, allowance = details.get("used"), details.get("allowance")
        whose = details.get("principal_id")
        view = BudgetView(
            "day",
            used if isinstance(used, int) else 0,
            allowance if isinstance(allowance, int) else 0,
        )
        asked = isinstance(whose, str) and await self._ask_owner(whose, view)
        card = budget_reached_card(view, asked, self._lang, refused=True)
        await self._client.reply(event.message_id, card=card)

    async def _ask_owner(self, whose: str, view: BudgetView) -> bool:
        """Send the owner, in their private chat, a request to extend ``whose`` day, with its
        Extend button, once per shortfall (the request not yet granted is asked no more);
        False when the owner cannot be reached there."""
        people = self._hub.people
        owner = people.owner()
        target = self._private_chat_of(owner.id) if owner is not None else None
        if target is None:
            return False
        tokens = self._hub.config.daily_tokens or EXTEND_WITHOUT_DAILY
        request, new = await self._hub.usage.ask_extension(whose, tokens)
        if not new:
            # A member out of tokens sending message after message does not flood the owner.
            return True
        person = people.principal(whose)
        name = person.label if person is not None else whose
        card = budget_request_card(view, name, request, tokens, self._lang)
        try:
            await self._client.send_card(target[1], card, target[0])
        except AmuxError as error:
            logger.warning("the owner could not be asked to extend a budget: %s", error.message)
            return False
        return True

    def private_chat_of(
        self, principal_id: str
    ) -> tuple[Literal["chat_id", "open_id", "union_id"], str] | None:
        """How to reach a Principal in their private chat with the bot (see below)."""
        return self._private_chat_of(principal_id)

    def _private_chat_of(
        self, principal_id: str
    ) -> tuple[Literal["chat_id", "open_id", "union_id"], str] | None:
        """How to reach a Principal in their private chat with the bot: the chat as last seen,
        else their open_id in this app, else their union_id; None without any."""
        app = self._hub.people.recorded_app()
        open_kind = alias_kind("open_id", app) if app is not None else None
        found: dict[str, str] = {}
        for alias in self._hub.people.aliases(principal_id):
            found.setdefault(alias.kind, alias.value)
        if PRIVATE_CHAT_ALIAS in found:
            return "chat_id", found[PRIVATE_CHAT_ALIAS]
        if open_kind is not None and open_kind in found:
            return "open_id", found[open_kind]
        if UNION_ID_KIND in found:
            return "union_id", found[UNION_ID_KIND]
        return None


# The tokens the Extend button adds when only a per-turn ceiling is set.
EXTEND_WITHOUT_DAILY = 100_000


def _tokens_of(usage: Mapping[str, Any]) -> int:
    """Input and output tokens the gateway counted for a turn, as its budget counts them."""
    counted = usage.get("gateway")
    if not isinstance(counted, Mapping):
        return 0
    return sum(
        value
        for value in (counted.get("input_tokens"), counted.get("output_tokens"))
        if isinstance(value, int) and not isinstance(value, bool)
    )
