"""What the Feishu (or Lark) app must grant amux: its scopes, events and callbacks.

The one list ``amux feishu setup`` asks Feishu to configure and ``amux doctor`` checks the app
against, so the two can never disagree about what the bot needs.
"""

from __future__ import annotations

from typing import Any

from bot.feishu.events import CARD_ACTION, COMMENT_ADD, MESSAGE_RECEIVE, OTHER_SUBSCRIBED

# Tenant scopes, each for something users would miss without it.
SCOPES: tuple[str, ...] = (
    # Read and send messages in chats the bot is in; send as the bot.
    "im:message",
    "im:message:send_as_bot",
    # Receive private messages, and group messages that @mention the bot.
    "im:message.p2p_msg:readonly",
    "im:message.group_at_msg:readonly",
    # Read a topic's earlier messages, the context of a group @mention inside a topic.
    "im:message:readonly",
    "im:message.group_msg",
    # Download what users send and upload what Agents leave in outbox/.
    "im:resource",
    # Stream progress into a CardKit card.
    "cardkit:card:write",
    # People's names on cards, in prompts and in logs.
    "contact:user.base:readonly",
    # Read a document comment thread that @mentions the bot (its quote and replies) and answer
    # in it; nothing of the document itself is read with these.
    "docs:document.comment:read",
    "docs:document.comment:create",
    # Read the app's own configuration, so `amux doctor` can say what it lacks.
    "application:application:self_manage",
)

# User scopes: what a person grants when they connect their own account (``/amux connect``), so
# documents they link are read as them. Read-only, and nothing else of their account;
# ``offline_access`` is what makes Feishu hand out a refresh token.
USER_SCOPES: tuple[str, ...] = (
    "docx:document:readonly",
    "wiki:wiki:readonly",
    "sheets:spreadsheet:readonly",
    "bitable:app:readonly",
    # The Agent's feishu_search: only what the person may open.
    "search:docs:read",
    # The Agent's feishu_comment, each one allowed as an edit is (under ask, on its card).
    "docs:document.comment:create",
    "offline_access",
)

EVENTS: tuple[str, ...] = (MESSAGE_RECEIVE, COMMENT_ADD, *sorted(OTHER_SUBSCRIBED))

CALLBACKS: tuple[str, ...] = (CARD_ACTION,)

APP_NAME = "amux"
APP_DESCRIPTION = "Coding Agents in Feishu chats, with a shared long-term memory"


def addons() -> dict[str, Any]:
    """The registration's request for the scopes, events and callbacks above."""
    return {
        "scopes": {"tenant": list(SCOPES), "user": list(USER_SCOPES)},
        "events": {"items": {"tenant": list(EVENTS)}},
        "callbacks": {"items": list(CALLBACKS)},
    }


def missing(granted: set[str], needed: tuple[str, ...]) -> list[str]:
    """What of ``needed`` is not in ``granted``, in the manifest's order."""
    return [item for item in needed if item not in granted]
