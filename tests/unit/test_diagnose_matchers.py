"""``Signature.matchers``: the literal text a pattern's every match holds, by which the engine skips a search -
read from the pattern itself, so a pattern changed upstream of it can never be skipped where it would match."""

from __future__ import annotations

import re

import pytest

from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.base import required_literal

SIGS = all_signatures()


@pytest.mark.parametrize(("pattern", "literal"), [
    (r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation", "Timed out waiting "),
    (r"\bNCCL error(?: in: (?P<at>[^\s,]+),|:) x", "NCCL error"),   # an optional group ends the run
    (r"(?<!-- )Could NOT find (?:CUDNN|cuDNN) \(missing:", "Could NOT find "),  # a look-behind keeps it going
    (r"ab+cdef", "cdef"),                                           # a repeat's required first turn is a run of its own
    (r"(?:x|y)z", None),                                            # too short after an alternation
    (r"(?i)timeout waiting", None),                                 # case-insensitive: no literal
    (r"\b(?i:UB[ _]manager (?:is )?)not initiali[sz]ed", "not initiali"),
])
def test_the_literal_is_read_from_the_parse(pattern, literal):
    assert required_literal(re.compile(pattern)) == literal


@pytest.mark.parametrize("sig", [s for s in SIGS if s.patterns], ids=lambda s: s.id)
def test_every_text_a_pattern_matches_holds_its_literal(sig):
    texts = [*sig.emitted, *getattr(sig, "excerpts", ())]
    for pattern, literal in sig.matchers():
        assert literal is None or len(literal) >= 3
        for text in texts:
            if pattern.search(text):
                assert literal in text, (sig.id, pattern.pattern, literal, text)


def test_almost_every_pattern_has_a_literal():
    none = [(s.id, p.pattern) for s in SIGS for p, literal in s.matchers() if literal is None]
    assert len(none) <= 2, none  # a pattern without one is searched in every line of every log
