"""GEMM precision, Blackwell hardware and what the model does not represent (``predict.precision``,
``hardware.json``, ``core.prediction.unmodelled`` / ``hybrid_layers``). CPU only; MB's own
mixed-precision table is the reference for reading recipe names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from mbridge_ep_overlap.predict import Cluster, StepInputs, predict
from mbridge_ep_overlap.predict import precision as prec
from mbridge_ep_overlap.core.prediction import CannotPredict, for_config, hybrid_layers, unmodelled
from mbridge_ep_overlap.core.prediction_inputs import gemm_precision
from mbridge_ep_overlap.predict.costs import a2a_cost, default_calibration, layer_costs

HW = json.loads((Path(prec.__file__).parent / "hardware.json").read_text())


def _moe(**kw) -> StepInputs:
    base = dict(num_layers=8, hidden_size=4096, num_attention_heads=64, num_query_groups=4, kv_channels=128,
                seq_length=4096, micro_batch_size=1, num_moe_experts=128, moe_router_topk=8, moe_ffn_hidden_size=1536,
                vocab_size=151936, ep=32, dp=64, num_microbatches=16)
    base.update(kw)
    return StepInputs(**base)


def _registered_names() -> list[str]:
    from megatron.bridge.training import mixed_precision as mp

    table = next(v for k, v in vars(mp).items() if isinstance(v, dict) and "bf16_mixed" in v)
    return sorted(table)


@pytest.mark.parametrize("name", _registered_names())
def test_recipe_names_read_as_mb_builds_them(name):
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    assert prec.of_name(name) == prec.of_fields(get_mixed_precision_config(name))


def test_mxfp8_recipe_is_not_bf16():
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    cfg = NS(mixed_precision=get_mixed_precision_config("bf16_with_mxfp8_mixed"), model=NS())
    assert gemm_precision(cfg) == "mxfp8"
    assert gemm_precision(NS(mixed_precision="bf16_with_fp8_subchannel_scaling_mixed", model=NS())) == "fp8_blockwise"
    assert gemm_precision(NS(mixed_precision=None, model=NS(bf16=True, fp8="hybrid", fp8_recipe="delayed"))) == \
        "fp8_delayed"
    assert gemm_precision(NS(mixed_precision=None, model=NS())) is None


def test_low_precision_gemms_run_at_their_peak_and_send_bf16():
    gb200 = Cluster(gpu="gb200", num_gpus=64)
    cal = default_calibration()
    bf16, mx = _moe(), _moe(gemm_precision="mxfp8")
    c_bf, c_mx = layer_costs(bf16, gb200, cal), layer_costs(mx, gb200, cal)
    assert c_mx.expert_f < c_bf.expert_f and c_mx.attn_f < c_bf.attn_f
    assert c_mx.head_f == c_bf.head_f  # the output layer stays BF16
    # what is sent does not change: MCore 0.19.2's dispatchers send BF16 tokens
    assert a2a_cost(mx, gb200, cal).bytes_total == a2a_cost(bf16, gb200, cal).bytes_total
    assert a2a_cost(bf16, gb200, cal).bytes_total == bf16.tokens_per_gpu * 8 * 4096 * prec.A2A_BYTES
    assert predict(mx, gb200).off_step_s < predict(bf16, gb200).off_step_s
    nv = predict(_moe(gemm_precision="nvfp4"), gb200)
    assert nv.off_step_s < predict(mx, gb200).off_step_s


def test_blackwell_formats_refused_on_hopper_by_name():
    with pytest.raises(ValueError, match="H100.*no mxfp8 Tensor Cores"):
        predict(_moe(gemm_precision="mxfp8"), Cluster(gpu="h100", num_gpus=64))
    with pytest.raises(ValueError, match="gemm_precision 'int4'"):
        _moe(gemm_precision="int4")


def test_blackwell_kinds_are_distinct_with_sources():
    gpus = HW["gpus"]
    assert {"b200", "b300", "gb200", "gb300"} <= set(gpus)
    numbers = ("bf16_dense_tflops", "fp8_dense_tflops", "fp4_dense_tflops", "hbm_TBps", "nvlink_GBps_bidir",
               "nic_gbit_s", "attention_speedup")
    assert [gpus["gb300"][k] for k in numbers] != [gpus["gb200"][k] for k in numbers]
    for key, spec in gpus.items():
        for k in numbers:
            if spec.get(k) not in (None, 1.0) or k != "attention_speedup":
                assert k in spec["sources"] or k == "attention_speedup", f"{key}.{k} has no source"
    # GB300 predicted faster than GB200 on the same MXFP8 job (faster FP8 peak, faster attention)
    mx = _moe(gemm_precision="mxfp8")
    assert predict(mx, Cluster(gpu="gb300", num_gpus=64)).off_step_s < predict(mx, Cluster(gpu="gb200", num_gpus=64)).off_step_s
    for name, row in HW["precisions"].items():
        if name in prec.LOW:
            assert row["provisional"] is ("measured" not in row), f"{name}: provisional exactly when not measured"


def test_b300_target_is_predicted():
    cp = for_config(_cfg(), NS(gpu_name="NVIDIA B300 SXM6 AC", world_size=16, gpus_per_node=8, nvlink_domain_size=8))
    assert cp.cluster.gpu == "b300" and cp.confidence.startswith("provisional")


def _cfg(**model):
    base = dict(num_layers=8, hidden_size=2048, num_attention_heads=32, num_query_groups=4, kv_channels=128,
                seq_length=4096, num_moe_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768, vocab_size=151936,
                expert_model_parallel_size=16, moe_token_dispatcher_type="alltoall", transformer_impl="transformer_engine")
    base.update(model)
    return NS(model=NS(**base), train=NS(micro_batch_size=1, global_batch_size=256), ddp=NS(overlap_grad_reduce=True),
              dataset=NS(create_attention_mask=False), mixed_precision="bf16_mixed")


H100 = NS(gpu_name="NVIDIA H100 80GB HBM3", world_size=16, gpus_per_node=8, nvlink_domain_size=8)


def test_hybrid_mamba_models_are_refused_with_the_reason():
    pattern = "M-M-M-M*-M-M-M-EM-M*-"
    with pytest.raises(CannotPredict, match=r"hybrid Mamba model .*9 Mamba, 2 attention, 1 MoE, 9 MLP.*never counted as attention"):
        for_config(_cfg(hybrid_layer_pattern=pattern), H100)
    assert hybrid_layers(_cfg(hybrid_override_pattern="*-*-E")) is None  # no Mamba layer: a transformer


def test_what_is_not_modelled_is_said_and_lowers_confidence():
    plain = for_config(_cfg(), H100)
    assert plain.not_modelled == () and plain.confidence.startswith("validated")
    cfg = _cfg(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router"], recompute_granularity="selective",
               recompute_modules=["moe_act", "moe"], moe_shared_expert_overlap=True)  # moe_act's replay is costed
    cp = for_config(cfg, H100)
    text = "\n".join(cp.lines())
    for needle in ("CUDA graphs", "selective recompute of ['moe']", "moe_shared_expert_overlap"):
        assert f"not modelled        : {needle}" in text or needle in text
    assert cp.confidence.startswith("low") and "confidence          : low" in text
    assert len(unmodelled(cfg, cp.inputs, cp.cluster.gpu)) == 3
    mx = for_config(_cfg(), NS(**{**vars(H100), "gpu_name": "NVIDIA GB200", "world_size": 16}))
    assert mx.confidence.startswith("provisional") and "gb200" in mx.confidence
    d = cp.to_dict()
    assert d["confidence"] == cp.confidence and len(d["not_modelled"]) == 3 and "total_on_gib" in d["memory"]


def test_attention_sinks_are_said_not_measured_on_te_layers_only():
    sinks = for_config(_cfg(softmax_type="learnable"), H100)
    assert [n for n in sinks.not_modelled if n.startswith("softmax_type=learnable (attention sinks)")]
    assert sinks.confidence.startswith("low")
    assert for_config(_cfg(softmax_type="vanilla"), H100).not_modelled == ()
    local = _cfg(softmax_type="learnable", transformer_impl="local")
    assert not [n for n in for_config(local, H100).not_modelled if "softmax_type" in n]


def test_measured_fp8_efficiencies_are_the_ones_the_evidence_gives():
    """The FP8 rows' relative_efficiency re-derived from the 2026-12-01 1x H200 GEMM measurements."""
    evidence = Path(__file__).parents[2] / "docs/evidence/2026-12-01-h200x1-predict/gemm.json"
    rows = [r for r in json.loads(evidence.read_text())["rows"] if r["status"] == "ok"]
    key = lambda r: (r["model"], r["op"], r["direction"])  # noqa: E731
    bf16 = {key(r): r["seconds"] for r in rows if r["precision"] == "bf16"}
    h200 = HW["gpus"]["h200"]
    measured = [name for name, row in HW["precisions"].items() if isinstance(row, dict) and "measured" in row]
    assert sorted(measured) == ["fp8_blockwise", "fp8_delayed", "fp8_tensorwise"]
    for name in measured:
        mine = [r for r in rows if r["precision"] == name]
        assert len(mine) == 24 and all(key(r) in bf16 for r in mine)
        speedup = sum(bf16[key(r)] for r in mine) / sum(r["seconds"] for r in mine)
        derived = speedup * h200["bf16_dense_tflops"] / h200["fp8_dense_tflops"]
        assert HW["precisions"][name]["relative_efficiency"] == pytest.approx(derived, abs=0.0005), name


def test_te_gemm_size_curve_is_the_one_the_evidence_gives():
    """hardware.json's te_gemm_efficiency re-derived from the 2026-12-01 1x H200 BF16 TE GEMM rows: the
    least-squares fit in log time of e_max x (1 - exp(-d / d0)), d = (M N K)^(1/3) per call (a grouped
    GEMM: per local expert), on the grid the stated values lie on."""
    import math

    from mbridge_ep_overlap.predict.costs import te_gemm_efficiency

    evidence = Path(__file__).parents[2] / "docs/evidence/2026-12-01-h200x1-predict/gemm.json"
    rows = [r for r in json.loads(evidence.read_text())["rows"]
            if r["status"] == "ok" and r["precision"] == "bf16" and r["op"] != "attention"]
    assert len(rows) == 24
    peak = HW["gpus"]["h200"]["bf16_dense_tflops"] * 1e12
    pts = [((r["tokens"] / r.get("groups", 1) * r["in_features"] * r["out_features"]) ** (1 / 3), r["seconds"],
            r["flops"]) for r in rows]

    def loss(e_max: float, d0: float) -> float:
        return sum((math.log(f / (peak * e_max * (1 - math.exp(-d / d0)))) - math.log(t)) ** 2 for d, t, f in pts)

    best = min(((loss(e / 1000, d0), e / 1000, d0) for e in range(500, 1001, 5) for d0 in range(100, 8000, 20)))
    curve = HW["te_gemm_efficiency"]
    assert (curve["e_max"], curve["d0"]) == (best[1], best[2])
    assert math.sqrt(best[0] / len(pts)) < 0.16  # the stated rms error per row
    # the function the cost model uses is that curve (flops per call = 2 M N K)
    for d, t, f in pts[:4]:
        groups = f / (2 * d ** 3)
        assert te_gemm_efficiency(f / groups) == pytest.approx(curve["e_max"] * (1 - math.exp(-d / curve["d0"])))


ATTENTION_EVIDENCE = ("docs/evidence/2026-12-01-h200x1-predict/gemm.json",
                      "docs/evidence/2026-12-02-h200x1-fp8-attention/attention.json")


def test_te_attention_curve_is_the_one_the_evidence_gives():
    """hardware.json's te_attention_efficiency re-derived from the BF16 fused-attention rows measured on
    1x H200 (two days, three layer shapes): d0 by least squares in log time over the forward rows with
    e_max the TE GEMM ceiling, backward_factor the geometric mean of backward / forward time."""
    import math

    from mbridge_ep_overlap.predict.costs import te_attention_efficiency

    rows = [r for path in ATTENTION_EVIDENCE for r in json.loads((Path(__file__).parents[2] / path).read_text())["rows"]
            if r.get("op") == "attention" and r.get("precision") == "bf16" and r["status"] == "ok"]
    fwd = [(r["flops"], r["seconds"]) for r in rows if r["direction"] == "forward"]
    assert len(fwd) == 6
    peak = HW["gpus"]["h200"]["bf16_dense_tflops"] * 1e12
    e_max = HW["te_gemm_efficiency"]["e_max"]

    def loss(d0: float) -> float:
        return sum((math.log(f / (peak * e_max * (1 - math.exp(-((f / 2) ** (1 / 3)) / d0)))) - math.log(t)) ** 2
                   for f, t in fwd)

    best = min((loss(d0), d0) for d0 in range(100, 40000, 20))
    curve = HW["te_attention_efficiency"]
    assert curve["d0"] == best[1]
    assert math.sqrt(best[0] / len(fwd)) < 0.065  # the stated rms error per row (6.4%)
    ratios = []
    for path in ATTENTION_EVIDENCE:
        got = [r for r in json.loads((Path(__file__).parents[2] / path).read_text())["rows"]
               if r.get("op") == "attention" and r.get("precision") == "bf16" and r["status"] == "ok"]
        t = {(r["model"], r["direction"]): r["seconds"] for r in got}
        ratios += [t[(m, "backward")] / t[(m, "forward")] for m, d in t if d == "forward"]
    assert len(ratios) == 6
    assert curve["backward_factor"] == round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 2)
    for f, _ in fwd:
        assert te_attention_efficiency(f) == pytest.approx(e_max * (1 - math.exp(-((f / 2) ** (1 / 3)) / curve["d0"])))


def test_te_layers_cost_core_attention_at_the_measured_curve(monkeypatch):
    """The TE attention node's core attention is its causal FLOPs at te_attention_efficiency of the
    layer's full-attention call; its backward is backward_factor x that: raising the factor by one adds
    exactly the forward core time to the backward node. A sliding window shortens the FLOPs, not the rate."""
    from mbridge_ep_overlap.predict import costs
    from mbridge_ep_overlap.predict.costs import te_attention_efficiency

    i = _moe(transformer_impl="transformer_engine")
    cluster = Cluster(gpu="h200", num_gpus=64)
    cal = default_calibration()
    base = layer_costs(i, cluster, cal)
    curve = dict(costs.hardware()["te_attention_efficiency"])
    hw = dict(costs.hardware())
    monkeypatch.setattr(costs, "hardware", lambda: {**hw, "te_attention_efficiency": {**curve,
                                                                                      "backward_factor": curve["backward_factor"] + 1}})
    raised = layer_costs(i, cluster, cal)
    core = 4 * i.tokens_per_gpu * i.seq_length * i.num_attention_heads * i.kv_channels * 0.5
    peak = HW["gpus"]["h200"]["bf16_dense_tflops"] * 1e12
    assert raised.attn_b - base.attn_b == pytest.approx(core / (peak * te_attention_efficiency(core)), rel=1e-9)
    assert raised.attn_f == base.attn_f
    # a sliding window on every layer: the FLOPs shrink (window + a partly masked key tile), the rate is the
    # full-attention call's
    windowed = _moe(transformer_impl="transformer_engine", attention_window=127, windowed_layers=8)
    w_raised = layer_costs(windowed, cluster, cal)  # backward_factor + 1 still in force
    monkeypatch.setattr(costs, "hardware", lambda: hw)
    w_base = layer_costs(windowed, cluster, cal)
    w_core = 4 * i.tokens_per_gpu * (127 + 1 + 128) * i.num_attention_heads * i.kv_channels
    assert w_raised.attn_b - w_base.attn_b == pytest.approx(w_core / (peak * te_attention_efficiency(core)), rel=1e-9)


def test_fp8_attention_factor_is_the_one_the_evidence_gives():
    """hardware.json's fp8_attention time_factor re-derived from the 2026-12-02 1x H200 attention rows: FP8 over
    BF16 seconds, summed over the shapes both ran, forward and backward; every FP8 row ran cuDNN's FP8 fused
    attention (TE's sub-backend 2), never a fallback."""
    evidence = Path(__file__).parents[2] / "docs/evidence/2026-12-02-h200x1-fp8-attention/attention.json"
    data = json.loads(evidence.read_text())
    assert data["device"]["capability"] == "9.0" and data["versions"]["transformer_engine"] == "2.18.0"
    rows = [r for r in data["rows"] if r["status"] == "ok"]
    key = lambda r: (r["model"], r["direction"])  # noqa: E731
    bf16 = {key(r): r["seconds"] for r in rows if r["precision"] == "bf16"}
    fp8 = {key(r): r["seconds"] for r in rows if r["precision"] == "fp8_delayed"}
    assert all("FusedAttention backend (sub-backend 2)" in r["backend"] for r in rows if r["precision"] != "bf16")
    both = sorted(set(bf16) & set(fp8))
    assert len(both) == 4
    factor = sum(fp8[k] for k in both) / sum(bf16[k] for k in both)
    assert HW["fp8_attention"]["time_factor"] == pytest.approx(factor, abs=0.0005)
    assert "h200" in HW["fp8_attention"]["gpus"]


def test_fp8_attention_is_costed_where_measured_and_named_where_not():
    h200, gb200 = Cluster(gpu="h200", num_gpus=64), Cluster(gpu="gb200", num_gpus=64)
    cal = default_calibration()
    plain, fp8 = _moe(gemm_precision="fp8_delayed"), _moe(gemm_precision="fp8_delayed", fp8_attention=True)
    a, b = layer_costs(plain, h200, cal), layer_costs(fp8, h200, cal)
    assert b.attn_f > a.attn_f and b.attn_b > a.attn_b  # slower on H200, as measured
    assert layer_costs(_moe(gemm_precision="mxfp8", fp8_attention=True), gb200, cal).attn_f == \
        layer_costs(_moe(gemm_precision="mxfp8"), gb200, cal).attn_f
    cfg = _cfg(fp8_dot_product_attention=True)
    cfg.mixed_precision = "bf16_with_mxfp8_mixed"
    gb = for_config(cfg, NS(**{**vars(H100), "gpu_name": "NVIDIA GB200", "world_size": 16}))
    assert gb.inputs.fp8_attention and any(line.startswith("fp8_dot_product_attention") for line in gb.not_modelled)
    assert gb.confidence.startswith("low")
    cfg = _cfg(fp8_dot_product_attention=True)
    cfg.mixed_precision = "bf16_with_fp8_delayed_scaling_mixed"
    hop = for_config(cfg, H100)
    assert hop.inputs.fp8_attention and not any("fp8_dot_product_attention" in line for line in hop.not_modelled)
    bf = for_config(_cfg(fp8_dot_product_attention=True), H100)  # no FP8 recipe: TE keeps attention in BF16
    assert not bf.inputs.fp8_attention


def test_fp8_attention_flag_is_read_from_the_mixed_precision_config_and_only_delayed_is_measured():
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    mp = get_mixed_precision_config("bf16_with_mxfp8_mixed")
    mp.fp8_dot_product_attention = True
    cfg = _cfg()
    cfg.mixed_precision = mp
    gb = for_config(cfg, NS(**{**vars(H100), "gpu_name": "NVIDIA GB200", "world_size": 16}))
    assert gb.inputs.fp8_attention and any(line.startswith("fp8_dot_product_attention") for line in gb.not_modelled)
    cfg = _cfg(fp8_dot_product_attention=True)
    cfg.mixed_precision = "bf16_with_fp8_current_scaling_mixed"  # TE 2.18 has no FP8 attention for it on Hopper
    cur = for_config(cfg, H100)
    assert cur.inputs.fp8_attention and any("fp8_dot_product_attention" in line for line in cur.not_modelled)
