"""EP overlap through Megatron-Bridge's training loop on real GPUs, on both layer stacks.

Each variant launches ``scripts/run_script.py`` with torchrun (``conftest.Suite``: in the background,
a few at a time, hard timeouts) on the proxy recipe - ``local`` layers (``qwen3_moe_proxy``) or
Transformer Engine layers (``qwen3_moe_proxy_te``), same shape, data and seed - for a handful of
iterations. We then check, as a user would, the finalized config the run recorded, the layer stack
the model was really built from, that MCore's combined-1F1B schedule really executed (counted),
which flex buffer moved the tokens, and that per-iteration losses match overlap off of the same
stack. Flex variants run only when the dispatcher smoke check says the backend is usable on this
node; ``test_dispatcher_health`` reports a crash, hang or wrong result as a failure with its stage
and stack. GPU count: ``EP_OVERLAP_TEST_GPUS`` (default 2; must divide the proxy's 16 experts).
Timings are printed (terminal summary), never asserted.
"""

from __future__ import annotations

import re

import pytest
from functional_suite import MICROBATCHES, NPROC, SHARED, SHARED_SKIP, STEPS

from mbridge_ep_overlap.lab.numerics import BF16_RTOL, compare_losses, losses_from_summary

pytestmark = pytest.mark.gpu

NO_OVERLAP_PATH = "combined_1f1b_schedule_for_no_pipelining"
STACK_IDS = ["local", "te"]
VARIANTS = [pytest.param(stack, dispatcher, id=f"{stack}-{dispatcher}")
            for stack in STACK_IDS for dispatcher in ("alltoall", "deepep", "hybridep")]


def report_parity(name, reference, candidate):
    ref, _ = losses_from_summary(reference.summary)
    cand, skipped = losses_from_summary(candidate.summary)
    result = compare_losses(ref, cand, skipped=skipped)
    print(f"\n{name}: max rel diff {result.max_rel_diff:.2e} (tolerance {BF16_RTOL:.2e})")
    print(result.table(ref, cand))
    return result


def assert_layer_stack(run, stack):
    """The model really was built from the stack's layers (module classes, not only the flag)."""
    ls = run.summary["layer_stack"]
    te_classes = ls["te_module_classes"]
    print(f"\n{run.name}: transformer_impl={ls['transformer_impl']}, TE {ls['te_version']} "
          f"(Megatron-Core sees {ls['mcore_te_version']}), classes {ls['module_classes']}, TE's {te_classes}")
    if stack == "te":
        assert ls["transformer_impl"] == "transformer_engine"
        assert any("Linear" in c for c in te_classes), f"no Transformer Engine linear layer: {ls['module_classes']}"
        assert any("GroupedLinear" in c for c in te_classes), f"experts are not TE grouped GEMM: {te_classes}"
        assert any("Attention" in c for c in te_classes), f"attention is not TE's: {te_classes}"
        for fusion in ("apply_rope_fusion", "moe_permute_fusion", "cross_entropy_loss_fusion"):
            assert ls[fusion] is True, f"{fusion} is {ls[fusion]} on the te stack"
        # the TE proxy keeps gradient-accumulation fusion off: it needs APEX's fused wgrad kernel
        # (rule grad-accum-fusion-needs-apex), which the GPU node lacks (recipes/proxy.py)
        assert ls["gradient_accumulation_fusion"] is False
    else:
        assert ls["transformer_impl"] == "local"
        # MCore builds the final norm with TE whenever TE imports; linear, attention and experts stay local
        not_norm = [c for c in te_classes if "Norm" not in c]
        assert not not_norm, f"Transformer Engine layers in a local-stack model: {not_norm}"


def assert_overlapped(run):
    s = run.summary
    # One combined-1F1B schedule per training step, and one schedule-plan build per microbatch.
    assert s["combined_schedule_calls"][NO_OVERLAP_PATH] == STEPS, s["combined_schedule_calls"]
    assert s["schedule_plan_calls"] == STEPS * MICROBATCHES


@pytest.mark.runs("smoke")
@pytest.mark.parametrize("backend", ["alltoall", "deepep", "hybridep"])
def test_dispatcher_health(suite, backend):
    """The smoke check's verdict: skip when the backend is not installed; fail (with the stage and
    every crashed rank's Python stack) when it crashed, hung or gave a wrong result."""
    if SHARED:
        pytest.skip(SHARED_SKIP)
    verdicts = suite.smoke()
    verdict = verdicts.get(backend)
    if verdict is None:
        pytest.skip(f"{backend}: not checked")
    print(f"\nsmoke check ({suite.smoke_source}):\n{verdict.report()}")
    if verdict.status in ("missing", "cannot_run"):
        pytest.skip(verdict.line())
    extra = verdicts.get("hybridep:USE_MNNVL=0") if backend == "hybridep" else None
    assert verdict.usable, verdict.report() + (f"\n{extra.report()}" if extra is not None else "")


@pytest.mark.runs("{stack}-off")
@pytest.mark.parametrize("stack", STACK_IDS)
def test_baseline_really_had_overlap_off(suite, stack):
    run = suite.result(f"{stack}-off")
    s = run.summary
    fin = s["finalized"]
    assert fin["overlap_moe_expert_parallel_comm"] is False
    assert fin["moe_token_dispatcher_type"] == "alltoall"
    assert s["schedule_plan_calls"] == 0
    assert not any(s["flex_buffers"].values())
    assert s["combined_schedule_calls"].get(NO_OVERLAP_PATH, 0) == 0
    assert s["wgrad"]["node_backward_dw_calls"] == 0
    assert_layer_stack(run, stack)


@pytest.mark.runs("{stack}-off", "{stack}-{dispatcher}")
@pytest.mark.parametrize("stack,dispatcher", VARIANTS)
def test_overlap_variant(suite, stack, dispatcher):
    """Finalized config, layer stack, combined-1F1B executed, the dispatcher's own buffer, loss parity."""
    run = suite.result(f"{stack}-{dispatcher}")
    baseline = suite.result(f"{stack}-off")
    s = run.summary
    fin = s["finalized"]
    assert fin["overlap_moe_expert_parallel_comm"] is True
    assert fin["delay_wgrad_compute"] is False
    assert fin["expert_model_parallel_size"] == NPROC
    assert fin["num_microbatches"] == MICROBATCHES
    if dispatcher == "alltoall":
        assert fin["moe_token_dispatcher_type"] == "alltoall"
    else:
        assert fin["moe_token_dispatcher_type"] == "flex" and fin["moe_flex_dispatcher_backend"] == dispatcher
    assert s["flex_buffers"] == {"deepep": dispatcher == "deepep", "hybridep": dispatcher == "hybridep"}
    if dispatcher == "hybridep":
        print(f"\n{run.name}: USE_MNNVL={s['environment'].get('USE_MNNVL', 'unset')} in the training processes")
    assert_overlapped(run)
    assert_layer_stack(run, stack)
    assert s["wgrad"]["node_backward_dw_delayed"] == 0  # delayed wgrad off: nothing deferred
    assert s["wgrad"]["te_wgrad_deferred"] in (0, None)
    result = report_parity(f"{stack}: {dispatcher} overlap vs off", baseline, run)
    assert len(result.iterations) == STEPS
    assert result.ok, result.problems


@pytest.mark.runs("te-off", "te-delay_wgrad")
@pytest.mark.parametrize("stack", ["te"])
def test_delay_wgrad_variant(suite, stack):
    """Delayed wgrad on TE layers: on in the finalized config, the deferred weight-gradient GEMMs
    really queued and executed by backward_dw (counted), the gradients written there, losses as off."""
    run = suite.result("te-delay_wgrad")
    baseline = suite.result("te-off")
    s = run.summary
    assert s["finalized"]["delay_wgrad_compute"] is True
    assert s["finalized"]["overlap_moe_expert_parallel_comm"] is True
    assert_overlapped(run)
    assert_layer_stack(run, stack)
    w = s["wgrad"]
    print(f"\ndelayed wgrad evidence: {w}")
    assert w["node_backward_dw_delayed"] > 0, w
    assert w["te_wgrad_deferred"] > 0 and w["te_wgrad_executed"] == w["te_wgrad_deferred"], w
    assert w["probe"]["changed"] > 0, f"no weight gradient changed inside backward_dw: {w}"
    result = report_parity("te: delayed wgrad vs off", baseline, run)
    assert len(result.iterations) == STEPS
    assert result.ok, result.problems


@pytest.mark.runs("local-refused_full_recompute")
def test_refused_config_fails_fast_on_every_rank(suite):
    run = suite.result("local-refused_full_recompute", ok=False)
    assert not run.timed_out, run.describe_failure()
    assert run.returncode != 0
    logs = run.rank_logs()
    rank_outputs = [text for name, text in logs.items() if name.endswith(("stderr.log", "stdout.log"))]
    refused = {name.rsplit("/", 2)[-2] for name, text in logs.items()
               if name.endswith(("stderr.log", "stdout.log")) and "EP overlap refused" in text and "full-recompute" in text}
    assert refused, run.tail()
    # torchrun ends the other ranks once one has failed: a rank still importing Megatron when the first
    # refused is terminated (SIGTERM, exit code -15) before it prints; every rank refused or was ended so
    terminated = set(re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*-15", (run.folder / "launcher.log").read_text()))
    assert refused | terminated >= {str(r) for r in range(NPROC)}, (refused, terminated, run.tail())
    assert not any("AssertionError" in t for t in rank_outputs), run.tail()
