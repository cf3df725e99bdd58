"""The layers of docs/architecture.md, checked against the code.

The page's two tables are the rules, read from the page itself so that it cannot drift:

- every module of the package belongs to one layer, and imports (at module level) only
  modules of its own layer or of those below it;
- the imports have no cycle, counting those made inside a function: each module's
  dependencies point one way, not only the order Python imports them in;
- the pure core and the store contract import nothing of Django's ORM, the models or the
  engine, even through what they import: each is imported alone in a fresh interpreter,
  with no settings, and the modules it pulled in are listed;
- an import made inside a function, to load a module later, is one of those the page
  lists with its reason.
"""

from __future__ import annotations

import ast
import graphlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "durable_django"
PAGE = ROOT / "docs" / "architecture.md"

#: What the lowest layers must not pull in, even indirectly: by layer number.
FORBIDDEN = {
    1: ("django.db", "durable_django.models", "durable_django.engines"),
    2: ("django.db.models", "durable_django.models", "durable_django.engines"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    lazy: bool  # made inside a function


#: The internal packages the page names modules without.
INTERNAL = ("_core", "_rules", "_runtime")


def full_name(name: str) -> str:
    """``engines`` -> ``durable_django.engines``; ``concurrency`` ->
    ``durable_django._rules.concurrency`` (an internal module, named without its package);
    the package itself is ``durable_django``."""
    if name == "durable_django":
        return name
    first = name.split(".")[0]
    for package in INTERNAL:
        if any((PACKAGE / package / f"{first}{end}").exists() for end in (".py", "")):
            return f"durable_django.{package}.{name}"
    return f"durable_django.{name}"


def table_rows(heading: str) -> list[list[str]]:
    """The body rows of the first table under ``heading`` on the page, as cells."""
    text = PAGE.read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [row for row in rows[1:] if not set(row[0]) <= set("-: ")]


@cache
def layers() -> dict[str, int]:
    """Each module or package the page places, with its layer's number."""
    placed = {}
    for cell, modules, _ in table_rows("## The layers"):
        number = int(cell.split(".")[0].strip("* "))
        for name in re.findall(r"`([\w.]+)`", modules):
            placed[full_name(name)] = number
    return placed


def layer_of(module: str) -> int:
    """The layer of the longest name the page places that is ``module`` or a package
    above it."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in layers():
            return layers()[name]
    raise LookupError(module)


@cache
def lazy_imports_listed() -> set[tuple[str, str]]:
    pairs = set()
    for importer, imported, _ in table_rows("## Imports made later"):
        source = re.match(r"`([\w.]+)", importer)
        assert source, importer
        for name in re.findall(r"`([\w.]+)`", imported):
            pairs.add((full_name(source.group(1)), full_name(name)))
    return pairs


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str, path: Path, *, annotations: bool = False) -> Iterator[Import]:
    """The package's own modules that ``module`` imports; with ``annotations``, those it
    imports for type checking only (under ``if TYPE_CHECKING:``), instead."""
    known = modules()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        source = node.module or ""
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*base, node.module] if node.module else base)
        # ``from . import starting`` imports the module ``starting``.
        names = [f"{source}.{alias.name}" for alias in node.names]
        return [name for name in names if name in known] or [source]

    def walk(node: ast.AST, lazy: bool, typing: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inside = typing or _is_type_checking(child)
            if isinstance(child, ast.Import | ast.ImportFrom) and inside == annotations:
                for target in targets(child):
                    if target.split(".")[0] == "durable_django":
                        yield Import(module, target, child.lineno, lazy)
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from walk(child, inner, inside)

    yield from walk(ast.parse(path.read_text()), lazy=False, typing=False)


@cache
def all_imports() -> list[Import]:
    return [found for module, path in modules().items() for found in imports_of(module, path)]


def test_every_module_has_a_layer():
    unplaced = []
    for module in modules():
        try:
            layer_of(module)
        except LookupError:
            unplaced.append(module)
    assert unplaced == [], f"add these to the layers table of {PAGE.name}: {unplaced}"


def test_the_page_places_only_modules_that_exist():
    stale = sorted(set(layers()) - set(modules()))
    assert stale == [], f"the layers table of {PAGE.name} names modules that do not exist"


def test_modules_import_only_their_layer_and_those_below():
    upward = [
        f"{found.importer} (layer {layer_of(found.importer)}) imports {found.imported} "
        f"(layer {layer_of(found.imported)}) at line {found.line}"
        for found in all_imports()
        if not found.lazy and layer_of(found.imported) > layer_of(found.importer)
    ]
    assert upward == []


def cycle(imports: list[Import]) -> list[str]:
    """A cycle of ``imports``, as the modules along it, or ``[]`` when they have none."""
    graph: dict[str, set[str]] = {module: set() for module in modules()}
    for found in imports:
        if found.imported != found.importer:
            graph[found.importer].add(found.imported)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def test_module_level_imports_have_no_cycle():
    assert cycle([found for found in all_imports() if not found.lazy]) == []


def test_imports_have_no_cycle_counting_those_made_later():
    assert cycle(all_imports()) == [], "a low module reaches back up, when first called"


def test_a_cycle_made_later_is_found():
    """The test above can fail: the import that once put the whole package under the
    engine (an error asking the default engine for its holders) makes a cycle."""
    made_later = Import("durable_django.errors", "durable_django.engines", 0, lazy=True)
    found = cycle([*all_imports(), made_later])
    assert {"durable_django.errors", "durable_django.engines"} <= set(found)


def test_below_the_engine_no_module_names_it_even_in_annotations():
    """The modules below the engine take it as a ``runtime.Runtime``: not even an import
    under ``if TYPE_CHECKING:`` reaches back up to it."""
    engines = "durable_django.engines"
    naming = sorted(
        found.importer
        for module, path in modules().items()
        if layer_of(module) < layer_of(engines)
        for found in imports_of(module, path, annotations=True)
        if found.imported == engines
    )
    assert naming == [], "annotate the engine as a durable_django._core.runtime.Runtime"


def test_annotations_have_no_cycle():
    """Counting the imports made for type checking too, the package has no cycle."""
    typing_only = [
        found
        for module, path in modules().items()
        for found in imports_of(module, path, annotations=True)
    ]
    assert cycle([*all_imports(), *typing_only]) == []


def test_imports_made_later_are_the_ones_the_page_lists():
    made = {(found.importer, found.imported) for found in all_imports() if found.lazy}
    assert made - lazy_imports_listed() == set(), f"explain these in {PAGE.name}"
    assert lazy_imports_listed() - made == set(), f"{PAGE.name} lists imports no longer made"


#: A fresh interpreter imports one module alone. The package's ``__init__`` (the public
#: API, which imports the engine on purpose) and those of its subpackages are not run:
#: each parent package is an empty one over the same directory, so what gets imported
#: is the module's own imports and theirs.
IMPORT_ALONE = """
import importlib, json, sys, types
name, root = sys.argv[1], sys.argv[2]
parts = name.split(".")
for end in range(1, len(parts)):
    package = types.ModuleType(".".join(parts[:end]))
    package.__path__ = [root + "/" + "/".join(parts[:end])]
    sys.modules[package.__name__] = package
before = set(sys.modules)
importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def pulled_in(module: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALONE, module, str(ROOT)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "module", sorted(m for m in modules() if layer_of(m) in FORBIDDEN and m != "durable_django")
)
def test_the_lowest_layers_import_nothing_above_them(module: str):
    layer = layer_of(module)
    loaded = pulled_in(module)
    assert module in loaded
    forbidden = [
        name
        for name in loaded
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert forbidden == [], f"{module} pulls in {forbidden}"
    above = [
        name for name in loaded if name.startswith("durable_django.") and layer_of(name) > layer
    ]
    assert above == [], f"{module} (layer {layer}) pulls in {above}"
