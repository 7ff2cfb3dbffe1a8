"""The product speaks of the product: no word of how it was built in any tracked text file.

Contract: every file `git ls-files` lists (and every path it lists) is free of phrases that belong to
how the project is run rather than to what it does: run numbers ("stop 11", "stop-10"), machines
"lent", "device time", carry limits, "workplace" rules, the project's own issue numbers ("issue 16"),
and a "session" in the sense of a work session ("this session", "the session's GPU time").
Evidence is named by date, commit and machine instead.

Not flagged, because they are the product's own vocabulary: a process session (``setsid``,
"a session of its own"), pytest's "test session" and ``scope="session"``, ``Session`` class names
and variables, and upstream references ("Megatron-Bridge issue 6006", "MB issue #5992").

Exempt by path, because they are verbatim copies of text written elsewhere that must stay as
written for the parsers and signatures tested against them: upstream issue threads and recorded
failure logs (``tests/unit/fixtures/failure_reports*/``, ``tests/unit/fixtures/recorded/``) and the
raw logs of GPU runs (``docs/evidence/**/*.log``). This file names the phrases it looks for.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EXEMPT = (
    re.compile(r"^tests/unit/fixtures/failure_reports[^/]*/"),
    re.compile(r"^tests/unit/fixtures/recorded/"),
    re.compile(r"^docs/evidence/.*\.log$"),
    re.compile(r"^tests/unit/test_product_words\.py$"),
)

UPSTREAM = ("megatron-bridge", "megatron-core", "megatron-lm", "mb", "mcore", "te", "deepep", "torch",
            "pytorch", "nccl", "upstream", "transformerengine", "github")

PHRASES = {
    "a run number": re.compile(r"\bstops?[ -]?\d+\b", re.I),
    "a lent machine": re.compile(r"\blent\b", re.I),
    "device time": re.compile(r"\bdevice[ -]time\b", re.I),
    "a carry limit": re.compile(r"\bcarr(?:y|ied)[ -]limit|\b64 ?MiB[ -]limit", re.I),
    "a workplace rule": re.compile(r"\bworkplace\b", re.I),
    "a work session": re.compile(
        r"\b(?:this|that|next|previous|later|earlier|same|each|every) session\b|\bsession's\b"
        r"|\bsessions? (?:built|ran|had|was|were)\b", re.I),
}


def _internal_issue(line: str) -> bool:
    if "issue" not in line.lower():
        return False
    for match in re.finditer(r"\bissues? (#?)\d+\b", line, re.I):
        words = line[max(0, match.start() - 40):match.start()].split()
        before = words[-1].strip("([`'\"").lower() if words else ""
        if not match.group(1) and before not in UPSTREAM:
            return True
    return False


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files to scan")
    return [p for p in out.splitlines() if not any(e.search(p) for e in EXEMPT)]


def _hits() -> list[str]:
    hits = []
    for rel in _tracked():
        for what, pattern in PHRASES.items():
            if pattern.search(rel):
                hits.append(f"{rel}: path: {what}")
        path = REPO / rel
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (plots) or absent from this working tree
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in PHRASES.items():
                if pattern.search(line):
                    hits.append(f"{rel}:{number}: {what}: {line.strip()[:120]}")
            if _internal_issue(line):
                hits.append(f"{rel}:{number}: an internal issue number: {line.strip()[:120]}")
    return hits


def test_tracked_files_speak_of_the_product_alone():
    hits = _hits()
    assert not hits, f"{len(hits)} line(s) speak of how the project is built:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "What ran on 2x H200 (stop 11)", "the stop-10 evidence", "Only the one-GPU kind was lent again",
    "the device time ran out", "the 64 MiB-limited GPU test machine", "workplace rule: no script",
    "Columns added for issue 16", "was lent in this session", "the session's GPU time",
])
def test_the_phrases_are_caught(line):
    assert any(p.search(line) for p in PHRASES.values()) or _internal_issue(line)


@pytest.mark.parametrize("line", [
    "torchrun starts each worker in a session of its own", "@pytest.fixture(scope=\"session\")",
    "as the test session starts", "session = Session(cfg, options).configure()", "os.setsid()",
    "a no-op, Megatron-Bridge issue 6006", "MB issue #5992", "Megatron-LM PR #6311",
    "stops when the next would not fit", "profiler start/stop", "start_new_session=True",
])
def test_the_products_own_words_pass(line):
    assert not any(p.search(line) for p in PHRASES.values()) and not _internal_issue(line)
