"""The mbridge-ep-overlap CLI: doctor, plan (the README's main job), recipes, usage errors."""

from __future__ import annotations

import json

import pytest

from mbridge_ep_overlap.tools.cli import main


def test_plan_default_recipe_accepted(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "ACCEPTED with EP overlap on" in out
    assert "overlap_moe_expert_parallel_comm: True" in out
    assert "full-recompute" not in out  # a passing rule: listed with --rules (tests/unit/test_plan_report.py)


def test_plan_json_is_machine_readable(capsys):
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["accepted"] is True and data["finalized"]["expert_model_parallel_size"] == 16
    assert {r["rule"] for r in data["rules"]} >= {"ep-size", "pp-needs-vpp"}


def test_plan_refusal_exits_1_and_lists_violations(capsys):
    code = main(["plan", "--set", "model.mtp_num_layers=2", "--set", "model.recompute_granularity=selective",
                 "--set", "model.recompute_modules=[moe]"])
    out = capsys.readouterr().out
    assert code == 1 and "REFUSED" in out and "mtp-layers" in out and "moe-recompute" in out


def test_plan_resolve_auto_fixes(capsys):
    assert main(["plan", "--set", "model.mtp_num_layers=2", "--resolve", "auto"]) == 0
    assert "set by resolve: mtp-layers" in capsys.readouterr().out


def test_plan_for_another_gpu(capsys):
    assert main(["plan", "--recipe", "deepseek_v3", "--gpu", "gb200", "--num-gpus", "1024"]) == 1
    assert "fell back from deepep to alltoall" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["plan", "--recipe", "nope"], "unknown recipe 'nope'"),
        (["plan", "--gpu", "x100"], "invalid choice: 'x100'"),
        (["plan", "--dispatcher", "magic"], "invalid choice: 'magic'"),
        (["plan", "--set", "novalue"], "malformed override 'novalue'"),
        (["plan", "--num-gpus", "0"], "--num-gpus"),
        (["nosuch"], "invalid choice: 'nosuch'"),
    ],
)
def test_bad_input_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as excinfo:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err.strip()
    assert excinfo.value.code == 2 and needle in err and len(err.splitlines()) == 1


def test_doctor_block(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in ("megatron-core     : 0.19.2", "megatron-bridge   : 0.6.2", "transformer-engine: missing",
                "deep_ep           : missing", "GPUs              : none visible", "NVSHMEM", "import shims"):
        assert key in out
    assert "deepep    NOT usable" in out


def test_doctor_is_one_fenced_block_with_this_packages_version(capsys):
    """The whole block a user pastes into an issue sits inside the fence, this package's version first."""
    from mbridge_ep_overlap import __version__

    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "```" and lines[-1] == "```" and lines.count("```") == 2, lines
    assert lines[2].startswith(f"mbridge-ep-overlap: {__version__} (")
    assert any(line.startswith("  auto      ->") for line in lines[1:-1])


def test_the_dataset_makefile_script_closes_the_gap_doctor_reports(tmp_path, monkeypatch):
    """doctor's fix for the wheel's missing datasets Makefile is the script setup_env.sh runs; after it
    the gap is gone (the folder of a fake megatron.core.datasets stands in for site-packages)."""
    import importlib.util
    import subprocess
    from pathlib import Path
    from types import SimpleNamespace

    from mbridge_ep_overlap.tools import doctor

    repo = Path(__file__).resolve().parents[2]
    ds = tmp_path / "megatron" / "core" / "datasets"
    ds.mkdir(parents=True)
    (ds / "helpers_cpp.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(submodule_search_locations=[str(ds)]))
    gap = doctor.dataset_helpers_gap()
    assert gap is not None and f"bash scripts/dataset_makefile.sh {ds}" in gap
    subprocess.run(["bash", str(repo / "scripts/dataset_makefile.sh"), str(ds)], check=True, timeout=30)
    assert doctor.dataset_helpers_gap() is None and "default:" in (ds / "Makefile").read_text()
    setup = (repo / "scripts/setup_env.sh").read_text()
    assert "scripts/dataset_makefile.sh" in setup and "printf" not in setup


def test_recipes_listing(capsys):
    assert main(["recipes"]) == 0
    assert "qwen3_moe_proxy" in capsys.readouterr().out


def test_plan_for_a_cluster_the_batch_does_not_fit(capsys):
    assert main(["plan", "--gpu", "gb200", "--num-gpus", "64"]) == 1
    out = capsys.readouterr().out
    assert "global-batch-divisible" in out and "Traceback" not in out


def test_upstream_refusal_without_a_rule_is_reported_cleanly(capsys):
    # MCore's own check, not an EP-overlap rule: padding to capacity needs a capacity factor.
    code = main(["plan", "--set", "model.moe_pad_expert_input_to_capacity=true"])
    out = capsys.readouterr().out
    assert code == 1 and "Megatron-Bridge finalize refused the config" in out and "Traceback" not in out


@pytest.mark.parametrize("override,code,shown", [
    (None, 0, "env CUDA_DEVICE_MAX_CONNECTIONS=32  (default: set in cfg.env_vars)"),
    ("env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8", 0, "env CUDA_DEVICE_MAX_CONNECTIONS=8  (set by an override: what the run gets"),
    ("env_vars.CUDA_DEVICE_MAX_CONNECTIONS=1", 1, "[error] cuda-device-max-connections: CUDA_DEVICE_MAX_CONNECTIONS=1"),
    ("env_vars.CUDA_DEVICE_MAX_CONNECTIONS=abc", 1, "cuda-device-max-connections-value"),
    ("env_vars.CUDA_DEVICE_MAX_CONNECTIONS=64", 1, "cuda-device-max-connections-value"),
    ("env_vars.CUDA_DEVICE_MAX_CONNECTIONS=0", 1, "cuda-device-max-connections-value"),
], ids=["plan's", "8", "1", "abc", "64", "0"])
def test_plan_shows_the_environment_the_run_gets(override, code, shown, capsys):
    """An override after the plan set CUDA_DEVICE_MAX_CONNECTIONS=32: the plan shows the value the run
    gets, never the 32 it replaced; 1 (it serialises the all-to-all) and a value outside CUDA's 1..32 are
    refused naming it."""
    argv = ["plan", "--no-predict"] + (["--set", override] if override else [])
    assert main(argv) == code
    out = capsys.readouterr().out
    assert shown in out, out[-3000:]
    if override:
        assert "CUDA_DEVICE_MAX_CONNECTIONS=32  (default: set in cfg.env_vars)" not in out
