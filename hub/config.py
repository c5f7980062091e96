"""Settings of the Hub and of its clients. Only composition roots construct these."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from hub.errors import Unavailable

OWNER_TOKEN_FILE = "owner.token"


def absolute_path(path: Path) -> Path:
    """``path`` from the directory this process started in, links kept as they are.

    Settings are made absolute once, when read: a relative one handed on as it is would be taken
    from another directory by bwrap and by the Agents, which run elsewhere.
    """
    return Path(os.path.abspath(path))


# A path setting; a relative value is taken from the directory the process starts in.
AbsolutePath = Annotated[Path, AfterValidator(absolute_path)]


def invalid_settings(err: ValidationError, prefix: str = "AMUX_") -> str:
    """Which variables are wrong and why, never their values (one may be a credential)."""
    return "; ".join(
        f"{prefix}{'_'.join(str(part) for part in problem['loc']).upper()}: "
        + problem["msg"].removeprefix("Value error, ")
        for problem in err.errors()
    )


def unparsable_setting(err: SettingsError, models: Iterable[type[BaseSettings]]) -> str:
    """Which variable a settings source could not parse (a JSON one that is not JSON), and the fix.

    The error names only the field; the variable is the one of the model that has that field.
    """
    found = re.search(r'field "(\w+)"', str(err))
    field = found.group(1) if found else None
    names = [
        f"{model.model_config.get('env_prefix', '')}{field}".upper()
        for model in models
        if field is not None and field in model.model_fields
    ]
    name = names[0] if len(names) == 1 else "an AMUX_* variable"
    return (
        f"{name} does not parse: it takes JSON (a list or an object); "
        "fix or unset it (deploy/amux.env.example shows each with an example)"
    )


class HubSettings(BaseSettings):
    """Where the Hub keeps its state and where it listens."""

    model_config = SettingsConfigDict(env_prefix="AMUX_", extra="ignore")

    home: AbsolutePath = Field(default=Path(".amux"), validate_default=True)
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    # exec: re-exec in place after a graceful drain; exit: leave the restart to a supervisor.
    restart_mode: Literal["exec", "exit"] = "exec"
    max_request_bytes: int = 1024 * 1024
    # A request body not received whole within this long gets 408 and its connection is closed:
    # a client dribbling bytes must not hold a connection, or a restart's drain, for longer.
    request_body_seconds: float = Field(default=10.0, gt=0)
    # A worker that misses heart-beats this long loses its turn to a retry.
    lease_seconds: float = 30.0
    # A turn no worker takes within this long fails visibly instead of waiting forever.
    queue_seconds: float = 900.0
    # A project conversation's turns wait for the worker holding its checkout; once that worker
    # has not been seen for this long (while the Hub runs) another worker takes them and makes
    # the checkout again from the conversation's branch. Below queue_seconds, so a waiting turn
    # moves before it would fail.
    home_worker_seconds: float = Field(default=300.0, ge=10)
    # How long an Agent's delegated credential lives unless revoked first (a finished turn's is
    # revoked at once); bounds what a leaked one can do.
    delegated_credential_seconds: int = 6 * 3600
    # A restart claims no new turns and gives running ones this long to finish; those still
    # running are then handed back to the queue and run again after it (a stop hands back at once).
    drain_seconds: float = 120.0

    @property
    def memory_root(self) -> Path:
        return self.home / "memory"

    @property
    def state_path(self) -> Path:
        return self.home / "state.sqlite3"


class ClientSettings(BaseSettings):
    """How a CLI, MCP server or worker reaches the Hub."""

    model_config = SettingsConfigDict(env_prefix="AMUX_", extra="ignore")

    home: AbsolutePath = Field(default=Path(".amux"), validate_default=True)
    hub_url: str = "http://127.0.0.1:8765"
    token: SecretStr | None = None
    memory_binding: str | None = None
    timeout: float = 30.0
    # Agent launches set this false: an Agent's amux never falls back to an owner token it finds.
    owner_token_fallback: bool = True
    # Set in a launch of a bound conversation whose Hub could not be asked: why its memory calls
    # fail. Its Agent keeps the memory protocol and never falls back to another memory.
    memory_unavailable: str | None = None

    @field_validator("hub_url")
    @classmethod
    def _hub_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL of the Hub, e.g. http://127.0.0.1:8765")
        return value.strip()

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        # Never the value in a message: it is a credential.
        # Empty is unset, as resolved_token reads it.
        if value is None or not value.get_secret_value():
            return value
        secret = value.get_secret_value()
        if not secret.strip():
            raise ValueError("is blank; set it to the token `amux token issue` printed, or unset")
        if any(ord(char) < 0x21 or ord(char) == 0x7F for char in secret):
            raise ValueError(
                "holds a character a header cannot carry (a space, line break or other control "
                "character); set it to the token exactly as `amux token issue` printed it"
            )
        return value

    def unavailable(self) -> Unavailable | None:
        """The error every memory call of this launch answers, if its memory is unavailable."""
        if not self.memory_unavailable:
            return None
        return Unavailable(f"amux memory is unavailable: {self.memory_unavailable}")

    def resolved_token(self) -> str | None:
        """AMUX_TOKEN, else the local owner token a Hub on this host wrote under AMUX_HOME."""
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value()
        if not self.owner_token_fallback:
            return None
        path = self.home / OWNER_TOKEN_FILE
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
