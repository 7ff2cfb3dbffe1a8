"""Warnings the libraries raise while a command runs, split in two: import noise and warnings about the run.

Contract: inside ``Collector`` (started and ended by the stderr hold of ``runtime.exits``) every Python
warning and every warning record of the root logger (where Megatron-Bridge logs) and of the libraries
that log through a handler of their own (transformers) is kept instead of printed. A warning raised
while a module is being imported - importing Megatron on a machine without Transformer Engine, APEX or
CUDA raises a dozen "X is not installed, falling back" - is *import noise*:
it is about this machine, not about the config, and ``summary()`` says it in one line with its count. Any
other warning was raised while the recipe was built or finalized: it is about the user's run, and
``summary()`` lists each once, with how often it was raised. ``EP_OVERLAP_VERBOSE=1`` (or a command's
``-v``) starts no collector, so every warning is printed as the library wrote it. Nothing here imports
torch or Megatron.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass, field

# how a warning raised at import time is told apart: its stack passes through importlib's bootstrap
_IMPORTING = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# torch logs "No CUDA runtime is found" on its own logger (not the root) while torch.utils.cpp_extension
# is imported: import noise like the Python warnings beside it
_IMPORT_LOGGERS = ("torch.utils.cpp_extension",)
# libraries whose loggers print through a handler of their own and do not propagate to the root logger
# (transformers: "[transformers] `torch_dtype` is deprecated!", raised while MB builds a recipe's HF config);
# a filter on a parent logger never sees a child's records, so their records are taken where they are handled
_OWN_HANDLER_LIBRARIES = ("transformers",)


def _own_handler(name: str) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in _OWN_HANDLER_LIBRARIES)


def _importing() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename in _IMPORTING:
            return True
        frame = frame.f_back
    return False


@dataclass
class Collector:
    import_noise: list[str] = field(default_factory=list)
    about_run: dict[str, int] = field(default_factory=dict)
    """message -> how many times it was raised, in the order first raised"""

    def __post_init__(self) -> None:
        self._saved_show = None
        self._saved_handle = None
        self._loggers: list[logging.Logger] = []

    def start(self) -> "Collector":
        self._saved_show = warnings.showwarning
        warnings.showwarning = self._show
        self._loggers = [logging.getLogger(), *(logging.getLogger(n) for n in _IMPORT_LOGGERS)]
        for logger in self._loggers:
            logger.addFilter(self._filter)
        self._saved_handle = handle = logging.Logger.handle
        collector = self

        def handled(logger: logging.Logger, record: logging.LogRecord) -> None:
            if _own_handler(record.name) and not collector._filter(record):
                return
            handle(logger, record)

        logging.Logger.handle = handled  # type: ignore[method-assign]
        return self

    def stop(self) -> None:
        if self._saved_show is not None:
            warnings.showwarning = self._saved_show
            self._saved_show = None
        for logger in self._loggers:
            logger.removeFilter(self._filter)
        self._loggers = []
        if self._saved_handle is not None:
            logging.Logger.handle = self._saved_handle  # type: ignore[method-assign]
            self._saved_handle = None

    def _keep(self, text: str) -> None:
        if _importing():
            self.import_noise.append(text)
        else:
            self.about_run[text] = self.about_run.get(text, 0) + 1

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        where = filename.rsplit("site-packages/", 1)[-1]
        self._keep(f"{category.__name__}: {' '.join(str(message).split())} ({where}:{lineno})")

    def _filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.levelno >= logging.ERROR:
            return True
        self._keep(f"{record.levelname.lower()} from {record.name}: {' '.join(record.getMessage().split())}")
        return False

    def summary(self) -> list[str]:
        """The lines for stderr: import noise in one line, warnings about the run each once."""
        out = []
        if self.about_run:
            out.append(f"warnings Megatron-Core / Megatron-Bridge raised about this config ({len(self.about_run)}):")
            out += [f"  - {text}" + (f" ({n} times)" if n > 1 else "") for text, n in self.about_run.items()]
        if self.import_noise:
            out.append(f"({len(self.import_noise)} warnings from importing Megatron on this machine - a package it "
                       "can use is missing here, e.g. Transformer Engine, APEX or CUDA; -v or EP_OVERLAP_VERBOSE=1 "
                       "prints them)")
        return out
