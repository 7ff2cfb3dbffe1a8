"""The generated references (docs/rules.md, docs/cli.md, docs/layout.md, docs/troubleshooting.md) are current,
and the check notices when not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from mbridge_ep_overlap.tools import gen_docs

ROOT = Path(__file__).resolve().parents[2]


def test_generated_pages_are_current():
    result = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap.tools.gen_docs", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + "\n(run: python -m mbridge_ep_overlap.tools.gen_docs --write)"


def test_a_stale_page_is_named(tmp_path):
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    fixtures = tmp_path / "tests/unit/fixtures"  # docs/troubleshooting.md counts diagnose's hits on the corpus
    for corpus in ("failure_reports", "failure_reports_unseen"):
        shutil.copytree(ROOT / "tests/unit/fixtures" / corpus, fixtures / corpus)
    shutil.copyfile(ROOT / "tests/unit/fixtures/corpus_causes.tsv", fixtures / "corpus_causes.tsv")
    for rel in gen_docs.PAGES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    assert gen_docs.stale(tmp_path) == []
    stale_one = sorted(gen_docs.PAGES)[0]
    (tmp_path / stale_one).write_text((tmp_path / stale_one).read_text() + "\nedited by hand\n")
    assert gen_docs.stale(tmp_path) == [stale_one]


def test_rule_command_prints_the_pages_section():
    from mbridge_ep_overlap.core.rules import RULES

    rule_id = RULES[0].id
    out = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap", "rule", rule_id], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() and out.stdout.strip() in (ROOT / "docs/rules.md").read_text()
    bad = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap", "rule", "no-such-rule-x"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
