"""Settings of the Feishu bot. Only composition roots construct these."""

from __future__ import annotations

import re
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cards.times import DEFAULT_TIME_ZONE

FEISHU_DOMAIN = "https://open.feishu.cn"
LARK_DOMAIN = "https://open.larksuite.com"
FEISHU_ACCOUNTS = "https://accounts.feishu.cn"
LARK_ACCOUNTS = "https://accounts.larksuite.com"
ENCRYPT_KEY_VARIABLE = "AMUX_FEISHU_ENCRYPT_KEY"
VERIFICATION_TOKEN_VARIABLE = "AMUX_FEISHU_VERIFICATION_TOKEN"


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]{0,127}")


class FeishuSettings(BaseSettings):
    """Feishu (or Lark) app credentials and ingress choice; no app id means the bot is off."""

    model_config = SettingsConfigDict(env_prefix="AMUX_FEISHU_", extra="ignore")

    app_id: str = ""
    app_secret: SecretStr = SecretStr("")
    encrypt_key: SecretStr = SecretStr("")
    verification_token: SecretStr = SecretStr("")
    # Without an encrypt key webhook events are neither signed nor encrypted; that takes a choice.
    allow_unencrypted: bool = False
    # Feishu's, Lark's, or a loopback URL (tests); the SDK appends "/open-apis/...".
    domain: str = FEISHU_DOMAIN
    # Where `amux feishu setup` registers the app (Feishu's accounts site; with --lark, Lark's).
    accounts_domain: str = FEISHU_ACCOUNTS
    mode: Literal["webhook", "long_connection"] = "webhook"
    enroll: Literal["auto", "closed"] = "auto"
    tenant_key: str = Field(
        default="",
        description="The tenant (tenant_key) the app belongs to: events of any other tenant are "
        "refused. Empty: the tenant of the first signed event, kept in the Hub's state.",
    )
    # Feishu retries for about 7 h; remember event ids well beyond that.
    dedup_hours: float = 24.0
    # Messages sent while the bot could not hear them (long connection down or reconnecting, Hub
    # stopped) are listed and handled once it hears again; one older than this window when found
    # is not run but answered with a note and a button its sender may press to run it.
    catch_up_window_seconds: float = Field(default=600.0, ge=0)
    # Never looks further back than this (and never beyond dedup_hours, which is what says a
    # listed message already ran).
    catch_up_max_age_seconds: float = Field(default=6 * 3600.0, ge=0)
    # The most recently active chats and topics looked at, and pages of 50 messages read in each.
    catch_up_chats: int = Field(default=50, ge=0)
    catch_up_pages: int = Field(default=4, ge=1)
    # Webhook requests older (or further in the future) than this are replays.
    max_clock_skew_seconds: float = 300.0
    # At most one in-place card update per message per interval while streaming.
    card_update_interval_seconds: float = 1.5
    # The Agent a new Feishu conversation runs (claude, codex or pi).
    # Feishu documents linked in a message, read as its sender: at most this many bytes of
    # Markdown per link and per turn.
    document_link_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description="Bytes of Markdown a Feishu document linked in a message may put in the "
        "Agent's prompt, read as the message's sender. A longer document is saved whole in the "
        "conversation's working directory (inbox/<message>/feishu/) and the prompt holds its "
        "first 2 KiB and the file's path (with remote workers only, it is cut at this bound).",
    )
    document_turn_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes of Markdown all the documents linked in one message may put in the "
        "Agent's prompt; links past it are not read, and the card says which.",
    )
    provider: str = "claude"
    # The models ``/model`` may choose for a topic's conversation, per provider; a provider not
    # listed offers none (its Agent's own default runs).
    models: dict[str, list[str]] = {}
    # Language of the bot's cards and replies.
    language: Literal["zh_cn", "en_us"] = "zh_cn"
    # The IANA time zone the bot's cards tell time in (each time carries its UTC offset).
    time_zone: str = DEFAULT_TIME_ZONE

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as Asia/Shanghai or UTC"
            ) from None
        return value

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for provider, names in value.items():
            for name in names:
                # It becomes an argument of the Agent's command line: never an option.
                if not MODEL_NAME.fullmatch(name):
                    raise ValueError(
                        f"model {name!r} of {provider} is not a model name (letters, digits "
                        "and . _ - : / @ [ ], not starting with -)"
                    )
        return value

    @field_validator("domain", "accounts_domain")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @property
    def enabled(self) -> bool:
        return bool(self.app_id.strip())

    def webhook_secrets_missing(self) -> tuple[str, ...]:
        """The variables a webhook set-up lacks to verify its events; empty when it has them.

        The one rule `amux serve` starts by and `amux doctor` checks. An encrypt key is enough
        alone: Feishu signs and encrypts every event with it. Without one (only by the explicit
        AMUX_FEISHU_ALLOW_UNENCRYPTED) the verification token in each event's body is all that
        vouches for it, so it is then needed.
        """
        if self.encrypt_key.get_secret_value():
            return ()
        missing = [] if self.allow_unencrypted else [ENCRYPT_KEY_VARIABLE]
        if not self.verification_token.get_secret_value():
            missing.append(VERIFICATION_TOKEN_VARIABLE)
        return tuple(missing)

    def startup_problem(self) -> str | None:
        """Why the bot must not start with these settings, in one line; None when it may."""
        if not self.enabled or self.mode != "webhook":
            return None
        missing = self.webhook_secrets_missing()
        if ENCRYPT_KEY_VARIABLE in missing:
            return (
                "the Feishu webhook has no AMUX_FEISHU_ENCRYPT_KEY, so its events would arrive "
                "unsigned and in clear text: set AMUX_FEISHU_ENCRYPT_KEY to the app's Encrypt "
                "Key, or set AMUX_FEISHU_ALLOW_UNENCRYPTED=true to accept that"
            )
        if missing:
            return (
                "the Feishu webhook has neither AMUX_FEISHU_ENCRYPT_KEY nor "
                "AMUX_FEISHU_VERIFICATION_TOKEN, so nothing would vouch for its events: set "
                "AMUX_FEISHU_VERIFICATION_TOKEN to the app's Verification Token"
            )
        return None

    def describe(self) -> str:
        """One log line about the bot's state, never including a secret."""
        if not self.enabled:
            return (
                "Feishu bot disabled: set AMUX_FEISHU_APP_ID and AMUX_FEISHU_APP_SECRET "
                "(and AMUX_FEISHU_ENCRYPT_KEY / AMUX_FEISHU_VERIFICATION_TOKEN for webhooks)"
            )
        return f"Feishu bot enabled: app {self.app_id}, {self.mode} via {self.domain}"
