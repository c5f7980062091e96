"""The Hub's long-lived services, opened and closed together."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hub.approvals import Approvals
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.errors import InvalidArgument
from hub.executions import Executions
from hub.feishu_docs import FeishuDocsReader
from hub.forges import Forges
from hub.history import MemoryHistory
from hub.identity import Actor, Authenticator, require_owner
from hub.memory import Memory
from hub.people import People
from hub.preferences import ChatPreferences, RestartCards
from hub.projects import Projects
from hub.rootlock import RootLock
from hub.schedules import Schedules
from hub.sealing import Sealer
from hub.state import State
from hub.store import MemoryStore
from hub.sysconfig import SystemConfig
from hub.usage import Usage
from hub.user_tokens import UserTokens

logger = logging.getLogger("amux.hub")

LOCAL_OWNER_NAME = "owner"
# Beside the memory root, never in it: kept bodies are not searched, read or counted as memory.
HISTORY_DIR = "memory-history"


def write_owner_token(home: Path, token: str) -> Path:
    """Put ``token`` in ``<home>/owner.token`` (mode 0600), replacing whatever was there whole:
    a reader sees the old token or the new one, never part of one."""
    path = home / OWNER_TOKEN_FILE
    partial = home / f".{OWNER_TOKEN_FILE}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


@dataclass
class Hub:
    """Everything one Hub process serves from: its state, memory root and running settings."""

    settings: HubSettings
    state: State
    store: MemoryStore
    config: SystemConfig
    root_lock: RootLock
    executions: Executions
    authenticate: Authenticator
    history: MemoryHistory
    approvals: Approvals
    # The one door to memory for the RPC methods and the cards alike.
    memory: Memory
    # The bot's doors to the rest: it runs in this process and calls these, never the state.
    people: People
    chats: ChatPreferences
    restart_cards: RestartCards
    # Model usage per Principal per day; each turn's is recorded as it completes.
    usage: Usage
    # The git repositories chats are bound to, and those bindings.
    projects: Projects
    # Turns that start on a clock or a signed request, as their creator.
    schedules: Schedules
    # Where projects' pull requests are opened, and each conversation's.
    forges: Forges
    # Each person's own Feishu token, sealed; read only to act as that person.
    user_tokens: UserTokens
    restart_requested: asyncio.Event = field(default_factory=asyncio.Event)
    # Hooks other packages register to extend ``system.capabilities`` (e.g. connected workers).
    capability_hooks: list[Callable[[], dict[str, object]]] = field(default_factory=list)
    # Reads Feishu as one person with their own token: set by the bot when a Feishu app runs
    # beside the Hub (the Hub itself never speaks to Feishu); None answers feishu_unavailable.
    feishu_docs: FeishuDocsReader | None = None
    # The allowed requests whose Feishu comment was added: an answer adds one comment, once.
    feishu_comments_made: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, settings: HubSettings, providers: Iterable[str] = ()) -> Hub:
        """Take the memory root lock, open state and store, and bootstrap a local owner.

        ``providers`` are the Agents turns may name; no other is ever queued.

        Raises:
            Unavailable: another Hub already serves this memory root.
        """
        try:
            settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as error:
            # At start, before anything is opened: one line naming the setting, not a traceback.
            problem = "it is not a directory" if isinstance(error, FileExistsError) else None
            raise InvalidArgument(
                f"AMUX_HOME {settings.home} cannot be used: {problem or error.strerror}; "
                "point AMUX_HOME at a directory this user may write"
            ) from None
        root_lock = RootLock(settings.memory_root)
        root_lock.acquire()
        try:
            state = State(settings.state_path)
            store = MemoryStore(settings.memory_root)
            store.open()
            config = SystemConfig(state)
            usage = Usage(state)
            executions = Executions(
                state,
                lease_seconds=settings.lease_seconds,
                queue_seconds=settings.queue_seconds,
                home_worker_seconds=settings.home_worker_seconds,
                providers=providers,
                max_queued_per_principal=config.max_queued_per_principal,
                usage=usage,
                event_bounds=lambda: (config.max_events_per_turn, config.max_event_bytes_per_turn),
                budgets=lambda: (config.daily_tokens, config.turn_tokens),
            )
            history = MemoryHistory(
                state, store, settings.home / HISTORY_DIR, config.history_days, store.limits
            )
            history.open()
            projects = Projects(state, executions.providers)
            sealer = Sealer(settings.home)
            hub = cls(
                settings,
                state,
                store,
                config,
                root_lock,
                executions,
                Authenticator(state),
                history,
                Approvals(executions, lambda: config.approval_timeout),
                Memory(state, config, store, history, executions),
                People(state),
                ChatPreferences(state, lambda: executions.providers),
                RestartCards(state),
                usage,
                projects,
                Schedules(state, lambda: executions.providers, config.schedule_rules),
                Forges(state, projects, sealer),
                UserTokens(state, sealer),
            )
            hub._bootstrap_owner()
        except BaseException:
            root_lock.release()
            raise
        return hub

    def close(self) -> None:
        # The file-system watch is the process's own and outlives this Hub (an in-place restart
        # opens another), so what this Hub's store watched is given back first.
        self.store.close()
        self.state.close()
        self.root_lock.release()

    def _bootstrap_owner(self) -> None:
        if self.state.principals():
            return
        owner = self.state.add_principal(LOCAL_OWNER_NAME, "user", owner=True)
        token, _ = self.state.issue_credential(owner.id, "cli", label="local owner")
        path = write_owner_token(self.settings.home, token)
        logger.info("created the local owner principal; its CLI token is in %s", path)

    def require_owner(self, actor: Actor) -> None:
        """Raises: Forbidden: the caller is not the owner (or acts through an Agent credential)."""
        require_owner(actor, "only the owner can change Hub settings or restart the Hub")
