import pytest
from pydantic import SecretStr

from bot.commands.doctor import check_feishu_ingress
from bot.config import FEISHU_DOMAIN, FeishuSettings


def test_no_app_id_means_the_bot_is_off_with_a_hint() -> None:
    settings = FeishuSettings()
    assert not settings.enabled
    assert "AMUX_FEISHU_APP_ID" in settings.describe()
    assert settings.domain == FEISHU_DOMAIN
    assert settings.mode == "webhook" and settings.enroll == "auto"


def test_settings_come_from_amux_feishu_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMUX_FEISHU_APP_ID", "cli_env")
    monkeypatch.setenv("AMUX_FEISHU_APP_SECRET", "very-secret")
    monkeypatch.setenv("AMUX_FEISHU_ENCRYPT_KEY", "ek-secret")
    monkeypatch.setenv("AMUX_FEISHU_DOMAIN", "https://open.larksuite.com/")
    monkeypatch.setenv("AMUX_FEISHU_MODE", "long_connection")
    monkeypatch.setenv("AMUX_FEISHU_ENROLL", "closed")
    settings = FeishuSettings()
    assert settings.enabled
    assert settings.domain == "https://open.larksuite.com"
    assert settings.mode == "long_connection" and settings.enroll == "closed"
    described = settings.describe() + repr(settings)
    assert "very-secret" not in described and "ek-secret" not in described


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError):
        FeishuSettings(mode="carrier_pigeon")  # type: ignore[arg-type]


def test_the_time_zone_is_beijings_unless_set_and_an_unknown_one_is_refused_by_name() -> None:
    assert FeishuSettings().time_zone == "Asia/Shanghai"
    assert FeishuSettings(time_zone="Europe/Berlin").time_zone == "Europe/Berlin"
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        FeishuSettings(time_zone="Mars/Olympus")
    with pytest.raises(ValueError, match="unknown time zone"):
        FeishuSettings(time_zone="../../etc/passwd")


def webhook_settings(**kw: object) -> FeishuSettings:
    return FeishuSettings(app_id="cli_x", app_secret=SecretStr("s"), **kw)  # type: ignore[arg-type]


def test_a_webhook_without_an_encrypt_key_is_a_startup_problem_naming_both_variables() -> None:
    problem = webhook_settings(verification_token=SecretStr("vt")).startup_problem()
    assert problem is not None and "\n" not in problem
    assert "AMUX_FEISHU_ENCRYPT_KEY" in problem and "AMUX_FEISHU_ALLOW_UNENCRYPTED" in problem


@pytest.mark.parametrize(
    "settings",
    [
        # Built at collection, before any fixture clears the environment: defaults, read from none.
        FeishuSettings.model_construct(),
        webhook_settings(encrypt_key=SecretStr("ek")),
        webhook_settings(verification_token=SecretStr("vt"), allow_unencrypted=True),
        webhook_settings(mode="long_connection"),
    ],
    ids=["bot-off", "encrypted", "explicitly-allowed", "long-connection"],
)
def test_these_settings_may_start(settings: FeishuSettings) -> None:
    assert settings.startup_problem() is None


def test_allowing_unencrypted_webhooks_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert FeishuSettings().allow_unencrypted is False
    monkeypatch.setenv("AMUX_FEISHU_ALLOW_UNENCRYPTED", "true")
    assert FeishuSettings().allow_unencrypted is True


@pytest.mark.parametrize(
    ("secrets", "missing"),
    [
        ({"encrypt_key": "ek"}, ()),
        ({"encrypt_key": "ek", "verification_token": "vt"}, ()),
        ({"verification_token": "vt", "allow_unencrypted": True}, ()),
        ({"verification_token": "vt"}, ("AMUX_FEISHU_ENCRYPT_KEY",)),
        ({"allow_unencrypted": True}, ("AMUX_FEISHU_VERIFICATION_TOKEN",)),
        ({}, ("AMUX_FEISHU_ENCRYPT_KEY", "AMUX_FEISHU_VERIFICATION_TOKEN")),
    ],
    ids=["key", "key-and-token", "token-allowed", "token-only", "allowed-only", "none"],
)
async def test_serve_and_doctor_need_the_same_webhook_secrets(
    secrets: dict[str, object], missing: tuple[str, ...]
) -> None:
    settings = FeishuSettings(app_id="cli_x", app_secret=SecretStr("s"), **secrets)  # type: ignore[arg-type]
    assert settings.webhook_secrets_missing() == missing
    assert (settings.startup_problem() is None) == (not missing)
    # Nothing listens on port 1: a set-up with its secrets gets as far as probing the Hub.
    checked = await check_feishu_ingress(settings, "http://127.0.0.1:1")
    verified = "events cannot be verified" not in checked.detail
    assert verified == (not missing), checked
    if missing:
        assert " and ".join(missing) in checked.detail
