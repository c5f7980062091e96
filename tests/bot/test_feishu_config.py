import pytest

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
