"""One row, one test: each rule is shown against the real Megatron-Core / Megatron-Bridge finalize.

For every rule a config is built that violates only that rule (on top of a base that violates
none). ``check_ep_overlap`` must report exactly that rule, and MB's real ``runtime_config_update``
(run with only the hardware, world size and - where a rule is about versions - the version probes
faked) must reject the config with upstream's own message when the rule mirrors an upstream
check, or accept it when the rule is one of ours (the silent failures upstream does not catch).
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import pytest
from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.gpt_step import forward_step as mb_forward_step
from packaging.version import Version

from mbridge_ep_overlap import check_ep_overlap
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.simulate import simulate
from mbridge_ep_overlap.core.errors import Severity
from mbridge_ep_overlap.core.rules import RULES, RULES_BY_ID, Upstream

BASE_WORLD = 16


def base_config(cfg):
    """Proxy at EP16 on 16 H100s, overlap on the way MB users set it, zero violations."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    cfg.model.expert_model_parallel_size = 16
    cfg.train.global_batch_size = 2 * BASE_WORLD * 2  # MBS 2, DP 16 -> 2 microbatches
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False, overlap_moe_expert_parallel_comm=True)
    return cfg


def two_arg_forward_step(data_iterator, model):
    raise NotImplementedError


@dataclass
class Case:
    rule: str
    mutate: Callable
    env: dict = field(default_factory=dict)  # ClusterEnvironment overrides
    te: str | None = None  # fake TE version seen by MB/MCore's is_te_min_version
    torch_ok: bool = True
    also: tuple[str, ...] = ()  # rules that cannot be violated apart from this one
    forward_step: Callable | None = None


def section(name: str | None):
    """A mutator factory that sets fields on one config section (``None``: the container itself)."""

    def factory(**fields):
        def mutate(cfg):
            target = cfg if name is None else getattr(cfg, name)
            for k, v in fields.items():
                setattr(target, k, v)

        return mutate

    return factory


m, co, ddp, set_cfg = section("model"), section("comm_overlap"), section("ddp"), section(None)
dataset, dist, train = section("dataset"), section("dist"), section("train")


def chain(*fns):
    def mutate(cfg):
        for fn in fns:
            fn(cfg)

    return mutate


def graphs(*modules):
    return m(cuda_graph_impl="transformer_engine", cuda_graph_scope=list(modules))


def flex(backend):
    return m(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend)


def reverted_model_flag(cfg):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    cfg.model.overlap_moe_expert_parallel_comm = True


def stale_snapshot(cfg):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    cfg.comm_overlap.finalize()  # what a first runtime_config_update does
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True  # ignored by MB from now on


class WrapperProvider(GPTModelProvider):
    """A provider whose model is a wrapper (as MB's VLM providers are): no build_schedule_plan."""

    def provide(self, pre_process=None, post_process=None, vp_stage=None):
        raise NotImplementedError


def provider(cls):
    def mutate(cfg):
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        cfg.model = cls(**{f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)
                           if f.init and f.name in names})

    return mutate


def gemma4(cfg):
    from megatron.bridge.models.gemma.gemma4_provider import Gemma4ModelProvider

    provider(Gemma4ModelProvider)(cfg)


def packed_sequences(cfg):
    cfg.dataset.enable_in_batch_packing = True  # what MB's in-batch packing dataset configs set


DELAY = chain(co(delay_wgrad_compute=True), m(transformer_impl="transformer_engine"), ddp(overlap_grad_reduce=False))
TE_KNOWN = {"te_version": "2.12.0"}
NCCL_EP = {"te_version": "2.18.0", "te_nccl_ep": True}

CASES = [
    Case("ep-size", m(expert_model_parallel_size=1)),
    Case("num-experts", m(num_moe_experts=1), also=("experts-divisible-by-ep", "router-topk")),
    Case("dispatcher-type", m(moe_token_dispatcher_type="allgather")),
    Case("precision", chain(set_cfg(mixed_precision=None), m(bf16=False, fp16=False))),
    Case("torch-version", lambda cfg: None, env={"torch_version": "2.5.1"}, torch_ok=False),
    Case("pp-needs-vpp", m(pipeline_model_parallel_size=2, expert_model_parallel_size=8)),
    Case("full-recompute", m(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
         also=("recompute-method", "recompute-num-layers")),
    Case("recompute-method", m(recompute_granularity="selective", recompute_method="uniform")),
    Case("recompute-num-layers", m(recompute_granularity="selective", recompute_num_layers=1)),
    Case("moe-recompute", m(recompute_granularity="selective", recompute_modules=["moe"])),
    Case("shared-expert-overlap", m(moe_shared_expert_intermediate_size=512, moe_shared_expert_overlap=True)),
    Case("mtp-layers", m(mtp_num_layers=2)),
    Case("cuda-graph-moe-scope", graphs("moe"), env=TE_KNOWN, te="2.12.0"),
    Case("dispatch-backward-wgrad-exclusive", m(overlap_dispatch_backward_with_experts_wgrad=True), te="2.12.0"),
    Case("delay-wgrad-needs-overlap", chain(DELAY, co(overlap_moe_expert_parallel_comm=False)), env=TE_KNOWN, te="2.12.0"),
    Case("delay-wgrad-needs-te", chain(DELAY, m(transformer_impl="local")), env=TE_KNOWN, te="2.12.0"),
    Case("delay-wgrad-te-grad-reduce", chain(DELAY, ddp(overlap_grad_reduce=True)), env={"te_version": "2.6.0"}, te="2.6.0"),
    Case("delay-wgrad-te-grad-accum-fusion", chain(DELAY, m(gradient_accumulation_fusion=True)),
         env={"te_version": "2.6.0"}, te="2.6.0"),
    Case("delay-wgrad-te-partial-graph", chain(DELAY, graphs("moe_router")), env={"te_version": "2.9.0"}, te="2.9.0"),
    Case("delay-wgrad-graph-te", chain(DELAY, graphs("attn"), m(gradient_accumulation_fusion=True)),
         env={"te_version": "2.11.0"}, te="2.11.0"),
    Case("delay-wgrad-graph-grad-accum-fusion", chain(DELAY, graphs("attn")), env=TE_KNOWN, te="2.12.0"),
    Case("delay-wgrad-graph-attn-bias", chain(DELAY, graphs("attn"), m(gradient_accumulation_fusion=True, add_bias_linear=True)),
         env=TE_KNOWN, te="2.12.0"),
    Case("flex-backend-set", flex(None)),
    Case("flex-backend-gpu", flex("deepep"), env={"gpu": "gb200"}),
    Case("flex-backend-importable", flex("deepep"), env={"deep_ep_version": ""}),
    Case("deepep-built-with-nvshmem", flex("deepep"), env={"deep_ep_version": "1.2.1", "deep_ep_nvshmem": False}),
    # On the GPU node (a probed environment) with CUDA_HOME pointing at no toolkit.
    Case("hybridep-jit-nvcc", flex("hybridep"), env={"source": "probed", "env_vars": {"CUDA_HOME": "/no/cuda"}}),
    Case("hybridep-nvlink-domain", chain(flex("hybridep"), set_cfg(env_vars={"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "4"}))),
    Case("model-flag-reverted", reverted_model_flag),
    Case("comm-overlap-snapshot-stale", stale_snapshot),
    Case("microbatches", lambda cfg: setattr(cfg.train, "global_batch_size", 2 * BASE_WORLD)),
    Case("forward-step-signature", lambda cfg: None, forward_step=two_arg_forward_step),
    Case("cuda-device-max-connections", set_cfg(env_vars={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})),
    Case("tested-versions", lambda cfg: None, env={"mcore_version": "0.18.0"}),
    Case("early-attn-release-needs-overlap",
         chain(m(ep_overlap_early_attn_memory_release=True), co(overlap_moe_expert_parallel_comm=False))),
    Case("ncclep-expert-fc1-offload",
         chain(flex("ncclep"), m(moe_ncclep_static_shape=True, moe_expert_rank_capacity_factor=1.5,
                                 use_transformer_engine_op_fuser=True, moe_grouped_gemm=True,
                                 fine_grained_activation_offloading=True, offload_modules=["expert_fc1"])), env=NCCL_EP),
    Case("ncclep-static-shape", chain(flex("ncclep"), m(moe_expert_rank_capacity_factor=1.5)), env=NCCL_EP),
    Case("dispatcher-healthy", flex("deepep"), env={"dispatcher_health": {"deepep": "crashed (SIGSEGV) in Buffer init"}}),
    Case("ncclep-capacity-factor", flex("ncclep"), env=NCCL_EP, also=("ncclep-static-shape",)),
    Case("ncclep-static-shape-fused-gemm",
         chain(flex("ncclep"), m(moe_ncclep_static_shape=True, moe_expert_rank_capacity_factor=1.5)), env=NCCL_EP),
    # config values: types and ranges
    Case("parallel-sizes", m(tensor_model_parallel_size=0)),
    Case("batch-sizes", train(micro_batch_size=0)),
    Case("model-shape", m(num_layers=0)),
    Case("moe-experts-value", m(num_moe_experts="abc")),
    Case("experts-divisible-by-ep", m(num_moe_experts=24)),
    Case("router-topk", m(moe_router_topk=17)),
    Case("recompute-modules-type", m(recompute_granularity="selective", recompute_modules=5)),
    Case("mixed-precision-known", set_cfg(mixed_precision="nonsense")),
    Case("env-vars-type", set_cfg(env_vars=["CUDA_DEVICE_MAX_CONNECTIONS=32"])),
    # what silently disables or corrupts the overlapped schedule (MCore 0.19.2 / MB 0.6.2 code paths)
    Case("model-has-schedule-plan", provider(WrapperProvider)),
    Case("moe-layer-code-bypassed", gemma4),
    Case("last-layer-dense", m(moe_layer_freq=2)),
    Case("packed-sequences-forward-step", packed_sequences, forward_step=mb_forward_step),
    Case("packed-sequences-mtp", chain(packed_sequences, m(mtp_num_layers=1))),
    Case("inter-document-masking", dataset(inter_document_masking=True)),
    Case("hybrid-context-parallel", m(hybrid_context_parallel=True)),
    Case("decentralized-process-groups", dist(use_decentralized_pg=True, use_gloo_process_groups=False)),
    Case("cpu-offloading", m(cpu_offloading=True)),
    Case("te-features-need-te", m(moe_permute_fusion=True)),
    Case("grad-accum-fusion-needs-apex", m(gradient_accumulation_fusion=True), env={"apex_fused_wgrad": False}),
    Case("te-cudnn-matches-torch", m(transformer_impl="transformer_engine"),
         env={"te_version": "2.18.0", "torch_cudnn_version": "9.19.0", "te_cudnn_version": "9.14.0",
              "te_cudnn_library": "/usr/local/cuda/lib64/libcudnn.so.9.14.0"}),
    Case("world-size-divisible", m(tensor_model_parallel_size=3, expert_model_parallel_size=8), env={"num_gpus": 16}),
    Case("expert-world-divisible", chain(m(expert_model_parallel_size=16), lambda cfg: setattr(cfg.train, "global_batch_size", 96)),
         env={"num_gpus": 24}),
    Case("global-batch-divisible", lambda cfg: setattr(cfg.train, "global_batch_size", 2 * BASE_WORLD * 2 + 2)),
    Case("predicted-gain-alltoall", m(expert_model_parallel_size=4), env={"num_gpus": 4}),
    Case("predicted-gain-deepep", chain(flex("deepep"), m(expert_model_parallel_size=8)), env={"num_gpus": 8}),
]


def environment(case: Case):
    opts = dict(case.env)
    gpu = opts.pop("gpu", "h100")
    num_gpus = opts.pop("num_gpus", BASE_WORLD)
    env = describe(gpu, num_gpus, te_version="", deep_ep_version=None)
    return dataclasses.replace(env, **opts)


def violated(cfg, env, forward_step=None, include_advice=False):
    return {
        v.rule_id
        for v in check_ep_overlap(cfg, environment=env, forward_step_func=forward_step)
        if include_advice or v.severity is not Severity.ADVICE
    }


def upstream_finalize(cfg, env, case: Case):
    """MB's real finalize; fakes only hardware/world size and, where named, the version probes."""
    from megatron.bridge.training.config import runtime_config_update

    with ExitStack() as stack:
        stack.enter_context(simulate(env))
        if case.te is not None:
            te_ok = lambda v, te=case.te: Version(te) >= Version(v)  # noqa: E731
            stack.enter_context(mock.patch("megatron.bridge.training.comm_overlap.is_te_min_version", te_ok))
            stack.enter_context(mock.patch("megatron.core.transformer.transformer_config.is_te_min_version", te_ok))
        if not case.torch_ok:
            stack.enter_context(mock.patch("megatron.bridge.training.comm_overlap.is_torch_min_version", lambda v: False))
            stack.enter_context(
                mock.patch("megatron.core.transformer.transformer_config.is_torch_min_version", lambda v: False)
            )
        runtime_config_update(cfg)


def test_every_rule_has_a_case():
    assert sorted(c.rule for c in CASES) == sorted(r.id for r in RULES)


def test_base_config_violates_nothing_and_finalizes_with_overlap_on(proxy_cfg):
    cfg = base_config(proxy_cfg)
    env = describe("h100", BASE_WORLD, te_version="", deep_ep_version=None)
    assert violated(cfg, env, include_advice=True) == set()
    upstream_finalize(cfg, env, Case("base", lambda c: None))
    assert cfg.model.overlap_moe_expert_parallel_comm is True


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rule_matches_upstream(case: Case, proxy_cfg):
    rule = RULES_BY_ID[case.rule]
    cfg = base_config(proxy_cfg)
    case.mutate(cfg)
    env = environment(case)

    found = violated(cfg, env, case.forward_step, include_advice=rule.severity is Severity.ADVICE)
    assert found == {case.rule, *case.also}, f"expected only {case.rule}, got {found}"

    if rule.upstream is Upstream.NONE:
        upstream_finalize(cfg, env, case)  # upstream accepts it: that is the gap this rule closes
        if case.rule in ("model-flag-reverted", "comm-overlap-snapshot-stale"):
            assert cfg.model.overlap_moe_expert_parallel_comm is False, "upstream silently turned overlap off"
    else:
        with pytest.raises((AssertionError, ValueError, TypeError, ZeroDivisionError, AttributeError)) as excinfo:
            upstream_finalize(cfg, env, case)
        assert re.search(rule.upstream_match, str(excinfo.value)), (
            f"{case.rule}: upstream rejected it for another reason: {excinfo.value!r}"
        )


def test_each_rule_carries_its_text_check_and_upstream_side_by_side():
    """A rule is one object: text, check and the upstream check it mirrors (matched by the cases above)."""
    for rule in RULES:
        assert rule.message and rule.fix and rule.required and rule.field and callable(rule.check), rule.id
        assert bool(rule.upstream_match) == (rule.upstream is not Upstream.NONE), rule.id
    assert len({r.id for r in RULES}) == len(RULES)
