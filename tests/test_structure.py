"""Shape rules for app/ and engine/ (issues 54, 64): no module over 500 lines, no class over 30 methods, no function
over 60 lines, no import circle between modules or between packages.

Imports made only under `if TYPE_CHECKING:` never run, so they make no circle: grimp counts them, this test
finds them with ast and leaves them out. Imports inside functions run, so they count.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app")
MAX_MODULE_LINES = 500
MAX_CLASS_METHODS = 30
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@cache  # parsed once for the three size tests
def _trees() -> list[tuple[str, str, ast.Module]]:
    return [
        (str(p.relative_to(ROOT)), text, ast.parse(text, str(p)))
        for p in _sources()
        for text in [p.read_text(encoding="utf-8")]
    ]


def test_no_module_is_over_500_lines():
    long = [
        f"{name} ({len(text.splitlines())} lines)"
        for name, text, _ in _trees()
        if len(text.splitlines()) > MAX_MODULE_LINES
    ]
    assert not long, "modules over 500 lines:\n" + "\n".join(long)


def test_no_class_has_over_30_methods():
    big = []
    for name, _, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                if methods > MAX_CLASS_METHODS:
                    big.append(f"{name}:{node.lineno} {node.name} ({methods} methods)")
    assert not big, "classes over 30 methods:\n" + "\n".join(big)


def test_no_function_is_over_60_lines():
    long = []
    for name, _, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def _is_type_checking(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
    )


def _guarded_import_lines(source: str) -> frozenset[int]:
    """The line numbers of the imports made only under `if TYPE_CHECKING:` (its else branch runs)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return frozenset(lines)


@cache
def _type_checking_lines(module: str) -> frozenset[int]:
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return _guarded_import_lines(path.read_text(encoding="utf-8"))


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of app/ and engine/ it imports where the import runs."""
    # tests/app and tests/engine (no __init__) are on the path too, but only as namespace portions: the root, on
    # the path by pyproject.toml's pythonpath, holds the real packages, and a regular package wins
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            details = graph.get_import_details(importer=importer, imported=imported)
            skipped = _type_checking_lines(importer)
            if any(d["line_number"] not in skipped for d in details):
                edges[importer].add(imported)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_are_left_out():
    source = (
        "import typing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import b\n"
        "    import c\nelse:\n    import d\nif typing.TYPE_CHECKING:\n    import e\nimport f\n"
    )
    assert _guarded_import_lines(source) == {4, 5, 9}


def test_no_import_circle():
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(", ".join(sorted(c)) for c in circles)


def _package(module: str) -> str:
    """The package a module belongs to: engine.decoding.step -> engine.decoding; a package is its own."""
    path = ROOT / Path(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def test_no_import_circle_between_packages():
    edges: dict[str, set[str]] = {}
    for module, imported in _import_graph().items():
        edges.setdefault(_package(module), set()).update(
            _package(m) for m in imported if _package(m) != _package(module)
        )
    # a package's __init__ importing its own subpackages is not a circle between them
    for package, targets in edges.items():
        targets.difference_update(
            t for t in list(targets) if t.startswith(package + ".") or package.startswith(t + ".")
        )
    circles = _circles(edges)
    assert not circles, "import circles between packages:\n" + "\n".join(", ".join(sorted(c)) for c in circles)
