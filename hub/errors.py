"""The one error tree of amux, shared by the Hub, its client, the CLI and the MCP server.

    AmuxError                      code                 HTTP  details
    ├── InvalidArgument            invalid_argument     400
    │   └── InvalidPath            invalid_path         400
    ├── Unauthenticated            unauthenticated      401
    ├── Forbidden                  forbidden            403
    │   ├── BindingMismatch        binding_mismatch     403
    │   ├── MemoryDisabled         memory_disabled      403
    │   ├── FeishuNotConnected     feishu_not_connected 403
    │   └── FeishuRefused          feishu_refused       403
    ├── NotFound                   not_found            404
    ├── RequestTimeout             request_timeout      408
    ├── Conflict                   conflict             409   observed_revision, path
    ├── PayloadTooLarge            payload_too_large    413
    ├── UnsupportedEncoding        unsupported_encoding 415
    ├── QuotaExceeded              quota_exceeded       422   limit, retry_after
    ├── Unavailable                unavailable          503
    │   ├── FeishuUnavailable      feishu_unavailable   503
    │   └── StorageUnavailable     storage_unavailable  503   cause, disk
    │       └── StorageFull        storage_unavailable  507   cause, disk
    └── InternalError              internal             500

``storage_unavailable`` is a disk the Hub writes to refusing a write (or a read): ``cause`` is
``no_space`` or ``quota`` (507 Insufficient Storage: retrying will not help until room is made),
``read_only`` or ``io`` (503); ``disk`` is ``memory``, ``memory_history`` or ``state``. Its
message names the cause, never a file system path.

Other packages graft their own errors onto this tree by subclassing (the Runtime bridge's launch
errors under ``Unavailable``, the Feishu adapter's ``FeishuApiError``). A class that names its own
``code`` is registered under it when it is defined, and two classes cannot claim one code.

Inner code raises these; only the edges translate them: the Hub RPC turns one into
``{"error": {"code", "message", ...details}}`` with its status, and the client turns that JSON back
into the class registered for the code: a caller catches ``Conflict`` (or ``ExecutableMissing``)
whether it runs in the Hub or over HTTP. A code whose class this process never imported comes
back as ``InternalError`` with the same message and details.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

_BY_CODE: dict[str, type[AmuxError]] = {}

# Every registered error class by its code; the client rebuilds errors from it.
ERRORS: Mapping[str, type[AmuxError]] = MappingProxyType(_BY_CODE)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class AmuxError(Exception):
    """Base of every error amux reports to a caller.

    ``details`` is the context that travels with the error on the wire; subclasses read theirs
    through typed properties, which answer None when a raiser left a detail out.
    """

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass that inherits its parent's code travels as the parent: only a class that
        # names a code of its own is what that code means.
        if "code" not in cls.__dict__:
            return
        taken = _BY_CODE.get(cls.code)
        # The same class defined again (a module reloaded) takes its code back.
        if taken is not None and _qualified(taken) != _qualified(cls):
            raise TypeError(f"error code {cls.code!r} already belongs to {_qualified(taken)}")
        _BY_CODE[cls.code] = cls

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}

    def to_wire(self) -> dict[str, Any]:
        """The JSON error body every edge emits."""
        return {"error": {"code": self.code, "message": self.message, **self.details}}

    def _text_detail(self, name: str) -> str | None:
        # Details came from JSON when the error crossed the wire: trust nothing about their type.
        value = self.details.get(name)
        return value if isinstance(value, str) else None


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


class FeishuNotConnected(Forbidden):
    """The person a Feishu tool acts as has not connected their own Feishu account."""

    code = "feishu_not_connected"
    status = 403


class FeishuRefused(Forbidden):
    """Feishu would not give that person what was asked (no access, no such document)."""

    code = "feishu_refused"
    status = 403


class NotFound(AmuxError):
    code = "not_found"
    status = 404


class RequestTimeout(AmuxError):
    code = "request_timeout"
    status = 408


class Conflict(AmuxError):
    code = "conflict"
    status = 409

    @property
    def observed_revision(self) -> str | None:
        """The document's revision now (``absent`` if it is gone), for a caller to reread."""
        return self._text_detail("observed_revision")

    @property
    def path(self) -> str | None:
        """The memory document that changed, when the conflict is about one."""
        return self._text_detail("path")


class PayloadTooLarge(AmuxError):
    code = "payload_too_large"
    status = 413


class UnsupportedEncoding(AmuxError):
    code = "unsupported_encoding"
    status = 415


class QuotaExceeded(AmuxError):
    code = "quota_exceeded"
    status = 422

    @property
    def limit(self) -> str | None:
        """Which limit was reached, e.g. ``scope_documents``, ``scope_bytes``, ``queued_turns``."""
        return self._text_detail("limit")

    @property
    def retry_after(self) -> int | None:
        """Seconds after which trying again may succeed, when waiting is what helps."""
        value = self.details.get("retry_after")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return max(0, round(value))


class Unavailable(AmuxError):
    code = "unavailable"
    status = 503


class FeishuUnavailable(Unavailable):
    """This Hub reads no Feishu documents: no Feishu app runs beside it, or Feishu is down."""

    code = "feishu_unavailable"
    status = 503


class StorageUnavailable(Unavailable):
    code = "storage_unavailable"
    status = 503

    @property
    def cause(self) -> str | None:
        """``no_space``, ``quota``, ``read_only`` or ``io``."""
        return self._text_detail("cause")

    @property
    def disk(self) -> str | None:
        """Which of the Hub's stores refused: ``memory``, ``memory_history`` or ``state``."""
        return self._text_detail("disk")


class StorageFull(StorageUnavailable):
    # No code of its own: it travels as storage_unavailable, with the status that says more
    # room is needed rather than a retry.
    status = 507


class InternalError(AmuxError):
    code = "internal"
    status = 500


def error_from_wire(body: Any, status: int) -> AmuxError:
    """Rebuild the typed error from a Hub error body; unknown shapes become ``InternalError``."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        fields = dict(body["error"])
        code = str(fields.pop("code", "internal"))
        message = str(fields.pop("message", "") or code)
        cls = _BY_CODE.get(code, InternalError)
        return cls(message, **fields)
    return InternalError(f"unexpected Hub response (HTTP {status})")
