"""A ``TypeError`` raised where one package's code meets another's: an argument layout of another version.

Contract
--------
``TypeErrors.feed(text, where)`` is fed every line of a log (``finish()`` after each source); it keeps each traceback
(its frames and the line each prints; torchrun's ``[rankN]:`` prefix removed) that ends in ``TypeError: MESSAGE``, at most
``MAX_ERRORS``, one per message and innermost frame. ``findings(errors)`` names each that crosses a package boundary:

- the frame that chose the arguments, A's: the innermost one that is neither Python's own (``<frozen ...>``,
  ``<string>``, the standard library) nor a pure forwarder (its line passes ``*args, **kwargs`` on) nor a ``raise`` (a
  check of the package's own, left to the other readers);
- the other package, B: the nearest frame above it in another package (B's code calls A's: A wraps or replaces B's
  function, or B calls A with a layout A's version does not take), else the package of the function the message names
  (A calls B's function: the name's module through the imports of A's installed file, or the dotted call A's line
  prints);
- a package is read from the path alone (``package_of``): the first folder below ``site-packages`` / ``dist-packages``
  or below a pasted log's elided prefix (``.../PKG/...``);
  in a source tree the first folder named as a package installed here; else the first folder after the folders the two
  files share (one package when that folder is a package here; a file right in the shared folder is a script); for A
  only, else the file's own folder.

Inside one package (its code passes an unexpected keyword to its own installed function, which has no such parameter): a
``type-error-within:A:FUNCTION:KEYWORD`` finding from the ``TYPE_ERROR_WITHIN_PACKAGE`` row when the installed version of
the calling function (the frame's def, ``call_signatures.calls_in``) calls that function: no longer with the keyword (the
run's release has a bug fixed here; ``WITHIN_FIXED_CONFIDENCE``) or with it too (``WITHIN_SAME_CONFIDENCE``); else,
and with only a script's frames, no finding. Else one
``type-error:A:B:FUNCTION`` finding from the ``TYPE_ERROR_ACROSS_PACKAGES`` row (``signatures.install``): both frames
(file:line and the line printed), the cause "A's code was written for a version of B whose FUNCTION had another
signature or argument layout", and, when the function the message names is in the source installed here
(``call_signatures.find``: B's frame's module, what it or A's module imports under that name, the call's dotted
prefix), its signature and whether the keyword or argument count the message names fits it. The fix: the versions of
A and B released to work together (A's ``Requires-Dist`` on B when A's metadata is installed here; else "check A's
supported B versions"), or an updated A. ``CONFIDENCE`` with both packages' frames, ``NAMED_CONFIDENCE`` with B known
from the function alone. Nothing is imported; never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field

from . import call_signatures, installed_modules
from .import_errors import _frame_words
from .report import Finding
from .signatures.install import TYPE_ERROR_ACROSS_PACKAGES, TYPE_ERROR_WITHIN_PACKAGE
from .traceback_frames import Frames, named_findings
from .upstream_checks import PREFIX

CONFIDENCE = 0.45
NAMED_CONFIDENCE = 0.4
WITHIN_FIXED_CONFIDENCE = 0.6
"""One package's call the installed release no longer makes: the run's release has a bug fixed here."""
WITHIN_SAME_CONFIDENCE = 0.5
SHOWN_SITES = 3
MAX_ERRORS = 8
MESSAGE = re.compile(r"(?:^|[\s:])(?:[\w.]+\.)?TypeError: (?P<message>.+?)\s*$")
OTHER_END = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)(?::|$)")
_FORWARD = re.compile(r"\(\s*\*\w+\s*,\s*\*\*\w+\s*\)")
_GENERIC_FOLDERS = frozenset({"tests", "test", "examples", "scripts", "docs", "src", "tools", "benchmarks", "utils",
                              "common", "build", "lib", "data", "python"})
"""Folder names some wheels install at top level that are no package a path can be named by."""
_STDLIB = re.compile(r"/lib(?:64)?/python3(?:\.\d+)?/(?!(?:site|dist)-packages/)")


@dataclass
class TypeErrorLine:
    message: str
    where: str
    line: str
    frames: list[tuple[str, int, str, str]] = field(default_factory=list)
    """(file, line, function, the line printed) outermost first."""


class TypeErrors:
    def __init__(self) -> None:
        self.errors: list[TypeErrorLine] = []
        self._frames = Frames(other_end=OTHER_END)

    def feed(self, text: str, where: str) -> None:
        if self._frames.start_or_frame(text):
            return
        if "TypeError: " in text and (m := MESSAGE.search(PREFIX.sub("", text))):
            frames = self._frames.take()
            if frames and len(self.errors) < MAX_ERRORS and all(
                    (e.message, e.frames[-1][:2]) != (m.group("message"), frames[-1][:2]) for e in self.errors):
                self.errors.append(TypeErrorLine(m.group("message")[:500], where, PREFIX.sub("", text).strip()[:300],
                                                 frames))
        else:
            self._frames.other(text)

    def finish(self) -> None:
        self._frames.take()


def findings(errors: list[TypeErrorLine]) -> list[Finding]:
    return named_findings(errors, _named)


# ---- packages from paths ----------------------------------------------------------------------------------------

def _norm(path: str) -> str:
    return path.replace("\\", "/")


def python_own(path: str) -> bool:
    p = _norm(path)
    return p.startswith("<") or bool(_STDLIB.search(p))


def _identifier(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*", name))


def package_of(path: str, other: str = "", strong: bool = False) -> str:
    """The package a file is in, from its path and, outside an installation, the other file's ('' for Python's own, or
    a script); ``strong``: only from an installation's layout, a package installed here, or the shared folders."""
    p = _norm(path)
    if python_own(p):
        return ""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            top = p.rsplit(marker, 1)[1].split("/")[0].removesuffix(".py")
            return top if _identifier(top) else ""
    folders = [x for x in p.split("/")[:-1] if x]
    if len(folders) >= 2 and folders[0] in ("...", "\u2026") and _identifier(folders[1]):
        return folders[1]  # a pasted log's elided prefix (".../PKG/...") stands for the installation's folder
    installed = installed_modules.top_names()
    for part in folders:
        if part in installed and part not in _GENERIC_FOLDERS and _identifier(part):
            return part
    others = [x for x in _norm(other).split("/")[:-1] if x] if other else []
    shared = 0
    while shared < min(len(folders), len(others)) and folders[shared] == others[shared]:
        shared += 1
    if shared >= 2:
        inside = _is_package("/" + "/".join(folders[:shared]))
        if inside:  # both files in one package here
            return folders[shared - 1] if _identifier(folders[shared - 1]) else ""
        if len(folders) == shared:  # a script beside the other file's folders
            return ""
        return folders[shared] if _identifier(folders[shared]) else ""
    if strong or not folders or folders[-1] in _GENERIC_FOLDERS or not _identifier(folders[-1]):
        return ""
    return folders[-1]


def _is_package(folder: str) -> bool:
    try:
        return os.path.isfile(os.path.join(folder, "__init__.py"))
    except (OSError, ValueError):
        return False


def _chooser(frames: list[tuple[str, int, str, str]]) -> int | None:
    for i in range(len(frames) - 1, -1, -1):
        path, _, _, code = frames[i]
        if python_own(path) or _FORWARD.search(code):
            continue
        return None if code.startswith("raise ") else i
    return None


# ---- the finding ------------------------------------------------------------------------------------------------

def _named(e: TypeErrorLine):
    i = _chooser(e.frames)
    if i is None:
        return None
    frame = e.frames[i]
    call = call_signatures.Call.parse(e.message)
    caller = next((f for f in reversed(e.frames[:i]) if not python_own(f[0])
                   and package_of(f[0], frame[0], strong=True) not in ("", package_of(frame[0], f[0]))), None)
    a = package_of(frame[0], caller[0] if caller else "")
    if not a:
        return None
    modules = _modules(frame, caller, call)
    found = call_signatures.find(call, modules) if call else None
    if caller is not None:
        b, sure = package_of(caller[0], frame[0], strong=True), CONFIDENCE
    else:
        b = (found.module.split(".")[0] if found else "") or _called_package(frame, call)
        sure = NAMED_CONFIDENCE
        if not b or b == a:
            return _within(e, frame, call, found, a) if b == a else None
    function = call.function if call else ""
    detail = [f"{a}'s frame (the innermost that chose the arguments): {_frame_words(frame)}"]
    detail.append(f"{b}'s frame (its caller): {_frame_words(caller)}" if caller else
                  f"{b}: the package of {function}() as {a}'s line calls it (no frame of {b} in the traceback)")
    fit = None
    if found is not None:
        fit, words = call_signatures.fits(found, call)
        detail.append(words)
    elif call is not None:
        detail.append(f"{function}() is not in the source installed here (looked in: {', '.join(modules) or 'no module'})")
    here = {p: installed_modules.version(p) for p in (a, b)}
    detail += [f"{p} installed here: {v}" if v else f"{p}: not installed here" for p, v in here.items()]
    what = f"{function}()" if function else "call into it" if caller else "function"
    layout = (f"{a}'s code ({_frame_words(frame)}) was written for a version of {b} whose {what} had another "
              f"signature or argument layout")
    how = (f"{b}'s code ({_frame_words(caller)}) calls into {a}'s" if caller else f"{a}'s code calls {b}'s {what}")
    cause = f"TypeError where {b} and {a} meet: {how} and gets `TypeError: {e.message}`; {layout}"
    if fit is True:
        cause += f" (the {b} installed here takes the call as {a} makes it: the run used another {b} version)"
    fix = _fix(a, b)
    sig = dataclasses.replace(TYPE_ERROR_ACROSS_PACKAGES, id=f"{TYPE_ERROR_ACROSS_PACKAGES.id}:{a}:{b}:{function or 'call'}",
                              cause=cause + ".", fix=fix, confidence=sure,
                              source=f"installed:{found.rel}" if found else TYPE_ERROR_ACROSS_PACKAGES.source,
                              versions=", ".join(f"{v}" for v in here.values() if v) or TYPE_ERROR_ACROSS_PACKAGES.versions)
    return sig, detail


def _within(e: TypeErrorLine, frame, call, found, package: str):
    """A keyword the run's code of one package passes to its own function, which takes none such, compared with the
    installed version of the calling function: no longer passed there (fixed in the installed release), or passed
    there too (the installed release has the same call)."""
    if call is None or call.kind != "keyword" or found is None or call_signatures.fits(found, call)[0] is not False:
        return None
    module = call_signatures.module_of(frame[0])
    sites = call_signatures.calls_in(module, frame[2], call.name) if module else []
    if not sites:
        return None
    version = found.version
    passing = [c for c in sites if call.keyword in c.keywords]
    detail = [f"the run's frame (the call): {_frame_words(frame)}",
              f"the installed {found.version}'s {found.signature} ({found.where}) has no parameter {call.keyword}"]
    detail += [f"the installed {frame[2]}() calls {call.name}() at {c.rel}:{c.line}: `{c.code}`"
               + (f" (passes {call.keyword})" if call.keyword in c.keywords else
                  f" (binds {call.keyword} in functools.partial, passed to that function instead)" if call.keyword in c.bound
                  else f" (without {call.keyword})") for c in sites[:SHOWN_SITES]]
    if passing:
        cause = (f"TypeError inside {package}: its {frame[2]}() passes {call.keyword} to its own {call.name}(), which "
                 f"takes no such parameter, and the installed {version} makes the same call: a bug of {package} "
                 "this release has too")
        fix = (f"do not pass {call.keyword} on this path (the setting that takes it there; a later {package} release "
               f"may fix the call), or bind it where {call.name}() does not see it (functools.partial)")
        sure = WITHIN_SAME_CONFIDENCE
    else:
        cause = (f"TypeError inside {package}: the run's {package} passes {call.keyword} to its own {call.name}() in "
                 f"{frame[2]}(), which takes no such parameter - a bug of the run's release; the installed {version}'s "
                 f"{frame[2]}() no longer passes it there, so the release installed here has the fix")
        fix = (f"upgrade to {version} (the release installed here) or another that no longer makes this call, or "
               f"turn off the setting that takes this path ({frame[2]}() calling {call.name}()) until then")
        sure = WITHIN_FIXED_CONFIDENCE
    sig = dataclasses.replace(TYPE_ERROR_WITHIN_PACKAGE, id=f"{TYPE_ERROR_WITHIN_PACKAGE.id}:{package}:{call.name}:{call.keyword}",
                              cause=cause + ".", fix=fix, confidence=sure, source=f"installed:{sites[0].rel}",
                              versions=version)
    return sig, detail


def _modules(frame, caller, call) -> list[str]:
    """The installed modules the named function may be in: B's frame's, what B's and A's modules import under its name,
    A's, and the dotted prefix of the call A's line prints."""
    if call is None:
        return []
    out = []
    for f in (caller, frame):
        if f is None:
            continue
        module = call_signatures.module_of(f[0])
        if module:
            out.append(module)
            for local, target in call_signatures.imports(module).items():  # under its own name or another (an alias)
                last = target.rpartition(".")[2]
                if call.name in (local, last) or call.owner and call.owner in (local, last):
                    out.append(target.rpartition(".")[0])
    dotted = _dotted_call(frame[3], call)
    if dotted:
        root, _, rest = dotted.partition(".")
        module = call_signatures.module_of(frame[0])
        target = call_signatures.imports(module).get(root) if module else ""
        full = f"{target}.{rest}" if target and rest else target or dotted
        parts = full.split(".")
        out += [".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]
    return list(dict.fromkeys(m for m in out if m and all(_identifier(x) for x in m.split("."))))


def _dotted_call(code: str, call) -> str:
    """``pkg.Widget`` from ``w = pkg.Widget(a, ...)`` for ``Widget.__init__``; '' when not printed."""
    if call is None or not code:
        return ""
    m = re.search(rf"((?:[A-Za-z_]\w*\.)*){re.escape(call.name)}\s*\(", code)
    return (m.group(1) + call.name) if m else ""


def _called_package(frame, call) -> str:
    dotted = _dotted_call(frame[3], call)
    if "." not in dotted:
        return ""
    root = dotted.split(".")[0]
    module = call_signatures.module_of(frame[0])
    target = call_signatures.imports(module).get(root, "") if module else ""
    top = (target or root).split(".")[0]
    return top if top not in ("self", "cls") and (target or top in installed_modules.top_names()) else ""


def _fix(a: str, b: str) -> str:
    dist = next(iter(installed_modules.dists(a)), "")
    wants = installed_modules.requirement_on(dist, b) if dist else ()
    if dist and wants:
        pair = f"{dist} {installed_modules.version_of(dist)} requires " + "; ".join(
            installed_modules.pin_words(r) for r in wants[:3])
    elif dist:
        pair = f"{dist} {installed_modules.version_of(dist)} states no requirement on {b}: check {a}'s supported {b} versions"
    else:
        pair = f"check {a}'s supported {b} versions ({a}'s metadata is not installed here)"
    product = "Python" if b in sys.stdlib_module_names else b
    return (f"use the versions of {a} and {product} that are released to work together ({pair}), or update {a} to a "
            f"release written for the run's {product}")
