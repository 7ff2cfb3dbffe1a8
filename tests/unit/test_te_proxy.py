"""The proxy on Transformer Engine layers, planned on CPU (the dry run simulates TE 2.18 on the
target), the forced-delayed-wgrad launcher of the GPU suite, and the suite's run declarations."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.core.dispatcher import IPC_HEALTH_KEY
from mbridge_ep_overlap.tools.cli import main

FUNCTIONAL = Path(__file__).resolve().parents[1] / "functional"


def plan_json(capsys, *argv):
    import json

    code = main(["plan", "--recipe", "qwen3_moe_proxy_te", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_te_proxy_is_accepted_for_its_cluster(capsys):
    code, out = plan_json(capsys)
    assert code == 0 and out["accepted"] is True
    assert out["finalized"]["overlap_moe_expert_parallel_comm"] is True
    assert out["finalized"]["moe_token_dispatcher_type"] == "alltoall"


def test_te_proxy_is_refused_without_te_naming_the_rule(capsys):
    code, out = plan_json(capsys, "--te", "none")
    assert code == 1 and out["accepted"] is False
    assert "te-features-need-te" in [v["rule_id"] for v in out["violations"]]


def test_te_proxy_differs_from_the_local_proxy_only_in_its_layers():
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    with simulate(describe("h200", 2, te_version="2.18.0")):
        local, te = resolve_recipe("qwen3_moe_proxy").config(), resolve_recipe("qwen3_moe_proxy_te").config()
    assert te.model.transformer_impl == "transformer_engine" and local.model.transformer_impl == "local"
    assert te.model.transformer_layer_spec.__name__ == "default_layer_spec"  # what MB's Qwen3-MoE recipes use
    for name in ("apply_rope_fusion", "moe_permute_fusion", "moe_router_fusion",
                 "cross_entropy_loss_fusion", "moe_grouped_gemm", "bias_activation_fusion"):
        assert getattr(te.model, name) is True, name
    assert te.model.gradient_accumulation_fusion is False  # needs APEX, absent on the proving node
    assert te.model.cross_entropy_fusion_impl == "te"
    for name in ("num_layers", "hidden_size", "num_moe_experts", "moe_router_topk", "seq_length", "vocab_size",
                 "expert_model_parallel_size", "moe_token_dispatcher_type", "moe_aux_loss_coeff"):
        assert getattr(te.model, name) == getattr(local.model, name), name
    for section in ("optimizer", "train", "dataset", "tokenizer", "scheduler", "rng", "ddp"):
        assert getattr(te, section) == getattr(local, section), section


def _load(name: str):
    """A module of tests/functional (its own imports resolve as pytest resolves them there)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", "") == str(FUNCTIONAL / f"{name}.py"):
        return sys.modules[name]
    sys.path.insert(0, str(FUNCTIONAL))
    try:
        spec = importlib.util.spec_from_file_location(name, FUNCTIONAL / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(FUNCTIONAL))


@pytest.mark.parametrize("te,overlap_grad_reduce_off", [(None, False), ("none", True)])
def test_forced_delay_wgrad_launcher_bypasses_only_our_rule(te, overlap_grad_reduce_off, capsys, tmp_path):
    launcher = _load("force_delay_wgrad")
    argv = ["--recipe", "qwen3_moe_proxy", "--ep", "2", "--dryrun", "--output-dir", str(tmp_path)]
    assert launcher.main(argv + (["--te", te] if te else [])) == 0
    out = capsys.readouterr().out
    assert "delay_wgrad_compute: True" in out and "overlap_moe_expert_parallel_comm: True" in out
    assert ("'ddp.overlap_grad_reduce': False" in out) is overlap_grad_reduce_off


def test_every_run_a_functional_test_uses_is_declared():
    """The GPU suite's ``runs`` markers name declared runs for every parameter combination."""
    suite = _load("functional_suite")
    defs = suite.run_defs()
    used = set()
    for module_name in ("test_ep_overlap_gpu", "test_te_rules_gpu"):
        module = _load(module_name)
        for fn in (getattr(module, n) for n in dir(module) if n.startswith("test_")):
            marks = getattr(fn, "pytestmark", [])
            names = [a for m in marks if m.name == "runs" for a in m.args]
            combos = [{}]
            for m in marks:
                if m.name == "parametrize":
                    keys = [k.strip() for k in m.args[0].split(",")]
                    values = [v.values if hasattr(v, "values") else (v if len(keys) > 1 else (v,)) for v in m.args[1]]
                    combos = [{**c, **dict(zip(keys, v))} for c in combos for v in values]
            used |= {n.format(**c) for n in names for c in combos if n != "smoke"}
    assert used and used <= set(defs), used - set(defs)
    assert set(defs) - used == set(), f"declared but unused runs: {set(defs) - used}"
    assert defs["local-forced_delay_wgrad"].script == "tests/functional/force_delay_wgrad.py"
    assert (Path(__file__).resolve().parents[2] / defs["local-forced_delay_wgrad"].script).exists()
    assert all(d.flex == d.name.split("-")[1] for d in defs.values() if d.flex)


def test_suite_launches_declared_runs_and_gates_flex_runs_on_the_smoke_verdict(monkeypatch, tmp_path):
    from mbridge_ep_overlap.lab import launch, smoke
    from mbridge_ep_overlap.lab.smoke import Verdict

    suite_module = _load("functional_suite")
    launched = []

    def fake_launch(name, nproc, args, timeout_s, env, log_root, script, share_gpu=False):
        assert share_gpu is False  # EP_OVERLAP_SHARE_GPU is not set here
        launched.append((name, script, env))
        return launch.Run(name, 0, False, 1.0, tmp_path / name, {"steps": []})

    verdicts = {"alltoall": Verdict("alltoall", "usable"), "deepep": Verdict("deepep", "missing", detail="no deep_ep"),
                "hybridep": Verdict("hybridep", "crashed", stage="HybridEPBuffer init", signal="SIGSEGV"),
                IPC_HEALTH_KEY: Verdict(IPC_HEALTH_KEY, "usable")}
    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(smoke, "load", lambda **kw: verdicts)
    monkeypatch.delenv("EP_OVERLAP_SMOKE", raising=False)
    monkeypatch.delenv("USE_MNNVL", raising=False)
    monkeypatch.setattr(suite_module, "_te_problem", ["Transformer Engine does not import here"])
    s = suite_module.Suite(["local-off", "local-deepep", "local-hybridep", "te-off", "local-forced_delay_wgrad"],
                           tmp_path)
    try:
        assert s.result("local-off").name == "local-off"
        with pytest.raises(pytest.skip.Exception, match="deepep is not usable on this node .smoke check: not installed"):
            s.result("local-deepep")
        # the plan runs HybridEP with USE_MNNVL=0 on a <= 8-GPU NVLink domain: the CUDA-IPC verdict applies
        assert s.result("local-hybridep").name == "local-hybridep"
        with pytest.raises(pytest.skip.Exception, match="Transformer Engine does not import"):
            s.result("te-off")
        s.result("local-forced_delay_wgrad")
    finally:
        s.close()
    assert sorted(n for n, _, _ in launched) == ["local-forced_delay_wgrad", "local-hybridep", "local-off"]
    assert dict((n, sc) for n, sc, _ in launched)["local-forced_delay_wgrad"] == "tests/functional/force_delay_wgrad.py"
    monkeypatch.setenv("USE_MNNVL", "1")  # a caller's USE_MNNVL wins over the plan's: the default verdict applies
    other = suite_module.Suite([], tmp_path)
    try:
        assert "crashed (SIGSEGV)" in other.flex_gate("hybridep")
    finally:
        other.close()


# ---- the cuDNN Transformer Engine loads must be the one torch runs (found on 2x H200) ----------------
@pytest.mark.parametrize("number,text", [(91900, "9.19.0"), (91400, "9.14.0"), (90100, "9.1.0"), (8902, "8.9.2"),
                                         (None, None), (0, None)])
def test_cudnn_version_numbers_read_as_cudnn_writes_them(number, text):
    from mbridge_ep_overlap.target.probe import cudnn_version_text

    assert cudnn_version_text(number) == text


@pytest.mark.parametrize("te_cudnn,impl,refused", [("9.14.0", "transformer_engine", True),
                                                    ("9.19.0", "transformer_engine", False),
                                                    ("9.14.0", "local", False), (None, "transformer_engine", False)])
def test_te_cudnn_rule_refuses_a_te_stack_on_another_cudnn(te_cudnn, impl, refused):
    """TE stack + TE on another cuDNN than torch's: refused with the library named; local layers (no
    TE attention) or an unknown pair are not."""
    import dataclasses

    from mbridge_ep_overlap import check_ep_overlap
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.offline import offline_architectures
    from mbridge_ep_overlap.target.simulate import simulate
    from mbridge_ep_overlap_recipes.proxy import qwen3_moe_proxy_te

    node = dataclasses.replace(describe("h200", 2, te_version="2.18.0"), torch_cudnn_version="9.19.0",
                               te_cudnn_version=te_cudnn, te_cudnn_library="/usr/local/cuda/lib64/libcudnn.so.9")
    with offline_architectures(), simulate(node):
        cfg = qwen3_moe_proxy_te()
        cfg.model.transformer_impl = impl
        found = [v for v in check_ep_overlap(cfg, environment=node) if v.rule_id == "te-cudnn-matches-torch"]
    assert bool(found) == refused
    if refused:
        assert "/usr/local/cuda/lib64/libcudnn.so.9" in str(found[0].current) and "CUDNN_HOME" in found[0].fix


def test_library_file_names_the_real_file_of_a_function_loaded_by_bare_name():
    """What doctor shows for the cuDNN TE loaded: dladdr's file, not the bare name ctypes was given."""
    import ctypes
    import ctypes.util
    import os

    from mbridge_ep_overlap.target.probe import library_file

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    path = library_file(libm.cos)
    assert path and os.path.isabs(path) and os.path.exists(path) and "libm" in os.path.basename(path)


def test_suite_with_ranks_sharing_one_gpu_launches_shared_and_never_flex(monkeypatch, tmp_path):
    """EP_OVERLAP_SHARE_GPU=1: every launch gets share_gpu=True, no smoke check starts, the flex
    runs are not launched and skip saying why, and one GPU counts as enough for the suite."""
    from mbridge_ep_overlap.lab import launch, smoke

    suite_module = _load("functional_suite")
    launched = []

    def fake_launch(name, nproc, args, timeout_s, env, log_root, script, share_gpu=False):
        launched.append((name, share_gpu))
        return launch.Run(name, 0, False, 1.0, tmp_path / name, {"steps": []})

    def no_smoke(**kw):
        raise AssertionError("the smoke check must not run when ranks share one GPU")

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(smoke, "load", no_smoke)
    monkeypatch.setattr(smoke, "run", no_smoke)
    monkeypatch.setattr(suite_module, "SHARED", True)
    s = suite_module.Suite(["local-off", "local-deepep", "local-hybridep", "smoke"], tmp_path)
    try:
        assert s.result("local-off").name == "local-off"
        for backend in ("deepep", "hybridep"):
            with pytest.raises(pytest.skip.Exception, match="ranks share one GPU"):
                s.result(f"local-{backend}")
    finally:
        s.close()
    assert launched == [("local-off", True)]
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("EP_OVERLAP_SHARE_GPU", "1")
    assert suite_module.gpu_count() == suite_module.NPROC
    monkeypatch.delenv("EP_OVERLAP_SHARE_GPU")
    assert suite_module.gpu_count() == 1
