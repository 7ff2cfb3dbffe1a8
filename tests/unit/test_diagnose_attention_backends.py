"""Transformer Engine's attention-backend choice (diagnose.attention_backends): log lines rendered from TE's own
format strings, copied from its source at the commits the signatures name (fixtures/upstream_text), read back
with and without logging prefixes; the findings' causes quote TE's reasons verbatim and their fixes read them."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_ep_overlap.diagnose import attention_backends, diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.base import TE_AT

UPSTREAM_TEXT = Path(__file__).parent / "fixtures" / "upstream_text" / "TransformerEngine"
REAL_LOG = Path(__file__).parents[2] / "docs" / "evidence" / "2026-12-01-h200x1-te-cudnn" / "te-thd-attention-before-fix.log"
BY_ID = {s.id: s for s in all_signatures()}
IDS = ("te-attention-unfused", "te-no-attention-backend", "te-fp8-attention-disabled")
DPA = "transformer_engine/pytorch/attention/dot_product_attention/"
_CALL = re.compile(r'(?:logger\.(?:debug|info|warning)|raise ValueError)\(\s*((?:f?"(?:[^"\\]|\\.)*"\s*)+)')
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
TE_FORMAT = "[%(levelname)-8s | %(name)-19s]: %(message)s"
"""TE's own handler format (AttentionLogging._formatter, transformer_engine/pytorch/attention/dot_product_attention/
utils.py line 80 at v2.18)."""
PREFIXES = ("", "te", "2026-05-18 12:51:31.9511 DEBUG:DotProductAttention: ", "[rank0]: ",
            "[rank0]: 2026-05-18 12:51:31.9511 DEBUG:DotProductAttention: ")


def formats(path: str, first: int, last: int, commit: str = TE_AT.split("@")[1]) -> list[str]:
    """The format strings of the logger calls and raises in TE's lines first-last of path (as the excerpt keeps
    them: the header names the commit), adjacent string literals joined as Python joins them."""
    lines = (UPSTREAM_TEXT / f"{path}@L{first}-{last}.txt").read_text(encoding="utf-8").splitlines()
    assert lines[1] == f"# commit: {commit}" and lines[3] == f"# lines: {first}-{last}"
    body = "\n".join(lines[4:])
    return [bytes("".join(_LITERAL.findall(m.group(1))), "utf-8").decode("unicode_escape")
            for m in _CALL.finditer(body)]


def excerpt_formats(at: str) -> list[str]:
    """The format strings of an excerpt named as the signatures name it: owner/repo@commit:path:first-last."""
    repo_commit, path, span = at.split(":")
    first, last = span.split("-")
    return formats(path, int(first), int(last), repo_commit.split("@")[1])


def fmt(path: str, first: int, last: int, starts: str) -> str:
    found = [f for f in formats(path, first, last) if f.startswith(starts)]
    assert len(found) == 1, (starts, formats(path, first, last))
    return found[0]


def logged(message: str, prefix: str, level: str = "DEBUG") -> str:
    """The line TE's handler (or another logging prefix) writes for a message."""
    if prefix == "te":
        record = logging.LogRecord("DotProductAttention", getattr(logging, level), "utils.py", 1, message, None, None)
        return logging.Formatter(TE_FORMAT).format(record)
    return prefix + message


U = DPA + "utils.py"
D = DPA + "dot_product_attention.py"
FUSED_NO_KERNEL = fmt(U, 1399, 1402, "Disabling FusedAttention as no backend")
FA2_HEAD_DIM = fmt(U, 857, 866, "Disabling FlashAttention 2") % (576, 512, 576, "9.0")
FA3_SHAPE = fmt(U, 885, 901, "Disabling FlashAttention 3") % (128, 5, 576, 512, "torch.bfloat16")
AVAILABLE = fmt(U, 1540, 1552, "Available backends")
SELECTED = fmt(U, 1568, 1575, "Selected backend")
CONFIG = fmt(U, 448, 448, "Running with config=")
RUN_FLASH = fmt(D, 1668, 1679, "Running with FlashAttention")
RUN_FUSED = fmt(D, 1668, 1679, "Running with FusedAttention")
RUN_UNFUSED = fmt(D, 1668, 1679, "Running with UnfusedDotProductAttention")
NO_BACKEND = "ValueError: " + fmt(D, 1687, 1693, "No dot product attention backend")
NO_BACKEND_2_1 = "ValueError: " + formats("transformer_engine/pytorch/attention.py", 7736, 7736,
                                          "450146ae6a16e3aa220fa7089c6193458e8f8dca")[0]
FP8_CS = fmt(U, 593, 655, "Disabling FusedAttention for FP8 current scaling on arch")
FP8_RECIPE = fmt(U, 593, 655, "Disabling FusedAttention for %s")
FA3_FP8_TRAINING = fmt(U, 566, 592, "Disabling FlashAttention 3 for FP8 training")
UNFUSED_FP8 = fmt(U, 566, 592, "Disabling UnfusedDotProductAttention for FP8")
FA2_FP8 = fmt(U, 566, 592, "Disabling FlashAttention 2 for FP8")
ENV_FUSED = fmt(U, 464, 473, "Disabling FusedAttention due to")
ENV_FA2 = fmt(U, 464, 473, "Disabling FlashAttention 2 due to")
FLASH_ATTN_MISSING = fmt(U, 1491, 1522, "flash-attn may provide") % ">= 2.1.1, <= 2.8.3"


def reason(line: str) -> str:
    """TE's words after 'Disabling <backend> '."""
    return attention_backends.LINES["disabling"].search(line)["reason"]


def run(lines: list[str], prefix: str = ""):
    text = "\n".join(line if line.startswith(("ValueError", "Traceback", " ")) and not prefix.startswith("[rank")
                     else logged(line, prefix) for line in lines) + "\n"
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def finding(d, sig_id: str):
    return next((f for f in d.findings if f.signature.id == sig_id), None)


def test_every_excerpt_renders_lines_the_reader_reads():
    """Each format string of the signatures' excerpts, rendered, is a line one of the reader's expressions reads."""
    values = {"Available": (False, "", True, " (sub-backend 1)", True), "Selected": ("UnfusedDotProductAttention",),
              "Running with FlashAttention": ("2.7.4",), "Running with FusedAttention": (1,),
              "Running with config": ({'head_dim_qk': 64},)}
    seen = 0
    for sig_id in IDS:
        for at in BY_ID[sig_id].excerpts:
            for f in excerpt_formats(at):
                args = next((v for k, v in values.items() if f.startswith(k)), ("X",) * f.count("%s"))
                line = f % args if "%" in f else f
                assert any(p.search(line) for p in attention_backends.LINES.values()), (sig_id, at, line)
                seen += 1
                if f.startswith("Disabling "):
                    m = attention_backends.LINES["disabling"].search(line)
                    assert f"Disabling {m['backend']} {m['reason']}" == line.strip(), line
    assert seen >= 35, seen


def test_each_signature_shows_a_line_its_excerpts_render():
    rendered = {f for s in IDS for at in BY_ID[s].excerpts for f in excerpt_formats(at)}
    for sig_id in IDS:
        for line in BY_ID[sig_id].emitted:
            assert line.removeprefix("ValueError: ") in rendered, (sig_id, line)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_unfused_attention_names_each_disabled_backend_and_its_reason_verbatim(prefix):
    d = run([FUSED_NO_KERNEL, FA2_HEAD_DIM, FA3_SHAPE, AVAILABLE % (False, "", False, "", True),
             SELECTED % "UnfusedDotProductAttention", RUN_UNFUSED], prefix)
    assert d.cause_ids[0] == "te-attention-unfused" and d.symptom == "silent fallback"
    top = d.findings[0]
    assert top.signature.cause == ("Transformer Engine runs attention unfused: FusedAttention: "
                                   f"{reason(FUSED_NO_KERNEL)}; FlashAttention 2: {reason(FA2_HEAD_DIM)}; "
                                   f"FlashAttention 3: {reason(FA3_SHAPE)}.")
    assert "FlashAttention 2 does not take head_dim_qk = 576, head_dim_v = 512, padded head_dim = 576, on sm9.0" \
        in top.signature.fix
    assert "FlashAttention 3 does not take num_heads = 128, num_gqa_groups = 5, head_dim_qk = 576" in top.signature.fix
    assert "cuDNN (FusedAttention's kernels) has no fused kernel for these inputs" in top.signature.fix
    assert "s x s attention scores" in top.signature.fix
    assert any("Running with UnfusedDotProductAttention backend" in e for e in top.evidence)
    assert top.detail[0] == "TE's choice: UnfusedDotProductAttention (1 call)"
    assert finding(d, "te-no-attention-backend") is None and finding(d, "te-fp8-attention-disabled") is None


def test_the_inputs_of_te_config_line_reach_the_fix():
    cfg = {"transformer_engine_version": "2.18.0", "compute_capability": "sm90", "flash_attn_version": "not installed",
           "flash_attn_3_version": "not installed", "flash_attn_4_version": "not installed", "cudnn_version": "9.14.0",
           "qkv_dtype": "torch.bfloat16", "qkv_layout": "sbhd_sbhd_sbhd", "head_dim_qk": 192, "head_dim_v": 128,
           "attn_mask_type": "causal", "window_size": (-1, 0)}
    line = CONFIG % repr(cfg).replace("'torch.bfloat16'", "torch.bfloat16")
    top = run([line, FUSED_NO_KERNEL, RUN_UNFUSED], "te").findings[0]
    assert top.signature.cause.endswith("FlashAttention: not installed (its config line: flash_attn_version = not "
                                        "installed).")
    assert ("qkv_dtype = torch.bfloat16, qkv_layout = sbhd_sbhd_sbhd, head_dim_qk = 192, head_dim_v = 128, "
            "attn_mask_type = causal, window_size = (-1, 0) (sm90, cuDNN 9.14.0, Transformer Engine 2.18.0)") \
        in top.signature.fix


def test_a_log_at_info_level_says_unfused_and_how_to_get_the_reasons():
    top = run([RUN_UNFUSED], "te").findings[0]
    assert top.signature.id == "te-attention-unfused"
    assert "gives no reason" in top.signature.cause and "NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2" in top.signature.fix


def test_fused_and_flash_disabled_with_no_choice_logged_is_inferred_unfused():
    top = run([FUSED_NO_KERNEL, FA3_SHAPE], "[rank0]: ").findings[0]
    assert top.signature.id == "te-attention-unfused"
    assert "inferred" in top.detail[0]


def test_flash_attn_warning_alone_names_both_backends():
    """Without NVTE_DEBUG only TE's warnings print; this one is issued when FusedAttention rejected the input."""
    top = run([FLASH_ATTN_MISSING], "te").findings[0]
    assert top.signature.id == "te-attention-unfused"
    assert top.signature.cause.startswith("Transformer Engine runs attention unfused: FusedAttention: disabled (")
    assert "FlashAttention: not installed (flash-attn may provide important feature support" in top.signature.cause
    assert "install flash-attn" in top.signature.fix


def test_an_environment_switch_is_named_as_such():
    top = run([ENV_FUSED, ENV_FA2, RUN_UNFUSED], "te").findings[0]
    assert "FusedAttention is switched off in the environment (NVTE_FUSED_ATTN=0" in top.signature.fix
    assert "model.attention_backend" in top.signature.fix


def test_an_unsupported_dtype_is_not_an_fp8_reason():
    """TE lists Float8Tensor / MXFP8Tensor among the types it supports: the reason is the dtype, not FP8."""
    line = fmt(U, 555, 562, "Disabling FusedAttention for unsupported") % ("torch.float32", "<class 'torch.Tensor'>")
    d = run([line, RUN_UNFUSED], "te")
    assert d.cause_ids == ["te-attention-unfused"]
    assert "FusedAttention does not take qkv_dtype = torch.float32, qkv_type = <class 'torch.Tensor'>" \
        in d.findings[0].signature.fix


@pytest.mark.parametrize("prefix", PREFIXES)
def test_no_backend_names_the_reasons_the_log_gives(prefix):
    d = run([FA3_FP8_TRAINING, UNFUSED_FP8, FP8_CS, SELECTED % "NoBackend", NO_BACKEND], prefix)
    assert d.cause_ids[:2] == ["te-no-attention-backend", "te-fp8-attention-disabled"]
    top = d.findings[0]
    assert top.signature.cause == ("Transformer Engine found no attention backend for the inputs; the reasons it logged: "
                                   f"FusedAttention: {reason(FP8_CS)}; FlashAttention 3: {reason(FA3_FP8_TRAINING)}; "
                                   f"UnfusedDotProductAttention: {reason(UNFUSED_FP8)}.")
    assert "NVTE_DPA_FP8_RECIPE=DelayedScaling" in top.signature.fix
    assert not any(i.startswith("upstream-check") for i in d.cause_ids), d.cause_ids
    fp8 = finding(d, "te-fp8-attention-disabled")
    assert f"FusedAttention: {reason(FP8_CS)}" in fp8.signature.cause
    assert "no backend was left" in fp8.signature.cause


@pytest.mark.parametrize("error", [NO_BACKEND, NO_BACKEND_2_1], ids=["2.18", "2.1"])
def test_no_backend_without_reasons_says_how_to_log_them(error):
    traceback = ["Traceback (most recent call last):",
                 f'  File "/usr/local/lib/python3.12/site-packages/{D}", line 1689, in forward',
                 "    raise ValueError(", error]
    for prefix in ("", "[rank0]: "):
        d = run(traceback, prefix)
        assert d.cause_ids[0] == "te-no-attention-backend", d.cause_ids
        top = d.findings[0]
        assert "the log gives none of its reasons" in top.signature.cause
        assert top.signature.fix.startswith("rerun with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2")
        assert not any(i.startswith(("upstream-check", "failed-assert")) for i in d.cause_ids), d.cause_ids


def test_fp8_attention_disabled_while_another_backend_runs():
    d = run([FP8_RECIPE % "Float8BlockScaling", AVAILABLE % (True, " (3.0.0b1)", False, "", False),
             RUN_FLASH % "3.0.0b1"], "te")
    assert d.cause_ids == ["te-fp8-attention-disabled"]
    f = d.findings[0]
    assert "FusedAttention: for Float8BlockScaling" in f.signature.cause
    assert "what ran instead: FlashAttention" in f.signature.cause
    assert "FusedAttention has no FP8 path for Float8BlockScaling" in f.signature.fix


@pytest.mark.parametrize("prefix", PREFIXES)
def test_fused_attention_chosen_gives_no_finding(prefix):
    d = run([FA2_FP8, AVAILABLE % (False, "", True, " (sub-backend 1)", True), SELECTED % "FusedAttention (sub-backend 1)",
             RUN_FUSED % 1], prefix)
    assert not any(f.signature.id in IDS for f in d.findings)
    assert not d.problem


def test_a_real_te_log_that_ran_fused_attention_gives_no_attention_finding():
    """TE 2.18 on an H200 (docs/evidence): config, Available, Selected and Running lines, then a cuDNN failure."""
    read = attention_backends.AttentionBackends()
    for n, line in enumerate(REAL_LOG.read_text().splitlines(), 1):
        read.feed(line, f"log:{n}")
    (call,) = read.calls
    assert call.outcome == "FusedAttention" and call.config["head_dim_qk"] == "64" and call.running
    assert attention_backends.findings(read) == []
    assert not any(f.signature.id in IDS for f in diagnose([str(REAL_LOG)]).findings)


def test_ranks_are_read_apart():
    """Rank 0 ran fused, rank 1 unfused, their lines interleaved in one file (torchrun's prefixes)."""
    text = "\n".join([f"[rank1]: {FUSED_NO_KERNEL}", f"[rank0]: {SELECTED % 'FusedAttention (sub-backend 1)'}",
                      f"[rank1]: {SELECTED % 'UnfusedDotProductAttention'}", f"[rank0]: {RUN_FUSED % 1}",
                      f"[rank1]: {RUN_UNFUSED}"]) + "\n"
    top = diagnose(["-"], stdin=io.BytesIO(text.encode())).findings[0]
    assert top.signature.id == "te-attention-unfused"
    assert top.signature.cause == f"Transformer Engine runs attention unfused: FusedAttention: {reason(FUSED_NO_KERNEL)}."
    assert top.detail[0] == "TE's choice: UnfusedDotProductAttention (1 call), FusedAttention (sub-backend 1) (1 call)"


PIECES = [FUSED_NO_KERNEL, FA3_SHAPE, RUN_UNFUSED, NO_BACKEND, FLASH_ATTN_MISSING, SELECTED, AVAILABLE, CONFIG,
          "Disabling ", "Running with ", "Available backends = {FlashAttention=", "Selected backend = ",
          "Running with config={'", "No dot product attention", "flash-attn"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PIECES), st.integers(0, 200), st.text(max_size=40)), max_size=12))
def test_never_raises_on_garbage(parts):
    read = attention_backends.AttentionBackends()
    for n, (piece, cut, noise) in enumerate(parts):
        read.feed(piece[:cut] + noise, f"f:{n}", noise[:2] or None)
        read.feed(noise + piece, f"g:{n}")
    for f in attention_backends.findings(read):
        assert f.signature.id in IDS and f.signature.cause and f.signature.fix


def test_garbage_bytes_through_diagnose():
    blob = bytes(range(256)) * 8 + b"\nDisabling \nRunning with \xff\xfe backend\nSelected backend = (\n"
    d = diagnose(["-"], stdin=io.BytesIO(blob))
    assert not any(f.signature.id in IDS for f in d.findings)


def test_reasons_logged_after_the_no_backend_error_explain_it():
    """A pasted excerpt (or a log that prints the traceback first) gives TE's reasons after its ValueError."""
    from mbridge_ep_overlap.diagnose.engine import diagnose as _diagnose

    text = ("ValueError: No dot product attention backend is available for the provided inputs.\n"
            "Disabling FusedAttention due to NVTE_FUSED_ATTN=0\n"
            "       Disabling UnfusedDotProductAttention due to NVTE_UNFUSED_ATTN=0\n"
            "       Disabling FlashAttention 2 as it does not support MLA.\n")
    d = _diagnose(["-"], stdin=io.BytesIO(text.encode()))
    top = d.findings[0]
    assert top.signature.id == "te-no-attention-backend"
    for said in ("FusedAttention: due to NVTE_FUSED_ATTN=0", "UnfusedDotProductAttention: due to NVTE_UNFUSED_ATTN=0",
                 "FlashAttention 2: as it does not support MLA"):
        assert said in top.signature.cause
