"""Checks that name a value outside what a kernel was built for (diagnose.kernel_limits), build errors of code written
for another release of a library's headers or of the toolkit (diagnose.compile_errors), and Megatron-Bridge's Hugging
Face export warnings (diagnose.conversion). The compiler texts are made here by nvcc / ptxas / g++ where installed and
read from their recorded copies (``fixtures/compile_texts``) everywhere; the export warnings are the installed
Megatron-Bridge's own format strings."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import compile_errors, conversion, kernel_limits
from mbridge_ep_overlap.diagnose.engine import diagnose

TEXTS = Path(__file__).parent / "fixtures" / "compile_texts"
CUTLASS_TEMPLATE = """namespace cutlass { namespace arch {
enum class CacheOperation { Always, LastUse };
template <typename AccessType, int LoadBytes> struct global_load {
  __device__ global_load(AccessType &D, void const *ptr, bool pred_guard) {}
};
} }
__global__ void permute(float4 *out, const float4 *in) {
  cutlass::arch::global_load<float4, sizeof(float4), cutlass::arch::CacheOperation::LastUse>(out[0], in, true);
}
"""
BAD_MOV = """.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  mov.b32 %r1, %rd1;
  ret;
}
"""


FP4_CVT = """.version 8.8
.target sm_100
.address_size 64
.visible .entry k(.param .u64 p)
{
  .reg .f32 %f<3>;
  .reg .b8 %b<2>;
  mov.f32 %f1, 0f3F800000;
  mov.f32 %f2, 0f3F800000;
  cvt.rn.satfinite.e2m1x2.f32 %b1, %f1, %f2;
  ret;
}
"""


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def _tool(command: list[str], source: str, name: str, tmp_path: Path) -> str:
    if shutil.which(command[0]) is None:
        pytest.skip(f"no {command[0]} here")
    (tmp_path / name).write_text(source)
    done = subprocess.run(command + [name], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return done.stdout + done.stderr


# ---- compile errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    pytest.param(lambda tmp: _tool(["nvcc", "-c", "-o", "k.o"], CUTLASS_TEMPLATE, "k.cu", tmp), id="nvcc-here"),
    pytest.param(lambda tmp: (TEXTS / "nvcc_cutlass_template.txt").read_text(), id="nvcc-recorded"),
    pytest.param(lambda tmp: _tool(["g++", "-fsyntax-only", "-x", "c++"], CUTLASS_TEMPLATE.replace("__device__ ", "")
                                   .replace("__global__ ", "").replace("float4", "int"), "k.cpp", tmp), id="gcc-here"),
])
def test_a_call_written_for_another_cutlass_is_named_by_the_library(text, tmp_path):
    d = run(text(tmp_path))
    assert d.cause_ids[0] == "header-api:cutlass", d.cause_ids
    top = d.findings[0]
    assert "cutlass::arch::global_load" in top.signature.cause and "another release of CUTLASS" in top.signature.cause
    assert "release the project pins" in top.signature.fix


def test_an_unknown_namespace_is_not_called_a_library_mismatch(tmp_path):
    text = (TEXTS / "nvcc_cutlass_template.txt").read_text().replace("cutlass::", "mylib::")
    assert not [c for c in run(text).cause_ids if c.startswith("header-api")]


@pytest.mark.parametrize("text", [
    pytest.param(lambda tmp: _tool(["ptxas", "-arch=sm_90", "-o", "k.cubin"], BAD_MOV, "k.ptx", tmp), id="ptxas-here"),
    pytest.param(lambda tmp: (TEXTS / "ptxas_mov.txt").read_text(), id="ptxas-recorded"),
    pytest.param(lambda tmp: "NVCC compilation failed: ptxas kernel.ptx: error: Arguments mismatch for instruction 'mov'",
                 id="jit-form"),
])
def test_ptx_that_ptxas_refuses_is_named_with_its_instruction(text, tmp_path):
    d = run(text(tmp_path))
    assert d.cause_ids[0] == "ptxas:mov", d.cause_ids
    assert "inline" in d.findings[0].signature.cause and "toolkit" in d.findings[0].signature.fix


@pytest.mark.parametrize("text", [
    pytest.param(lambda tmp: _tool(["ptxas", "-arch=sm_100", "-o", "k.cubin"], FP4_CVT, "k.ptx", tmp), id="ptxas-here"),
    pytest.param(lambda tmp: (TEXTS / "ptxas_fp4_bare_target.txt").read_text(), id="ptxas-recorded"),
])
def test_an_instruction_of_the_arch_specific_target_built_for_the_plain_one_names_the_suffix(text, tmp_path):
    d = run(text(tmp_path))
    top = d.findings[0]
    assert top.signature.id.startswith("ptxas:"), d.cause_ids
    assert "without the arch-specific suffix (sm_100a" in top.signature.cause and "compute_100a" in top.signature.fix


def test_the_suffixed_target_assembles_the_same_instruction(tmp_path):
    if shutil.which("ptxas") is None:
        pytest.skip("no ptxas here")
    (tmp_path / "k.ptx").write_text(FP4_CVT.replace(".target sm_100", ".target sm_100a"))
    done = subprocess.run(["ptxas", "-arch=sm_100a", "k.ptx", "-o", "k.cubin"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# ---- kernel limits --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("line", "cause_id", "field"), [
    ("AssertionError: Unsupported number of EP ranks: 12", "kernel-limit:ep-ranks", "expert_model_parallel_size"),
    ("EP_HOST_ASSERT(num_topk <= kNumMaxTopK)", "kernel-limit:num-topk", "moe_router_topk"),
    ("Unsupported hidden", "kernel-limit:hidden", "hidden_size"),
    ("RuntimeError: Assertion `num_experts < NUM_MAX_LOCAL_EXPERTS' failed", "kernel-limit:num-experts", "num_moe_experts"),
    ("expert_indices.size(1) == args->top_k (1 vs. 6) : expert_indices dim1 must match top_k.",
     "value-mismatch:expert-indices-size-1", "moe_router_topk"),
])
def test_a_kernel_limit_is_named_with_the_field_that_sets_it(line, cause_id, field):
    d = run(line + "\n")
    assert d.cause_ids[0] == cause_id, d.cause_ids
    assert field in d.findings[0].signature.cause + d.findings[0].signature.fix


@pytest.mark.parametrize("line", ["EP_HOST_ASSERT(topk_idx_ptr != 0)", "assert 'x_ptr != 0 && topk_idx_ptr != 0'",
                                  "RuntimeError: Failed: Assertion error csrc/deep_ep.cpp:301 'x.data_ptr() != nullptr'"])
def test_a_null_pointer_check_is_named_as_an_empty_tensor(line):
    d = run(line + "\n")
    ids = d.cause_ids
    top = next(f for f in d.findings if f.signature.id.startswith("null-tensor") or any("null" in x for x in f.detail))
    assert ids, line
    assert "zero tokens" in top.signature.cause + " ".join(top.detail)


def test_a_native_check_reaching_an_unsupported_case_gets_the_quantity_beside_it():
    d = run("RuntimeError: Failed: Assertion error /build/DeepEP/csrc/kernels/intranode.cu:926 'false and Unsupported type'\n")
    top = d.findings[0]
    assert d.cause_ids[0] == "native-check:deep-ep:csrc/kernels/intranode.cu:926"
    assert "it reached one it does not: Unsupported type" in top.signature.cause
    assert any(x.startswith("limit:") and "dtype" in x for x in top.detail)
    assert len([c for c in d.cause_ids if c.startswith("kernel-limit")]) == 0  # the same line: one finding


@pytest.mark.parametrize("line", [
    "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
    "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing",
    "assert x == y",  # no values printed
    " [iteration 10] loss 2.5 < 3.0",  # a comparison outside an assertion
    "CHECK(a == b (3 vs. 3))",  # equal values: no mismatch
    "    assert run.returncode != 0, run.describe_failure()",  # a return code is no pointer
])
def test_lines_that_only_look_like_limits_are_not(line):
    assert kernel_limits.read(line) is None


# ---- the Hugging Face export ----------------------------------------------------------------------------------
def _mb_warning(name: str) -> str:
    """The installed Megatron-Bridge's warning, from its own format string."""
    src = (Path(__import__("megatron.bridge").bridge.__file__).parent / "models/conversion/model_bridge.py").read_text()
    assert 'logger.warning(f"WARNING: No mapping found for megatron_param: {global_name}")' in src
    return f"WARNING:megatron.bridge.models.conversion.model_bridge:WARNING: No mapping found for megatron_param: {name}"


def test_unmapped_export_parameters_are_counted_by_part_and_module():
    names = [f"mtp.layers.0.transformer_layer.mlp.experts.local_experts.{e}.linear_fc1.weight" for e in range(8)] + \
            [f"_teacher_model.decoder.layers.{i}.self_attention.linear_qkv.weight" for i in range(3)] + \
            ["decoder.layers.1.mlp.router.expert_bias"]
    d = run("\n".join(_mb_warning(n) for n in names) + "\n")
    assert d.cause_ids[0] == "conversion-unmapped"
    top = d.findings[0]
    assert "12 Megatron parameter(s)" in top.signature.cause
    for said in ("8 under mtp.* (the multi-token-prediction (MTP) layers)", "3 under _teacher_model.* (a distillation "
                 "teacher)", "1 elsewhere in the model"):
        assert said in top.signature.cause
    assert "unmapped: mtp.layers.*.transformer_layer.mlp.experts.local_experts.*.linear_fc1 (8 parameter(s))" in top.detail
    assert "unwrap the distillation model" in top.signature.fix and "MTP weights" in top.signature.fix


def test_unmapped_sequential_experts_name_grouped_gemm_and_the_installed_bridges_that_map_them():
    src = (Path(__import__("megatron.bridge").bridge.__file__).parent / "models/conversion/model_bridge.py").read_text()
    assert 'logger.warning(f"No mapping found for global_name: {global_name}")' in src
    names = [f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc{k}.weight" for i in range(2) for e in range(4)
             for k in (1, 2)]
    d = run("\n".join(f"WARNING:megatron.bridge.models.conversion.model_bridge:No mapping found for global_name: {n}"
                      for n in names) + "\n")
    top = d.findings[0]
    assert d.cause_ids[0] == "conversion-unmapped" and "16 under local_experts.* (the sequential experts" in top.signature.cause
    assert "moe_grouped_gemm=True" in top.signature.fix
    said = next(x for x in top.detail if x.startswith("bridges of the installed Megatron-Bridge that map local_experts"))
    mapping = conversion.sequential_bridges()
    assert "qwen3_moe_bridge" in mapping and "model_bridge" not in mapping and ", ".join(mapping) in said
    # a report's copy with the head of the name cut off
    assert run("No mapping found for ...experts.local_experts.0.linear_fc1.weight\n").cause_ids[0] == "conversion-unmapped"


def test_module_of_replaces_numbers_and_drops_the_parameter_name():
    assert conversion.module_of("decoder.layers.23.mlp.experts.local_experts.27.linear_fc1.bias") == \
        "decoder.layers.*.mlp.experts.local_experts.*.linear_fc1"


def test_compile_errors_keep_one_finding_per_library():
    r = compile_errors.CompileErrors()
    for i in range(5):
        r.feed(f'k.cu({i}): error: namespace "cute" has no member "TMA_{i}"', f"log:{i}")
    found = compile_errors.findings(r.errors)
    assert [f.signature.id for f in found] == ["header-api:cutlass-cute"] and len(found[0].evidence) == 5


# ---- a norm that differs between ranks ------------------------------------------------------------------------
def test_a_grad_norm_that_differs_between_ranks_is_named_with_the_values():
    d = run("rank 0: total_norm=40.199502  dense_grad_after_clip=2.487593e-02\n"
            "rank 1: total_norm=4.019950   dense_grad_after_clip=2.487592e-01\n")
    assert d.cause_ids[0] == "grad-norm-differs-across-ranks"
    assert "rank 0 / rank 1 = 10x" in " ".join(d.findings[0].detail)
    assert "EP" in d.findings[0].signature.cause


def test_rank_prefixed_norms_are_compared_and_equal_ones_are_not_a_finding(tmp_path):
    line = " [2026-12-04 10:00:00] iteration        1/      10 | lm loss: 1.05E+01 | grad norm: {} |"
    differ = f"[rank0]:{line.format('12.500')}\n[rank1]:{line.format('3.100')}\n"
    assert "grad-norm-differs-across-ranks" in run(differ).cause_ids
    same = f"[rank0]:{line.format('12.500')}\n[rank1]:{line.format('12.500')}\n"
    assert "grad-norm-differs-across-ranks" not in run(same).cause_ids
    one = f"{line.format('12.500')}\n{line.format('3.100')}\n"  # one rank's log: a norm that changes over time
    assert "grad-norm-differs-across-ranks" not in run(one).cause_ids


NEW_READERS = ("kernel-limit", "value-mismatch", "null-tensor", "header-api", "ptxas", "conversion-unmapped",
               "grad-norm-differs", "version-gate", "sharded-size", "expert-layout", "pickled-class", "table-key",
               "extension-built-for-other-torch")


@pytest.mark.parametrize("text", [
    "Checking assert: hidden_size < MAX_HIDDEN_SIZE passed\n",
    "saving CHECKPOINT at iteration 100 < MAX_ITERS\n",
    "W0101 torch/_dynamo: Unsupported operator aten.foo; falling back\n",
    "[rank0]: UserWarning: Unsupported: Graph break due to unsupported builtin\n",
    "CHECK: seq_len == max_seq (4096 vs. 8192) noted; padding\n",
    "WARNING: --moe-grouped-gemm requires TE >= 1.9 for fp8, falling back\n",
    "Supported flash-attn versions are >= 2.1.1, <= 2.8.0.post2. Found flash-attn 2.8.3.\n",
    "WARNING: The size of tensor a (4096) must match the size of tensor b (1024) at non-singleton dimension 0; retrying\n",
    "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev'If you don't plan on using image functionality from "
    "torchvision.io, you can ignore this warning.\n",
    "[rank0]: step 1 | grad norm: 1.50\n[rank1]: step 5 | grad norm: 0.90\n",
    f"[rank{'9' * 5000}]: grad norm: 1.0\n[rank1]: grad norm: 3.0\n",
])
def test_lines_healthy_runs_print_are_not_findings_of_the_new_readers(text):
    d = run(text)
    assert not [c for c in d.cause_ids if c.startswith(NEW_READERS)], d.cause_ids


def test_two_runs_compared_are_not_one_run_s_ranks(tmp_path):
    line = " [2026-12-04 10:00:00] iteration        1/      10 | lm loss: 1.05E+01 | grad norm: {} |\n"
    for run_dir, rank, norm in (("a", 0, "12.5"), ("b", 1, "3.1")):
        (tmp_path / run_dir).mkdir()
        (tmp_path / run_dir / "stdout.log").write_text(f"[rank{rank}]:{line.format(norm)}")
    d = diagnose([str(tmp_path / "a"), str(tmp_path / "b")])
    assert "grad-norm-differs-across-ranks" not in d.cause_ids
