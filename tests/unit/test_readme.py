"""README.md stays short and keeps the commands CI runs.

Contract: the README is under 12,000 characters, and its set-up and test commands are exactly the
ones `.ci/run` runs (set-up script, unit test command), plus the GPU suite command.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _ci_commands() -> list[str]:
    ci = (REPO / ".ci" / "run").read_text()
    found = [cmd for cmd in ("bash scripts/setup_env.sh", ".venv/bin/python -m pytest tests/unit -q") if cmd in ci]
    assert len(found) == 2, ".ci/run no longer runs the set-up script and the unit test command the README shows"
    return found


def test_readme_is_under_12000_characters():
    assert len(README) < 12_000, f"README.md has {len(README)} characters; move detail into docs/"


def test_readme_shows_the_commands_ci_runs():
    for command in _ci_commands():
        assert command in README, f"README.md does not show `{command}`, which .ci/run runs"


def test_readme_shows_the_gpu_suite_command():
    assert "pytest tests/functional -m gpu" in README
    assert "scripts/gpu/run_suite.sh" in README


def test_readme_links_point_at_files_that_exist():
    for path in sorted(set(re.findall(r"`((?:docs|scripts|tests)/[^`\s]+?)`", README))):
        path = path.rstrip("/")
        if path in {"docs/rules.md", "docs/cli.md", "docs/api.md"}:
            continue  # generated references, written by their own generators
        assert (REPO / path).exists(), f"README.md names {path}, which does not exist"
