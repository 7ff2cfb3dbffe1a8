"""Five mismatches between what a run has and what its code expects, read from the message alone.

Contract
--------
``Mismatches.feed(text, where)`` keeps (at most ``MAX_EACH`` of each kind, distinct):

- **version gates**: a package's check of another's version, ``Supported X versions are >= A, <= B. Found X C.`` /
  ``X maximum version A is supported`` / ``X version >= A is required`` / ``requires X >= A`` (``GATES``): the
  package, the range, the version found when printed;
- **sharded sizes**: torch's ``The size of tensor a (X) must match the size of tensor b (Y) at non-singleton
  dimension D`` where one size is a whole multiple k > 1 of the other: one operand covers k shards of what the other
  covers (a sequence-parallel / context-parallel / expert-parallel split applied to one side only);
- **expert layouts**: ``Missing key(s)`` / ``Unexpected key(s) in state_dict`` whose keys name MoE experts in one
  layout (``EXPERT_LAYOUTS``: grouped ``experts.weight1`` / ``weight2``, TE grouped ``experts.linear_fc1.weightN``,
  per-expert ``experts.local_experts.N.linear_fc1``): the checkpoint was written with another expert layout
  (``moe_grouped_gemm`` / the TE grouped-GEMM spec) than the model now built;
- **pickled classes**: ``Can't get attribute 'NAME' on <module 'M'>`` (unpickling): the installed M, read without
  importing it (``installed_modules``), lacks NAME: the data was written by another release of M's package;
- **table lookups**: ``KeyError: 'VALUE'`` right after a traceback's source line that indexes a table by name
  (``ROPE_MAPPING[rope_scaling['rope_type']](...)``): the configured VALUE has no entry in that table.

``findings(m)`` gives one finding per kept line from the rows of ``signatures.config_error`` (``VERSION_GATE``,
``SHARDED_SIZE``, ``EXPERT_LAYOUT``, ``PICKLED_CLASS``, ``TABLE_KEY``), ids ``version-gate:PACKAGE``,
``sharded-size:Kx``, ``expert-layout:LAYOUT``, ``pickled-class:NAME``, ``table-key:TABLE``,
with the numbers, the layouts or the installed version in the cause
and the fix. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from . import installed_modules
from .report import Finding
from .signatures.config_error import EXPERT_LAYOUT, PICKLED_CLASS, SHARDED_SIZE, TABLE_KEY, VERSION_GATE

MAX_EACH = 4
_V = r"(?P<{}>\d+(?:\.\d+)+(?:[.+-]?(?:post|dev|rc|a|b)\d*)?)"
"""A version: at least MAJOR.MINOR (``requires TPxEP > 1`` is a size check, not a version gate)."""
GATES = (
    re.compile(r"Supported (?P<pkg>[\w.-]+) versions are (?P<range>[^A-Z]{1,80}?)\.\s+Found (?:[\w.-]+ )?"
               + _V.format("found")),
    re.compile(r"(?P<pkg>[\w.-]+) maximum version " + _V.format("max") + r" is supported"),
    re.compile(r"(?P<pkg>[\w.-]+) (?:version )?(?P<op>>=|>|<=|<) ?" + _V.format("need") + r" (?:is |are )?required"),
    re.compile(r"requires (?P<pkg>[\w.-]+) ?(?P<op>>=|>|<=|<) ?" + _V.format("need") + r"\b(?:.*?found:? "
               + _V.format("found") + r")?"),
)
RAISED = re.compile(r"\b\w*(?:Error|Exception|Assertion\w*)\b:")
"""A raised exception's line (``ValueError: ...``): a version a package only warns about is no failure."""
GATE_WARNING = re.compile(r"\bWARN(?:ING)?\b|[Ww]arning")
SIZES = re.compile(r"The size of tensor a \((?P<a>\d+)\) must match the size of tensor b \((?P<b>\d+)\) at "
                   r"non-singleton dimension (?P<dim>\d+)")
KEYS = re.compile(r"(?P<kind>Missing|Unexpected) key\(s\) in state_dict")
EXPERT_LAYOUTS = (
    ("grouped-weight", re.compile(r"\bexperts\.weight[12]\b"), "GroupedMLP (moe_grouped_gemm, legacy stacked "
     "weight1 / weight2)"),
    ("te-grouped", re.compile(r"\bexperts\.linear_fc[12]\.weight\d+\b"), "TEGroupedMLP (moe_grouped_gemm with the "
     "Transformer Engine spec: linear_fc1.weightN per expert)"),
    ("sequential", re.compile(r"\bexperts\.local_experts\.\d+\.linear_fc[12]\b"), "SequentialMLP (one MLP per "
     "expert: local_experts.N.linear_fc1)"),
)
KEY_ERROR = re.compile(r"^(?:\w+\.)*KeyError: (?P<q>['\"])(?P<value>[^'\"]{1,80})(?P=q)\s*$")
INDEXED = re.compile(r"(?<![\w.\]])(?P<table>[A-Za-z_][\w.]*)\[")


def indexings(line: str) -> list[tuple[str, str]]:
    """(table, index source) of every ``NAME[...]`` in a source line, nested ones too."""
    out = []
    for m in INDEXED.finditer(line):
        depth, i = 1, m.end()
        while i < len(line) and depth:
            depth += {"[": 1, "]": -1}.get(line[i], 0)
            i += 1
        if depth == 0:
            out.append((m["table"], line[m.end():i - 1]))
    return out
_FRAME = re.compile(r'\.py", line \d+')
"""A traceback's frame line (its ``File "`` may be cut off in a pasted excerpt)."""
PICKLE = re.compile(r"Can't get attribute '(?P<name>\w+)' on <module '(?P<module>[\w.]+)'")


@dataclass
class Mismatches:
    gates: list[tuple[str, str, dict]] = field(default_factory=list)
    sizes: list[tuple[str, str, int, int, int]] = field(default_factory=list)
    layouts: dict[str, set[str]] = field(default_factory=dict)
    """'Missing' / 'Unexpected' -> the expert layouts its keys name."""
    layout_lines: list[str] = field(default_factory=list)
    pickled: list[tuple[str, str, str, str]] = field(default_factory=list)
    tables: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    """(where, the KeyError line, the source line, table, value)."""
    _source: str = ""
    """The last traceback source line (the line after a ``File ...`` line)."""
    _after_frame: bool = False
    _keys: str = ""
    """The kind of the key list being read (a list runs over several lines), '' outside one."""

    def feed(self, text: str, where: str) -> None:
        t = text.strip()[:4000]
        if (m := KEYS.search(t)) is not None:
            self._keys = m["kind"]
        elif self._keys and not t.startswith(('"', "'")) and "key(s)" not in t and not re.search(r"experts\.", t):
            self._keys = ""
        if self._keys:
            found = {name for name, pattern, _ in EXPERT_LAYOUTS if pattern.search(t)}
            if found:
                self.layouts.setdefault(self._keys, set()).update(found)
                if len(self.layout_lines) < 2:
                    self.layout_lines.append(f"{where}: {t[:300]}")
        if len(self.gates) < MAX_EACH and ("version" in t or "requires" in t) and RAISED.search(t[:600]) \
                and not GATE_WARNING.search(t):
            for pattern in GATES:
                if (m := pattern.search(t)) is not None:
                    if all(g[1] != t for g in self.gates):
                        self.gates.append((where, t[:300], m.groupdict()))
                    break
        if len(self.sizes) < MAX_EACH and (m := SIZES.search(t)) is not None and not GATE_WARNING.search(t):
            a, b = int(m["a"]), int(m["b"])
            big, small = max(a, b), min(a, b)
            if small > 0 and big % small == 0 and big // small > 1 and all(s[1] != t for s in self.sizes):
                self.sizes.append((where, t[:300], a, b, int(m["dim"])))
        if _FRAME.search(t):
            self._after_frame, self._source = True, ""
        elif self._after_frame:
            self._after_frame, self._source = False, t
        elif (m := KEY_ERROR.match(t)) is not None and self._source and len(self.tables) < MAX_EACH:
            indexed = [(name, index) for name, index in indexings(self._source) if name not in ("self", "cls")]
            literal = [name for name, index in indexed if index.strip() in (f"'{m['value']}'", f'"{m["value"]}"')]
            computed = [name for name, index in indexed if not re.fullmatch(r"\s*(['\"]).*\1\s*|\s*-?\d+\s*", index)]
            table = (literal or computed or [""])[0]
            if table and all(x[4] != m["value"] for x in self.tables):
                self.tables.append((where, t[:300], self._source[:300], table, m["value"]))
        if len(self.pickled) < MAX_EACH and (m := PICKLE.search(t)) is not None:
            if all(p[2] != m["name"] for p in self.pickled):
                self.pickled.append((where, t[:300], m["name"], m["module"]))

    def finish(self) -> None:
        self._keys, self._source, self._after_frame = "", "", False


def _one(row, suffix: str, cause: str, fix: str, *lines: str) -> Finding:
    """A finding of ``row`` as ``ROW_ID:suffix`` with this cause and fix, the lines its evidence."""
    f = Finding(dataclasses.replace(row, id=f"{row.id}:{suffix}", cause=cause, fix=fix))
    for line in lines:
        f.add(line)
    return f


def _gate(where: str, text: str, g: dict) -> Finding:
    pkg = g["pkg"]
    if g.get("range"):
        need = f"versions {g['range'].strip()}"
    elif g.get("max"):
        need = f"at most version {g['max']}"
    else:
        need = f"version {g.get('op', '>=')} {g['need']}"
    found = f" and found {g['found']}" if g.get("found") else ""
    cause = (f"A version check failed: the code that raised it accepts {pkg} {need}{found}: the installed {pkg} is "
             "outside the range that release was written and tested for.")
    fix = (f"install {pkg} {need} (pip install '{pkg}...' in that range), or a release of the package that raised it "
           f"whose check accepts the installed {pkg}; where {pkg} is optional, uninstall it or turn off its use")
    slug = re.sub(r"[^a-z0-9]+", "-", pkg.lower()).strip("-")
    return _one(VERSION_GATE, slug, cause, fix, f"{where}: {text}")


def _size(where: str, text: str, a: int, b: int, dim: int) -> Finding:
    k = max(a, b) // min(a, b)
    whole, shard = ("a", "b") if a > b else ("b", "a")
    cause = (f"Two tensors that must line up differ k = {k} times along dimension {dim} (tensor a {a}, tensor b {b}): "
             f"tensor {shard} holds one of {k} shards of what tensor {whole} holds - a split over {k} ranks (sequence "
             f"parallelism over a TP group of {k}, context parallelism of {k}, or an EP / DP split) applied to one "
             "operand and not the other.")
    fix = (f"find the parallel size equal to {k} in the run (TP with sequence parallelism, CP, EP) and run once "
           "without it to confirm; the code that combines the two must scatter (or gather) the other operand the same "
           "way - a bug of that code path with that parallelism, fixed upstream or avoided by not combining the two")
    return _one(SHARDED_SIZE, f"{k}x", cause, fix, f"{where}: {text}")


def _layouts(m: Mismatches) -> list[Finding]:
    missing, unexpected = m.layouts.get("Missing", set()), m.layouts.get("Unexpected", set())
    names = {name: what for name, _, what in EXPERT_LAYOUTS}
    if not missing and not unexpected:
        return []
    model = ", ".join(names[x] for x in sorted(missing)) or "(not shown)"
    ckpt = ", ".join(names[x] for x in sorted(unexpected - missing)) or "(not shown)"
    if missing and unexpected and missing != unexpected:
        cause = (f"The checkpoint's MoE experts are stored in another layout than the model now built: the model "
                 f"expects {model} and the checkpoint holds {ckpt}.")
    else:
        cause = (f"State-dict keys of MoE experts do not match ({'missing' if missing else 'unexpected'}: "
                 f"{model if missing else ckpt}): the checkpoint was written with another expert layout (grouped GEMM "
                 "or not, the Transformer Engine spec or the local one) or another expert count.")
    fix = ("build the model with the expert layout the checkpoint was saved with (moe_grouped_gemm and the layer spec "
           "as at save time), or convert the checkpoint's expert weights to the new layout; the distributed "
           "checkpoint format (torch_dist) stores experts independently of the layout and loads across them")
    key = sorted(missing or unexpected)[0]
    return [_one(EXPERT_LAYOUT, key, cause, fix, *m.layout_lines)]


def _pickled(where: str, text: str, name: str, module: str) -> Finding:
    if module == "__main__":
        cause = (f"Unpickling needs the class {name} of the script that saved the data (module __main__): the loading "
                 "process runs another script, which does not define it.")
        fix = (f"define or import {name} in the loading script before loading, or save the data with the class in an "
               "importable module (not the script itself)")
        return _one(PICKLED_CLASS, name, cause, fix, f"{where}: {text}")
    located = installed_modules.locate(module)
    version = installed_modules.version(module)
    has = name in installed_modules.top_level(installed_modules.tree(located)) if located.kind == "source" else None
    if has is False:
        here = (f"the installed {module} ({version or 'version unknown'}, {located.rel}) has no {name}: the data was "
                "written by another release of it (usually a newer one)")
    elif has:
        here = (f"the installed {module} ({version}) defines {name}: the run read the data with an older release than "
                "the one installed here")
    else:
        here = f"{module} is {'not installed here' if located.kind == 'missing' else 'not readable here'}"
    cause = (f"Unpickling needs the class {module}.{name}, which the running release does not have; {here}. A "
             "checkpoint or cached object saved by one release of a package and loaded by another.")
    fix = (f"load it with the release that wrote it (the one whose {module} defines {name}), or upgrade the loading "
           "side to it; for a distributed checkpoint, both sides need the same Megatron-Core / Megatron-Bridge line")
    return _one(PICKLED_CLASS, name, cause, fix, f"{where}: {text}")


def _table(where: str, text: str, source: str, table: str, value: str) -> Finding:
    cause = (f"The code looks the value '{value}' up in {table} ({source.strip()[:160]}) and {table} has no entry for it: "
             f"the configured '{value}' (from the config or the checkpoint's config.json) is a choice this release "
             "does not implement.")
    fix = (f"use one of the values {table} lists (its definition in the code that raised), or a release whose {table} "
           f"has '{value}'; for a model's config.json value, a release of the converter that supports that model")
    return _one(TABLE_KEY, table.rsplit(".", 1)[-1], cause, fix, f"{where}: {text}")


def findings(m: Mismatches) -> list[Finding]:
    return ([_gate(*g) for g in m.gates] + [_size(*s) for s in m.sizes] + _layouts(m)
            + [_pickled(*p) for p in m.pickled] + [_table(*t) for t in m.tables])
