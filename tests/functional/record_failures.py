#!/usr/bin/env python3
"""Record real failures of the proxy under EP overlap, and the cost of the evidence (GPU node).

    python tests/functional/record_failures.py OUT_DIR [--only CASE,...] [--deadline-s S]

Runs ``CASES`` - each fault of ``fault_injector.py`` on ``qwen3_moe_proxy`` (local layers, no TE),
EP = 2, overlap on with the alltoall dispatcher, ranks sharing GPU 0 (``EP_OVERLAP_SHARE_GPU=1``, the
functional suite's way) - up to ``PARALLEL`` at a time, each with a hard timeout (``lab.launch``),
after the overhead pairs (the same healthy run with evidence on and off, ``--overhead-pairs`` times,
alternating which goes first, nothing else running). ``--deadline-s`` bounds the whole (runs that would start after it are
skipped, and a run's timeout never passes it). Writes under OUT_DIR:

* ``runs/<case>/``: what the run left (``launcher.log``, ``torchrun/.../std{out,err}.log``,
  ``evidence/``, ``summary.json``, ``injected-fault.json``), big files pruned (``prune``);
* ``runs/<hang|stall>/pyspy-dumps.txt`` with ``--py-spy PATH``: ``py-spy dump`` of every rank once the watchdog
  has seen the stall (``spy_when_stalled``);
* ``cases.json``: per case the fault, the command's environment, exit code, timed out, seconds;
* ``overhead.json``: per-step times of every run, the median of each, each pair's cost and the
  median over the pairs (``overhead``).
The exit code is 0 when every case ran (a failure is what a fault case is for), 1 when one was
skipped or did not leave the evidence it should.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fault_injector import ENV as FAULT_ENV  # noqa: E402  (this folder is not a package)

NPROC = 2
STEPS = 6
OVERHEAD_STEPS = 25
OVERHEAD_PAIRS = 3
PARALLEL = 3
SCRIPT = "tests/functional/fault_injector.py"
OVERLAP = ["--ep-overlap", "on", "--dispatcher", "alltoall"]
# name -> (fault, extra run_script arguments, hard timeout s). Watchdog 20 s where the watchdog is
# the witness; the NCCL-timeout case has a 1-minute process-group timeout and the default watchdog,
# which caps its threshold at half of that timeout (runtime.watchdog.PG_TIMEOUT_FRACTION) so that it records
# the rank's MoE position before NCCL's watchdog ends the job.
CASES = {
    "nccl_timeout": ("timeout:rank=1,layer=1,step=3,microbatch=0",
                     ["dist.distributed_timeout_minutes=1"], 180),
    "hang": ("hang:rank=1,layer=2,step=3,microbatch=1", ["--watchdog-s", "20"], 110),
    "stall": ("stall:rank=1,layer=1,step=3,microbatch=2,seconds=600", ["--watchdog-s", "20"], 110),
    "crash": ("crash:rank=0,layer=3,step=2,microbatch=0", [], 120),
    "nan": ("nan:rank=0,layer=2,step=4,microbatch=1", [], 120),
    "no_gain": ("none", ["--global-batch-size", str(2 * NPROC)], 120),  # one microbatch per rank
}
OVERHEAD = "overhead"
"""The ``--only`` name of the overhead pairs."""
EVIDENCE = {"evidence_on": "1", "evidence_off": "0"}


def overhead_runs(pairs: int) -> list[tuple[str, str]]:
    """(run name, EP_OVERLAP_EVIDENCE) in order: pair i is on/off for even i, off/on for odd i, so a
    drift of the machine over the runs falls on both sides."""
    order = []
    for i in range(1, pairs + 1):
        names = ("evidence_on", "evidence_off") if i % 2 else ("evidence_off", "evidence_on")
        order += [(f"{n}_{i}", EVIDENCE[n]) for n in names]
    return order
KEEP_BYTES = 256 * 1024
"""Per log file: a longer one keeps its first and last half of this."""


def proxy(steps: int) -> list[str]:
    from mbridge_ep_overlap.lab.launch import proxy_args

    return proxy_args(NPROC, steps, 2, 4) + OVERLAP


def with_override(args: list[str], extra: list[str]) -> list[str]:
    """``args`` with ``extra``: a flag given in ``extra`` replaces the same flag in ``args``."""
    out = list(args)
    i = 0
    while i < len(extra):
        if extra[i].startswith("--") and i + 1 < len(extra):
            if extra[i] in out:
                j = out.index(extra[i])
                out[j + 1] = extra[i + 1]
            else:
                out += extra[i:i + 2]
            i += 2
        else:
            out.append(extra[i])
            i += 1
    return out


def prune(folder: Path, keep: int = KEEP_BYTES) -> None:
    """Cut every log over ``keep`` bytes to its head and tail; drop checkpoints and traces."""
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        if path.suffix in (".pt", ".distcp", ".bin") or path.name.endswith(".pt.trace.json"):
            path.unlink()
            continue
        if path.suffix in (".log", ".txt") and path.stat().st_size > keep:
            data = path.read_bytes()
            cut = len(data) - keep
            path.write_bytes(data[:keep // 2] + f"\n[... {cut} bytes pruned ...]\n".encode() + data[-keep // 2:])


def _percent(on: float | None, off: float | None) -> float | None:
    return round(100 * (on - off) / off, 2) if on and off else None


def overhead(runs: dict[str, dict | None]) -> dict:
    """Per-step times of each run (from its summary) and the median after the first two steps; per
    pair ``i`` (``evidence_on_i`` / ``evidence_off_i``) evidence-on's cost relative to evidence-off;
    ``overhead_percent``: the median of the pairs' costs, with their range."""
    out: dict = {"runs": {}}
    for name, summary in runs.items():
        times = [s["step_time_s"] for s in (summary or {}).get("steps", []) if s.get("step_time_s") is not None]
        steady = times[2:] if len(times) > 4 else times
        out["runs"][name] = {"step_times_s": times, "median_s": statistics.median(steady) if steady else None}
    pairs = sorted({n.rsplit("_", 1)[1] for n in runs if n.rsplit("_", 1)[-1].isdigit()}, key=int)
    costs = {}
    for i in pairs:
        on, off = (out["runs"].get(f"{k}_{i}", {}).get("median_s") for k in ("evidence_on", "evidence_off"))
        costs[i] = _percent(on, off)
    out["pairs_percent"] = costs
    valid = [c for c in costs.values() if c is not None]
    out["overhead_percent"] = round(statistics.median(valid), 2) if valid else None
    out["range_percent"] = [min(valid), max(valid)] if valid else None
    return out


def expected_evidence(case: str, folder: Path) -> list[str]:
    """What the case must have left for a diagnosis; the missing ones by name."""
    from mbridge_ep_overlap.base import run_files

    missing = [str(run_files.facts_file(folder, r)) for r in range(NPROC) if not run_files.facts_file(folder, r).exists()]
    if case == "nccl_timeout" and not any(Path(str(run_files.flight_recorder_prefix(folder)) + str(r)).exists()
                                          for r in range(NPROC)):
        missing.append("a flight-recorder dump (TORCH_NCCL_DUMP_ON_TIMEOUT)")
    if case in ("hang", "stall"):
        if not any(run_files.watchdog_file(folder, r).exists() for r in range(NPROC)):
            missing.append("a watchdog stall event")
    if case in CASES and CASES[case][0] != "none" and not (folder / "injected-fault.json").exists():
        missing.append("injected-fault.json (the fault never fired)")
    return missing


def spy_when_stalled(py_spy: str, folder: Path, wait_s: float) -> None:
    """What a user runs on a stuck job: once the watchdog has written its stall event, ``py-spy dump`` of every
    rank (pids from the facts files), one after the other into ``folder/pyspy-dumps.txt``. Gives up after ``wait_s``."""
    import subprocess

    from mbridge_ep_overlap.base import run_files

    end = time.monotonic() + wait_s
    while not any(run_files.watchdog_file(folder, r).exists() for r in range(NPROC)):
        if time.monotonic() > end:
            return
        time.sleep(1)
    time.sleep(2)  # the other rank's stall event too
    parts = []
    for r in range(NPROC):
        try:
            pid = json.loads(run_files.facts_file(folder, r).read_text())["pid"]
            done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            parts.append(done.stdout + done.stderr)
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
            parts.append(f"(rank {r}: no dump: {e})\n")
    (folder / "pyspy-dumps.txt").write_text("".join(parts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="record_failures.py")
    p.add_argument("out_dir")
    p.add_argument("--only", default=None, help="comma-separated case names (default: all, then the overhead pair)")
    p.add_argument("--deadline-s", type=float, default=420.0)
    p.add_argument("--overhead-pairs", type=int, default=OVERHEAD_PAIRS, help="evidence on/off pairs (default %(default)s)")
    p.add_argument("--overhead-steps", type=int, default=OVERHEAD_STEPS, help="steps per overhead run (default %(default)s)")
    p.add_argument("--py-spy", default=os.environ.get("EP_OVERLAP_PY_SPY"), metavar="PATH",
                   help="a py-spy binary (default: $EP_OVERLAP_PY_SPY, set by scripts/gpu/env.sh from the py-spy wheel): "
                        "the hang and stall cases also leave py-spy dumps of every rank")
    args = p.parse_args(argv)
    names = list(CASES) + [OVERHEAD]
    wanted = names if args.only is None else [n for n in args.only.split(",") if n]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; allowed: {', '.join(names)}")
    from mbridge_ep_overlap.lab import launch

    def terminated(signum, frame):  # the outer `timeout`: end every run started here, then leave
        launch.kill_launched()
        sys.exit(124)

    signal.signal(signal.SIGTERM, terminated)
    out = Path(args.out_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.deadline_s
    base_env = {"EP_OVERLAP_SHARE_GPU": "1"}
    results: dict[str, dict] = {}

    def run(name: str, fault: str, extra: list[str], timeout_s: float, env: dict, steps: int) -> dict:
        left = end - time.monotonic()
        if left < 30:
            return {"skipped": f"out of time ({args.deadline_s:.0f} s for the whole recording)"}
        cmd_env = {**base_env, **env, FAULT_ENV: fault}
        if args.py_spy and name in ("hang", "stall"):
            threading.Thread(target=spy_when_stalled, args=(args.py_spy, out / "runs" / name, min(timeout_s, left)),
                             daemon=True).start()
        r = launch.launch(name, NPROC, with_override(proxy(steps), extra), timeout_s=min(timeout_s, left),
                          env=cmd_env, log_root=out / "runs", script=SCRIPT, share_gpu=True)
        prune(r.folder)
        return {"fault": fault, "args": extra, "env": cmd_env, "returncode": r.returncode, "timed_out": r.timed_out,
                "seconds": round(r.seconds, 1), "crash": r.crash(), "summary": r.summary is not None,
                "missing_evidence": expected_evidence(name, r.folder)}

    summaries = {}
    for n, value in (overhead_runs(args.overhead_pairs) if OVERHEAD in wanted else []):  # first, on a quiet machine
        results[n] = run(n, "none", [], 60 + 6 * args.overhead_steps, {"EP_OVERLAP_EVIDENCE": value}, args.overhead_steps)
        print(f"{n}: {results[n]}", flush=True)
        path = out / "runs" / n / "summary.json"
        summaries[n] = json.loads(path.read_text()) if path.exists() else None
        if "missing_evidence" in results[n] and value == "0":
            results[n]["missing_evidence"] = []  # nothing is expected with the evidence off
    faults = [n for n in CASES if n in wanted]
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = {n: pool.submit(run, n, CASES[n][0], CASES[n][1], CASES[n][2], {}, STEPS) for n in faults}
        for n, f in futures.items():
            results[n] = f.result()
            print(f"{n}: {results[n]}", flush=True)
    (out / "cases.json").write_text(json.dumps(results, indent=1) + "\n")
    if summaries:
        cost = overhead(summaries)
        (out / "overhead.json").write_text(json.dumps(cost, indent=1) + "\n")
        print(f"overhead: {cost['overhead_percent']} % (median of {len(cost['pairs_percent'])} pairs, "
              f"range {cost['range_percent']})", flush=True)
    bad = [n for n, r in results.items() if r.get("skipped") or r.get("missing_evidence")]
    for n in bad:
        print(f"{n}: {results[n].get('skipped') or 'missing ' + ', '.join(results[n]['missing_evidence'])}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
