"""Install or build: a ``static_assert`` that failed when a kernel was compiled, in a build or a JIT compile at run time.

Contract
--------
``STATIC_ASSERT`` is the row ``diagnose.static_asserts`` makes one finding per failed ``static_assert`` from.
``STATIC_ASSERTS`` is the table of the ``static_assert`` lines of DeepEP (V1 v1.2.1, V2 on main), HybridEP (DeepEP's
hybrid-ep branch) and Transformer Engine v2.18 that a run's values can reach, each as ``KnownAssert``: the library,
the file and line at the quoted commit, the condition and the message as the source spells them, whether the library
compiles it at run time (``jit``), and, where the cause is known in the user's terms, its own ``cause`` / ``fix``.
Every row's line is kept, with a few lines around it, in an excerpt (``excerpt``: ``owner/repo@commit:path:first-last``,
copied under ``tests/unit/fixtures/upstream_text``); the parity test checks the condition and the message there.
``FEEDS`` says, per library, which value of the run sets each template parameter a condition names (``Feed``: the
Python-side value, the Megatron-Core setting behind it, the installed Megatron-Core lines to quote, and the upstream
lines that show it: ``shown_by``, checked in the excerpts too). Nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import DEEPEP_AT, DEEPEP_V2_AT, HYBRID_EP_AT, TE_AT, Signature

HYBRID_EP = "HybridEP"
DEEPEP_V1 = "DeepEP"
DEEPEP_V2 = "DeepEP V2"
TE = "Transformer Engine"
HYBRID_EP_BEFORE_PADDING = "deepseek-ai/DeepEP@17cfb817bccec3a9c247013360cc550c2bac441e"
"""The hybrid-ep branch just before its commit 4214430 (DeepEP PR #638), which pads the token capacity to the combine
chunk size."""

JIT = {HYBRID_EP: "HybridEP's JIT: NVCCCompiler::build runs nvcc on the kernel source it writes for the template "
                  "parameters the Python side chose, at the first dispatch / combine of a new shape",
       DEEPEP_V2: "DeepEP V2's JIT (csrc/jit/compiler.hpp): nvcc on the kernel source made for the buffer's and the "
                  "call's sizes"}
"""How each library that compiles its kernels at run time does it; a library not here compiles them in its build."""


@dataclass(frozen=True)
class KnownAssert:
    library: str
    at: str
    """``owner/repo@commit`` of the quoted source."""
    path: str
    line: int
    condition: str
    message: str
    first: int
    last: int
    """The excerpt's lines (``excerpt``) around ``line``."""
    cause: str = ""
    """In the user's terms, where known ('' otherwise: the finding says it from the condition and ``FEEDS``)."""
    fix: str = ""

    @property
    def jit(self) -> str:
        return JIT.get(self.library, "")

    @property
    def excerpt(self) -> str:
        return f"{self.at}:{self.path}:{self.first}-{self.last}"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Feed:
    names: tuple[str, ...]
    """The template parameters it sets."""
    python: str
    """What sets it on the library's side (its Python, its environment variables, its build)."""
    mcore: str = ""
    """The Megatron-Core setting behind it ('' where none)."""
    looks: tuple[str, ...] = ()
    """Regular expressions of the installed Megatron-Core lines that feed it (quoted with file:line when found)."""
    shown_by: tuple[tuple[str, str], ...] = ()
    """(excerpt, text it holds) for each claim of ``python``: the parity test checks the text in the excerpt."""


def _block(library: str, at: str, path: str, first: int, last: int, *rows: tuple) -> tuple[KnownAssert, ...]:
    """The rows of one excerpt: (line, condition, message[, cause, fix])."""
    return tuple(KnownAssert(library, at, path, r[0], r[1], r[2], first, last, *r[3:]) for r in rows)


_HEP = "csrc/hybrid_ep/backend/hybrid_ep_backend.cuh"
_CHUNK_32 = "NUM_OF_TOKENS_PER_CHUNK must be multiple of 32."
_CHUNK_LOAD = "NUM_OF_TOKENS_PER_CHUNK must be multiple of rdma_to_attn_map_load_t."
_CHUNK_MAP = "NUM_OF_TOKENS_PER_CHUNK % sizeof(rdma_to_attn_map_load_t) == 0"
_IN_FLIGHT = "NUM_OF_IN_FLIGHT_S2G must smaller than NUM_OF_STAGES."
_HIDDEN_2 = "HIDDEN_DIM must be multiple of 2."
_GROUP = "NUM_OF_TOKENS_PER_CHUNK must be multiple of NUM_OF_TOKENS_PER_GROUP."
_EXPERTS_4 = ("Currently, expert per node must be multiple of 4(So the prob for each token is multiple of 16B) to make "
              "TMA work.")
_EXPERTS_COND = "(NUM_OF_EXPERTS_PER_RANK * NUM_OF_RANKS_PER_NODE * sizeof(float)) % 16 == 0"
_TOKEN_16B = "Currently, the size of token must be multiple of 16B to make TMA work."
_CAPACITY_CAUSE = (
    "the per-rank token capacity HybridEP compiled its combine kernel for is not a multiple of the combine chunk size: "
    "HybridEP takes the capacity from the tokens per rank the MoE layer hands it (at least 512, each dispatch's count "
    "rounded up to 16 only), and the chunk from NUM_OF_TOKENS_PER_CHUNK_COMBINE_API (64 by default); HybridEP before "
    "the hybrid-ep branch's commit 4214430 (DeepEP PR #638) does not pad the capacity to the chunk")
_CAPACITY_FIX = (
    "make the tokens per rank a multiple of the combine chunk (64 by default): micro_batch_size x seq_length / "
    "context_parallel_size (/ tensor_model_parallel_size with sequence_parallel) a multiple of 64, or pad the dispatch "
    "inputs (Megatron-Core's moe_hybridep_pad_uneven_dispatch_inputs, where the installed release has it); or install a "
    "HybridEP with DeepEP PR #638 (hybrid-ep commit 4214430 or later), which pads the capacity to the chunk itself")
_CHUNK_FIX = ("set NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API / NUM_OF_TOKENS_PER_CHUNK_COMBINE_API / "
              "NUM_OF_TOKENS_PER_CHUNK_PREPROCESSING_API to a multiple of 32 (unset: 64), or unset them")

STATIC_ASSERTS: tuple[KnownAssert, ...] = (
    _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 899, 899,
           (899, "NUM_OF_TOKENS_PER_CHUNK % INTER_NODE_RDMA_GROUP::size() == 0", _CHUNK_32, "", _CHUNK_FIX))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 1046, 1047,
             (1046, "INTER_NODE_GROUP::size() >= NUM_OF_NODES - 1", "mr_info should be loaded at once."),
             (1047, "NUM_OF_TOKENS_PER_CHUNK % INTER_NODE_GROUP::size() == 0", _CHUNK_32, "", _CHUNK_FIX))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 1228, 1228, (1228, _CHUNK_MAP, _CHUNK_LOAD))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 1434, 1438,
             (1434, "NUM_OF_IN_FLIGHT_S2G < NUM_OF_STAGES", _IN_FLIGHT), (1438, _CHUNK_MAP, _CHUNK_LOAD))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 1979, 1979, (1979, "NUM_OF_IN_FLIGHT_S2G < NUM_OF_STAGES", _IN_FLIGHT))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 2029, 2036,
             (2029, "(HIDDEN_DIM * sizeof(TOKEN_DATA_TYPE)) % 16 == 0", "The size of each token must be multiple of 16B."),
             (2036, "((HIDDEN_DIM / 128) * sizeof(float)) % 16 == 0",
              "The size of each scaling vector must be multiple of 16B."))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 2226, 2226, (2226, _CHUNK_MAP, _CHUNK_LOAD))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 2425, 2435, (2425, _CHUNK_MAP, _CHUNK_LOAD), (2435, "HIDDEN_DIM % 2 == 0", _HIDDEN_2))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 2758, 2760,
             (2758, "INTER_NODE_RDMA_GROUP::size() >= NUM_OF_NODES - 1", "mr_info should be loaded at once."),
             (2759, "NUM_OF_TOKENS_PER_CHUNK % INTER_NODE_RDMA_GROUP::size() == 0", _CHUNK_32, "", _CHUNK_FIX),
             (2760, _CHUNK_MAP, "NUM_OF_TOKENS_PER_CHUNK must be multiple of sizeof(rdma_to_attn_map_load_t)."))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 2935, 2939,
             (2935, "NUM_OF_STAGES_G2S % INTER_NODE_G2S_GROUP::warp_size() == 0",
              "NUM_OF_STAGES_G2S must be multiple of inter-node G2S warp group warp size."),
             (2939, "NUM_OF_TOKENS_PER_CHUNK % NUM_OF_TOKENS_PER_GROUP == 0", _GROUP))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 3237, 3250,
             (3237, "NUM_OF_STAGES_G2S % NUM_OF_DATA_PIPELINE_PER_BLOCK == 0",
              "NUM_OF_STAGES_G2S must be multiple of data pipeline per CUDA block."),
             (3240, "NUM_OF_STAGES_S2G % NUM_OF_DATA_PIPELINE_PER_BLOCK == 0",
              "NUM_OF_STAGES_S2G must be multiple of data pipeline per CUDA block."),
             (3244, "NUM_OF_TOKENS_PER_CHUNK % NUM_OF_TOKENS_PER_GROUP == 0", _GROUP),
             (3250, "HIDDEN_DIM % 2 == 0", _HIDDEN_2))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 3598, 3598,
             (3598, "NUM_OF_STAGES_G2S % UNPERMUTE_G2S_GROUP::warp_size() == 0",
              "NUM_OF_STAGES_G2S must be multiple of unpermute G2S warp group warp size."))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 3810, 3819,
             (3810, "NUM_OF_STAGES_G2S % NUM_OF_DATA_PIPELINE_PER_BLOCK == 0",
              "NUM_OF_STAGES_G2S must be multiple of data pipeline per unpermute CUDA block."),
             (3813, "NUM_OF_STAGES_S2G % NUM_OF_DATA_PIPELINE_PER_BLOCK == 0",
              "NUM_OF_STAGES_S2G must be multiple of data pipeline per unpermute CUDA block."),
             (3819, "HIDDEN_DIM % 2 == 0", _HIDDEN_2))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 4325, 4331,
             (4325, _EXPERTS_COND, _EXPERTS_4),
             (4326, "(HIDDEN_DIM * sizeof(TOKEN_DATA_TYPE)) % 16 == 0", _TOKEN_16B),
             (4329, "HIDDEN_DIM % 128 == 0", "HIDDEN_DIM must be multiple of 128 for scaling factor"),
             (4331, "((HIDDEN_DIM / 128) * sizeof(float)) % 16 == 0",
              "Currently, scaling factor per token must be multiple of 16B."))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 4571, 4573,
             (4571, _EXPERTS_COND, _EXPERTS_4),
             (4572, "(HIDDEN_DIM * sizeof(uint16_t)) % 16 == 0", _TOKEN_16B),
             (4573, "MAX_NUM_OF_TOKENS_PER_RANK % NUM_OF_TOKENS_PER_CHUNK == 0",
              "MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK.", _CAPACITY_CAUSE, _CAPACITY_FIX))
    + _block(HYBRID_EP, HYBRID_EP_AT, _HEP, 4869, 4869,
             (4869, "NUM_OF_EXPERTS_PER_RANK % sizeof(expert_to_rank_t) == 0",
              "NUM_OF_EXPERTS_PER_RANK and expert_to_rank_t mismatch"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/combine.cuh", 109, 109,
             (109, "kHidden % (32 * sizeof(int4) / sizeof(nv_bfloat16)) == 0", "Invalid hidden"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/combine_reduce_epilogue.cuh", 34, 34,
             (34, "kNumExperts % (kNumScaleupRanks * kNumScaleoutRanks) == 0", "Invalid number of experts or ranks"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/dispatch.cuh", 47, 47,
             (47, "kNumExperts % kNumRanks == 0", "Invalid number of experts or ranks"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/dispatch.cuh", 93, 93,
             (93, "kNumTopk <= 32", "Insufficient lanes"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/hybrid_combine.cuh", 178, 178,
             (178, "kNumScaleupRanks <= 64", "Too many scale-up ranks for 64-bit mask"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/hybrid_combine.cuh", 219, 219,
             (219, "kHidden % (32 * sizeof(int4) / sizeof(nv_bfloat16)) == 0", "Invalid hidden"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/hybrid_dispatch.cuh", 52, 52,
             (52, "kNumExperts % kNumScaleupRanks == 0", "Invalid number of experts or ranks"))
    + _block(DEEPEP_V2, DEEPEP_V2_AT, "deep_ep/include/deep_ep/impls/hybrid_dispatch.cuh", 336, 336,
             (336, "kNumScaleoutRanks <= 32", "Invalid number of scale-out ranks"))
    + _block(DEEPEP_V1, DEEPEP_AT, "csrc/kernels/ibgda_device.cuh", 16, 16,
             (16, "NVSHMEMI_IBGDA_MIN_QP_DEPTH >= 64", "Invalid QP minimum depth",
              "DeepEP's IBGDA code was compiled against NVSHMEM headers whose NVSHMEMI_IBGDA_MIN_QP_DEPTH is below 64: an "
              "NVSHMEM release (or build) other than the ones DeepEP supports",
              "build DeepEP against the NVSHMEM release its installation guide names (NVSHMEM_DIR pointing at it), the "
              "same one the run loads"))
    + _block(DEEPEP_V1, DEEPEP_AT, "csrc/kernels/internode.cu", 620, 620,
             (620, "kNumRDMARanks <= 32", "Invalid number of RDMA ranks"))
    + _block(DEEPEP_V1, DEEPEP_AT, "csrc/kernels/internode_ll.cu", 95, 95,
             (95, "kHidden % (32 * kNumElemsPerRead) == 0", "Invalid hidden"))
    + _block(DEEPEP_V1, DEEPEP_AT, "csrc/kernels/internode_ll.cu", 588, 594,
             (588, "kHidden % (32 * 2 * sizeof(int4) / sizeof(nv_bfloat16)) == 0", "Invalid hidden"),
             (594, "kHidden % 128 == 0", "Invalid hidden"))
    + _block(TE, TE_AT, "transformer_engine/common/common.h", 16, 17,
             (16, "NVTE_BUILD_NUM_PHILOX_ROUNDS > 0", "NVTE_BUILD_NUM_PHILOX_ROUNDS must be a positive integer.",
              "Transformer Engine's build was given NVTE_BUILD_NUM_PHILOX_ROUNDS of 0 or less",
              "unset NVTE_BUILD_NUM_PHILOX_ROUNDS for the build, or set it to a positive integer"))
    + _block(TE, TE_AT, "transformer_engine/common/normalization/common.cpp", 214, 215,
             (214, "CUDNN_FRONTEND_VERSION >= 10601", "CUDNN_FRONTEND_VERSION should be at least 1.6.1!",
              "Transformer Engine was built against a cudnn-frontend older than 1.6.1 (its 3rdparty/cudnn-frontend "
              "submodule not checked out at the release's commit, or an older copy first on the include path)",
              "build from a recursive clone (git submodule update --init --recursive) so the release's cudnn-frontend is "
              "used, or put cudnn-frontend 1.6.1 or newer first on the include path"))
    + _block(TE, TE_AT, "transformer_engine/common/util/ptx.cuh", 37, 58,
             (37, "ArchSpecific == CurrentArch", "Compiled for the generic architecture, while utilizing arch-specific "
              "features. Please compile for smXXXa architecture instead of smXXX architecture.",
              "Transformer Engine was built for a generic GPU architecture (sm_90, sm_100) while its kernels use "
              "architecture-specific instructions, which need the 'a' targets (sm_90a, sm_100a)",
              "build with the architecture-specific targets: NVTE_CUDA_ARCHS=\"90a;100a\" (or the CMake "
              "CMAKE_CUDA_ARCHITECTURES the release's build docs give), not 90 / 100"),
             (55, "FamilySpecific == CurrentArch", "Compiled for the generic architecture, while utilizing "
              "family-specific features. Please compile for smXXXf architecture instead of smXXX architecture.",
              "Transformer Engine was built for a generic GPU architecture while its kernels use family-specific "
              "instructions, which need the 'f' targets (sm_100f, sm_120f)",
              "build with the family-specific targets (NVTE_CUDA_ARCHS=\"100f\"), as the release's build docs give"))
)

_BUFFER_PY = f"{HYBRID_EP_AT}:deep_ep/hybrid_ep_buffer.py"
_CONFIG = f"{HYBRID_EP_AT}:csrc/hybrid_ep/config.cuh"
_STAGES = ("NUM_OF_STAGES", "NUM_OF_STAGES_G2S", "NUM_OF_STAGES_S2G")
FEEDS: dict[str, tuple[Feed, ...]] = {
    HYBRID_EP: (
        Feed(("MAX_NUM_OF_TOKENS_PER_RANK",),
             "the token capacity: HybridEPBuffer(max_num_of_tokens_per_rank) (at least 512; padded to the combine chunk "
             "since hybrid-ep commit 4214430), raised to each dispatch's token count rounded up to 16 "
             "(HybridEPBuffer.update_template_config)",
             "the tokens per rank the MoE layer hands the dispatcher: micro_batch_size x seq_length / "
             "context_parallel_size (/ tensor_model_parallel_size with sequence_parallel); the first dispatch sizes "
             "the buffer (fused_a2a.init_hybrid_ep_buffer)",
             (r"max_num_of_tokens_per_rank\s*=", r"^HYBRIDEP_TOKEN_ALIGNMENT\s*=", r"% HYBRIDEP_TOKEN_ALIGNMENT\b",
              r"^[ \t]*moe_hybridep_pad_uneven_dispatch_inputs\s*:"),
             ((f"{_BUFFER_PY}:139-154", "num_of_tokens_per_rank = (num_of_tokens_per_rank + 15) // 16 * 16"),
              (f"{_BUFFER_PY}:139-154", "config.max_num_of_tokens_per_rank = max("),
              (f"{HYBRID_EP_BEFORE_PADDING}:csrc/hybrid_ep/config.cuh:325-325", "std::max(max_num_of_tokens_per_rank, 512)"),
              (f"{_CONFIG}:383-387", "hybrid_ep_pad_num_of_tokens_per_rank("),
              (f"{_CONFIG}:466-468", "config.max_num_of_tokens_per_rank = hybrid_ep_pad_num_of_tokens_per_rank("),
              (f"{HYBRID_EP_AT}:csrc/hybrid_ep/jit/compiler.cu:248-254", "std::to_string(config.max_num_of_tokens_per_rank)"))),
        Feed(("NUM_OF_TOKENS_PER_CHUNK",),
             "the tokens per chunk: NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API / _COMBINE_API / _PREPROCESSING_API in the "
             "environment (64 when unset)", "",
             (), ((f"{_CONFIG}:418-440", 'get_env_int("NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", default_chunk_size)'),
                  (f"{_CONFIG}:418-440", "int default_chunk_size = 64;"),
                  (f"{HYBRID_EP_AT}:csrc/hybrid_ep/jit/compiler.cu:248-254",
                   "std::to_string(config.num_of_tokens_per_chunk_combine_api)"))),
        Feed(("HIDDEN_DIM",), "the hidden size of the dispatched tensor (hidden.shape[1])", "hidden_size",
             (), ((f"{_BUFFER_PY}:190-190", "num_of_tokens, hidden_dim = hidden.shape"),
                  (f"{_BUFFER_PY}:139-154", "config.hidden_dim = hidden_dim"))),
        Feed(("TOKEN_DATA_TYPE",), "use_fp8: uint8_t tokens with an FP8 dispatch, uint16_t otherwise", "",
             (), ((f"{_BUFFER_PY}:139-154", "hybrid_ep_cpp.UINT8 if use_fp8 else hybrid_ep_cpp.UINT16"),)),
        Feed(("NUM_OF_EXPERTS_PER_RANK",), "num_local_experts", "num_moe_experts / expert_model_parallel_size",
             (), ((f"{_BUFFER_PY}:139-154", "config.num_of_experts_per_rank = num_local_experts"),)),
        Feed(("NUM_OF_RANKS_PER_NODE",),
             "the ranks of one NVLink domain: NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN in the environment, else the "
             "ranks HybridEP detects", "",
             (), ((f"{_BUFFER_PY}:63-83", 'os.getenv("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")'),)),
        Feed(("NUM_OF_NODES",), "the EP group's size / the ranks of one NVLink domain",
             "expert_model_parallel_size (x tensor_model_parallel_size: the dispatcher's group)",
             (), ((f"{_BUFFER_PY}:63-83",
                   "self.num_of_nodes = self.group_size // self.num_of_hybrid_ep_ranks_per_nvlink_domain"),)),
        Feed(_STAGES, "NUM_OF_STAGES_DISPATCH_API / NUM_OF_STAGES_G2S_COMBINE_API / NUM_OF_STAGES_S2G_COMBINE_API in "
                      "the environment, lowered to fit the GPU's shared memory (Configurer.adjust_template)", "",
             (), ((f"{_CONFIG}:418-440", 'get_env_int("NUM_OF_STAGES_DISPATCH_API", 10)'),
                  (f"{_CONFIG}:418-440", 'get_env_int("NUM_OF_STAGES_S2G_COMBINE_API", 2)'))),
        Feed(("NUM_OF_IN_FLIGHT_S2G",), "NUM_OF_IN_FLIGHT_S2G_DISPATCH_API in the environment (8 when unset)", "",
             (), ((f"{_CONFIG}:418-440", 'get_env_int("NUM_OF_IN_FLIGHT_S2G_DISPATCH_API", 8)'),)),
        Feed(("NUM_OF_TOKENS_PER_GROUP",), "NUM_OF_TOKENS_PER_GROUP_COMBINE_API in the environment (4 when unset)", "",
             (), ((f"{_CONFIG}:418-440", 'get_env_int("NUM_OF_TOKENS_PER_GROUP_COMBINE_API", 4)'),)),
    ),
    DEEPEP_V2: (
        Feed(("kNumExperts",), "the buffer's number of experts", "num_moe_experts",
             (), ((f"{DEEPEP_V2_AT}:csrc/kernels/elastic/dispatch.hpp:55-65", "args.num_experts"),)),
        Feed(("kNumRanks", "kNumScaleupRanks", "kNumScaleoutRanks"),
             "the EP group's ranks: those of one scale-up (NVLink) domain and the number of domains", "expert_model_parallel_size",
             (), ((f"{DEEPEP_V2_AT}:csrc/kernels/elastic/dispatch.hpp:55-65", "args.num_scaleup_ranks"),)),
        Feed(("kNumTopk",), "the top-k of the dispatched indices", "moe_router_topk",
             (), ((f"{DEEPEP_V2_AT}:csrc/kernels/elastic/dispatch.hpp:55-65", "args.num_topk"),)),
        Feed(("kHidden",), "the hidden size of the dispatched tensor", "hidden_size",
             (), ((f"{DEEPEP_V2_AT}:csrc/kernels/elastic/dispatch.hpp:55-65", "args.num_hidden_bytes"),)),
    ),
    DEEPEP_V1: (
        Feed(("kHidden",), "a hidden size DeepEP's build instantiates (SWITCH_HIDDEN in csrc/kernels/launch.cuh)", "",
             (), ((f"{DEEPEP_AT}:csrc/kernels/launch.cuh:87-96", "#define SWITCH_HIDDEN(case_macro)"),)),
        Feed(("kNumRDMARanks",), "an RDMA rank count DeepEP's build instantiates (SWITCH_RDMA_RANKS in "
                                 "csrc/kernels/launch.cuh)", "",
             (), ((f"{DEEPEP_AT}:csrc/kernels/launch.cuh:54-70", "#define SWITCH_RDMA_RANKS(case_macro)"),)),
    ),
}

JIT_SHOWN_BY = ((f"{HYBRID_EP_AT}:csrc/hybrid_ep/jit/compiler.cu:151-151", "Failed to compile the code, compile command: "),
                (f"{DEEPEP_V2_AT}:csrc/jit/compiler.hpp:238-239", "NVCC compilation failed: %s"))
"""The lines the two JIT compilers print when nvcc fails (the reader takes them as the mark of a compile at run time)."""

_EXCERPTS = tuple(sorted({a.excerpt for a in STATIC_ASSERTS} | {at for feeds in FEEDS.values() for f in feeds
                                                                 for at, _ in f.shown_by} | {at for at, _ in JIT_SHOWN_BY}))

STATIC_ASSERT = Signature(
    id="static-assert", symptom="install", patterns=(),
    cause="A static_assert failed when a kernel was compiled: in a build of an extension (DeepEP, Transformer Engine, "
          "an extension of torch) or in a JIT compile at run time (HybridEP and DeepEP V2 compile their kernels with nvcc "
          "from the sizes the run chose). nvcc, gcc and clang print the file:line and the message, and the source line "
          "with the condition; the message is looked up in the known static_asserts of DeepEP, HybridEP and Transformer "
          "Engine, then in the C/C++ headers of the packages installed here. Found: the library, file:line, the "
          "condition, the run's template parameters where the compiler printed them, and, for a JIT compile, the "
          "values of the run that feed them.",
    fix="give the kernel the values its condition needs (the finding names the settings behind them), or use a "
        "release of the library whose kernels accept them; for a build, the toolkit, headers and flags its release "
        "supports",
    source="installed:mbridge_ep_overlap/diagnose/static_asserts.py", emitted=(), confidence=0.75,
    found_by="static-assert", excerpts=_EXCERPTS,
    versions="75% for a static_assert of the table (found by its message and file), 60% for one found in an installed "
             "package's headers, 35% for one not found")

SIGNATURES = (STATIC_ASSERT,)
