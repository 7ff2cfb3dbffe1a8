"""The rule table: every constraint on EP overlap, one ``Rule`` object each, grouped by family.

Contract: ``RULES`` is the ordered tuple the engine iterates (families in the order below, rules in
their module's order); ``RULES_BY_ID`` indexes it. Importing it loads no Megatron package. A
duplicate id is a programming error and fails at import.
"""

from __future__ import annotations

from . import advice, delay_wgrad, environment, flex, memory, overlap, topology, values
from .base import Family, Rule, Upstream, When

RULES: tuple[Rule, ...] = (*values.RULES, *overlap.RULES, *delay_wgrad.RULES, *flex.RULES, *topology.RULES,
                          *memory.RULES, *environment.RULES, *advice.RULES)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
if len(RULES_BY_ID) != len(RULES):
    _ids = [r.id for r in RULES]
    raise RuntimeError(f"duplicate rule ids: {sorted({i for i in _ids if _ids.count(i) > 1})}")

__all__ = ["RULES", "RULES_BY_ID", "Rule", "Family", "When", "Upstream"]
