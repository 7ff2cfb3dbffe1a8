"""HybridEP's bandwidth inside the NVLink domain from its published table (predict.costs.hybridep_published):
read from hardware.json as stated there, interpolated between published rank counts, the end value outside
them, GB300 / B300 through the kinds they name, Hopper left to the assumed efficiency."""

from __future__ import annotations

import pytest

from mbridge_ep_overlap.predict import Cluster, StepInputs, predict
from mbridge_ep_overlap.predict.costs import a2a_cost, default_calibration, hardware, hybridep_published

TABLE = hardware()["flex_dispatchers"]["hybridep"]


def _mean(kind: str, i: int) -> float:
    t = TABLE["published_algbw_GBps"][kind]
    return (t["dispatch_bf16"][i] + t["combine"][i]) / 2


def test_a_published_rank_count_gives_its_figure_without_the_own_share():
    t = TABLE["published_algbw_GBps"]["gb200"]
    for i, ranks in enumerate(t["ranks"]):
        bw, how = hybridep_published("gb200", ranks)
        assert bw == pytest.approx(_mean("gb200", i) * (ranks - 1) / ranks)
        assert f"at {ranks} ranks" in how


def test_between_two_counts_it_is_linear_and_outside_the_end_value():
    r = TABLE["published_algbw_GBps"]["gb200"]["ranks"]
    mid = (r[0] + r[1]) // 2
    bw, how = hybridep_published("gb200", mid)
    t = (mid - r[0]) / (r[1] - r[0])
    assert bw == pytest.approx((_mean("gb200", 0) + t * (_mean("gb200", 1) - _mean("gb200", 0))) * (mid - 1) / mid)
    assert "between" in how
    bw64, how64 = hybridep_published("gb200", 64)
    assert bw64 == pytest.approx(_mean("gb200", -1) * 63 / 64) and "used for 64 EP peers" in how64


def test_kinds_without_a_table_use_the_one_they_name_and_hopper_none():
    for kind, named in TABLE["published_for"].items():
        if kind == "why":
            continue
        assert hybridep_published(kind, 8)[0] == pytest.approx(hybridep_published(named, 8)[0])
        assert f"{kind} has none published" in hybridep_published(kind, 8)[1]
    assert hybridep_published("h100", 8) is None and hybridep_published("h200", 8) is None
    assert hybridep_published("gb200", 1) is None


def test_the_all_to_all_uses_it_and_the_prediction_says_so():
    inputs = StepInputs(hidden_size=4096, num_layers=4, num_attention_heads=32, num_query_groups=4, kv_channels=128,
                        ffn_hidden_size=0,
                        moe_ffn_hidden_size=1536, num_moe_experts=128, moe_router_topk=8, seq_length=4096,
                        micro_batch_size=1, num_microbatches=8, ep=8, dp=8, dispatcher="hybridep")
    cluster = Cluster(gpu="gb200", num_gpus=8)
    a2a = a2a_cost(inputs, cluster, default_calibration())
    assert a2a.seconds > a2a.bytes_intra / (hybridep_published("gb200", 8)[0] * 1e9)
    assert a2a.seconds == pytest.approx(a2a.bytes_intra / (hybridep_published("gb200", 8)[0] * 1e9)
                                        + hardware()["links"]["nvlink"]["latency_s"])
    notes = predict(inputs, cluster).notes
    assert any(n.startswith("hybridep inside the NVLink domain: published HybridEP gb200") for n in notes)
    h100 = predict(inputs, Cluster(gpu="h100", num_gpus=8)).notes
    assert not any(n.startswith("hybridep inside") for n in h100)
