"""Two build failures read from the toolchain's own words: code written against another release of a library's
headers than the build found, and inline PTX that this ptxas refuses.

Contract
--------
``CompileErrors.feed(text, where)`` keeps (at most ``MAX_ERRORS``) each distinct

- header-API error of nvcc's front end or GCC on a name of a known library's namespace (``NAMESPACES``: CUTLASS /
  CuTe, PyTorch, CCCL, NVSHMEM, cuDNN frontend, Transformer Engine, DeepEP): ``too many / too few arguments for class
  template "NS::X"``, ``namespace "NS" has no member "X"``, ``class "NS::X" has no member "Y"``, ``no instance of
  overloaded function "NS::X" matches``, GCC's ``'X' is not a member of 'NS'`` and ``wrong number of template
  arguments``;
- ptxas error: ``ptxas FILE, line N; error   : MESSAGE`` / ``ptxas FILE: error: MESSAGE`` (a JIT compile's form),
  with the instruction it names;
- CMake's ``Could not find NAME_LIBRARY using the following names:`` wrapped before its names (a long line): joined
  with the next line and read by the library rows' own patterns (``signatures.build``).

``findings(errors)`` gives one ``header-api:LIBRARY`` finding per library (``HEADER_API``, ``signatures.build``:
the code calls the library's NS::X in a form the headers on the include path do not have, so it was written for
another release of them) and one ``ptxas:INSTRUCTION`` finding per instruction (``PTX_REJECTED``: inline or generated
PTX that this ptxas does not accept for the target: written for another toolkit release or architecture; a plain
``sm_NN`` target where the instruction needs ``sm_NNa``: the suffix named). ``joined_findings(joined)``: for each
joined CMake line, the finding of the library row whose pattern matches it. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .report import Finding
from .sources import Held, join
from .signatures.build import HEADER_API, PTX_REJECTED
from .signatures.build import SIGNATURES as BUILD_SIGNATURES

MAX_ERRORS = 8
NAMESPACES = (("cutlass", "CUTLASS"), ("cute", "CUTLASS (CuTe)"), ("at", "PyTorch (ATen)"), ("c10", "PyTorch (c10)"),
              ("torch", "PyTorch"), ("cub", "CCCL (CUB)"), ("thrust", "CCCL (Thrust)"), ("cuda", "CCCL (libcu++)"),
              ("nvshmem", "NVSHMEM"), ("cudnn_frontend", "cuDNN frontend"), ("transformer_engine", "Transformer Engine"),
              ("deep_ep", "DeepEP"), ("hybrid_ep", "DeepEP (HybridEP)"), ("pybind11", "pybind11"))
"""(first namespace component, the library it belongs to)."""
_Q = r"[\"'\u2018\u2019`]"
HEADER_FORMS = (
    re.compile(r"error: too (?P<how>many|few) arguments for (?:class|function|alias|variable) template "
               + _Q + r"(?P<name>[\w:<>, ]+?)" + _Q),
    re.compile(r"error: namespace " + _Q + r"(?P<ns>[\w:]+)" + _Q + r" has no member " + _Q + r"(?P<member>\w+)" + _Q),
    re.compile(r"error: class " + _Q + r"(?P<name>[\w:<>, ]+?)" + _Q + r" has no member " + _Q + r"(?P<member>\w+)" + _Q),
    re.compile(r"error: no instance of (?:overloaded function|constructor|function template) " + _Q
               + r"(?P<name>[\w:<>, ]+?)" + _Q + r" matches"),
    re.compile(r"error: " + _Q + r"(?P<member>\w+)" + _Q + r" is not a member of " + _Q + r"(?P<ns>[\w:]+)" + _Q),
    re.compile(r"error: wrong number of template arguments \((?P<given>\d+), should be (?:at least |at most )?"
               r"(?P<wanted>\d+)\)"),
)
PTXAS = re.compile(r"\bptxas\b[^;:]*?(?:, line (?P<line>\d+))?\s*[;:]\s*error\s*:\s*(?P<message>.+)$")
_INSTRUCTION = re.compile(r"instruction '(?P<ins>[\w.]+)'|Instruction '(?P<ins2>[\w.]+)'|Feature '(?P<feat>[^']+)'")
_CMAKE_WRAPPED = re.compile(r"Could not find \w+_LIBRARY using the following names:\s*$")
_BARE_TARGET = re.compile(r"not supported on \.target '(?P<target>sm_(?P<n>\d+))'")
"""A target without its arch-specific ('a') or family ('f') suffix, which the newest instructions need."""
_TEMPLATE_NAME = re.compile(r"(?P<name>[A-Za-z_]\w*(?:::\w+)+)\s*<")
_PENDING_LINES = 3
"""GCC prints a template-count error's template on the lines after it (the source line, ``note: provided for``)."""


@dataclass(frozen=True)
class CompileError:
    kind: str
    """``header`` or ``ptxas``."""
    where: str
    text: str
    library: str = ""
    name: str = ""
    """NS::X (header), the instruction or feature (ptxas)."""
    message: str = ""


def _library(name: str) -> str:
    head = name.strip(":").split("::")[0]
    return next((lib for ns, lib in NAMESPACES if head == ns), "")


class CompileErrors:
    def __init__(self) -> None:
        self.errors: list[CompileError] = []
        self._pending: tuple[str, str, str] | None = None
        """(where, text, message) of a template-count error whose template is named on a later line."""
        self._pending_left = 0
        self._cmake = Held()
        """A CMake find_library line whose names are on the next line."""
        self.joined: list[tuple[str, str]] = []
        """(where, the CMake line joined with its names)."""

    def feed(self, text: str, where: str) -> None:
        if len(self.errors) >= MAX_ERRORS:
            return
        if (held := self._cmake.take()) is not None:
            if len(self.joined) < MAX_ERRORS:
                self.joined.append((where, join(held[1], text)))
        elif "_LIBRARY using the following names" in text and _CMAKE_WRAPPED.search(text):
            self._cmake.hold(text.strip(), where)
        if self._pending is not None:
            if (m := _TEMPLATE_NAME.search(text)) is not None and _library(m["name"]):
                at, line, message = self._pending
                self._add(CompileError("header", at, line, library=_library(m["name"]), name=m["name"], message=message))
                self._pending = None
            else:
                self._pending_left -= 1
                if self._pending_left <= 0:
                    self._pending = None
        error = self._read(text.strip()[:500], where)
        if error is not None:
            self._add(error)

    def _add(self, error: CompileError) -> None:
        if all((e.kind, e.library, e.name) != (error.kind, error.library, error.name) for e in self.errors):
            self.errors.append(error)

    def _read(self, text: str, where: str) -> CompileError | None:
        if "error" not in text:
            return None
        if (m := PTXAS.search(text)) is not None:
            i = _INSTRUCTION.search(m["message"])
            name = (i["ins"] or i["ins2"] or i["feat"]) if i else ""
            return CompileError("ptxas", where, text, name=name, message=m["message"].strip())
        for form in HEADER_FORMS:
            if (m := form.search(text)) is None:
                continue
            groups = m.groupdict()
            if groups.get("given"):
                self._pending, self._pending_left = (where, text, text[m.start():].removeprefix("error: ")), _PENDING_LINES
                return None
            name = groups.get("name") or f"{groups.get('ns')}::{groups.get('member')}"
            library = _library(name)
            if library:
                return CompileError("header", where, text, library=library, name=name.split("<")[0].strip(),
                                    message=text[m.start():].removeprefix("error: ")[:200])
        return None

    def finish(self) -> None:
        self._pending = None
        self._cmake.clear()


def joined_findings(joined: list[tuple[str, str]]) -> list[Finding]:
    """The library rows' findings for CMake lines joined with their wrapped names."""
    out: dict[str, Finding] = {}
    for where, text in joined:
        for sig in BUILD_SIGNATURES:
            if sig.id.endswith("-link-library-not-found") and any(p.search(text) for p in sig.compiled()):
                out.setdefault(sig.id, Finding(sig)).add(f"{where}: {text}")
    return list(out.values())


def findings(errors: list[CompileError]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for e in errors:
        if e.kind == "header":
            key = f"{HEADER_API.id}:{re.sub(r'[^a-z0-9]+', '-', e.library.lower()).strip('-')}"
            if key not in out:
                cause = (f"The code being compiled uses {e.library}'s {e.name} in a form the {e.library} headers this "
                         f"build found do not have ({e.message}): it was written against another release of "
                         f"{e.library} than the one on the include path.")
                fix = (f"build against the {e.library} release the project pins (its submodule, requirements or "
                       f"container), or use a release of the project written for the {e.library} installed; the "
                       "include path of the failing command shows which headers were found")
                out[key] = Finding(dataclasses.replace(HEADER_API, id=key, cause=cause, fix=fix))
            out[key].add(f"{e.where}: {e.text}")
            continue
        key = f"{PTX_REJECTED.id}:{e.name or 'ptx'}"
        if key not in out:
            what = f"'{e.name}'" if e.name else "its PTX"
            bare = _BARE_TARGET.search(e.message)
            if bare is not None and int(bare["n"]) >= 90:
                t = bare["target"]
                cause = (f"ptxas refused {what} ({e.message}): the build targets plain {t}, without the arch-specific "
                         f"suffix ({t}a, or the family target {t}f) that these instructions exist on; the arch list the "
                         "build passes lost the suffix.")
                fix = (f"build for {t}a (-gencode arch=compute_{bare['n']}a,code=sm_{bare['n']}a; "
                       f"TORCH_CUDA_ARCH_LIST={bare['n'][:-1]}.{bare['n'][-1]}a) or the family target, as the library's "
                       "own build does for its other architectures")
            else:
                cause = (f"ptxas refused {what} ({e.message}): PTX written inline in the source (asm volatile) or "
                         "generated by a JIT compile that this CUDA toolkit's ptxas does not accept for the target "
                         "architecture; the code was written for another toolkit release or another architecture.")
                fix = ("use the CUDA toolkit release the library supports for this GPU, or a release of the library whose "
                       "PTX builds with this one (the instruction and line ptxas names locate it); for 'requires .target "
                       "sm_NN', build only for architectures from sm_NN on")
            out[key] = Finding(dataclasses.replace(PTX_REJECTED, id=key, cause=cause, fix=fix))
        out[key].add(f"{e.where}: {e.text}")
    return list(out.values())
