"""Helpers and fixtures the tests share: local servers, tiny and damaged model files, pinned step costs, the
window's test helpers, what this build runs on, the fuzzer's watchdog.

Importable as `support` in every test (pyproject.toml's [tool.pytest.ini_options] pythonpath puts tests/ on the
path; tests/app and tests/engine have no __init__.py, and the real app/ and engine/ packages still win over them).
Modules here import each other relatively, so the scripts among them run from the repository root as
`python -m tests.support.<name>` too (screenshots, hostile_figures). Nothing here is collected as a test."""
