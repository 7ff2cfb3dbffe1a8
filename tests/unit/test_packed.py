"""Packed (THD) sequences under EP overlap, on CPU with the real Megatron-Bridge code.

* ``recipes.packed``'s synthetic dataset yields what MB 0.6.2's ``get_batch_from_iterator`` /
  ``get_packed_seq_params`` turn into THD ``PackedSeqParams``, deterministically, with distinct
  data-parallel shards through MB's own sampler;
* through MB's real ``_forward_step_common`` / ``get_batch`` (CPU tensors, a model stand-in that
  records its calls): MB's stock overlapped step builds the schedule plan *without*
  ``packed_seq_params``; ``mbridge_ep_overlap.forward_step`` passes exactly what the normal path
  gives the model;
* ``build`` refuses the packed recipe with MB's stock forward step (rule
  ``packed-sequences-forward-step``) and accepts it with ours; MB's finalize accepts it and enforces
  micro_batch_size 1.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace as NS

import pytest
import torch

from mbridge_ep_overlap import RunSpec, build
from mbridge_ep_overlap.pipeline import finalize
from mbridge_ep_overlap.base.errors import EPOverlapError, UpstreamRefusal
from mbridge_ep_overlap.core.facts import feeds_packed_sequences
from mbridge_ep_overlap.core.forward_step import forward_step as our_forward_step
from mbridge_ep_overlap_recipes.packed import (
    PACKED_SEQ_LENGTH,
    SyntheticPackedDataset,
    SyntheticPackedDatasetProvider,
    qwen3_moe_proxy_packed,
)

RECIPE = "qwen3_moe_proxy_packed"
RULE = "packed-sequences-forward-step"


@pytest.fixture(scope="module")
def built():
    return build(RunSpec(recipe=RECIPE))


@pytest.fixture(scope="module")
def provider(built):
    return built.cfg.dataset


def mb_loader(dataset, dp_rank=0, dp_size=2, consumed=0):
    """The train loader MB builds for this dataset (``single``: MegatronPretrainingSampler), CPU."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    return build_pretraining_data_loader(
        dataset, consumed, "single", 1, 0, True, collate_fn=dataset.collate_fn, pin_memory=False,
        persistent_workers=False, data_parallel_rank=dp_rank, data_parallel_size=dp_size, global_batch_size=8)


def train_dataset(provider, samples=16):
    """Through MB's own dispatch: ``get_dataset_provider`` -> the DatasetProvider protocol adapter."""
    from megatron.bridge.data.utils import get_dataset_provider

    train, valid, test = get_dataset_provider(provider)([samples, 0, 0], provider)
    assert valid is None and test is None
    return train


# ---- the recipe ---------------------------------------------------------------------------------
def test_recipe_is_the_te_proxy_on_packed_rows(built):
    cfg = built.cfg
    assert isinstance(cfg.dataset, SyntheticPackedDatasetProvider)
    assert cfg.model.transformer_impl == "transformer_engine"  # THD attention needs TE
    assert cfg.model.seq_length == cfg.dataset.seq_length == PACKED_SEQ_LENGTH
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size) == (1, 8)
    assert cfg.model.expert_model_parallel_size == 2 and cfg.model.context_parallel_size == 1
    assert not cfg.model.mtp_num_layers
    assert cfg.dataset.dataloader_type == "single"
    assert built.plan is not None and cfg.comm_overlap.overlap_moe_expert_parallel_comm is True


def test_recipe_declares_that_it_feeds_packed_sequences(built):
    from megatron.bridge.training.gpt_step import _uses_packed_sequence_metadata

    assert feeds_packed_sequences(built.cfg) is True  # the packed rules are checked, not "n/a"
    assert _uses_packed_sequence_metadata(built.cfg) is True  # MB agrees (middle PP stages load the metadata)
    assert {RULE, "packed-sequences-mtp"} <= set(built.report.passed)  # checked and passed, not "not checked"


def test_mb_finalize_accepts_it_for_two_h200(built):
    b = copy.deepcopy(built)
    s = finalize(b).summary
    assert s["overlap_moe_expert_parallel_comm"] is True
    assert (s["micro_batch_size"], s["num_microbatches"], s["data_parallel_size"]) == (1, 4, 2)
    assert s["seq_length"] == PACKED_SEQ_LENGTH
    assert b.cfg.dataset.offline_packing_specs.packed_sequence_size == PACKED_SEQ_LENGTH


def test_mb_refuses_micro_batch_size_above_one():
    b = build(RunSpec(recipe=RECIPE, micro_batch_size=2, global_batch_size=16))
    with pytest.raises(UpstreamRefusal, match="Micro batch size should be 1"):
        finalize(b)


def test_seq_length_flag_resizes_the_rows():
    b = build(RunSpec(recipe=RECIPE, seq_length=1024))
    finalize(b)
    assert b.cfg.dataset.seq_length == b.cfg.model.seq_length == 1024
    assert b.cfg.dataset.offline_packing_specs.packed_sequence_size == 1024
    row = b.cfg.dataset.dataset(1)[0]
    assert row["tokens"].shape == (1024,) and int(row["cu_seqlens_q"][-1]) == 1024


def test_config_round_trips_through_mb_yaml(built, tmp_path):
    path = tmp_path / "packed.yaml"
    built.cfg.to_yaml(str(path))
    text = path.read_text()
    assert "SyntheticPackedDatasetProvider" in text and "enable_offline_packing: true" in text


# ---- the dataset ----------------------------------------------------------------------------------
def test_rows_follow_the_thd_contract(provider):
    ds = train_dataset(provider)
    assert isinstance(ds, SyntheticPackedDataset) and len(ds) == 16
    s = provider.seq_length
    for i in range(len(ds)):
        b = SyntheticPackedDataset.collate_fn([ds[i]])
        for key in ("tokens", "labels", "position_ids"):
            assert b[key].shape == (1, s) and b[key].dtype == torch.int64, key
        assert b["loss_mask"].shape == (1, s) and b["loss_mask"].dtype == torch.float32
        cu = b["cu_seqlens_q"]
        assert cu.dtype == torch.int32 and cu.dim() == 2 and cu.shape[0] == 1
        assert torch.equal(cu, b["cu_seqlens_kv"])
        cu = cu[0].long()
        assert int(cu[0]) == 0 and int(cu[-1]) == s  # whole row, no padding
        lengths = (cu[1:] - cu[:-1]).tolist()
        assert all(n >= 1 for n in lengths)
        assert all(provider.min_doc_length <= n <= provider.max_doc_length for n in lengths[:-1])
        assert b["max_seqlen_q"].shape == (1, 1) and b["max_seqlen_q"].dtype == torch.int32
        assert int(b["max_seqlen_q"]) == int(b["max_seqlen_kv"]) == max(lengths)
        pos = b["position_ids"][0]
        assert torch.equal(pos, torch.cat([torch.arange(n) for n in lengths]))  # restart in every document
        zeros = (b["loss_mask"][0] == 0).nonzero().flatten()
        assert torch.equal(zeros, cu[1:] - 1)  # exactly each document's last token
        assert torch.equal(b["tokens"][0, 1:], b["labels"][0, :-1])
        tokens = b["tokens"][0]
        assert int(tokens.min()) >= 1 and int(tokens.max()) <= provider.vocab_size - 2
        for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):  # each document speaks its own small topic
            assert len(set(tokens[a:e].tolist())) <= provider.topic_size


def test_document_lengths_vary_widely(provider):
    ds = train_dataset(provider, samples=32)
    lengths = []
    for i in range(len(ds)):
        cu = ds[i]["cu_seqlens_q"].long()
        lengths += (cu[1:] - cu[:-1]).tolist()[:-1]
    assert min(lengths) < 64 and max(lengths) > 400
    assert 4 <= len(lengths) / len(ds) <= 16  # ~8 documents per 2048-token row


def test_same_seed_same_data_other_seed_other_data(provider):
    a, b = train_dataset(provider), train_dataset(copy.deepcopy(provider))
    for i in (0, 5, 15):
        for key, value in a[i].items():
            assert torch.equal(value, b[i][key]), key
    other = copy.deepcopy(provider)
    other.seed += 1
    assert not torch.equal(train_dataset(other)[0]["tokens"], a[0]["tokens"])
    assert not torch.equal(a[0]["tokens"], a[1]["tokens"])


def test_data_parallel_shards_are_distinct_through_mb_sampler(provider):
    ds = train_dataset(provider)
    seen = {}
    for rank in (0, 1):
        rows = [b["tokens"] for _, b in zip(range(4), mb_loader(ds, dp_rank=rank))]  # 4 microbatches of step 1
        seen[rank] = rows
    for x in seen[0]:
        assert not any(torch.equal(x, y) for y in seen[1])
    again = [b["tokens"] for _, b in zip(range(4), mb_loader(ds, dp_rank=0))]
    assert all(torch.equal(x, y) for x, y in zip(seen[0], again))


def test_mb_builds_thd_packed_seq_params_from_a_batch(provider):
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward, get_batch_from_iterator
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from megatron.core.packed_seq_params import PackedSeqParams

    ds = train_dataset(provider)
    with cpu_cuda():
        batch = get_batch_from_iterator(iter(mb_loader(ds)), is_first_pp_stage=True, is_last_pp_stage=True)
    assert batch.get("attention_mask") is None  # TE builds the causal mask per document
    params = get_packed_seq_params(_packed_metadata_for_forward(batch))
    assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
    cu = ds[0]["cu_seqlens_q"]
    assert torch.equal(params.cu_seqlens_q, cu) and torch.equal(params.cu_seqlens_kv, cu)
    assert params.cu_seqlens_q.dtype == torch.int32 and params.cu_seqlens_q.dim() == 1
    assert params.cu_seqlens_q_padded is None and params.cu_seqlens_kv_padded is None
    lengths = (cu[1:] - cu[:-1]).tolist()
    assert params.max_seqlen_q == params.max_seqlen_kv == max(lengths) and isinstance(params.max_seqlen_q, int)


# ---- the forward steps through MB's real get_batch ------------------------------------------------
@contextlib.contextmanager
def cpu_cuda():
    """MB moves batch tensors with ``.cuda(non_blocking=True)``: identity on this CPU machine."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """A gloo process group of one (MCore's CP split asks torch.distributed for ranks); torn down after."""
    import torch.distributed as dist

    mine = not dist.is_initialized()
    if mine:
        store = dist.FileStore(str(tmp_path_factory.mktemp("dist") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    if mine:
        dist.destroy_process_group()


class RecordingGPT:
    """Stands in for MCore's GPTModel: records the normal call and ``build_schedule_plan``."""

    def __init__(self, seq_length, group):
        self.config = NS(overlap_moe_expert_parallel_comm=True, mtp_num_layers=None, seq_length=seq_length,
                         is_hybrid_model=False)
        self.pg_collection = NS(pp=group, cp=group, tp=group)
        self.vp_stage = None
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(("forward", kwargs))
        return torch.zeros(1, self.config.seq_length)

    def build_schedule_plan(self, *args, **kwargs):
        self.calls.append(("plan", dict(zip(("input_ids", "position_ids", "attention_mask"), args)) | kwargs))
        return "PLAN"


class _Timers:
    def __call__(self, *a, **k):
        return self

    def start(self):
        pass

    def stop(self):
        pass


class _StragglerTimer:  # used as `with straggler_timer(bdata=True)` and as `with straggler_timer`
    def __call__(self, **k):
        return contextlib.nullcontext()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def one_call(step, built, group, return_schedule_plan):
    """One microbatch through ``step`` on the first batch of rank 0; returns (name, model inputs)."""
    ds = train_dataset(built.cfg.dataset)
    model = RecordingGPT(built.cfg.model.seq_length, group)
    state = NS(cfg=built.cfg, timers=_Timers(), straggler_timer=_StragglerTimer())
    with cpu_cuda():
        out, loss_fn = step(state, iter(mb_loader(ds)), model, return_schedule_plan=return_schedule_plan)
    assert out == "PLAN" if return_schedule_plan else out is not None
    assert callable(loss_fn)
    assert len(model.calls) == 1
    return model.calls[0]


def test_normal_path_gives_the_model_thd_packed_seq_params(built, world_of_one):
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    name, kwargs = one_call(mb_forward_step, built, world_of_one, False)
    assert name == "forward"
    assert kwargs["packed_seq_params"].qkv_format == "thd"


def test_mb_stock_overlapped_step_drops_packed_seq_params(built, world_of_one):
    """The upstream bug (MB 0.6.2): attention would cross document boundaries under overlap."""
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    name, kwargs = one_call(mb_forward_step, built, world_of_one, True)
    assert name == "plan"
    assert kwargs.get("packed_seq_params") is None
    assert kwargs["loss_mask"] is not None and kwargs["labels"] is not None


def test_our_overlapped_step_passes_what_the_normal_path_passes(built, world_of_one):
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    _, normal = one_call(mb_forward_step, built, world_of_one, False)
    name, plan = one_call(our_forward_step, built, world_of_one, True)
    assert name == "plan"
    p, q = plan["packed_seq_params"], normal["packed_seq_params"]
    assert p is not None and p.qkv_format == "thd"
    for key in ("cu_seqlens_q", "cu_seqlens_kv"):
        assert torch.equal(getattr(p, key), getattr(q, key)), key
    assert (p.max_seqlen_q, p.max_seqlen_kv) == (q.max_seqlen_q, q.max_seqlen_kv)
    for key in ("input_ids", "position_ids", "labels"):
        assert torch.equal(plan[key], normal[key]), key
    assert plan["attention_mask"] is None and normal["attention_mask"] is None


def test_pretrain_data_path_feeds_our_steps(built, world_of_one, monkeypatch):
    """What ``pretrain()`` does with the finalized config, on CPU: MB's dataset-provider dispatch with
    its context binding, ``build_train_valid_test_data_iterators`` (sample counts, sampler, a worker
    process, RerunDataIterator), then MB's stock step and ours on those batches."""
    from megatron.bridge.data import loaders
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step
    from megatron.bridge.training.setup import _bind_dataset_provider_context
    from megatron.bridge.training.state import TrainState

    class CpuTorch:  # MB broadcasts its do-train flags from a CUDA tensor
        def __getattr__(self, name):
            return getattr(torch, name)

        def tensor(self, *args, device=None, **kwargs):
            return torch.tensor(*args, **kwargs)

    monkeypatch.setattr(loaders, "torch", CpuTorch())
    b = copy.deepcopy(built)
    finalize(b)
    cfg = b.cfg
    provider = _bind_dataset_provider_context(get_dataset_provider(cfg.dataset), tokenizer=None,
                                              pg_collection=None)
    state = TrainState()
    train_it, valid_it, test_it = loaders.build_train_valid_test_data_iterators(cfg, state, provider, world_of_one)
    assert valid_it is None and test_it is None and state.do_train
    expected = b.cfg.dataset.dataset(cfg.train.train_iters * cfg.train.global_batch_size)
    assert len(expected) == 8 * 20  # train_iters (the recipe's 20) x global_batch_size 8
    model = RecordingGPT(cfg.model.seq_length, world_of_one)
    gstate = NS(cfg=cfg, timers=_Timers(), straggler_timer=_StragglerTimer())
    with cpu_cuda():
        mb_forward_step(gstate, train_it, model, return_schedule_plan=True)
        our_forward_step(gstate, train_it, model, return_schedule_plan=True)
        mb_forward_step(gstate, train_it, model, return_schedule_plan=False)
    (_, stock), (_, ours), (_, normal) = model.calls
    assert stock.get("packed_seq_params") is None
    for i, kwargs in ((1, ours), (2, normal)):  # the sampler's indices 1 and 2 (DP 1)
        assert torch.equal(kwargs["input_ids"][0], expected[i]["tokens"])
        assert torch.equal(kwargs["packed_seq_params"].cu_seqlens_q, expected[i]["cu_seqlens_q"])
    assert torch.equal(stock["input_ids"][0], expected[0]["tokens"])


# ---- the rule ---------------------------------------------------------------------------------------
def test_build_refuses_mb_stock_forward_step_with_packed_sequences():
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    with pytest.raises(EPOverlapError) as e:
        build(RunSpec(recipe=RECIPE), forward_step_func=mb_forward_step)
    assert RULE in {v.rule_id for v in e.value.violations}
    assert RULE in str(e.value)


def test_build_accepts_our_forward_step_and_overlap_off_with_mb_stock():
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    assert build(RunSpec(recipe=RECIPE), forward_step_func=our_forward_step).plan is not None
    assert build(RunSpec(recipe=RECIPE, ep_overlap=False), forward_step_func=mb_forward_step).plan is None


def test_recipe_function_builds_directly():
    from mbridge_ep_overlap.target.offline import offline_architectures

    with offline_architectures():
        cfg = qwen3_moe_proxy_packed()
    assert feeds_packed_sequences(cfg) is True


# ---- the GPU proof's own code, dry on CPU ------------------------------------------------------------
def _load(path: str, name: str):
    import importlib.util
    from pathlib import Path

    file = Path(__file__).resolve().parents[2] / path
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stock_step_launcher_trains_with_mb_stock_step_after_recording_the_refusal(monkeypatch, tmp_path):
    """``tests/functional/packed_stock_step.py`` up to MB's ``pretrain()`` (faked: no GPU here)."""
    import megatron.bridge.training.pretrain as mb_pretrain
    from megatron.bridge.training import gpt_step

    import importlib

    from mbridge_ep_overlap.core import enforcement
    from mbridge_ep_overlap.core.facts import passes_packed_seq_params
    from mbridge_ep_overlap.spec import TargetSpec

    build_module = importlib.import_module("mbridge_ep_overlap.pipeline")
    launcher = _load("tests/functional/packed_stock_step.py", "packed_stock_step")
    real_resolve = build_module.resolve_target
    # this machine has no GPU or TE: describe the recipe's own target (2x H200, TE 2.18) instead of probing
    monkeypatch.setattr(build_module, "resolve_target", lambda spec, recipe: real_resolve(
        spec.replace(target=TargetSpec()), recipe))
    seen = {}

    def fake_pretrain(cfg, forward_step_func, callbacks=None):
        seen.update(cfg=cfg, step=forward_step_func, callbacks=callbacks, checked=enforcement._CHECKED.get())

    monkeypatch.setattr(mb_pretrain, "pretrain", fake_pretrain)
    monkeypatch.setenv("EP_OVERLAP_EVIDENCE", "0")  # no faulthandler / watchdog thread inside the test process
    argv = ["--recipe", RECIPE, "--ep", "2", "--max-steps", "8", "--micro-batch-size", "1", "--global-batch-size", "8",
            "--ep-overlap", "on", "--dispatcher", "alltoall",
            "--output-dir", str(tmp_path), "--summary-json", str(tmp_path / "summary.json")]
    assert launcher.main(argv) == 0
    step = seen["step"]
    assert step.__wrapped__ is gpt_step.forward_step and not passes_packed_seq_params(step)
    assert seen["cfg"].comm_overlap.overlap_moe_expert_parallel_comm is True
    assert isinstance(seen["cfg"].dataset, SyntheticPackedDatasetProvider)
    assert seen["checked"] is not None and seen["checked"][0] == id(seen["cfg"])  # finalize reuses the build's check
    recorder = seen["callbacks"][0]
    assert RULE in recorder.meta["refused_with_mb_stock_step"]
    assert recorder.meta["forward_step"] == "megatron.bridge.training.gpt_step.forward_step"
    assert str(recorder.summary_path) == str(tmp_path / "summary.json")
    bare = [a for i, a in enumerate(argv) if a != "--summary-json" and argv[i - 1] != "--summary-json"]
    assert launcher.main(bare + ["--dryrun"]) == 2  # the launcher only trains


def test_gpu_proof_writes_its_loss_table(monkeypatch, tmp_path):
    """The evidence writer and the assertions of ``test_packed_sequences_gpu.py`` on made-up summaries."""
    from pathlib import Path

    from mbridge_ep_overlap.lab.launch import Run

    gpu = _load("tests/functional/test_packed_sequences_gpu.py", "packed_gpu_proof")
    monkeypatch.setattr(gpu, "LOG_ROOT", tmp_path)
    steps, mbs = gpu.STEPS, gpu.MICROBATCHES
    off = [10.6, 10.6, 10.3, 9.5, 8.9, 8.5, 8.3, 8.2][:steps]

    def summary(losses, overlap, extra=None):
        plans = steps * mbs if overlap else 0
        return {
            # the keys a real RunRecorder summary has (evidence.summarize): no microbatch count of its own
            "finalized": {"overlap_moe_expert_parallel_comm": overlap, "micro_batch_size": 1,
                          "global_batch_size": mbs * gpu.NPROC, "tensor_model_parallel_size": 1,
                          "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                          "seq_length": 2048, "expert_model_parallel_size": 2},
            "world_size": gpu.NPROC,
            "combined_schedule_calls": {gpu.NO_OVERLAP_PATH: steps if overlap else 0},
            "schedule_plan_calls": plans,
            "steps": [{"iteration": i, "loss": x, "finite": True, "skipped": False} for i, x in enumerate(losses)],
            **(extra or {}),
        }

    def run(name, s):
        folder = Path(tmp_path) / name
        folder.mkdir()
        (folder / "summary.json").write_text(__import__("json").dumps(s))
        return Run(name, 0, False, 1.0, folder, s)

    runs = {
        "off": run("packed_off", summary(off, False)),
        "ours": run("packed_overlap_ours", summary([x * (1 + 1e-4) for x in off], True)),
        "stock": run("packed_overlap_mb_stock", summary([x * 1.08 for x in off], True, {
            "forward_step": "megatron.bridge.training.gpt_step.forward_step",
            "refused_with_mb_stock_step": [RULE]})),
    }
    gpu.write_evidence(runs)
    table = (tmp_path / "packed_losses.md").read_text()
    assert table.count("\n| ") == steps + 1 and "match" in table and "MISMATCH" not in table
    assert {p.name for p in tmp_path.glob("*.summary.json")} == {
        "packed_off.summary.json", "packed_overlap_ours.summary.json", "packed_overlap_mb_stock.summary.json"}
    gpu.test_all_runs_trained_packed_rows(runs)
    gpu.test_reference_really_had_overlap_off(runs)
    for key in ("ours", "stock"):
        gpu.test_overlapped_schedule_executed(runs, key)
    gpu.test_stock_run_used_mb_stock_step_that_our_rule_refuses(runs)
    gpu.test_our_step_matches_overlap_off(runs)
    gpu.test_mb_stock_step_differs_from_overlap_off(runs)
    runs["stock"].summary["steps"] = runs["off"].summary["steps"]  # a stock run that matched would fail the proof
    with pytest.raises(AssertionError):
        gpu.test_mb_stock_step_differs_from_overlap_off(runs)


# ---- finalize inside MB's pretrain() judges the step pretrain() was given -----------------------------
@pytest.mark.parametrize("ours", [False, True], ids=["mb-stock-step", "our-step"])
def test_pretrain_finalize_judges_the_step_it_was_given(monkeypatch, ours):
    """The README pattern: ``enable_ep_overlap(cfg)`` without naming the step, then MB's real
    ``pretrain(cfg, step)``; its ``runtime_config_update`` refuses MB's stock step with packed data.
    Only the training loop after finalize is faked (no GPU here)."""
    import megatron.bridge.training.pretrain as mb_pretrain
    from megatron.bridge.training.gpt_step import forward_step as mb_forward_step

    from mbridge_ep_overlap import enable_ep_overlap
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.offline import offline_architectures
    from mbridge_ep_overlap.target.simulate import simulate

    target = describe("h200", 2, te_version="2.18.0")
    trained = []
    monkeypatch.setattr(mb_pretrain, "_pretrain", lambda **kw: trained.append(kw["forward_step_func"]))
    with offline_architectures(), simulate(target):
        cfg = qwen3_moe_proxy_packed()
        enable_ep_overlap(cfg, environment=target)
        step = our_forward_step if ours else mb_forward_step
        if ours:
            mb_pretrain.pretrain(cfg, step)
            assert trained == [step]
        else:
            with pytest.raises(EPOverlapError) as e:
                mb_pretrain.pretrain(cfg, step)
            assert RULE in {v.rule_id for v in e.value.violations} and trained == []


# ---- "does this run feed packed batches" answers as MB 0.6.2's own _uses_packed_sequence_metadata --
@pytest.mark.parametrize("offline,in_batch,size", [
    (True, False, 1024), (True, False, None), (True, False, 0), (True, False, -1), (False, True, None),
    (False, False, 1024),
])
def test_feeds_packed_sequences_matches_mb(built, offline, in_batch, size):
    from megatron.bridge.training.gpt_step import _uses_packed_sequence_metadata

    cfg = copy.deepcopy(built.cfg)
    cfg.dataset.enable_offline_packing, cfg.dataset.enable_in_batch_packing = offline, in_batch
    cfg.dataset.offline_packing_specs.packed_sequence_size = size
    if offline or in_batch:
        assert feeds_packed_sequences(cfg) is _uses_packed_sequence_metadata(cfg)
    else:  # MB says no; this recipe's own provider (synthetic THD rows) may emit cu_seqlens: unknown
        assert _uses_packed_sequence_metadata(cfg) is False and feeds_packed_sequences(cfg) is None
