"""disable_ep_overlap is the exact inverse of enable_ep_overlap: after enable then disable the config
equals the one enable was given (class, fields, created sections, env_vars, the recipe's recorded
request); on a config enable never touched it turns EP overlap off and nothing else."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest

from mbridge_ep_overlap import disable_ep_overlap, enable_ep_overlap
from mbridge_ep_overlap.core.dispatcher import RECIPE_REQUEST
from mbridge_ep_overlap.core.enforcement import is_installed
from mbridge_ep_overlap.spec import registered_recipes, resolve_recipe
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.simulate import simulate

PERF = "megatron.bridge.perf_recipes"
# (recipe, GPU, GPUs, enable's arguments)
CASES = [(name, e.gpu, e.num_gpus, {"dispatcher": e.dispatcher, "resolve": "auto"})
         for name, e in sorted(registered_recipes().items())] + [
    (f"{PERF}.qwen.gb300.qwen3_moe:qwen3_30b_a3b_pretrain_8gpu_gb300_bf16_config", "gb300", 8, {}),
    (f"{PERF}.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "h100", 16, {"dispatcher": "alltoall"}),
    (f"{PERF}.deepseek.gb200.deepseek_v3:deepseek_v3_pretrain_256gpu_gb200_fp8mx_config", "gb200", 256, {}),
]


def _plain(value):
    """MB's serialisation keeps a layer-spec ``functools.partial`` as an object (equal only to itself):
    compared by what it calls with which arguments."""
    if isinstance(value, functools.partial):
        return ("partial", value.func, _plain(list(value.args)), _plain(dict(value.keywords)))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def picture(cfg) -> tuple:
    """Everything that makes two configs equal: the class, MB's own serialisation of every field,
    and the attributes outside the fields (the recipe's recorded flex request)."""
    return (type(cfg), _plain(cfg.to_dict()), getattr(cfg.model, RECIPE_REQUEST, None),
            cfg._checkpoint_load_required, _extra_attributes(cfg), _extra_attributes(cfg.model))


def _extra_attributes(obj) -> list[str]:
    """Instance attributes that are no dataclass field (what enable could leave behind unseen)."""
    fields = {f.name for f in dataclasses.fields(obj)}
    return sorted(k for k in vars(obj) if k not in fields)


@pytest.mark.parametrize("name, gpu, num, kwargs", CASES, ids=[c[0].rsplit(":", 1)[-1] for c in CASES])
def test_enable_then_disable_gives_back_the_original(name, gpu, num, kwargs):
    target = describe(gpu, num)
    with simulate(target):
        cfg = resolve_recipe(name).config()
    original = copy.deepcopy(cfg)
    enable_ep_overlap(cfg, environment=target, **kwargs)
    assert is_installed(cfg)
    disable_ep_overlap(cfg)
    assert not is_installed(cfg)
    assert picture(cfg) == picture(original)


def test_twice_enabled_is_undone_to_the_first_original(proxy_cfg, h100x2):
    original = copy.deepcopy(proxy_cfg)
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    enable_ep_overlap(proxy_cfg, "alltoall", delay_wgrad=True, high_priority_a2a=False, environment=h100x2,
                      resolve="auto")
    changes = disable_ep_overlap(proxy_cfg)
    assert picture(proxy_cfg) == picture(original)
    assert proxy_cfg.comm_overlap is None and "CUDA_DEVICE_MAX_CONNECTIONS" not in proxy_cfg.env_vars
    assert any(c.path == "comm_overlap" and c.new is None for c in changes)


def test_disable_on_a_config_enable_never_touched_turns_overlap_off_and_nothing_else(proxy_cfg, h100x2):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    proxy_cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False, overlap_moe_expert_parallel_comm=True,
                                               delay_wgrad_compute=True)
    proxy_cfg.model.overlap_moe_expert_parallel_comm = True
    before = copy.deepcopy(proxy_cfg)
    changes = disable_ep_overlap(proxy_cfg)
    assert {c.path for c in changes} == {"comm_overlap.overlap_moe_expert_parallel_comm",
                                         "comm_overlap.delay_wgrad_compute", "model.overlap_moe_expert_parallel_comm"}
    for c in changes:
        assert c.new is False
    proxy_cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    proxy_cfg.comm_overlap.delay_wgrad_compute = True
    proxy_cfg.model.overlap_moe_expert_parallel_comm = True
    assert picture(proxy_cfg) == picture(before)


def test_a_second_disable_after_the_undo_only_turns_off(proxy_cfg, h100x2):
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    disable_ep_overlap(proxy_cfg)
    assert disable_ep_overlap(proxy_cfg) == []  # the recipe never enabled overlap: nothing left to turn off
