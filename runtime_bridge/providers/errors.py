"""Launch errors of the provider adapters, grafted onto the shared tree in ``hub.errors``.

Unavailable (503)
├── ExecutableMissing          executable_missing          the agent CLI is not installed
├── NativeMemoryUnconfirmed    native_memory_unconfirmed   the agent could not confirm that its
│                                                          own long-term memory is off
└── AgentProtocolError         agent_protocol              the agent broke its control protocol
"""

from __future__ import annotations

from hub.errors import Unavailable


class ExecutableMissing(Unavailable):
    code = "executable_missing"


class NativeMemoryUnconfirmed(Unavailable):
    code = "native_memory_unconfirmed"


class AgentProtocolError(Unavailable):
    code = "agent_protocol"
