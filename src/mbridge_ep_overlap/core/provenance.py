"""Where a value of the plan came from: the one vocabulary every plan line and finalized field uses.

Contract: ``Source`` has exactly five members and their words are the only provenance words the
plan prints - ``requested`` (the caller passed it: an argument of ``enable_ep_overlap``, a flag),
``the recipe's`` (the recipe, or the config given, set it and it was kept), ``default`` (this
package's choice where nobody made one), ``set by resolve`` (an edit of ``resolve='auto'``), ``set by
an override`` (``--set`` / Hydra-style overrides, or the launcher's environment). ``labelled`` writes
a reason with its source first, so a reader (and a test) finds the source in one place.
``settled_source`` is the word of a choice as ``base.choices.settle_choices`` settled it.
"""

from __future__ import annotations

import enum

from ..base.choices import CONFIG, DEFAULT, FLAG, REGISTRY, Settled


class Source(enum.Enum):
    REQUESTED = "requested"
    RECIPE = "the recipe's"
    DEFAULT = "default"
    RESOLVE = "set by resolve"
    OVERRIDE = "set by an override"

    def labelled(self, why: str = "") -> str:
        """``"<source>: <why>"`` (``"<source>"`` alone without a why)."""
        return f"{self.value}: {why}" if why else self.value


PRECEDENCE = (Source.RESOLVE, Source.OVERRIDE, Source.REQUESTED, Source.DEFAULT, Source.RECIPE)
"""For a value derived from several (``num_microbatches`` from the batch sizes and DP): the first of
these among its inputs' sources - the latest hand that moved any input."""


def strongest(sources: list[Source]) -> Source:
    """The source of a value derived from values of ``sources`` (``PRECEDENCE``); the recipe's when none."""
    return next((s for s in PRECEDENCE if s in sources), Source.RECIPE)


_SETTLED = {FLAG: Source.REQUESTED, REGISTRY: Source.RECIPE, CONFIG: Source.RECIPE, DEFAULT: Source.DEFAULT}


def settled_source(settled: Settled) -> Source:
    """The plan's word for a settled choice: a flag is requested, the registry row and the config's own
    value are the recipe's, the library's default is default."""
    return _SETTLED[settled.source]
