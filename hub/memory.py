"""The memory service: every memory operation, and every rule about it, for every door.

The RPC methods (``hub.rpc``) and the Feishu cards (``bot.management``) both come here with the
acting ``Actor``; neither reaches the store or the history on its own. Each operation:

- runs in the scope derived from the actor and the running isolation policy, after the presented
  binding is checked against it (``hub.identity``);
- is refused with ``memory_disabled`` while the running policy has memory off, except erase;
- records a change in the change log with its provenance (the route it came by and, for an
  Agent credential, the Session and execution it was issued for), and a memory call made with a
  turn's credential as an event of that turn (``hub.contract.MemoryUse``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from hub.contract import MEMORY, MemoryOp, MemoryUse
from hub.errors import Forbidden, MemoryDisabled, NotFound
from hub.executions import Executions
from hub.history import Author, LogEntry, LogPage, MemoryHistory, Receipt, Via
from hub.identity import Actor, check_binding, require_owner
from hub.paths import GLOBAL_SCOPE, memory_scope
from hub.state import State
from hub.store import (
    ABSENT,
    Document,
    Forgotten,
    Found,
    Listed,
    Listing,
    Match,
    MemoryStore,
    Written,
)
from hub.sysconfig import SystemConfig

# Callers outside hub/ take what they read of the history and the store from here, never there.
__all__ = [
    "ABSENT",
    "Document",
    "ForgetRequest",
    "Forgotten",
    "Found",
    "GetRequest",
    "HistoryRequest",
    "Listed",
    "Listing",
    "LogEntry",
    "LogPage",
    "Match",
    "Memory",
    "MemoryOp",
    "Receipt",
    "RestoreRequest",
    "SearchRequest",
    "UndoOutcome",
    "UndoRequest",
    "Undone",
    "UpsertRequest",
    "Via",
    "Written",
]

# What a turn's memory call did, as its ``memory`` event says.
# How an undo ended: done (back to the revision before, or the new document removed), or not
# done because the document is no longer as the turn left it.
UndoOutcome = Literal["restored", "removed", "changed"]


# -- requests -------------------------------------------------------------------------------------
# Fields typed ``object`` are checked by the store, which owns their rules and codes.


@dataclass(frozen=True)
class SearchRequest:
    query: object
    path_prefix: object = None
    limit: object = None


@dataclass(frozen=True)
class GetRequest:
    path: object
    start_line: object = None
    end_line: object = None
    offset: object = None


@dataclass(frozen=True)
class UpsertRequest:
    path: object
    content: object
    expected_revision: object


@dataclass(frozen=True)
class ForgetRequest:
    path: object
    expected_revision: object


@dataclass(frozen=True)
class HistoryRequest:
    path: object = None
    limit: int = 20
    before: int | None = None


@dataclass(frozen=True)
class RestoreRequest:
    path: object
    # The kept revision, whole or a unique prefix of at least 12 hex digits.
    revision: object
    expected_revision: object


@dataclass(frozen=True)
class UndoRequest:
    """Undo one change a turn made: ``revision`` is what the turn left, ``previous_revision``
    what was there before it (None when the turn created the document)."""

    path: str
    revision: str
    previous_revision: str | None


# -- results --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Undone:
    path: str
    outcome: UndoOutcome
    # The revision the document went back to (None unless restored).
    revision: str | None = None


class Memory:
    """The one door to a Hub's memory."""

    def __init__(
        self,
        state: State,
        config: SystemConfig,
        store: MemoryStore,
        history: MemoryHistory,
        executions: Executions,
    ) -> None:
        self._state = state
        self._config = config
        self._store = store
        self._history = history
        self._executions = executions

    # -- the rules -------------------------------------------------------------------------------

    def checked_scope(self, actor: Actor, binding: str | None = None) -> str:
        """The scope a memory call runs in, after the enabled and binding checks.

        Raises:
            MemoryDisabled: the running policy has memory off.
            BindingMismatch: the binding does not equal the derived scope.
        """
        if not self._config.memory_enabled:
            raise MemoryDisabled(
                "Agent memory is disabled on this Hub; the owner can enable it and restart"
            )
        return self._bound_scope(actor, binding)

    def _bound_scope(self, actor: Actor, binding: str | None) -> str:
        scope = memory_scope(actor.principal.id, self._config.isolation)
        check_binding(actor, binding, scope)
        return scope

    def _erase_scope(self, actor: Actor, binding: str | None) -> str:
        # Unlike the other memory calls, erasing works while memory is off: "forget me" must not
        # wait for the owner to turn memory back on. The scope and binding rules are the same.
        scope = self._bound_scope(actor, binding)
        if actor.delegated:
            # Nothing undoes an erase: a person decides it, never an Agent acting on a prompt.
            raise Forbidden("an Agent credential cannot erase memory; erase is for its owner")
        return scope

    def _launch(self, actor: Actor) -> tuple[str, str | None] | None:
        # Only delegated (Agent) credentials are issued for a launch: others skip the lookup.
        if not actor.delegated:
            return None
        return self._state.credential_launch(actor.credential.id)

    def _author(self, actor: Actor, via: Via) -> Author:
        """The change log's author of a change this actor makes (see ``hub.history``)."""
        launch = self._launch(actor)
        return Author(
            actor.principal.id,
            via,
            launch[0] if launch else None,
            launch[1] if launch else None,
        )

    async def _note(
        self,
        actor: Actor,
        op: MemoryOp,
        path: str,
        revision: str | None = None,
        previous: str | None = None,
    ) -> None:
        """Record a memory call made with a turn's delegated credential as an event of that
        turn, so watchers and the result card show what the Agent read and saved."""
        launch = self._launch(actor)
        if launch is None or launch[1] is None:
            return
        use = MemoryUse(op, path, revision, previous)
        text = json.dumps(use.to_wire(), ensure_ascii=False)
        # A change is what an undo goes back to: kept past the turn's bound on events.
        await self._executions.add_hub_event(launch[1], MEMORY, text, bounded=not use.changed)

    # -- reads -----------------------------------------------------------------------------------

    async def search(self, actor: Actor, binding: str | None, request: SearchRequest) -> Found:
        scope = self.checked_scope(actor, binding)
        r = request
        found = await self._store.search(scope, r.query, r.path_prefix, r.limit)
        await self._note(actor, "searched", r.path_prefix if isinstance(r.path_prefix, str) else "")
        return found

    async def get(self, actor: Actor, binding: str | None, request: GetRequest) -> Document:
        scope = self.checked_scope(actor, binding)
        r = request
        document = await self._store.get(scope, r.path, r.start_line, r.end_line, r.offset)
        if document.exists and not r.offset:
            # Continuation pages of the same read are not another read.
            await self._note(actor, "read", document.path, document.revision)
        return document

    async def list_documents(
        self, actor: Actor, binding: str | None, path_prefix: object, limit: int
    ) -> Listing:
        """Paths, sizes and revisions of the scope's documents in path order, at most ``limit``."""
        scope = self.checked_scope(actor, binding)
        return await self._store.list_documents(scope, path_prefix, limit)

    def history(self, actor: Actor, binding: str | None, request: HistoryRequest) -> LogPage:
        """The scope's change log, newest first (in the global scope only the actor's own)."""
        scope = self.checked_scope(actor, binding)
        r = request
        return self._history.entries(scope, actor.principal.id, r.path, r.limit, r.before)

    def made_by(self, actor: Actor, path: str, revision: str | None, previous: str | None) -> bool:
        """Whether the change log records the actor as the author of the change that took
        ``path`` from ``previous`` to ``revision`` (None: no document) in the scope the actor's
        memory is in now: what an Undo button is authorised by, never the ids it carries."""
        scope = memory_scope(actor.principal.id, self._config.isolation)
        return self._history.authored(scope, actor.principal.id, path, revision, previous)

    async def global_documents(self) -> int:
        """How many documents the one shared scope holds: what per-person scopes do not see."""
        return await self._store.count_documents(GLOBAL_SCOPE)

    # -- changes ---------------------------------------------------------------------------------

    async def upsert(
        self, actor: Actor, binding: str | None, request: UpsertRequest, via: Via
    ) -> Written:
        scope = self.checked_scope(actor, binding)
        r = request
        written = await self._history.upsert(
            scope, r.path, r.content, r.expected_revision, self._author(actor, via)
        )
        if written.changed:
            previous = str(r.expected_revision)
            before = None if previous == ABSENT else previous
            await self._note(actor, "saved", written.path, written.revision, before)
        return written

    async def forget(
        self, actor: Actor, binding: str | None, request: ForgetRequest, via: Via
    ) -> Forgotten:
        scope = self.checked_scope(actor, binding)
        r = request
        forgotten = await self._history.forget(
            scope, r.path, r.expected_revision, self._author(actor, via)
        )
        if not forgotten.already_absent:
            await self._note(actor, "forgot", forgotten.path, None, str(r.expected_revision))
        return forgotten

    async def restore(
        self, actor: Actor, binding: str | None, request: RestoreRequest, via: Via
    ) -> Written:
        scope = self.checked_scope(actor, binding)
        r = request
        restored = await self._history.restore(
            scope, r.path, r.revision, r.expected_revision, self._author(actor, via)
        )
        if restored.changed:
            previous = str(r.expected_revision)
            await self._note(actor, "saved", restored.path, restored.revision, previous)
        return restored

    async def undo(self, actor: Actor, request: UndoRequest, via: Via) -> Undone:
        """Back to the revision before a turn's change (or the turn's new document removed), if
        the document is still as the turn left it."""
        r = request
        current = await self.get(actor, None, GetRequest(r.path, end_line=1))
        if current.revision != r.revision:
            return Undone(r.path, "changed")
        if r.previous_revision:
            restore = RestoreRequest(r.path, r.previous_revision, r.revision)
            await self.restore(actor, None, restore, via)
            return Undone(r.path, "restored", r.previous_revision)
        await self.forget(actor, None, ForgetRequest(r.path, r.revision), via)
        return Undone(r.path, "removed")

    # -- erasing ---------------------------------------------------------------------------------

    async def preview_erase(self, actor: Actor, binding: str | None, path: object) -> Receipt:
        """What ``erase`` would remove now, removing nothing: for a confirmation that states it."""
        scope = self._erase_scope(actor, binding)
        preview = await self._history.preview_erase(scope, path, actor.principal.id)
        _found(path, preview)
        return preview

    async def erase(self, actor: Actor, binding: str | None, path: object, via: Via) -> Receipt:
        """One document or, with ``path`` None, the actor's whole scope ("forget me").

        Raises:
            NotFound: ``path`` names nothing to erase: no document, kept copy or change log
                entry of the actor's there (a whole scope may be empty).
        """
        scope = self._erase_scope(actor, binding)
        if path is not None:
            _found(path, await self._history.preview_erase(scope, path, actor.principal.id))
        return await self._history.erase(scope, path, self._author(actor, via))

    async def erase_principal(self, actor: Actor, principal_id: str, via: Via) -> Receipt:
        """The owner erases everything one Principal wrote to memory, whatever the running
        policy."""
        require_owner(actor, "only the owner can erase another Principal's memory")
        if self._state.principal(principal_id) is None:
            raise NotFound("no such principal", principal_id=principal_id)
        return await self._history.erase_principal(principal_id, self._author(actor, via))


def _found(path: object, preview: Receipt) -> None:
    """Raises: NotFound: a one-document erase would remove and keep nothing."""
    if path is None or preview.kept:
        return
    if preview.documents_removed or preview.history_copies_removed or preview.log_entries_redacted:
        return
    raise NotFound(
        f"nothing to erase at '{path}': no document, kept copy or change of yours", path=path
    )
