"""The packages import one way only (DESIGN.md): a wrong-direction import fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("hub", "bot", "runtime_bridge", "cards")

# What each package may import of ours. runtime_bridge reaches the Hub only through its client,
# its settings and its wire errors, never the store or the state.
ALLOWED: dict[str, set[str]] = {
    "cards": {"cards"},
    "hub": {"hub"},
    "runtime_bridge": {
        "runtime_bridge",
        "hub.client",
        "hub.config",
        "hub.errors",
        "hub.requestid",
    },
    "bot": {"bot", "hub", "runtime_bridge", "cards"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
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


def test_the_rule_catches_a_wrong_direction(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from hub.store import MemoryStore\nimport bot.app\n")
    modules = [module for _, module in imported_modules(sample)]
    assert [m for m in modules if not allowed("runtime_bridge", m)] == ["hub.store", "bot.app"]
