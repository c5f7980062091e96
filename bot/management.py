"""The private `/amux` card: identity and scope for everyone, Experiments for the owner only.

Card clicks arrive as callbacks anyone could forge or replay from an old card: the action table
(``bot.actions``) refuses owner-only actions from anyone else before a handler here runs, and the
handlers check the rest against the operator's Principal, not what the card showed.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from bot.actions import (
    Click,
    DocumentRef,
    Draft,
    ListRequest,
    LiveChange,
    MemoryTarget,
    OpenRequest,
    ProviderChoice,
    Restore,
    ScheduleChange,
    SearchForm,
    UnbindRequest,
)
from bot.feishu_accounts import FeishuAccounts
from bot.project_cards import ProjectCards, Tell
from cards.catalogue import plain_text, text
from cards.elements import Card, escape
from cards.management import (
    management_card,
    restart_deferred_card,
    restart_notice_card,
    restart_scheduled_card,
)
from cards.memory import (
    DOCUMENT_CHARS,
    erase_confirm_card,
    erased_card,
    forget_confirm_card,
    forget_done_card,
    memory_document_card,
    memory_history_card,
    memory_list_card,
    memory_search_card,
    restored_card,
)
from cards.models import (
    EraseView,
    ForgetOutcome,
    Identity,
    Lang,
    ManagementView,
    MemoryChange,
    MemoryDocument,
    MemoryItem,
    MemoryList,
    MemorySearch,
    ProjectsView,
    RestartNotice,
    SchedulesView,
    ScheduleView,
    SearchHit,
    Setting,
)
from cards.notices import (
    memory_disabled_card,
    owner_only_card,
    project_memory_owner_only_card,
)
from cards.projects import binding_card
from cards.times import DEFAULT_TIME_ZONE, date_time
from hub.errors import Forbidden, InvalidArgument, MemoryDisabled, NotFound
from hub.identity import Actor, in_person
from hub.memory import (
    ABSENT,
    ForgetRequest,
    GetRequest,
    HistoryRequest,
    LogEntry,
    Receipt,
    RestoreRequest,
    SearchRequest,
    UndoRequest,
)
from hub.paths import memory_scope
from hub.preferences import RestartCard
from hub.principals import Principal
from hub.projects import Project
from hub.services import Hub

logger = logging.getLogger("amux.bot")
T = TypeVar("T")
# At most this many reach the card; `amux schedule list` shows every one.
SCHEDULES_SHOWN = 10


class Drafts(TypedDict, total=False):
    """The unsaved choices a settings card carries from click to click, as ``view`` takes them."""

    draft_memory: bool
    draft_isolation: bool
    draft_history_days: int
    draft_max_queued: int
    draft_messages_per_minute: int
    draft_revision: str
    restarted: bool


LIST_LIMIT = 50
# Changes shown on a document's card, and on the card of the whole memory's changes.
DOCUMENT_CHANGES = 5
HISTORY_CHANGES = 15


def _erase_view(path: str | None, receipt: Receipt) -> EraseView:
    return EraseView(
        path,
        receipt.documents_removed,
        receipt.history_copies_removed,
        receipt.log_entries_redacted,
        receipt.kept,
    )


def _card_page(content: str, next_offset: int | None, offset: int) -> tuple[str, int | None]:
    """The part of a Hub page one card shows, and the byte offset that continues after it.

    A Hub page can hold more than a card shows; continuing from the Hub's own offset would skip
    the text in between.
    """
    if len(content) <= DOCUMENT_CHARS:
        return content, next_offset
    cut = content.rfind("\n", 0, DOCUMENT_CHARS) + 1
    if cut < DOCUMENT_CHARS // 2:
        cut = DOCUMENT_CHARS  # No line break late enough: cut between characters.
    shown = content[:cut]
    return shown, offset + len(shown.encode("utf-8"))


class Management:
    """Builds the management cards and applies their actions for one Hub."""

    def __init__(
        self,
        hub: Hub,
        lang: Lang,
        default_provider: str,
        tell: Tell | None = None,
        zone: str = DEFAULT_TIME_ZONE,
        accounts: FeishuAccounts | None = None,
    ) -> None:
        self._hub = hub
        self._accounts = accounts
        self._tell = tell
        self.lang = lang
        self.zone = zone
        self.default_provider = default_provider
        self._projects = ProjectCards(hub, lang, tell)

    def provider_of(self, chat_id: str) -> str:
        """The Agent new conversations in this chat run."""
        return self._hub.chats.provider(chat_id) or self.default_provider

    def set_provider(self, chat_id: str, provider: str) -> None:
        """Raises: InvalidArgument: not an Agent amux can launch."""
        chats = self._hub.chats
        chosen = chats.choose_provider(chat_id, provider)
        if chosen == "unknown_provider":
            choices = ", ".join(chats.providers)
            raise InvalidArgument(text(self.lang, "provider.choose", providers=choices))
        if chosen == "no_chat":
            raise InvalidArgument(text(self.lang, "provider.no_chat"))

    def note_private_chat(self, chat_id: str, principal: Principal) -> None:
        """Remember whose private chat this is (learned from a signed message event)."""
        self._hub.people.note_private_chat(chat_id, principal)

    def note_group(self, chat_id: str) -> None:
        """Remember a group chat the bot was spoken to in, for the owner's card to offer."""
        self._hub.chats.note_group(chat_id)

    async def bind_chat(self, chat_id: str, name: str, by: Principal, *, group: bool) -> str:
        """Bind the chat to project ``name`` (the caller checked ``by`` is the owner); what
        the chat is told.

        Raises: NotFound: no such project. Conflict: the chat is bound already.
        """
        project = await self._hub.projects.bind(chat_id, name, by.id)
        logger.info("chat bound to project %s by %s", project.name, by.label)
        memory = text(self.lang, "project.memory.group" if group else "project.memory.private")
        return plain_text(
            self.lang,
            "project.bound",
            project=project.name,
            branch=project.default_branch,
            memory=memory,
        )

    async def unbind_chat(self, chat_id: str, by: Principal) -> str:
        """Raises: NotFound: the chat is bound to no project."""
        project = await self._hub.projects.unbind(chat_id)
        logger.info("chat unbound from project %s by %s", project.name, by.label)
        return plain_text(self.lang, "project.unbound", project=project.name)

    def chat_binding_text(self, chat_id: str, *, on_card: bool = False) -> str:
        """The chat's binding in words: for a card (Markdown) or a plain-text reply."""
        say = text if on_card else plain_text
        project = self._hub.projects.binding_of(chat_id)
        if project is None:
            return say(self.lang, "project.none")
        return say(
            self.lang, "project.current", project=project.name, branch=project.default_branch
        )

    def may_choose_provider(self, principal: Principal, chat_id: str) -> bool:
        """The owner chooses for any chat; others only for their own private chat."""
        if principal.is_owner:
            return True
        holder = self._hub.people.private_chat_holder(chat_id)
        return holder is not None and holder.id == principal.id

    def view(
        self,
        principal: Principal,
        draft_memory: bool | None = None,
        draft_isolation: bool | None = None,
        draft_history_days: int | None = None,
        restarted: bool = False,
        chat_id: str = "",
        draft_max_queued: int | None = None,
        draft_messages_per_minute: int | None = None,
        notice: str = "",
        draft_revision: str | None = None,
    ) -> ManagementView:
        described = self._hub.config.describe()
        memory = described["memory.enabled"]
        isolation = described["memory.isolation"]
        history = described["memory.history_days"]
        queued = described["turns.max_queued_per_principal"]
        messages = described["feishu.messages_per_minute"]
        return ManagementView(
            permissions=str(described["agents.permissions"].saved),
            approval_timeout=int(described["agents.approval_timeout"].saved),
            daily_tokens=int(described["budget.daily_tokens"].saved),
            turn_tokens=int(described["budget.turn_tokens"].saved),
            identity=Identity(principal.label, principal.id, "user", principal.is_owner),
            memory_scope=memory_scope(principal.id, self._hub.config.isolation),
            memory=Setting(bool(memory.saved), bool(memory.running), draft_memory),
            feishu_scopes=self._feishu_scopes(principal),
            feishu_connectable=self._accounts is not None,
            isolation=Setting(isolation.saved == "on", isolation.running == "on", draft_isolation),
            history_days=Setting(int(history.saved), int(history.running), draft_history_days),
            restarted=restarted,
            chat_id=chat_id,
            provider=self.provider_of(chat_id) if chat_id else "",
            providers=self._hub.executions.providers if chat_id else (),
            max_queued=Setting(int(queued.saved), int(queued.running), draft_max_queued),
            messages_per_minute=Setting(
                int(messages.saved), int(messages.running), draft_messages_per_minute
            ),
            worktree_days=int(described["projects.worktree_days"].saved),
            # Only the owner's card shows projects: where each chat's work and memory go.
            projects=self._projects.view() if principal.is_owner else ProjectsView(),
            schedules=self._schedules_view(principal),
            notice=notice,
            # A draft keeps the revision it was built from; a fresh card the current one.
            settings_revision=(
                self._hub.config.revision() if draft_revision is None else draft_revision
            ),
        )

    def card(
        self, principal: Principal, chat_id: str = "", notice: str = "", **draft: Unpack[Drafts]
    ) -> Card:
        view = self.view(principal, chat_id=chat_id, notice=notice, **draft)
        return management_card(view, self.lang)

    @staticmethod
    def _draft(draft: Draft, saved: ManagementView) -> Drafts:
        """The whole draft a click carries, keyed as ``view`` takes drafts; what an older card
        lacks is the saved value."""

        def kept(value: T | None, default: T) -> T:
            return default if value is None else value

        return Drafts(
            draft_memory=kept(draft.memory_enabled, saved.memory.saved),
            draft_isolation=kept(draft.isolation, saved.isolation.saved),
            draft_history_days=kept(draft.history_days, saved.history_days.saved),
            draft_max_queued=kept(draft.max_queued, saved.max_queued.saved),
            draft_messages_per_minute=kept(
                draft.messages_per_minute, saved.messages_per_minute.saved
            ),
            draft_revision=draft.revision,
        )

    def _feishu_scopes(self, principal: Principal) -> tuple[str, ...] | None:
        connection = self._hub.user_tokens.connection(principal.id)
        return None if connection is None else connection.scopes

    def _own_private_chat(self, click: Click) -> bool:
        holder = self._hub.people.private_chat_holder(click.chat_id) if click.chat_id else None
        return holder is not None and holder.id == click.principal.id

    async def connect_feishu(self, click: Click, _: None) -> Card:
        """``feishu.connect``: start connecting the clicker's own account, in their own private
        chat only (whoever opens the code connects their account: never a group's card)."""
        if self._accounts is None or not self._own_private_chat(click):
            logger.warning(
                "refused a Feishu connect from %s outside their chat", click.principal.label
            )
            raise Forbidden(text(self.lang, "command.private_only"))
        chat_id, tell = click.chat_id, self._tell

        async def told(words: str) -> None:
            if tell is not None:
                await tell(chat_id, words)

        started = await self._accounts.begin(click.principal, told)
        return self.card(click.principal, chat_id=chat_id, notice=escape(started))

    async def disconnect_feishu(self, click: Click, _: None) -> Card:
        """``feishu.disconnect``: erase the clicker's own token (whoever's card it was)."""
        if self._accounts is None:
            raise Forbidden(text(self.lang, "command.private_only"))
        done = await self._accounts.disconnect(click.principal)
        return self.card(click.principal, chat_id=click.chat_id, notice=escape(done))

    async def open(self, click: Click, _: None) -> Card:
        """``manage.open``: the management card again."""
        return self.card(click.principal, chat_id=click.chat_id)

    async def choose_provider(self, click: Click, choice: ProviderChoice) -> Card:
        """``provider.set``: the Agent of the chat the card is in."""
        principal, chat_id = click.principal, click.chat_id
        # The card's own chat, not one named in the (forgeable) value: people choose the
        # Agent of the chat they are in. A click carries no chat type, and a group's Agent
        # affects everyone in it, so only a chat known to be the clicker's own is theirs.
        if not self.may_choose_provider(principal, chat_id):
            logger.warning(
                "refused a provider choice from %s for a chat not theirs", principal.name
            )
            return owner_only_card(self.lang)
        self.set_provider(chat_id, choice.provider)
        return self.card(principal, chat_id=chat_id)

    async def redraw(self, click: Click, draft: Draft) -> Card:
        """A switch or choice of the draft: the card with the draft, nothing saved."""
        saved = self.view(click.principal)
        return self.card(click.principal, chat_id=click.chat_id, **self._draft(draft, saved))

    async def save_live(self, click: Click, change: LiveChange) -> Card:
        """Live settings: saved at once, for turns (and requests) started after this; the draft
        the click carries stays a draft."""
        draft = self._draft(change.draft, self.view(click.principal))
        self._hub.config.save(change.key, change.value)
        logger.info("%s changed from Feishu by %s", click.action, click.principal.label)
        return self.card(click.principal, chat_id=click.chat_id, **draft)

    async def bind_project(self, click: Click, draft: Draft) -> Card:
        """``project.bind``: the chat and project the card's form chose, bound; the card again
        with what was done, or why nothing was."""
        drafts = self._draft(draft, self.view(click.principal))
        notice = await self._projects.bind(click.principal, click.form)
        return self.card(click.principal, chat_id=click.chat_id, notice=notice, **drafts)

    async def unbind_project(self, click: Click, request: UnbindRequest) -> Card:
        """``project.unbind``: the chat unbound if still bound to the project the card showed."""
        drafts = self._draft(request.draft, self.view(click.principal))
        notice = await self._projects.unbind(click.principal, request.chat_id, request.project)
        return self.card(click.principal, chat_id=click.chat_id, notice=notice, **drafts)

    def _schedules_view(self, principal: Principal) -> SchedulesView:
        """Those the viewer may change: their own, and for the owner everyone's."""
        mine = self._hub.schedules.listed(created_by=None if principal.is_owner else principal.id)
        people = self._hub.people
        shown = []
        for schedule in mine[:SCHEDULES_SHOWN]:
            creator = people.principal(schedule.created_by)
            shown.append(
                ScheduleView(
                    schedule.id,
                    schedule.name,
                    schedule.spec or schedule.kind,
                    schedule.active,
                    schedule.next_run_at,
                    schedule.last_result,
                    creator.label if creator is not None else "",
                )
            )
        return SchedulesView(tuple(shown), max(0, len(mine) - SCHEDULES_SHOWN), self.zone)

    async def change_schedule(self, click: Click, request: ScheduleChange) -> Card:
        """``schedule.change``: pause, resume, run or remove one schedule, if the clicker made
        it or is the owner (the Hub decides from the stored schedule); the card again with
        what was done, or why nothing was."""
        drafts = self._draft(request.draft, self.view(click.principal))
        schedules, principal = self._hub.schedules, click.principal
        change = {
            "pause": schedules.pause,
            "resume": schedules.resume,
            "run": schedules.request_run,
            "remove": schedules.remove,
        }[request.change]
        key = {
            "pause": "schedule.paused",
            "resume": "schedule.resumed",
            "run": "schedule.run_asked",
            "remove": "schedule.removed",
        }[request.change]
        try:
            changed = await change(request.schedule_id, principal)
        except (Forbidden, NotFound, InvalidArgument) as error:
            logger.info("a schedule change from the card was refused: %s", error.message)
            notice = text(self.lang, "schedule.refused", reason=escape(error.message))
        else:
            upcoming = changed.next_run_at
            notice = text(
                self.lang,
                key,
                name=escape(changed.name),
                id=changed.id,
                time=date_time(upcoming, self.zone) if upcoming is not None else "-",
            )
        return self.card(principal, chat_id=click.chat_id, notice=notice, **drafts)

    async def save_settings(self, click: Click, value: Draft) -> Card:
        """``settings.save``: the draft saved, for the next restart; refused, with the current
        values shown, when the settings changed after the card's draft was built from them."""
        hub, principal = self._hub, click.principal
        if value.revision != hub.config.revision():
            logger.warning("refused a stale settings card's Save from %s", principal.label)
            stale = text(self.lang, "manage.stale")
            return self.card(principal, chat_id=click.chat_id, notice=stale)
        draft = self._draft(value, self.view(principal))
        hub.config.save("memory.enabled", draft["draft_memory"])
        hub.config.save("memory.isolation", "on" if draft["draft_isolation"] else "off")
        hub.config.save("memory.history_days", draft["draft_history_days"])
        hub.config.save("turns.max_queued_per_principal", draft["draft_max_queued"])
        hub.config.save("feishu.messages_per_minute", draft["draft_messages_per_minute"])
        logger.info("settings saved from Feishu by %s", principal.label)
        after = self.view(principal)
        notice = RestartNotice(
            after.memory,
            after.isolation,
            after.history_days,
            after.max_queued,
            after.messages_per_minute,
        )
        return restart_notice_card(notice, self.lang)

    async def restart_now(self, click: Click, _: None) -> Card:
        """``restart.now``: the new process updates this card (``pending_restart_card``)."""
        hub = self._hub
        hub.restart_cards.remember(RestartCard(click.message_id, click.principal.id))
        logger.info("restart requested from Feishu by %s", click.principal.label)
        hub.restart_requested.set()
        return restart_scheduled_card(self.lang)

    async def restart_later(self, click: Click, _: None) -> Card:
        return restart_deferred_card(self.lang)

    # -- My memory: every action but the erase ones needs memory on ----------------------------

    def group_binding_card(self, chat_id: str) -> Card | None:
        """``/amux project`` in a group bound to a project under isolation: the binding, and
        the button that opens the project's memory there; None for any other chat."""
        project = self._memory_project(chat_id)
        if project is None:
            return None
        return binding_card(self.chat_binding_text(chat_id, on_card=True), project.name, self.lang)

    def _memory_project(self, chat_id: str) -> Project | None:
        """The project whose memory a memory card in this chat shows: a bound group's, under
        isolation. A memory card's update is seen by everyone in its chat, so in a group it
        must never show a member's own memory. Without isolation the project's memory is the
        one global memory, which the clicker's own cards show anyway."""
        if not chat_id or not self._hub.config.isolation:
            return None
        if self._hub.people.private_chat_holder(chat_id) is not None:
            return None  # A bound private chat keeps its person's own memory.
        return self._hub.projects.binding_of(chat_id)

    def _card_actor(self, click: Click) -> tuple[Actor, str]:
        """Whom a memory card acts for, and the project's name when it is a project's: in a
        bound group, the project's Principal; elsewhere the clicker."""
        project = self._memory_project(click.chat_id)
        if project is None:
            return in_person(click.principal, "card"), ""
        principal = self._hub.projects.principal_of(project.name)
        return in_person(principal, "card"), project.name

    def _check_own_memory_shown_privately(self, click: Click) -> None:
        """Raises: Forbidden: under isolation, a card of the clicker's own memory clicked in a
        chat other than their private chat with the bot (a card forwarded into a group): its
        update would show that memory to everyone in the chat."""
        chat_id = click.chat_id
        if not chat_id or not self._hub.config.isolation:
            return
        holder = self._hub.people.private_chat_holder(chat_id)
        if holder is not None and holder.id == click.principal.id:
            return
        logger.warning(
            "refused %s's own memory card outside their private chat", click.principal.label
        )
        raise Forbidden(text(self.lang, "memory.private_chat_only"))

    def _changer(self, click: Click) -> Actor | Card:
        """Whom a memory change from a card acts for; the refusal card when the clicker may not
        make it: in a bound group only the owner changes the project's memory from a card (any
        member's turn there may still save to it)."""
        actor, project = self._card_actor(click)
        if not project:
            self._check_own_memory_shown_privately(click)
        elif not click.principal.is_owner:
            logger.warning(
                "refused a change of project %s's memory from %s", project, click.principal.name
            )
            return project_memory_owner_only_card(project, self.lang)
        return actor

    def _reader(self, click: Click) -> tuple[Actor, str, str] | None:
        """Whom the card reads for (the clicker, or a bound group's project), held to the rules
        the Hub applies to their own CLI calls, the scope they see and the project's name (empty
        for the clicker's own); None while memory is off."""
        actor, project = self._card_actor(click)
        try:
            scope = self._hub.memory.checked_scope(actor)
        except MemoryDisabled:
            return None
        if not project:
            self._check_own_memory_shown_privately(click)
        return actor, scope, project

    async def memory_list(self, click: Click, request: ListRequest) -> Card:
        """``memory.list``: the clicker's (or a bound group's project's) documents under the
        prefix."""
        reader = self._reader(click)
        if reader is None:
            return memory_disabled_card(self.lang)
        actor, scope, project = reader
        prefix = request.path_prefix
        listed = await self._hub.memory.list_documents(actor, None, prefix, LIST_LIMIT)
        items = tuple(MemoryItem(d.path, d.revision, d.size_bytes) for d in listed.documents)
        view = MemoryList(scope, items, prefix or "", listed.truncated, project)
        return memory_list_card(view, self.lang)

    async def memory_search(self, click: Click, _: None) -> Card:
        """``memory.search``: the keywords of the card's form."""
        reader = self._reader(click)
        if reader is None:
            return memory_disabled_card(self.lang)
        actor, scope, _project = reader
        query = SearchForm.parse(click.form).query
        if not query:
            raise InvalidArgument(text(self.lang, "memory.search_empty"))
        found = await self._hub.memory.search(actor, None, SearchRequest(query, limit=10))
        hits = tuple(SearchHit(m.path, m.snippet, m.line) for m in found.matches)
        return memory_search_card(MemorySearch(scope, query, hits, found.incomplete), self.lang)

    async def memory_open(self, click: Click, request: OpenRequest) -> Card:
        """``memory.open``: one page of a document, with its recent changes."""
        reader = self._reader(click)
        if reader is None:
            return memory_disabled_card(self.lang)
        actor = reader[0]
        path, offset = request.path, request.offset
        got = await self._hub.memory.get(actor, None, GetRequest(path, offset=offset))
        if not got.exists:
            raise InvalidArgument(text(self.lang, "memory.gone", path=path))
        content, next_offset = _card_page(got.content, got.next_offset, offset or 0)
        changes = await self._changes(actor, got.path, DOCUMENT_CHANGES)
        document = MemoryDocument(got.path, got.revision, content, next_offset, changes)
        return memory_document_card(document, self.lang)

    async def forget_ask(self, click: Click, ref: DocumentRef) -> Card:
        """``memory.forget.ask``: the confirmation, nothing forgotten yet."""
        if self._reader(click) is None:
            return memory_disabled_card(self.lang)
        actor = self._changer(click)
        if not isinstance(actor, Actor):
            return actor  # No confirmation the click after it would refuse.
        return forget_confirm_card(ref.path, ref.revision, self.lang)

    async def forget_confirm(self, click: Click, ref: DocumentRef) -> Card:
        """``memory.forget.confirm``: the document deleted if it is still at the revision shown."""
        if self._reader(click) is None:
            return memory_disabled_card(self.lang)
        actor = self._changer(click)
        if not isinstance(actor, Actor):
            return actor
        request = ForgetRequest(ref.path, ref.revision)
        forgotten = await self._hub.memory.forget(actor, None, request, "card")
        logger.info("memory document forgotten from Feishu by %s", click.principal.label)
        return forget_done_card(ForgetOutcome(forgotten.path, forgotten.already_absent), self.lang)

    async def memory_history(self, click: Click, target: MemoryTarget) -> Card:
        """``memory.history``: recent changes of one document, or of the clicker's memory."""
        reader = self._reader(click)
        if reader is None:
            return memory_disabled_card(self.lang)
        changes = await self._changes(reader[0], target.path, HISTORY_CHANGES)
        return memory_history_card(changes, self.lang)

    async def restore(self, click: Click, request: Restore) -> Card:
        """``memory.restore``: a kept earlier version back, if the document is as shown."""
        if self._reader(click) is None:
            return memory_disabled_card(self.lang)
        actor = self._changer(click)
        if not isinstance(actor, Actor):
            return actor
        wanted = RestoreRequest(request.path, request.revision, request.expected_revision)
        restored = await self._hub.memory.restore(actor, None, wanted, "card")
        logger.info("a memory document restored from Feishu by %s", click.principal.label)
        return restored_card(restored.path, restored.revision, self.lang)

    async def erase_ask(self, click: Click, target: MemoryTarget) -> Card:
        """``memory.erase.ask``: what an erase would remove (works while memory is off)."""
        actor = self._changer(click)
        if not isinstance(actor, Actor):
            return actor
        preview = await self._hub.memory.preview_erase(actor, None, target.path)
        return erase_confirm_card(_erase_view(target.path, preview), self.lang)

    async def erase_confirm(self, click: Click, target: MemoryTarget) -> Card:
        """``memory.erase.confirm``: the document(s) and their history erased (works while
        memory is off)."""
        actor = self._changer(click)
        if not isinstance(actor, Actor):
            return actor
        receipt = await self._hub.memory.erase(actor, None, target.path, "card")
        logger.info("memory erased from Feishu by %s", click.principal.label)
        return erased_card(_erase_view(target.path, receipt), self.lang)

    async def _changes(self, actor: Actor, path: object, limit: int) -> tuple[MemoryChange, ...]:
        """Recent change-log entries as My memory shows them: by which conversation or person,
        and the earlier version to restore while it is kept."""
        memory = self._hub.memory
        page = memory.history(actor, None, HistoryRequest(path or None, limit))
        current: dict[str, str] = {}
        changes: list[MemoryChange] = []
        for entry in page.entries:
            if entry.restorable and entry.path not in current:
                got = await memory.get(actor, None, GetRequest(entry.path, end_line=1))
                current[entry.path] = got.revision
            changes.append(
                MemoryChange(
                    at=entry.at,
                    action=entry.action,
                    path=entry.path,
                    by=self._author_label(entry),
                    restore_revision=entry.previous_revision if entry.restorable else None,
                    restorable_until=entry.restorable_until,
                    current_revision=current.get(entry.path, ABSENT),
                    zone=self.zone,
                )
            )
        return tuple(changes)

    def _author_label(self, entry: LogEntry) -> str:
        if entry.session_id:
            session = entry.session_id[:8]
            return text(self.lang, "memory.change.by_conversation", session=session)
        name = escape(entry.principal or "?")
        return text(self.lang, "memory.change.by_person", name=name, via=entry.via)

    async def extend_budget(
        self, principal: Principal, request: str
    ) -> tuple[str, Literal["success", "info", "warning"]]:
        """Grant an extension request (the owner's Extend); the toast that says what it did:
        nothing for a request already granted, one of an earlier day, or a card from before
        requests."""
        if not request:
            return text(self.lang, "budget.outdated"), "warning"
        granted = await self._hub.usage.grant(in_person(principal, "card"), request)
        found = self._hub.people.principal(granted.principal_id)
        name = found.label if found is not None else granted.principal_id
        tokens = f"{granted.tokens:,}"
        if granted.outcome == "already":
            said = text(self.lang, "budget.already", tokens=tokens, name=name, day=granted.day)
            return said, "info"
        if granted.outcome == "expired":
            return text(self.lang, "budget.expired", day=granted.day), "warning"
        logger.info("a budget extended from Feishu by %s", principal.label)
        return text(self.lang, "budget.extended", tokens=tokens, name=name), "success"

    async def undo(self, principal: Principal, value: dict[str, Any]) -> tuple[str, bool]:
        """Undo one change a turn made, if the change log records it as the clicker's own (or,
        for the owner, a project's): back to the revision before it, if the document is still as
        the turn left it. Returns the message to show and whether it worked.

        The button's ``principal_id`` is never read: a member who edits it to their own id
        would otherwise undo a change of someone else's in the memory they share.
        """
        lang = self.lang
        path = str(value.get("path") or "")
        left = str(value.get("revision") or ABSENT)
        previous = value.get("previous_revision")
        before = previous if isinstance(previous, str) and previous else None
        actor = self._undoer(principal, path, None if left == ABSENT else left, before)
        if actor is None:
            logger.warning("refused an Undo of memory not theirs from %s", principal.label)
            return text(lang, "memory.undo.not_yours"), False
        request = UndoRequest(path, left, before)
        try:
            undone = await self._hub.memory.undo(actor, request, "card")
        except MemoryDisabled:
            return text(lang, "notice.memory_disabled"), False
        if undone.outcome == "changed":
            return text(lang, "memory.undo.changed", path=path), False
        if undone.outcome == "restored" and undone.revision is not None:
            logger.info("a turn's memory change undone from Feishu by %s", principal.label)
            return text(lang, "memory.undo.done", path=path, revision=undone.revision[:8]), True
        logger.info("a turn's new memory document removed from Feishu by %s", principal.label)
        return text(lang, "memory.undo.removed", path=path), True

    def _undoer(
        self, principal: Principal, path: str, revision: str | None, previous: str | None
    ) -> Actor | None:
        """Whom an Undo acts for: the clicker when the log names them the change's author; for
        the owner also a project whose (bound group's) turn made it, as with the group's other
        memory cards; None when neither made it."""
        memory = self._hub.memory
        candidates = [principal]
        if principal.is_owner:
            projects = self._hub.projects
            candidates += [projects.principal_of(p.name) for p in projects.all()]
        for candidate in candidates:
            actor = in_person(candidate, "card")
            if memory.made_by(actor, path, revision, previous):
                return actor
        return None

    def pending_restart_card(self) -> tuple[str, Card] | None:
        """After a restart from Feishu: the card to refresh with the now-running values."""
        pending = self._hub.restart_cards.take()
        if pending is None:
            return None
        principal = self._hub.people.principal(pending.principal_id)
        message_id = pending.message_id
        if principal is None or not message_id:
            return None
        return message_id, management_card(self.view(principal, restarted=True), self.lang)
