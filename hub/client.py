"""Typed async client of the Hub RPC, used by the CLI, the MCP server and Runtime workers."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import aiohttp

from hub.errors import AmuxError, Unauthenticated, Unavailable, error_from_wire
from hub.requestid import REQUEST_ID, REQUEST_ID_HEADER

BINDING_HEADER = "X-Amux-Memory-Binding"
# How the call came (``cli`` or ``mcp``), for the Hub's memory change log.
VIA_HEADER = "X-Amux-Via"


class HubClient:
    """One authenticated connection pool to a Hub. Use as ``async with HubClient(...) as hub``."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        binding: str | None = None,
        timeout: float = 30.0,
        via: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._binding = binding
        self._via = via
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

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
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Content-Type": "application/json"}
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            if self._binding:
                headers[BINDING_HEADER] = self._binding
            if self._via:
                headers[VIA_HEADER] = self._via
            self._session = aiohttp.ClientSession(headers=headers, timeout=self._timeout)
        return self._session

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Call one RPC method; parameters that are None are left out.

        Raises:
            AmuxError: the Hub's typed error, or Unavailable when the Hub cannot be reached.
        """
        if not self._token:
            raise Unauthenticated(
                "no Hub credential: set AMUX_TOKEN, or run on the Hub host with its AMUX_HOME"
            )
        body = {key: value for key, value in params.items() if value is not None}
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        url = f"{self.base_url}/rpc/v1/{method}"
        request_id = REQUEST_ID.get()
        headers = {REQUEST_ID_HEADER: request_id} if request_id else None
        try:
            async with self._client().post(url, data=payload, headers=headers) as response:
                raw = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise Unavailable(f"cannot reach the Hub at {self.base_url}: {_reason(err)}") from None
        try:
            decoded = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            decoded = None
        if status != 200:
            raise error_from_wire(decoded, status)
        if not isinstance(decoded, dict):
            raise AmuxError(f"the Hub sent an unreadable answer (HTTP {status})")
        return decoded

    # Typed wrappers; the parameter names are the RPC's, which the MCP tools and the CLI share.

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

    async def capabilities(self) -> dict[str, Any]:
        return await self.call("system.capabilities")


def _reason(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    text = str(err).strip()
    return text or type(err).__name__
