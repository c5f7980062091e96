"""How alive the long connection is: its state, when a frame last arrived, forced reconnects.

The connection thread writes these fields and the main loop reads them for ``/healthz``,
``/metrics`` and the readiness check; each write is a single attribute store, so a reader sees
either the old or the new value, never a torn one.

A WebSocket can stay open while nothing comes through it any more (a proxy or NAT that dropped
the path, a server that stopped answering). The SDK pings every ping interval and Feishu answers
each ping with a pong, so a healthy connection hears something at least that often; silence for
:data:`SILENT_PINGS` intervals means the connection is dead and is replaced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from hub.metrics import FeishuLink

LinkState = Literal["connected", "reconnecting", "disconnected"]

# The key of the long connection's state in /healthz (`amux doctor` reads it there).
LINK_HEALTH = "feishu_long_connection"
# Pongs missed in a row before the connection counts as dead.
SILENT_PINGS = 3


class LinkHealth:
    """The long connection's liveness, as the connection thread last saw it."""

    def __init__(self) -> None:
        self._state: LinkState = "disconnected"
        # Told of each change of state, on the connection's thread (catch-up listens).
        self.on_change: Callable[[LinkState], None] | None = None
        self.last_frame: float | None = None
        self.last_event: float | None = None
        # Where the watchdog's silence count starts; None while a reconnect it forced is under way.
        self.quiet_since: float | None = None
        self.silent_reconnects = 0
        # The SDK's ping interval (Feishu sets it in the client config it hands out).
        self.ping_interval = 120.0

    @property
    def state(self) -> LinkState:
        return self._state

    @state.setter
    def state(self, value: LinkState) -> None:
        changed = value != self._state
        self._state = value
        if changed and self.on_change is not None:
            self.on_change(value)

    @property
    def silence_bound(self) -> float:
        return self.ping_interval * SILENT_PINGS

    def connected(self) -> None:
        self.state = "connected"
        # A fresh connection starts its silence count now, not at the old one's last frame.
        self.quiet_since = time.monotonic()

    def gave_up(self) -> None:
        self.state = "disconnected"
        self.quiet_since = time.monotonic()

    def frame(self, is_event: bool = False) -> None:
        now = time.monotonic()
        self.last_frame = self.quiet_since = now
        if is_event:
            self.last_event = now

    def silent_for(self) -> float:
        """Seconds of silence the watchdog counts; 0 while it waits for a reconnect."""
        return 0.0 if self.quiet_since is None else time.monotonic() - self.quiet_since

    def snapshot(self) -> FeishuLink:
        now = time.monotonic()
        return FeishuLink(
            state=self.state,
            frame_age_seconds=None if self.last_frame is None else now - self.last_frame,
            event_age_seconds=None if self.last_event is None else now - self.last_event,
            silent_reconnects=self.silent_reconnects,
            silence_bound_seconds=self.silence_bound,
        )
