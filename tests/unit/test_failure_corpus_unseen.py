"""Schema of the unseen failure-report set (``tests/unit/fixtures/failure_reports_unseen/``).

The set is a second, separately collected group of real upstream failure reports, kept apart from
``failure_reports/`` so that ``diagnose`` can be measured on reports its signatures were not written
from. These tests check only the data: every file has exactly the corpus keys with the corpus types,
is marked ``split: "unseen"``, points at the upstream thread its id names, repeats no report (id or
thread) of the main corpus, and is listed in the folder's README table with the same class and
recognisability. They read no ``diagnose`` code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
UNSEEN = FIXTURES / "failure_reports_unseen"
MAIN = FIXTURES / "failure_reports"

KEYS = (
    "id", "project", "source_url", "title", "date", "log", "maintainers_cause", "cause",
    "symptom_class", "fix", "versions", "recognisable_from_log", "split",
)
REPOSITORY_OF_PROJECT = {
    "megatron-bridge": ("NVIDIA-NeMo/Megatron-Bridge",),
    "megatron-lm": ("NVIDIA/Megatron-LM",),
    "transformer-engine": ("NVIDIA/TransformerEngine",),
    "deepep": ("deepseek-ai/DeepEP",),
    "other": ("NVIDIA-NeMo/NeMo", "NVIDIA-NeMo/RL"),
}
SYMPTOM_CLASSES = {
    "upstream-assertion", "hang", "crash-signal", "wrong-numerics", "silent-fallback",
    "no-speedup", "unsupported-hardware", "install-build", "oom", "other",
}
OPTIONAL_TEXT = ("date", "maintainers_cause", "cause", "fix", "versions")
MINIMUM_REPORTS = 15


def _reports(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))}


UNSEEN_REPORTS = _reports(UNSEEN)


def test_the_unseen_set_holds_enough_reports():
    assert len(UNSEEN_REPORTS) >= MINIMUM_REPORTS


@pytest.mark.parametrize("stem", sorted(UNSEEN_REPORTS))
def test_report_has_exactly_the_corpus_keys_with_their_types(stem):
    report = UNSEEN_REPORTS[stem]
    assert tuple(report) == KEYS
    assert report["id"] == stem
    for key in ("id", "project", "source_url", "title", "log", "symptom_class", "split"):
        assert isinstance(report[key], str) and report[key].strip(), key
    for key in OPTIONAL_TEXT:
        assert report[key] is None or (isinstance(report[key], str) and report[key].strip()), key
    assert isinstance(report["recognisable_from_log"], bool)
    assert report["split"] == "unseen"
    assert report["symptom_class"] in SYMPTOM_CLASSES
    assert report["project"] in REPOSITORY_OF_PROJECT
    if report["date"] is not None:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", report["date"])


@pytest.mark.parametrize("stem", sorted(UNSEEN_REPORTS))
def test_source_url_is_the_thread_the_id_names(stem):
    report = UNSEEN_REPORTS[stem]
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)", report["source_url"])
    assert match, report["source_url"]
    assert match.group(1) in REPOSITORY_OF_PROJECT[report["project"]]
    assert stem == f"{report['project']}-{match.group(3)}"


@pytest.mark.parametrize("stem", sorted(UNSEEN_REPORTS))
def test_a_cause_recognisable_from_the_log_is_a_known_cause(stem):
    report = UNSEEN_REPORTS[stem]
    if report["recognisable_from_log"]:
        assert report["cause"] is not None
    if report["maintainers_cause"] is not None:
        assert report["cause"] is not None


def test_no_report_repeats_one_of_the_main_corpus():
    main = _reports(MAIN)
    assert main, "the main corpus is missing"
    assert not set(UNSEEN_REPORTS) & set(main)
    main_threads = {r["source_url"] for r in main.values()}
    assert not {r["source_url"] for r in UNSEEN_REPORTS.values()} & main_threads


def test_each_thread_appears_once():
    urls = [r["source_url"] for r in UNSEEN_REPORTS.values()]
    assert len(urls) == len(set(urls))


def test_readme_table_lists_every_report_with_its_class_and_recognisability():
    rows = {}
    for line in (UNSEEN / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        link = re.fullmatch(r"\[([\w.-]+)\]\((\S+)\)", cells[0]) if len(cells) >= 4 else None
        if link:
            rows[link.group(1)] = (link.group(2), cells[1], cells[2])
    assert set(rows) == set(UNSEEN_REPORTS)
    for stem, (url, symptom_class, recognisable) in rows.items():
        report = UNSEEN_REPORTS[stem]
        assert url == report["source_url"]
        assert symptom_class == report["symptom_class"]
        assert recognisable == ("yes" if report["recognisable_from_log"] else "no")
