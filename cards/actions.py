"""The stable vocabulary of card callback actions.

Every interactive element of an amux card carries ``behaviors: [{"type": "callback", "value":
{"action": <name>, ...fields}}]``. Feishu echoes that value back in ``card.action.trigger``
(``event.action.value``), plus ``form_value`` for form submissions and ``checked`` for checkers.
Handlers dispatch on ``value["action"]``; the names and fields below are a wire contract (old
cards stay in chats for weeks), so add names rather than change them. Cards from before
``history_days`` existed carry none: a draft without it keeps the saved number of days.

=========================  ======================================================================
action                     fields carried in the value
=========================  ======================================================================
``manage.open``            (none) re-render the management card
``memory.toggle``          the draft *after* this click (below)
``isolation.toggle``       the draft *after* this click
``history.days``           the draft *after* this click (a choice of days history is kept)
``turns.queued``           the draft *after* this click (a choice of waiting turns per person)
``feishu.rate``            the draft *after* this click (a choice of messages per minute)
``settings.save``          the draft to save, refused (nothing saved) unless its
                           ``settings_revision`` is the saved settings' revision still
``restart.now``            (none) restart the Hub now
``restart.later``          (none) keep the saved values pending until a later restart
``memory.list``            ``path_prefix`` (optional) list the caller's memory documents
``memory.search``          (none) form submit; the query is ``form_value["query"]``
``memory.open``            ``path``, ``offset`` (optional continuation offset)
``memory.forget.ask``      ``path``, ``revision``: show the confirmation card
``memory.forget.confirm``  ``path``, ``revision``: delete if the document is still at ``revision``
``memory.history``         ``path`` (optional): recent changes of the caller's memory
``memory.restore``         ``path``, ``revision`` (kept), ``expected_revision`` (current)
``memory.erase.ask``       ``path`` (optional; none: the whole scope): what an erase removes
``memory.erase.confirm``   ``path`` (optional): erase the document(s) and their history; both
                           erase actions work while memory is off, no other memory action does
``memory.undo``            ``path``, ``revision`` (what the turn left; absent after a forget),
                           ``previous_revision`` (absent when the turn created it),
                           ``principal_id`` (whose memory; shown, never trusted: the Hub's
                           change log says whose change it is): undo one change of a turn
``run.cancel``             ``run_id``: stop a running Agent execution
``run.approve``            ``run_id``, ``request_id``, ``decision`` (``allow_once``,
                           ``allow_session`` or ``deny``): answer a permission request of a
                           running turn (its person or the owner; the handler checks)
``provider.set``           ``provider``, ``chat_id``: the Agent new conversations in a chat run
``conversation.new``       ``origin``: the next message in this topic starts a new conversation
                           (refused for a topic of another chat than the one clicked in)
``agents.permissions``     ``permissions`` (``ask``, ``auto`` or ``read-only``) and the draft:
                           saved at once, for turns started after it (owner only)
``agents.timeout``         ``approval_timeout`` (seconds) and the draft: saved at once, for
                           permission requests made after it (owner only)
``budget.extend``          ``principal_id``, ``tokens``: add that many tokens to the Principal's
                           budget for today, UTC (owner only)
``budget.daily``           ``daily_tokens`` and the draft: saved at once, for turns started
                           after it (owner only)
``budget.turn``            ``turn_tokens`` and the draft: saved at once, likewise (owner only)
``projects.worktree``      ``worktree_days`` and the draft: saved at once, for turns workers take
                           after it (owner only)
``project.bind``           the draft; form submit: bind ``form_value["chat_id"]`` to the project
                           ``form_value["project"]`` (owner only)
``project.unbind``         ``chat_id``, ``project`` (the binding the card showed) and the draft:
                           unbind the chat if it is still bound to that project (owner only)
``schedule.change``        ``schedule`` (its id), ``change`` (``pause``, ``resume``, ``run`` or
                           ``remove``) and the draft: its creator or the owner (the Hub checks)
``branch.pull_request``    ``run_id``: open the conversation's pull request from its branch, or
                           update the one it opened; which conversation, and who may (its
                           participants and the owner), is the Hub's record of the turn
``catchup.run``             (none): run the message a note about a message sent while the bot was
                           away answers; which message, and who may run it (its sender or the
                           owner, once), is the bot's record of the note, never the card's
``feishu.connect``         (none): start connecting the clicker's own Feishu account; only in
                           their own private chat with the bot (the bot's record of that chat)
``feishu.disconnect``      (none): erase the clicker's own Feishu token
=========================  ======================================================================

The draft is ``memory_enabled``, ``isolation``, ``history_days``, ``max_queued`` and
``messages_per_minute``, and ``settings_revision``: the revision of the saved settings the draft
was built from, carried from click to click. Cards from before ``max_queued`` and
``messages_per_minute`` existed carry neither: a draft without them keeps the saved values, as one
without ``history_days`` does. A draft without ``settings_revision`` cannot show it is current, so
its Save is refused like a stale one's.

Ids in a value (principal, chat, run, request, origin) name what a click is about, never who may
make it: handlers authorise from the clicker and the stored state the click acts on.
"""

from __future__ import annotations

from typing import Any, Final

MANAGE_OPEN: Final = "manage.open"
MEMORY_TOGGLE: Final = "memory.toggle"
ISOLATION_TOGGLE: Final = "isolation.toggle"
HISTORY_DAYS: Final = "history.days"
QUEUED_MAX: Final = "turns.queued"
MESSAGES_RATE: Final = "feishu.rate"
SETTINGS_SAVE: Final = "settings.save"
RESTART_NOW: Final = "restart.now"
RESTART_LATER: Final = "restart.later"
MEMORY_LIST: Final = "memory.list"
MEMORY_SEARCH: Final = "memory.search"
MEMORY_OPEN: Final = "memory.open"
MEMORY_FORGET_ASK: Final = "memory.forget.ask"
MEMORY_FORGET_CONFIRM: Final = "memory.forget.confirm"
MEMORY_UNDO: Final = "memory.undo"
MEMORY_HISTORY: Final = "memory.history"
MEMORY_RESTORE: Final = "memory.restore"
MEMORY_ERASE_ASK: Final = "memory.erase.ask"
MEMORY_ERASE_CONFIRM: Final = "memory.erase.confirm"
RUN_CANCEL: Final = "run.cancel"
PROVIDER_SET: Final = "provider.set"
CONVERSATION_NEW: Final = "conversation.new"
RUN_APPROVE: Final = "run.approve"
PERMISSIONS_SET: Final = "agents.permissions"
APPROVAL_TIMEOUT_SET: Final = "agents.timeout"
BUDGET_EXTEND: Final = "budget.extend"
BUDGET_DAILY_SET: Final = "budget.daily"
BUDGET_TURN_SET: Final = "budget.turn"
WORKTREE_DAYS_SET: Final = "projects.worktree"
PROJECT_BIND: Final = "project.bind"
PROJECT_UNBIND: Final = "project.unbind"
SCHEDULE_CHANGE: Final = "schedule.change"
CATCH_UP_RUN: Final = "catchup.run"
PULL_REQUEST: Final = "branch.pull_request"
FEISHU_CONNECT: Final = "feishu.connect"
FEISHU_DISCONNECT: Final = "feishu.disconnect"

ALL: Final[frozenset[str]] = frozenset(
    {
        MANAGE_OPEN,
        MEMORY_TOGGLE,
        ISOLATION_TOGGLE,
        HISTORY_DAYS,
        QUEUED_MAX,
        MESSAGES_RATE,
        SETTINGS_SAVE,
        RESTART_NOW,
        RESTART_LATER,
        MEMORY_LIST,
        MEMORY_SEARCH,
        MEMORY_OPEN,
        MEMORY_FORGET_ASK,
        MEMORY_FORGET_CONFIRM,
        MEMORY_UNDO,
        MEMORY_HISTORY,
        MEMORY_RESTORE,
        MEMORY_ERASE_ASK,
        MEMORY_ERASE_CONFIRM,
        RUN_CANCEL,
        PROVIDER_SET,
        CONVERSATION_NEW,
        RUN_APPROVE,
        PERMISSIONS_SET,
        APPROVAL_TIMEOUT_SET,
        BUDGET_EXTEND,
        BUDGET_DAILY_SET,
        BUDGET_TURN_SET,
        WORKTREE_DAYS_SET,
        PROJECT_BIND,
        PROJECT_UNBIND,
        SCHEDULE_CHANGE,
        CATCH_UP_RUN,
        PULL_REQUEST,
        FEISHU_CONNECT,
        FEISHU_DISCONNECT,
    }
)

# Actions only the owner may trigger: the bot's action table refuses them from anyone else
# before any handler runs; the card merely hides them.
OWNER_ONLY: Final[frozenset[str]] = frozenset(
    {
        MEMORY_TOGGLE,
        ISOLATION_TOGGLE,
        HISTORY_DAYS,
        QUEUED_MAX,
        MESSAGES_RATE,
        SETTINGS_SAVE,
        RESTART_NOW,
        RESTART_LATER,
        PERMISSIONS_SET,
        APPROVAL_TIMEOUT_SET,
        BUDGET_EXTEND,
        BUDGET_DAILY_SET,
        BUDGET_TURN_SET,
        WORKTREE_DAYS_SET,
        PROJECT_BIND,
        PROJECT_UNBIND,
    }
)


def callback(action: str, **fields: Any) -> list[dict[str, Any]]:
    """The ``behaviors`` list that makes an element report ``action`` (and ``fields``) on click."""
    if action not in ALL:
        raise ValueError(f"unknown card action {action!r}")
    value: dict[str, Any] = {"action": action}
    value.update({k: v for k, v in fields.items() if v is not None})
    return [{"type": "callback", "value": value}]
