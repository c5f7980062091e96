"""The names people know each other by, read from Feishu's contact API onto their Principals.

A Principal enrolled from Feishu is named by a handle such as ``feishu-on_1a2b3c``, which nobody
in a chat recognises. So the bot reads the person's display name (``contact.v3.user.batch`` by
open_id) and keeps it on the Principal (``People.set_display_name``), for cards ("For Alice to
answer"), the prompt's sender line and the log:

- the first time a person is met, the turn waits up to ``FIRST_WAIT_SECONDS`` for the name, so
  even a first message is headed by it; later reads refresh it in the background, at most once
  per ``REFRESH_SECONDS``, so a renamed person is shown by the new name within a day;
- without the contact scope Feishu refuses every read: that is logged once, with the scope to
  grant, and not asked again for ``SCOPE_RETRY_SECONDS``; people are then shown by their handle
  (``amux doctor`` says the same). Any other failure is retried for that person after
  ``FAILED_RETRY_SECONDS``. A name is a courtesy: no turn waits longer or fails for want of one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import UserIds
from hub.errors import AmuxError
from hub.people import People
from hub.principals import Principal

logger = logging.getLogger("amux.bot")

CONTACT_SCOPE = "contact:user.base:readonly"
REFRESH_SECONDS = 24 * 3600.0
FIRST_WAIT_SECONDS = 3.0
SCOPE_RETRY_SECONDS = 3600.0
FAILED_RETRY_SECONDS = 300.0


class DisplayNames:
    """Reads and refreshes Feishu display names; one read per person at a time."""

    def __init__(
        self,
        people: People,
        client: FeishuClient,
        *,
        clock: Callable[[], float] = time.time,
        first_wait: float = FIRST_WAIT_SECONDS,
    ) -> None:
        self._people = people
        self._client = client
        self._clock = clock
        self._first_wait = first_wait
        self._reading: dict[str, asyncio.Task[Principal | None]] = {}
        self._failed_until: dict[str, float] = {}
        self._no_scope_until = 0.0

    async def named(self, principal: Principal, ids: UserIds) -> Principal:
        """``principal`` with its display name as well as it is known now."""
        if principal.kind != "user" or not ids.open_id:
            return principal
        now = self._clock()
        read_at = self._people.display_name_at(principal.id)
        if read_at and now - read_at < REFRESH_SECONDS:
            return principal
        if now < self._no_scope_until or now < self._failed_until.get(principal.id, 0.0):
            return principal
        task = self._reading.get(principal.id)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._read(principal.id, ids.open_id), name=f"feishu-name-{principal.id}"
            )
            self._reading[principal.id] = task
            task.add_done_callback(lambda _: self._reading.pop(principal.id, None))
        if read_at:
            return principal  # A refresh: the name known so far serves meanwhile.
        done, _ = await asyncio.wait({task}, timeout=self._first_wait)
        if done and not task.cancelled() and task.exception() is None:
            return task.result() or principal
        return principal

    async def _read(self, principal_id: str, open_id: str) -> Principal | None:
        try:
            names = await self._client.user_names([open_id])
        except FeishuApiError as error:
            if error.missing_scope:
                if not self._no_scope_until:
                    logger.warning(
                        "Feishu does not let amux read people's names (%s): cards and prompts "
                        "name people by their amux handle; grant the scope %s in the app's "
                        "Permissions & Scopes and publish a new version",
                        error.message,
                        CONTACT_SCOPE,
                    )
                self._no_scope_until = self._clock() + SCOPE_RETRY_SECONDS
                return None
            self._failed(principal_id, error)
            return None
        except AmuxError as error:
            self._failed(principal_id, error)
            return None
        # An empty answer (the person left, or is outside the app's visible range) is recorded
        # too: asked again at the next refresh, not at every message.
        return self._people.set_display_name(principal_id, names.get(open_id, ""), self._clock())

    def _failed(self, principal_id: str, error: AmuxError) -> None:
        logger.info("a display name could not be read from Feishu: %s", error.message)
        self._failed_until[principal_id] = self._clock() + FAILED_RETRY_SECONDS

    async def close(self) -> None:
        """Stop the reads in flight (a name is read again on the next message)."""
        tasks = list(self._reading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
