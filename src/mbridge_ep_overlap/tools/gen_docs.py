"""The generated reference pages: write them, or check that the checked-in copies are current.

    python -m mbridge_ep_overlap.tools.gen_docs --write    # regenerate every page
    python -m mbridge_ep_overlap.tools.gen_docs --check    # exit 1 naming each stale page

Contract: ``PAGES`` maps each generated file (a path under the checkout) to the function that builds
its text from the code; every page opens with ``HEADER``. ``--check`` writes nothing and exits 0 when
every file holds exactly what its function builds, else 1 with one line per stale or missing file
on stderr; ``--write`` rewrites the files that differ and names them; bad usage exits 2 in one line.
``--root`` is the checkout (default: the one this module lives in, else the current folder).
Adding a generated page is adding one entry to ``PAGES``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ..diagnose import docs as troubleshooting
from .cli_docs import cli_page
from ..runtime.exits import OneLineArgumentParser, run_reporting_errors
from .layout_docs import layout_page
from .rule_docs import rules_page

COMMAND = "python -m mbridge_ep_overlap.tools.gen_docs --write"
HEADER = f"<!-- Generated from the code by `{COMMAND}`: do not edit by hand. -->\n\n"

PAGES: dict[str, Callable[[Path], str]] = {
    "docs/rules.md": lambda root: rules_page(),
    "docs/cli.md": cli_page,
    "docs/layout.md": layout_page,
    "docs/troubleshooting.md": lambda root: troubleshooting.body(
        root / "tests/unit/fixtures/failure_reports", root / "tests/unit/fixtures/corpus_causes.tsv",
        root / "tests/unit/fixtures/failure_reports_unseen"),
    # One more generated page is one more entry: its path, and a function of the checkout's root
    # returning its text.
}


def render(root: Path) -> dict[str, str]:
    """Every generated page's current text, by path."""
    return {path: HEADER + build(root) for path, build in PAGES.items()}


def stale(root: Path) -> list[str]:
    """The generated files whose checked-in text differs from what the code builds (or that are missing)."""
    return [path for path, text in render(root).items()
            if not (root / path).is_file() or (root / path).read_text() != text]


def write(root: Path) -> list[str]:
    """Rewrite the files that differ; the paths written."""
    written = []
    for path, text in render(root).items():
        file = root / path
        if not file.is_file() or file.read_text() != text:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text)
            written.append(path)
    return written


def default_root() -> Path:
    checkout = Path(__file__).resolve().parents[3]
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(prog="gen_docs", description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the pages that differ")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale page; write nothing")
    p.add_argument("--root", type=Path, default=None, help="the checkout (default: this module's own)")
    args = p.parse_args(argv)
    root = args.root or default_root()
    if not (root / "pyproject.toml").is_file():
        p.error(f"--root {root}: not a checkout (no pyproject.toml)")
    return run_reporting_errors("gen_docs", lambda: _run(root, args.write))


def _run(root: Path, write_them: bool) -> int:
    if write_them:
        written = write(root)
        print("\n".join(f"wrote {path}" for path in written) or "every generated page is current")
        return 0
    behind = stale(root)
    for path in behind:
        print(f"gen_docs: {path} is stale: run {COMMAND}", file=sys.stderr)
    if not behind:
        print(f"{len(PAGES)} generated pages are current")
    return 1 if behind else 0


if __name__ == "__main__":
    sys.exit(main())
