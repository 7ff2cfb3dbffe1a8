"""enable_ep_overlap on real ConfigContainers: where flags land, atomicity, resolve modes, plan."""

from __future__ import annotations

import copy
import json

import pytest

from mbridge_ep_overlap import EPOverlapError, UsageError, enable_ep_overlap
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.simulate import simulate
from mbridge_ep_overlap.core.enforcement import is_installed


def finalize(cfg, env):
    from megatron.bridge.training.config import runtime_config_update

    with simulate(env):
        runtime_config_update(cfg)
    return cfg


def snapshot(cfg):
    """A deep, comparable picture of the whole config (callables by identity)."""
    return copy.deepcopy(cfg.__dict__)


def test_creates_comm_overlap_and_survives_setup(proxy_cfg, h100x2):
    assert proxy_cfg.comm_overlap is None
    plan = enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert proxy_cfg.comm_overlap.tp_comm_overlap is False
    assert proxy_cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert proxy_cfg.comm_overlap.delay_wgrad_compute is False
    assert plan.change("comm_overlap").old is None
    finalize(proxy_cfg, h100x2)
    assert proxy_cfg.model.overlap_moe_expert_parallel_comm is True
    assert proxy_cfg.model.delay_wgrad_compute is False


def test_updates_the_snapshot_of_an_already_finalized_config(proxy_cfg, h100x2):
    finalize(proxy_cfg, h100x2)  # no comm_overlap yet: overlap off
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    proxy_cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    proxy_cfg.comm_overlap.finalize()
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert proxy_cfg.comm_overlap.user_comm_overlap_cfg.overlap_moe_expert_parallel_comm is True
    finalize(proxy_cfg, h100x2)
    assert proxy_cfg.model.overlap_moe_expert_parallel_comm is True


def test_turns_shared_expert_overlap_off_and_keeps_delay_wgrad_opt_in(proxy_cfg, h100x2):
    proxy_cfg.model.moe_shared_expert_intermediate_size = 512
    proxy_cfg.model.moe_shared_expert_overlap = True
    plan = enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert proxy_cfg.model.moe_shared_expert_overlap is False
    assert plan.change("model.moe_shared_expert_overlap").new is False
    assert proxy_cfg.comm_overlap.delay_wgrad_compute is False


def test_env_vars_never_override_the_user(proxy_cfg, h100x2):
    proxy_cfg.env_vars = {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    plan = enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert proxy_cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert plan.env_vars_kept == {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    cfg2 = copy.deepcopy(proxy_cfg)
    cfg2.env_vars = {}
    enable_ep_overlap(cfg2, environment=h100x2, cuda_device_max_connections=16)
    assert cfg2.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "16"


def test_conflicts_raise_all_at_once_and_leave_cfg_unchanged(proxy_cfg, h100x2):
    m = proxy_cfg.model
    m.recompute_granularity, m.recompute_method, m.recompute_num_layers = "full", "uniform", 1
    m.mtp_num_layers = 2
    proxy_cfg.mixed_precision = None
    m.bf16 = False  # the Qwen3 provider is bf16 by itself (HF torch_dtype)
    before = snapshot(proxy_cfg)
    with pytest.raises(EPOverlapError) as excinfo:
        enable_ep_overlap(proxy_cfg, environment=h100x2)
    ids = {v.rule_id for v in excinfo.value.violations}
    assert {"full-recompute", "recompute-method", "recompute-num-layers", "mtp-layers", "precision"} <= ids
    for v in excinfo.value.violations:
        if v.severity.value == "error":
            assert f"{v.rule_id}: " in str(excinfo.value)
    assert snapshot(proxy_cfg) == before
    assert not is_installed(proxy_cfg)


def test_resolve_auto_applies_documented_fixes_and_records_them(proxy_cfg, h100x2):
    m = proxy_cfg.model
    m.recompute_granularity, m.recompute_method, m.recompute_num_layers = "full", "uniform", 1
    m.recompute_modules = ["moe", "core_attn"]
    proxy_cfg.mixed_precision = None
    m.bf16 = False  # the Qwen3 provider is bf16 by itself (HF torch_dtype)
    plan = enable_ep_overlap(proxy_cfg, resolve="auto", environment=h100x2)
    assert (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == (None, None, None)
    assert m.recompute_modules == ["core_attn"]
    assert proxy_cfg.mixed_precision == "bf16_mixed"
    reasons = " ".join(c.labelled for c in plan.changes)
    assert "set by resolve: full-recompute" in reasons and "set by resolve: precision" in reasons
    finalize(proxy_cfg, h100x2)
    assert proxy_cfg.model.overlap_moe_expert_parallel_comm is True


def test_pp_without_vpp_gets_a_vpp_only_with_auto(proxy_cfg):
    env = describe("h100", 4, te_version="", deep_ep_version="")
    proxy_cfg.model.pipeline_model_parallel_size = 2
    with pytest.raises(EPOverlapError, match="pp-needs-vpp"):
        enable_ep_overlap(proxy_cfg, environment=env)
    plan = enable_ep_overlap(proxy_cfg, resolve="auto", environment=env)
    assert proxy_cfg.model.virtual_pipeline_model_parallel_size == 2
    assert plan.change("model.virtual_pipeline_model_parallel_size").new == 2
    finalize(proxy_cfg, env)
    assert proxy_cfg.model.overlap_moe_expert_parallel_comm is True


def test_unfixable_conflict_raises_even_with_auto(proxy_cfg, h100x2):
    proxy_cfg.model.expert_model_parallel_size = 1
    before = snapshot(proxy_cfg)
    with pytest.raises(EPOverlapError, match="ep-size"):
        enable_ep_overlap(proxy_cfg, resolve="auto", environment=h100x2)
    assert snapshot(proxy_cfg) == before


def test_deepep_on_hopper_goes_through_mb_and_sets_flex(proxy_cfg, h100x2):
    env = describe("h100", 2, te_version="", deep_ep_version="1.2.1")
    plan = enable_ep_overlap(proxy_cfg, dispatcher="deepep", environment=env)
    assert proxy_cfg.model.moe_token_dispatcher_type == "flex"
    assert proxy_cfg.model.moe_flex_dispatcher_backend == "deepep"
    assert "apply_flex_dispatcher_backend" in plan.change("model.moe_token_dispatcher_type").reason


def test_mb_silent_fallback_is_refused_or_recorded(proxy_cfg):
    gb200 = describe("gb200", 4, te_version="", deep_ep_version="1.2.1")
    before = snapshot(proxy_cfg)
    with pytest.raises(EPOverlapError, match="fell back from deepep to alltoall"):
        enable_ep_overlap(proxy_cfg, dispatcher="deepep", environment=gb200)
    assert snapshot(proxy_cfg) == before
    plan = enable_ep_overlap(proxy_cfg, dispatcher="deepep", resolve="auto", environment=gb200)
    assert plan.dispatcher == "alltoall"
    assert proxy_cfg.model.moe_token_dispatcher_type == "alltoall"
    assert any(w.rule_id == "flex-backend-gpu" for w in plan.warnings)


def test_missing_deep_ep_is_refused_with_the_build_hint(proxy_cfg, h100x2):
    with pytest.raises(EPOverlapError, match="flex-backend-importable"):
        enable_ep_overlap(proxy_cfg, dispatcher="deepep", environment=h100x2)


def test_hybridep_gets_topology_env(proxy_cfg):
    env = describe("h100", 2, te_version="", deep_ep_version=None)
    enable_ep_overlap(proxy_cfg, dispatcher="hybridep", environment=env)
    assert proxy_cfg.env_vars["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "2"
    assert proxy_cfg.env_vars["NVLINK_DOMAIN_SIZE"] == "8"
    assert proxy_cfg.env_vars["USE_MNNVL"] == "0"


@pytest.mark.parametrize(
    "gpu,ep,deep_ep,expected",
    [
        ("h100", 2, "1.2.1", "alltoall"),
        ("h100", 16, "1.2.1", "deepep"),
        ("h100", 16, "", "alltoall"),
        ("gb200", 16, "1.2.1", "hybridep"),
        ("a100", 32, None, "alltoall"),
    ],
)
def test_auto_dispatcher_choice(gpu, ep, deep_ep, expected):
    from dataclasses import replace

    from types import SimpleNamespace

    from mbridge_ep_overlap.core.dispatcher import decide

    env = describe(gpu, ep, deep_ep_version=deep_ep)
    if gpu == "gb200":
        env = replace(env, hybrid_ep_available=True)
    choice = decide("auto", SimpleNamespace(expert_model_parallel_size=ep), env, "error", keep_current=False)
    assert choice.dispatcher == expected and choice.reason.startswith("auto:")


def test_plan_prints_as_table_and_json(proxy_cfg, h100x2):
    plan = enable_ep_overlap(proxy_cfg, environment=h100x2)
    table = plan.to_table()
    assert "comm_overlap.overlap_moe_expert_parallel_comm" in table and "CUDA_DEVICE_MAX_CONNECTIONS=32" in table
    data = json.loads(plan.to_json())
    assert data["dispatcher"] == "alltoall"
    assert {"path": "comm_overlap.overlap_moe_expert_parallel_comm", "old": None, "new": True,
            "reason": "EP overlap on", "source": "requested"} in data["changes"]


@pytest.mark.parametrize(
    "kwargs,match",
    [({"dispatcher": "nccl"}, "dispatcher"), ({"resolve": "maybe"}, "resolve"),
     ({"cuda_device_max_connections": 0}, "cuda_device_max_connections")],
)
def test_bad_arguments_name_value_and_allowed(proxy_cfg, h100x2, kwargs, match):
    with pytest.raises(UsageError, match=match):
        enable_ep_overlap(proxy_cfg, environment=h100x2, **kwargs)


def test_precision_is_read_from_mixed_precision_before_mb_applies_it(proxy_cfg, h100x2):
    """A recipe says "bf16_mixed"; model.bf16 only becomes True inside runtime_config_update."""
    from mbridge_ep_overlap import check_ep_overlap

    proxy_cfg.model.bf16 = False
    proxy_cfg.mixed_precision = "bf16_mixed"
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert "precision" not in {v.rule_id for v in check_ep_overlap(proxy_cfg, environment=h100x2)}
    assert proxy_cfg.model.bf16 is False
    finalize(proxy_cfg, h100x2)
    assert proxy_cfg.model.bf16 is True and proxy_cfg.model.overlap_moe_expert_parallel_comm is True


def test_fallback_is_reported_together_with_the_other_conflicts(proxy_cfg):
    gb200 = describe("gb200", 4, te_version="", deep_ep_version="1.2.1")
    proxy_cfg.model.mtp_num_layers = 2
    with pytest.raises(EPOverlapError) as excinfo:
        enable_ep_overlap(proxy_cfg, dispatcher="deepep", environment=gb200)
    assert {"flex-backend-gpu", "mtp-layers"} <= {v.rule_id for v in excinfo.value.violations}


def test_high_priority_a2a_stream_is_opt_in_recorded_and_survives_finalize(proxy_cfg, h100x2):
    from megatron.bridge.training.config import runtime_config_update

    from mbridge_ep_overlap import enable_ep_overlap
    from mbridge_ep_overlap.target.simulate import simulate

    plan = enable_ep_overlap(proxy_cfg, "alltoall", high_priority_a2a=True, environment=h100x2)
    assert [c.path for c in plan.changes if "high_priority" in c.path] == ["model.high_priority_a2a_comm_stream"]
    with simulate(h100x2):
        runtime_config_update(proxy_cfg)
    assert proxy_cfg.model.high_priority_a2a_comm_stream is True
    with pytest.raises(UsageError, match="high_priority_a2a"):
        enable_ep_overlap(proxy_cfg, "alltoall", high_priority_a2a="yes", environment=h100x2)


def test_a_refusal_with_overlap_off_says_so_and_overlap_only_rules_stay_quiet(capsys, tmp_path):
    """With EP overlap off only the rules about the run itself answer (a TE feature on a TE-less
    target, say), and the refusal does not claim EP overlap was refused; the overlap-only trap
    inter-document-masking is not raised for an overlap-off config."""
    from mbridge_ep_overlap import RunSpec, build
    from mbridge_ep_overlap.spec import TargetSpec

    def spec(*overrides):
        return RunSpec(recipe="qwen3_moe_proxy", ep_overlap=False, overrides=overrides,
                       target=TargetSpec(gpu="h100", num_gpus=2, te="none"))

    built = build(spec("dataset.inter_document_masking=true"))
    assert "inter-document-masking" not in {v.rule_id for v in built.report.violations}
    with pytest.raises(EPOverlapError) as e:
        build(spec("model.moe_permute_fusion=true"))
    assert str(e.value).startswith("config refused (EP overlap off) (build)")
    assert "te-features-need-te" in str(e.value)


@pytest.mark.parametrize("section,value,error,needle", [
    ("model", None, UsageError, "cfg.model"),
    ("model", "gpt", UsageError, "cfg.model"),
    ("comm_overlap", "on", UsageError, "cfg.comm_overlap"),
    ("env_vars", "A=1", EPOverlapError, "env-vars-type"),
    ("env_vars", {1: 2}, EPOverlapError, "env-vars-type"),
])
def test_a_malformed_config_section_is_a_typed_error_and_nothing_changes(proxy_cfg, h100x2, section, value, error, needle):
    """A config whose sections have the wrong type is refused before any edit (UsageError naming the
    section; a malformed value inside one: the value rule, as EPOverlapError), never an AttributeError."""
    from mbridge_ep_overlap import check_ep_overlap
    from mbridge_ep_overlap.core.enable import disable_ep_overlap

    setattr(proxy_cfg, section, value)
    before = snapshot(proxy_cfg)
    with pytest.raises(error, match=needle):
        enable_ep_overlap(proxy_cfg, environment=h100x2)
    assert snapshot(proxy_cfg) == before
    if error is UsageError:
        for call in (lambda: check_ep_overlap(proxy_cfg, environment=h100x2), lambda: disable_ep_overlap(proxy_cfg)):
            with pytest.raises(UsageError, match=needle):
                call()
    else:
        assert needle in {v.rule_id for v in check_ep_overlap(proxy_cfg, environment=h100x2)}


@pytest.mark.parametrize("make,needle", [
    (lambda RunSpec, TargetSpec, build: build("qwen3_moe_proxy"), "invalid spec"),
    (lambda RunSpec, TargetSpec, build: build(None), "invalid spec"),
    (lambda RunSpec, TargetSpec, build: build(RunSpec(recipe="qwen3_moe_proxy"), target="h100"), "invalid target"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", target=None).validated(), "invalid target"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", overrides=None).validated(), "overrides"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", overrides="model.x=1").validated(), "overrides"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", overrides=(5,)).validated(), "override"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", hf_config_dir=5).validated(), "hf_config_dir"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", hf_config_dir="").validated(), "hf_config_dir"),
    (lambda RunSpec, TargetSpec, build: TargetSpec(te="1-").validated(), "te version"),
    (lambda RunSpec, TargetSpec, build: TargetSpec(deep_ep="2.18.0+").validated(), "deep_ep version"),
    (lambda RunSpec, TargetSpec, build: TargetSpec(num_gpus=True).validated(), "number of GPUs"),
    (lambda RunSpec, TargetSpec, build: TargetSpec(this_machine="yes").validated(), "this_machine"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", ep_overlap=False,
                                                dispatcher="auto").validated(), "while EP overlap is off"),
    (lambda RunSpec, TargetSpec, build: RunSpec(recipe="qwen3_moe_proxy", tensor_model_parallel_size=True).validated(),
     "tensor_model_parallel_size"),
])
def test_run_spec_and_build_refuse_wrong_types_with_usage_error(make, needle):
    from mbridge_ep_overlap import RunSpec, build
    from mbridge_ep_overlap.spec import TargetSpec

    with pytest.raises(UsageError, match=needle):
        make(RunSpec, TargetSpec, build)


@pytest.mark.parametrize("version", ["2.18.0", "2.18.0+15288857", "1.7", "2.10.0.dev0", "none"])
def test_valid_versions_pass(version):
    from mbridge_ep_overlap.spec import TargetSpec

    assert TargetSpec(te=version, deep_ep=version).validated()


@pytest.mark.parametrize("kwargs,name", [
    ({"delay_wgrad": 1}, "delay_wgrad"), ({"delay_wgrad": 0}, "delay_wgrad"), ({"delay_wgrad": "yes"}, "delay_wgrad"),
    ({"high_priority_a2a": 1}, "high_priority_a2a"), ({"high_priority_a2a": 0.0}, "high_priority_a2a"),
    ({"cuda_device_max_connections": 2**70}, "cuda_device_max_connections"),
    ({"cuda_device_max_connections": 10**5000}, "cuda_device_max_connections"),
    ({"cuda_device_max_connections": 33}, "cuda_device_max_connections"),
    ({"cuda_device_max_connections": 0}, "cuda_device_max_connections"),
    ({"cuda_device_max_connections": 8.0}, "cuda_device_max_connections"),
    ({"cuda_device_max_connections": True}, "cuda_device_max_connections"),
])
def test_arguments_of_the_wrong_type_or_range_are_usage_errors(proxy_cfg, h100x2, kwargs, name):
    """1 is not a bool (it compares equal to True), and CUDA takes 1 to 32 connections: UsageError naming
    the argument, cfg untouched - as the other type checks of enable_ep_overlap."""
    before = snapshot(proxy_cfg)
    with pytest.raises(UsageError, match=name):
        enable_ep_overlap(proxy_cfg, environment=h100x2, **kwargs)
    assert snapshot(proxy_cfg) == before


@pytest.mark.parametrize("kwargs", [{"delay_wgrad": False}, {"high_priority_a2a": True},
                                    {"cuda_device_max_connections": 2}, {"cuda_device_max_connections": 32}])
def test_arguments_of_the_right_type_and_range_are_accepted(proxy_cfg, h100x2, kwargs):
    enable_ep_overlap(proxy_cfg, environment=h100x2, **kwargs)


def test_run_spec_flags_are_bools_too():
    from mbridge_ep_overlap import RunSpec

    for name in ("delay_wgrad", "high_priority_a2a"):
        with pytest.raises(UsageError, match=name):
            RunSpec(recipe="qwen3_moe_proxy", **{name: 1}).validated()


def test_cuda_device_max_connections_the_run_gets(proxy_cfg, h100x2):
    """The caller's value wins over the recipe's; 32 replaces a recipe's 1 (which would serialise the
    all-to-all stream); another value of the recipe is kept; asking for 1 with overlap on is refused."""
    for recipe_value, asked, expected in [(None, None, "32"), ("1", None, "32"), ("8", None, "8"), ("8", 16, "16")]:
        cfg = copy.deepcopy(proxy_cfg)
        cfg.env_vars = {} if recipe_value is None else {"CUDA_DEVICE_MAX_CONNECTIONS": recipe_value}
        kwargs = {} if asked is None else {"cuda_device_max_connections": asked}
        enable_ep_overlap(cfg, environment=h100x2, **kwargs)
        assert cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == expected, (recipe_value, asked)
    cfg = copy.deepcopy(proxy_cfg)
    before = snapshot(cfg)
    with pytest.raises(EPOverlapError, match="cuda-device-max-connections"):
        enable_ep_overlap(cfg, environment=h100x2, cuda_device_max_connections=1)
    assert snapshot(cfg) == before
