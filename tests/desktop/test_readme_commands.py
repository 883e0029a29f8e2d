"""The README's two set-up commands are the ones CI runs.

README.md must have a section whose heading starts with "Run" (e.g. "## Run") and one whose heading
starts with "Test" ("## Test", "### Testing"), each with a ```bash fenced block holding the one command.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def section_command(text: str, first_word: str) -> str:
    """The command in the first ```bash block under the first heading whose first word starts with first_word."""
    in_section = in_block = False
    lines: list[str] = []
    for line in text.splitlines():
        if in_block:
            if line.strip().startswith("```"):
                commands = [c.strip() for c in lines if c.strip() and not c.strip().startswith("#")]
                assert len(commands) == 1, (
                    f"the {first_word!r} section's bash block should hold one command: {commands}"
                )
                return commands[0]
            lines.append(line)
            continue
        heading = HEADING.match(line)
        if heading:
            words = heading.group(1).split()
            in_section = bool(words) and words[0].lower().startswith(first_word.lower())
        elif in_section and line.strip() == "```bash":
            in_block = True
    pytest.fail(f"README.md has no section titled {first_word!r}... with a ```bash block")


def ci_commands() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith(("#", "set ", "cd "))]


def ci_test_command() -> str:
    """The line of .ci/run that installs and runs the suite (the GPU check's CPU mode follows it)."""
    found = [c for c in ci_commands() if "install.sh" in c and "pytest" in c]
    assert len(found) == 1, ci_commands()
    return found[0]


@pytest.fixture(scope="module")
def readme() -> str:
    if not README.exists():
        pytest.skip("README.md does not exist yet")
    return README.read_text(encoding="utf-8")


def test_readme_test_command_is_what_ci_runs(readme):
    assert section_command(readme, "Test") == ci_test_command()


def test_readme_run_command_installs_like_ci_and_starts_the_app(readme):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ci_install, _ = (part.strip() for part in ci_test_command().split("&&", 1))
    install, start = (part.strip() for part in section_command(readme, "Run").split("&&", 1))
    assert install == ci_install.replace(" --test", "")  # same script, without the test tools
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["gui-scripts"]
    assert start in {f".venv/bin/{name}" for name in scripts}
