"""Mismatches named from the message alone (diagnose.mismatches): a version gate, a size one parallel split apart, a
checkpoint's expert layout, a pickled class the installed release lacks. The torch and pickle errors are raised here
for real; the version gates are the texts Transformer Engine prints (not installed here)."""

from __future__ import annotations

import io
import pickle
import sys
import types

import pytest
import torch

from mbridge_ep_overlap.diagnose.engine import diagnose


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


@pytest.mark.parametrize(("line", "cause_id", "said"), [
    ("ValueError: Supported flash-attn versions are >= 2.1.1, <= 2.7.4.post1. Found flash-attn 2.8.3.",
     "version-gate:flash-attn", "versions >= 2.1.1, <= 2.7.4.post1 and found 2.8.3"),
    ("AssertionError: FlashAttention maximum version 2.5.8 is supported.", "version-gate:flashattention",
     "at most version 2.5.8"),
    ("RuntimeError: This feature requires transformer_engine >= 2.7.0, found 2.5.0", "version-gate:transformer-engine",
     "version >= 2.7.0 and found 2.5.0"),
])
def test_a_version_gate_names_the_package_the_range_and_the_version_found(line, cause_id, said):
    d = run(line + "\n")
    assert d.cause_ids[0] == cause_id, d.cause_ids
    assert said in d.findings[0].signature.cause


@pytest.mark.parametrize("line", ["AssertionError: Flex token dispatcher requires TPxEP > 1",
                                  "ValueError: num_layers requires pipeline_model_parallel_size >= 2 here"])
def test_a_size_requirement_is_no_version_gate(line):
    assert not [c for c in run(line + "\n").cause_ids if c.startswith("version-gate")]


def test_a_size_that_is_a_whole_multiple_is_named_as_a_split_applied_to_one_side():
    with pytest.raises(RuntimeError) as raised:
        torch.ones(16256, 2) * torch.ones(65024, 2)
    d = run(f"RuntimeError: {raised.value}\n")
    assert d.cause_ids[0] == "sharded-size:4x", d.cause_ids
    assert "one of 4 shards" in d.findings[0].signature.cause and "sequence parallelism" in d.findings[0].signature.cause
    with pytest.raises(RuntimeError) as other:
        torch.ones(5, 2) * torch.ones(7, 2)  # not a multiple: no split to name
    assert not [c for c in run(f"RuntimeError: {other.value}\n").cause_ids if c.startswith("sharded-size")]


class _Grouped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.Module()
        self.experts.weight1 = torch.nn.Parameter(torch.zeros(2, 2))
        self.experts.weight2 = torch.nn.Parameter(torch.zeros(2, 2))


def test_a_checkpoint_saved_with_per_expert_mlps_loaded_into_grouped_experts_is_named():
    saved = {f"experts.local_experts.{e}.linear_fc{i}.weight": torch.zeros(2, 2) for e in range(2) for i in (1, 2)}
    with pytest.raises(RuntimeError) as raised:
        _Grouped().load_state_dict(saved)
    d = run(f"RuntimeError: {raised.value}\n")
    top = next(f for f in d.findings if f.signature.id.startswith("expert-layout"))
    assert "the model expects GroupedMLP" in top.signature.cause and "SequentialMLP" in top.signature.cause
    assert "moe_grouped_gemm" in top.signature.fix


def test_a_pickled_class_missing_from_the_installed_module_is_named_with_its_version(monkeypatch):
    mod = types.ModuleType("megatron.core.dist_checkpointing.strategies.torch")
    cls = type("MadeUpMetadataV9", (), {"__module__": mod.__name__})
    mod.MadeUpMetadataV9 = cls
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    data = pickle.dumps(cls())
    del mod.MadeUpMetadataV9
    with pytest.raises(AttributeError) as raised:
        pickle.loads(data)
    d = run(f"AttributeError: {raised.value}\n")
    top = d.findings[0]
    assert top.signature.id == "pickled-class:MadeUpMetadataV9", d.cause_ids
    assert "megatron-core 0.19.2" in top.signature.cause and "has no MadeUpMetadataV9" in top.signature.cause


@pytest.mark.parametrize(("line", "cause_id"), [
    ("Duplicate GPU detected : rank 7 and rank 0 both on CUDA device f000", "nccl-duplicate-gpu"),
    ("[torch_memory_saver.cpp] CUresult error: 2 (out of memory) file=csrc/utils.h func=cu_mem_create line=187",
     "cuda-driver-out-of-memory"),
    ("undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
     "extension-built-for-other-torch"),
])
def test_lines_of_installed_libraries_are_named(line, cause_id):
    assert run(line + "\n").cause_ids[0] == cause_id


def _traceback(body: str, tmp_path) -> str:
    import subprocess

    (tmp_path / "rope.py").write_text(body)
    done = subprocess.run([sys.executable, str(tmp_path / "rope.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    return done.stderr


def test_a_configured_value_missing_from_a_lookup_table_is_named_with_the_table(tmp_path):
    text = _traceback("ROPE_MAPPING = {'linear': abs, 'dynamic': abs}\nrope_scaling = {'rope_type': 'yarn'}\n"
                      "def update(inv_freq):\n    return ROPE_MAPPING[rope_scaling['rope_type']](inv_freq)\n"
                      "update(1.0)\n", tmp_path)
    d = run(text)
    assert d.cause_ids[0] == "table-key:ROPE_MAPPING", d.cause_ids
    assert "'yarn'" in d.findings[0].signature.cause


def test_a_missing_literal_key_names_the_dict_indexed_by_it(tmp_path):
    text = _traceback("ROPE_MAPPING = {'linear': abs}\nrope_scaling = {'type': 'linear'}\n"
                      "def update(inv_freq):\n    return ROPE_MAPPING[rope_scaling['rope_type']](inv_freq)\n"
                      "update(1.0)\n", tmp_path)
    d = run(text)
    assert d.cause_ids[0] == "table-key:rope_scaling", d.cause_ids


def test_a_class_of_the_saving_script_is_not_called_a_release_skew():
    d = run("AttributeError: Can't get attribute 'Foo' on <module '__main__' from 'train.py'>\n")
    assert d.cause_ids[0] == "pickled-class:Foo"
    assert "script that saved the data" in d.findings[0].signature.cause
