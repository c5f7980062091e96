"""The packages import one way only: a wrong-direction import fails here.

bot (the Feishu bot and the composition root) may use every other package; runtime_bridge reaches
the Hub only through its client; hub and cards import nothing of ours, so a Hub mounted alone
needs none of the bot.
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
# rest through ``hub.services.Hub``, so no rule is written a second time outside hub/.
HUB_INTERNALS = ("hub.store", "hub.history")
# Of the state module, outside hub/ only its value types; bot/identity.py resolves Feishu senders
# to Principals against the state database itself, the one place that still opens it.
STATE_NAMES_OUTSIDE = {"Principal"}
STATE_NAMES_BY_FILE = {"bot/identity.py": {"Principal", "State"}}


def state_names(path: Path) -> list[tuple[int, str]]:
    """The names ``path`` imports from ``hub.state`` (``*`` for the module itself)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "hub.state" and not node.level:
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "hub" and not node.level:
            found += [(node.lineno, "*") for alias in node.names if alias.name == "state"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, "*") for alias in node.names if alias.name == "hub.state"]
    return found


@pytest.mark.parametrize("package", [p for p in OURS if p != "hub"])
def test_nothing_outside_the_hub_reaches_its_storage(package: str) -> None:
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        name = str(path.relative_to(REPO))
        for line, module in imported_modules(path):
            if any(module == m or module.startswith(m + ".") for m in HUB_INTERNALS):
                wrong.append(f"{name}:{line} imports {module}")
        permitted = STATE_NAMES_BY_FILE.get(name, STATE_NAMES_OUTSIDE)
        for line, imported in state_names(path):
            if imported not in permitted:
                wrong.append(f"{name}:{line} imports {imported} from hub.state")
    assert wrong == []


def test_the_storage_rule_catches_a_store_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from hub.store import ABSENT\nfrom hub.state import State, Principal\nimport hub.state\n"
    )
    modules = [module for _, module in imported_modules(sample)]
    assert [m for m in modules if m in HUB_INTERNALS] == ["hub.store"]
    names = [name for _, name in state_names(sample)]
    assert [n for n in names if n not in STATE_NAMES_OUTSIDE] == ["State", "*"]
