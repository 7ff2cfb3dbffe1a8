"""An ``ImportError`` / ``ModuleNotFoundError``: a name or module another version of a package has, read here.

The importing frame, the copy of the package installed here, the installed Megatron lines that use it and the
requirement the importing distribution states, all read without importing anything.

Contract
--------
``ImportErrors.feed(text, where)`` is fed every line of a log; it keeps (torchrun's ``[rankN]:`` prefix removed,
anywhere in the line) each

- ``ImportError: cannot import name 'NAME' from 'PKG.MOD' (PATH)`` (``(unknown location)`` too, and Python's
  ``. Did you mean: 'X'?``), and ``... from partially initialized module 'PKG.MOD' (most likely due to a circular
  import) (PATH)``;
- ``ModuleNotFoundError: No module named 'PKG.SUB'`` (and ``; 'PKG' is not a package``), and ``No module named
  'PKG'``,

with the traceback frames above it (``<frozen importlib...>`` and ``importlib`` frames left out: the importing frame
is the innermost other one; a traceback that ended in another exception leaves none). ``findings(errors)`` gives
one finding per error, made from the rows of ``signatures.install`` (``IMPORT_NAME_MISSING``, ``CIRCULAR_IMPORT``,
``SUBMODULE_MISSING``, ``PACKAGE_NOT_INSTALLED``), id ``ROW:DOTTED`` (``import-name-missing:PKG.MOD.NAME``):

- a name: the importing file:line and the line it prints; the distribution that file belongs to
  (``installed_modules.distribution_of``); whether the copy of PKG.MOD installed here defines NAME (the line, the
  ``if`` / ``try`` around it; a submodule file of that name; a source that makes names at run time: not known), its
  nearest names; where the installed Megatron source references PKG.MOD.NAME (``foreign_attributes.megatron_references``).
  Cause: "the importing code was written for a PKG whose MOD has NAME; the run's PKG (PATH) does not: the two
  packages' versions are not a pair" (the importing file and MOD of one distribution: a mix of two versions' files).
  Fix: the PKG the importing distribution requires (its ``Requires-Dist`` line, and whether it pins a version), or
  an importing package that matches the run's PKG;
- a partially initialised module: a circular import, no version mismatch: the cycle of frames from the first frame
  in that module's file to the importing one;
- ``No module named 'PKG.SUB'``: PKG was imported in the run (Python names the first part it cannot find) but has no
  SUB: whether the copy installed here has it, where else that package has a module of that name
  (``installed_modules.elsewhere``: moved or renamed), the installed Megatron lines that import it; ``'PKG' is not a
  package``: the run's PKG is a module file, another version's a package;
- ``No module named 'PKG'``: PKG is not installed in the run's environment: whether it is here, the file that
  imports it and the distributions that require it (the importing one's ``Requires-Dist``, Megatron-Core's and
  Megatron-Bridge's).

Confidence ``FRAME_CONFIDENCE`` with the importing frame found (for a circular import: the cycle), ``PLAIN_CONFIDENCE``
otherwise. Nothing is hard-coded per package. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from dataclasses import dataclass, field

from . import foreign_attributes, installed_modules, upstream_source
from .report import Finding
from .signatures.install import CIRCULAR_IMPORT, IMPORT_NAME_MISSING, PACKAGE_NOT_INSTALLED, SUBMODULE_MISSING
from .traceback_frames import Frames, named_findings
from .upstream_checks import PREFIX

FRAME_CONFIDENCE = 0.5
PLAIN_CONFIDENCE = 0.4
MAX_ERRORS = 8
MAX_REFERENCES = 3
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
NAME_MESSAGE = re.compile(
    r"ImportError: cannot import name '(?P<name>\w+)' from (?P<partial>partially initialized module )?"
    rf"'(?P<module>{_DOTTED})'(?: \(most likely due to a circular import\))?(?: \((?P<path>[^()]{{1,1000}})\))?"
    r"(?:\. Did you mean: '(?P<near>\w+)'\?)?")
MODULE_MESSAGE = re.compile(rf"ModuleNotFoundError: No module named '(?P<module>{_DOTTED})'"
                            rf"(?:; '(?P<parent>{_DOTTED})' is not a package)?")
UNKNOWN_LOCATION = "unknown location"
OTHER_END = re.compile(r"[A-Za-z_][\w.]{0,200}(?:Error|Exception|Exit|Interrupt)(?::|$)")
"""The last line of a traceback of another exception (``RuntimeError: ...``)."""


@dataclass
class ImportErrorLine:
    module: str
    """PKG.MOD a name was imported from, or the module that was not found."""
    name: str
    """The name that could not be imported ('' for a module not found)."""
    where: str
    line: str
    path: str = ""
    """The run's file of ``module`` as the message gives it (or 'unknown location')."""
    partial: bool = False
    not_package: str = ""
    """The module Python says is not a package (``; 'PKG' is not a package``)."""
    near: str = ""
    """Python's own suggestion (``Did you mean: 'X'?``): a name the run's module has."""
    frames: list[tuple[str, int, str, str]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module

    def importing_frame(self) -> tuple[str, int, str, str] | None:
        return self.frames[-1] if self.frames else None


def _machinery(path: str) -> bool:
    p = path.replace("\\", "/")
    return p.startswith("<frozen ") or bool(re.search(r"/importlib/(?:__init__|_bootstrap\w*)\.py$", p))


class ImportErrors:
    def __init__(self) -> None:
        self.errors: list[ImportErrorLine] = []
        self._frames = Frames(skip=_machinery, other_end=OTHER_END)

    def feed(self, text: str, where: str) -> None:
        if self._frames.start_or_frame(text):
            return
        if "Error: " in text and (m := NAME_MESSAGE.search(text) or MODULE_MESSAGE.search(text)):
            self._add(m, text, where)
        else:
            self._frames.other(text)

    def _add(self, m: re.Match, text: str, where: str) -> None:
        named = m.re is NAME_MESSAGE
        e = ImportErrorLine(m.group("module"), m.group("name") if named else "", where, PREFIX.sub("", text).strip()[:300],
                            (m.group("path") or "") if named else "", bool(named and m.group("partial")),
                            "" if named else m.group("parent") or "", (m.group("near") or "") if named else "",
                            self._frames.take())
        if len(self.errors) < MAX_ERRORS and all(x.key != e.key for x in self.errors):
            self.errors.append(e)


def findings(errors: list[ImportErrorLine]) -> list[Finding]:
    return named_findings(errors, lambda e: _name(e) if e.name else _module(e))


# ---- words shared by the readers ------------------------------------------------------------------------

def _shown(path: str) -> str:
    """A file as the user knows it: below its site directory when installed, else as printed."""
    return installed_modules.site_relative(path) or path


def _frame_words(frame: tuple[str, int, str, str]) -> str:
    return f"{_shown(frame[0])}:{frame[1]}" + (f" in {frame[2]}" if frame[2] != "<module>" else "") + \
        (f": `{frame[3]}`" if frame[3] else "")


@dataclass
class _Importer:
    words: str
    """'PKG/MOD.py:12: `from ... import ...`' or ''."""
    dist: str
    """The installed distribution the importing file belongs to ('' for the run's own code)."""
    version: str


def _importer(e: ImportErrorLine) -> _Importer:
    frame = e.importing_frame()
    if frame is None:
        return _Importer("", "", "")
    rel = installed_modules.site_relative(frame[0])
    dist = installed_modules.distribution_of(rel) if rel else ""
    version = installed_modules.version_of(dist) if dist else ""
    return _Importer(_frame_words(frame), dist, version)


def _package(module: str) -> str:
    """The distribution that installs ``module`` here (found from its files), else its top-level name."""
    loc = installed_modules.locate(module)
    if loc.kind == "source" and (dist := installed_modules.distribution_of(loc.rel)):
        return dist
    parent = module.rsplit(".", 1)[0]
    if parent != module and (up := installed_modules.locate(parent)).kind == "source" \
            and (dist := installed_modules.distribution_of(up.rel)):
        return dist
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return "Python"
    dists = installed_modules.dists(top)
    return dists[0] if len(dists) == 1 else top


def _requires(importer: _Importer, module: str) -> str:
    """'DIST VERSION requires PKG[EXTRA] (no version pinned)', or ''."""
    lines = installed_modules.requirement_on(importer.dist, module) if importer.dist else ()
    if not lines:
        return ""
    return (f"{importer.dist} {importer.version} requires "
            + "; ".join(installed_modules.pin_words(r) for r in lines[:3]))


def _signature(row, key: str, cause: str, fix: str, sure: float, source: str, version: str):
    return dataclasses.replace(row, id=f"{row.id}:{key}", cause=cause, fix=fix, confidence=sure,
                               source=source, versions=version or row.versions)


def _references(module: str, name: str) -> list[tuple[str, int, str]]:
    return foreign_attributes.megatron_references(module, name)


def _reference_words(refs: list[tuple[str, int, str]], what: str) -> str:
    version = upstream_source.installed_version(refs[0][0])
    return (f"the installed {version} references {what} at "
            + "; ".join(f"{r}:{line}: `{text}`" for r, line, text in refs[:MAX_REFERENCES])
            + (f" (and {len(refs) - MAX_REFERENCES} more)" if len(refs) > MAX_REFERENCES else ""))


def _source(module: str) -> str:
    loc = installed_modules.locate(module)
    return f"installed:{loc.rel}" if loc.kind == "source" else IMPORT_NAME_MISSING.source


# ---- cannot import name -----------------------------------------------------------------------------------

def _installed_copy(module: str, name: str) -> tuple[str, bool | None, list[str]]:
    """What the copy installed here says of NAME in MODULE: (words, whether it has it (None: not known), nearest)."""
    loc = installed_modules.locate(module)
    here = installed_modules.version(module) or "version unknown"
    top = module.split(".")[0]
    if loc.kind == "missing":
        if loc.top_installed:
            return f"{top} is installed here ({here}) but has no module {module}", False, []
        return f"{top} is not installed here: whether a {top} release has {module}.{name} is not known from here", None, []
    if installed_modules.submodule(loc, name):
        return f"the copy installed here ({here}) has {name} as a submodule of {module}", True, []
    if loc.kind != "source":
        return f"{module} is installed here ({here}) as a {loc.kind} module: its names are not read", None, []
    tree = installed_modules.tree(loc)
    names = installed_modules.top_level(tree)
    if name in names:
        line, guards = names[name]
        when = f", under {' and '.join(guards)}" if guards else ""
        return f"the copy installed here ({here}) defines {name} at {loc.rel}:{line}{when}", True, []
    if why := installed_modules.opaque(tree):
        return (f"the copy installed here ({here}, {loc.rel}) makes names at run time ({why}): whether it has {name} "
                "is not known from its source"), None, []
    near = difflib.get_close_matches(name, sorted(n for n in names if n != "*"), n=3, cutoff=0.7)
    return (f"the copy installed here ({here}, {loc.rel}) has no {name} either"
            + (f" (nearest: {', '.join(near)})" if near else "")), False, near


def _name(e: ImportErrorLine):
    if e.partial:
        return _circular(e)
    importer = _importer(e)
    pkg = _package(e.module)
    where = ("unknown location: a namespace package without that module's file" if e.path == UNKNOWN_LOCATION
             else f"at {e.path}" if e.path else "")
    at = f" ({where})" if where else ""
    detail = [f"imported at {importer.words}" + (f" ({importer.dist} {importer.version})" if importer.dist else "")
              if importer.words else "the importing frame is not in the log"]
    if e.near:
        detail.append(f"Python suggests {e.near}: a name the run's {e.module} has (renamed?)")
    copy, has, near = _installed_copy(e.module, e.name)
    detail.append(copy)
    refs = _references(e.module, e.name)
    if refs:
        detail.append(_reference_words(refs, f"{e.module}.{e.name}"))
    who = f"the importing code ({importer.words})" if importer.words else "the importing code"
    same = importer.dist and importer.dist == pkg
    if same:
        cause = (f"{who} and {e.module} are both {pkg}'s, yet the run's {e.module}{at} has no {e.name}: the run's {pkg} "
                 "mixes files of two versions (a partial upgrade, or a source tree on the path over the installed one)")
    else:
        cause = (f"{who} was written for a {pkg} whose {e.module} has {e.name}; the run's {pkg}{at} does not: the two "
                 "packages' versions are not a pair")
    fix = _pair_fix(e, importer, pkg, has, near, refs, same)
    sure = FRAME_CONFIDENCE if importer.words else PLAIN_CONFIDENCE
    return _signature(IMPORT_NAME_MISSING, e.key, cause, fix, sure, _source(e.module),
                      f"the installed {installed_modules.version(e.module) or pkg}"), detail


def _pair_fix(e: ImportErrorLine, importer: _Importer, pkg: str, has: bool | None, near: list[str],
              refs: list[tuple[str, int, str]], same: bool, moved: tuple[str, ...] = ()) -> str:
    if same:
        return (f"reinstall one {pkg} release whole (pip install --force-reinstall {pkg}==VERSION) and check that the run "
                f"imports it, not another copy of {e.module}")
    wants = _requires(importer, e.module)
    if importer.dist:
        loose = not any(installed_modules.pinned(r) for r in installed_modules.requirement_on(importer.dist, e.module))
        fix = (f"install the {pkg} version {importer.dist} pins" + (f" ({wants})" if wants else
                                                                    f" ({importer.dist} states no requirement on {pkg})")
               + (f": the {pkg} released together with {importer.dist} {importer.version}" if loose else "")
               + f", or a {importer.dist} release that matches the run's {pkg}")
    else:
        fix = f"install the {pkg} release the importing code was written for, or change the import to the run's {pkg} API"
    if has:
        fix += f"; the {pkg} installed here has {e.name}: run with it"
    if moved:
        fix += f"; the {pkg} installed here has it as {', '.join(moved)}: import it from there with that release"
    if near or e.near:
        fix += f" (nearest names: {', '.join(dict.fromkeys(([e.near] if e.near else []) + near))})"
    if refs and installed_modules.distribution_of(refs[0][0]) != importer.dist:
        fix += f"; the installed {upstream_source.installed_version(refs[0][0])} imports it too ({refs[0][0]}:{refs[0][1]})"
    return fix


def _circular(e: ImportErrorLine):
    file = e.module.replace(".", "/")
    ends = (f"/{file}.py", f"/{file}/__init__.py")
    norm = [(f[0].replace("\\", "/"), f) for f in e.frames]
    start = next((i for i, (p, _) in enumerate(norm) if (e.path and p == e.path.replace("\\", "/")) or p.endswith(ends)),
                 None)
    cycle = [f for _, f in norm[start:]] if start is not None else []
    frame = e.importing_frame()
    who = f" when {_frame_words(frame)} imported {e.name} from it" if frame else ""
    detail = ([f"the import cycle: {' -> '.join(_frame_words(f) for f in cycle)}"] if len(cycle) >= 2 else
              [f"the import cycle is not in the log (no frame in {file}.py)"])
    if installed_modules.locate(e.module).kind != "missing":
        detail.append(_installed_copy(e.module, e.name)[0])
    cause = (f"a circular import, not a version mismatch: {e.module} was still being initialised{who}; {e.name} is "
             f"defined below the line of {e.module} that started the cycle, so Python found it partially initialised")
    fix = (f"break the cycle: import {e.name} inside the function that uses it (or `import {e.module}` and read "
           f"{e.module}.{e.name} when used), or move what both modules need into a third; when the cycle runs through "
           "installed packages only, importing the outermost package first (as their own entry points do) avoids it")
    sure = FRAME_CONFIDENCE if len(cycle) >= 2 else PLAIN_CONFIDENCE
    return _signature(CIRCULAR_IMPORT, e.key, cause, fix, sure, _source(e.module), ""), detail


# ---- no module named ----------------------------------------------------------------------------------------

def _module_references(dotted: str) -> list[tuple[str, int, str]]:
    """Where the installed Megatron source imports ``dotted`` (``import X``, ``from X import ...``, ``from P import S``)."""
    parent, _, last = dotted.rpartition(".")
    refs = set(_references(parent, last)) if parent else set()
    for rel, source in upstream_source.sources():
        if dotted not in source:
            continue
        for i, row in enumerate(source.splitlines(), 1):
            text = " ".join(row.split())
            if re.match(rf"(?:from {re.escape(dotted)}(?:\.\w+)* import |import {re.escape(dotted)}\b)", text):
                refs.add((rel, i, text))
    return sorted(refs)


def _module(e: ImportErrorLine):
    if "." not in e.module:
        return _not_installed(e)
    parent, _, sub = e.module.rpartition(".")
    if e.not_package:
        parent = e.not_package
    importer = _importer(e)
    pkg = _package(parent)
    detail = [f"imported at {importer.words}" + (f" ({importer.dist} {importer.version})" if importer.dist else "")
              if importer.words else "the importing frame is not in the log"]
    loc = installed_modules.locate(e.module)
    ploc = installed_modules.locate(parent)
    here = installed_modules.version(parent) or "version unknown"
    has, moved = None, ()
    if loc.kind != "missing":
        has = True
        detail.append(f"the copy installed here ({here}) has {e.module} ({loc.rel})")
    elif ploc.kind == "missing":
        detail.append(f"{parent} is not installed here: whether a release has {e.module} is not known from here"
                      if not ploc.top_installed else f"the copy installed here ({here}) has no {parent} either")
    else:
        has = False
        moved = installed_modules.elsewhere(e.module)
        detail.append(f"the copy installed here ({here}) has no {e.module} either"
                      + (f"; it has {', '.join(moved)} (moved or renamed?)" if moved else ""))
    refs = _module_references(e.module)
    if refs:
        detail.append(_reference_words(refs, e.module))
    who = f"the importing code ({importer.words})" if importer.words else "the importing code"
    if e.not_package:
        cause = (f"the run's {parent} is a module, not a package: {who} was written for a {pkg} where {parent} is a "
                 f"package with {sub}: the two packages' versions are not a pair")
    else:
        cause = (f"the run's {pkg} has {parent} but no module {e.module}: {who} was written for a {pkg} version that has "
                 "it (moved, renamed or added in another release): the two packages' versions are not a pair")
    same = importer.dist and importer.dist == pkg
    if same:
        cause = (f"{who} and {parent} are both {pkg}'s, yet the run's {pkg} has no {e.module}: it mixes files of two "
                 "versions (a partial upgrade, or a source tree on the path over the installed one)")
    fix = _pair_fix(dataclasses.replace(e, module=parent, name=sub, near=""), importer, pkg, has, [], refs, bool(same),
                    moved)
    sure = FRAME_CONFIDENCE if importer.words else PLAIN_CONFIDENCE
    return _signature(SUBMODULE_MISSING, e.module, cause, fix, sure, _source(parent),
                      f"the installed {installed_modules.version(parent) or pkg}"), detail


def _not_installed(e: ImportErrorLine):
    top = e.module
    importer = _importer(e)
    loc = installed_modules.locate(top)
    detail = [f"imported at {importer.words}" + (f" ({importer.dist} {importer.version})" if importer.dist else "")
              if importer.words else "the importing frame is not in the log"]
    detail.append(f"{top} is installed here ({installed_modules.version(top) or 'version unknown'}, {loc.rel}): the "
                  "run's environment is another one" if loc.kind != "missing" else f"{top} is not installed here either")
    own = installed_modules.requirement_on(importer.dist, top) if importer.dist else ()
    wants = [f"{importer.dist} {importer.version} requires {installed_modules.pin_words(r)}" for r in own]
    stated = [w.rpartition(" (") for w in installed_modules.megatron_requires(top)]  # (requirement, ' (', 'DIST VERSION)')
    wants += [f"{by.removesuffix(')')} requires {installed_modules.pin_words(req)}" for req, _, by in stated
              if not (importer.dist and by.startswith(f"{importer.dist} "))]
    if wants:
        detail.append("required by: " + "; ".join(wants[:4]))
    refs = _module_references(top)
    if refs:
        detail.append(_reference_words(refs, top))
    first = (own or [req for req, _, _ in stated] or [top.replace("_", "-")])[0]
    named = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", first.strip("_-"))
    dist = (installed_modules.dists(top) or [named.group(0) if named else top])[0]
    who = (f" ({importer.words}" + (f", {importer.dist}'s" if importer.dist else "") + ")") if importer.words else ""
    cause = (f"{top} is not installed in the run's environment (Python found no module {top} at all), yet the code "
             f"imports it{who}")
    fix = (f"install {dist} in the job's environment" + (f" (as required: {wants[0]})" if wants else "")
           + ", or avoid the feature that imports it")
    sure = FRAME_CONFIDENCE if importer.words else PLAIN_CONFIDENCE
    source = f"installed:{installed_modules.locate(m).rel}" if (m := _importer_module(e)) else PACKAGE_NOT_INSTALLED.source
    return _signature(PACKAGE_NOT_INSTALLED, top, cause, fix, sure, source, ""), detail


def _importer_module(e: ImportErrorLine) -> str:
    """The importing file as a dotted module installed here, or ''."""
    frame = e.importing_frame()
    rel = installed_modules.site_relative(frame[0]) if frame else ""
    if not rel.endswith(".py"):
        return ""
    dotted = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return dotted if installed_modules.locate(dotted).kind == "source" else ""
