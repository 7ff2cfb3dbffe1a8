"""diagnose.state_dict_shapes: torch's own load_state_dict size-mismatch text, raised here on small modules whose
parameter names are Megatron-Core's, read by part, dimension and factor."""

from __future__ import annotations

import io

import torch

from mbridge_ep_overlap.diagnose import state_dict_shapes
from mbridge_ep_overlap.diagnose.engine import diagnose


def _model(vocab: int, ffn: int, experts_ffn: int, heads_dim: int) -> torch.nn.Module:
    root = torch.nn.Module()
    root.embedding = torch.nn.Module()
    root.embedding.word_embeddings = torch.nn.Embedding(vocab, 8)
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.linear_fc1 = torch.nn.Linear(8, ffn, bias=False)
    layer.mlp.experts = torch.nn.Module()
    layer.mlp.experts.linear_fc2 = torch.nn.Linear(experts_ffn, 8, bias=False)
    layer.self_attention = torch.nn.Module()
    layer.self_attention.linear_qkv = torch.nn.Linear(8, heads_dim, bias=False)
    root.decoder = torch.nn.ModuleList([layer])
    return root


def _load_error(saved: torch.nn.Module, model: torch.nn.Module) -> str:
    try:
        model.load_state_dict(saved.state_dict())
    except RuntimeError as e:
        return f"RuntimeError: {e}"
    raise AssertionError("no mismatch")


def test_each_part_is_named_with_its_dimension_and_factor():
    text = _load_error(_model(vocab=64, ffn=32, experts_ffn=48, heads_dim=24), _model(vocab=16, ffn=16, experts_ffn=12,
                                                                                      heads_dim=20))
    assert "size mismatch for embedding.word_embeddings.weight" in text  # torch's words
    d = diagnose(["-"], stdin=io.BytesIO(text.encode()))
    top = d.findings[0]
    assert d.cause_ids[0] == "state-dict-shape"
    cause = top.signature.cause
    assert "4 tensor(s) differ" in cause
    assert "the padded vocabulary differs" in cause and "one side is a 4-way tensor-parallel shard" in cause
    assert "a gated FC1 (SwiGLU / GLU" in cause  # 32 saved, 16 in the model on FC1's output
    assert "in the MoE experts' FC2 (first: decoder.0.mlp.experts.linear_fc2.weight, dimension 1: 48 saved, 12 in " \
           "the model (the saved is 4x the other): a tensor split 4 ways" in cause
    assert "ratio 6/5" in cause  # QKV 24 against 20: another size, no split


def test_a_tensor_of_another_rank_is_another_layout():
    m = state_dict_shapes.Mismatch("-:1", "decoder.layers.0.mlp.experts.weight1", (8, 16, 4), (128, 4))
    assert "another layout of the tensor" in state_dict_shapes._reason(m)


def test_megatron_cores_distributed_checkpoint_mismatch_is_a_config_size_not_a_split():
    from pathlib import Path

    from megatron.core.dist_checkpointing.strategies import torch as dist_torch

    src = Path(dist_torch.__file__).read_text()
    assert "f'Global shape mismatch for loaded ({loaded_shape})'" in src
    assert "f' and expected ({expected_shape}) tensor'" in src and "f' for key {sh_ten.key}'" in src
    loaded, expected, key = torch.Size([64, 2048]), (128, 2048), "decoder.layers.mlp.router.weight"
    text = f"CheckpointingException: Global shape mismatch for loaded ({loaded}) and expected ({expected}) tensor for key {key}\n"
    top = diagnose(["-"], stdin=io.BytesIO(text.encode())).findings[0]
    assert top.signature.id == "state-dict-shape"
    assert "dimension 0: 64 saved, 128 in the model (the model's is 2x the other)" in top.signature.cause
    assert "the same under any parallel layout" in top.signature.cause and "split 2 ways" not in top.signature.cause


def test_odd_shapes_are_left_unread_not_raised_on():
    for text in ("size mismatch for w: copying a param with shape torch.Size([1 2]) from checkpoint, the shape in "
                 "current model is torch.Size([3]).",
                 "size mismatch for w: copying a param with shape torch.Size([" + "9" * 5000 + "]) from checkpoint, the "
                 "shape in current model is torch.Size([3]).",
                 "Global shape mismatch for loaded (torch.Size([" + "9" * 5000 + "])) and expected ((3,)) tensor for key k"):
        d = diagnose(["-"], stdin=io.BytesIO(text.encode()))
        assert "state-dict-shape" not in d.cause_ids


def test_a_global_vocabulary_mismatch_is_not_called_a_shard_and_shared_experts_are_named_apart():
    vocab = state_dict_shapes.Mismatch("-:1", "embedding.word_embeddings.weight", (32000, 8), (128000, 8), whole=True)
    assert "padded vocabulary" in state_dict_shapes._reason(vocab) and "shard" not in state_dict_shapes._reason(vocab)
    shared = state_dict_shapes.Mismatch("-:1", "decoder.layers.0.mlp.shared_experts.linear_fc1.weight", (8, 4), (4, 4))
    assert shared.part == ("the shared experts' FC1", "fc1")
