"""``mbridge-ep-overlap doctor``: this machine in a block a user can paste into an issue.

Contract: one fenced block (the whole of it, ready to paste into an issue): this package's version
and where it is imported from, versions (Python, torch, Megatron-Core, Megatron-Bridge, Transformer Engine, DeepEP and
whether it has NVSHMEM kernels), GPUs, NCCL, NVSHMEM, the relevant environment variables, the
active import shims and the megatron-core dataset-helper gap, then a verdict per dispatcher from the same facts
the rules read (``core.dispatcher.problems``) plus this node's cached smoke-check verdict
(``lab.smoke``), and what ``auto`` picks here. ``--smoke`` then runs the smoke check (each
backend's buffer on two ranks, one dispatch/combine round trip with a result check, in a
subprocess with a timeout) and prints a verdict line per backend. Exit codes: 0 (``--smoke``: every
installed backend usable), 1 (``--smoke``: an installed backend failed on the path training takes),
2 (``--smoke`` on a machine where it cannot run: one line on stderr, nothing else).
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from .. import __version__
from ..base.choices import DEEP_EP_BACKENDS, NAMED_DISPATCHERS
from ..base.errors import UsageError


def dataset_helpers_gap() -> str | None:
    """MB's initialize runs ``make -C megatron/core/datasets``; the PyPI wheel has no Makefile there."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.core.datasets")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    if (folder / "Makefile").exists():
        return None
    prebuilt = any(folder.glob("helpers_cpp*.so"))
    return (
        f"{folder}/Makefile is missing: MB pretrain() exits at 'compiling dataset index builder'. Fix: "
        + (f"bash scripts/dataset_makefile.sh {folder}  (a no-op Makefile: helpers_cpp is prebuilt; "
           "scripts/setup_env.sh runs it)" if prebuilt else "install megatron-core from source, or build helpers_cpp")
    )


def doctor_lines() -> list[str]:
    import torch

    from ..core import dispatcher
    from ..target import shims
    from ..target.cluster import dist_version
    from ..target.probe import probe

    shims.install()
    env = probe()
    lines = ["```", "mbridge-ep-overlap doctor"]
    lines.append(f"mbridge-ep-overlap: {__version__} ({Path(__file__).resolve().parents[1]})")
    lines.append(f"python            : {platform.python_version()} ({sys.executable})")
    lines.append(f"torch             : {torch.__version__} (CUDA {torch.version.cuda})")
    lines.append(f"megatron-core     : {env.mcore_version or 'missing'}")
    lines.append(f"megatron-bridge   : {env.mb_version or 'missing'}")
    lines.append(f"transformer-engine: {env.te_version or 'missing'}")
    lines.append(f"deep_ep           : {env.deep_ep_version or 'missing'}"
                 + (f" (HybridEP: {'yes' if env.hybrid_ep_available else 'no'})" if env.deep_ep_version else ""))
    if env.deep_ep_build:
        lines.append(f"deep_ep build     : {env.deep_ep_build}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"GPUs              : {torch.cuda.device_count()} x {p.name} (sm{p.major}{p.minor}, "
                     f"{p.total_memory / 2**30:.0f} GiB)")
        try:
            lines.append(f"NCCL              : {'.'.join(map(str, torch.cuda.nccl.version()))}")
        except Exception as e:  # noqa: BLE001 - depends on the build; the line says why
            lines.append(f"NCCL              : unknown ({e})")
    else:
        lines.append("GPUs              : none visible (CUDA not available)")
    lines.append(f"NVSHMEM           : {dist_version('nvidia-nvshmem-cu13', 'nvidia-nvshmem-cu12') or 'missing'}")
    if env.te_cudnn_version or env.torch_cudnn_version:
        same = env.te_cudnn_version == env.torch_cudnn_version
        lines.append(f"cuDNN             : torch {env.torch_cudnn_version or 'unknown'}; Transformer Engine loaded "
                     f"{env.te_cudnn_version or 'unknown'} ({env.te_cudnn_library or '?'})"
                     + ("" if same else " - MISMATCH: TE's fused attention will fail (rule te-cudnn-matches-torch; "
                        "export CUDNN_HOME=<torch's cuDNN folder>)"))
    active = shims.installed()
    lines.append(f"import shims      : {', '.join(active) if active else 'none (real packages present)'}")
    for k in sorted(env.env_vars):
        lines.append(f"env {k}={env.env_vars[k]}")
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in env.env_vars:
        lines.append("env CUDA_DEVICE_MAX_CONNECTIONS unset (CUDA default 8; enable_ep_overlap puts 32 in cfg.env_vars)")
    gap = dataset_helpers_gap()
    lines.append(f"dataset helpers   : {'OK' if gap is None else 'PROBLEM: ' + gap}")
    lines.append("dispatchers for EP overlap on this machine:")
    smoked = _cached_smoke(env)
    for name in NAMED_DISPATCHERS:
        why = ["no CUDA GPU visible"] if not env.has_gpu else dispatcher.problems(name, env)
        usable = f"deep_ep {env.deep_ep_version} on {env.gpu_name}" if name in DEEP_EP_BACKENDS else "every GPU"
        smoke = smoked.get(name) if smoked else None
        if smoke is not None and not smoke.usable:
            why = [*why, f"smoke check: {smoke.text} on this node" + (f" ({smoke.cause})" if smoke.cause else "")
                   + " (cached; rerun: mbridge-ep-overlap doctor --smoke)"]
        elif smoke is not None:
            usable += " (smoke check passed)"
        lines.append(f"  {name:9s} " + (f"NOT usable: {'; '.join(why)}" if why else f"usable: {usable}"))
    ep = max(env.gpus_per_node or 1, 2)
    auto = dispatcher.decide("auto", _Model(ep), env, "error", keep_current=False)
    lines.append(f"  auto      -> {auto.dispatcher} at EP={ep} ({auto.reason})")
    return [*lines, "```"]


def _cached_smoke(env) -> dict | None:
    """This node's cached smoke-check verdicts (``lab.smoke``), None without a GPU or a check."""
    if not env.has_gpu:
        return None
    from ..lab import smoke

    try:
        return smoke.cached_results(env)
    except Exception:  # noqa: BLE001 - a damaged cache never breaks doctor
        return None


def smoke_lines() -> tuple[list[str], int]:
    """Run the smoke check here: its verdict lines and the exit code (``smoke.exit_code``: 0 every
    installed backend usable, 1 one failed, 2 nothing could run). A machine where it cannot run at
    all is bad usage (``UsageError``, one line) - checked before anything else is printed."""
    from ..lab import smoke
    from ..runtime.exits import release_stderr

    _check_smoke_can_run()
    release_stderr()  # the check takes minutes: its output streams
    results = smoke.run()
    return smoke.report_lines(results) + [f"  (verdicts cached in {smoke.cache_path()})"], smoke.exit_code(results)


def _check_smoke_can_run() -> None:
    from ..lab import smoke

    reason = smoke.cannot_run_reason()
    if reason is not None:
        raise UsageError("on this machine", reason, "a node with 2 CUDA GPUs (doctor without --smoke works anywhere)",
                         "dispatcher smoke check cannot run")


class _Model:
    """The one model fact ``decide`` reads for ``auto``."""

    def __init__(self, ep: int) -> None:
        self.expert_model_parallel_size = ep


def main(args) -> int:
    if getattr(args, "smoke", False):
        _check_smoke_can_run()
    print("\n".join(doctor_lines()), flush=True)
    if getattr(args, "smoke", False):
        lines, code = smoke_lines()
        if code == 2:  # every backend could not even start here (smoke.exit_code)
            raise UsageError("on this machine", " / ".join(lines)[:300], "a node where the smoke workers can start",
                             "dispatcher smoke check cannot run")
        print("\n".join(lines), flush=True)
        return code
    return 0
