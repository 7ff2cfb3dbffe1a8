"""Environment: the software versions and launcher variables EP overlap depends on (the advice
of the same family lives in ``advice``)."""

from __future__ import annotations


from ...base.errors import Severity
from ...predict import precision
from ...target.stack import unknown_versions
from ..facts import Facts
from ..prediction_inputs import gemm_precision
from .base import Family, Upstream, When, release_before, rule, te_known, version_at_least

TESTED_PAIR = ("0.19.2", "0.6.2")  # megatron-core, megatron-bridge

family = rule.family(Family.ENVIRONMENT)


@family("torch-version", When.OVERLAP, "environment.torch_version", required=">= 2.6.0",
        needs=lambda f: f.env.torch_version is not None, current=lambda f: f.env.torch_version,
        upstream=Upstream.MCORE, upstream_match="hang issue with torch version")
def torch_version(f: Facts) -> bool:
    """EP overlap hangs with torch < 2.6.0.

    Fix: upgrade PyTorch to 2.6 or newer.
    """
    return version_at_least(f.env.torch_version, "2.6.0")


@family("cuda-device-max-connections", When.OVERLAP, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS",
        required="> 1 (32 recommended)", current=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS"))
def cuda_device_max_connections(f: Facts) -> bool:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 in force (the launcher's exported value wins over cfg.env_vars:
    MB only sets what is not exported) serialises the all-to-all stream behind compute: the overlap
    hides nothing.

    Fix: unset CUDA_DEVICE_MAX_CONNECTIONS in the launcher, or export CUDA_DEVICE_MAX_CONNECTIONS=32
    there (and keep 32 in cfg.env_vars).
    """
    return f.env_var("CUDA_DEVICE_MAX_CONNECTIONS") != "1"


@family("tested-versions", When.OVERLAP, "environment.mcore_version", severity=Severity.WARNING,
        required="megatron-core 0.19.2 with megatron-bridge 0.6.2", needs=lambda f: bool(f.env.mcore_version),
        current=lambda f: f"megatron-core {f.env.mcore_version}, megatron-bridge {f.env.mb_version}")
def tested_versions(f: Facts) -> bool:
    """these rules mirror the tested pair; other versions may check differently.

    Fix: install megatron-core==0.19.2 and megatron-bridge==0.6.2.
    """
    return (f.env.mcore_version, f.env.mb_version) == TESTED_PAIR


def _unknown_versions(f: Facts) -> str | None:
    return "; ".join(unknown_versions(f.env.te_version, f.env.deep_ep_version)) or None


@family("stack-versions-known", When.ALWAYS, "environment.te_version", severity=Severity.ADVICE,
        required="TE 2.7 to 2.18 and DeepEP 1.0 to 1.2 (the versions these rules were checked against)",
        current=_unknown_versions)
def stack_versions_known(f: Facts) -> bool:
    """the target's Transformer Engine or DeepEP is outside the versions these rules were checked
    against: the verdict is the rules' as they stand, and the value found says what it assumes.

    Fix: check the plan against a run on that stack (mbridge-ep-overlap bench run), or use TE 2.7 to 2.18
    and DeepEP 1.0 to 1.2.
    """
    return _unknown_versions(f) is None


TE_ONLY_FEATURES = (  # model field -> the value that needs Transformer Engine
    ("transformer_impl", "transformer_engine"), ("apply_rope_fusion", True), ("moe_permute_fusion", True),
    ("use_transformer_engine_op_fuser", True), ("cuda_graph_impl", "transformer_engine"),
)


def _te_features_on(f: Facts) -> dict[str, object]:
    """Each setting that needs Transformer Engine, with its value (the field and the value it has)."""
    on = {f"model.{name}": value for name, value in TE_ONLY_FEATURES if f.model(name) == value}
    if getattr(getattr(f.cfg, "optimizer", None), "use_precision_aware_optimizer", False):
        on["optimizer.use_precision_aware_optimizer"] = True
    return on


@family("te-features-need-te", When.ALWAYS, "model.* / optimizer.use_precision_aware_optimizer (TE-only settings)",
        required="Transformer Engine on the target",
        needs=te_known, current=_te_features_on, upstream=Upstream.MCORE,
        upstream_match="not available. Please install TE|requires FusedAdam from TransformerEngine")
def te_features_need_te(f: Facts) -> bool:
    """the config uses Transformer Engine layers or kernels, and the target has no Transformer Engine.

    Fix: install Transformer Engine on the nodes (or plan with --te VERSION), or use the local layer spec
    with the TE fusions off.
    """
    return bool(f.te_usable) or not _te_features_on(f)



@family("grad-accum-fusion-needs-apex", When.ALWAYS, "model.gradient_accumulation_fusion",
        required="False, or APEX's fused_weight_gradient_mlp_cuda on the node",
        needs=lambda f: f.env.apex_fused_wgrad is not None, current=lambda f: f.model("gradient_accumulation_fusion"))
def grad_accum_fusion_needs_apex(f: Facts) -> bool:
    """gradient_accumulation_fusion is on and APEX's fused_weight_gradient_mlp_cuda is missing: Megatron-Core's
    ColumnParallelLinear (the output layer, even with TE layers) raises when the model is built, after setup
    (seen on 2x H200 with TE 2.18 and no APEX)

    Fix: set model.gradient_accumulation_fusion=False, or install APEX with its CUDA extensions on the nodes.
    """
    return not f.model("gradient_accumulation_fusion") or bool(f.env.apex_fused_wgrad)


FP8_MIN_COMPUTE_CAPABILITY = (8, 9)
"""Transformer Engine runs FP8 (and the finer low-precision recipes) from compute capability 8.9 (Ada) on
(its ``_compute_fp8_support``; the diagnose signature ``te-fp8-needs-compute-capability-8-9`` quotes it)."""


def _low_precision(f: Facts) -> str | None:
    """The low-precision GEMM recipe the config asks for (fp8_delayed, mxfp8, ...), None for bf16/fp16/fp32."""
    try:
        asked = gemm_precision(f.cfg)
    except ValueError:  # a recipe the precision table does not read: mixed-precision-known says so
        return None
    return asked if asked in precision.LOW else None


def _gpu_and_precision(f: Facts) -> str:
    major, minor = f.env.compute_capability
    return f"{_low_precision(f)} on {f.env.gpu_name} (compute capability {major}.{minor})"


@family("fp8-needs-compute-capability-8-9", When.ALWAYS, "mixed_precision",
        required="compute capability 8.9 or newer (Ada, Hopper, Blackwell) for an FP8 / FP4 recipe",
        needs=lambda f: f.env.compute_capability is not None and _low_precision(f) is not None,
        current=_gpu_and_precision)
def fp8_needs_compute_capability(f: Facts) -> bool:
    """an FP8 (or FP4) mixed-precision recipe on a GPU without FP8 Tensor Cores: finalize accepts it, then
    Transformer Engine refuses the first FP8 layer with 'Device compute capability 8.9 or higher required for FP8
    execution.' (A100 and other Ampere GPUs)

    Fix: use a bf16 recipe on this GPU (mixed_precision=bf16_mixed), or run the FP8 recipe on Ada, Hopper or
    Blackwell GPUs.
    """
    return tuple(f.env.compute_capability) >= FP8_MIN_COMPUTE_CAPABILITY


RECIPE_COMPUTE_CAPABILITY = {
    "fp8_blockwise": ((9, 0), None),
    "mxfp8": ((10, 0), (12, 0)),
    "nvfp4": ((10, 0), None),
}
"""The compute capabilities, [first, end), on which Transformer Engine 2.18 runs a block-scaled recipe
(``quantization.py`` ``_compute_*_support``: MXFP8 from 10.0 and not on 12.0+, NVFP4 from 10.0, FP8 block
scaling from 9.0 with torch built for CUDA 12.9+); the diagnose signatures ``te-mxfp8-*``, ``te-nvfp4-*`` and
``te-fp8-block-scaling-needs-cuda-12-9`` quote its messages."""
BLOCKWISE_ON_BLACKWELL_TE = "2.9"
"""Before this Transformer Engine release FP8 block scaling ran on Hopper (9.x) alone."""


def _recipe_range(f: Facts) -> tuple[tuple[int, int], tuple[int, int] | None] | None:
    low = _low_precision(f)
    if low not in RECIPE_COMPUTE_CAPABILITY:
        return None
    first, end = RECIPE_COMPUTE_CAPABILITY[low]
    if low == "fp8_blockwise" and release_before(f.env.te_version, BLOCKWISE_ON_BLACKWELL_TE):
        end = (10, 0)
    return first, end


@family("block-scaled-recipe-on-gpu", When.ALWAYS, "mixed_precision",
        required="MXFP8: compute capability 10.x-11.x (B200, B300, GB200, GB300); NVFP4: 10.0 or newer; FP8 block "
                 "scaling: 9.0 or newer (9.x alone before Transformer Engine 2.9; its torch-built-for-CUDA-12.9 "
                 "condition is not checked here: the target does not record torch's CUDA)",
        needs=lambda f: f.env.compute_capability is not None and _recipe_range(f) is not None,
        current=_gpu_and_precision)
def block_scaled_recipe_on_gpu(f: Facts) -> bool:
    """a block-scaled low-precision recipe on a GPU Transformer Engine does not run it on: finalize accepts it, then
    TE refuses the first layer ('Device compute capability 10.0 or higher required for MXFP8 execution.' on Hopper,
    'MXFP8 ... is not supported on 12.0+ architectures yet.' on RTX-class Blackwell, the NVFP4 and FP8 block-scaling
    equivalents)

    Fix: on Hopper use fp8_recipe='blockwise' or 'tensorwise' (NVIDIA's H100 perf recipes use FP8 current scaling),
    on compute capability 12.x 'tensorwise' or 'delayed'; MXFP8 and NVFP4 on B200 / B300 / GB200 / GB300.
    """
    first, end = _recipe_range(f)
    cc = tuple(f.env.compute_capability)
    return cc >= first and (end is None or cc < end)


def _cudnn_pair(f: Facts) -> str:
    return f"{f.env.te_cudnn_version} ({f.env.te_cudnn_library}); torch runs {f.env.torch_cudnn_version}"


@family("te-cudnn-matches-torch", When.ALWAYS, "environment.te_cudnn_version",
        required="the cuDNN torch runs", current=_cudnn_pair,
        needs=lambda f: bool(f.env.te_cudnn_version and f.env.torch_cudnn_version))
def te_cudnn_matches_torch(f: Facts) -> bool:
    """Transformer Engine loaded another cuDNN than the one torch runs: TE's fused attention fails at
    the first step with CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED (seen on H200 nodes: TE loaded a system
    libcudnn.so 9.14, torch ran the 9.19 wheel)

    Fix: export CUDNN_HOME=<the folder of torch's cuDNN, e.g. site-packages/nvidia/cudnn> before the
    process starts (TE searches CUDNN_HOME, CUDNN_PATH, CUDA_HOME, /usr/local/cuda in that order).
    """
    return f.model("transformer_impl") != "transformer_engine" or f.env.te_cudnn_version == f.env.torch_cudnn_version


RULES = family.rules
