"""The Feishu app ``amux feishu setup`` created, kept in ``<AMUX_HOME>/feishu-app.json``.

The file holds the app's credentials, so it is written mode 0600 and whole (a temporary file,
fsynced, renamed over the old one): a crash leaves the old file or the new one, never half of
either. Only someone who may write AMUX_HOME (the operator) can write it, which is why it may also
name the Feishu user who becomes the owner: the person who scanned the set-up QR code.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from bot.config import FeishuSettings
from hub.errors import InvalidArgument

APP_FILE = "feishu-app.json"
Brand = Literal["feishu", "lark"]


@dataclass(frozen=True)
class SavedApp:
    app_id: str
    app_secret: str
    brand: Brand
    # The open-platform base URL the bot calls (Feishu's, Lark's, or a private deployment's).
    domain: str
    # Where the app was registered; `amux feishu setup --update` goes there again.
    accounts_domain: str
    # The scanner's open_id for this app: the Feishu owner, unless the Hub has one already.
    owner_open_id: str
    mode: Literal["long_connection"] = "long_connection"


def app_path(home: Path) -> Path:
    return home / APP_FILE


def load(home: Path) -> SavedApp | None:
    """The saved app, or None when there is none.

    Raises:
        InvalidArgument: the file exists but is not one ``amux feishu setup`` wrote.
    """
    path = app_path(home)
    try:
        raw = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        # No app saved; a home that is no directory is the Hub's to report.
        return None
    except OSError as error:
        raise InvalidArgument(f"cannot read {path}: {error.strerror or error}") from None
    try:
        data = json.loads(raw)
        app = SavedApp(
            app_id=_text(data, "app_id"),
            app_secret=_text(data, "app_secret"),
            brand="lark" if data.get("brand") == "lark" else "feishu",
            domain=_text(data, "domain").rstrip("/"),
            accounts_domain=_text(data, "accounts_domain").rstrip("/"),
            owner_open_id=str(data.get("owner_open_id") or ""),
        )
    except (ValueError, AttributeError, KeyError):
        raise InvalidArgument(
            f"{path} is not a Feishu app saved by `amux feishu setup`: run it again, or remove "
            "the file and set AMUX_FEISHU_APP_ID and AMUX_FEISHU_APP_SECRET"
        ) from None
    return app


def _text(data: dict[str, object], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise ValueError(key)
    return value


def save(home: Path, app: SavedApp) -> Path:
    """Write ``app`` whole, mode 0600, replacing any saved before; its path."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = app_path(home)
    body = json.dumps(asdict(app), indent=2).encode("utf-8") + b"\n"
    # mkstemp creates it 0600 before a byte is written: the secret is never readable by others.
    fd, name = tempfile.mkstemp(dir=home, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(home, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def loose_mode(path: Path) -> int | None:
    """The file's permission bits when others than its owner may read or write it, else None."""
    bits = stat.S_IMODE(path.stat().st_mode)
    return bits if bits & 0o077 else None


def resolve(home: Path, exported: FeishuSettings) -> tuple[FeishuSettings, SavedApp | None, str]:
    """The bot's settings: the exported ones when they name an app, else the saved app's.

    Also the saved app that is used (None when the exported variables win or nothing is saved)
    and one line for the log saying which it is.
    """
    path = app_path(home)
    if exported.enabled:
        if path.exists():
            return (
                exported,
                None,
                (
                    f"Feishu app {exported.app_id} from AMUX_FEISHU_APP_ID: exported variables win "
                    f"over the app saved in {path}"
                ),
            )
        return exported, None, f"Feishu app {exported.app_id} from AMUX_FEISHU_APP_ID"
    saved = load(home)
    if saved is None:
        return exported, None, ""
    settings = exported.model_copy(
        update={
            "app_id": saved.app_id,
            "app_secret": SecretStr(saved.app_secret),
            "domain": saved.domain,
            "mode": saved.mode,
        }
    )
    return (
        settings,
        saved,
        (f"Feishu app {saved.app_id} ({saved.brand}) from {path}, saved by `amux feishu setup`"),
    )
