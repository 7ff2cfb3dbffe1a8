"""A compiled extension's function called with arguments its build does not take: pybind11's
``incompatible function arguments`` (Transformer Engine's ``transformer_engine_torch``, DeepEP's ``deep_ep_cpp``, ...).

Contract
--------
``ExtensionCalls.feed(text, where)`` keeps each ``NAME(): incompatible function arguments. The following argument types
are supported:`` (``TypeError:`` and torchrun's ``[rankN]:`` optional) with the numbered signatures pybind11 lists under
it (``    1. (self: ..., x: int) -> None``) and its ``Invoked with: ...`` line, at most ``MAX_ERRORS``, one per name.
``findings(errors)`` gives one ``extension-call:NAME`` finding each from the ``EXTENSION_CALL_MISMATCH`` row
(``signatures.install``): the function is compiled code whose build takes only the signatures listed, and the caller
passed another argument list: the caller (an application, Megatron-Core, Transformer Engine's Python side) and the
compiled extension are from different releases; the signatures the build supports and the call as invoked are in the
detail; where the name is a module the log's frames or lines show (``transformer_engine``, ``deep_ep``), that package
is named. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from .report import Finding
from .signatures.install import EXTENSION_CALL_MISMATCH

MAX_ERRORS = 8
MAX_OVERLOADS = 6
HEADER = re.compile(r"(?P<name>[A-Za-z_][\w.]*)\(\): incompatible (?:function|constructor) arguments\. "
                    r"The following argument types are supported:")
OVERLOAD = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?P<n>\d{1,2})\. (?P<signature>\(.*\)(?: -> .+)?)\s*$")
INVOKED = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?Invoked with:\s*(?P<args>.*)$")
PACKAGES = (("transformer_engine", "Transformer Engine"), ("deep_ep", "DeepEP"), ("hybrid_ep", "DeepEP's HybridEP"),
            ("apex", "Apex"), ("grouped_gemm", "grouped_gemm"), ("torch", "PyTorch"))
"""A module name (in a frame's path or the function's dotted name) and the package it is, most specific first."""


@dataclass
class ExtensionCall:
    name: str
    where: str
    text: str
    overloads: list[str] = field(default_factory=list)
    invoked: str = ""
    package: str = ""


class ExtensionCalls:
    def __init__(self) -> None:
        self.errors: list[ExtensionCall] = []
        self._open: ExtensionCall | None = None
        self._frames: list[str] = []

    def feed(self, text: str, where: str) -> None:
        if 'File "' in text:
            self._frames.append(text)
            del self._frames[:-20]
        if "incompatible" in text and (m := HEADER.search(text)) is not None:
            if all(e.name != m["name"] for e in self.errors) and len(self.errors) < MAX_ERRORS:
                self._open = ExtensionCall(m["name"], where, text.strip()[:300], package=self._package(m["name"]))
                self.errors.append(self._open)
            return
        if self._open is None:
            return
        if (o := OVERLOAD.match(text)) is not None:
            if len(self._open.overloads) < MAX_OVERLOADS:
                self._open.overloads.append(o["signature"][:300])
        elif (i := INVOKED.match(text)) is not None:
            self._open.invoked, self._open = i["args"][:300], None
        elif text.strip():
            self._open = None

    def _package(self, name: str) -> str:
        words = " ".join([name, *self._frames])
        return next((package for module, package in PACKAGES if module in words), "")

    def finish(self) -> None:
        self._open, self._frames = None, []


def findings(errors: list[ExtensionCall]) -> list[Finding]:
    out = []
    for e in errors:
        owner = e.package or "the extension"
        binding = e.package or "a compiled extension"
        cause = (f"{e.name} is compiled code (a pybind11 binding of {binding}) whose build takes only the argument list(s) "
                 f"it printed ({len(e.overloads) or 'none'} shown); the caller passed another: the calling code and the "
                 f"compiled extension are from different releases ({e.name}'s arguments changed between them).")
        fix = (f"use the caller and {owner} from releases made to work together (rebuild or reinstall {owner} to the "
               f"version the caller was written for, or update the caller to {owner}'s {e.name} as built)")
        sig = dataclasses.replace(EXTENSION_CALL_MISMATCH, id=f"{EXTENSION_CALL_MISMATCH.id}:{e.name}", cause=cause, fix=fix)
        f = Finding(sig)
        f.add(f"{e.where}: {e.text}")
        f.detail += [f"the build supports: {o}" for o in e.overloads]
        if e.invoked:
            f.detail.append(f"invoked with: {e.invoked}")
        if e.overloads == ["() -> None"]:
            f.detail.append(f"this build's {e.name} takes no arguments at all: the caller uses an API the build no "
                            "longer (or not yet) has in that form")
        out.append(f)
    return out
