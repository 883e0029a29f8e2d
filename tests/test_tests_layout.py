"""The tests' own layout (issue 64): shared helpers and fixtures live in tests/support (imported as `support`) and in
conftest fixtures; no test imports another test module or a conftest by name, and nothing edits sys.path. A test
that imported another ran that module's tests' imports twice and picked the wrong conftest when tests/app and
tests/engine were collected together."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SOURCES = sorted(TESTS.rglob("*.py"))


def imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_or_conftest_is_imported_and_sys_path_is_left_alone(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for line, module in imported_modules(tree):
        first = module.split(".")[0]
        assert not (first == "conftest" or first.startswith("test_") or module.startswith("tests.")), (
            f"{path.name}:{line} imports {module}: shared code goes to tests/support"
        )
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            pytest.fail(f"{path.name}:{node.lineno} uses sys.path: pyproject.toml's pythonpath puts tests/ on it")


def test_the_helpers_are_a_package_and_collect_no_tests():
    support = TESTS / "support"
    assert (support / "__init__.py").is_file()
    assert not list(support.glob("test_*.py")), "tests/support holds helpers, not tests"
