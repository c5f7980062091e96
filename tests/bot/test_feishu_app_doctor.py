"""`amux doctor` on the app `amux feishu setup` saved: the file (which app, where, mode 0600) and
what the app lacks of the scopes, events and callbacks amux uses, with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.commands.doctor import check_feishu_app_config, check_feishu_app_file, load_settings
from bot.config import FeishuSettings
from bot.feishu import saved_app
from hub.errors import InvalidArgument
from tests.fakes.feishu import FakeFeishu

UPDATE = "amux feishu setup --update"


def an_app(feishu_url: str = "https://open.feishu.cn") -> saved_app.SavedApp:
    return saved_app.SavedApp(
        app_id="cli_test",
        app_secret="secret",
        brand="feishu",
        domain=feishu_url,
        accounts_domain="https://accounts.feishu.cn",
        owner_open_id="ou_scanner",
    )


async def test_doctor_names_each_scope_and_event_the_app_lacks_and_the_fix() -> None:
    async with FakeFeishu() as feishu:
        settings = FeishuSettings(app_id="cli_test", app_secret="secret", domain=feishu.url)
        whole = await check_feishu_app_config(settings)
        assert whole.status == "ok", whole
        feishu.app_events.discard("im.message.recalled_v1")
        feishu.app_scopes.discard("cardkit:card:write")
        lacking = await check_feishu_app_config(settings)
        assert lacking.status == "fail"
        assert "cardkit:card:write" in lacking.detail
        assert "im.message.recalled_v1" in lacking.detail
        assert UPDATE in lacking.fix
        feishu.app_events.add("im.message.recalled_v1")
        only_scope = await check_feishu_app_config(settings)
        assert only_scope.status == "warn" and "cardkit:card:write" in only_scope.detail
        feishu.app_config_refused = True
        unread = await check_feishu_app_config(settings)
        assert unread.status == "warn" and UPDATE in unread.fix


def test_doctor_reports_the_saved_app_and_warns_when_others_may_read_it(tmp_path: Path) -> None:
    settings = FeishuSettings.model_construct()
    assert check_feishu_app_file(tmp_path, settings).status == "skip"
    path = saved_app.save(tmp_path, an_app())
    check = check_feishu_app_file(tmp_path, settings)
    assert check.status == "ok"
    assert "cli_test" in check.detail and "(feishu)" in check.detail
    assert str(path) in check.detail and "0600" in check.detail
    path.chmod(0o644)
    loose = check_feishu_app_file(tmp_path, settings)
    assert loose.status == "warn" and "0644" in loose.detail
    assert loose.fix == f"chmod 600 {path}"


def test_doctor_checks_the_saved_app_unless_an_exported_app_id_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMUX_HOME", str(tmp_path))
    saved_app.save(tmp_path, an_app("http://127.0.0.1:9"))
    settings, check = load_settings()
    assert settings is not None, check
    assert settings.feishu.app_id == "cli_test"
    assert settings.feishu.app_secret.get_secret_value() == "secret"
    assert settings.feishu.mode == "long_connection"
    assert settings.feishu.domain == "http://127.0.0.1:9"
    monkeypatch.setenv("AMUX_FEISHU_APP_ID", "cli_exported")
    settings, _ = load_settings()
    assert settings is not None and settings.feishu.app_id == "cli_exported"
    assert (
        "AMUX_FEISHU_APP_ID (cli_exported) wins"
        in check_feishu_app_file(tmp_path, settings.feishu).detail
    )


def test_serve_runs_the_saved_app_unless_an_app_id_is_exported_and_says_which(
    tmp_path: Path,
) -> None:
    assert saved_app.resolve(tmp_path, FeishuSettings()) == (FeishuSettings(), None, "")
    path = saved_app.save(tmp_path, an_app())
    settings, saved, line = saved_app.resolve(tmp_path, FeishuSettings(language="en_us"))
    assert saved == an_app() and settings.app_id == "cli_test"
    assert settings.mode == "long_connection" and settings.language == "en_us"
    assert line == f"Feishu app cli_test (feishu) from {path}, saved by `amux feishu setup`"
    exported = FeishuSettings(app_id="cli_exported")
    settings, saved, line = saved_app.resolve(tmp_path, exported)
    assert settings is exported and saved is None
    assert "exported variables win over the app saved in" in line


def test_a_damaged_saved_app_is_refused_with_one_line_naming_the_file(tmp_path: Path) -> None:
    path = saved_app.app_path(tmp_path)
    path.write_text('{"app_id": "cli_test"')
    with pytest.raises(InvalidArgument) as raised:
        saved_app.load(tmp_path)
    assert str(path) in raised.value.message
    assert "amux feishu setup" in raised.value.message
