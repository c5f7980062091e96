"""The one error tree of amux, shared by the Hub, its client, the CLI and the MCP server.

    AmuxError                      code              HTTP
    ├── InvalidArgument            invalid_argument  400
    │   └── InvalidPath            invalid_path      400
    ├── Unauthenticated            unauthenticated   401
    ├── Forbidden                  forbidden         403
    │   ├── BindingMismatch        binding_mismatch  403
    │   └── MemoryDisabled         memory_disabled   403
    ├── NotFound                   not_found         404
    ├── Conflict                   conflict          409   (observed_revision, path)
    ├── PayloadTooLarge            payload_too_large 413
    ├── QuotaExceeded              quota_exceeded    422   (limit)
    ├── Unavailable                unavailable       503
    └── InternalError              internal          500

Inner code raises these; only the edges translate them: the Hub RPC turns one into
``{"error": {"code", "message", ...attributes}}`` with its status, and the client turns that JSON
back into the same class: a caller catches ``Conflict`` whether it runs in the Hub or over HTTP.
"""

from __future__ import annotations

from typing import Any, ClassVar


class AmuxError(Exception):
    """Base of every error amux reports to a caller."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}

    def to_wire(self) -> dict[str, Any]:
        """The JSON error body every edge emits."""
        return {"error": {"code": self.code, "message": self.message, **self.details}}

    def __getattr__(self, name: str) -> Any:
        # Context such as ``observed_revision`` lives in ``details`` so it round-trips the wire.
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(name)


class InvalidArgument(AmuxError):
    code = "invalid_argument"
    status = 400


class InvalidPath(InvalidArgument):
    code = "invalid_path"
    status = 400


class Unauthenticated(AmuxError):
    code = "unauthenticated"
    status = 401


class Forbidden(AmuxError):
    code = "forbidden"
    status = 403


class BindingMismatch(Forbidden):
    code = "binding_mismatch"
    status = 403


class MemoryDisabled(Forbidden):
    code = "memory_disabled"
    status = 403


class NotFound(AmuxError):
    code = "not_found"
    status = 404


class Conflict(AmuxError):
    code = "conflict"
    status = 409


class PayloadTooLarge(AmuxError):
    code = "payload_too_large"
    status = 413


class QuotaExceeded(AmuxError):
    code = "quota_exceeded"
    status = 422


class Unavailable(AmuxError):
    code = "unavailable"
    status = 503


class InternalError(AmuxError):
    code = "internal"
    status = 500


_BY_CODE: dict[str, type[AmuxError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        InvalidPath,
        Unauthenticated,
        Forbidden,
        BindingMismatch,
        MemoryDisabled,
        NotFound,
        Conflict,
        PayloadTooLarge,
        QuotaExceeded,
        Unavailable,
        InternalError,
    )
}


def error_from_wire(body: Any, status: int) -> AmuxError:
    """Rebuild the typed error from a Hub error body; unknown shapes become ``InternalError``."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        fields = dict(body["error"])
        code = str(fields.pop("code", "internal"))
        message = str(fields.pop("message", "") or code)
        cls = _BY_CODE.get(code, InternalError)
        return cls(message, **fields)
    return InternalError(f"unexpected Hub response (HTTP {status})")
