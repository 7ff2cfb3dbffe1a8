"""Megatron-Bridge's Hugging Face export, read from its warnings: parameters the model bridge has no mapping for,
grouped by the module they belong to.

Contract
--------
``Unmapped.feed(text, where)`` counts each ``No mapping found for megatron_param: NAME`` line (Megatron-Bridge's
``models/conversion/model_bridge.py``) by NAME's module (``module_of``: the path with layer and expert numbers
replaced by ``*``, cut before the parameter's own name), keeping the first line of each module as evidence.
``findings(unmapped)`` gives one ``conversion-unmapped`` finding (``UNMAPPED_PARAMS``, ``signatures.config_error``)
for the whole export: how many parameters and under which top-level parts (``PARTS`` names the usual ones: the
multi-token-prediction layers ``mtp.*``, a distillation teacher ``_teacher_model.*``, the sequential experts
``local_experts.*`` - with the installed bridges that map them -, adapters), each part's count and
an example, and the fix for each part (an MTP-trained model exported with a bridge that maps no MTP weights, a
distillation wrapper exported with its teacher, a model whose modules the Hugging Face architecture lacks). Never
raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from . import upstream_source
from .report import Finding
from .signatures.config_error import UNMAPPED_PARAMS

LINE = re.compile(r"No mapping found for (?:(?:megatron_param|global_name):\s*|\.\.\.)(?P<name>[\w.]+)")
"""Both of ``model_bridge.py``'s warnings (export: ``megatron_param``; the weight-task build: ``global_name``), and a
report's copy with the head of the name cut to ``...``."""
SEQUENTIAL = "local_experts."
MAX_MODULES = 64
SHOWN = 4
PARTS = (
    ("_teacher_model.", "a distillation teacher",
     "export the student alone: unwrap the distillation model (its student module) before exporting, so the "
     "teacher's parameters are not part of the export"),
    ("mtp.", "the multi-token-prediction (MTP) layers",
     "use a Megatron-Bridge release whose bridge for this model maps the MTP weights, or export without them "
     "(mtp_num_layers None on the exported provider); Hugging Face configs without MTP have nowhere to put them"),
    (SEQUENTIAL, "the sequential experts (SequentialMLP's local_experts.N: the model was built with moe_grouped_gemm "
     "off)", "build the model with moe_grouped_gemm=True (the grouped expert layout the bridge maps), or use a "
     "Megatron-Bridge release whose bridge for this model maps local_experts"),
    ("adapter", "adapters (PEFT)", "merge the adapters into the base weights before the export, or export them with "
     "the adapter export path"),
)


def module_of(name: str) -> str:
    """``decoder.layers.23.mlp.experts.local_experts.27.linear_fc1.weight`` -> ``decoder.layers.*.mlp.experts.
    local_experts.*.linear_fc1``."""
    parts = name.split(".")
    if len(parts) > 1:
        parts = parts[:-1]
    return ".".join("*" if p.isdigit() else p for p in parts)


@dataclass
class Unmapped:
    count: int = 0
    modules: dict[str, list[str]] = field(default_factory=dict)
    """module -> [first evidence line, count as str]."""
    by_part: dict[str, int] = field(default_factory=dict)

    def feed(self, text: str, where: str) -> None:
        if "No mapping found" not in text or (m := LINE.search(text)) is None:
            return
        name = m["name"]
        self.count += 1
        part = next((prefix for prefix, _, _ in PARTS if name.startswith(prefix) or f".{prefix}" in name), "")
        self.by_part[part] = self.by_part.get(part, 0) + 1
        module = module_of(name)
        if module in self.modules:
            self.modules[module][1] = str(int(self.modules[module][1]) + 1)
        elif len(self.modules) < MAX_MODULES:
            self.modules[module] = [f"{where}: {text.strip()[:300]}", "1"]

    def finish(self) -> None:
        """Counted across every source: one export."""


def findings(u: Unmapped) -> list[Finding]:
    if not u.count:
        return []
    named = [(prefix, what, fix) for prefix, what, fix in PARTS if u.by_part.get(prefix)]
    rest = u.by_part.get("", 0)
    parts = [f"{u.by_part[p]} under {p}* ({what})" for p, what, _ in named] + \
        ([f"{rest} elsewhere in the model"] if rest else [])
    cause = (f"Converting weights between Megatron and Hugging Face, the model bridge found no mapping for {u.count} Megatron parameter(s): "
             + "; ".join(parts) + ". Those weights are not written; an export that needs every weight fails after.")
    fixes = [fix for _, _, fix in named]
    if rest:
        fixes.append("for the others: the model has modules the bridge's mapping registry does not cover - a config "
                     "that differs from the Hugging Face architecture (extra or renamed modules), or a bridge release "
                     "without those mappings")
    sig = dataclasses.replace(UNMAPPED_PARAMS, cause=cause, fix="; ".join(fixes))
    f = Finding(sig)
    for module, (line, n) in sorted(u.modules.items(), key=lambda kv: -int(kv[1][1]))[:SHOWN]:
        f.add(line)
        f.detail.append(f"unmapped: {module} ({n} parameter(s))")
    if len(u.modules) > SHOWN:
        f.detail.append(f"unmapped: {len(u.modules) - SHOWN} more module(s)")
    if u.by_part.get(SEQUENTIAL):
        mapping = sequential_bridges()
        f.detail.append("bridges of the installed Megatron-Bridge that map local_experts: "
                        + (", ".join(mapping) if mapping else "none"))
    return [f]


def sequential_bridges() -> list[str]:
    """The model-bridge modules of the installed Megatron-Bridge whose mappings name ``local_experts``."""
    return sorted(rel.rsplit("/", 1)[1].removesuffix(".py") for rel, text in upstream_source.sources()
                  if rel.startswith("megatron/bridge/models/") and not rel.startswith("megatron/bridge/models/conversion/")
                  and rel.endswith("_bridge.py")
                  and "local_experts" in text)
