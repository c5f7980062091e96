"""Process logging: one JSON object per line (or plain text), with request ids and redaction.

Every line written while a request is served carries its id (the Hub's middleware sets it), and so
does the access line aiohttp writes after the handler. Redaction scrubs bearer tokens, ``amux_``
credentials and any secret value the process registers, from the message, extra fields and
tracebacks alike.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from pydantic_settings import BaseSettings, SettingsConfigDict

from hub.middleware import CREDENTIAL_SHAPE, REQUEST_ID_KEY
from hub.requestid import REQUEST_ID
from hub.rpc import RPC_PATH

REDACTED = "[redacted]"
_PATTERNS = (
    (re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+"), rf"\1 {REDACTED}"),
    (CREDENTIAL_SHAPE, f"amux_{REDACTED}"),
)
# Attributes every LogRecord has; anything else was passed as ``extra=`` and is logged as a field.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class LogSettings(BaseSettings):
    """How ``amux serve`` writes its log (stderr)."""

    model_config = SettingsConfigDict(env_prefix="AMUX_LOG_", extra="ignore")

    # json: one object per line for collectors; text: one readable line for a terminal.
    format: Literal["text", "json"] = "text"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class Redactor:
    """Removes credentials from text: token shapes by pattern, registered secrets by value."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Very short values would blank out ordinary words, so they are not treated as secrets.
        self._secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        # Every log line passes here; most hold neither token shape, so skip the patterns cheaply.
        if "amux_" in text or "bearer" in text.lower():
            for pattern, replacement in _PATTERNS:
                text = pattern.sub(replacement, text)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


class RedactionFilter(logging.Filter):
    """Renders each record's message once, redacted, so no formatter sees the raw arguments."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redact(record.getMessage())
        record.args = None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.redact(value))
        return True


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, request_id, then extra fields; tracebacks as ``exception``."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value if _is_json_scalar(value) else repr(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return self.redact(json.dumps(entry, ensure_ascii=False, default=repr))


class TextFormatter(logging.Formatter):
    def __init__(self, redact: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            line += f" [request_id={request_id}]"
        return self.redact(line)


def configure(
    settings: LogSettings, secrets: Iterable[str] = (), stream: TextIO | None = None
) -> logging.Handler:
    """Send the root logger's records to ``stream`` (stderr) in the chosen format, redacted."""
    redact = Redactor(secrets)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RedactionFilter(redact))
    formatter: logging.Formatter = (
        JsonFormatter(redact) if settings.format == "json" else TextFormatter(redact)
    )
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    return handler


# Workers and watchers hold these open for up to 20 s and ask again at once, so an idle worker
# alone would write a line every 20 s; their successes are logged only at DEBUG.
LONG_POLLS = frozenset(
    RPC_PATH.format(method=method) for method in ("executions.claim", "executions.watch")
)


class AccessLogger(AbstractAccessLogger):
    """One line per request, with its id: aiohttp writes these after the handler's context ends."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        quiet = request.path in LONG_POLLS and response.status < 400
        # Only the path: query strings are the caller's to fill and are not needed here.
        self.logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "%s %s %s",
            request.method,
            request.path,
            response.status,
            extra={
                "request_id": request.get(REQUEST_ID_KEY),
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "duration_ms": round(time * 1000, 2),
            },
        )


def _is_json_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
