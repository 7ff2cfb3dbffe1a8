"""Peak memory per GPU (``predict.memory``) and the rules that read it (``core/rules/memory.py``):
the parts move the way Megatron-Core's memory does, the impossible configs are refused with the
numbers, and the memory check rows (docs/prediction.md) are the computed ones. CPU only; real MB
configs, described targets."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from mbridge_ep_overlap.core.engine import check_ep_overlap
from mbridge_ep_overlap.core.prediction_inputs import from_config, grad_reduce_in_fp32, memory_options
from mbridge_ep_overlap.base.errors import Severity
from mbridge_ep_overlap.pipeline import build, finalize
from mbridge_ep_overlap.predict import Cluster, StepInputs
from mbridge_ep_overlap.predict.memory import MemoryOptions, predict_memory, te_cublas_workspaces
from mbridge_ep_overlap.runtime.flags import spec_from_args
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.offline import offline_architectures
from mbridge_ep_overlap.tools.run import parse_args


def _moe(**kw) -> StepInputs:
    base = dict(num_layers=48, hidden_size=2048, num_attention_heads=32, num_query_groups=4, kv_channels=128,
                seq_length=4096, micro_batch_size=1, num_moe_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768,
                vocab_size=151936, ep=16, dp=16, num_microbatches=64)
    base.update(kw)
    return StepInputs(**base)


H100_16 = Cluster(gpu="h100", num_gpus=16)


def _mem(inputs=None, cluster=H100_16, **opts):
    return predict_memory(inputs or _moe(), cluster, MemoryOptions(**opts))


def test_overlap_adds_one_layer_and_early_release_takes_its_attention_back():
    # the first of 4 pipeline stages (no logits there): 4 microbatches of 12 layers, plus one layer
    m = _mem(_moe(pp=4, dp=4, ep=4))
    assert m.stage == "first" and m.parts_on["activations"] > m.parts_off["activations"]
    layer = m.parts_off["activations"] / (4 * 12)
    assert m.parts_on["activations"] - m.parts_off["activations"] == pytest.approx(layer, rel=1e-9)
    early = _mem(_moe(pp=4, dp=4, ep=4), early_attn_release=True)
    assert m.parts_off["activations"] < early.parts_on["activations"] < m.parts_on["activations"]
    assert _mem(_moe(pp=4, dp=4, ep=4), delay_wgrad=True).parts_on["activations"] > m.parts_on["activations"]
    assert {k: v for k, v in m.parts_off.items() if k != "activations"} == \
        {k: v for k, v in m.parts_on.items() if k != "activations"}


def test_overlap_extra_layer_and_the_logits_are_never_held_together():
    # on the stage with the loss, combined 1F1B frees the backward microbatch's logits before the layer
    # pairs and makes the forward microbatch's logits after them: overlap costs max(0, layer - logits)
    small_vocab = _mem(_moe(vocab_size=1024))
    big_vocab = _mem()
    layer = small_vocab.parts_off["activations"] / 48
    assert small_vocab.parts_on["activations"] - small_vocab.parts_off["activations"] == pytest.approx(
        layer - small_vocab.parts_on["logits"], rel=1e-9)
    assert big_vocab.parts_on["logits"] > big_vocab.parts_off["activations"] / 48
    assert big_vocab.parts_on["activations"] == big_vocab.parts_off["activations"]


def test_distributed_optimizer_divides_the_state_by_the_data_parallel_groups():
    dense_dp = _mem(_moe(ep=8), distributed_optimizer=True)  # experts: 2 replicas over 16 GPUs
    full = _mem(_moe(ep=8), distributed_optimizer=False)
    assert full.parts_off["optimizer"] > dense_dp.parts_off["optimizer"] > full.parts_off["optimizer"] / 16
    assert full.parts_off["parameters"] == dense_dp.parts_off["parameters"]
    assert _mem(_moe(grad_reduce_in_fp32=False)).parts_off["gradients"] == pytest.approx(_mem().parts_off["gradients"] / 2)
    assert _mem(optimizer_offload_fraction=1.0).parts_off["optimizer"] == 0
    # the precision-aware optimizer with BF16 moments: FP32 master weights + two BF16 moments, 8 bytes
    cfg = NS(model=NS(), ddp=NS(use_distributed_optimizer=True), optimizer=NS(
        use_precision_aware_optimizer=True, main_params_dtype="torch.float32", exp_avg_dtype="torch.bfloat16",
        exp_avg_sq_dtype="torch.bfloat16"), comm_overlap=None, mixed_precision=None)
    assert memory_options(cfg).optimizer_state_bytes == 8
    assert _mem(optimizer_state_bytes=8).parts_off["optimizer"] == pytest.approx(_mem().parts_off["optimizer"] * 8 / 12)


def test_recompute_and_fp8_hold_fewer_activations():
    base = _mem().parts_off["activations"]
    assert _mem(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1).parts_off[
        "activations"] < base / 10
    sel = _mem(recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"))
    assert sel.parts_off["activations"] < base
    assert _mem(_moe(gemm_precision="fp8_tensorwise")).parts_off["activations"] < base
    # unfused (local) attention keeps the [s, s] scores: quadratic in the sequence
    local = _mem(_moe(transformer_impl="local")).parts_off["activations"]
    assert local > base and _mem(_moe(transformer_impl="local", seq_length=8192, num_microbatches=32)).parts_off[
        "activations"] > 3 * local


def test_pipeline_stages_hold_the_warmup_microbatches():
    pp1 = _mem(_moe(dp=4, ep=4, pp=4))
    vpp = _mem(_moe(dp=4, ep=4, pp=4, vpp=3))
    assert pp1.stage in ("first", "last") and vpp.parts_on["activations"] > vpp.parts_off["activations"]
    # PP 4 without VPP: 4 microbatches of a quarter of the layers on the first stage = one microbatch of all
    one = _mem(_moe(dp=16, ep=16)).parts_off["activations"]
    assert pp1.parts_off["activations"] == pytest.approx(one, rel=0.35)


def test_dispatcher_buffers_only_for_the_flex_backends():
    assert _mem().parts_off["dispatcher_buffers"] == 0
    deepep = _mem(_moe(dispatcher="deepep")).parts_off["dispatcher_buffers"]
    hybrid = _mem(_moe(dispatcher="hybridep")).parts_off["dispatcher_buffers"]
    assert 0.05 < deepep < 4 and 0.05 < hybrid < 4
    one_domain = _mem(_moe(dispatcher="deepep", dp=8, ep=8), Cluster(gpu="h100", num_gpus=8)).parts_off[
        "dispatcher_buffers"]
    assert one_domain < deepep  # no RDMA buffer inside one NVLink domain
    assert _mem(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",)).parts_on["cuda_graphs"] > 0


def test_transformer_engine_holds_its_cublas_workspaces_and_the_local_stack_none():
    # TE 2.18: one workspace for general_gemm, one per compute stream (4) for te.GroupedLinear, 3 more for
    # userbuffers GEMMs; 32 MiB + 1 KiB each from compute capability 9.0 on, 4 MiB before
    mib = 2 ** 20
    te = _mem(_moe(), grouped_gemm=True).parts_off["cublas_workspaces"] * 2 ** 30
    assert te == 5 * (32 * mib + 1024)
    assert _mem(_moe()).parts_off["cublas_workspaces"] * 2 ** 30 == 32 * mib + 1024
    ub = _mem(_moe(tp=2, dp=8), grouped_gemm=True, tp_comm_overlap=True).parts_off["cublas_workspaces"] * 2 ** 30
    assert ub == 8 * (32 * mib + 1024)
    a100 = te_cublas_workspaces(_moe(), Cluster(gpu="a100", num_gpus=16), MemoryOptions(grouped_gemm=True))
    assert a100 == 5 * 4 * mib
    assert _mem(_moe(transformer_impl="local"), grouped_gemm=True).parts_off["cublas_workspaces"] == 0

def test_lines_and_dict_say_the_totals():
    m = _mem()
    text = "\n".join(m.lines())
    assert f"{m.total_off:.1f} GiB off / {m.total_on:.1f} GiB on of 80 GiB" in text
    d = m.to_dict()
    assert d["total_on_gib"] == m.total_on and d["capacity_gib"] == 80.0
    assert m.total_on > m.allocated_on + m.parts_on["fixed"]


def test_options_read_from_a_config():
    cfg = NS(model=NS(recompute_granularity="selective", recompute_modules=["moe_act"], cuda_graph_impl="none",
                      ep_overlap_early_attn_memory_release=True, share_embeddings_and_output_weights=False),
             ddp=NS(use_distributed_optimizer=True, grad_reduce_in_fp32=False),
             optimizer=NS(optimizer_cpu_offload=False), comm_overlap=NS(overlap_moe_expert_parallel_comm=True,
                                                                        delay_wgrad_compute=True),
             mixed_precision="bf16_mixed")
    o = memory_options(cfg)
    assert (o.distributed_optimizer, grad_reduce_in_fp32(cfg), o.recompute_modules, o.overlap, o.early_attn_release,
            o.delay_wgrad) == (True, False, ("moe_act",), True, True, True)


# --- the rules on real configs ---------------------------------------------------------------------
def _violations(cfg, gpu, n):
    return {v.rule_id: v for v in check_ep_overlap(cfg, environment=describe(gpu, n, te_version="", deep_ep_version=None))}


def test_ten_billion_experts_on_16_h100_refused_with_the_numbers(proxy_cfg):
    proxy_cfg.model.num_moe_experts = 10**10
    proxy_cfg.train.global_batch_size = 64
    found = _violations(proxy_cfg, "h100", 16)
    assert set(found) == {"fits-in-gpu-memory"}
    v = found["fits-in-gpu-memory"]
    assert v.severity is Severity.ERROR and "h100 has 80 GiB" in v.current
    gib = float(v.current.split("predicted ")[1].split(" GiB")[0])
    assert gib > 1e6 and "parameters" in v.current and "optimizer" in v.current


def test_sequence_of_ten_million_on_2_h200_refused_with_the_numbers(proxy_cfg):
    proxy_cfg.model.seq_length = 10**7
    proxy_cfg.dataset.seq_length = 10**7
    found = _violations(proxy_cfg, "h200", 2)
    assert set(found) == {"fits-in-gpu-memory"}
    v = found["fits-in-gpu-memory"]
    assert "activations" in v.current and "h200 has 141 GiB" in v.current
    assert float(v.current.split("predicted ")[1].split(" GiB")[0]) > 1e5


def test_the_proxy_fits_and_no_memory_rule_fires(proxy_cfg):
    assert not {"fits-in-gpu-memory", "gpu-memory-headroom"} & set(_violations(proxy_cfg, "h200", 2))


@pytest.mark.parametrize("layout,pp", [("Et|(tt|)*30mL", 8), ("Ettt|(tt|)*29,m|L", 8), ("E(t|)*4tL", 5)])
def test_layout_chunks_read_the_layout_as_megatron_core_does(layout, pp):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from mbridge_ep_overlap.predict.memory import layout_chunks

    real = PipelineParallelLayerLayout(layout, pp).layout
    letters = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    assert layout_chunks(layout, pp) == [["".join(letters[t.name] for t in chunk) for chunk in row] for row in real]
    with pytest.raises(ValueError, match="stages for PP"):
        layout_chunks(layout, 7)


def test_the_peak_is_the_stage_with_the_most_layers_in_flight():
    # DeepSeek-V3's H100 layout: the first stage has the embedding and one layer in its first chunk,
    # the middle stages two layers per chunk and more warm-up microbatches than the later stages
    ds = _moe(num_layers=61, num_dense_layers=3, mtp_num_layers=1, tp=2, pp=8, vpp=4, ep=64, dp=64,
              num_microbatches=64, num_moe_experts=256)
    cluster = Cluster(gpu="h100", num_gpus=1024)
    laid = predict_memory(ds, cluster, MemoryOptions(pipeline_layout="Et|(tt|)*30mL"))
    even = predict_memory(ds, cluster, MemoryOptions())
    # stage 2 holds more warm-up forwards, but two of its layers are the lighter dense ones
    assert laid.stage == "3 of 8"
    assert laid.parts_off["activations"] != even.parts_off["activations"]
    # without VPP: rank r holds pp - r microbatches; the last stage one, plus the logits
    plain = predict_memory(_moe(pp=4, num_layers=48), H100_16, MemoryOptions())
    assert plain.stage == "first"


MEMORY_EVIDENCE = "docs/evidence/2026-12-01-h200x1-predict/memory.json"


def _measured_config(row: dict, versions: dict):
    """The config a memory row ran: its ``run_script.py`` arguments (recipe, sizes, overlap, overrides) built
    and finalized as ``run_script.py`` does, for the described target (2x H200, the row's TE version). The
    finalized fields must be the ones the row recorded: a row is predicted from what it measured."""
    te = versions.get("transformer_engine", "")
    target = describe("h200", 2, te_version="" if te == "not installed" else te, deep_ep_version=None)
    with offline_architectures():
        built = build(spec_from_args(parse_args(row["args"])), target=target)
        summary = finalize(built).summary
    # the launcher exports CUDA_DEVICE_MAX_CONNECTIONS itself; every other recorded field must match
    recorded = {k: v for k, v in row["finalized"].items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    assert {k: summary.get(k) for k in recorded} == recorded, row["name"]
    assert built.cfg.model.transformer_impl == row["transformer_impl"], row["name"]
    return built.cfg


def memory_table() -> list[str]:
    """The memory check rows of docs/prediction.md: each measured peak against the prediction for the
    config the row ran (``_measured_config``)."""
    root = Path(__file__).parents[2]
    data = json.loads((root / MEMORY_EVIDENCE).read_text())
    out = ["| row | stack | recipe | measured GiB/rank | predicted GiB | error |", "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        cfg = _measured_config(row, data["versions"])
        opts = memory_options(cfg)
        p = predict_memory(from_config(cfg, 2), Cluster(gpu="h200", num_gpus=2), opts)
        pred, meas = (p.allocated_on if opts.overlap else p.allocated_off), max(row["peak_gib_per_rank"])
        recipe = row["args"][row["args"].index("--recipe") + 1]
        out.append(f"| {row['variant']} | {row['stack']} | `{recipe}` | {meas:.2f} | {pred:.2f} | "
                   f"{100 * (pred / meas - 1):+.1f}% |")
    return out


def test_memory_table_in_the_docs_is_the_computed_one():
    doc = (Path(__file__).parents[2] / "docs/prediction.md").read_text()
    table = memory_table()
    assert "\n".join(table) in doc, "regenerate: " + "\n".join(table)
    # every row, both stacks, within 10% of the measured peak
    errors = [float(line.split("|")[6].strip(" %")) for line in table[2:]]
    assert len(errors) == 7 and all(abs(e) <= 10 for e in errors), errors
