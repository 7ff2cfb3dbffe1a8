"""The TE proxy on packed (THD) sequences from a synthetic packed dataset (needs TE).

``qwen3_moe_proxy_packed()`` is ``proxy.qwen3_moe_proxy_te()`` (TE attention: THD attention needs
Transformer Engine, MCore's local ``DotProductAttention`` refuses packed sequences) fed by
``SyntheticPackedDatasetProvider``: every training sample is one packed row of ``seq_length``
tokens holding whole documents of widely varying length, with the metadata Megatron-Bridge 0.6.2
turns into THD ``PackedSeqParams`` (``gpt_step.get_batch_from_iterator`` ->
``packed_seq_utils.get_packed_seq_params``). No tokenizer or data download.

Batch contract (micro_batch_size 1, MB's ``collate_fn`` hook): ``tokens``, ``labels``,
``position_ids`` int64 ``[1, S]`` (positions restart at 0 in every document), ``loss_mask``
float32 ``[1, S]`` (0 on each document's last token: its label is the next document's first
token), ``cu_seqlens_q`` / ``cu_seqlens_kv`` int32 ``[1, n + 1]`` (document boundaries, first 0,
last S: rows are filled exactly, so no padding, no ``*_padded`` keys and no -1 sentinels; CP = 1
needs no multiple), ``max_seqlen_q`` / ``max_seqlen_kv`` int32 ``[1, 1]`` (MB moves them to the
host and reads them as Python ints). No ``attention_mask``: TE builds the causal mask per document.

Data: sample ``i`` is a pure function of ``(seed, i)`` - the same on every run and every rank -
and MB's ``MegatronPretrainingSampler`` (``dataloader_type="single"``) hands each data-parallel
rank its own indices, so the DP shards are distinct. Document lengths are uniform in
``[min_doc_length, max_doc_length]`` (16..512 by default; the last one is cut to fill the row).
Each document draws its tokens from its own small "topic" (``topic_size`` tokens picked from a
fixed pool of ``pool_size`` token ids): what predicts the next token is the earlier part of the
*same* document, so attention that crosses document boundaries (MB 0.6.2's overlapped forward step,
which drops ``packed_seq_params``) changes the loss measurably within a few steps. Uniform random
tokens would not: nothing in any context predicts them, so masking them differently moves the loss
by ~1e-4 relative, below the bf16 parity tolerance.

Why the provider declares ``enable_offline_packing=True`` with ``offline_packing_specs``: that is
how Megatron-Bridge 0.6.2 itself decides a run feeds packed metadata
(``gpt_step._uses_packed_sequence_metadata``: middle pipeline stages then load the packed
metadata too; ``ConfigContainer.validate`` then requires micro_batch_size 1, as THD rows do), and
how this package's ``facts.feeds_packed_sequences`` knows the recipe packs (True instead of None for
an arbitrary provider), so the ``packed-sequences-forward-step`` and ``packed-sequences-mtp`` rules
are checked. The rows are packed before training (synthesised packed), which is what "offline"
means there; ``packed_sequence_size`` is kept equal to ``seq_length`` by ``finalize``.

Changes relative to ``qwen3_moe_proxy_te``: seq 2048, micro_batch_size 1 / global_batch_size 8
(4 microbatches per rank at EP = DP = 2), the packed dataset above.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
from megatron.bridge.data.packing import PackedSequenceSpecs

from mbridge_ep_overlap.target.offline import builds_offline

from ._fields import set_fields
from .proxy import PROXY_VOCAB, qwen3_moe_proxy_te

PACKED_SEQ_LENGTH = 2048
PACKED_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens_q", "cu_seqlens_kv",
               "max_seqlen_q", "max_seqlen_kv")


class SyntheticPackedDataset(torch.utils.data.Dataset):
    """``num_samples`` packed rows of ``seq_length`` tokens; row ``i`` depends only on ``(seed, i)``."""

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, *, seed: int = 1234,
                 min_doc_length: int = 16, max_doc_length: int = 512, pool_size: int = 64, topic_size: int = 4):
        if not 1 <= min_doc_length <= max_doc_length:
            raise ValueError(f"document lengths: need 1 <= min ({min_doc_length}) <= max ({max_doc_length})")
        if not 1 <= topic_size <= pool_size <= vocab_size - 2:
            raise ValueError(f"need 1 <= topic_size ({topic_size}) <= pool_size ({pool_size}) <= vocab_size - 2")
        self.num_samples, self.seq_length, self.vocab_size, self.seed = num_samples, seq_length, vocab_size, seed
        self.min_doc_length, self.max_doc_length = min_doc_length, max_doc_length
        self.topic_size = topic_size
        # token ids 1 .. vocab_size - 2: never 0 or the NullTokenizer's last id (EOD)
        pool = torch.randperm(vocab_size - 2, generator=torch.Generator().manual_seed(seed)) + 1
        self.pool = pool[:pool_size]

    def __len__(self) -> int:
        return self.num_samples

    def document_lengths(self, g: torch.Generator) -> list[int]:
        lengths, total = [], 0
        while total < self.seq_length:
            n = int(torch.randint(self.min_doc_length, self.max_doc_length + 1, (1,), generator=g))
            n = min(n, self.seq_length - total)
            lengths.append(n)
            total += n
        return lengths

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(idx))
        lengths = self.document_lengths(g)
        pieces = []
        for n in lengths + [1]:  # one extra token: the label of the row's last position
            topic = self.pool[torch.randperm(len(self.pool), generator=g)[: self.topic_size]]
            pieces.append(topic[torch.randint(0, self.topic_size, (n,), generator=g)])
        text = torch.cat(pieces).to(torch.int64)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        loss_mask = torch.ones(self.seq_length, dtype=torch.float32)
        loss_mask[(cu[1:] - 1).long()] = 0.0  # a document's last label is the next document's first token
        max_len = torch.tensor(max(lengths), dtype=torch.int32)
        return {
            "tokens": text[:-1], "labels": text[1:], "loss_mask": loss_mask,
            "position_ids": torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths]),
            "cu_seqlens_q": cu, "cu_seqlens_kv": cu.clone(), "max_seqlen_q": max_len, "max_seqlen_kv": max_len.clone(),
        }

    @staticmethod
    def collate_fn(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if len(items) != 1:
            raise ValueError(f"packed (THD) rows need micro_batch_size 1, got a batch of {len(items)}")
        item = items[0]
        out = {key: item[key].unsqueeze(0) for key in PACKED_KEYS}  # [1, S], [1, n + 1], [1]
        out["max_seqlen_q"] = out["max_seqlen_q"].view(1, 1)
        out["max_seqlen_kv"] = out["max_seqlen_kv"].view(1, 1)
        return out


@dataclass(kw_only=True)
class SyntheticPackedDatasetProvider(DatasetProvider):
    """Megatron-Bridge ``DatasetProvider`` of ``SyntheticPackedDataset`` (train split only)."""

    seq_length: int = PACKED_SEQ_LENGTH
    """Tokens per packed row (filled exactly with whole documents)."""
    vocab_size: int = PROXY_VOCAB
    seed: int = 1234
    """Row i depends only on the seed and i: every run and rank sees the same data."""
    min_doc_length: int = 16
    max_doc_length: int = 512
    """Document lengths are drawn between these: boundaries fall everywhere in a row."""
    pool_size: int = 64
    topic_size: int = 4
    """Each document draws its tokens from its own topic of this many tokens out of the pool, so
    attending across a document boundary measurably hurts the loss."""
    dataloader_type: str = "single"
    num_workers: int = 1
    enable_offline_packing: bool = True
    offline_packing_specs: PackedSequenceSpecs = field(
        default_factory=lambda: PackedSequenceSpecs(packed_sequence_size=PACKED_SEQ_LENGTH))

    def finalize(self) -> None:
        super().finalize()
        self.offline_packing_specs.packed_sequence_size = self.seq_length  # rows are seq_length tokens

    def dataset(self, num_samples: int) -> SyntheticPackedDataset:
        return SyntheticPackedDataset(
            num_samples, self.seq_length, self.vocab_size, seed=self.seed, min_doc_length=self.min_doc_length,
            max_doc_length=self.max_doc_length, pool_size=self.pool_size, topic_size=self.topic_size)

    def build_datasets(self, context: DatasetBuildContext):
        train = self.dataset(context.train_samples) if context.train_samples else None
        valid = self.dataset(context.valid_samples) if context.valid_samples else None
        return train, valid, None


@builds_offline
def qwen3_moe_proxy_packed():
    """The TE proxy on packed (THD) sequences from a synthetic packed dataset; needs TE."""
    cfg = qwen3_moe_proxy_te()
    set_fields(cfg.model, seq_length=PACKED_SEQ_LENGTH)
    cfg.dataset = SyntheticPackedDatasetProvider(seq_length=PACKED_SEQ_LENGTH, vocab_size=PROXY_VOCAB,
                                                 seed=cfg.rng.seed)
    set_fields(cfg.train, global_batch_size=8, micro_batch_size=1)
    return cfg
