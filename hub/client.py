"""Typed async client of the Hub RPC, used by the CLI, the MCP server and Runtime workers.

One client, two transports: ``HttpTransport`` posts to a Hub over the network; a transport in
the Hub's own process (``hub.local_transport``) hands the same request to the same dispatch.
Either way the client sends the same headers (the bearer credential among them) and reads the
answer the same way, so a caller sees the same results and the same typed errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import aiohttp

from hub.contract import (
    Approval,
    Claim,
    Execution,
    Session,
    TurnOutcome,
    UsageReport,
    WatchResult,
)
from hub.errors import AmuxError, InvalidArgument, Unauthenticated, Unavailable, error_from_wire
from hub.requestid import REQUEST_ID, REQUEST_ID_HEADER

BINDING_HEADER = "X-Amux-Memory-Binding"
# How the call came (``cli`` or ``mcp``), for the Hub's memory change log.
VIA_HEADER = "X-Amux-Via"


class Transport(Protocol):
    """How one call reaches a Hub: method name, JSON body and headers in; status and body out.

    Raises Unavailable when the Hub cannot be reached; every other failure is the Hub's answer.
    """

    async def send(
        self, method: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class HttpTransport:
    """``POST <base_url>/rpc/v1/<method>`` over one aiohttp connection pool."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, method: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self.base_url}/rpc/v1/{method}"
        try:
            async with self._session.post(url, data=body, headers=dict(headers)) as response:
                return response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise Unavailable(f"cannot reach the Hub at {self.base_url}: {_reason(err)}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# -- answers that have no dataclass in hub.contract ------------------------------------------------


def _text(wire: Mapping[str, Any], name: str) -> str:
    value = wire.get(name)
    if not isinstance(value, str):
        raise InvalidArgument(f"malformed Hub answer: {name} is missing or of the wrong type")
    return value


def _optional_text(wire: Mapping[str, Any], name: str) -> str | None:
    value = wire.get(name)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Registered:
    """``workers.register``: the id a worker claims under and how long its leases last."""

    worker_id: str
    lease_seconds: float

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Registered:
        lease = wire.get("lease_seconds")
        return cls(str(wire["worker_id"]), float(lease) if isinstance(lease, int | float) else 0.0)


@dataclass(frozen=True)
class Heartbeat:
    """``executions.heartbeat``: whether the turn's user asked to cancel it, and, for a worker
    that reported its gateway's count, the turn's allowance now (``budget``; None: unlimited)."""

    cancel_requested: bool
    budget_given: bool = False
    budget: int | None = None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Heartbeat:
        budget = wire.get("budget")
        given = "budget" in wire and (budget is None or _whole(budget))
        return cls(bool(wire.get("cancel_requested")), given, budget if given else None)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class SessionMemory:
    """``sessions.memory``: a launch's memory (``bound`` with a delegated credential, or not)."""

    memory: str | None
    binding: str | None
    warning: str | None
    token: str | None
    credential_id: str | None

    @property
    def bound(self) -> bool:
        return self.memory == "bound" and bool(self.token)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SessionMemory:
        warning = wire.get("warning")
        binding = wire.get("binding")
        return cls(
            memory=_optional_text(wire, "memory"),
            binding=str(binding) if binding is not None else None,
            warning=str(warning) if warning else None,
            token=_optional_text(wire, "token"),
            credential_id=_optional_text(wire, "credential_id"),
        )


@dataclass(frozen=True)
class Submitted:
    """``executions.submit``: the queued turn and the Session it belongs to."""

    execution: Execution
    session: Session

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Submitted:
        return cls(Execution.from_wire(wire["execution"]), Session.from_wire(wire["session"]))


@dataclass(frozen=True)
class ResolvedBinding:
    """``memory.binding.resolve``: the binding a fresh conversation of the Principal freezes."""

    binding: str
    principal_id: str

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ResolvedBinding:
        return cls(_text(wire, "binding"), _text(wire, "principal_id"))


@dataclass(frozen=True)
class CredentialInfo:
    """A credential as the Hub describes it (never its secret)."""

    id: str
    kind: str
    binding: str | None
    label: str
    expires_at: float | None
    revoked: bool

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> CredentialInfo:
        expires = wire.get("expires_at")
        return cls(
            id=_text(wire, "id"),
            kind=_text(wire, "kind"),
            binding=_optional_text(wire, "binding"),
            label=_optional_text(wire, "label") or "",
            expires_at=float(expires) if isinstance(expires, int | float) else None,
            revoked=bool(wire.get("revoked")),
        )


@dataclass(frozen=True)
class Delegated:
    """``credentials.delegate``: an Agent credential's secret, what it is, and whom it acts for."""

    token: str
    credential: CredentialInfo
    principal_id: str

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Delegated:
        return cls(
            _text(wire, "token"), CredentialInfo.from_wire(wire), _text(wire, "principal_id")
        )


class HubClient:
    """One authenticated client of a Hub. Use as ``async with HubClient(...) as hub``.

    ``transport`` defaults to HTTP to ``base_url``; the Hub's own process may hand in one that
    reaches its dispatch directly (``hub.local_transport``).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        binding: str | None = None,
        timeout: float = 30.0,
        via: str | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if binding:
            self._headers[BINDING_HEADER] = binding
        if via:
            self._headers[VIA_HEADER] = via
        self._transport = transport or HttpTransport(self.base_url, timeout)

    async def __aenter__(self) -> HubClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Call one RPC method; parameters that are None are left out. The typed methods below
        are built on this; it stays for a caller with a generic need.

        Raises:
            AmuxError: the Hub's typed error, or Unavailable when the Hub cannot be reached.
        """
        if not self._token:
            raise Unauthenticated(
                "no Hub credential: set AMUX_TOKEN, or run on the Hub host with its AMUX_HOME"
            )
        body = {key: value for key, value in params.items() if value is not None}
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = self._headers
        request_id = REQUEST_ID.get()
        if request_id:
            headers = {**headers, REQUEST_ID_HEADER: request_id}
        status, raw = await self._transport.send(method, payload, headers)
        try:
            decoded = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            decoded = None
        if status != 200:
            raise error_from_wire(decoded, status)
        if not isinstance(decoded, dict):
            raise AmuxError(f"the Hub sent an unreadable answer (HTTP {status})")
        return decoded

    # -- memory: the parameter names are the RPC's, which the MCP tools and the CLI share. Their
    # answers are passed on as they came (the CLI prints them, the MCP tools return them), so
    # they stay JSON objects.

    async def memory_search(
        self, query: str, path_prefix: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        return await self.call("memory.search", query=query, path_prefix=path_prefix, limit=limit)

    async def memory_get(
        self,
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        return await self.call(
            "memory.get", path=path, start_line=start_line, end_line=end_line, offset=offset
        )

    async def memory_upsert(
        self, path: str, content: str, expected_revision: str
    ) -> dict[str, Any]:
        return await self.call(
            "memory.upsert", path=path, content=content, expected_revision=expected_revision
        )

    async def memory_forget(self, path: str, expected_revision: str) -> dict[str, Any]:
        return await self.call("memory.forget", path=path, expected_revision=expected_revision)

    async def feishu_read(
        self,
        document: str,
        kind: str | None = None,
        offset: int | None = None,
        cells: str | None = None,
    ) -> dict[str, Any]:
        return await self.call(
            "feishu.read", document=document, kind=kind, offset=offset, range=cells
        )

    async def feishu_search(self, query: str, limit: int | None = None) -> dict[str, Any]:
        return await self.call("feishu.search", query=query, limit=limit)

    async def feishu_comment(
        self,
        document: str,
        text: str,
        request_id: str | None = None,
        wait_seconds: float | None = None,
    ) -> dict[str, Any]:
        return await self.call(
            "feishu.comment",
            document=document,
            text=text,
            request_id=request_id,
            wait_seconds=wait_seconds,
        )

    async def memory_history(
        self, path: str | None = None, limit: int | None = None, before: int | None = None
    ) -> dict[str, Any]:
        return await self.call("memory.history", path=path, limit=limit, before=before)

    async def memory_restore(
        self, path: str, revision: str, expected_revision: str
    ) -> dict[str, Any]:
        return await self.call(
            "memory.restore", path=path, revision=revision, expected_revision=expected_revision
        )

    async def memory_erase(self, path: str | None = None) -> dict[str, Any]:
        return await self.call("memory.erase", path=path)

    async def memory_erase_principal(self, principal_id: str) -> dict[str, Any]:
        return await self.call("memory.erase_principal", principal_id=principal_id)

    async def resolve_binding(self, principal_id: str | None = None) -> ResolvedBinding:
        return ResolvedBinding.from_wire(
            await self.call("memory.binding.resolve", principal_id=principal_id)
        )

    # -- system: printed as they came by ``amux system``, so JSON objects too.

    async def capabilities(self) -> dict[str, Any]:
        return await self.call("system.capabilities")

    async def whoami(self) -> dict[str, Any]:
        return await self.call("system.whoami")

    async def config_get(self) -> dict[str, Any]:
        return await self.call("system.config.get")

    async def config_set(self, key: str, value: object) -> dict[str, Any]:
        return await self.call("system.config.set", key=key, value=value)

    async def restart(self) -> dict[str, Any]:
        return await self.call("system.restart")

    # -- usage

    async def usage_report(
        self, principal: str | None = None, days: int | None = None
    ) -> UsageReport:
        """Model usage per day; ``principal`` an id or a name (default: the caller's own, or
        for the owner everyone's)."""
        return UsageReport.from_wire(
            await self.call("usage.report", principal=principal, days=days)
        )

    async def usage_extend(self, principal: str, tokens: int) -> dict[str, Any]:
        """Add ``tokens`` to a Principal's budget for today (the owner only)."""
        return await self.call("usage.extend", principal=principal, tokens=tokens)

    # -- projects (the owner only)

    async def project_add(
        self,
        name: str,
        *,
        path: str | None = None,
        remote: str | None = None,
        credential_env: str | None = None,
        branch: str = "main",
        provider: str = "claude",
        permissions: str | None = None,
    ) -> dict[str, Any]:
        """Add a project from a repository ``path`` on the Hub's host or a ``remote`` URL;
        ``credential_env`` names the worker's variable holding the remote's token."""
        return await self.call(
            "projects.add",
            name=name,
            path=path,
            remote=remote,
            credential_env=credential_env,
            branch=branch,
            provider=provider,
            permissions=permissions,
        )

    async def project_forge(
        self,
        name: str,
        *,
        kind: str,
        token: str,
        base_url: str | None = None,
        repo: str | None = None,
    ) -> dict[str, Any]:
        """Set the forge the project's pull requests are opened on, with its token."""
        return await self.call(
            "projects.forge", name=name, kind=kind, token=token, base_url=base_url, repo=repo
        )

    async def project_list(self) -> list[dict[str, Any]]:
        projects = (await self.call("projects.list")).get("projects")
        return [p for p in projects if isinstance(p, dict)] if isinstance(projects, list) else []

    async def project_show(self, name: str) -> dict[str, Any]:
        """The project and the chats bound to it."""
        return await self.call("projects.show", name=name)

    async def project_remove(self, name: str) -> dict[str, Any]:
        """Remove a project no chat is bound to; its memory stays with its service Principal."""
        return await self.call("projects.remove", name=name)

    # -- schedules and triggers

    async def schedule_call(self, method: str, **params: Any) -> dict[str, Any]:
        """One ``schedules.*`` or ``triggers.*`` call; parameters left None are not sent."""
        if not method.startswith(("schedules.", "triggers.")):
            raise ValueError(f"{method} is not a schedules method")
        return await self.call(method, **{k: v for k, v in params.items() if v is not None})

    # -- credentials

    async def delegate_credential(
        self,
        binding: str,
        principal_id: str | None = None,
        ttl_seconds: int | None = None,
        label: str | None = None,
    ) -> Delegated:
        return Delegated.from_wire(
            await self.call(
                "credentials.delegate",
                binding=binding,
                principal_id=principal_id,
                ttl_seconds=ttl_seconds,
                label=label,
            )
        )

    async def revoke_credential(self, credential_id: str) -> CredentialInfo:
        return CredentialInfo.from_wire(await self.call("credentials.revoke", id=credential_id))

    # -- turns, as the bot and ``amux agent run`` follow them

    async def submit(
        self,
        provider: str,
        prompt: str,
        *,
        session_id: str | None = None,
        cwd: str | None = None,
        origin: str | None = None,
        principal_id: str | None = None,
    ) -> Submitted:
        return Submitted.from_wire(
            await self.call(
                "executions.submit",
                provider=provider,
                prompt=prompt,
                session_id=session_id,
                cwd=cwd,
                origin=origin,
                principal_id=principal_id,
            )
        )

    async def watch(
        self, execution_id: str, after: int = 0, wait_seconds: float | None = None
    ) -> WatchResult:
        return WatchResult.from_wire(
            await self.call(
                "executions.watch",
                execution_id=execution_id,
                after=after,
                wait_seconds=wait_seconds,
            )
        )

    async def cancel(self, execution_id: str) -> Execution:
        return Execution.from_wire(await self.call("executions.cancel", execution_id=execution_id))

    async def approve(
        self,
        execution_id: str,
        request_id: str,
        decision: str,
        reason: str | None = None,
        principal_id: str | None = None,
    ) -> Approval:
        return Approval.from_wire(
            await self.call(
                "executions.approve",
                execution_id=execution_id,
                request_id=request_id,
                decision=decision,
                reason=reason,
                principal_id=principal_id,
            )
        )

    async def session(self, session_id: str) -> Session:
        return Session.from_wire(await self.call("sessions.get", session_id=session_id))

    # -- turns, as a Runtime worker runs them. A worker id is None while the worker registers
    # anew (the Hub forgot it): the call then goes without one, and the Hub refuses it.

    async def register_worker(self, name: str) -> Registered:
        return Registered.from_wire(await self.call("workers.register", name=name))

    async def claim(self, worker_id: str | None, wait_seconds: float | None = None) -> Claim | None:
        """The next turn leased to this worker; None when none came within ``wait_seconds``."""
        answer = await self.call("executions.claim", worker_id=worker_id, wait_seconds=wait_seconds)
        return Claim.from_wire(answer) if answer else None

    async def heartbeat(
        self,
        execution_id: str,
        worker_id: str | None,
        used_tokens: int | None = None,
        wait_seconds: float = 0.0,
    ) -> Heartbeat:
        """Keep the lease; with ``wait_seconds`` it answers early once a cancel is asked for."""
        params: dict[str, Any] = {"execution_id": execution_id, "worker_id": worker_id}
        if wait_seconds:
            params["wait_seconds"] = wait_seconds
        if used_tokens is not None:
            params["used_tokens"] = used_tokens
        return Heartbeat.from_wire(await self.call("executions.heartbeat", **params))

    async def add_event(
        self, execution_id: str, worker_id: str | None, kind: str, text: str
    ) -> int:
        """Report one event of a running turn; returns its sequence number."""
        answer = await self.call(
            "executions.event",
            execution_id=execution_id,
            worker_id=worker_id,
            kind=kind,
            text=text,
        )
        seq = answer.get("seq")
        return seq if isinstance(seq, int) else 0

    async def complete(
        self, execution_id: str, worker_id: str | None, outcome: TurnOutcome
    ) -> Execution:
        return Execution.from_wire(
            await self.call(
                "executions.complete",
                execution_id=execution_id,
                worker_id=worker_id,
                succeeded=outcome.succeeded,
                result=outcome.result.to_wire() if outcome.result is not None else None,
                error=outcome.error,
                native_id=outcome.native_id,
            )
        )

    async def session_memory(
        self, session_id: str, *, capable: bool = True, execution_id: str | None = None
    ) -> SessionMemory:
        return SessionMemory.from_wire(
            await self.call(
                "sessions.memory",
                session_id=session_id,
                capable=capable,
                execution_id=execution_id,
            )
        )

    async def unbind_session(self, session_id: str) -> Session:
        return Session.from_wire(await self.call("sessions.unbind", session_id=session_id))

    async def ask(
        self,
        execution_id: str,
        worker_id: str,
        *,
        tool: str,
        action: str,
        subject: str,
        detail: str = "",
    ) -> Approval:
        return Approval.from_wire(
            await self.call(
                "executions.ask",
                execution_id=execution_id,
                worker_id=worker_id,
                tool=tool,
                action=action,
                subject=subject,
                detail=detail,
            )
        )

    async def decision(
        self,
        execution_id: str,
        worker_id: str,
        request_id: str,
        wait_seconds: float | None = None,
    ) -> Approval:
        return Approval.from_wire(
            await self.call(
                "executions.decision",
                execution_id=execution_id,
                worker_id=worker_id,
                request_id=request_id,
                wait_seconds=wait_seconds,
            )
        )


def _reason(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    text = str(err).strip()
    return text or type(err).__name__
