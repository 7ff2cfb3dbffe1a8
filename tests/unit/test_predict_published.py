"""Published Megatron-Bridge rows against the step-time model (predict.published, docs/prediction.md).

Each row's NVIDIA perf recipe is built as ``mbridge-ep-overlap plan --recipe MODULE:FUNCTION`` builds
it (the library's pipeline, the target described and simulated, the recipe's own EP-overlap setting
unless the row's source states another), checked to have the published layout, and predicted with
``core.prediction.for_config``. The generated table in docs/prediction.md must be the computed one.
``python tests/unit/test_predict_published.py`` prints the section to paste.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.predict import published as pub

DOC = Path(__file__).parents[2] / "docs" / "prediction.md"


def _build(recipe: str, gpu: str, num_gpus: int, overlap: bool | None):
    """(finalized ConfigContainer, target) of ``recipe`` as ``plan`` builds it."""
    from mbridge_ep_overlap import RunSpec, build
    from mbridge_ep_overlap.pipeline import finalize
    from mbridge_ep_overlap.spec import TargetSpec, resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    if overlap is None:  # the recipe's own setting
        with simulate(describe(gpu, num_gpus)):
            cfg = resolve_recipe(recipe).config(None)
        overlap = bool(cfg.comm_overlap and cfg.comm_overlap.overlap_moe_expert_parallel_comm)
    built = build(RunSpec(recipe=recipe, target=TargetSpec(gpu=gpu, num_gpus=num_gpus), ep_overlap=overlap))
    finalize(built)
    return built.cfg, built.target


def _layout(cfg) -> dict:
    m, t = cfg.model, cfg.train
    return {"gbs": t.global_batch_size, "mbs": t.micro_batch_size, "seq": m.seq_length,
            "tp": m.tensor_model_parallel_size, "pp": m.pipeline_model_parallel_size, "cp": m.context_parallel_size,
            "vp": m.virtual_pipeline_model_parallel_size, "ep": m.expert_model_parallel_size}


def predicted_rows() -> tuple[dict, dict]:
    """({row id: Predicted}, {row id: the built config's layout})."""
    from mbridge_ep_overlap.core.prediction import for_config

    predicted, layouts = {}, {}
    for r in pub.ROWS:
        cfg, target = _build(r.recipe, r.gpu, r.num_gpus, r.overlap)
        predicted[r.id] = pub.Predicted.of(for_config(cfg, target), bool(cfg.model.overlap_moe_expert_parallel_comm))
        layouts[r.id] = _layout(cfg)
    return predicted, layouts


def section(checks) -> str:
    return "\n\n".join([pub.markdown_table(checks), pub.markdown_summary(checks), pub.markdown_excluded()])


@pytest.fixture(scope="module")
def built():
    return predicted_rows()


def test_rows_parse_from_their_text_and_step_is_tokens_over_throughput():
    row = next(r for r in pub.ROWS if r.tokens_per_s_per_gpu)
    cells = [c.strip() for c in row.source["row"].strip("|").split("|")]
    assert cells[1] == str(row.num_gpus) and cells[-2] == str(row.tokens_per_s_per_gpu)
    assert row.published_step_s == pytest.approx(row.layout["gbs"] * row.layout["seq"]
                                                 / (row.tokens_per_s_per_gpu * row.num_gpus))
    with pytest.raises(ValueError, match="cells"):
        pub.parse_row(row.source["header"], "| DGX-H100 | 16 |")
    assert len({r.id for r in pub.ROWS}) == len(pub.ROWS)
    assert all(r.source.get("row") or r.source.get("pull") for r in pub.ROWS)


def test_check_rows_are_never_calibration_inputs():
    import ast

    pkg = Path(pub.__file__).parent
    for path in pkg.glob("*.py"):
        if path.name == "published.py":
            continue
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m.split(".")[-1] == "published"}, f"{path.name} imports the check rows"
        assert "published.json" not in path.read_text(), f"{path.name} reads the check rows"


def test_every_recipe_has_the_published_layout(built):
    _, layouts = built
    for r in pub.ROWS:
        assert layouts[r.id] == r.layout, (r.id, layouts[r.id], r.layout)


def test_excluded_rows_really_differ_from_their_recipe():
    for e in pub.EXCLUDED:
        row = pub.parse_row(e["header"], e["row"])
        cfg, _ = _build(e["recipe"], row["gpu"], row["num_gpus"], None)
        got = _layout(cfg)
        for k, v in e["recipe_has"].items():
            assert got[k] == v and row[k] == e["row_has"][k] != v, (e["recipe"], k, got[k], row[k])


def test_doc_table_is_the_computed_one(built):
    predicted, _ = built
    text = DOC.read_text()
    m = re.search(r"<!-- published-table:start -->\n(.*?)\n<!-- published-table:end -->", text, re.S)
    assert m, "docs/prediction.md lacks the published-table section"
    computed = section(pub.check(pub.ROWS, predicted))
    assert m.group(1).strip() == computed, "regenerate (python tests/unit/test_predict_published.py):\n" + computed


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    predicted, _ = predicted_rows()
    sys.stdout.write(section(pub.check(pub.ROWS, predicted)) + "\n")
