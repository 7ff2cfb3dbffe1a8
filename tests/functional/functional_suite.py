"""The functional suite's runs and the ``Suite`` that launches them (hooks and fixture: ``conftest.py``).

``run_defs()`` declares the runs once: per layer stack (``STACKS``: ``local`` = ``qwen3_moe_proxy``,
``te`` = ``qwen3_moe_proxy_te``) one baseline shared by its variants, overlap with each dispatcher,
delayed wgrad on TE layers, delayed wgrad forced on local layers (``force_delay_wgrad.py``) and a
refused config. ``Suite`` launches the runs the selected tests use in the background, up to
``EP_OVERLAP_PARALLEL_RUNS`` (default 3) at a time - a run is ~45 s of which ~40 s is CPU start-up and
the proxy takes ~3 GiB per GPU, so runs overlap well on one node - each on its own rendezvous port
with a hard timeout, and gates each flex run on the dispatcher smoke check (``lab.smoke``).

``EP_OVERLAP_SHARE_GPU=1`` (``lab.shared_gpu``) runs every rank of a run on GPU 0, each as a node
of its own, for correctness evidence on a machine with fewer GPUs than ranks: the runs that need a
GPU per rank (DeepEP, HybridEP, the smoke check) are not launched then, and their tests skip saying so.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NPROC = int(os.environ.get("EP_OVERLAP_TEST_GPUS", "2"))
STEPS = 6
MICRO_BATCH = 2
MICROBATCHES = 4
STACKS = {"local": "qwen3_moe_proxy", "te": "qwen3_moe_proxy_te"}
"""Layer stack id -> recipe: the same proxy on local (non-TE) layers and on Transformer Engine layers."""
FLEX = ("deepep", "hybridep")
RUN_TIMEOUT_S = int(os.environ.get("EP_OVERLAP_RUN_TIMEOUT", "300"))
PARALLEL_RUNS = max(1, int(os.environ.get("EP_OVERLAP_PARALLEL_RUNS", "3")))
SMOKE_MAX_AGE_S = float(os.environ.get("EP_OVERLAP_SMOKE_MAX_AGE", "3600"))


def _shared() -> bool:
    from mbridge_ep_overlap.lab import shared_gpu

    return shared_gpu.enabled()


SHARED = _shared()
"""Every rank on GPU 0 (``EP_OVERLAP_SHARE_GPU=1``)."""
SHARED_SKIP = ("EP_OVERLAP_SHARE_GPU=1 (ranks share one GPU): DeepEP, HybridEP and the dispatcher smoke "
               "check need a GPU per rank")


def gpu_count() -> int:
    """The GPUs the suite can run its ranks on (``lab.shared_gpu.usable_gpus``)."""
    from mbridge_ep_overlap.lab.shared_gpu import usable_gpus

    return usable_gpus(NPROC)


_te_problem: list[str | None] = []


def te_problem() -> str | None:
    """Why the ``te`` stack cannot run here (None: Transformer Engine imports)."""
    if not _te_problem:
        from mbridge_ep_overlap.target.shims import real_te_available

        _te_problem.append(None if real_te_available() else
                           "Transformer Engine does not import here (the te layer stack needs it)")
    return _te_problem[0]


# ---- the runs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunDef:
    name: str
    args: list[str]
    stack: str | None = None
    flex: str | None = None
    """The flex backend the run needs healthy (its smoke verdict gates the launch)."""
    env: dict[str, str] = field(default_factory=dict)
    script: str = "scripts/run_script.py"
    timeout_s: int = RUN_TIMEOUT_S
    order: int = 0
    """Launch order: baselines first, flex runs (which wait for the smoke check) last."""


def proxy(stack: str) -> list[str]:
    from mbridge_ep_overlap.lab.launch import proxy_args

    return proxy_args(NPROC, STEPS, MICRO_BATCH, MICROBATCHES, recipe=STACKS[stack])


def run_defs() -> dict[str, RunDef]:
    defs = []
    for stack in STACKS:
        defs.append(RunDef(f"{stack}-off", proxy(stack) + ["--ep-overlap", "off"], stack, order=0))
        defs.append(RunDef(f"{stack}-alltoall", proxy(stack) + ["--ep-overlap", "on", "--dispatcher", "alltoall"],
                           stack, order=1))
        for backend in FLEX:
            defs.append(RunDef(f"{stack}-{backend}", proxy(stack) + ["--ep-overlap", "on", "--dispatcher", backend],
                               stack, flex=backend, order=4))
    defs.append(RunDef("te-delay_wgrad", proxy("te") + ["--ep-overlap", "on", "--dispatcher", "alltoall",
                                                        "--delay-wgrad", "on"],
                       "te", env={"EP_OVERLAP_WGRAD_PROBE": "1"}, order=2))
    defs.append(RunDef("local-forced_delay_wgrad", proxy("local") + ["--dispatcher", "alltoall"], "local",
                       script="tests/functional/force_delay_wgrad.py", order=2))
    defs.append(RunDef("local-refused_full_recompute",
                       proxy("local") + ["model.recompute_granularity=full", "model.recompute_method=uniform",
                                         "model.recompute_num_layers=1"], "local", timeout_s=240, order=3))
    return {d.name: d for d in defs}


@dataclass
class NotRun:
    """A run the suite decided not to launch, and why (its tests skip with this reason)."""

    reason: str


class Suite:
    """Launches the declared runs in the background and hands each test its result."""

    def __init__(self, names: list[str], log_root: Path) -> None:
        from mbridge_ep_overlap.lab import launch

        self.defs = run_defs()
        self.log_root = log_root
        self.launch = launch
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL_RUNS, thread_name_prefix="run")
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._smoke: concurrent.futures.Future | None = None
        self.smoke_source = ""
        wanted = sorted({n for n in names if n in self.defs}, key=lambda n: (self.defs[n].order, n))
        if (any(self.defs[n].flex for n in wanted) or "smoke" in names) and not SHARED:
            self._start_smoke()
        for name in wanted:
            self._submit(name)

    # smoke check
    def _start_smoke(self) -> None:
        from mbridge_ep_overlap.lab import smoke

        def check():
            if os.environ.get("EP_OVERLAP_SMOKE") != "fresh":
                cached = smoke.load(max_age_s=SMOKE_MAX_AGE_S)
                if cached and all(b in cached for b in smoke.BACKENDS):
                    self.smoke_source = f"cached ({smoke.cache_path()})"
                    return cached
            self.smoke_source = f"run now (logs {self.log_root / 'smoke'})"
            return smoke.run(backends=("deepep", "hybridep", "alltoall"), nproc=NPROC,
                             log_dir=self.log_root / "smoke")

        self._smoke = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="smoke").submit(check)

    def smoke(self) -> dict:
        if self._smoke is None:
            self._start_smoke()
        return self._smoke.result()

    def flex_gate(self, backend: str) -> str | None:
        """Why the backend's run is not launched (None: its smoke verdict is usable)."""
        import dataclasses

        from mbridge_ep_overlap.core.dispatcher import health
        from mbridge_ep_overlap.target.probe import probe

        texts = {name: v.text for name, v in self.smoke().items()}
        # The rules' own reader: HybridEP on an NVLink domain of <= 8 GPUs runs with the plan's
        # USE_MNNVL=0 unless the caller set USE_MNNVL (MB applies cfg.env_vars with setdefault).
        caller = {"USE_MNNVL": os.environ["USE_MNNVL"]} if os.environ.get("USE_MNNVL") else {}
        verdict = health(backend, dataclasses.replace(probe(), dispatcher_health=texts), caller)
        if verdict == "usable":
            return None
        return (f"{backend} is not usable on this node (smoke check: {verdict or 'not checked'}; "
                f"see test_dispatcher_health[{backend}])")

    # runs
    def _submit(self, name: str) -> concurrent.futures.Future:
        with self._lock:
            if name not in self._futures:
                self._futures[name] = self._pool.submit(self._run, self.defs[name])
            return self._futures[name]

    def _run(self, d: RunDef):
        if d.stack == "te" and te_problem():
            return NotRun(te_problem())
        if d.flex and SHARED:
            return NotRun(SHARED_SKIP)
        if d.flex:
            why = self.flex_gate(d.flex)
            if why:
                return NotRun(why)
        return self.launch.launch(d.name, NPROC, d.args, timeout_s=d.timeout_s, env=dict(d.env),
                                  log_root=self.log_root, script=d.script, share_gpu=SHARED)

    def result(self, name: str, *, ok: bool = True):
        """The finished run ``name`` (launching it if no test declared it); skips the calling test
        when the suite did not launch it; with ``ok`` asserts it exited 0 and wrote its summary."""
        run = self._submit(name).result()
        if isinstance(run, NotRun):
            pytest.skip(run.reason)
        if ok:
            assert not run.timed_out and run.returncode == 0, run.describe_failure()
            assert run.summary is not None, "the run wrote no evidence summary\n" + run.tail()
        return run

    def finished(self) -> list:
        return [f.result() for f in self._futures.values() if f.done() and not f.cancelled() and f.exception() is None]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.launch.kill_launched()


