"""resolve='auto' finds a virtual pipeline for pp-needs-vpp (``core.pipeline_split``): a VPP the
recipe's split accepts, or a layout of PP x VPP stages MCore accepts, or the reason none exists;
MB 0.6.2's own H100 DeepSeek-V3 and Qwen3-235B-A22B recipes then pass MB's real finalize."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mbridge_ep_overlap.core import pipeline_split
from mbridge_ep_overlap.tools import cli


def _model(num_layers, pp, **fields):
    base = dict(num_layers=num_layers, pipeline_model_parallel_size=pp, pipeline_model_parallel_layout=None,
                virtual_pipeline_model_parallel_size=None, mtp_num_layers=None,
                num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
                account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False)
    return SimpleNamespace(**{**base, **fields})


DSV3_PP16 = [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder", "mtp", "loss"]]

# model -> the edits resolve='auto' makes (None: none exists), and words the choice must contain
ROWS = [
    (_model(8, 2), {"model.virtual_pipeline_model_parallel_size": 2}, "divides evenly"),
    (_model(12, 2), {"model.virtual_pipeline_model_parallel_size": 2}, "divides evenly"),
    (_model(9, 3), {"model.virtual_pipeline_model_parallel_size": 3}, "divides evenly"),
    # Qwen3-235B-A22B's split: 94 layers + embedding + loss over PP 16 -> 6 a rank, VPP 2
    (_model(94, 16, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
     {"model.virtual_pipeline_model_parallel_size": 2}, "VPP 2"),
    (_model(10, 2, num_layers_in_first_pipeline_stage=4, num_layers_in_last_pipeline_stage=6),
     {"model.virtual_pipeline_model_parallel_size": 2}, "VPP 2"),
    # DeepSeek-V3's PP 16 layout (61 decoders, MTP, loss): 32 stages of two layers each
    (_model(61, 16, mtp_num_layers=1, pipeline_model_parallel_layout=DSV3_PP16),
     {"model.pipeline_model_parallel_layout": "Et|(tt|)*30mL", "model.virtual_pipeline_model_parallel_size": 2},
     "layout Et|(tt|)*30mL"),
    (_model(61, 16, mtp_num_layers=1, pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL"),
     {"model.pipeline_model_parallel_layout": "Et|(tt|)*30mL", "model.virtual_pipeline_model_parallel_size": 2},
     "layout"),
    # 7 layers over PP 2: no even VPP; a layout of 4 stages (9 layers with embedding and loss) is
    (_model(7, 2), {"model.pipeline_model_parallel_layout": "Et|t*3|tt|tL",
                    "model.virtual_pipeline_model_parallel_size": 2}, "the recipe's split has none: VPP 2-8"),
    (_model(4, 4), None, "no virtual pipeline for PP 4 and 4 layers: VPP 2-8: 4 layers not divisible by PP 4 x VPP; "
                         "a layout of VPP 2-8: fewer layers than stages"),
]


@pytest.mark.parametrize("model,edits,words", ROWS, ids=[f"row{i}" for i in range(len(ROWS))])
def test_choose(model, edits, words):
    split = pipeline_split.choose(model)
    if edits is None:
        assert split.edits == []
    else:
        assert {k: v for k, v in split.edits if k in edits} == edits, split.edits
    assert words in split.words, split.words


@pytest.mark.parametrize("layers,mtp,pp,vpp", [(61, 1, 16, 2), (61, 1, 8, 4), (94, 0, 16, 2), (27, 1, 4, 3), (7, 0, 2, 2)])
def test_every_layout_made_is_one_mcore_accepts(layers, mtp, pp, vpp):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    text, why = pipeline_split.layout_for(layers, mtp, pp, vpp)
    assert text is not None, why
    parsed = PipelineParallelLayerLayout(text, pp)
    parsed.validate_layer_layout(num_layers=layers, mtp_num_layers=mtp or None)
    assert parsed.virtual_pipeline_model_parallel_size == vpp
    sizes = [len(stage) for stage in PipelineParallelLayerLayout.parse_str_to_list(text)]
    assert max(sizes) - min(sizes) <= 1  # balanced, embedding and loss one layer each


H100_RECIPES = [
    ("megatron.bridge.recipes.deepseek.h100.deepseek_v3:deepseek_v3_pretrain_1024gpu_h100_bf16_config", "Et|(tt|)*30mL"),
    ("megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", None),
]


@pytest.mark.parametrize("recipe,layout", H100_RECIPES, ids=["deepseek_v3_1024gpu_h100", "qwen3_235b_256gpu_h100"])
def test_mb_h100_recipes_plan_with_resolve_auto(recipe, layout, capsys):
    assert cli.main(["plan", "--no-predict", "--recipe", recipe]) == 1  # refused as they are: pp-needs-vpp
    assert "pp-needs-vpp" in capsys.readouterr().out
    assert cli.main(["plan", "--no-predict", "--json", "--recipe", recipe, "--resolve", "auto"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["finalized"]["virtual_pipeline_model_parallel_size"] == 2  # after MB's real finalize
    assert data["finalized_sources"]["virtual_pipeline_model_parallel_size"] == "set by resolve"
    changed = {c["path"]: c for c in data["plan"]["changes"]}
    assert changed["model.virtual_pipeline_model_parallel_size"]["source"] == "set by resolve"
    assert (changed.get("model.pipeline_model_parallel_layout") or {}).get("new") == layout


def test_no_virtual_pipeline_says_what_was_tried(capsys):
    flags = ["plan", "--no-predict", "--num-gpus", "8", "--pp", "4", "--ep", "2", "--resolve", "auto"]
    assert cli.main(flags) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("REFUSED") and "[error] pp-needs-vpp" in out
    assert "no virtual pipeline for PP 4 and 4 layers: VPP 2-8:" in out and "lower pipeline_model_parallel_size" in out
