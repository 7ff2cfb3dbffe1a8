"""Evidence on by default in every training rank: ``RunEvidence`` started before MB's ``pretrain()``.

Contract
--------
``RunEvidence.start(run_dir, cfg)`` - called by ``tools.run`` in every rank before ``pretrain()``, so
``scripts/run_script.py`` under torchrun, ``bench``, ``bench tune``, the functional suite and Slurm
jobs all get it - sets the flight-recorder variables in this process (``run_evidence``), sends
faulthandler to the rank's evidence file and stderr, writes the facts, and starts the progress
watchdog (``runtime.watchdog``) unless its settings turn it off. ``RunEvidence.callback()`` is an MB
``Callback``: at ``on_train_start`` it writes the facts again (MB has applied ``cfg.env_vars`` and
the process group exists, so microbatches per step are known) and restarts the watchdog's clock; at
each ``on_train_step_end`` it tells the watchdog the iteration completed (one clock read). Stall
events say where the rank was (``MoEPosition``: the MoE layer, dispatch or combine, the microbatch
of the last forward dispatch/combine entered, and whether it returned). Nothing here changes the
training computation. Importing this module imports Megatron-Bridge: install the import shims
first (``target.shims.install``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from megatron.bridge.training.callbacks import Callback
from megatron.core.transformer.moe.moe_layer import MoELayer

from ..base import run_files
from .run_evidence import dump_flight_recorder, enable_faulthandler, enabled, facts, install_flight_recorder, \
    process_group_timeout_s, watchdog_settings, write_facts
from .watchdog import ProgressWatchdog


# ---- where in the schedule a rank is ------------------------------------------------------------------
class MoEPosition:
    """The last forward dispatch / combine entered, per rank: MoE layer, which of the two, and how many
    forward calls that layer has had since the last completed iteration (the microbatch, 0-based, is
    that count minus one). ``install`` wraps ``MoELayer.dispatch`` / ``combine`` (a dictionary update
    per call); the backward all-to-alls run inside autograd and show in the stacks instead."""

    def __init__(self) -> None:
        self.last: dict | None = None
        self.counts: dict[tuple[int, str], int] = {}
        self._originals: tuple | None = None

    def entered(self, layer, op: str) -> None:
        key = (layer, op)
        self.counts[key] = count = self.counts.get(key, 0) + 1
        self.last = {"layer": layer, "op": op, "phase": "forward", "microbatch": count - 1, "done": False}

    def left(self) -> None:
        if self.last is not None:
            self.last["done"] = True

    def iteration_done(self) -> None:
        self.counts.clear()

    def snapshot(self) -> dict | None:
        return None if self.last is None else dict(self.last)

    def install(self, layer_class=MoELayer) -> "MoEPosition":
        dispatch, combine = layer_class.dispatch, layer_class.combine
        position = self

        def dispatch_tracked(self, hidden_states, probs):
            position.entered(getattr(self, "layer_number", None), "dispatch")
            result = dispatch(self, hidden_states, probs)
            position.left()
            return result

        def combine_tracked(self, output):
            position.entered(getattr(self, "layer_number", None), "combine")
            result = combine(self, output)
            position.left()
            return result

        self._originals = (layer_class, dispatch, combine)
        layer_class.dispatch, layer_class.combine = dispatch_tracked, combine_tracked
        return self

    def uninstall(self) -> None:
        if self._originals is not None:
            layer_class, dispatch, combine = self._originals
            layer_class.dispatch, layer_class.combine = dispatch, combine
            self._originals = None


# ---- in a rank -----------------------------------------------------------------------------------------
class RunEvidence:
    """The evidence of one rank: started before ``pretrain()``, fed by ``callback()``."""

    def __init__(self, run_dir, rank: int, torch_version: str, watchdog: ProgressWatchdog | None) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.torch_version = torch_version
        self.watchdog = watchdog
        self.tee: subprocess.Popen | None = None
        self.cfg = None
        self.position: MoEPosition | None = None

    @classmethod
    def start(cls, run_dir, cfg, stderr=None, watchdog_flag: str | None = None) -> "RunEvidence":
        import torch

        rank = int(os.environ.get("RANK", "0"))
        # a bad value is a usage error before anything starts; the default is capped below NCCL's timeout
        settings = watchdog_settings(watchdog_flag, pg_timeout_s=process_group_timeout_s(cfg))
        prefix = install_flight_recorder(run_dir, torch.__version__)
        watchdog = position = None
        if settings is not None:
            position = MoEPosition().install()
            watchdog = ProgressWatchdog(rank, run_files.faulthandler_file(run_dir, rank),
                                        run_files.watchdog_file(run_dir, rank),
                                        dump_flight_recorder=lambda: dump_flight_recorder(prefix, rank),
                                        position=position.snapshot, native_backup=True, **settings)
        self = cls(run_dir, rank, torch.__version__, watchdog)
        self.position = position
        self.cfg = cfg
        self.tee = enable_faulthandler(run_files.faulthandler_file(run_dir, rank), stderr or sys.__stderr__)
        write_facts(run_dir, rank, facts(cfg))
        if watchdog is not None:
            watchdog.start()
        return self

    def callback(self) -> "ProgressCallback":
        return ProgressCallback(self)

    def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.position is not None:
            self.position.uninstall()


def evidence_callbacks(args, run_dir, cfg, stderr=None) -> list:
    """What a launcher adds to ``pretrain()``'s callbacks for run_script's ``--evidence`` /
    ``--watchdog-s`` (``args``): the started ``RunEvidence``'s callback, or nothing when it is off
    (``--evidence off``, else ``EP_OVERLAP_EVIDENCE=0``). Call it before ``pretrain()``: the
    flight-recorder variables must be set before the process group exists."""
    wanted = args.evidence == "on" if args.evidence is not None else enabled()
    if not wanted:
        return []
    return [RunEvidence.start(run_dir, cfg, stderr=stderr, watchdog_flag=args.watchdog_s).callback()]


class ProgressCallback(Callback):
    """MB callback: facts again once training starts, each completed iteration to the watchdog."""

    def __init__(self, evidence: RunEvidence) -> None:
        self.evidence = evidence

    def on_train_start(self, context) -> None:
        microbatches = None
        try:
            from megatron.core.num_microbatches_calculator import get_num_microbatches

            microbatches = get_num_microbatches()
        except Exception:  # noqa: BLE001 - the calculator not set up: the fact stays unknown (null)
            pass
        ev = self.evidence
        write_facts(ev.run_dir, ev.rank, facts(getattr(context.state, "cfg", None) or ev.cfg, microbatches=microbatches))
        if ev.watchdog is not None:
            ev.watchdog.restart_clock()

    def on_train_step_end(self, context) -> None:
        if self.evidence.watchdog is not None:
            self.evidence.watchdog.progress(int(context.state.train_state.step))
        if self.evidence.position is not None:
            self.evidence.position.iteration_done()

    def on_train_end(self, context) -> None:
        self.evidence.stop()
