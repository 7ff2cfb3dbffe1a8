"""Schema of the unseen failure-report sets (``tests/unit/fixtures/failure_reports_unseen*/``).

Each set is a separately collected group of real upstream failure reports, kept apart from
``failure_reports/`` so that ``diagnose`` can be measured on reports its signatures were not written
from: ``failure_reports_unseen/`` (collected 2026-12-01), then ``failure_reports_unseen2/``,
``failure_reports_unseen3/``, ``failure_reports_unseen4/``, ``failure_reports_unseen5/`` and
``failure_reports_unseen6/`` (collected 2026-12-02), ``failure_reports_unseen7/``, ``failure_reports_unseen8/`` and
``failure_reports_unseen9/`` (collected 2026-12-03), ``failure_reports_unseen10/`` to
``failure_reports_unseen15/`` (collected 2026-12-04), ``failure_reports_unseen16/`` (collected 2026-12-05). These tests check
only the data: every file has exactly the corpus keys with the corpus types, is marked ``split: "unseen"``,
points at the upstream thread its id names, repeats no report (id or thread) of the main corpus or of an
earlier unseen set, and is listed in its folder's README table with the same class and recognisability;
the second, third and fourth sets' ``labels.tsv`` list every report with the same recognisability, what
``diagnose`` named when the set was first run (``diagnose_before``: for the second set, before the frame
and native-check readers; for the third, before the Transformer Engine, NVSHMEM and build signatures
written from it; for the fourth to the sixteenth, blind, before anything was changed after reading them), what it names now
(``diagnose_after``: compared with ``diagnose`` run on the
report's log here, so the column cannot go stale) and whether that top cause names the maintainers'
cause (``hit``: yes / partial / no, a judgement). Only the tests of that column run ``diagnose``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MAIN = FIXTURES / "failure_reports"
# In collection order: a later set may repeat nothing of the main corpus or of any set before it.
UNSEEN_SETS = {
    "unseen": FIXTURES / "failure_reports_unseen",
    "unseen2": FIXTURES / "failure_reports_unseen2",
    "unseen3": FIXTURES / "failure_reports_unseen3",
    "unseen4": FIXTURES / "failure_reports_unseen4",
    "unseen5": FIXTURES / "failure_reports_unseen5",
    "unseen6": FIXTURES / "failure_reports_unseen6",
    "unseen7": FIXTURES / "failure_reports_unseen7",
    "unseen8": FIXTURES / "failure_reports_unseen8",
    "unseen9": FIXTURES / "failure_reports_unseen9",
    "unseen10": FIXTURES / "failure_reports_unseen10",
    "unseen11": FIXTURES / "failure_reports_unseen11",
    "unseen12": FIXTURES / "failure_reports_unseen12",
    "unseen13": FIXTURES / "failure_reports_unseen13",
    "unseen14": FIXTURES / "failure_reports_unseen14",
    "unseen15": FIXTURES / "failure_reports_unseen15",
    "unseen16": FIXTURES / "failure_reports_unseen16",
}
MINIMUM_REPORTS = {"unseen": 15, "unseen2": 16, "unseen3": 18, "unseen4": 20, "unseen5": 20, "unseen6": 20, "unseen7": 20, "unseen8": 20,
                   "unseen9": 20, "unseen10": 20, "unseen11": 20, "unseen12": 20, "unseen13": 20, "unseen14": 20,
                   "unseen15": 14, "unseen16": 17}
LABELLED_SETS = ("unseen2", "unseen3", "unseen4", "unseen5", "unseen6", "unseen7", "unseen8", "unseen9", "unseen10",
                 "unseen11", "unseen12", "unseen13", "unseen14", "unseen15", "unseen16")
"""The sets whose ``labels.tsv`` has the before / after / hit columns."""
BLIND_SETS = ("unseen4", "unseen5", "unseen6", "unseen7", "unseen8", "unseen9", "unseen10", "unseen11", "unseen12", "unseen13",
              "unseen14", "unseen15", "unseen16")
"""The sets whose before column was measured blind; their ``labels.tsv`` adds ``hit_before``."""

KEYS = (
    "id", "project", "source_url", "title", "date", "log", "maintainers_cause", "cause",
    "symptom_class", "fix", "versions", "recognisable_from_log", "split",
)
REPOSITORY_OF_PROJECT = {
    "megatron-bridge": ("NVIDIA-NeMo/Megatron-Bridge",),
    "megatron-lm": ("NVIDIA/Megatron-LM",),
    "transformer-engine": ("NVIDIA/TransformerEngine",),
    "deepep": ("deepseek-ai/DeepEP",),
    "other": ("NVIDIA-NeMo/NeMo", "NVIDIA-NeMo/RL", "NVIDIA-NeMo/Automodel", "verl-project/verl", "NVIDIA/nvshmem",
              "deepseek-ai/DeepGEMM", "alibaba/Pai-Megatron-Patch", "sgl-project/sglang", "THUDM/slime", "NVIDIA/srt-slurm",
              "ishandhanani/srt-slurm", "radixark/miles", "NVIDIA/Model-Optimizer", "ROCm/Megatron-LM", "vllm-project/vllm",
              "NVIDIA-NeMo/Speech", "NVIDIA/NeMo-Framework-Launcher", "hiyouga/LlamaFactory", "modelscope/ms-swift",
              "modelscope/mcore-bridge", "fanshiqing/grouped_gemm", "awslabs/awsome-distributed-ai",
              "PaddlePaddle/FastDeploy", "ByteDance-Seed/Triton-distributed", "NVIDIA/TensorRT-LLM", "pytorch/torchtitan",
              "uccl-project/uccl", "KuangjuX/NVSHMEM-Tutorial", "hao-ai-lab/DistCA", "AMD-AGI/Primus",
              "kvcache-ai/Mooncake", "areal-project/AReaL"),
}
SYMPTOM_CLASSES = {
    "upstream-assertion", "hang", "crash-signal", "wrong-numerics", "silent-fallback",
    "no-speedup", "unsupported-hardware", "install-build", "oom", "other",
}
OPTIONAL_TEXT = ("date", "maintainers_cause", "cause", "fix", "versions")
LABEL_COLUMNS = ("id", "recognisable", "maintainers_cause", "diagnose_before", "diagnose_after", "hit")
HITS = {"yes", "partial", "no"}


def _reports(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))}


REPORTS = {name: _reports(folder) for name, folder in UNSEEN_SETS.items()}
CASES = [(name, stem) for name, reports in REPORTS.items() for stem in sorted(reports)]


@pytest.mark.parametrize("name", sorted(UNSEEN_SETS))
def test_each_unseen_set_holds_enough_reports(name):
    assert len(REPORTS[name]) >= MINIMUM_REPORTS[name]


@pytest.mark.parametrize(("name", "stem"), CASES)
def test_report_has_exactly_the_corpus_keys_with_their_types(name, stem):
    report = REPORTS[name][stem]
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


@pytest.mark.parametrize(("name", "stem"), CASES)
def test_source_url_is_the_thread_the_id_names(name, stem):
    report = REPORTS[name][stem]
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)", report["source_url"])
    assert match, report["source_url"]
    assert match.group(1) in REPOSITORY_OF_PROJECT[report["project"]]
    named = {"NVIDIA-NeMo/RL": "nemo-rl", "NVIDIA-NeMo/NeMo": "nemo", "ROCm/Megatron-LM": "rocm-megatron-lm",
             "NVIDIA-NeMo/Speech": "nemo", "NVIDIA/NeMo-Framework-Launcher": "nemo-launcher"}
    prefix = report["project"] if report["project"] != "other" else \
        named.get(match.group(1), match.group(1).split("/")[1].lower())
    assert stem == f"{prefix}-{match.group(3)}"


@pytest.mark.parametrize(("name", "stem"), CASES)
def test_a_cause_recognisable_from_the_log_is_a_known_cause(name, stem):
    report = REPORTS[name][stem]
    if report["recognisable_from_log"]:
        assert report["cause"] is not None
    if report["maintainers_cause"] is not None:
        assert report["cause"] is not None


@pytest.mark.parametrize("name", sorted(UNSEEN_SETS))
def test_no_report_repeats_one_of_the_main_corpus_or_an_earlier_set(name):
    main = _reports(MAIN)
    assert main, "the main corpus is missing"
    earlier = [main] + [REPORTS[n] for n in UNSEEN_SETS][: list(UNSEEN_SETS).index(name)]
    ids = set(REPORTS[name])
    urls = {r["source_url"] for r in REPORTS[name].values()}
    for other in earlier:
        assert not ids & set(other)
        assert not urls & {r["source_url"] for r in other.values()}


@pytest.mark.parametrize("name", sorted(UNSEEN_SETS))
def test_each_thread_appears_once(name):
    urls = [r["source_url"] for r in REPORTS[name].values()]
    assert len(urls) == len(set(urls))


@pytest.mark.parametrize("name", sorted(UNSEEN_SETS))
def test_readme_table_lists_every_report_with_its_class_and_recognisability(name):
    rows = {}
    for line in (UNSEEN_SETS[name] / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        link = re.fullmatch(r"\[([\w.-]+)\]\((\S+)\)", cells[0]) if len(cells) >= 4 else None
        if link:
            rows[link.group(1)] = (link.group(2), cells[1], cells[2])
    reports = REPORTS[name]
    assert set(rows) == set(reports)
    for stem, (url, symptom_class, recognisable) in rows.items():
        report = reports[stem]
        assert url == report["source_url"]
        assert symptom_class == report["symptom_class"]
        assert recognisable == ("yes" if report["recognisable_from_log"] else "no")


def _label_rows(name: str) -> list[list[str]]:
    lines = (UNSEEN_SETS[name] / "labels.tsv").read_text(encoding="utf-8").splitlines()
    head = tuple(lines[0].split("\t"))
    # a set measured blind also keeps the judged hit of its before column
    assert head == LABEL_COLUMNS + (("hit_before",) if name in BLIND_SETS else ())
    return [line.split("\t")[:len(LABEL_COLUMNS)] for line in lines[1:]]


@pytest.mark.parametrize("name", BLIND_SETS)
def test_a_blind_hit_is_a_cause_named_before(name):
    lines = (UNSEEN_SETS[name] / "labels.tsv").read_text(encoding="utf-8").splitlines()
    for line in lines[1:]:
        stem, _rec, _cause, before, _after, _hit, hit_before = line.split("\t")
        assert hit_before in HITS and (hit_before == "no" or before != "-"), stem


@pytest.mark.parametrize("name", LABELLED_SETS)
def test_labels_list_every_report_with_its_recognisability(name):
    rows = _label_rows(name)
    assert all(len(row) == len(LABEL_COLUMNS) and all(cell.strip() for cell in row) for row in rows)
    reports = REPORTS[name]
    assert sorted(row[0] for row in rows) == sorted(reports)
    for stem, recognisable, _cause, _before, after, hit in rows:
        assert recognisable == ("yes" if reports[stem]["recognisable_from_log"] else "no")
        assert hit in HITS
        assert hit == "no" or after != "-", stem  # a hit is a named cause


@pytest.mark.parametrize("name", LABELLED_SETS)
def test_diagnose_after_is_what_diagnose_names_today(name):
    import io

    from mbridge_ep_overlap.diagnose import diagnose

    for stem, *_, after, _hit in _label_rows(name):
        log = REPORTS[name][stem]["log"]
        named = (diagnose(["-"], stdin=io.BytesIO(log.encode())).cause_ids or ["-"])[0]
        assert named == after, (stem, named)
