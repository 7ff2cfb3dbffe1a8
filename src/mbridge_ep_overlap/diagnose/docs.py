"""``docs/troubleshooting.md``, generated from the signatures (and the corpus of real failure reports).

Contract
--------
``python -m mbridge_ep_overlap.diagnose.docs --write`` rewrites the page; ``--check`` exits 1 when the
page on disk is not what the signatures and the corpus give today (the unit tests call ``render`` and
compare). The page is one of the generated references: ``tools.gen_docs --write/--check`` builds it
from ``body`` with the same ``HEADER`` (``render() == HEADER + body()``). The page lists, per symptom
class, each signature's symptom -> cause -> fix, its source,
the rule that refuses it up front and the versions it applies to; then the table of which corpus
reports ``diagnose`` names, with the hit rates on the ``dev`` and ``holdout`` splits counted over the
reports whose cause is recognisable from the log, and on the ``unseen`` set (``failure_reports_unseen``,
its ``labels.tsv`` says which top cause names the thread's cause) and on the second unseen set
(``failure_reports_unseen2``: what was named before the raise-frame and native-check readers, what is
named now, computed, and the judged hit) and on the third (``failure_reports_unseen3``, the same columns: before
the Transformer Engine, NVSHMEM and build signatures written from it) and on the fourth (``failure_reports_unseen4``,
*before* measured blind, with its judged hit in a ``hit_before`` column), the fifth and the sixth
(``failure_reports_unseen5``,
``failure_reports_unseen6`` to ``failure_reports_unseen16``, the same). A corpus label ``upstream-check:FILE``
is met by the general upstream-check finding for a check in FILE (``upstream-check:FILE:LINE``: the line
follows the installed version). The corpus folder is found beside this checkout
(``tests/unit/fixtures/failure_reports``, labels in ``tests/unit/fixtures/corpus_causes.tsv``) or given.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .engine import diagnose
from .signatures import SYMPTOMS, Signature, all_signatures

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "troubleshooting.md"
CORPUS = REPO / "tests" / "unit" / "fixtures" / "failure_reports"
LABELS = REPO / "tests" / "unit" / "fixtures" / "corpus_causes.tsv"
UNSEEN = REPO / "tests" / "unit" / "fixtures" / "failure_reports_unseen"
FIXTURES = REPO / "tests" / "unit" / "fixtures"
"""Where each labelled set lives: ``failure_reports_<name>`` (``LABELLED_SETS``)."""
READ_FROM = "2026-12-02"
"""From this date on the developer has read the holdout and every unseen set: their rates are no longer blind
(unseen4's to unseen16's *before* columns are: each was measured before its set was read; unseen7 to unseen9 were
read from 2026-12-03, unseen10 to unseen15 from 2026-12-04, unseen16 from 2026-12-05)."""
HEADER = ("<!-- Generated from the code by `python -m mbridge_ep_overlap.tools.gen_docs --write`: "
          "do not edit by hand. -->\n\n")


@dataclass(frozen=True)
class CorpusRow:
    id: str
    split: str
    symptom_class: str
    recognisable: bool
    expected: str
    named: str
    source_url: str

    @property
    def hit(self) -> bool:
        return self.expected != "-" and (self.named == self.expected or (
            self.expected.startswith("upstream-check:") and self.named.startswith(self.expected + ":")))


def labels(path: Path = LABELS) -> dict[str, str]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            report, expected = line.split("\t")
            rows[report] = expected
    return rows


def unseen_labels(folder: Path = UNSEEN) -> dict[str, str]:
    """Report id -> the top cause that names the thread's cause (the ``labels.tsv`` rows marked hit)."""
    rows = {}
    path = folder / "labels.tsv"
    for line in path.read_text().splitlines()[1:] if path.is_file() else []:
        report, top, hit, *_ = line.split("\t")
        rows[report] = top if hit == "yes" else "-"
    return rows


def top_cause(log: str) -> str:
    return (diagnose(["-"], stdin=io.BytesIO(log.encode())).cause_ids or ["-"])[0]


def corpus_rows(folder: Path = CORPUS, label_file: Path = LABELS) -> list[CorpusRow]:
    expected = labels(label_file)
    rows = []
    for f in sorted(folder.glob("*.json")):
        report = json.loads(f.read_text())
        rows.append(CorpusRow(report["id"], report["split"], report["symptom_class"],
                              bool(report["recognisable_from_log"]), expected.get(report["id"], "-"),
                              top_cause(report["log"]), report["source_url"]))
    return rows


def unseen_rows(folder: Path = UNSEEN) -> list[CorpusRow]:
    expected = unseen_labels(folder)
    rows = []
    for f in sorted(folder.glob("*.json")):
        report = json.loads(f.read_text())
        rows.append(CorpusRow(report["id"], "unseen", report["symptom_class"], bool(report["recognisable_from_log"]),
                              expected.get(report["id"], "-"), top_cause(report["log"]), report["source_url"]))
    return rows


@dataclass(frozen=True)
class Unseen2Row:
    id: str
    symptom_class: str
    recognisable: bool
    before: str
    named: str
    hit: str
    """yes / partial / no, from ``labels.tsv`` (a judgement of the named cause against the maintainers')."""
    source_url: str
    hit_before: str = ""
    """The same judgement of *before*, where ``labels.tsv`` has a ``hit_before`` column (a set measured blind)."""


def unseen2_rows(folder: Path = FIXTURES / "failure_reports_unseen2") -> list[Unseen2Row]:
    """A labelled unseen set (the second, the third): ``labels.tsv``'s before and hit columns, *named* computed now."""
    path = folder / "labels.tsv"
    labelled = {}
    lines = path.read_text().splitlines() if path.is_file() else []
    head = lines[0].split("\t") if lines else []
    for line in lines[1:]:
        cells = dict(zip(head, line.split("\t")))
        labelled[cells["id"]] = (cells["diagnose_before"], cells["hit"], cells.get("hit_before", ""))
    rows = []
    for f in sorted(folder.glob("*.json")):
        report = json.loads(f.read_text())
        before, hit, hit_before = labelled.get(report["id"], ("-", "no", ""))
        rows.append(Unseen2Row(report["id"], report["symptom_class"], bool(report["recognisable_from_log"]), before,
                               top_cause(report["log"]), hit, report["source_url"], hit_before))
    return rows


@dataclass(frozen=True)
class LabelledSet:
    name: str
    title: str
    before: str
    """What *before* means for this set: what was there when it was first run, what was added after."""
    blind: bool = False
    """*Before* was measured before anyone who changes the signatures read the set."""
    read_from: str = READ_FROM
    """The date from which the developer has read the set."""


LABELLED_SETS = {
    "unseen2": LabelledSet("unseen2", "Second set collected apart from the signatures",
                           "before the readers of a traceback's raise frame and of native (C++/CUDA) checks were added"),
    "unseen3": LabelledSet("unseen3", "Third set collected apart from the signatures",
                           "before the Transformer Engine (FP8 availability and GEMM shape checks, extension lookup, "
                           "torch API), NVSHMEM (non-mlx5 NICs, relocatable device code) and build (cuDNN and CUTLASS "
                           "headers, C++ ABI, operator schema) signatures were added"),
    "unseen4": LabelledSet("unseen4", "Fourth set collected apart from the signatures",
                           "blind, on main d39500c, before the set was read; then the general readers were changed "
                           "(a message another version cut or reworded at its end names the installed check by its "
                           "start, the `else` of an if / elif chain requires one of the chain's tests, a frame whose "
                           "message no installed check raises is named with lower confidence, glibc's failed C "
                           "`assert`)", blind=True),
    "unseen5": LabelledSet("unseen5", "Fifth set collected apart from the signatures",
                           "blind, on main c3742ad, before the set was read; then NVSHMEM's, HybridEP's and DeepEP "
                           "V2's error formats were read as native checks (with the HybridEP fabric-memory, NVSHMEM "
                           "IBGDA and CPU-proxy signatures), and readers of Transformer Engine's attention-backend "
                           "lines and of an `AttributeError` against the installed source were added", blind=True),
    "unseen6": LabelledSet("unseen6", "Sixth set collected apart from the signatures",
                           "blind, on main fcb7913 (with the readers added after the fifth set), before the set was "
                           "read; then GNU ld's missing-library error, a re-quoted duplicate-symbol line, Transformer "
                           "Engine's FP8 leading-dimension check and AttributeErrors across a package boundary were "
                           "added", blind=True),
    "unseen7": LabelledSet("unseen7", "Seventh set collected apart from the signatures",
                           "blind, on main c090c35 (with the py-spy, launcher, ImportError and CUDA / cuBLAS / NCCL "
                           "runtime-error readers), before the set was read; then a DeepEP check wrapped onto two lines "
                           "and the CUDA error it reports, an error printed as its repr (a wrapping exception, a Ray "
                           "worker), a raised message the installed version only warns about, compile-time "
                           "`static_assert`s and TypeErrors across a package boundary were read", blind=True,
                           read_from="2026-12-03"),
    "unseen8": LabelledSet("unseen8", "Eighth set collected apart from the signatures",
                           "blind, on main 3018402 (with the readers added after the seventh set), before the set was "
                           "read; then a static_assert quoted with its header's name alone, an upstream check raised "
                           "through another framework's Megatron backend, a header's `#error`, nvlink linking for "
                           "another architecture, a config section left None, a size that does not divide another and "
                           "a name used where it is not defined were read", blind=True, read_from="2026-12-03"),
    "unseen9": LabelledSet("unseen9", "Ninth set collected apart from the signatures",
                           "blind, on main fc9edd2 (before the readers written from the eighth set), before the set "
                           "was read; then a keyword the installed Megatron passes that the receiving code does not "
                           "take and a compiled binding's argument mismatch were read, written from this set's misses",
                           blind=True, read_from="2026-12-03"),
    "unseen10": LabelledSet("unseen10", "Tenth set collected apart from the signatures",
                            "blind, on main 806171e (after the readers written from the ninth set), before the set "
                            "was read; then a value outside what a kernel was built for ('Unsupported ...', a "
                            "compile-time maximum, an equality check's two values), a call written for another release "
                            "of a library's headers, ptxas refusing PTX, and Megatron-Bridge's Hugging Face export "
                            "warnings were read, written from this set's misses",
                            blind=True, read_from="2026-12-04"),
    "unseen11": LabelledSet("unseen11", "Eleventh set collected apart from the signatures",
                            "blind, on main f29344a (after the readers written from the tenth set), before the set was "
                            "read; then a package's version gate, a size one parallel split apart, a checkpoint's "
                            "expert layout, a pickled class the installed release lacks, NCCL's duplicate GPU, the CUDA "
                            "driver's out-of-memory and a wrapped torch-symbol import error were read, written from "
                            "this set's misses",
                            blind=True, read_from="2026-12-04"),
    "unseen12": LabelledSet("unseen12", "Twelfth set collected apart from the signatures",
                            "blind, on main 18adbb2 (after the readers written from the eleventh set), before the set was "
                            "read; then TE's backend reasons logged after its error, ptxas's arch-specific suffix, a "
                            "configured value missing from a lookup table and CMake's find_library failure were read, "
                            "written from this set's misses",
                            blind=True, read_from="2026-12-04"),
    "unseen13": LabelledSet("unseen13", "Thirteenth set collected apart from the signatures",
                            "blind, on main 279954f (after the readers written from the twelfth set), before the set was "
                            "read; then an exception retyped with its message in parentheses and short frames listed "
                            "under an error were read, written from this set's misses",
                            blind=True, read_from="2026-12-04"),
    "unseen14": LabelledSet("unseen14", "Fourteenth set collected apart from the signatures",
                            "blind, on main b1d729e (after the readers written from the thirteenth set), before the set "
                            "was read; then Transformer Engine's refusals of the block-scaled recipes by compute "
                            "capability, its cuDNN fused-attention error, CMake's failed find_package, a divisor named in "
                            "several words or wrapped onto the next line, the sequential experts of a conversion, a "
                            "call's result unpacked into another number of names, a feature refused on the run's "
                            "platform and TE's userbuffers used before initialize_ub were read, written from this set's "
                            "misses",
                            blind=True, read_from="2026-12-04"),
    "unseen15": LabelledSet("unseen15", "Fifteenth set collected apart from the signatures",
                            "blind, on main 6ab7546 (after the readers written from the fourteenth set), before the set "
                            "was read; then torch's 16-byte GEMM alignment, the distributed optimizer's flattened-range "
                            "checkpoint format and Transformer Engine's userbuffers without CUDA multicast were read, "
                            "written from this set's misses",
                            blind=True, read_from="2026-12-04"),
    "unseen16": LabelledSet("unseen16", "Sixteenth set collected apart from the signatures",
                            "blind, on main 7578de6 (after the readers written from the fifteenth set and the CPU gloo "
                            "recordings), before the set was read; then a keyword one package passes to its own function, "
                            "compared with the installed version of the calling function, was read, written from this "
                            "set's miss",
                            blind=True, read_from="2026-12-05"),
}


def _labelled_section(folder: Path, labelled: LabelledSet) -> list[str]:
    rows = unseen2_rows(folder)
    counted = [r for r in rows if r.recognisable]
    named_before = sum(r.before != "-" for r in counted)
    named_after = sum(r.named != "-" for r in counted)
    yes, partial = (sum(r.hit == h for r in counted) for h in ("yes", "partial"))
    out = [f"## {labelled.title}", "",
           f"{len(rows)} more reports (`tests/unit/fixtures/{folder.name}`), collected without reading the "
           f"signatures. *Before* is what `diagnose` named when the set was first run, {labelled.before}; *named* is "
           "what it names now (computed), and those additions were written after looking at this set, so *named* is "
           f"not an unseen measurement; the developer has read the whole set from {labelled.read_from} on. *Hit*: does the top "
           "cause name the maintainers' cause (yes / partial / no, a judgement in `labels.tsv`).", "",
           f"- **{labelled.name}, reports whose cause is recognisable from the log:** {len(counted)}; a cause named "
           f"before: {named_before}, now: {named_after}; hit now: {yes} yes, {partial} partial"]
    if labelled.blind:
        yes_b, partial_b = (sum(r.hit_before == h for r in counted) for h in ("yes", "partial"))
        out.append(f"- **{labelled.name}, blind (before):** hit {yes_b} yes, {partial_b} partial of {len(counted)} "
                   "(`hit_before` in `labels.tsv`, a judgement)")
    out += ["", "| report | class | recognisable | before | named | hit |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.recognisable or r.before != "-" or r.named != "-":
            out.append(f"| [{r.id}]({r.source_url}) | {r.symptom_class} | {'yes' if r.recognisable else 'no'} | "
                       f"`{r.before}` | `{r.named}` | {r.hit} |")
    return out + [""]


def hit_rate(rows: list[CorpusRow], split: str) -> tuple[int, int]:
    counted = [r for r in rows if r.split == split and r.recognisable]
    return sum(r.hit for r in counted), len(counted)


def _signature(s: Signature) -> list[str]:
    seen = (f"`{s.emitted[0]}`" if s.emitted else f"(read from {s.found_by.replace('-', ' ')})")
    out = [f"### `{s.id}`" + (" (symptom only)" if s.generic else ""), "",
           f"- **What you see:** {seen}",
           f"- **Cause:** {s.cause}",
           f"- **Fix:** {s.fix}",
           f"- **Source:** {s.source}" + (f" (report `{s.corpus_report}`)" if s.corpus_report else "")
           + (f"; the line that prints it: `{s.quoted_at}`" if s.quoted_at else ""),
           "- **Rule that refuses it before the run:** " + (f"`{s.rule}`" if s.rule else "none"),
           f"- **Applies to:** {s.versions}; confidence of a match {s.confidence:.0%}", ""]
    return out


def render(folder: Path = CORPUS, label_file: Path = LABELS) -> str:
    """The whole page as checked in: ``HEADER`` + ``body``."""
    return HEADER + body(folder, label_file)


def body(folder: Path = CORPUS, label_file: Path = LABELS, unseen: Path = UNSEEN, fixtures: Path = FIXTURES) -> str:
    sigs = all_signatures()
    out = ["# Troubleshooting EP overlap: symptom -> cause -> fix", "",
           "`mbridge-ep-overlap diagnose PATH...` (a log, a run folder, Slurm output, or `-` for a pasted log) "
           "matches what a run left behind against the known failures below and prints the symptom class, "
           "the evidence lines with file:line, the causes ranked with their confidence, the fix, the upstream "
           "source and the rule that would have refused the run up front. Exit 0: nothing wrong found; 1: a "
           "problem found (recognised or not); 2: bad usage. In Python: "
           "`from mbridge_ep_overlap import diagnose; diagnose([path]).lines()`.", "",
           f"{len(sigs)} known failures in {len(SYMPTOMS)} symptom classes. A *symptom only* entry names the "
           "class (\"a rank died of SIGSEGV\") and ranks below every specific cause; a run matched only by such "
           "entries is reported as *not recognised*, with the lines that look like the failure.", ""]
    for key, title in SYMPTOMS.items():
        members = [s for s in sigs if s.symptom == key]
        out += [f"## {title[0].upper() + title[1:]}", ""]
        for s in members:
            out += _signature(s)
    if folder.is_dir() and label_file.is_file():
        rows = corpus_rows(folder, label_file)
        out += ["## Which real failure reports `diagnose` names", "",
                f"{len(rows)} failure reports from upstream issue threads (`tests/unit/fixtures/failure_reports`, "
                "verbatim logs). The signatures were first written from the `dev` reports only, the `holdout` reports "
                "read only to measure; the developer has read the `holdout` reports and the sets below from "
                f"{READ_FROM} on, so their numbers are recomputed, no longer blind. *Expected* is the signature "
                "whose cause is the maintainers' cause (`-`: no signature names it); *named* is the top cause "
                "`diagnose` gives for the report's log.", ""]
        for split in ("dev", "holdout"):
            hits, total = hit_rate(rows, split)
            out.append(f"- **{split}:** names the maintainers' cause in {hits} of {total} reports whose cause is "
                       f"recognisable from the log ({(100 * hits / total) if total else 0:.0f}%)")
        out += ["", "| report | split | class | recognisable from the log | expected | named | |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            mark = "yes" if r.hit else "no" if r.recognisable else ""
            out.append(f"| [{r.id}]({r.source_url}) | {r.split} | {r.symptom_class} | "
                       f"{'yes' if r.recognisable else 'no'} | `{r.expected}` | `{r.named}` | {mark} |")
        out.append("")
    if unseen.is_dir():
        rows = unseen_rows(unseen)
        hits, total = hit_rate(rows, "unseen")
        out += ["## Reports collected apart from the signatures", "",
                f"{len(rows)} more reports (`tests/unit/fixtures/failure_reports_unseen`), collected without looking "
                f"at the signatures (read by the developer from {READ_FROM} on). *Expected* is the top cause that "
                "names the thread's cause (`labels.tsv`); a line number follows the installed upstream version.", "",
                f"- **unseen:** names the thread's cause in {hits} of {total} reports whose cause is recognisable "
                f"from the log ({(100 * hits / total) if total else 0:.0f}%)", "",
                "| report | class | expected | named | |", "|---|---|---|---|---|"]
        for r in rows:
            if r.recognisable:
                out.append(f"| [{r.id}]({r.source_url}) | {r.symptom_class} | `{r.expected}` | `{r.named}` | "
                           f"{'yes' if r.hit else 'no'} |")
        out.append("")
    for name, labelled in LABELLED_SETS.items():
        path = fixtures / f"failure_reports_{name}"
        if path.is_dir():
            out += _labelled_section(path, labelled)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mbridge_ep_overlap.diagnose.docs", description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {PAGE.relative_to(REPO)}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is not current")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        PAGE.write_text(text)
        return 0
    current = PAGE.is_file() and PAGE.read_text() == text
    if not current:
        print(f"{PAGE.relative_to(REPO)} is not current: run python -m mbridge_ep_overlap.diagnose.docs --write",
              file=sys.stderr)
    return 0 if current else 1


if __name__ == "__main__":
    sys.exit(main())
