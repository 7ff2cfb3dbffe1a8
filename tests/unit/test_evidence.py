"""Run-time evidence counters on CPU: the delayed-wgrad counters and the layer-stack record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mbridge_ep_overlap.lab import evidence
from mbridge_ep_overlap.lab.evidence import ScheduleCounter, WgradCounter


class _Slot(torch.nn.Module):
    """A layer slot's delayed-wgrad callable: ``deferred`` says whether its wgrad waits for backward_dw."""

    def __init__(self, deferred: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4, bias=False)
        self.deferred = deferred

    def backward_dw(self) -> None:
        if self.deferred:  # TE: the weight gradient is computed (accumulated into main_grad) only now
            self.linear.weight.main_grad.add_(1.0)


def _node(slot: _Slot, delay: bool):
    slot.linear.weight.main_grad = torch.full((4, 4), 0.5)  # computed in the normal backward already
    return SimpleNamespace(delay_wgrad_compute=delay, bwd_dw_callables=[slot])


def _original_backward_dw(node):
    """MCore's TransformerLayerNode.backward_dw in miniature: nothing unless delayed wgrad is on."""
    if not node.delay_wgrad_compute:
        return
    for module in node.bwd_dw_callables:
        module.backward_dw()
    node.bwd_dw_callables = None


@pytest.mark.parametrize("deferred,changed", [(True, 1), (False, 0)], ids=["te-like", "local-like"])
def test_probe_tells_real_deferred_work_from_a_no_op(deferred, changed):
    counter = WgradCounter(probe=True)
    wrapped = counter.wrap_node_backward_dw(_original_backward_dw)
    wrapped(_node(_Slot(deferred), delay=True))
    wrapped(_node(_Slot(deferred), delay=False))  # delayed wgrad off: counted, never probed
    d = counter.to_dict()
    assert d["node_backward_dw_calls"] == 2 and d["node_backward_dw_delayed"] == 1
    assert d["probe"] == {"changed": changed, "unchanged": 1 - changed, "grads_present_before": 1}


def test_without_the_probe_only_counts(monkeypatch):
    monkeypatch.delenv("EP_OVERLAP_WGRAD_PROBE", raising=False)
    counter = WgradCounter()
    counter.wrap_node_backward_dw(_original_backward_dw)(_node(_Slot(True), delay=True))
    assert "probe" not in counter.to_dict() and counter.node_backward_dw_delayed == 1
    monkeypatch.setenv("EP_OVERLAP_WGRAD_PROBE", "1")
    assert WgradCounter().probe is True


def test_install_wraps_mcore_layer_node_and_te_weight_grad_store(monkeypatch):
    from megatron.core.models.common.utils import TransformerLayerNode

    class WeightGradStore:  # TE 2.18's transformer_engine.pytorch.module._common.WeightGradStore, reduced
        def __init__(self):
            self.queue = []

        def put(self, tensor_list, func):
            self.queue.append((tensor_list, func))

        def pop(self):
            tensor_list, func = self.queue.pop(0)
            return func(*tensor_list), tensor_list

    monkeypatch.setattr(evidence, "_te_weight_grad_store", lambda: WeightGradStore)
    original = TransformerLayerNode.backward_dw
    counter = ScheduleCounter(probe_wgrad=False).install()
    try:
        assert TransformerLayerNode.backward_dw is not original
        store = WeightGradStore()
        store.put([1, 2], lambda a, b: a + b)
        assert store.pop()[0] == 3
        TransformerLayerNode.backward_dw(SimpleNamespace(delay_wgrad_compute=False))  # returns at once
        d = counter.wgrad.to_dict()
        assert (d["te_wgrad_deferred"], d["te_wgrad_executed"], d["node_backward_dw_calls"]) == (1, 1, 1)
    finally:
        counter.uninstall()
    assert TransformerLayerNode.backward_dw is original
    assert WeightGradStore.put.__name__ == "put"


def test_te_counters_are_unknown_without_transformer_engine():
    assert evidence._te_weight_grad_store() is None  # TE is not installed in the unit-test environment
    assert WgradCounter().to_dict()["te_wgrad_deferred"] is None


def test_layer_stack_records_the_modules_really_built():
    class TELayerNormColumnParallelLinear(torch.nn.Linear):
        pass

    TELayerNormColumnParallelLinear.__module__ = "megatron.core.extensions.transformer_engine"

    model = torch.nn.Sequential(TELayerNormColumnParallelLinear(2, 2), torch.nn.LayerNorm(2), torch.nn.ReLU())
    cfg = SimpleNamespace(model=SimpleNamespace(transformer_impl="transformer_engine", apply_rope_fusion=True,
                                                cross_entropy_fusion_impl="te"))
    record = evidence.layer_stack(SimpleNamespace(state=SimpleNamespace(cfg=cfg), model=[model]))
    assert record["module_classes"] == ["LayerNorm", "TELayerNormColumnParallelLinear"]
    assert record["te_module_classes"] == ["TELayerNormColumnParallelLinear"]
    assert record["transformer_impl"] == "transformer_engine" and record["apply_rope_fusion"] is True
    assert record["moe_permute_fusion"] is None and record["te_version"] is None
