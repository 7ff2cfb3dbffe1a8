"""Known failures as data: one ``Signature`` per known failure, a module per symptom class.

Contract
--------
A signature is a row, like a rule: an id, the symptom class, the patterns that recognise it in what
a run left behind, the cause, the fix, the upstream issue or PR (or installed source) it comes from,
the rule of this library that refuses it before the run (if any), the versions it applies to, and
how sure a match makes us (``confidence``, 0..1). ``emitted`` is the text upstream really prints;
the parity tests check that every pattern matches it and that it is still what upstream emits
(triggered on CPU, grepped from the installed package, or quoted from a corpus report with its URL).
A *generic* signature names the symptom class only ("a NCCL collective timed out") and ranks below
every specific one; a log matched by generic signatures alone is "not recognised".
Nothing here reads files or imports torch or Megatron.
"""

from __future__ import annotations

from . import (build, compile_checks, config_error, crash, fallback, hang, hardware, install, launch, memory, no_speedup,
               numerics, runtime)
from .base import SYMPTOMS, Signature

__all__ = ["SYMPTOMS", "Signature", "all_signatures"]


def all_signatures() -> tuple[Signature, ...]:
    """Every signature, by symptom class then id; ids are unique."""
    found = [s for m in (config_error, hang, crash, runtime, numerics, fallback, no_speedup, hardware, install, build,
                         compile_checks, memory, launch)
             for s in m.SIGNATURES]
    ids = [s.id for s in found]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate signature ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(found)
