"""The pieces of a rank's evidence that need neither Megatron nor a GPU: names, variables, files.

Contract
--------
What every launched rank writes into ``<run_dir>/evidence/`` (layout and names: ``base.run_files``;
wired into training by ``runtime.rank_evidence``):

* the **flight recorder**: ``flight_recorder_environment`` gives PyTorch's variables to set in the
  rank before its process group exists - the names chosen for the installed torch in one place
  (``flight_recorder_names``), a value the user set (under either name) never overridden;
  ``install_flight_recorder`` sets them and makes the folder the dumps go to (torch does not: without
  it the dump on an NCCL timeout is lost, "Error opening file for writing Flight Recorder debug
  info"); ``dump_flight_recorder`` asks torch for an on-demand dump into the same files;
* **faulthandler** output into ``faulthandler-rank<R>.log`` *and* on the rank's real stderr
  (``enable_faulthandler``: through a ``tee`` child, so a SIGSEGV still reaches both);
* the **facts** that fail silently (``facts``: ``base.run_files.FACT_KEYS``; versions reported as
  "not installed" rather than failing);
* the **watchdog settings** (``watchdog_settings``: run_script's ``--watchdog-s``,
  ``EP_OVERLAP_WATCHDOG_S``, ``EP_OVERLAP_WATCHDOG_FIRST_S``; a bad value is a ``UsageError``).

``enabled()``: ``EP_OVERLAP_EVIDENCE=0`` (or ``off``) turns the evidence off. Importing this module
imports neither torch nor Megatron.
"""


from __future__ import annotations

import faulthandler
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..base import run_files
from ..base.errors import UsageError
from .watchdog import FACTOR, FIRST_S, FLOOR_S, PG_TIMEOUT_FRACTION

ENV = "EP_OVERLAP_EVIDENCE"
"""``0`` / ``off``: no evidence folder, no watchdog, no flight recorder set up by this project."""
WATCHDOG_ENV = "EP_OVERLAP_WATCHDOG_S"
"""Seconds without a completed iteration that count as a stall (fixed; ``0`` turns the watchdog off)."""
WATCHDOG_FIRST_ENV = "EP_OVERLAP_WATCHDOG_FIRST_S"
"""Seconds allowed before the first iteration completes (default ``watchdog.FIRST_S``)."""
FR_BUFFER_ENTRIES = "2000"
"""Flight-recorder ring size: a few hundred all-to-alls per step on the proxy, more than enough."""
_NEW_FR_NAMES_FROM = (2, 10)
"""torch from which the flight recorder reads ``TORCH_FR_*`` (torch 2.11 warns that the
``TORCH_NCCL_*`` names are deprecated; older releases know only those)."""
NEW_FR_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")
OLD_FR_NAMES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
# Distribution names to try, per version the facts report.
DISTRIBUTIONS = {
    "torch": ("torch",), "megatron-core": ("megatron-core", "megatron_core"),
    "megatron-bridge": ("megatron-bridge", "megatron_bridge"),
    "transformer-engine": ("transformer-engine", "transformer_engine", "transformer-engine-torch"),
    "deep-ep": ("deep-ep", "deep_ep"), "nvshmem": ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12"),
    "mbridge-ep-overlap": ("mbridge-ep-overlap", "mbridge_ep_overlap"),
}
NOT_INSTALLED = "not installed"


def enabled(environ=None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV, "1").strip().lower()
    return value not in ("0", "off", "false", "no")


# ---- flight recorder --------------------------------------------------------------------------------
def _version_tuple(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def flight_recorder_names(torch_version: str) -> tuple[str, str]:
    """(buffer-size variable, dump-file-prefix variable) the installed torch reads."""
    return NEW_FR_NAMES if _version_tuple(torch_version) >= _NEW_FR_NAMES_FROM else OLD_FR_NAMES


def flight_recorder_environment(run_dir, torch_version: str, environ=None) -> dict[str, str]:
    """The variables to set so that the flight recorder records and dumps into ``run_dir``'s
    evidence folder: only those the user has not set (under the old or the new name)."""
    environ = os.environ if environ is None else environ
    buffer_name, file_name = flight_recorder_names(torch_version)
    wanted = {(NEW_FR_NAMES[0], OLD_FR_NAMES[0]): (buffer_name, FR_BUFFER_ENTRIES),
              (NEW_FR_NAMES[1], OLD_FR_NAMES[1]): (file_name, str(run_files.flight_recorder_prefix(run_dir))),
              (_DUMP_ON_TIMEOUT,): (_DUMP_ON_TIMEOUT, "1")}
    return {name: value for names, (name, value) in wanted.items() if not any(environ.get(n) for n in names)}


def flight_recorder_prefix(run_dir, torch_version: str, environ=None) -> str:
    """Where torch writes the dumps (``<prefix><rank>``): the user's prefix when they set one."""
    environ = os.environ if environ is None else environ
    name = flight_recorder_names(torch_version)[1]
    other = OLD_FR_NAMES[1] if name == NEW_FR_NAMES[1] else NEW_FR_NAMES[1]
    return environ.get(name) or environ.get(other) or str(run_files.flight_recorder_prefix(run_dir))


def install_flight_recorder(run_dir, torch_version: str, environ=None) -> str:
    """Set the flight-recorder variables the user has not set (``flight_recorder_environment``) and
    create the folder of the dump prefix in force, the user's included; returns that prefix."""
    environ = os.environ if environ is None else environ
    environ.update(flight_recorder_environment(run_dir, torch_version, environ))
    prefix = flight_recorder_prefix(run_dir, torch_version, environ)
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    return prefix


def _on_demand_dumps() -> list:
    """torch's on-demand flight-recorder dumps, in order of preference: ``_dump_nccl_trace`` (the
    recorder of NCCL process groups, in CUDA builds), ``_dump_fr_trace`` (the recorder of the other
    backends, gloo); those this torch has."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return []
    return [f for f in (getattr(c10d, "_dump_nccl_trace", None), getattr(c10d, "_dump_fr_trace", None)) if f]


def _has_entries(data: bytes) -> bool:
    import pickle  # only when a dump is taken (a stall), not at start-up

    try:
        return bool(pickle.loads(data).get("entries"))
    except Exception:  # noqa: BLE001 - an unreadable dump is still worth keeping
        return True


def dump_flight_recorder(prefix: str, rank: int, dumps: list | None = None) -> str:
    """Write torch's flight-recorder entries (pickled, torch's format) to ``<prefix><rank>``, from the
    first recorder of ``dumps`` (default ``_on_demand_dumps()``) that holds any; returns that path or why not."""
    dumps = _on_demand_dumps() if dumps is None else dumps
    if not dumps:
        return "unavailable: this torch has no on-demand flight-recorder dump"
    data = b""
    for dump in dumps:
        data = dump()
        if _has_entries(data):
            break
    path = Path(f"{prefix}{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


# ---- faulthandler ------------------------------------------------------------------------------------
def enable_faulthandler(path: Path, stderr) -> subprocess.Popen | None:
    """faulthandler (every thread) into ``path`` and onto ``stderr`` (a stream or a file descriptor)
    through a ``tee`` child, which outlives a crashed rank long enough to copy its report; without
    ``tee``, into ``path`` alone, saying so on stderr. Returns the ``tee`` process."""
    fd = stderr if isinstance(stderr, int) else stderr.fileno()
    path.parent.mkdir(parents=True, exist_ok=True)
    tee = shutil.which("tee")
    if tee is None:
        handle = open(path, "a")  # kept open for the life of the process (faulthandler holds the fd)
        faulthandler.enable(file=handle, all_threads=True)
        os.write(fd, f"[ep-overlap evidence] no `tee` here: faulthandler writes to {path} only\n".encode())
        return None
    proc = subprocess.Popen([tee, "-a", str(path)], stdin=subprocess.PIPE, stdout=fd, close_fds=True)
    faulthandler.enable(file=proc.stdin, all_threads=True)
    return proc


# ---- facts --------------------------------------------------------------------------------------------
def _distribution_version(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def _nccl_version() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a torch without NCCL: report the wheel instead
        pass
    return _distribution_version(("nvidia-nccl-cu13", "nvidia-nccl-cu12"))


def versions() -> dict[str, str]:
    return {**{key: _distribution_version(names) for key, names in DISTRIBUTIONS.items()}, "nccl": _nccl_version()}


def facts(cfg, environ=None, microbatches: int | None = None, versions_found: dict | None = None) -> dict:
    """``base.run_files.FACT_KEYS`` for this process: ``cfg`` after the recipe and
    ``apply_flex_dispatcher_backend`` ran; the environment as this process sees it."""
    environ = os.environ if environ is None else environ
    model = getattr(cfg, "model", None)

    def number(name):
        value = environ.get(name)
        return int(value) if value is not None and value.strip().isdigit() else value

    found = {
        "rank": number("RANK"), "world_size": number("WORLD_SIZE"), "local_rank": number("LOCAL_RANK"),
        "hostname": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
        "overlap_moe_expert_parallel_comm": getattr(model, "overlap_moe_expert_parallel_comm", None),
        "delay_wgrad_compute": getattr(model, "delay_wgrad_compute", None),
        "moe_token_dispatcher_type": getattr(model, "moe_token_dispatcher_type", None),
        "moe_flex_dispatcher_backend": getattr(model, "moe_flex_dispatcher_backend", None),
        "cuda_device_max_connections": environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "microbatches_per_step": microbatches,
        "versions": versions_found if versions_found is not None else versions(),
    }
    return {key: found[key] for key in run_files.FACT_KEYS}


def write_facts(run_dir, rank: int, found: dict) -> Path:
    path = run_files.facts_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(found, indent=1, default=str) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


# ---- the watchdog's settings ------------------------------------------------------------------------
def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise UsageError(name, text, "a number of seconds >= 0 (0: watchdog off)", "bad")
    return value


def watchdog_settings(flag: str | None = None, environ=None, pg_timeout_s: float | None = None) -> dict | None:
    """``ProgressWatchdog`` keyword arguments, or None when the watchdog is off. ``flag`` (run_script's
    ``--watchdog-s``) wins over ``EP_OVERLAP_WATCHDOG_S``; unset: ``max(floor, factor x median step)``, at most
    ``PG_TIMEOUT_FRACTION`` x ``pg_timeout_s`` (the NCCL process group's timeout, ``process_group_timeout_s``)
    so that the watchdog records a stuck collective before NCCL ends the job. A fixed value at or past
    that timeout is kept (the user's choice) and said on stderr: the watchdog cannot fire before NCCL does."""
    environ = os.environ if environ is None else environ
    fixed_text = flag if flag is not None else environ.get(WATCHDOG_ENV)
    fixed = _seconds("--watchdog-s" if flag is not None else WATCHDOG_ENV, fixed_text) if fixed_text else None
    if fixed == 0:
        return None
    first_text = environ.get(WATCHDOG_FIRST_ENV)
    first = _seconds(WATCHDOG_FIRST_ENV, first_text) if first_text else FIRST_S
    cap = PG_TIMEOUT_FRACTION * pg_timeout_s if pg_timeout_s else None
    if fixed is not None and pg_timeout_s and fixed >= pg_timeout_s:
        print(f"ep-overlap watchdog: {'--watchdog-s' if flag is not None else WATCHDOG_ENV}={fixed:g} s is at or "
              f"past the process group's timeout ({pg_timeout_s:g} s): NCCL ends the job before the watchdog "
              f"records the stall; leave it unset (default: at most {cap:g} s) or set it below {pg_timeout_s:g} s",
              file=sys.stderr)
    return {"first_s": first, "floor_s": FLOOR_S, "factor": FACTOR, "fixed_s": fixed, "cap_s": cap}


def process_group_timeout_s(cfg) -> float | None:
    """The NCCL process group's timeout MB initialises with (``cfg.dist.distributed_timeout_minutes``,
    megatron/bridge/training/initialize.py), in seconds; None where the config does not carry it."""
    minutes = getattr(getattr(cfg, "dist", None), "distributed_timeout_minutes", None)
    return 60.0 * minutes if isinstance(minutes, (int, float)) and minutes > 0 else None


