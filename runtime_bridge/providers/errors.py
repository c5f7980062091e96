"""Launch errors of the provider adapters, grafted onto the shared tree in ``hub.errors``.

Unavailable (503)
├── ExecutableMissing          executable_missing          the agent CLI is not installed
│                                                          (executable, provider)
├── NativeMemoryUnconfirmed    native_memory_unconfirmed   the agent could not confirm that its
│                                                          own long-term memory is off
└── AgentProtocolError         agent_protocol              the agent broke its control protocol

Defining them registers their codes, so a client that imported this module gets them back from
the Hub as these classes.
"""

from __future__ import annotations

from hub.errors import Unavailable


class ExecutableMissing(Unavailable):
    code = "executable_missing"

    @property
    def executable(self) -> str | None:
        """The program that was not found, as the launch named it."""
        return self._text_detail("executable")

    @property
    def provider(self) -> str | None:
        """Whose launch needed it: an Agent provider, or ``sandbox`` / ``amux``."""
        return self._text_detail("provider")


class NativeMemoryUnconfirmed(Unavailable):
    code = "native_memory_unconfirmed"


class AgentProtocolError(Unavailable):
    code = "agent_protocol"
