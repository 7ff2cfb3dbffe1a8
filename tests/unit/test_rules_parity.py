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
from mbridge_ep_overlap.base.errors import Severity
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


def recipe_asked_for_deepep_on_gb200(cfg):
    """What a recipe calling MB's apply_flex_dispatcher_backend itself does, built for GB200 (as every
    recipe is built: inside the target's simulation, recorded): MB falls back to alltoall."""
    from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend

    from mbridge_ep_overlap.core.dispatcher import recording_recipe_requests

    with simulate(describe("gb200", BASE_WORLD)), recording_recipe_requests():
        apply_flex_dispatcher_backend(cfg.model, "deepep")


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
    Case("recipe-flex-fallback", recipe_asked_for_deepep_on_gb200, env={"gpu": "gb200"}),
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
    Case("stack-versions-known", lambda cfg: None, env={"te_version": "99.0"}),
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
    Case("env-var-values", set_cfg(env_vars={"NCCL_DEBUG": None})),
    Case("cuda-device-max-connections-value", set_cfg(env_vars={"CUDA_DEVICE_MAX_CONNECTIONS": "abc"})),
    # MB's finalize accepts each of these; the comment names where upstream fails (or silently changes it) later
    Case("sizes-fit-int64", train(global_batch_size=2 * 10**400)),  # MB data/loaders.py:127 -> numpy index
    Case("tokens-per-step-fit-int64",  # 2**64 tokens per step; MCore datasets/gpt_dataset.py:690 counts them
         chain(train(global_batch_size=2**32), m(seq_length=2**32), dataset(seq_length=2**32))),
    Case("moe-ffn-hidden-size", m(moe_ffn_hidden_size=-1)),  # MCore moe/experts.py:212 at model construction
    Case("num-query-groups", m(num_query_groups=0)),  # MCore attention.py:358 divides the heads by 0
    Case("kv-channels", m(kv_channels=0)),  # MCore dot_product_attention.py:85 divides by sqrt(0)
    Case("vocab-size", m(vocab_size=-5)),  # MB training/setup.py:707 once the tokenizer is built
    Case("moe-capacity-factor", m(moe_expert_capacity_factor=0)),  # MCore keeps 0: every token dropped, asserted
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
    Case("fp8-needs-compute-capability-8-9", set_cfg(mixed_precision="bf16_with_fp8_delayed_scaling_mixed"),
         env={"gpu": "a100"}, te="2.18.0"),
    Case("block-scaled-recipe-on-gpu", set_cfg(mixed_precision="bf16_with_mxfp8_mixed"), te="2.18.0"),  # MXFP8 on H100
    Case("world-size-divisible", m(tensor_model_parallel_size=3, expert_model_parallel_size=8), env={"num_gpus": 16}),
    Case("expert-world-divisible", chain(m(expert_model_parallel_size=16), lambda cfg: setattr(cfg.train, "global_batch_size", 96)),
         env={"num_gpus": 24}),
    Case("global-batch-divisible", lambda cfg: setattr(cfg.train, "global_batch_size", 2 * BASE_WORLD * 2 + 2)),
    # MB and MCore accept both; the job fails with CUDA out of memory (10**10 experts: it cannot even
    # allocate its parameters; 10240 experts: ~76 GiB predicted of an H100's 80)
    Case("fits-in-gpu-memory", m(num_moe_experts=10**10)),
    Case("gpu-memory-headroom", m(num_moe_experts=10240), also=("predicted-gain-alltoall",)),  # 640 experts a GPU: little to gain
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
        if case.rule == "moe-capacity-factor":
            assert cfg.model.moe_expert_capacity_factor == 0, "upstream kept a capacity of 0 tokens per expert"
        if case.rule == "recipe-flex-fallback":
            assert cfg.model.moe_token_dispatcher_type == "alltoall", "upstream runs alltoall, not the recipe's deepep"
    else:
        with pytest.raises((AssertionError, ValueError, TypeError, ZeroDivisionError, AttributeError)) as excinfo:
            upstream_finalize(cfg, env, case)
        assert re.search(rule.upstream_match, str(excinfo.value)), (
            f"{case.rule}: upstream rejected it for another reason: {excinfo.value!r}"
        )


# config values: one row per value: the value rules that refuse it (empty: accepted) and whether the
# step-time prediction the advice rules read can still be made ("made": it does not read the value,
# or reads it as a summary would hold it - 1024.0, "32768"). Covers what the parity cases above do
# not: non-integral and non-finite floats where an int is required, the int64 bound on every size,
# and None where upstream derives the value.
BIG = 2 * 10**400
VALUE_ROWS = [
    (train(global_batch_size=BIG), {"sizes-fit-int64"}, "not made"),
    (train(global_batch_size=2**63), {"sizes-fit-int64"}, "not made"),
    (train(global_batch_size=2**63 - 32), {"tokens-per-step-fit-int64"}, "not made"),  # x 1024 tokens each
    (train(micro_batch_size=2**64, global_batch_size=2**69), {"sizes-fit-int64"}, "not made"),
    (chain(m(seq_length=10**400), dataset(seq_length=10**400)), {"sizes-fit-int64"}, "not made"),
    (chain(m(seq_length=float("inf")), dataset(seq_length=float("inf"))), {"model-shape"}, "not made"),
    (chain(m(seq_length=float("nan")), dataset(seq_length=float("nan"))), {"model-shape"}, "not made"),
    (chain(m(seq_length=1024.5), dataset(seq_length=1024.5)), {"model-shape"}, "not made"),
    (chain(m(seq_length=1024.0), dataset(seq_length=1024.0)), {"model-shape"}, "made"),  # an int is required
    (train(global_batch_size=64.5), {"batch-sizes"}, "not made"),
    (m(hidden_size=10**5000), {"sizes-fit-int64"}, "not made"),  # too long even to print: shown by its bit length
    (m(num_moe_experts=2**64), {"sizes-fit-int64"}, "not made"),
    (m(tensor_model_parallel_size=-(2**64)), {"sizes-fit-int64", "parallel-sizes"}, "not made"),
    (m(moe_ffn_hidden_size="abc"), {"moe-ffn-hidden-size"}, "not made"),
    (m(moe_ffn_hidden_size=0), {"moe-ffn-hidden-size"}, "not made"),
    (m(moe_ffn_hidden_size=512.0), {"moe-ffn-hidden-size"}, "made"),
    (m(moe_ffn_hidden_size=None), set(), "not made"),  # MCore uses ffn_hidden_size (at finalize: none yet here)
    (m(moe_ffn_hidden_size=2**63), {"sizes-fit-int64"}, "not made"),
    (m(num_query_groups=-1), {"num-query-groups"}, "not made"),
    (m(num_query_groups=True), {"num-query-groups"}, "not made"),
    (m(num_query_groups=None), set(), "made"),  # multi-head attention
    (m(kv_channels=-1), {"kv-channels"}, "not made"),
    (m(kv_channels=float("inf")), {"kv-channels"}, "not made"),
    (m(kv_channels=None), set(), "made"),  # hidden_size // num_attention_heads
    (m(vocab_size=0), {"vocab-size"}, "not made"),
    (m(vocab_size="32768"), {"vocab-size"}, "made"),
    (m(vocab_size=None), set(), "made"),  # the tokenizer's (the model assumes a default and says so)
    (m(moe_expert_capacity_factor=0), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=float("nan")), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=float("inf")), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=10**400), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=1e308), {"moe-capacity-factor"}, "made"),  # math.ceil(256 x 1e308) overflows
    (m(moe_expert_capacity_factor="1.0"), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=1.5), set(), "made"),
    (m(moe_expert_capacity_factor=-1.0), set(), "made"),  # upstream's spelling of dropless (MCore: None)
    (m(moe_expert_capacity_factor=-float("inf")), {"moe-capacity-factor"}, "made"),
    (m(moe_expert_capacity_factor=None), set(), "made"),  # dropless
]


@pytest.mark.parametrize("mutate,expected,prediction", VALUE_ROWS, ids=[str(i) for i in range(len(VALUE_ROWS))])
def test_value_rules_table(proxy_cfg, mutate, expected, prediction):
    """Each row's value is refused by exactly the expected rules - never an exception, every message
    printable - and where the step-time prediction cannot be made the advice rules are "not checked"
    (not unreadable, not fired)."""
    from mbridge_ep_overlap.core.engine import evaluate

    cfg = base_config(proxy_cfg)
    mutate(cfg)
    env = environment(Case("values", mutate))
    report = evaluate(cfg, env)
    assert {v.rule_id for v in report.errors} == expected
    assert all(v.line() for v in report.violations)  # a 10**5000 included
    assert "predicted-gain-alltoall" not in report.unreadable
    made = "predicted-gain-alltoall" not in report.not_checked
    assert made == (prediction == "made")
    if not made:
        assert not [v for v in report.violations if v.severity is Severity.ADVICE]


@pytest.mark.parametrize("mutate,rule", [
    (train(global_batch_size=BIG), "sizes-fit-int64"),
    (chain(m(seq_length=10**400), dataset(seq_length=10**400)), "sizes-fit-int64"),
    (chain(m(seq_length=float("inf")), dataset(seq_length=float("inf"))), "model-shape"),
    (m(moe_ffn_hidden_size=-1), "moe-ffn-hidden-size"),
    (m(moe_expert_capacity_factor=0), "moe-capacity-factor"),
], ids=["gbs-2e400", "seq-1e400", "seq-inf", "moe-ffn-minus-1", "capacity-0"])
def test_enable_refuses_out_of_range_values_with_a_typed_error(proxy_cfg, mutate, rule):
    """The API: EPOverlapError listing the value rule (not an OverflowError), the config unchanged."""
    from mbridge_ep_overlap import EPOverlapError, enable_ep_overlap

    import copy

    mutate(proxy_cfg)
    proxy_cfg.model.expert_model_parallel_size = 16
    before = copy.deepcopy(proxy_cfg.__dict__)
    env = describe("h100", BASE_WORLD, te_version="", deep_ep_version=None)
    with pytest.raises(EPOverlapError) as excinfo:
        enable_ep_overlap(proxy_cfg, environment=env)
    assert rule in {v.rule_id for v in excinfo.value.violations}
    assert proxy_cfg.__dict__ == before


def test_each_rule_carries_its_text_check_and_upstream_side_by_side():
    """A rule is one object: text, check and the upstream check it mirrors (matched by the cases above)."""
    for rule in RULES:
        assert rule.message and rule.fix and rule.required and rule.field and callable(rule.check), rule.id
        assert bool(rule.upstream_match) == (rule.upstream is not Upstream.NONE), rule.id
    assert len({r.id for r in RULES}) == len(RULES)
