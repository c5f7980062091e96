"""Process logging: one JSON object per line (or plain text), with request ids and redaction.

Every line written while a request is served carries its id (the Hub's middleware sets it), and so
does the access line aiohttp writes after the handler. Redaction scrubs bearer tokens, ``amux_``
credentials and any secret value the process registers, from the message, extra fields and
tracebacks alike.

A record is one line whatever a caller put into it: the text format writes control characters
(C0, DEL, C1 and the Unicode line separators) of the message as escapes such as ``\\n`` and
``\\x1b``, and indents the lines of a traceback, so a decoded request path holding a newline
cannot write a second, forged record. The JSON format escapes them inside its strings.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from pydantic_settings import BaseSettings, SettingsConfigDict

from hub.access import log_access
from hub.middleware import CREDENTIAL_SHAPE, REQUEST_ID_KEY
from hub.requestid import REQUEST_ID

REDACTED = "[redacted]"
_PATTERNS = (
    (re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+"), rf"\1 {REDACTED}"),
    (CREDENTIAL_SHAPE, f"amux_{REDACTED}"),
)
# Characters that end a line or drive a terminal: C0 controls, DEL, C1 controls, and the two
# Unicode separators that str.splitlines() and some viewers also break lines at.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
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
        fields = vars(record)
        for key in fields.keys() - _STANDARD:
            value = fields[key]
            if isinstance(value, str):
                fields[key] = self.redact(value)
        return True


_JSON_RAW = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


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
        text = json.dumps(entry, ensure_ascii=False, default=repr)
        # JSON escapes C0 itself; DEL, C1 and the line separators it leaves raw, and some
        # viewers break lines or take terminal commands at them. Outside strings JSON is ASCII,
        # so each one found is inside a string, where \uXXXX means the same character.
        return self.redact(_JSON_RAW.sub(_json_escape, text))


def escape_controls(text: str) -> str:
    """``text`` on one line: each control character as ``\\n``, ``\\r``, ``\\t`` or ``\\xNN``."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _continued(text: str) -> str:
    # Each line of a traceback indented and escaped: no line of it can pass for a record.
    return "\n".join("  " + escape_controls(line) for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    def __init__(self, redact: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redact
        # The date and time to the second, made once a second: every access line needs one,
        # and strftime is a visible share of a small request's cost.
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        msec = self.default_msec_format
        return msec % (self._stamp, record.msecs) if msec else self._stamp

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The message holds what callers sent (a request's path, method or headers).
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _continued(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _continued(super().formatStack(stack_info))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            line += f" [request_id={escape_controls(str(request_id))}]"
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
    # No format of ours prints where a record was logged from or the thread or process that
    # logged it; gathering them for every record (every access line) is work nobody reads (the
    # logging HOWTO's optimisation).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    return handler


def current_settings() -> LogSettings:
    """What ``configure`` set up in this process, for a child process to log the same way."""
    root = logging.getLogger()
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    named = logging.getLevelName(root.level)
    levels: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR"]] = {
        "DEBUG": "DEBUG",
        "INFO": "INFO",
        "WARNING": "WARNING",
        "ERROR": "ERROR",
    }
    return LogSettings(format="json" if json_lines else "text", level=levels.get(named, "INFO"))


def current_stream() -> int | None:
    """The descriptor ``configure``'s handler writes to, for a child process to log there too."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            try:
                return int(handler.stream.fileno())
            except (AttributeError, OSError, ValueError):
                return None
    return None


class AccessLogger(AbstractAccessLogger):
    """One line per request, with its id: aiohttp writes these after the handler's context ends."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        request_id = request.get(REQUEST_ID_KEY)
        log_access(self.logger, request.method, request.path, response.status, request_id, time)


def _is_json_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
