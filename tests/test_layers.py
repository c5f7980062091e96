"""The packages import one way only: a wrong-direction import fails here.

bot (the Feishu bot and the composition root) may use every other package; runtime_bridge reaches
the Hub only through its client; hub and cards import nothing of ours, so a Hub mounted alone
needs none of the bot. Outside hub/ nothing touches the Hub's storage: the bot, in the Hub's own
process, calls its services; everything else calls ``HubClient``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("hub", "bot", "runtime_bridge", "cards")

# What each package may import of ours. runtime_bridge reaches the Hub only through its client,
# its settings, the execution contract and its wire errors, never the store or the state; it also
# opens its own database with hub.sqlite, a leaf that imports nothing of ours but hub.errors
# (checked below).
ALLOWED: dict[str, set[str]] = {
    "cards": {"cards"},
    "hub": {"hub"},
    "runtime_bridge": {
        "runtime_bridge",
        "hub.client",
        "hub.config",
        "hub.contract",
        "hub.errors",
        "hub.requestid",
        "hub.sqlite",
    },
    "bot": {"bot", "hub", "runtime_bridge", "cards"},
}


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it, relative imports resolved to full names."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    package = list(path.parent.relative_to(REPO).parts) if path.is_relative_to(REPO) else []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:
                # ``from .. import x``: each name may be a module of its own.
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
    return found


def allowed(package: str, module: str) -> bool:
    return any(module == rule or module.startswith(rule + ".") for rule in ALLOWED[package])


@pytest.mark.parametrize("package", OURS)
def test_packages_import_only_inward(package: str) -> None:
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in OURS and not allowed(package, module):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert wrong == []


# Modules runtime_bridge may use although they live in hub/: leaves, so allowing one lets
# nothing else of the Hub in behind it.
HUB_LEAVES = ("hub.errors", "hub.sqlite")


@pytest.mark.parametrize("module", HUB_LEAVES)
def test_the_hub_leaves_the_runtime_may_use_import_nothing_more_of_ours(module: str) -> None:
    path = REPO.joinpath(*module.split(".")).with_suffix(".py")
    ours = [m for _, m in imported_modules(path) if m.split(".")[0] in OURS]
    assert [m for m in ours if m not in HUB_LEAVES] == []


def test_the_rule_catches_a_wrong_direction(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from hub.store import MemoryStore\nimport bot.service.app\n")
    modules = [module for _, module in imported_modules(sample)]
    assert [m for m in modules if not allowed("runtime_bridge", m)] == [
        "hub.store",
        "bot.service.app",
    ]
    assert [m for m in modules if not allowed("hub", m)] == ["bot.service.app"]


def test_relative_imports_count_as_the_modules_they_name() -> None:
    sample = REPO / "hub" / "not_a_module.py"
    source = "from ..bot import logs\nfrom .. import bot\nfrom . import rpc\nfrom .rpc import HUB\n"
    modules = [module for _, module in imported_modules(sample, source)]
    assert modules == ["bot", "bot", "hub.rpc", "hub.rpc"]
    assert [m for m in modules if not allowed("hub", m)] == ["bot", "bot"]


# The Hub's storage is its own: memory goes through the memory service (``hub.memory``) and the
# rest through the services on ``hub.services.Hub`` (people, chat preferences, turns, settings),
# so no rule is written a second time outside hub/. runtime_bridge and cards cannot import these
# at all (ALLOWED above); in bot/ only the composition root, which opens the Hub, may.
HUB_STORAGE = (
    "hub.state",
    "hub.store",
    "hub.history",
    "hub.migrations",
    "hub.search",
    "hub.storage",
)
COMPOSITION_ROOTS = ("bot/service/",)
# The bot's own databases (its delivery queue, the events it has seen, the topics read), never
# the Hub's.
SQLITE_FILES = {"bot/outbox.py", "bot/feishu/dedup.py", "bot/topic_context.py"}
# The Hub's storage attributes, which a module handed the Hub could still reach without an import.
STORAGE_ATTRIBUTES = {"state", "store", "history"}


def is_storage(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in HUB_STORAGE)


def storage_reached(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Where ``path`` reaches the Hub's storage: ``<hub>.state`` (or ``.store``, ``.history``) on
    something named the Hub (``hub``, ``self._hub``, ``app[HUB]``)."""
    text = path.read_text(encoding="utf-8") if source is None else source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.Attribute) or node.attr not in STORAGE_ATTRIBUTES:
            continue
        owner = node.value
        if (
            (isinstance(owner, ast.Name) and owner.id == "hub")
            or (isinstance(owner, ast.Attribute) and owner.attr in ("hub", "_hub"))
            or (
                isinstance(owner, ast.Subscript)
                and isinstance(owner.slice, ast.Name)
                and owner.slice.id == "HUB"
            )
        ):
            found.append((node.lineno, node.attr))
    return sorted(found)


def storage_breaches(name: str, path: Path, source: str | None = None) -> list[str]:
    """What ``name`` (a path from the repository root) takes of the Hub's storage, or of SQLite
    outside the bot's own databases."""
    if name.startswith(COMPOSITION_ROOTS):
        return []
    text = path.read_text(encoding="utf-8") if source is None else source
    # ``from hub import state`` names the module as ``hub`` imports it.
    named = [
        (node.lineno, f"hub.{alias.name}")
        for node in ast.walk(ast.parse(text, filename=str(path)))
        if isinstance(node, ast.ImportFrom) and node.module == "hub" and not node.level
        for alias in node.names
    ]
    wrong = []
    for line, module in sorted(imported_modules(path, text) + named):
        if is_storage(module):
            wrong.append(f"{name}:{line} imports {module}")
        elif module.split(".")[0] == "sqlite3" and name not in SQLITE_FILES:
            wrong.append(f"{name}:{line} imports {module}")
    wrong += [
        f"{name}:{line} uses the Hub's .{attr}" for line, attr in storage_reached(path, source)
    ]
    return wrong


@pytest.mark.parametrize("package", [p for p in OURS if p != "hub"])
def test_nothing_outside_the_hub_reaches_its_storage(package: str) -> None:
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        name = str(path.relative_to(REPO))
        if package == "bot":
            wrong += storage_breaches(name, path)
        else:
            wrong += [
                f"{name}:{line} imports {module}"
                for line, module in imported_modules(path)
                if is_storage(module)
            ]
    assert wrong == []


def test_the_storage_rule_catches_a_wrong_import_or_a_reach_past_the_services() -> None:
    source = (
        "import sqlite3\n"
        "from hub.state import Principal\n"
        "from hub import migrations\n"
        "from hub.principals import Principal\n"
        "from hub.people import People\n"
        "def f(self, hub, app):\n"
        "    self._hub.state.principal('p')\n"
        "    hub.store.get('s', 'p')\n"
        "    app[HUB].history.open()\n"
        "    self._hub.memory.history(None, None, None)\n"
        "    self._hub.people.principal('p')\n"
    )
    path = REPO / "bot" / "not_a_module.py"
    assert storage_breaches("bot/not_a_module.py", path, source) == [
        "bot/not_a_module.py:1 imports sqlite3",
        "bot/not_a_module.py:2 imports hub.state",
        "bot/not_a_module.py:3 imports hub.migrations",
        "bot/not_a_module.py:7 uses the Hub's .state",
        "bot/not_a_module.py:8 uses the Hub's .store",
        "bot/not_a_module.py:9 uses the Hub's .history",
    ]
    # The bot's own databases may open SQLite, and the composition root opens the Hub.
    assert storage_breaches("bot/outbox.py", path, "import sqlite3\n") == []
    assert storage_breaches("bot/service/app.py", path, source) == []
    assert storage_breaches("bot/feishu/adapter.py", path, "import sqlite3\n") != []
