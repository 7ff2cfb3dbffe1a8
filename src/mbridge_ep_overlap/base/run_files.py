"""Where a launched run leaves the evidence a diagnosis reads: one owner for the layout.

Contract
--------
Every run this project launches (``scripts/run_script.py`` under torchrun, ``bench``, ``bench tune``,
the smoke check, the functional suite, Slurm jobs) writes, under its run folder, an ``evidence/``
folder laid out as below. The writers (the launch side) and the readers (``diagnose``) both take the
names from here and nowhere else, so a rename is one edit. Nothing here touches the file system.

Layout of ``<run folder>/evidence/``::

    facts-rank<R>.json        effective facts at start, per rank (FACT_KEYS; JSON object)
    faulthandler-rank<R>.log  faulthandler output: native crashes and watchdog stack dumps
    watchdog-rank<R>.jsonl    progress watchdog events, one JSON object a line (WATCHDOG_KEYS)
    fr/nccl_trace_rank_<R>    PyTorch flight-recorder dumps (prefix FR_PREFIX), torch's own format
"""

from __future__ import annotations

import re
from pathlib import Path

EVIDENCE_DIR = "evidence"
FR_DIR = "fr"
FR_PREFIX = "nccl_trace_rank_"

# Keys of facts-rank<R>.json (values may be null where the process could not know them).
FACT_KEYS = (
    "rank", "world_size", "local_rank", "hostname", "pid", "time",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend", "cuda_device_max_connections", "microbatches_per_step",
    "versions",  # {"torch", "megatron-core", "megatron-bridge", "transformer-engine", "deep-ep", "nvshmem", "nccl", "mbridge-ep-overlap"}
)
# Keys of one watchdog-rank<R>.jsonl line: event is "stall" (no iteration for seconds) or "progress"
# (iterations complete again after a stall); flight_recorder: where the on-demand dump went, or why not;
# moe_position: the last forward MoE dispatch/combine the rank entered ({"layer", "op", "phase",
# "microbatch", "done"}) or null.
WATCHDOG_KEYS = ("event", "rank", "iteration", "seconds_since_progress", "threshold_s", "time",
                 "flight_recorder", "moe_position")


# The same names as patterns, for readers: group 1 is the rank.
FACTS_NAME = re.compile(r"^facts-rank(\d+)\.json$")
WATCHDOG_NAME = re.compile(r"^watchdog-rank(\d+)\.jsonl$")
FAULTHANDLER_NAME = re.compile(r"^faulthandler-rank(\d+)\.log$")


def evidence_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / EVIDENCE_DIR


def facts_file(run_dir: str | Path, rank: int) -> Path:
    return evidence_dir(run_dir) / f"facts-rank{rank}.json"


def faulthandler_file(run_dir: str | Path, rank: int) -> Path:
    return evidence_dir(run_dir) / f"faulthandler-rank{rank}.log"


def watchdog_file(run_dir: str | Path, rank: int) -> Path:
    return evidence_dir(run_dir) / f"watchdog-rank{rank}.jsonl"


def flight_recorder_prefix(run_dir: str | Path) -> Path:
    """The value for TORCH_FR_DUMP_TEMP_FILE (torch appends the rank)."""
    return evidence_dir(run_dir) / FR_DIR / FR_PREFIX
