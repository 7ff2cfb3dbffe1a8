"""``'NoneType' object has no attribute 'A'`` where A is a field of a Megatron-Bridge config section that defaults to
None: the recipe sets ``cfg.SECTION.A`` while ``cfg.SECTION`` was never created.

Contract
--------
``NoneSections.feed(text, where)`` keeps each ``'NoneType' object has no attribute 'A'`` (``AttributeError:`` and
torchrun's ``[rankN]:`` optional), at most ``MAX_ERRORS``, one per attribute, with the source line Python printed
above it when there is one. ``sections(attribute)`` reads the installed Megatron-Bridge ``ConfigContainer``
(``megatron/bridge/training/config.py``) for its fields declared ``Optional[X]`` / ``X | None`` with default None
whose class X (in the installed MB / MCore source, ``class_source``: its bases included) declares A. ``findings``
gives one ``none-section:SECTION.A`` finding per error whose attribute has such a section from the
``CONFIG_SECTION_NONE`` row (``signatures.config_error``): "cfg.SECTION is None (ConfigContainer.SECTION defaults to
None) and the code sets or reads its A", with the field's and the class's file:line, the fix "create cfg.SECTION =
X(...) before setting A". The printed source line choosing among several sections (``.SECTION.A``), that one at
``CONFIDENCE``; else every candidate listed at ``SEVERAL_CONFIDENCE``. An attribute no optional section declares is not
named here. Nothing is imported; never raises for what is in the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from dataclasses import dataclass

from . import class_source, upstream_source
from .report import Finding
from .signatures.config_error import CONFIG_SECTION_NONE

MAX_ERRORS = 6
CONFIDENCE = 0.6
SEVERAL_CONFIDENCE = 0.45
CONTAINER_FILE = "megatron/bridge/training/config.py"
CONTAINER = "ConfigContainer"
MESSAGE = re.compile(r"'NoneType' object has no attribute '(?P<attribute>\w+)'")
FRAME = re.compile(r'^\s*(?:\[(?:rank|default)\d+\]:\s*)*File "[^"]+", line \d+')


@dataclass
class NoneAttribute:
    attribute: str
    where: str
    text: str
    code: str = ""


@dataclass(frozen=True)
class Section:
    field: str
    """The ConfigContainer field (``comm_overlap``)."""
    cls: str
    field_at: str
    class_at: str


class NoneSections:
    def __init__(self) -> None:
        self.errors: list[NoneAttribute] = []
        self._frame = False
        self._code = ""

    def feed(self, text: str, where: str) -> None:
        if FRAME.match(text):
            self._frame, self._code = True, ""
            return
        if "NoneType" in text and (m := MESSAGE.search(text)) is not None:
            if all(e.attribute != m["attribute"] for e in self.errors) and len(self.errors) < MAX_ERRORS:
                self.errors.append(NoneAttribute(m["attribute"], where, text.strip()[:300], self._code))
            self._frame, self._code = False, ""
        elif self._frame and text.strip() and not set(text.strip()) <= set("^~ "):
            self._code, self._frame = text.strip()[:300], False

    def finish(self) -> None:
        self._frame, self._code = False, ""


def _optional_class(annotation: ast.expr | None) -> str:
    """X of ``Optional[X]`` / ``X | None`` / ``Union[X, None]`` (a single class), else ''."""
    if annotation is None:
        return ""
    text = ast.unparse(annotation)
    m = (re.fullmatch(r"Optional\[(\w+)\]", text) or re.fullmatch(r"(\w+) \| None", text)
         or re.fullmatch(r"Union\[(\w+), None\]", text))
    return m.group(1) if m else ""


def _declares(cls: str, attribute: str) -> class_source.ClassInfo | None:
    """The installed class of that name (Megatron-Bridge's first) whose body, or a base's, declares the field."""
    ranked = sorted(class_source.classes(cls), key=lambda c: not c.file.startswith("megatron/bridge/"))
    return next((c for c in ranked if any(kind == "class attribute" for _, _, kind in class_source.class_level(c, attribute))),
                None)


@functools.lru_cache(maxsize=32)
def sections(attribute: str) -> tuple[Section, ...]:
    container = next((c for c in class_source.classes(CONTAINER) if c.file == CONTAINER_FILE), None)
    if container is None:
        return ()
    out = []
    for item in container.node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        default_none = isinstance(item.value, ast.Constant) and item.value.value is None
        cls = _optional_class(item.annotation)
        if default_none and cls and (info := _declares(cls, attribute)) is not None:
            out.append(Section(item.target.id, cls, f"{CONTAINER_FILE}:{item.lineno}", info.where))
    return tuple(out)


def findings(errors: list[NoneAttribute]) -> list[Finding]:
    out = []
    for e in errors:
        candidates = sections(e.attribute)
        if not candidates:
            continue
        chosen = [s for s in candidates if f".{s.field}.{e.attribute}" in e.code] or list(candidates)
        s = chosen[0]
        version = upstream_source.installed_version(CONTAINER_FILE)
        cause = (f"cfg.{s.field} is None (ConfigContainer.{s.field} is Optional[{s.cls}] and defaults to None in the "
                 f"installed {version}, {s.field_at}) and the code sets or reads its {e.attribute}: the recipe changes "
                 f"a field of a config section it never created.")
        fix = (f"create the section before setting the field: cfg.{s.field} = {s.cls}(...) (its class: {s.class_at}), "
               f"then cfg.{s.field}.{e.attribute} = ...; or set it where the recipe builds cfg.{s.field}")
        sure = CONFIDENCE if len(chosen) == 1 else SEVERAL_CONFIDENCE
        sig = dataclasses.replace(CONFIG_SECTION_NONE, id=f"{CONFIG_SECTION_NONE.id}:{s.field}.{e.attribute}",
                                  cause=cause, fix=fix, confidence=sure, versions=f"{version} (its ConfigContainer read)")
        f = Finding(sig)
        f.add(f"{e.where}: {e.text}")
        if e.code:
            f.detail.append(f"the line that read it: `{e.code}`")
        if len(chosen) > 1:
            f.detail.append("other sections that declare it and default to None: "
                            + ", ".join(f"cfg.{o.field} ({o.cls})" for o in chosen[1:]))
        out.append(f)
    return out
