"""View-models the card builders render: small frozen dataclasses with no behaviour of note."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from cards.times import DEFAULT_TIME_ZONE

Lang = Literal["zh_cn", "en_us"]
LANGS: tuple[Lang, ...] = ("zh_cn", "en_us")

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One Hub setting as the owner sees it: saved value, running value, and an unsaved draft."""

    saved: T
    running: T
    draft: T | None = None

    @property
    def shown(self) -> T:
        """What the switch displays: the draft while editing, otherwise the saved value."""
        return self.saved if self.draft is None else self.draft

    @property
    def restart_pending(self) -> bool:
        return self.saved != self.running


@dataclass(frozen=True)
class Identity:
    """Who the card is for, as the Hub resolved them."""

    display_name: str
    principal_id: str
    kind: Literal["user", "service"] = "user"
    is_owner: bool = False


@dataclass(frozen=True)
class ChatView:
    """A chat as the owner's card names it: a group by its id, a private chat by its person."""

    chat_id: str
    kind: Literal["group", "private", "chat"]
    person: str = ""


@dataclass(frozen=True)
class ProjectView:
    """One project on the owner's card, with the chats bound to it (at most a few shown)."""

    name: str
    kind: Literal["path", "remote"]
    source: str
    branch: str
    provider: str
    permissions: str | None
    chats: tuple[ChatView, ...] = ()
    more_chats: int = 0


@dataclass(frozen=True)
class ProjectsView:
    """The owner's Projects section: the projects, and the unbound chats a bind may name."""

    projects: tuple[ProjectView, ...] = ()
    more_projects: int = 0
    bindable: tuple[ChatView, ...] = ()


@dataclass(frozen=True)
class ScheduleView:
    """One schedule on the `/amux` card: its clock, whether it runs, its next and last run."""

    id: str
    name: str
    when: str
    active: bool
    next_run_at: float | None
    last_result: str
    creator: str = ""


@dataclass(frozen=True)
class SchedulesView:
    """The schedules the viewer may change (the owner: everyone's), and how many more."""

    schedules: tuple[ScheduleView, ...] = ()
    more: int = 0
    zone: str = DEFAULT_TIME_ZONE


@dataclass(frozen=True)
class ManagementView:
    """The `/amux` management card; the owner variant adds the Experiments section."""

    identity: Identity
    memory_scope: str
    memory: Setting[bool]
    isolation: Setting[bool]
    # Whole days an overwritten or forgotten document stays restorable (0: none kept).
    history_days: Setting[int]
    # The viewer's own Feishu account: the scopes it granted, None when not connected; shown
    # only where this Hub can connect accounts.
    feishu_scopes: tuple[str, ...] | None = None
    feishu_connectable: bool = False
    restarted: bool = False
    # The Agent new conversations in this chat run, and the choices offered.
    chat_id: str = ""
    provider: str = ""
    providers: tuple[str, ...] = ()
    # Each person's share: turns waiting for a slot, and messages a minute (0: no limit).
    max_queued: Setting[int] = Setting(0, 0)
    messages_per_minute: Setting[int] = Setting(0, 0)
    # Live settings (saved at once, for what starts after the change): the Agents' permission
    # policy (ask, auto, read-only) and how long a permission request waits, in seconds.
    permissions: str = "ask"
    approval_timeout: int = 600
    # Live too: tokens per Principal per UTC day and per turn (0: no limit).
    daily_tokens: int = 0
    turn_tokens: int = 0
    # Live too: days a project conversation's checkout may go unused; and the projects.
    worktree_days: int = 14
    projects: ProjectsView = ProjectsView()
    schedules: SchedulesView = SchedulesView()
    # What the click before did, or why it changed nothing, shown atop the card.
    notice: str = ""
    # The revision of the saved settings the draft was built from; Save carries it back.
    settings_revision: str = ""

    @property
    def restart_pending(self) -> bool:
        return (
            self.memory.restart_pending
            or self.isolation.restart_pending
            or self.history_days.restart_pending
            or self.max_queued.restart_pending
            or self.messages_per_minute.restart_pending
        )

    @property
    def has_unsaved_draft(self) -> bool:
        return any(s.shown != s.saved for s in (self.memory, self.isolation)) or any(
            s.shown != s.saved
            for s in (self.history_days, self.max_queued, self.messages_per_minute)
        )


@dataclass(frozen=True)
class RestartNotice:
    """What saving changed, shown on the restart notice card."""

    memory: Setting[bool]
    isolation: Setting[bool]
    history_days: Setting[int]
    max_queued: Setting[int] = Setting(0, 0)
    messages_per_minute: Setting[int] = Setting(0, 0)


@dataclass(frozen=True)
class MemoryItem:
    path: str
    revision: str
    size_bytes: int | None = None
    title: str | None = None


@dataclass(frozen=True)
class MemoryList:
    scope: str
    items: tuple[MemoryItem, ...]
    path_prefix: str = ""
    truncated: bool = False
    # The project whose memory this is (a bound group's); empty for the viewer's own.
    project: str = ""


@dataclass(frozen=True)
class SearchHit:
    path: str
    snippet: str
    line: int | None = None


@dataclass(frozen=True)
class MemorySearch:
    scope: str
    query: str
    hits: tuple[SearchHit, ...]
    incomplete: bool = False


@dataclass(frozen=True)
class MemoryChange:
    """One change-log entry as My memory shows it. ``by`` is already a display label (a
    conversation or a person); ``restore_revision`` is the earlier version still kept, if any,
    and ``current_revision`` what the document is at now (``absent`` when gone)."""

    at: float
    action: str
    path: str
    by: str
    restore_revision: str | None = None
    restorable_until: float | None = None
    current_revision: str = "absent"
    # The time zone its times are shown in.
    zone: str = DEFAULT_TIME_ZONE


@dataclass(frozen=True)
class MemoryDocument:
    path: str
    revision: str
    content: str
    next_offset: int | None = None
    changes: tuple[MemoryChange, ...] = ()


@dataclass(frozen=True)
class EraseView:
    """What an erase of ``path`` (None: the whole scope) removes, asked or done."""

    path: str | None
    documents: int
    copies: int
    entries: int
    # In a shared scope, documents someone else changed too: left in place, and named.
    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class ForgetOutcome:
    path: str
    already_absent: bool = False


@dataclass(frozen=True)
class ProgressView:
    """A running Agent execution as shown on its progress card."""

    title: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    lines: tuple[str, ...] = ()
    elapsed_seconds: float | None = None
    run_id: str | None = None
    # The turn's permission requests so far, oldest first: pending ones with their buttons.
    approvals: tuple[ApprovalView, ...] = ()
    # A project conversation's project and branch; empty for any other.
    project: str = ""
    branch: str = ""
    # Who stopped a cancelled turn (a display name); empty when nobody is known to have.
    stopped_by: str = ""
    # Who recalled the message that asked for a cancelled turn; shown instead of ``stopped_by``.
    recalled_by: str = ""
    # The Agent's plan as it last reported it: (step, status) with status pending, in_progress
    # or completed; empty when it reported none.
    plan: tuple[tuple[str, str], ...] = ()
    # The Agent's tool calls so far, oldest first: (action, subject) with action read, edit,
    # run, search or tool.
    steps: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ApprovalView:
    """One permission request of a running turn, as its cards show it.

    ``action`` is command, edit or tool; ``subject`` the whole command or path; ``detail`` a
    bounded diff or input; both with their controls escaped by the caller. Once settled,
    ``decision`` is allow_once, allow_session or deny, and ``via`` says how: person, rule (a rule
    of the conversation), timeout or lapsed (the turn was handed back and asks again);
    ``decided_by`` is a person's display name.
    """

    run_id: str
    request_id: str
    tool: str
    action: str
    subject: str
    detail: str = ""
    expires_at: float = 0.0
    decision: str | None = None
    via: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    # The display name of whose turn it is (who may answer, besides the owner).
    asked_of: str = ""
    # Whether the whole subject, too long for a card, was posted in the topic as a file.
    subject_file: bool = False
    # The time zone its times are shown in.
    zone: str = DEFAULT_TIME_ZONE

    @property
    def pending(self) -> bool:
        return self.decision is None


@dataclass(frozen=True)
class TurnApprovals:
    """What a finished turn's card lists: its requests and how each was settled, and the rules
    this conversation keeps for the turn's person (each already described, e.g. ``Bash: npm
    test …``)."""

    requests: tuple[ApprovalView, ...] = ()
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryNote:
    """One memory call of a turn, as its result card lists it."""

    op: str
    path: str
    revision: str | None = None
    previous_revision: str | None = None


@dataclass(frozen=True)
class ChangedFileView:
    """One file a project turn's branch changed; None counts: a binary file, or one too large
    to be diffed."""

    path: str
    added: int | None
    removed: int | None
    too_large: bool = False


@dataclass(frozen=True)
class BranchView:
    """What a project turn left on its conversation's branch, as its result card shows it."""

    branch: str
    base: str
    files: tuple[ChangedFileView, ...]
    files_total: int
    # Whether the diff follows as a file in the topic, and whether it was cut short; or whether
    # it is not posted again, being the same as the last one posted for the branch.
    diff_attached: bool = False
    diff_truncated: bool = False
    diff_unchanged: bool = False
    # The turn whose answer a pull request carries: set when the project has a forge, which
    # offers the button; and the conversation's pull request once opened.
    pull_request_run: str = ""
    pull_request_url: str = ""


@dataclass(frozen=True)
class TurnMemory:
    """What a turn bound to memory did with it; ``principal_id`` owns the scope (and its Undo)."""

    principal_id: str
    notes: tuple[MemoryNote, ...] = ()


@dataclass(frozen=True)
class FinishView:
    """What a finished turn's first card adds: the turn's usage (as the worker reported it) and
    elapsed time in its title, and the New conversation button for its topic (``origin``)."""

    usage: Mapping[str, Any] = field(default_factory=dict)
    elapsed_seconds: float = 0.0
    origin: str = ""
    # Shown when most of a token budget is spent (the day's or the turn's).
    budget: BudgetView | None = None


@dataclass(frozen=True)
class BudgetView:
    """Where a token budget stands: ``scope`` says whose (the day's of one person, UTC, or one
    turn's); ``used`` of ``allowance`` tokens."""

    scope: Literal["day", "turn"]
    used: int
    allowance: int
