"""The suite's own habits: test modules share helpers through plain modules, never through
``conftest.py`` or one another, and every registered marker marks something."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def imported_modules(path: Path) -> set[str]:
    """The last part of every module ``path`` imports from, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Import):
            names.update(alias.name.rsplit(".", 1)[-1] for alias in node.names)
    return names


def test_no_module_imports_conftest_or_a_test_module():
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in TESTS.rglob("*.py")
        for name in imported_modules(path)
        if name == "conftest" or name.startswith("test_")
    }
    assert not offenders, sorted(offenders)


def test_every_registered_marker_is_used():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    registered = {line.split(":")[0] for line in options["ini_options"]["markers"]}
    source = "\n".join(path.read_text() for path in TESTS.rglob("*.py"))
    used = set(re.findall(r"pytest\.mark\.(\w+)", source))
    assert registered <= used, f"registered but never used: {sorted(registered - used)}"
