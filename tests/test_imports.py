"""No import circles in ``django_dynlock`` (issue 36; docs/architecture.md, "Imports").

Every module of the package is parsed (never imported) and each of its imports of another
module of the package is an edge: at module level, inside a function (a lazy import) or
under ``if TYPE_CHECKING:`` alike, for a lazy or type-only import still ties the two
modules' designs together (and mypy follows it). Relative imports are resolved, and
``from .x import y`` points at ``x.y`` when that is a module. The strongly connected
components of that graph are the circles.

The engine's type-only imports in ``KNOWN_ENGINE_CIRCLE`` are the only ones tolerated, and
the list can only shrink: a known edge that is gone, or no longer closes a circle, fails
the test until it is dropped from the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_dynlock"

# The engine's type-only imports tolerated in a circle: none is left (issue 36), so any
# circle fails. An import named here is one the design has not yet removed.
KNOWN_ENGINE_CIRCLE: set[tuple[str, str]] = set()

Edge = tuple[str, str]


@dataclass(frozen=True)
class Import:
    """One import statement of one package module by another."""

    source: str
    target: str
    path: str  # relative to the checkout
    line: int
    kind: str  # "module level", "lazy" (in a function) or "type-only" (if TYPE_CHECKING)

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line}, {self.kind})"


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportFinder(ast.NodeVisitor):
    """Collects each import statement with the context it runs in."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self.kind = "module level"

    def _within(self, kind: str, nodes: list[ast.stmt]) -> None:
        outer, self.kind = self.kind, kind if self.kind == "module level" else self.kind
        for node in nodes:
            self.visit(node)
        self.kind = outer

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._within("type-only", node.body)
            for other in node.orelse:
                self.visit(other)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._within("lazy", node.body)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._within("lazy", node.body)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.kind))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self.kind))


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _targets(
    node: ast.Import | ast.ImportFrom, source: str, is_package: bool, package: str, modules: dict[str, Path]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _in_package(alias.name, package):
                yield alias.name
        return
    if node.level:
        base = source.split(".") if is_package else source.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if not _in_package(module, package):
        return
    for alias in node.names:
        submodule = f"{module}.{alias.name}"
        yield submodule if submodule in modules else module


def package_imports(root: Path, package: str) -> list[Import]:
    """Every import of a package module by another, wherever in the module it is."""
    modules = package_modules(root, package)
    imports = []
    for source, path in modules.items():
        finder = _ImportFinder()
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        for node, kind in finder.found:
            # One statement may name several members of one module: one import.
            for target in dict.fromkeys(_targets(node, source, path.name == "__init__.py", package, modules)):
                if target not in modules:
                    raise AssertionError(f"{path}:{node.lineno} imports {target}, which is no module of {package}")
                imports.append(Import(source, target, str(path.relative_to(root)), node.lineno, kind))
    return imports


def circles(edges: set[Edge]) -> list[list[str]]:
    """The graph's strongly connected components that form a circle (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for source, target in sorted(edges):
        graph.setdefault(source, []).append(target)
        graph.setdefault(target, [])
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or (node, node) in edges:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            connect(node)
    return sorted(found)


def describe(found: list[list[str]], imports: list[Import]) -> str:
    """Each circle's modules and the imports that tie them, for the failure message."""
    lines = []
    for members in found:
        inside = set(members)
        lines.append(f"a circle of {len(members)} modules: {', '.join(members)}; its imports:")
        lines.extend(f"    {i}" for i in imports if i.source in inside and i.target in inside)
    return "\n".join(lines)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return package_imports(ROOT, PACKAGE)


def test_no_import_circles_but_the_known_engine_edges(imports):
    edges = {(i.source, i.target) for i in imports} - KNOWN_ENGINE_CIRCLE
    found = circles(edges)
    assert not found, (
        "import circles in django_dynlock (docs/architecture.md, 'Imports': a module may not import, even "
        "lazily or for type checking only, a module that imports it back):\n" + describe(found, imports)
    )


def test_each_known_engine_edge_still_closes_a_circle(imports):
    edges = {(i.source, i.target) for i in imports}
    together = {frozenset(members) for members in circles(edges)}
    stale = [
        edge
        for edge in sorted(KNOWN_ENGINE_CIRCLE)
        if edge not in edges or not any(edge[0] in members and edge[1] in members for members in together)
    ]
    assert not stale, f"KNOWN_ENGINE_CIRCLE names imports that no longer close a circle: drop {stale} from it"


def test_no_module_imports_another_modules_private_names():
    """What two modules share is public in one of them (as the key templates are in
    keytemplates.py, for decorators.py and celery.py): a private name stays in its module."""
    private = []
    for path in package_modules(ROOT, PACKAGE).values():
        finder = _ImportFinder()
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        for node, _ in finder.found:
            if isinstance(node, ast.ImportFrom) and (node.level or _in_package(node.module or "", PACKAGE)):
                private.extend(
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.endswith("__")
                )
    assert not private, "private names imported from another module:\n" + "\n".join(private)


def test_the_finder_counts_lazy_type_only_and_relative_imports(tmp_path):
    """The check itself on a made-up package: a circle made only of lazy, type-only and
    relative imports is found, and one edge less is none."""
    files = {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import b\nclass A: ...\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from .. import c\n",
        "pkg/c.py": "import os\nimport pkg.a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = package_imports(tmp_path, "pkg")
    assert {(i.source, i.target, i.kind) for i in found} == {
        ("pkg", "pkg.a", "module level"),
        ("pkg.a", "pkg.sub.b", "type-only"),
        ("pkg.sub.b", "pkg.c", "lazy"),
        ("pkg.c", "pkg.a", "module level"),
    }
    edges = {(i.source, i.target) for i in found}
    assert circles(edges) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert circles(edges - {("pkg.sub.b", "pkg.c")}) == []
