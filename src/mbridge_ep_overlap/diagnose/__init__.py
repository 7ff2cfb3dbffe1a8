"""diagnose: when a run goes wrong, name the cause from what it left behind.

Contract
--------
``diagnose(paths) -> Diagnosis`` (``engine``) reads logs, Slurm output, torchrun per-rank folders and a
run's ``evidence/`` folder (``base.run_files``) and matches them against the known failure signatures
(``signatures``: one object per failure, a module per symptom class). ``Diagnosis.exit_code`` is 0 when
nothing wrong was found, 1 when a problem was (recognised or not); bad paths are ``UsageError``.
Importing this package loads neither torch nor Megatron.

``from mbridge_ep_overlap import diagnose`` names this package once any of its modules is imported
(Python binds a subpackage to its parent's attribute); the package is therefore callable, as the
function: ``diagnose(paths)`` is the same call either way.
"""

from __future__ import annotations

import sys
import types

from .engine import diagnose
from .report import Diagnosis, Finding

__all__ = ["Diagnosis", "Finding", "diagnose"]


class _CallablePackage(types.ModuleType):
    def __call__(self, paths, stdin=None) -> Diagnosis:
        return diagnose(paths, stdin)


sys.modules[__name__].__class__ = _CallablePackage
