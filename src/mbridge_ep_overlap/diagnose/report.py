"""A diagnosis as a user reads it: the symptom class, the causes ranked, the evidence lines with
file:line, the fix, the upstream source, and the rule that would have refused the run up front.

Contract
--------
``Diagnosis.exit_code``: 0 nothing wrong found, 1 a problem found (recognised or not). ``lines()`` is
the text ``mbridge-ep-overlap diagnose`` prints; ``as_dict()`` the same as JSON-ready data. A
diagnosis whose findings are all generic signatures (or none, with lines that look like a failure)
says "not recognised" and shows those lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .signatures import SYMPTOMS, Signature

MAX_EVIDENCE = 5


@dataclass
class Finding:
    signature: Signature
    evidence: list[str] = field(default_factory=list)
    """'file:line: text' (or a fact / an analyzer line), at most MAX_EVIDENCE kept."""
    count: int = 0
    detail: list[str] = field(default_factory=list)
    """What the structured readers add: ranks, collective, place in the schedule, stacks."""
    rule_passes: bool | None = None
    """Does this run's config pass ``signature.rule`` (from the facts); None where they do not say."""

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.evidence) < MAX_EVIDENCE and line not in self.evidence:
            self.evidence.append(line)

    @property
    def score(self) -> tuple:
        return (not self.signature.generic, self.signature.confidence, self.count)


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    """Ranked, most likely cause first."""
    suspicious: list[str] = field(default_factory=list)
    """Lines that look like a failure ('file:line: text'), shown when nothing specific was recognised."""
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    """What was read: files, facts, watchdog events, flight-recorder folders."""

    @property
    def problem(self) -> bool:
        return bool(self.findings or self.suspicious)

    @property
    def recognised(self) -> bool:
        return any(not f.signature.generic for f in self.findings)

    @property
    def symptom(self) -> str | None:
        return SYMPTOMS[self.findings[0].signature.symptom] if self.findings else None

    @property
    def cause_ids(self) -> list[str]:
        return [f.signature.id for f in self.findings if not f.signature.generic]

    @property
    def exit_code(self) -> int:
        return 1 if self.problem else 0

    def lines(self) -> list[str]:
        out = [f"read: {', '.join(self.read)}" if self.read else "read: nothing"]
        if not self.problem:
            return out + ["nothing wrong found"] + [f"note: {n}" for n in self.notes]
        if self.findings:
            head = self.symptom
            out.append(f"symptom: {head}" + ("" if self.recognised else " - cause not recognised"))
        else:
            out.append("not recognised: no known failure signature matches; the lines that look like the failure:")
        for rank, f in enumerate(self.findings, 1):
            s = f.signature
            label = "cause" if not s.generic else "symptom only"
            out.append(f"{rank}. [{s.id}] {label}, confidence {s.confidence:.0%}: {s.cause}")
            out += [f"     evidence: {e}" for e in f.evidence]
            if f.count > len(f.evidence):
                out.append(f"     ({f.count - len(f.evidence)} more lines like these)")
            out += [f"     {d}" for d in f.detail]
            out.append(f"     fix: {s.fix}")
            out.append(f"     source: {s.source}")
            if s.rule:
                verdict = {True: "this run's config passes it", False: "this run's config FAILS it",
                           None: "the evidence does not give the config"}[f.rule_passes]
                out.append(f"     rule that refuses it up front: {s.rule} ({verdict})")
        if self.suspicious and not self.recognised:
            if self.findings:
                out.append("not recognised beyond the symptom; the lines that look like the failure:")
            out += [f"  {line}" for line in self.suspicious]
        out += [f"note: {n}" for n in self.notes]
        return out

    def as_dict(self) -> dict:
        return {
            "problem": self.problem, "recognised": self.recognised, "symptom": self.symptom,
            "findings": [{"id": f.signature.id, "symptom": f.signature.symptom, "generic": f.signature.generic,
                          "confidence": f.signature.confidence, "cause": f.signature.cause,
                          "fix": f.signature.fix, "source": f.signature.source, "rule": f.signature.rule,
                          "rule_passes": f.rule_passes, "evidence": f.evidence, "count": f.count,
                          "detail": f.detail} for f in self.findings],
            "suspicious": self.suspicious, "notes": self.notes, "read": self.read,
        }
