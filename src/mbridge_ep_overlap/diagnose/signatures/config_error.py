"""Upstream assertion or config error: MCore's ``TransformerConfig.__post_init__`` asserts and MB's
validation errors that an EP-overlap configuration meets at finalize. Each names the rule of this
library that refuses the same configuration before the run (``plan``, ``enable_ep_overlap``).
``UPSTREAM_CHECK`` is the row of the general case: any Megatron-Core / Megatron-Bridge check, named by
finding its message in the installed source (``diagnose.upstream_checks`` makes one per check found);
``ATTRIBUTE_ERROR`` the row of an AttributeError on a class or module of that source, or across a package boundary
(``diagnose.attribute_errors``).
``TE_NO_ATTENTION_BACKEND`` is Transformer Engine's error when it disables every attention backend
(``diagnose.attention_backends`` names the reasons its log gives)."""

from __future__ import annotations

import re

from .base import TE_AT, Signature, github_blob

_TC = "installed:megatron/core/transformer/transformer_config.py"
_MCORE = "megatron-core 0.19 (TransformerConfig.__post_init__)"


def _assert(id: str, text: str, cause: str, fix: str, rule: str, facts_pass=None) -> Signature:
    return Signature(id=id, symptom="config-error", patterns=(re.escape(text),),
                     cause=cause, fix=fix, source=_TC, emitted=(text,), confidence=0.95, rule=rule,
                     versions=_MCORE, facts_pass=facts_pass)


UPSTREAM_CHECK = Signature(
    id="upstream-check", symptom="config-error", patterns=(),
    cause="An AssertionError / ValueError / RuntimeError raised by a check in Megatron-Core or Megatron-Bridge "
          "(its traceback runs through megatron/core or megatron/bridge, or the message stands alone): the "
          "message is found in the installed source, and the check's file:line and condition (the assert "
          "expression, or the if above the raise) are the cause.",
    fix="the fix of the rule of this library that mirrors the check when one does; else change the "
        "configuration so that the check's condition holds ('the check at FILE:LINE requires CONDITION')",
    source="installed:mbridge_ep_overlap/diagnose/upstream_source.py", emitted=(), confidence=0.88,
    found_by="upstream-source",
    versions="the installed megatron-core / megatron-bridge; a message not in their source word for word "
             "(reworded, another version) names the nearest check at 55%")

NATIVE_CHECK = Signature(
    id="native-check", symptom="config-error", patterns=(),
    cause="A C++/CUDA check in Transformer Engine (NVTE_CHECK / NVTE_ERROR), DeepEP (EP_HOST_ASSERT, "
          "EP_DEVICE_ASSERT, CUDA_CHECK; V2's EPException: NCCL_CHECK, CUDA_RUNTIME_CHECK, CUDA_DRIVER_CHECK), "
          "HybridEP (CUDA_CHECK / CU_CHECK), NVSHMEM (NVSHMEMI_ERROR_PRINT, the *_ERROR_JMP family) or torch's NCCL "
          "wrapper (C10D_NCCL_CHECK) failed: the line its macro prints names the library, file:line (or the call), "
          "function, condition and message, and that check is the cause.",
    fix="'the check in LIBRARY FILE:LINE requires CONDITION': change what the run passes it, or use a release of "
        "the library whose check accepts it (the run's version from the facts)",
    source="installed:mbridge_ep_overlap/diagnose/native_checks.py", emitted=(), confidence=0.65,
    found_by="native-check",
    versions="the library's own check text: Transformer Engine, DeepEP and NCCL change such checks between "
             "releases, so the run's version is given from its facts where they record it")

FAILED_ASSERT = Signature(
    id="failed-assert", symptom="config-error", patterns=(),
    cause="A Python `assert` outside Megatron-Core / Megatron-Bridge (DeepEP's deep_ep, Transformer Engine's "
          "Python, a test or launcher script) failed: the traceback's innermost frame prints the assert line, "
          "and its condition is what the run did not meet.",
    fix="'the assert at FILE:LINE requires CONDITION': change what the run passes it (the frame that called it "
        "says from where), or use a release of that package whose check accepts it",
    source="installed:mbridge_ep_overlap/diagnose/raise_frames.py", emitted=(), confidence=0.6,
    found_by="traceback",
    versions="the package's own source line as the traceback prints it (that package's version need not be "
             "installed here)")

_TE_V2_1 = "NVIDIA/TransformerEngine@450146ae6a16e3aa220fa7089c6193458e8f8dca"
"""Transformer Engine v2.1, whose no-backend error is the older 'No dot product attention support' wording."""

TE_NO_ATTENTION_BACKEND = Signature(
    id="te-no-attention-backend", symptom="config-error", patterns=(),
    cause="Transformer Engine disabled every attention backend (FlashAttention, FusedAttention, "
          "UnfusedDotProductAttention) for the run's inputs and raised 'No dot product attention backend is available "
          "for the provided inputs': each backend's reason is in the log at NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2.",
    fix="give one backend an input it supports, as its reason says; with no reasons in the log, rerun with NVTE_DEBUG=1 "
        "NVTE_DEBUG_LEVEL=2; a Megatron-Core attention_backend other than auto switches the other backends off "
        "(NVTE_*_ATTN=0)",
    source=github_blob(TE_AT, "transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py")
    + "#L1687-L1693",
    emitted=("ValueError: No dot product attention backend is available for the provided inputs. Please run with "
             "NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to find out the reasons for disabling all backends.",
             "ValueError: No dot product attention support for the provided inputs!"),
    confidence=0.95, found_by="attention-backend",
    excerpts=(f"{TE_AT}:transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py:1687-1693",
              f"{_TE_V2_1}:transformer_engine/pytorch/attention.py:7736-7736"),
    versions="'No dot product attention backend is available ...': Transformer Engine 2.2 to 2.18; 'No dot product "
             "attention support for the provided inputs!': 1.12 to 2.1 (1.9 to 1.11 raise it as a plain Exception)")

TE_CUDNN_ATTENTION_REFUSED = Signature(
    id="te-cudnn-fused-attention-refused", symptom="config-error",
    patterns=(r"fused_attn\w*/\S+:\d+ in function [^:]+: cuDNN Error: (?!execute\()",),
    cause="Transformer Engine chose its cuDNN fused attention (FusedAttention) for these inputs, and cuDNN refused to "
          "build or run the attention graph: the message after 'cuDNN Error:' is cuDNN's limit for this shape on "
          "this GPU with this cuDNN (a head dim - Megatron's kv_channels -, a sequence length, a mask, bias or "
          "dropout, a dtype, or a pass: some cases run forward but not backward). Transformer Engine's own support "
          "check let the case through, so its check and the installed cuDNN disagree. (A graph cuDNN built and then failed to "
          "execute - 'execute(...) failed with message: err N' - is a crash in its kernel, named as the check it is.)",
    fix="let Transformer Engine pick another backend for the case: NVTE_FUSED_ATTN=0 (FlashAttention, else unfused "
        "attention; Megatron-Core: attention_backend=flash or unfused); or install the cuDNN release that supports "
        "it (newer cuDNN 9.x widened the head dims and masks of fused attention) with a Transformer Engine built for "
        "it; or change the shape the message names",
    source=github_blob(TE_AT, "transformer_engine/common/util/logging.h") + "#L81-L91",
    emitted=("RuntimeError: /opt/TransformerEngine/transformer_engine/common/fused_attn/"
             "fused_attn_f16_arbitrary_seqlen.cu:639 in function operator(): cuDNN Error: Num hidden_dim shoud be less "
             "than 128 and hidden_dim should be multiple of 8. For more information, enable cuDNN error logging by "
             "setting CUDNN_LOGERR_DBG=1 and CUDNN_LOGDEST_DBG=stderr in the environment.",),
    quote='      NVTE_ERROR("cuDNN Error: ", error.err_msg,                     \\',
    quoted_at=f"{TE_AT}:transformer_engine/common/util/logging.h:85",
    confidence=0.8, versions="Transformer Engine 1.x to 2.18 (NVTE_CHECK_CUDNN_FE)")


_TE_BEFORE_MLA = "NVIDIA/TransformerEngine@27c6342ea8ad88034bf04b587dd13cb6088d2474"
"""Transformer Engine just before multi-latent attention support (PR #1039, first in v1.10)."""

TE_ATTENTION_BEFORE_MLA = Signature(
    id="te-attention-needs-equal-kv-head-dims", symptom="config-error",
    patterns=(r"Keys and values must have the same shape!",),
    cause="Transformer Engine before 1.10 runs DotProductAttention only on keys and values of the same shape, and the "
          "model gives them different head dims: multi-latent attention (DeepSeek-V2 / V3, Kimi-K2: a QK head dim of "
          "qk_head_dim + qk_pos_emb_head_dim, 192, against a V head dim of v_head_dim, 128). Support for unequal K / V "
          "head dims came with Transformer Engine 1.10 (MLA, PR #1039).",
    fix="use Transformer Engine 1.10 or newer (the pinned Megatron-Core 0.19.2 wants 2.x), or pad V to the QK head dim "
        "before the attention call",
    source=github_blob(_TE_BEFORE_MLA, "transformer_engine/pytorch/attention.py") + "#L5631",
    emitted=("AssertionError: Keys and values must have the same shape!",),
    excerpts=(f"{_TE_BEFORE_MLA}:transformer_engine/pytorch/attention.py:5631-5631",),
    confidence=0.85, versions="Transformer Engine 0.x to 1.9")

GRAD_BUCKET_NOT_ISSUED = Signature(
    id="grad-bucket-never-issued", symptom="config-error",
    patterns=(r"Communication call has not been issued for this bucket",),
    cause="With overlap_grad_reduce, Megatron-Core's DDP issues each gradient bucket's reduce-scatter / all-reduce "
          "from the backward hooks of its parameters, once every parameter of the bucket has its gradient; a parameter "
          "that requires grad but took no part in the forward pass never gets one, so its bucket is never issued and "
          "finish_grad_sync asserts (the message counts the parameters that had their gradient). Usually a module or "
          "parameter added to the model but not used in forward (a custom layer, an unused expert path, a frozen part "
          "left requires_grad=True), or one used on some ranks or steps only.",
    fix="use every parameter that requires grad in forward, or set requires_grad=False on those that are not used "
        "(freeze them before the DDP wrapper is built); or turn ddp.overlap_grad_reduce off (the synchronous path "
        "does not wait on hooks)",
    source="installed:megatron/core/distributed/param_and_grad_buffer.py",
    emitted=("AssertionError: Communication call has not been issued for this bucket (3/4 params have grad "
             "available)",),
    confidence=0.85, versions="megatron-core's DDP with overlap_grad_reduce (the installed 0.19.2 adds the count of "
                                "parameters that had their gradient)")

_UB_MULTICAST_CAUSE = (
    "Transformer Engine's userbuffers (TP communication overlap: Megatron's tp_comm_overlap) build their TP "
    "communicators on CUDA multicast objects (NVLink SHARP through NVSwitch) where the device reports support, and "
    "this GPU, driver or toolkit cannot: a GPU without NVSwitch multicast (PCIe boards), a driver or CUDA before "
    "multicast (12.1+ with a recent driver and fabric manager), or a VM / container that hides it.")
_UB_MULTICAST_FIX = ("launch with UB_SKIPMC=1 (userbuffers then exchange through CUDA IPC, without multicast), or turn "
                     "TP communication overlap off (tp_comm_overlap=False); on an NVSwitch system check the driver, "
                     "CUDA 12.1+ and that the fabric manager runs")

TE_USERBUFFERS_NEED_MULTICAST = Signature(
    id="te-userbuffers-need-multicast", symptom="hardware",
    patterns=(r"does not support comm\+GEMM overlap with CUDA Multicast",),
    cause=_UB_MULTICAST_CAUSE + " Transformer Engine checks it before building them and says so.",
    fix=_UB_MULTICAST_FIX,
    source=github_blob(TE_AT, "transformer_engine/pytorch/module/base.py") + "#L196-L201",
    emitted=("RuntimeError: CUDA device, driver and/or toolkit version does not support comm+GEMM overlap with CUDA "
             "Multicast. Launch app with UB_SKIPMC=1 to try CUDA IPC instead.",),
    excerpts=(f"{TE_AT}:transformer_engine/pytorch/module/base.py:196-201",),
    confidence=0.9, versions="Transformer Engine 2.x to 2.18 (initialize_ub checks device_supports_multicast)")

TE_USERBUFFERS_MULTICAST_REFUSED = Signature(
    id="te-userbuffers-multicast-refused", symptom="hardware",
    patterns=(r"userbuffers[\w-]*\.cpp:\d+ in function create_communicator\w*: CUDA Error: operation not supported",),
    cause=_UB_MULTICAST_CAUSE + " Releases before that check create the multicast object anyway and the CUDA call fails "
                                "with 'operation not supported' in the communicator's creation.",
    fix=_UB_MULTICAST_FIX,
    source=github_blob(TE_AT, "transformer_engine/common/util/logging.h") + "#L57",
    emitted=("RuntimeError: /opt/TransformerEngine/transformer_engine/pytorch/csrc/userbuffers/userbuffers-host.cpp:208 "
             "in function create_communicator_grouped2: CUDA Error: operation not supported",),
    quote='      NVTE_ERROR("CUDA Error: ", cudaGetErrorString(status_NVTE_CHECK_CUDA)); \\',
    quoted_at=f"{TE_AT}:transformer_engine/common/util/logging.h:57",
    confidence=0.8, versions="Transformer Engine 1.x (userbuffers in pytorch/csrc, before initialize_ub's check)")

TE_USERBUFFERS_NOT_INITIALIZED = Signature(
    id="te-userbuffers-not-initialized", symptom="config-error",
    patterns=(r"\b(?i:UB[ _]manager (?:is )?)not initiali[sz]ed",),
    cause="A Transformer Engine layer built for TP communication overlap (ub_overlap_*: Megatron's tp_comm_overlap, "
          "NeMo's ub_tp_comm_overlap) asked for its userbuffers communicator, but TE's initialize_ub never created "
          "them: overlap was switched on in the layers without the initialisation that allocates the buffers "
          "(Megatron-Bridge does it in training/initialize.py _initialize_tp_communicators when "
          "model.tp_comm_overlap is set at start-up; a model built outside that path, or the flag set on the layers "
          "after it, misses it).",
    fix="turn TP communication overlap on through the framework's own setting before start-up (Megatron-Bridge: "
        "comm_overlap.tp_comm_overlap / model.tp_comm_overlap, which calls initialize_ub with the sequence x micro "
        "batch shape), or call transformer_engine.pytorch.initialize_ub(shape, tp_size, ...) before the model is "
        "built; or turn it off (tp_comm_overlap=False)",
    source=github_blob(TE_AT, "transformer_engine/pytorch/module/base.py") + "#L551-L558",
    emitted=("RuntimeError: UB manager is not initialized.",),
    excerpts=(f"{TE_AT}:transformer_engine/pytorch/module/base.py:551-558",),
    confidence=0.85, versions="Transformer Engine 0.8 to 2.18 (get_ub)")

ATTRIBUTE_ERROR = Signature(
    id="attribute-error", symptom="config-error", patterns=(),
    cause="An AttributeError ('CLASS' object has no attribute 'ATTR', module 'X' has no attribute 'Y') read against "
          "the installed source. On a Megatron-Core / Megatron-Bridge class or module: either the class sets the "
          "attribute in __init__ after a method that reads it has already run during construction (an "
          "initialisation-order bug, the chain of calls and the if tests that take it), or nothing in the installed "
          "version sets it (renamed or removed: code written for another version reads it). Across a package "
          "boundary: Megatron code reads an attribute another package's object lacks (the package named from the "
          "imports of the reading file: an API mismatch between the two versions), or code calls a name the run's "
          "copy of another package's module lacks (code written for another version of it; whether the copy "
          "installed here has it, and where the installed Megatron references it).",
    fix="for an initialisation-order bug, avoid the configuration its if tests name, or a release that sets the "
        "attribute first; for a name the installed version lacks, the release the reading code was written for; "
        "across a package boundary, pair the versions (the other package's release this Megatron-Core expects, or "
        "a Megatron-Core that matches the run's)",
    source="installed:mbridge_ep_overlap/diagnose/attribute_errors.py", emitted=(), confidence=0.6,
    found_by="attribute-error",
    versions="the installed megatron-core / megatron-bridge (its classes read from the source): 60% with the "
             "chain found, 40% otherwise; another package's object read by Megatron code: 50% with the installed "
             "line that reads it found, 40% otherwise; another package's module: 40%")

SIGNATURES = (
    UPSTREAM_CHECK,
    NATIVE_CHECK,
    FAILED_ASSERT,
    TE_NO_ATTENTION_BACKEND,
    TE_CUDNN_ATTENTION_REFUSED,
    TE_USERBUFFERS_NOT_INITIALIZED,
    TE_USERBUFFERS_NEED_MULTICAST,
    TE_USERBUFFERS_MULTICAST_REFUSED,
    TE_ATTENTION_BEFORE_MLA,
    GRAD_BUCKET_NOT_ISSUED,
    ATTRIBUTE_ERROR,
    _assert("overlap-needs-expert-parallel",
            "overlap_moe_expert_parallel_comm is only supported with expert model parallelism",
            "EP overlap was switched on with expert_model_parallel_size == 1: there is no all-to-all to hide.",
            "set model.expert_model_parallel_size > 1, or leave overlap off", "ep-size"),
    _assert("overlap-needs-alltoall-or-flex",
            "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher",
            "EP overlap with the allgather dispatcher (MCore's default when no dispatcher is set).",
            "enable_ep_overlap(cfg, 'alltoall' | 'deepep' | 'hybridep'), or "
            "model.moe_token_dispatcher_type=alltoall", "dispatcher-type",
            facts_pass=lambda f: (None if f.get("moe_token_dispatcher_type") is None
                                  else f["moe_token_dispatcher_type"] in ("alltoall", "flex"))),
    _assert("overlap-full-recompute",
            "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
            "Full activation recomputation re-runs whole layers, which the combined 1F1B schedule cannot split.",
            "model.recompute_granularity=selective (or null)", "full-recompute"),
    _assert("overlap-recompute-method",
            "disable recomputation method when enabling overlap_moe_expert_parallel_comm",
            "A recompute_method (uniform/block) is set with EP overlap.", "model.recompute_method=null",
            "recompute-method"),
    _assert("overlap-recompute-num-layers",
            "recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm",
            "recompute_num_layers is set with EP overlap.", "model.recompute_num_layers=null",
            "recompute-num-layers"),
    _assert("overlap-moe-recompute",
            "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm",
            "'moe' is in recompute_modules: recomputing the MoE block would re-issue the all-to-alls.",
            "remove 'moe' from model.recompute_modules", "moe-recompute"),
    _assert("overlap-needs-bf16-or-fp16",
            "overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model",
            "EP overlap on an fp32 model.", "use a bf16 mixed-precision recipe (mixed_precision=bf16_mixed)",
            "precision"),
    _assert("overlap-shared-expert-overlap",
            "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
            "moe_shared_expert_overlap and EP overlap both schedule the shared expert; MCore allows one.",
            "model.moe_shared_expert_overlap=false (EP overlap already hides the shared expert)",
            "shared-expert-overlap"),
    Signature(
        id="overlap-mtp-layers", symptom="config-error",
        patterns=(re.escape("MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm."),
                  re.escape("MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm.")),
        cause="More than one multi-token-prediction layer with EP overlap; before Megatron-LM PR #5912 MCore also "
              "refused mtp_num_layers=0 (no MTP, the default of hybrid models such as GPT-OSS).",
        fix="model.mtp_num_layers=1, or None for no MTP (0 on megatron-core before PR #5912)",
        source=_TC, emitted=("MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm.",),
        confidence=0.95, rule="mtp-layers", versions=_MCORE + "; the older wording before Megatron-LM PR #5912"),
    _assert("overlap-pp-needs-vpp",
            "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
            "pipeline_model_parallel_size > 1",
            "Pipeline parallelism without a virtual pipeline size: the combined 1F1B schedule needs "
            "interleaving to pair a forward with a backward.",
            "set model.virtual_pipeline_model_parallel_size (plan --resolve auto picks one)", "pp-needs-vpp"),
    _assert("delay-wgrad-needs-overlap",
            "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute",
            "delay_wgrad_compute without EP overlap.", "enable EP overlap too, or delay_wgrad_compute=false",
            "delay-wgrad-needs-overlap"),
    _assert("overlap-cuda-graph-moe-scope",
            "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm",
            "Transformer Engine CUDA graphs capture the moe/mlp scope that EP overlap splits across streams.",
            "drop moe and mlp from model.cuda_graph_scope", "cuda-graph-moe-scope"),
    _assert("overlap-torch-too-old",
            "A2A Overlap encounters hang issue with torch version < 2.6.0",
            "torch older than 2.6 with EP overlap (MCore knows it hangs).", "upgrade torch to >= 2.6",
            "torch-version"),
    Signature(
        id="deepep-backend-left-after-fallback", symptom="config-error",
        patterns=(r"DeepEP is supported for Ampere, Hopper, and Blackwell \(B200/B300\) GPUs\. Current GPU: "
                  r"NVIDIA GB\d+",),
        cause="moe_flex_dispatcher_backend='deepep' reached MB's validation on a GPU DeepEP does not support "
              "(GB200/GB300): the fallback to alltoall kept the DeepEP backend setting, finalize switched the "
              "dispatcher back to flex and validation raised.",
        fix="use the hybridep backend on GB200/GB300 (enable_ep_overlap(cfg, 'hybridep')), or clear "
            "model.moe_flex_dispatcher_backend when choosing alltoall; fixed upstream by MB PR #5207",
        source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5207",
        emitted=("ValueError: DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs. "
                 "Current GPU: NVIDIA GB200",), corpus_report="megatron-bridge-5207",
        confidence=0.9, rule="flex-backend-gpu", versions="megatron-bridge 0.2 - 0.6 (before PR #5207)"),
)

SIGNATURES += (
    Signature(
        id="deepep-internode-chunk-budget", symptom="config-error",
        patterns=(r"num_max_nvl_chunked_recv_tokens / num_rdma_ranks > std::max\(num_max_rdma_chunked_send_tokens",),
        cause="At this scale DeepEP's NVLink receive-chunk budget divided by the number of RDMA ranks is smaller "
              "than the send chunk sizes: the default internode dispatch/combine Config does not fit.",
        fix="pass a DeepEP Config retuned for the RDMA rank count (a larger num_max_nvl_chunked_recv_tokens, "
            "smaller send chunks)",
        source="https://github.com/deepseek-ai/DeepEP/issues/300",
        emitted=("`EP_HOST_ASSERT(num_max_nvl_chunked_recv_tokens / num_rdma_ranks > "
                 "std::max(num_max_rdma_chunked_send_tokens, num_max_nvl_chunked_send_tokens));`",),
        corpus_report="deepep-300", confidence=0.9, versions="DeepEP 1.x"),
    Signature(
        id="deepep-low-latency-token-limit", symptom="config-error",
        patterns=(r"x\.size\(0\) <= num_max_dispatch_tokens_per_rank",),
        cause="More tokens per rank than the low-latency buffer's num_max_dispatch_tokens_per_rank (on GB200 only "
              "DeepEP's low-latency kernels run: its normal kernels allow at most 8 GPUs per node).",
        fix="lower the tokens per rank (micro batch x sequence length) or build the buffer with a larger "
            "num_max_dispatch_tokens_per_rank (needs a deeper NVSHMEM queue-pair depth); on GB200 use HybridEP",
        source="https://github.com/deepseek-ai/DeepEP/issues/392",
        emitted=("[rank0]: RuntimeError: Failed: Assertion error /workspace/fireworks/third-party/DeepEP/csrc/"
                 "deep_ep.cpp:1134 'x.size(0) == topk_idx.size(0) and x.size(0) <= num_max_dispatch_tokens_per_rank'",),
        corpus_report="deepep-392", confidence=0.85, versions="DeepEP 1.x low-latency mode"),
    Signature(
        id="hybridep-expert-layout-mismatch", symptom="config-error",
        patterns=(r"hybrid_ep/executor/executor\.cu:\d+:.*Assertion `num_of_expert == config\.num_of_experts_per_rank",),
        cause="HybridEP's expert count does not equal experts per rank x ranks per node x nodes: its topology "
              "(NVLink domain, ranks per node) disagrees with the run.",
        fix="set NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN / the node count to the run's real layout "
            "(enable_ep_overlap(cfg, 'hybridep') sets them from the target)",
        source="https://github.com/deepseek-ai/DeepEP/issues/479",
        emitted=("python3: /opt/DeepEP/csrc/hybrid_ep/executor/executor.cu:20: std::tuple<at::Tensor, at::Tensor, "
                 "at::Tensor, at::Tensor, at::Tensor> Executor::metadata_preprocess_core(HybridEpConfigInstance, "
                 "hybrid_ep::tmp_state_t*, at::Tensor, int): Assertion `num_of_expert == "
                 "config.num_of_experts_per_rank * config.num_of_ranks_per_node * config.num_of_nodes' failed.",),
        corpus_report="deepep-479", confidence=0.9, rule="hybridep-nvlink-domain", versions="DeepEP hybrid-ep"),
    Signature(
        id="grad-none-with-overlap-grad-reduce", symptom="config-error",
        patterns=(r"param\.grad being None is not safe when overlap_grad_reduce is True",),
        cause="A parameter's grad was None when MCore's DDP hook ran with overlap_grad_reduce: a Transformer Engine "
              "module (GroupedLinear, the MoE grouped GEMM) saved its weight without grad_added_to_main_grad.",
        fix="upgrade Transformer Engine to a release with TransformerEngine PR #1609 (or turn off "
            "ddp.overlap_grad_reduce to confirm)",
        source="https://github.com/NVIDIA/TransformerEngine/pull/1609",
        emitted=("[rank0]: AssertionError: param.grad being None is not safe when overlap_grad_reduce is True",),
        corpus_report="transformer-engine-1609", confidence=0.75, versions="TE 2.x before PR #1609"),
)

_TE_V2_2 = "NVIDIA/TransformerEngine@c55e425ac5751c72bfa656560fc7c65ab7d895e9"
"""Transformer Engine v2.2, whose FP8 GEMM shape check is the AssertionError of 2.3 and older."""

SIGNATURES += (
    Signature(
        id="te-fp8-gemm-leading-dimension", symptom="config-error",
        patterns=(r"Assertion failed: ret\.ld[ab] % 16 == 0",
                  r"Leading dimension requirement on [AB] for FP8 GEMM\. Caller must pad"),
        cause="A Transformer Engine FP8 GEMM got an operand whose leading dimension is not a multiple of 16 (cuBLAS's "
              "FP8 Tensor Core requirement, checked in TE's cublaslt_gemm.cu): for an activation that is its token "
              "count - an expert's share of the tokens after the dispatch, or a packed sequence's length - which "
              "MoE routing and sequence packing leave unaligned.",
        fix="pad the tokens per GEMM to a multiple of 16: for MoE experts moe_router_padding_for_quantization=True "
            "(Megatron-Core pads each expert's routed tokens for quantized precision); for packed sequences pad each "
            "pack to a multiple of 16; or run the layer outside FP8",
        source=github_blob(TE_AT, "transformer_engine/common/gemm/cublaslt_gemm.cu") + "#L159-L163",
        emitted=("RuntimeError: /opt/TransformerEngine/transformer_engine/common/gemm/cublaslt_gemm.cu:161 in function "
                 "CanonicalizeGemmInput: Assertion failed: ret.lda % 16 == 0. Leading dimension requirement on A for FP8 "
                 "GEMM. Caller must pad.",),
        excerpts=(f"{TE_AT}:transformer_engine/common/gemm/cublaslt_gemm.cu:159-163",
                  f"{TE_AT}:transformer_engine/common/gemm/cublaslt_gemm.cu:250-254"),
        confidence=0.85, versions="Transformer Engine 2.x FP8 GEMMs (cublaslt_gemm.cu)"),
    Signature(
        id="te-fp8-gemm-dims-not-divisible", symptom="config-error",
        patterns=(r"FP8 execution requires 2D input matrices with height divisible by 8 and width divisible by 16",
                  r"FP8 execution requires the product of all dimensions except the last to be divisible by 8 and "
                  r"the last dimension to be divisible by 16"),
        cause="An FP8 GEMM of a Transformer Engine layer got an input whose shape the FP8 Tensor Core GEMM does not "
              "take: the leading dimensions (tokens: sequence x micro-batch, or an expert's share of them) must "
              "multiply to a multiple of 8 and the last one (the layer's input width) must be a multiple of 16.",
        fix="make the layer's widths multiples of 16 (pad hidden / ffn sizes, e.g. to a multiple of 32 or 64) and the "
            "tokens per micro-batch a multiple of 8; for MoE grouped GEMMs pad each expert's tokens "
            "(moe_router_padding_for_fp8 / Fp8Padding); or run the offending small layer outside fp8_autocast",
        source=github_blob(TE_AT, "transformer_engine/pytorch/utils.py") + "#L613-L623",
        emitted=("AssertionError: FP8 execution requires 2D input matrices with height divisible by 8 and width "
                 "divisible by 16, but got tensor with dims=[896, 712]",
                 "ValueError: FP8 execution requires the product of all dimensions except the last to be divisible by 8 "
                 "and the last dimension to be divisible by 16, but got tensor with dims=[4, 224, 712] (product of "
                 "leading dims = 896, last dim = 712)"),
        excerpts=(f"{TE_AT}:transformer_engine/pytorch/utils.py:613-623",
                  f"{_TE_V2_2}:transformer_engine/pytorch/utils.py:236-244"),
        confidence=0.95,
        versions="the ValueError ('product of all dimensions except the last'): Transformer Engine 2.4 to 2.18; "
                 "the AssertionError ('2D input matrices with height ... and width'): Transformer Engine 1.5 to 2.3 "
                 "(1.4 and older assert the shape with no message)"),
)

CONFIG_SECTION_NONE = Signature(
    id="none-section", symptom="config-error", patterns=(),
    cause="'NoneType' object has no attribute 'A' where A is a field of a Megatron-Bridge config section that "
          "ConfigContainer declares Optional and defaults to None (comm_overlap, ft, straggler, peft, ...): the recipe "
          "sets or reads cfg.SECTION.A while cfg.SECTION was never created. The section is read from the installed "
          "ConfigContainer.",
    fix="create the section first (cfg.SECTION = ITS_CLASS(...)), then set the field",
    source="installed:megatron/bridge/training/config.py (ConfigContainer; the AttributeError raised on a real "
           "ConfigContainer in the parity test)", emitted=(), confidence=0.6, found_by="none-section",
    versions="the installed megatron-bridge (its ConfigContainer is read)")

SIGNATURES += (CONFIG_SECTION_NONE,)

SIZE_NOT_DIVISIBLE = Signature(
    id="divisibility", symptom="config-error", patterns=(),
    cause="A check of some framework says one size must divide another ('A=a must be divisible by B=b', 'a is not "
          "divisible by b', 'the world size must be divisible by ETP * EP * PP (1 * 64 * 4 = 256)' with the GPU "
          "count): the numbers are read from the message and checked.",
    fix="the values that divide, computed from the message: the divisors of the dividend nearest the divisor, or for "
        "a product of parallel sizes each factor's values that make it divide the GPU count",
    source="installed:mbridge_ep_overlap/diagnose/divisibility.py (Megatron-Core's ensure_divisibility raised in its "
           "test)", emitted=(), confidence=0.5, found_by="divisibility",
    versions="any framework's wording of the forms the reader knows")

SIGNATURES += (SIZE_NOT_DIVISIBLE,)

NAME_NOT_DEFINED = Signature(
    id="name-error", symptom="config-error", patterns=(),
    cause="NameError / UnboundLocalError: a name used where it is not defined, a bug of the release whose code raised "
          "it (a typo, a refactor's leftover, a missing import), not a configuration error. The finding names the "
          "frame that raised it and where the installed Megatron-Core / Megatron-Bridge bind the name (the same "
          "function there: the installed release has it fixed).",
    fix="a release of that package with the bug fixed, or avoid the code path until then",
    source="installed:mbridge_ep_overlap/diagnose/name_errors.py (Python's NameError raised in its test)", emitted=(),
    confidence=0.55, found_by="name-error",
    versions="55% with the raising frame in the log, 45% without")

SIGNATURES += (NAME_NOT_DEFINED,)

UNPACK_MISMATCH = Signature(
    id="unpack-mismatch", symptom="config-error", patterns=(),
    cause="ValueError: too many / not enough values to unpack: the caller unpacks a call's result into another number "
          "of names than the call gives, read against what the installed Megatron-Core / Megatron-Bridge function of "
          "that name gives (its NamedTuple or tuple): caller and callee are from different releases.",
    fix="run the caller with the release it was written for, or unpack what the run's release gives",
    source="installed:mbridge_ep_overlap/diagnose/unpacking.py (Python's unpacking ValueError raised in its test)",
    emitted=(), confidence=0.6, found_by="unpacking",
    versions="60% where an installed function of the called name says what it gives, 40% otherwise")

SIGNATURES += (UNPACK_MISMATCH,)

STATE_DICT_SHAPE = Signature(
    id="state-dict-shape", symptom="config-error", patterns=(),
    cause="A checkpoint's tensors do not have the model's shapes (torch's load_state_dict: 'size mismatch for NAME: "
          "copying a param with shape ... from checkpoint, the shape in current model is ...'): per part of the model, "
          "the dimension that differs and by what factor - a tensor split k ways against a whole one, a gated FC1 "
          "against an ungated one, another padded vocabulary, another model size.",
    fix="build the model with the sizes the checkpoint was saved with (the config that wrote it; for a checkpoint that "
        "is not a distributed one, the same tensor / expert parallel sizes), or convert the checkpoint to this "
        "model's layout (Megatron-Bridge's converters, a distributed checkpoint that reshards on load)",
    source="installed:torch/nn/modules/module.py (load_state_dict's size-mismatch message, raised in its test)",
    emitted=(), confidence=0.7, found_by="state-dict-shape",
    versions="torch 1.x to 2.11 (Module._load_from_state_dict)")

SIGNATURES += (STATE_DICT_SHAPE,)

GEMM_ALIGNMENT = Signature(
    id="gemm-16-byte-alignment", symptom="config-error",
    patterns=(r"strides should be multiple of 16 bytes",
              r"Expected (?:trailing dimension of mat(?:_a|_b|1|2)|mat_b shape) to be divisible by 16"),
    cause="torch's scaled and grouped matmuls (torch._scaled_mm, torch._scaled_grouped_mm, torch._grouped_mm: the FP8 "
          "and grouped GEMMs of cuBLASLt / CUTLASS) need every stride and the trailing dimension 16-byte aligned - 16 "
          "FP8 elements, 8 BF16 ones. In an MoE grouped GEMM each expert's group of tokens is a block of rows, so a "
          "group whose token count is not a multiple of the alignment (tokens were not padded per expert), or a "
          "hidden / FFN size that is not, makes the GEMM refuse.",
    fix="pad each expert's token group to the alignment before the grouped GEMM (Megatron-Core: "
        "moe_router_padding_for_quantization=True for FP8-class recipes; torchtitan: its token-group alignment size, "
        "16 for FP8 and 32 for MXFP8), and keep hidden and FFN sizes multiples of 16",
    source="installed:torch/lib/libtorch_cuda.so (ATen's scaled / grouped matmul checks)",
    emitted=("RuntimeError: strides should be multiple of 16 bytes",
             "RuntimeError: Expected trailing dimension of mat_a to be divisible by 16",
             "RuntimeError: Expected mat_b shape to be divisible by 16"),
    confidence=0.8, versions="torch 2.8 to 2.11 (the grouped and scaled matmuls)")

SIGNATURES += (GEMM_ALIGNMENT,)

FLATTENED_RANGE = Signature(
    id="dist-optimizer-flattened-range-format", symptom="config-error",
    patterns=(r"ShardedTensor\.flattened_range is not supported",),
    cause="The distributed optimizer's state was built for a distributed checkpoint in the "
          "'fully_sharded_model_space' format - Megatron-Core's default when the sharded-state-dict metadata names no "
          "distrib_optim_sharding_type (DistributedOptimizer.sharded_state_dict), or named so - which cuts each "
          "parameter's optimizer state into flattened ranges (ShardedTensor.flattened_range), a legacy layout the "
          "installed dist_checkpointing refuses (mapping.py validate_metadata_integrity).",
    fix="pass distrib_optim_sharding_type='dp_reshardable' (Megatron-Bridge's default) or 'fully_reshardable' "
        "(Megatron-Bridge: checkpoint.dist_ckpt_optim_fully_reshardable=True) in the metadata given to the model's and "
        "optimizer's sharded_state_dict; a framework that calls Megatron-Core's checkpointing itself must pass that "
        "metadata",
    source="installed:megatron/core/dist_checkpointing/mapping.py",
    emitted=("megatron.core.dist_checkpointing.core.CheckpointingException: ShardedTensor.flattened_range is not "
             "supported.",),
    confidence=0.85, versions="megatron-core 0.19.2 (installed; the model-space format still builds flattened ranges)")

SIGNATURES += (FLATTENED_RANGE,)

KERNEL_LIMIT = Signature(
    id="kernel-limit", symptom="config-error", patterns=(),
    cause="A kernel or library check says the run's value is outside what it was built for: 'Unsupported WHAT[: VALUE]' "
          "(a type switch or a table of tuned sizes without this one), or a condition against a compile-time maximum "
          "('num_topk <= kNumMaxTopK'). The quantity is read from the check's words and named with the config field "
          "that sets it.",
    fix="a value of that field the library supports, or a release (or build) of the library that supports the run's",
    source="installed:mbridge_ep_overlap/diagnose/kernel_limits.py (the forms DeepEP's EP_HOST_ASSERT and its Python "
           "asserts print, read in its test)", emitted=(), confidence=0.6, found_by="kernel-limit",
    versions="any library's 'Unsupported ...' / '<= kMax...' check")

VALUE_MISMATCH = Signature(
    id="value-mismatch", symptom="config-error", patterns=(),
    cause="A check of two values that must be equal failed and printed both ('A == B (a vs. b)', TORCH_CHECK_EQ's "
          "form): the caller passed a tensor whose size or layout the callee does not take.",
    fix="make the side named first match the second; caller and callee from releases that agree on the layout",
    source="installed:mbridge_ep_overlap/diagnose/kernel_limits.py (TORCH_CHECK_EQ's 'a == b (x vs. y)' form, read in "
           "its test)", emitted=(), confidence=0.5, found_by="value-check",
    versions="any check printed in TORCH_CHECK_EQ's form")

NULL_TENSOR = Signature(
    id="null-tensor", symptom="config-error", patterns=(),
    cause="A kernel's check that a pointer is not null failed ('topk_idx_ptr != 0'): a tensor without storage reached "
          "it - an empty tensor (a rank that received zero tokens passes a [0, k] tensor whose data pointer is 0) or a "
          "tensor never allocated.",
    fix="skip the call or pass a placeholder on a rank with no tokens, or a release that handles zero tokens",
    source="installed:mbridge_ep_overlap/diagnose/kernel_limits.py (DeepEP's EP_HOST_ASSERT form, read in its test)",
    emitted=(), confidence=0.55, found_by="kernel-limit", versions="any library's '..._ptr != 0' / '!= nullptr' check")

SIGNATURES += (KERNEL_LIMIT, VALUE_MISMATCH, NULL_TENSOR)

UNMAPPED_PARAMS = Signature(
    id="conversion-unmapped", symptom="config-error", patterns=(),
    cause="Exporting to Hugging Face, Megatron-Bridge's model bridge found no mapping for some Megatron parameters "
          "('No mapping found for megatron_param: NAME'): they are counted by module and by part (MTP layers, a "
          "distillation teacher, adapters) and are not written.",
    fix="export what the Hugging Face architecture has: the student without its teacher, MTP with a bridge that maps "
        "it, merged adapters; or a bridge release that maps the modules",
    source="installed:megatron/bridge/models/conversion/model_bridge.py (its 'No mapping found for megatron_param' "
           "warning)", emitted=(), confidence=0.6, found_by="conversion",
    versions="Megatron-Bridge 0.6.2 and the releases that print the same warning")

EXPORT_SHARDS_INCOMPLETE = Signature(
    id="export-shards-incomplete", symptom="config-error",
    patterns=(r"tensors were yielded but not saved because their corresponding file shards? were incomplete",
              r"tensors from the original checkpoint were not written"),
    cause="The Hugging Face export writes into the shard layout of the reference checkpoint it was given (its "
          "model.safetensors.index.json); tensors of that reference that the exported model never produces leave "
          "their shards incomplete, and an incomplete shard is not written: the trained model's architecture (layers, "
          "hidden size, MoE layout, vocabulary) differs from the reference checkpoint's.",
    fix="export against a Hugging Face config / checkpoint of the same architecture as the trained model (a reference "
        "whose tensors the model produces), or pass strict=False to write the partial checkpoint knowingly",
    source="installed:megatron/bridge/models/hf_pretrained/state.py",
    emitted=("Warning: 1481 tensors were yielded but not saved because their corresponding file shards were incomplete.",
             "Error: 91991 tensors from the original checkpoint were not written. See warnings above for details."),
    confidence=0.7, versions="'file shards were incomplete': Megatron-Bridge 0.6.2; 'file shard were': an older release")

SIGNATURES += (UNMAPPED_PARAMS, EXPORT_SHARDS_INCOMPLETE)

_MISMATCHES = "installed:mbridge_ep_overlap/diagnose/mismatches.py"
VERSION_GATE = Signature(
    id="version-gate", symptom="config-error", patterns=(),
    cause="A package checked another's version and refused it ('Supported flash-attn versions are >= A, <= B. Found "
          "C.', 'X maximum version A is supported', 'requires X >= A'): the installed version is outside the range "
          "that release accepts.",
    fix="install a version in the range, or a release of the checking package that accepts the installed one",
    source=f"{_MISMATCHES} (the forms Transformer Engine's and Megatron's version checks print, read in its test)",
    emitted=(), confidence=0.7, found_by="mismatch", versions="any package's version check in these forms")

SHARDED_SIZE = Signature(
    id="sharded-size", symptom="config-error", patterns=(),
    cause="torch's 'The size of tensor a (X) must match the size of tensor b (Y)' where one size is a whole multiple k "
          "of the other: one operand holds one of k shards of the other's - a parallel split (sequence parallelism "
          "over TP, CP, EP) applied to one side only.",
    fix="the code combining them must split the other operand the same way; confirm by running without the size-k "
        "parallelism",
    source=f"{_MISMATCHES} (torch's broadcasting error, raised in its test)", emitted=(), confidence=0.55,
    found_by="mismatch", versions="torch 2.x")

EXPERT_LAYOUT = Signature(
    id="expert-layout", symptom="config-error", patterns=(),
    cause="Missing / unexpected state-dict keys of MoE experts in different layouts (grouped experts.weight1, TE "
          "grouped linear_fc1.weightN, per-expert local_experts.N): the checkpoint was saved with another expert layout "
          "than the model now built.",
    fix="build the model with the layout it was saved with, or convert the expert weights",
    source=f"{_MISMATCHES} (Megatron-Core's expert module names, torch's load_state_dict message)", emitted=(),
    confidence=0.7, found_by="mismatch", versions="Megatron-Core's GroupedMLP / TEGroupedMLP / SequentialMLP names")

PICKLED_CLASS = Signature(
    id="pickled-class", symptom="config-error", patterns=(),
    cause="Unpickling failed with \"Can't get attribute 'NAME' on <module 'M'>\": the data was written by a release of "
          "M that has NAME and read by one that does not (checked in the installed M).",
    fix="load with the release that wrote it, or upgrade the loading side",
    source=f"{_MISMATCHES} (pickle's error, raised in its test)", emitted=(), confidence=0.7, found_by="mismatch",
    versions="Python's pickle")

TABLE_KEY = Signature(
    id="table-key", symptom="config-error", patterns=(),
    cause="KeyError: 'VALUE' raised by a line that indexes a table by a configured value (ROPE_MAPPING[rope_type]): the "
          "table has no entry for the value the config or checkpoint gives.",
    fix="a value the table lists, or a release whose table has it",
    source=f"{_MISMATCHES} (Python's KeyError under a traceback source line, raised in its test)", emitted=(),
    confidence=0.55, found_by="mismatch", versions="Python's traceback format")

SIGNATURES += (VERSION_GATE, SHARDED_SIZE, EXPERT_LAYOUT, PICKLED_CLASS, TABLE_KEY)
