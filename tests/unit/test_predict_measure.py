"""The GPU measurement script's CPU-testable parts: its usage, the shapes and runs it measures, and the
reader of what it writes (scripts/gpu/measure_predict.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "measure_predict.py"


@pytest.fixture(scope="module")
def mp():
    spec = importlib.util.spec_from_file_location("measure_predict", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shell_script_refuses_missing_out_in_one_line():
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu/measure_predict.sh")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "usage" in r.stderr


def test_python_usage_exit_2(mp, capsys):
    assert mp.main(["nonsense", "x.json"]) == 2
    assert mp.main([]) == 2


def test_gemm_without_te_writes_a_skipped_row(mp, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # importing it raises ImportError
    out = tmp_path / "g.json"
    assert mp.main(["gemm", str(out)]) == 0
    data = mp.read_rows(out)
    assert [r["status"] for r in data["rows"]] == ["skipped"]
    assert "Transformer Engine" in data["rows"][0]["why"]


def test_shapes_are_the_local_experts_at_the_recipes_ep(mp):
    shapes = {(s["model"], s["op"]): s for s in mp.gemm_shapes()}
    assert shapes[("qwen3_30b_a3b", "grouped_fc1")]["groups"] == 16  # 128 experts / EP 8
    assert shapes[("deepseek_v3", "grouped_fc2")]["groups"] == 4  # 256 / EP 64
    assert shapes[("qwen3_235b_a22b", "grouped_fc1")]["out_features"] == 2 * 1536  # SwiGLU
    assert shapes[("qwen3_30b_a3b", "attention")]["tokens"] == 4096
    # FP8 GEMMs need every split a multiple of 16 tokens
    for s in shapes.values():
        if s.get("groups"):
            assert s["tokens"] % (16 * s["groups"]) == 0


def test_gpt_oss_attention_is_timed_with_and_without_its_window_and_sinks(mp, monkeypatch):
    rows = [s for s in mp.gemm_shapes() if s["model"] == "gpt_oss_120b" and s["op"] == "attention"]
    assert {(s["window"], s["softmax_type"]) for s in rows} == {(None, "vanilla"), (None, "learnable"),
                                                               (127, "vanilla"), (127, "learnable")}
    assert all(s["head_dim"] == 64 and s["kv_heads"] == 8 for s in rows)
    full, windowed = (next(s for s in rows if s["window"] == w) for w in (None, 127))
    n = 4096  # causal pairs n(n+1)/2; a window of 127 keys before each query keeps at most 128 of them
    assert mp._flops(full) == 2 * n * (n + 1) / 2 * 64 * 128
    assert mp._flops(windowed) == 2 * (128 * 129 / 2 + (n - 128) * 128) * 64 * 128
    monkeypatch.setattr(mp, "SELECTED_MODELS", ("gpt_oss_120b",))
    assert {s["model"] for s in mp.gemm_shapes()} == {"gpt_oss_120b"}


def test_layer_script_usage_exit_2():
    spec = importlib.util.spec_from_file_location("measure_layer", ROOT / "scripts/gpu/measure_layer.py")
    ml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ml)
    assert ml.main(["x.json"]) == 2  # --recipe is required
    assert ml.main(["x.json", "--recipe", "m:f", "--layers", "0"]) == 2
    assert ml.main(["x.json", "--recipe", "no_colon_here"]) == 2  # refused before torch is imported


def test_memory_runs_cover_the_variants(mp):
    names = [r[0] for r in mp.memory_runs(te_ok=True)]
    assert names == ["local-off", "local-overlap", "local-overlap_early_attn_release", "te-off", "te-overlap",
                     "te-overlap_delay_wgrad", "te-overlap_early_attn_release"]
    assert [r[0] for r in mp.memory_runs(te_ok=False)] == names[:3]
    args = dict((r[0], r[3]) for r in mp.memory_runs(te_ok=True))
    assert "--ep" in args["te-off"] and args["te-off"][args["te-off"].index("--ep") + 1] == "2"
    assert "model.ep_overlap_early_attn_memory_release=true" in args["local-overlap_early_attn_release"]


@pytest.mark.parametrize("bad, why", [
    ({"schema": 1, "kind": "gemm", "date": "d", "device": {}, "versions": {}}, "rows"),
    ({"schema": 1, "kind": "other", "date": "d", "device": {}, "versions": {}, "rows": []}, "kind"),
    ({"schema": 1, "kind": "gemm", "date": "d", "device": {}, "versions": {}, "rows": [{"status": "ok"}]}, "lacks"),
    ({"schema": 1, "kind": "memory", "date": "d", "device": {}, "versions": {}, "rows": [{}]}, "status"),
])
def test_reader_refuses_malformed_files(mp, tmp_path, bad, why):
    p = tmp_path / "x.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=why):
        mp.read_rows(p)
