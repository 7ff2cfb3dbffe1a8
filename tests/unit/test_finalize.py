"""Finalize-time enforcement: MB's own runtime_config_update / validate run our rules first."""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import EPOverlapError, enable_ep_overlap
from mbridge_ep_overlap.target.simulate import simulate
from mbridge_ep_overlap.core.enforcement import EPOverlapConfigContainer, is_installed, remove


def runtime_config_update(cfg, env):
    from megatron.bridge.training.config import runtime_config_update as mb_runtime_config_update

    with simulate(env):
        mb_runtime_config_update(cfg)


def hydra_overrides(cfg, *items):
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    process_config_with_overrides(cfg, cli_overrides=list(items))


def test_overrides_after_enable_are_refused_with_every_violation(proxy_cfg, h100x2):
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    hydra_overrides(
        proxy_cfg,
        "model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1",
        "model.mtp_num_layers=3",
    )
    assert isinstance(proxy_cfg, EPOverlapConfigContainer), "MB's override path must keep the enforcing class"
    with pytest.raises(EPOverlapError) as excinfo:
        runtime_config_update(proxy_cfg, h100x2)
    assert {v.rule_id for v in excinfo.value.violations} >= {
        "full-recompute", "recompute-method", "recompute-num-layers", "mtp-layers"
    }
    assert "runtime_config_update" in str(excinfo.value)


def test_without_enforcement_mb_stops_at_its_first_bare_assert(proxy_cfg, h100x2):
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    remove(proxy_cfg)
    proxy_cfg.model.mtp_num_layers = 3
    proxy_cfg.model.recompute_granularity = "selective"
    proxy_cfg.model.recompute_method = "uniform"
    with pytest.raises(AssertionError) as excinfo:
        runtime_config_update(proxy_cfg, h100x2)
    assert not isinstance(excinfo.value, EPOverlapError)


def test_validate_alone_runs_the_rules(proxy_cfg, h100x2):
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    proxy_cfg.model.moe_token_dispatcher_type = "allgather"
    with simulate(h100x2), pytest.raises(EPOverlapError, match="dispatcher-type"):
        proxy_cfg.validate()


def test_accepted_config_finalizes_with_overlap_really_on(proxy_cfg, h100x2):
    enable_ep_overlap(proxy_cfg, environment=h100x2)
    runtime_config_update(proxy_cfg, h100x2)
    assert proxy_cfg.model.overlap_moe_expert_parallel_comm is True
    assert proxy_cfg.comm_overlap.user_comm_overlap_cfg.overlap_moe_expert_parallel_comm is True


def test_yaml_round_trip_keeps_enforcement(proxy_cfg, h100x2, tmp_path):
    from megatron.bridge.training.config import ConfigContainer

    enable_ep_overlap(proxy_cfg, environment=h100x2)
    path = tmp_path / "cfg.yaml"
    proxy_cfg.to_yaml(str(path))
    assert "mbridge_ep_overlap.core.enforcement.EPOverlapConfigContainer" in path.read_text()
    loaded = ConfigContainer.from_yaml(str(path))
    assert is_installed(loaded)
