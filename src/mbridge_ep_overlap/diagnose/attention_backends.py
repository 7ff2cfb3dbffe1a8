"""Transformer Engine's attention-backend choice, read from the lines of its ``DotProductAttention`` logger.

Contract
--------
``AttentionBackends.feed(text, where, rank=None)`` is fed every line of a log (a logging prefix, TE's own
``[DEBUG    | DotProductAttention]: ``, torchrun's ``[rank0]: ``, is skipped: the lines are searched, not
anchored) and keeps, per call of TE's ``get_attention_backend`` (``transformer_engine/pytorch/attention/
dot_product_attention/utils.py``; one stream per file and rank, a call starting at its ``Running with
config=`` line), the reasons TE gives for each backend it disables (``Disabling <backend> <reason>``,
the reason verbatim), the inputs its config line names, its ``Available backends = {...}`` and ``Selected
backend = ...`` lines, ``DotProductAttention``'s INFO line ``Running with <backend> backend (...)``, TE's
warning that flash-attn is not installed (issued only when FusedAttention does not take the input) and the
``ValueError: No dot product attention backend is available ...`` (``... support for the provided inputs!`` before
TE 2.2). ``HEADS`` holds the fixed words of each of those formats, ``LINES`` the expressions that read them and
``READS`` which lines each signature is read from; the parity tests render TE's own format strings from the
excerpts the signatures name and read them back.

``findings(read)`` gives, from ``signatures.fallback`` / ``signatures.config_error``:

- ``te-attention-unfused`` when a call ran UnfusedDotProductAttention (TE's choice says so, or, with no
  choice logged, FusedAttention and FlashAttention were both disabled and the unfused backend was not):
  cause "Transformer Engine runs attention unfused: BACKEND: REASON; ..." (each disabled backend, its
  reason verbatim), a fix read from the reasons (the input a "Found:" part or an "unsupported X = V" names,
  an ``NVTE_*_ATTN=0`` switch, cuDNN finding no fused kernel, FP8), and what running unfused costs;
- ``te-no-attention-backend`` for the ValueError (or a ``Selected backend = NoBackend`` call): the reasons
  the log gives for every backend, or that it gives none and to rerun with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2;
- ``te-fp8-attention-disabled`` when FusedAttention (TE's FP8 attention path) or all backends were disabled
  for an FP8 reason (FP8, current / delayed scaling, MXFP8, an FP8 recipe's name, the arch it needs) and
  FusedAttention did not run: the FP8 reasons verbatim, what ran instead, and the fix for that recipe.

A log with only ``Running with FusedAttention backend`` / ``FlashAttention`` lines gives nothing. Reads
nothing but the lines; bounded in what it keeps; never raises for their text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from .report import Finding
from .signatures.config_error import TE_NO_ATTENTION_BACKEND
from .signatures.fallback import TE_ATTENTION_UNFUSED, TE_FP8_ATTENTION_DISABLED

FLASH, FUSED, UNFUSED, NONE, ALL = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention", "NoBackend", "all backends"
HEADS = {
    "disabling": "Disabling ",
    "running": "Running with ",
    "available": "Available backends = {FlashAttention=",
    "selected": "Selected backend = ",
    "flash-attn": " may provide important feature support or performance improvement.",
    "no-backend": "No dot product attention backend is available for the provided inputs.",
    "no-backend-before-2.2": "No dot product attention support for the provided inputs!",
}
"""The fixed words of each TE line read here, as TE v2.18 writes them (the parity test finds each in an excerpt)."""
_BACKEND = r"FlashAttention(?: \d(?: and \d)?)?|FusedAttention|UnfusedDotProductAttention|all backends"
LINES = {
    "disabling": re.compile(re.escape(HEADS["disabling"]) + rf"(?P<backend>{_BACKEND})\b\s*(?P<reason>.*?)\s*$"),
    "running": re.compile(re.escape(HEADS["running"]) + rf"(?P<backend>{FLASH}|{FUSED}|{UNFUSED}) backend"
                          r"(?: ?\((?P<detail>[^)]*)\))?"),
    "config": re.compile(re.escape(HEADS["running"]) + r"config=\{"),
    "available": re.compile(re.escape(HEADS["available"]) + r"(?P<flash>True|False)[^,]*, FusedAttention="
                            r"(?P<fused>True|False)[^,]*, UnfusedDotProductAttention=(?P<unfused>True|False)\}"),
    "selected": re.compile(re.escape(HEADS["selected"]) + rf"(?P<backend>{FLASH}|{FUSED}|{UNFUSED}|{NONE})"
                           r"(?: \((?P<detail>[^)]*)\))?\.?\s*$"),
    "flash-attn": re.compile(r"(?P<what>flash-attn(?: v\d)?)" + re.escape(HEADS["flash-attn"]) + r"(?P<rest>.*)"),
    "no-backend": re.compile(re.escape(HEADS["no-backend"]) + "|" + re.escape(HEADS["no-backend-before-2.2"])),
}
READS = {
    TE_ATTENTION_UNFUSED.id: ("running", "disabling", "available", "selected", "flash-attn"),
    TE_NO_ATTENTION_BACKEND.id: ("no-backend", "no-backend-before-2.2"),
    TE_FP8_ATTENTION_DISABLED.id: ("disabling",),
}
"""Which of ``HEADS``' lines each signature's finding is read from (its excerpts hold those lines)."""
_NOT_A_REASON = re.compile(r"^to (?:give|prefer) ")
"""A choice between two working backends ("to give FusedAttention preference on Hopper+"), not a failure."""
_SUPPORTED = re.compile(r"Supported(?: after padding)?: .*?(?=Found: |$)")
FP8 = re.compile(r"FP8|fp8|Float8|NVFP4|BlockScaling|DelayedScaling|CustomRecipe|[Cc]urrent scaling|[Dd]elayed scaling")
_CONFIG_KEYS = ("qkv_dtype", "qkv_layout", "num_heads", "num_gqa_groups", "head_dim_qk", "head_dim_v", "max_seqlen_q",
                "max_seqlen_kv", "attn_mask_type", "window_size", "core_attention_bias_type", "attention_dropout",
                "context_parallel", "deterministic", "fp8", "softmax_type", "compute_capability", "cudnn_version",
                "transformer_engine_version", "flash_attn_version", "flash_attn_3_version", "flash_attn_4_version")
_INPUT_KEYS = _CONFIG_KEYS[:16]
_SHAPE_KEYS = ("qkv_dtype", "qkv_layout", "head_dim_qk", "head_dim_v", "attn_mask_type", "window_size",
               "core_attention_bias_type", "attention_dropout", "softmax_type")
"""What decides whether cuDNN has a fused kernel, shown in the fix."""
_CONFIG_ITEM = re.compile(r"'(?P<key>\w+)': (?P<value>'[^']*'|\([^)]*\)|<[^>]*>|[^,{}]+)")
_FLASH_VERSIONS = ("flash_attn_version", "flash_attn_3_version", "flash_attn_4_version")
MAX_CALLS = 256
MAX_REASONS = 48
MAX_LISTED = 6
MAX_CHOICE_LINES = 8
COST = ("unfused attention materialises the s x s attention scores of every head: slower, and far more memory "
        "(it grows with the square of the sequence length)")
RERUN = "rerun with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 (TE then logs why it disables each backend)"


@dataclass(frozen=True)
class Reason:
    backend: str
    """'FusedAttention', 'FlashAttention 3', 'FlashAttention 2 and 4', 'UnfusedDotProductAttention', 'all backends'."""
    text: str
    """TE's words after the backend, verbatim ('as no backend supports the provided input')."""
    line: str
    where: str
    inferred: bool = False
    """Not a "Disabling" line: read from another line (flash-attn not installed)."""

    @property
    def fp8(self) -> bool:
        """The reason is about FP8 (what it lists as supported, such as Float8Tensor, is left out)."""
        return bool(FP8.search(_SUPPORTED.sub(" ", self.text)))

    def words(self) -> str:
        return f"{self.backend}: {self.text}" if self.text else self.backend


@dataclass
class Call:
    """One call of TE's get_attention_backend (or, where only INFO lines were logged, one choice)."""

    stream: tuple[str, str]
    reasons: list[Reason] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)
    available: dict[str, bool] | None = None
    selected: str | None = None
    running: str | None = None
    choice_lines: list[tuple[str, str]] = field(default_factory=list)
    """(where, line) of the Available / Selected / Running lines."""
    errors: list[tuple[str, str]] = field(default_factory=list)
    """(where, line) of the no-backend ValueError."""
    late: bool = False
    """Its reasons were logged after its error (an excerpt or a log that prints the traceback first)."""

    def chose(self, where: str, line: str) -> None:
        if len(self.choice_lines) < MAX_CHOICE_LINES:
            self.choice_lines.append((where, line))

    def add(self, reason: Reason) -> None:
        if len(self.reasons) < MAX_REASONS and all((r.backend, r.text) != (reason.backend, reason.text) for r in self.reasons):
            self.reasons.append(reason)

    @property
    def outcome(self) -> str | None:
        """FLASH / FUSED / UNFUSED / NONE as TE's lines say, else None (nothing logged of the choice)."""
        chosen = self.running or self.selected
        if chosen:
            return chosen.split(" (")[0]
        if self.errors:
            return NONE
        if self.available is not None:
            a = self.available
            return FLASH if a["flash"] else FUSED if a["fused"] else UNFUSED if a["unfused"] else NONE
        return None

    def off(self, backend: str) -> bool:
        return any(r.backend == ALL or r.backend == backend or (backend == FLASH and r.backend.startswith(FLASH))
                   for r in self.reasons)

    @property
    def inferred_unfused(self) -> bool:
        """No choice logged, but FusedAttention and FlashAttention were disabled and the unfused backend was not."""
        return self.outcome is None and self.off(FUSED) and self.off(FLASH) and not self.off(UNFUSED)

    def choice(self) -> str:
        return self.running or self.selected or (self.outcome or "not logged")


class AttentionBackends:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._current: dict[tuple[str, str], Call] = {}

    def feed(self, text: str, where: str, rank: str | None = None) -> None:
        if "Disabling " not in text and "Running with " not in text and " backend" not in text \
                and "flash-attn" not in text and "No dot product attention" not in text:
            return
        stream = (where.rsplit(":", 1)[0], str(rank or ""))
        line = text.strip()
        if LINES["config"].search(text):
            self._new(stream).config = _config(text)
        elif m := LINES["disabling"].search(text):
            self._open(stream).add(Reason(m["backend"], m["reason"], line, where))
        elif m := LINES["running"].search(text):
            call = self._current.get(stream)
            if call is None or call.running is not None or call.errors:
                call = self._new(stream)
            call.running = m["backend"] + (f" ({m['detail']})" if m["detail"] else "")
            call.chose(where, line)
        elif m := LINES["available"].search(text):
            call = self._open(stream)
            call.available = {k: m[k] == "True" for k in ("flash", "fused", "unfused")}
            call.chose(where, line)
        elif m := LINES["selected"].search(text):
            call = self._open(stream)
            if call.selected is not None:
                call = self._new(stream)
            call.selected = m["backend"] + (f" ({m['detail']})" if m["detail"] else "")
            call.chose(where, line)
        elif m := LINES["flash-attn"].search(text):
            call = self._open(stream)
            call.add(Reason(FLASH, f"not installed ({line[m.start():][:160]})", line, where, inferred=True))
            if not call.off(FUSED):  # TE warns only when FusedAttention does not take the input
                call.add(Reason(FUSED, "disabled (TE warns that flash-attn is missing only when FusedAttention does not "
                                "take the input; the reason is logged at NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2)", line, where,
                                inferred=True))
        elif LINES["no-backend"].search(text):
            call = self._current.get(stream)
            if call is None or call.errors or (call.outcome not in (None, NONE)):
                call = self._new(stream)
            call.errors.append((where, line))

    def _open(self, stream: tuple[str, str]) -> Call:
        """The stream's call still being decided (a new one after a choice was logged)."""
        call = self._current.get(stream)
        if call is not None and call.errors and (not call.reasons or call.late) and call.running is None \
                and call.selected is None:
            call.late = True  # the reasons printed after the error they explain (a traceback first, TE's log after it)
            return call
        if call is None or call.running is not None or call.errors:
            call = self._new(stream)
        return call

    def _new(self, stream: tuple[str, str]) -> Call:
        call = Call(stream)
        if len(self.calls) < MAX_CALLS:
            self.calls.append(call)
        self._current[stream] = call
        return call


def _config(text: str) -> dict[str, str]:
    return {m["key"]: m["value"].strip() for m in _CONFIG_ITEM.finditer(text) if m["key"] in _CONFIG_KEYS}


def _flash_not_installed(call: Call) -> bool:
    return bool(call.config) and all(call.config.get(k, "'not installed'") == "'not installed'" for k in _FLASH_VERSIONS)


def findings(read: AttentionBackends) -> list[Finding]:
    out = []
    for make in (_unfused, _no_backend, _fp8):
        if f := make(read.calls):
            out.append(f)
    return out


def _distinct(reasons) -> list[Reason]:
    """Each (backend, reason) once, FusedAttention's first (the backend the fix is mostly about), then all backends',
    FlashAttention's and the unfused backend's, each in the order logged."""
    seen, out = set(), []
    for r in reasons:
        if (r.backend, r.text) not in seen:
            seen.add((r.backend, r.text))
            out.append(r)
    return sorted(out, key=lambda r: {FUSED: 0, ALL: 1, UNFUSED: 3}.get(r.backend, 2))


def _listed(reasons: list[Reason]) -> str:
    more = f"; and {len(reasons) - MAX_LISTED} more" if len(reasons) > MAX_LISTED else ""
    return "; ".join(r.words() for r in reasons[:MAX_LISTED]) + more


def _evidence(f: Finding, calls: list[Call], reasons: list[Reason], errors: bool = False) -> None:
    """The error lines, each call's last choice line (Running with / Selected backend), then the reasons' lines."""
    for where, line in [e for c in calls for e in (c.errors if errors else [])] + [c.choice_lines[-1] for c in calls
                                                                                   if c.choice_lines]:
        f.add(f"{where}: {line[:300]}")
    for r in reasons:
        if not r.inferred:
            f.add(f"{r.where}: {r.line[:300]}")


def _inputs(calls: list[Call], keys: tuple[str, ...] = _INPUT_KEYS) -> str:
    """'head_dim_qk = 576, ... (sm90, cuDNN 9.14.0, Transformer Engine 2.18.0)' from the first config logged."""
    cfg = {k: v.strip("'") for k, v in next((c.config for c in calls if c.config), {}).items()}
    shown = [f"{k} = {cfg[k]}" for k in keys if k in cfg]
    where = [w for w in (cfg.get("compute_capability", ""), f"cuDNN {cfg['cudnn_version']}" if "cudnn_version" in cfg else "",
                         f"Transformer Engine {cfg['transformer_engine_version']}"
                         if "transformer_engine_version" in cfg else "") if w]
    return ", ".join(shown) + (f" ({', '.join(where)})" if where else "") if shown or where else ""


def _choices(calls: list[Call]) -> str:
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.choice()] = counts.get(c.choice(), 0) + 1
    return ", ".join(f"{k} ({n} call{'s' if n > 1 else ''})" for k, n in counts.items())


def _unfused(calls: list[Call]) -> Finding | None:
    ran = [c for c in calls if c.outcome == UNFUSED or c.inferred_unfused]
    if not ran:
        return None
    reasons = _distinct(r for c in ran for r in c.reasons
                        if r.backend != UNFUSED and r.backend != ALL and not _NOT_A_REASON.match(r.text))
    if not any(r.backend.startswith(FLASH) for r in reasons) and any(_flash_not_installed(c) for c in ran):
        reasons.append(Reason(FLASH, "not installed (its config line: flash_attn_version = not installed)", "", "",
                              inferred=True))
    said = (_listed(reasons) if reasons else
            f"the log gives no reason for disabling FusedAttention and FlashAttention ({RERUN})")
    hints = _hints(reasons, _inputs(ran, _SHAPE_KEYS)) if reasons else [RERUN + ", then give a fused backend an input it supports"]
    sig = dataclasses.replace(
        TE_ATTENTION_UNFUSED, cause=f"Transformer Engine runs attention unfused: {said}.",
        fix="; ".join(hints) + f". Why it matters: {COST}.")
    f = Finding(sig)
    _evidence(f, ran, reasons)
    others = [c for c in calls if c.outcome not in (UNFUSED, None)]
    f.detail.append("TE's choice: " + _choices(ran + others)
                    + ("" if any(c.outcome == UNFUSED for c in ran) else
                       " (inferred: FusedAttention and FlashAttention disabled, UnfusedDotProductAttention not)"))
    if inputs := _inputs(ran):
        f.detail.append(f"inputs (TE's 'Running with config=' line): {inputs}")
    return f


def _no_backend(calls: list[Call]) -> Finding | None:
    failed = [c for c in calls if c.errors or c.outcome == NONE]
    if not failed:
        return None
    reasons = _distinct(r for c in failed for r in c.reasons if not _NOT_A_REASON.match(r.text))
    if not reasons:  # the error's stream logged no reasons: those of a call that selected no backend elsewhere
        reasons = _distinct(r for c in calls if c.outcome == NONE for r in c.reasons if not _NOT_A_REASON.match(r.text))
    if reasons:
        cause = (f"Transformer Engine found no attention backend for the inputs; the reasons it logged: "
                 f"{_listed(reasons)}.")
        fix = "; ".join(_hints(reasons, _inputs(failed)))
    else:
        cause = ("Transformer Engine found no attention backend for the inputs, and the log gives none of its reasons "
                 "(they are logged only at NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2).")
        fix = (f"{RERUN}, then give one backend an input it supports; a Megatron-Core attention_backend other than "
               "auto (fused, flash) sets NVTE_*_ATTN=0 for the other backends, so one rejection leaves none")
    f = Finding(dataclasses.replace(TE_NO_ATTENTION_BACKEND, cause=cause, fix=fix))
    _evidence(f, failed, reasons, errors=True)
    if inputs := _inputs(failed):
        f.detail.append(f"inputs (TE's 'Running with config=' line): {inputs}")
    return f


def _fp8(calls: list[Call]) -> Finding | None:
    lost = [c for c in calls if c.outcome != FUSED and any(r.fp8 and r.backend in (FUSED, ALL) for r in c.reasons)]
    if not lost:
        return None
    reasons = _distinct(r for c in lost for r in c.reasons if r.fp8)
    ran = sorted({c.outcome or "" for c in lost})
    instead = ("no backend was left (TE raised its ValueError)" if ran == [NONE] else "what ran instead: " + ", ".join(
        "no backend (TE's ValueError)" if o == NONE else o or "not logged" for o in ran))
    sig = dataclasses.replace(
        TE_FP8_ATTENTION_DISABLED,
        cause=f"FP8 attention was asked for (fp8_dpa; Megatron-Core's fp8_dot_product_attention) and Transformer Engine "
              f"disabled it: {_listed(reasons)}; {instead}.",
        fix="; ".join(_hints(reasons, "")))
    f = Finding(sig)
    _evidence(f, lost, reasons, errors=True)
    return f


_FOUND = re.compile(r"Found: (?P<found>.+?)\.?\s*$")
_UNSUPPORTED = re.compile(r"unsupported (?P<found>\w+ = .*?)\.(?: |$)")
_SUPPORTED_WHAT = re.compile(r"(?P<what>Supported(?: after padding)?: .+?)\.?\s*(?:Found: |$)")
_SWITCH = re.compile(r"NVTE_(?:FLASH|FUSED|UNFUSED)_ATTN(?:_V\d)?=0")
_CUDNN_MIN = re.compile(r"cuDNN < (?P<version>\d+(?:\.\d+)+)")
_RECIPE = re.compile(r"for (?P<recipe>\w*(?:BlockScaling|Scaling|CustomRecipe)\w*)$")


def _hints(reasons: list[Reason], inputs: str) -> list[str]:
    out: list[str] = []
    for r in reasons:
        hint = _hint(r, inputs)
        if hint and hint not in out:
            out.append(hint)
    return out[:MAX_LISTED]


def _hint(r: Reason, inputs: str) -> str:
    """What a reason asks of the run, read from TE's words."""
    b, t = r.backend, r.text
    if r.inferred and b.startswith(FLASH):  # TE warns only when FlashAttention would take the input
        return ("install flash-attn (TE's warning names the versions): FlashAttention would take these inputs"
                if "may provide" in r.line else "")
    if switches := sorted(set(_SWITCH.findall(t))):
        return (f"{b} is switched off in the environment ({' or '.join(switches)}; Megatron-Core sets these from "
                "model.attention_backend): unset them, or attention_backend=auto")
    if r.fp8:
        return _fp8_hint(r)
    if m := _FOUND.search(t) or _UNSUPPORTED.search(t):
        supported = s["what"] if (s := _SUPPORTED_WHAT.search(t)) and len(s["what"]) <= 160 else ""
        return f"{b} does not take {m['found']}: change that input to one it supports" + (
            f" ({supported})" if supported else "")
    if "no backend supports the provided input" in t:
        return ("cuDNN (FusedAttention's kernels) has no fused kernel for these inputs" + (f" ({inputs})" if inputs else "")
                + ": change the head dimensions, mask, layout, dtype, dropout or bias to a combination cuDNN supports, "
                  "or use a newer cuDNN")
    if "compute capability" in t or re.search(r"\bsm\d+", t):
        return f"{b} does not run here ({t}): another GPU, or a backend this GPU has"
    return f"change what {b} rejects ({t})" if t else ""


def _fp8_hint(r: Reason) -> str:
    t = r.text
    if r.backend.startswith(FLASH):  # FusedAttention is TE's FP8 attention: its reason is the one to act on
        return ""
    if r.backend == UNFUSED:
        return "UnfusedDotProductAttention runs FP8 attention only emulated (NVTE_UnfusedDPA_Emulate_FP8=1)"
    if "arch < sm100" in t:
        return ("FusedAttention takes this FP8 recipe only on sm100+ (Blackwell): on this GPU set NVTE_DPA_FP8_RECIPE="
                "DelayedScaling (FP8 attention with delayed scaling; the linear layers keep their recipe) or "
                "NVTE_DPA_FP8_RECIPE=F16 (attention in BF16), or turn fp8_dot_product_attention off")
    if "sm120" in t:
        return "FP8 attention does not run on sm120: NVTE_DPA_FP8_RECIPE=F16 keeps attention in BF16"
    if m := _CUDNN_MIN.search(t):
        extra = " or allow non-deterministic algorithms (NVTE_ALLOW_NONDETERMINISTIC_ALGO=1)" if "determinism" in t else ""
        return f"use cuDNN {m['version']} or newer (the cuDNN Transformer Engine loads){extra}, or NVTE_DPA_FP8_RECIPE=F16"
    if "9.23.0/9.23.1" in t:
        return "use a cuDNN other than 9.23.0 / 9.23.1 for MXFP8 attention, or NVTE_DPA_FP8_RECIPE=F16"
    if "fp8_mha=True" in t:
        return "MXFP8 attention does not take fp8_mha=True: turn fp8_mha off"
    if "thd" in t:
        return f"FusedAttention does not take packed (thd) input for FP8 here ({t}): NVTE_DPA_FP8_RECIPE=F16 for packed runs"
    if m := _RECIPE.search(t):
        return (f"FusedAttention has no FP8 path for {m['recipe']}: set NVTE_DPA_FP8_RECIPE to a recipe it takes "
                "(DelayedScaling, as the table in Transformer Engine's dot_product_attention.py says per linear "
                "recipe) or F16 (attention in BF16)")
    return f"meet what {r.backend} asks for FP8 ({t}), or keep attention in BF16 (NVTE_DPA_FP8_RECIPE=F16)"
