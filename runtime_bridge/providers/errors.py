"""Launch errors of the provider adapters, grafted onto the shared tree in ``hub.errors``.

Unavailable (503)
├── ExecutableMissing          executable_missing          the agent CLI is not installed
│   │                                                      (executable, provider)
│   └── ExecutableUnreachable  executable_unreachable      it is, where the Agent's uid cannot
│                                                          run it (executable, provider, blocked)
├── NativeMemoryUnconfirmed    native_memory_unconfirmed   the agent could not confirm that its
│                                                          own long-term memory is off
├── AgentProtocolError         agent_protocol              the agent broke its control protocol
└── SandboxUnavailable         sandbox_unavailable         no pod could be had (or reached) for
                                                           the launch (claim, reason)

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


class ExecutableUnreachable(ExecutableMissing):
    code = "executable_unreachable"

    @property
    def blocked(self) -> str | None:
        """The directory (or the file itself) the Agent's uid is stopped at."""
        return self._text_detail("blocked")


class NativeMemoryUnconfirmed(Unavailable):
    code = "native_memory_unconfirmed"


class AgentProtocolError(Unavailable):
    code = "agent_protocol"


class SandboxUnavailable(Unavailable):
    code = "sandbox_unavailable"

    @property
    def claim(self) -> str | None:
        """The SandboxClaim made for the launch (deleted by then)."""
        return self._text_detail("claim")

    @property
    def reason(self) -> str | None:
        """Why, as the agent-sandbox controller or the API server said it."""
        return self._text_detail("reason")
