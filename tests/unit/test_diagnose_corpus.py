"""diagnose on the corpus of real upstream failure reports (verbatim logs), and the generated
docs/troubleshooting.md: current, and its hit-rate table computed, not written."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose, docs, upstream_source
from mbridge_ep_overlap.diagnose.signatures import all_signatures

CORPUS = Path(__file__).parent / "fixtures" / "failure_reports"
REPORTS = sorted(CORPUS.glob("*.json"))
KEYS = {"id", "project", "source_url", "title", "date", "log", "maintainers_cause", "cause", "symptom_class",
        "fix", "recognisable_from_log", "split"}


def test_corpus_is_complete_and_labelled():
    assert len(REPORTS) >= 25
    labels = docs.labels()
    ids = {s.id for s in all_signatures()}
    for f in REPORTS:
        report = json.loads(f.read_text())
        assert KEYS <= set(report), f.name
        assert report["split"] in ("dev", "holdout") and report["id"] == f.stem
        assert report["id"] in labels, f"{report['id']} has no expected cause in corpus_causes.tsv"
        expected = labels[report["id"]]
        if expected.startswith("upstream-check:"):  # a check named by file: that file is installed
            assert expected.split(":", 1)[1] in dict(upstream_source.sources()), expected
        else:
            assert expected in ids | {"-"}, expected
    assert set(labels) == {f.stem for f in REPORTS}


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.stem)
def test_every_report_gets_an_answer_without_a_traceback(path):
    report = json.loads(path.read_text())
    d = diagnose(["-"], stdin=io.BytesIO(report["log"].encode()))
    assert d.exit_code in (0, 1)
    assert d.lines()


def test_dev_hit_rate_meets_the_target():
    rows = docs.corpus_rows()
    hits, total = docs.hit_rate(rows, "dev")
    assert total >= 10 and hits / total >= 0.75, [(r.id, r.expected, r.named) for r in rows
                                                  if r.split == "dev" and r.recognisable and not r.hit]


def test_troubleshooting_page_is_current():
    assert docs.PAGE.read_text() == docs.render(), (
        "docs/troubleshooting.md is not current: python -m mbridge_ep_overlap.diagnose.docs --write")


def test_page_lists_every_signature_and_both_hit_rates():
    page = docs.PAGE.read_text()
    for s in all_signatures():
        assert f"### `{s.id}`" in page
    rows = docs.corpus_rows()
    for split in ("dev", "holdout"):
        hits, total = docs.hit_rate(rows, split)
        assert f"**{split}:** names the maintainers' cause in {hits} of {total} reports" in page
    hits, total = docs.hit_rate(docs.unseen_rows(), "unseen")
    assert f"**unseen:** names the thread's cause in {hits} of {total} reports" in page


def test_docs_check_mode(tmp_path, monkeypatch):
    assert docs.main(["--check"]) == 0
    stale = tmp_path / "troubleshooting.md"
    stale.write_text("old\n")
    monkeypatch.setattr(docs, "PAGE", stale)
    monkeypatch.setattr(docs, "REPO", tmp_path)
    assert docs.main(["--check"]) == 1
