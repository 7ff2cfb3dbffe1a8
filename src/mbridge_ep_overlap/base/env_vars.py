"""Every ``EP_OVERLAP_*`` environment variable this project reads: its name, default and meaning.

Contract: ``VARIABLES`` is the one list of them (``docs/cli.md`` is generated from it); a unit test
fails when the package, the scripts, the recipes or the tests read an ``EP_OVERLAP_*`` name this list
lacks, or when the list holds a name nothing reads. ``where`` says who reads it: the library (any
user), the GPU scripts under ``scripts/gpu/``, or the test suites. The modules that read a variable
keep reading it themselves; this module records what it means. Imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass

LIBRARY = "the library (every command and API call)"
GPU_SCRIPTS = "the GPU scripts (scripts/gpu)"
GPU_TESTS = "the GPU test suite (tests/functional)"
UNIT_TESTS = "the unit tests"


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    meaning: str
    where: str = LIBRARY


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("EP_OVERLAP_VERBOSE", "unset",
           "`1`: every warning the libraries raise, as they wrote it (same as `-v`), and nothing held back "
           "while a command prepares"),
    EnvVar("EP_OVERLAP_EVIDENCE", "on",
           "`0` or `off`: a training run writes no `evidence/` folder (no watchdog, flight recorder, stacks "
           "or facts); `--evidence` overrides it"),
    EnvVar("EP_OVERLAP_WATCHDOG_S", "max(60 s, 10 x median step time)",
           "seconds without a completed iteration that count as a stall (`0`: watchdog off); "
           "`--watchdog-s` overrides it"),
    EnvVar("EP_OVERLAP_WATCHDOG_FIRST_S", "600",
           "seconds the watchdog allows before the first iteration completes"),
    EnvVar("EP_OVERLAP_LOG_DIR", "out/functional",
           "where launched runs (`bench`, `doctor --smoke`, the GPU suite) write their logs"),
    EnvVar("EP_OVERLAP_SMOKE_CACHE", "$XDG_CACHE_HOME (or ~/.cache)/mbridge_ep_overlap/smoke.json",
           "the file holding this machine's `doctor --smoke` verdicts, which `dispatcher=\"auto\"` consults"),
    EnvVar("EP_OVERLAP_SMOKE_TIMEOUT", "per backend: alltoall 90, deepep 150, hybridep 180",
           "seconds before a `doctor --smoke` check of a dispatcher counts as hung (overrides every backend's)"),
    EnvVar("EP_OVERLAP_SHARE_GPU", "unset",
           "`1`: every rank of a launched run on GPU 0 (numerics with EP > 1 on one GPU; no timings)"),
    EnvVar("EP_OVERLAP_WGRAD_PROBE", "unset",
           "`1`: the run's evidence checks around each delayed `backward_dw` that weight gradients changed "
           "(device-synchronised; leave it off for timings)"),
    EnvVar("EP_OVERLAP_SITE", "/tmp/ep-overlap-site",
           "the private site folder `scripts/gpu/env.sh` installs the GPU wheels and this checkout into",
           GPU_SCRIPTS),
    EnvVar("EP_OVERLAP_SMOKE", "unset",
           "`cached`: reuse the `doctor --smoke` verdicts of an earlier check; `fresh`: always check anew",
           GPU_TESTS),
    EnvVar("EP_OVERLAP_SMOKE_MAX_AGE", "3600",
           "seconds for which cached `doctor --smoke` verdicts are reused by the GPU suite", GPU_TESTS),
    EnvVar("EP_OVERLAP_TEST_GPUS", "2",
           "GPUs (ranks) per GPU test run; must divide the proxy model's 16 experts", GPU_TESTS),
    EnvVar("EP_OVERLAP_PARALLEL_RUNS", "3", "GPU test runs launched at a time (`1`: one after the other)",
           GPU_TESTS),
    EnvVar("EP_OVERLAP_RUN_TIMEOUT", "300", "seconds before a GPU test run is stopped as hung", GPU_TESTS),
    EnvVar("EP_OVERLAP_STACKS", "local,te",
           "the layer stacks the GPU suite tests (comma list of `local`, `te`)", GPU_TESTS),
    EnvVar("EP_OVERLAP_FAULT", "unset",
           "`KIND:rank=R,layer=K,step=S,microbatch=M[,seconds=T]`: the failure "
           "`tests/functional/fault_injector.py` plants in one rank", GPU_TESTS),
    EnvVar("EP_OVERLAP_HF_CONFIG_DIR", "unset",
           "a folder of more Hugging Face architecture files the perf-recipe tests also check", UNIT_TESTS),
)

BY_NAME: dict[str, EnvVar] = {v.name: v for v in VARIABLES}
