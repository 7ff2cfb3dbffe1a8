"""One signature, one parity check: every pattern matches the text upstream really emits, and that text
is still what upstream emits - triggered for real on CPU (MCore's TransformerConfig asserts, MB's flex
fallback warning and validation error, CPython's faulthandler), read from the installed package's
source otherwise (so an upstream rewording fails here, not for a user), or, for DeepEP / NVSHMEM / TE
kernel text not installed here, quoted verbatim from a corpus report whose URL is the source, or matched
against a few upstream source lines kept at a named commit (``fixtures/upstream_text``)."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import pytest

from mbridge_ep_overlap.diagnose.signatures import SYMPTOMS, all_signatures
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.build import ASSEMBLED, TRIGGERED
from mbridge_ep_overlap.diagnose.signatures.launch import SLURM_BINARY, STORE_TRIGGERED
from mbridge_ep_overlap.diagnose.signatures.runtime import CHECKED

SITE = Path(__import__("megatron.core").core.__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "fixtures" / "failure_reports"
SIGS = all_signatures()
BY_ID = {s.id: s for s in SIGS}


def matches(sig, text: str) -> bool:
    return any(p.search(text) for p in sig.compiled())


def test_signatures_are_well_formed():
    assert len(SIGS) >= 30
    for s in SIGS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", s.id), s.id
        assert s.symptom in SYMPTOMS and s.found_by in FOUND_BY
        assert s.cause.strip() and s.fix.strip() and s.source.strip()
        assert s.patterns or s.found_by != "patterns", f"{s.id}: no pattern and no reader raises it"
        assert s.source.startswith(("installed:", "https://github.com/")), s.source
    for key in SYMPTOMS:
        assert any(s.symptom == key for s in SIGS), f"no signature for the class {key}"


@pytest.mark.parametrize("sig", [s for s in SIGS if s.patterns], ids=lambda s: s.id)
def test_every_emitted_line_is_matched(sig):
    assert sig.emitted, f"{sig.id}: has patterns but no upstream text to check them against"
    for line in sig.emitted:
        assert matches(sig, line), (sig.id, line)


def test_related_rules_exist():
    from mbridge_ep_overlap.core.rules import RULES_BY_ID

    for s in SIGS:
        assert s.rule is None or s.rule in RULES_BY_ID, (s.id, s.rule)


# ---- the installed package's source ---------------------------------------------------------------
def _templates(path: Path) -> list[re.Pattern]:
    """Every string literal of a Python file as a pattern (an f-string's fields and %-placeholders match
    anything; adjacent literals are one constant in the syntax tree, so a message split over lines is whole)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 12:
            escaped = re.sub(r"%[sd]", ".+?", re.escape(node.value))  # logger %-formats
            out.append(re.compile(re.sub(r"\\\{[^}]*?\\\}", ".+?", escaped)))  # str.format fields
        elif isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+?" for v in node.values]
            out.append(re.compile("".join(parts)))
    return out


def _so_fragments(text: str) -> list[str]:
    """The literal parts of a printed message (numbers and quoted values cut out) of 16 characters or more:
    what a shared object that prints it holds as a string."""
    # cut at what a separate format string prints: numbers, quoted values, NVSHMEM's "NULL value " / "WARN: "
    parts = re.split(r"-?\d+|'[^']*'|\"[^\"]*\"|\([^)]*\)|: |NULL value ", text)
    return [x.strip(" .") for x in parts if len(x.strip(" .")) >= 16]  # a sentence cut at a number keeps its dot


def _installed(sig) -> Path:
    path = sig.source.removeprefix("installed:").split(" ")[0]
    if path.startswith("mbridge_ep_overlap/"):
        return Path(__import__("mbridge_ep_overlap").__file__).parent / path.removeprefix("mbridge_ep_overlap/")
    return SITE / path


INSTALLED = [s for s in SIGS if s.source.startswith("installed:") and s.emitted and "python3" not in s.source
             and TRIGGERED not in s.source and ASSEMBLED not in s.source  # those: checked in test_diagnose_build
             and SLURM_BINARY not in s.source and STORE_TRIGGERED not in s.source  # those: in test_diagnose_launcher
             and CHECKED not in s.source]  # and those in test_diagnose_runtime_errors


@pytest.mark.parametrize("sig", INSTALLED, ids=lambda s: s.id)
def test_emitted_text_is_in_the_installed_source(sig):
    path = _installed(sig)
    assert path.is_file(), f"{sig.id}: {path} is not installed"
    for line in sig.emitted:
        if path.suffix in (".h", ".cuh", ".hpp"):  # a C++ header: the message is a string literal of it
            assert any(p.search(path.read_text()) for p in sig.compiled()), (sig.id, path)
            continue
        if ".so" in path.suffixes:  # a shared object, versioned (.so.3) or not
            text = re.sub(r".*\] ", "", line)
            head = text.split(":")[0]
            if "/" in head:  # a __FILE__ the library was built with
                assert head.encode() in path.read_bytes(), (sig.id, path, head)
            data = path.read_bytes()
            assert any(part.encode() in data for part in _so_fragments(text)), f"{sig.id}: no message of {path} in {line!r}"
            continue
        templates = _templates(path)
        assert any(t.search(line) or line.strip() in t.pattern.replace("\\", "") for t in templates), \
            f"{sig.id}: no string in {path} renders {line!r}"


@pytest.mark.parametrize("sig", [s for s in SIGS if s.source.startswith("installed:") and not s.emitted],
                         ids=lambda s: s.id)
def test_reader_signatures_name_an_installed_source(sig):
    assert _installed(sig).is_file(), sig.source


# ---- corpus quotes --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [s for s in SIGS if s.corpus_report], ids=lambda s: s.id)
def test_corpus_text_is_verbatim_from_its_report(sig):
    report = json.loads((CORPUS / f"{sig.corpus_report}.json").read_text())
    # dev reports, and from 2026-12-02 on the held-out ones too (read then; their numbers are no longer blind)
    assert report["split"] in ("dev", "holdout"), sig.id
    for line in sig.emitted:
        assert line in report["log"], (sig.id, line)
    if not sig.generic:
        assert sig.source == report["source_url"], (sig.id, sig.source)


def test_non_installed_text_has_a_corpus_report():
    for s in SIGS:
        if s.emitted and s.source.startswith("https://") and s.found_by == "patterns":
            assert s.corpus_report or s.quote or s.excerpts, \
                f"{s.id}: text from {s.source} with no corpus report, source quote or upstream excerpt"


_PRINTF = re.compile(r'printf\("((?:[^"\\]|\\.)*)')
_ASSERT = re.compile(r"EP_HOST_ASSERT\((.*)\);\s*$")
_THROW = re.compile(r'throw [\w:]+\("([^"]*)"\)')
_EP_V2_THROW = re.compile(r'throw EPExceptionWithLineInfo\("([^"]*)",')
_NVTE_ERROR = re.compile(r'NVTE_ERROR\("([^"]*)"')


def _renders(quote: str) -> re.Pattern:
    """What an upstream source line prints: a printf's format (its %-fields match anything), an
    EP_HOST_ASSERT's stringified condition inside DeepEP's 'Failed: Assertion error FILE:LINE 'COND'',
    a thrown message, Transformer Engine's ``NVTE_ERROR(MESSAGE, ...)`` as 'FILE:LINE in function FN: MESSAGE',
    DeepEP V2's ``EPExceptionWithLineInfo(NAME, ...)`` as 'NAME exception (FILE:LINE): ', or,
    for any other line, the identifiers it names."""
    if m := _PRINTF.search(quote):
        fmt = m.group(1).replace("\\n", "")
        return re.compile(re.sub(r"%(?:l{0,2}[dus]|p)", ".+?", re.escape(fmt).replace("%", "%")).replace("\\%", "%"))
    if m := _ASSERT.search(quote):
        return re.compile(r"Failed: Assertion error \S+:\d+ '" + re.escape(m.group(1)) + "'")
    if m := _THROW.search(quote):
        return re.compile(re.escape(m.group(1)))
    if m := _NVTE_ERROR.search(quote):  # Transformer Engine (util/logging.h): FILE ":" LINE " in function " FN ": " ARGS
        return re.compile(r"\S+:\d+ in function \S+: " + re.escape(m.group(1)))
    if m := _EP_V2_THROW.search(quote):  # DeepEP V2: name << " exception (" << file << ":" << line << "): " << error
        return re.compile(re.escape(m.group(1)) + r" exception \(\S+:\d+\): ")
    names = [w for w in re.findall(r"[A-Za-z_]\w{8,}", quote)]
    return re.compile(".*".join(re.escape(w) for w in names))


@pytest.mark.parametrize("sig", [s for s in SIGS if s.quote], ids=lambda s: s.id)
def test_quoted_source_renders_the_emitted_text(sig):
    assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}:[\w/.-]+:\d+", sig.quoted_at), sig.quoted_at
    rendered = _renders(sig.quote)
    for line in sig.emitted:
        assert rendered.search(line), (sig.id, rendered.pattern, line)


# ---- triggered for real ---------------------------------------------------------------------------
BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2, bf16=True,
            overlap_moe_expert_parallel_comm=True, expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall")
MCORE_CASES = {
    "overlap-needs-expert-parallel": dict(expert_model_parallel_size=1),
    "overlap-needs-alltoall-or-flex": dict(moe_token_dispatcher_type="allgather"),
    "overlap-needs-bf16-or-fp16": dict(bf16=False),
    "overlap-full-recompute": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "overlap-mtp-layers": dict(mtp_num_layers=2),
    "overlap-shared-expert-overlap": dict(moe_shared_expert_overlap=True, moe_shared_expert_intermediate_size=64),
    "overlap-pp-needs-vpp": dict(pipeline_model_parallel_size=2, num_layers=4, pipeline_dtype="bf16"),
    "delay-wgrad-needs-overlap": dict(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=True),
    "overlap-moe-recompute": dict(recompute_granularity="selective", recompute_modules=["moe"]),
}


@pytest.mark.parametrize("sig_id", sorted(MCORE_CASES))
def test_mcore_assert_is_recognised(sig_id):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    mutate = dict(MCORE_CASES[sig_id])
    if mutate.get("pipeline_dtype") == "bf16":
        mutate["pipeline_dtype"] = torch.bfloat16
    with pytest.raises((AssertionError, ValueError)) as raised:
        TransformerConfig(**{**BASE, **mutate})
    text = f"{type(raised.value).__name__}: {raised.value}"
    assert matches(BY_ID[sig_id], text), text
    from mbridge_ep_overlap.diagnose.engine import diagnose
    import io

    assert diagnose(["-"], stdin=io.BytesIO(text.encode())).cause_ids[0] == sig_id


def _gpu(name: str, major: int):
    return types.SimpleNamespace(name=name, major=major, minor=0)


@pytest.mark.parametrize("sig_id,backend,gpu,major", [
    ("deepep-fell-back-to-alltoall", "deepep", "NVIDIA GB200", 10),
    ("hybridep-fell-back-to-alltoall", "hybridep", "Tesla V100-SXM2-32GB", 7),
    ("ncclep-fell-back-to-alltoall", "ncclep", "NVIDIA A100-SXM4-80GB", 8),
])
def test_mb_fallback_warning_is_recognised(sig_id, backend, gpu, major, caplog):
    from megatron.bridge.training import flex_dispatcher_backend as flex
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(**BASE)
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.get_device_properties", return_value=_gpu(gpu, major)), \
            caplog.at_level(logging.WARNING):
        flex.apply_flex_dispatcher_backend(cfg, backend)
    assert cfg.moe_token_dispatcher_type == "alltoall"
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert matches(BY_ID[sig_id], text), text


@pytest.mark.parametrize("sig_id,backend,gpu,major", [
    ("deepep-backend-left-after-fallback", "deepep", "NVIDIA GB200", 10),
    ("deepep-unsupported-gpu-hopper-class", "deepep", "Tesla T4", 7),
    ("hybridep-unsupported-gpu", "hybridep", "Tesla V100-SXM2-32GB", 7),
    ("ncclep-unsupported-gpu", "ncclep", "NVIDIA A100-SXM4-80GB", 8),
])
def test_mb_flex_validation_error_is_recognised(sig_id, backend, gpu, major):
    from megatron.bridge.training import flex_dispatcher_backend as flex

    cfg = types.SimpleNamespace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend)
    with mock.patch("torch.cuda.get_device_properties", return_value=_gpu(gpu, major)), \
            pytest.raises(ValueError) as raised:
        flex.validate_flex_dispatcher_backend(cfg)
    text = f"ValueError: {raised.value}"
    assert matches(BY_ID[sig_id], text), text
    assert [s.id for s in SIGS if matches(s, text)] == [sig_id], "two signatures claim the same error"


def test_faulthandler_crash_text_is_recognised(tmp_path):
    code = "import faulthandler, os, signal; faulthandler.enable(); os.kill(os.getpid(), signal.SIGSEGV)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -11
    assert matches(BY_ID["segmentation-fault"], done.stderr), done.stderr
    code = code.replace("SIGSEGV", "SIGABRT")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert matches(BY_ID["abort-signal"], done.stderr), done.stderr


def test_iteration_line_format_is_what_mb_prints():
    """MB's own format strings from training_log, rendered, read back by the numerics reader."""
    from mbridge_ep_overlap.diagnose.iterations import IterationSeries

    source = (SITE / "megatron/bridge/training/utils/train_utils.py").read_text()
    fmt = {name: re.search(pattern, source).group(1) for name, pattern in {
        "head": r'log_string \+= "( iteration \{:8d\}/\{:8d\} \|)"',
        "ms": r'log_string \+= "( elapsed time per iteration \(ms\): \{:\.1f\} \|)"',
        "loss": r'log_string \+= "( \{\}: \{:\.6E\} \|)"',
        "skipped": r'log_string \+= "( number of skipped iterations: \{:3d\} \|)"',
        "nan": r'log_string \+= "( number of nan iterations: \{:3d\} \|)"',
    }.items()}
    assert 'f" grad norm: {grad_norm:.3f} |"' in source
    series = IterationSeries()
    for it, (loss, grad, nans) in enumerate([(10.5, 1.5, 0), (10.4, 1.6, 0), (10.3, 1.4, 0), (10.2, 224119.688, 2)], 1):
        line = (fmt["head"].format(it, 10) + fmt["ms"].format(700.0) + fmt["loss"].format("lm loss", loss)
                + f" grad norm: {grad:.3f} |" + fmt["skipped"].format(0) + fmt["nan"].format(nans))
        assert series.feed(line, f"log:{it}")
    assert list(series.numbers) == [1, 2, 3, 4] and series.loss[3] == pytest.approx(10.2)
    assert {a.kind for a in series.anomalies} == {"grad-norm-blowup", "nan-iterations"}
    assert matches(BY_ID["nan-iterations"], fmt["nan"].format(2))


# ---- upstream excerpts (Transformer Engine is not installed here) ----------------------------------------------
UPSTREAM_TEXT = Path(__file__).parent / "fixtures" / "upstream_text"
_EXCERPT = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)@(?P<commit>[0-9a-f]{40}):(?P<path>[\w/.-]+):(?P<first>\d+)-(?P<last>\d+)")


def _excerpt(at: str) -> tuple[dict, list[str]]:
    m = _EXCERPT.fullmatch(at)
    assert m, at
    path = UPSTREAM_TEXT / m["repo"].split("/")[1] / f"{m['path']}@L{m['first']}-{m['last']}.txt"
    assert path.is_file(), f"no copy of {at} at {path}"
    lines = path.read_text(encoding="utf-8").splitlines()
    header = dict(line[2:].split(": ", 1) for line in lines[:4])
    assert header == {"repo": m["repo"], "commit": m["commit"], "path": m["path"],
                      "lines": f"{m['first']}-{m['last']}"}, (at, header)
    body = lines[4:]
    assert len(body) == int(m["last"]) - int(m["first"]) + 1, (at, len(body))
    return header, body


def _joined(body: list[str]) -> str:
    """The lines with Python's adjacent string literals joined (a message split over lines is whole)."""
    return re.sub(r'"\s*\n\s*f?"', "", "\n".join(body))


def _read_by(sig) -> tuple[re.Pattern, ...]:
    """What finds a signature in a line: its patterns, or, for one a reader raises, the fixed words of the upstream
    lines that reader reads for it (test_diagnose_attention_backends renders and reads those lines whole)."""
    if sig.patterns:
        return sig.compiled()
    from mbridge_ep_overlap.diagnose import attention_backends
    from mbridge_ep_overlap.diagnose.signatures.runtime import IBV_WC_NAMES, IBV_WC_STATUS

    def ib_status(s):  # the ibv_wc_status names the runtime-error reader maps to the row (any other: the generic one)
        names = [n for n in IBV_WC_NAMES if IBV_WC_STATUS.get(n, (0, "nccl-ib-completion-error"))[1] == s.id]
        return tuple(re.compile(rf"\b{n}\b") for n in names)

    from mbridge_ep_overlap.diagnose import installed_headers, pyspy
    from mbridge_ep_overlap.diagnose.signatures.compile_checks import FEEDS, JIT_SHOWN_BY

    def compiled(s):  # a static_assert statement, or the text a feed or a JIT mark quotes (test_diagnose_static_assert)
        quoted = [t for feeds in FEEDS.values() for f in feeds for _, t in f.shown_by] + [t for _, t in JIT_SHOWN_BY]
        return (installed_headers.START,) + tuple(re.compile(re.escape(t)) for t in quoted)

    readers = {"attention-backend": lambda s: tuple(re.compile(re.escape(attention_backends.HEADS[k]))
                                                    for k in attention_backends.READS[s.id]),
               "py-spy": lambda s: tuple(re.compile(re.escape(f)) for f in pyspy.FORMATS),
               "runtime-error": ib_status, "static-assert": compiled}
    return readers[sig.found_by](sig)


@pytest.mark.parametrize("sig", [s for s in SIGS if s.excerpts], ids=lambda s: s.id)
def test_each_upstream_excerpt_is_matched_by_a_pattern(sig):
    for at in sig.excerpts:
        header, body = _excerpt(at)
        assert re.fullmatch(r"[0-9a-f]{40}", header["commit"])
        text = _joined(body)
        assert any(p.search(text) for p in _read_by(sig)), (sig.id, at)


def test_every_upstream_excerpt_belongs_to_a_signature():
    named = {at for s in SIGS for at in s.excerpts}
    for path in UPSTREAM_TEXT.rglob("*.txt"):
        header = dict(line[2:].split(": ", 1) for line in path.read_text(encoding="utf-8").splitlines()[:4])
        assert f"{header['repo']}@{header['commit']}:{header['path']}:{header['lines']}" in named, path
