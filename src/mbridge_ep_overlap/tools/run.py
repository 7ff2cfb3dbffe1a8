"""``scripts/run_script.py``: recipe-level flags a user of MB's performance scripts recognises.

Contract
--------
``main(argv)`` maps the flags - ours, or Megatron-Bridge's performance-script spellings of those we
share (``tools.mb_flags``: same meaning; ``--moe_a2a_overlap false`` really turns overlap off; any
other flag of theirs refused by name) - onto a ``RunSpec`` (``runtime.flags``), or reads the whole
``RunSpec`` from ``--spec FILE`` (``runtime.spec_file``: what ``launch_slurm.py`` and ``bench`` give the
jobs they launch; checked as the flags are, any run-description flag beside it refused; training
probes this machine as the target, a dry run judges the file's) - and builds it (``pipeline.build``:
recipe, sizes, EP overlap on or *really* off, overrides, one rule evaluation), then either

* ``--dryrun``: runs MB's ``runtime_config_update`` for the described target (``--gpu``,
  ``--num-gpus``, ``--te``; hardware and version gates simulated, nothing else), prints the report
  ``plan`` prints (``tools.plan_report``: the verdict, what changed, the rules that fail, advise or
  could not be checked, the finalized fields one per line as ``name: value``) on stdout - a refusal
  too, exit 1 -, writes the resolved YAML - plain Megatron-Bridge's form (``core.export``), loadable
  without this package - and prints its path; or
* trains on this machine (the target is probed): MB's ``pretrain()`` with
  ``mbridge_ep_overlap.forward_step`` (MB's GPT step whose overlapped path also passes packed
  sequences), wrapped by ``evidence.ScheduleCounter`` and recorded by ``evidence.RunRecorder``
  (``--summary-json``). faulthandler is on, so a native crash prints every rank's Python stack.
  Every rank also leaves ``<output-dir>/evidence/`` (``runtime.rank_evidence``: flight recorder,
  faulthandler file, progress watchdog, facts) unless ``--evidence off`` or ``EP_OVERLAP_EVIDENCE=0``.

The output folder is checked before anything is built. Exit codes: 0 ok; 1 refused config (every
violation printed); 2 bad usage (one line, no traceback: unknown flag, bad value, unknown recipe,
malformed override, an output path that cannot be written).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..base.choices import ON_OFF
from ..base.errors import UsageError
from ..runtime.exits import OneLineArgumentParser, crash_stream, release_stderr, run_reporting_errors
from ..runtime.flags import add_spec_arguments, parse, spec_from_args
from .mb_flags import TABLE as MB_TABLE
from .mb_flags import translate
from .plan_report import judge


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="run_script.py", description="Train or dry-run an EP-overlap recipe with Megatron-Bridge.",
                              epilog="Megatron-Bridge's performance-script spellings of the flags shared with them are "
                                     "accepted with the same meaning: " + "; ".join(
                                         f"{mb} = {ours}" for mb, ours, _ in MB_TABLE) + " (docs/run_script.md). "
                                     "Any other flag of theirs is refused by name.")
    add_spec_arguments(p, spec_file=True)
    p.add_argument("--dryrun", action="store_true", help="finalize for the target and write the resolved YAML; no training")
    p.add_argument("--rules", action="store_true", help="dry run: every rule of the table, not only those that fail, "
                   "advise or could not be checked")
    p.add_argument("--predict", action=argparse.BooleanOptionalAction, default=False,
                   help="dry run: the predicted step time with overlap off and on (docs/prediction.md)")
    p.add_argument("--output-dir", default="out/run_script", help="where the YAML / summary go")
    p.add_argument("--summary-json", default=None, help="training: write the evidence summary here")
    p.add_argument("--profile-steps", default=None, metavar="A:B",
                   help="training: profile CUDA kernels from step A to B (overlap efficiency in the summary)")
    p.add_argument("--evidence", choices=("on", "off"), default=None,
                   help="training: write <output-dir>/evidence/ (flight recorder, stacks, watchdog, facts); "
                        "default on unless EP_OVERLAP_EVIDENCE=0")
    p.add_argument("--watchdog-s", default=None, metavar="S",
                   help="training: seconds without a completed iteration that count as a stall (0: watchdog off; "
                        "default max(60 s, 10 x median step time), or EP_OVERLAP_WATCHDOG_S)")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    try:
        argv = translate(argv)
    except UsageError as e:
        parser.error(str(e))
    args = parse(parser, argv)
    if args.dryrun:
        for flag, value in (("--summary-json", args.summary_json), ("--profile-steps", args.profile_steps),
                            ("--evidence", args.evidence), ("--watchdog-s", args.watchdog_s)):
            if value is not None:
                parser.error(f"{flag} applies to training; a --dryrun trains nothing (drop one of them)")
    else:
        for flag, value in (("--rules", args.rules), ("--predict", args.predict)):
            if value:
                parser.error(f"{flag} applies to a --dryrun (training prints the plan, not the report)")
    if args.profile_steps is not None:
        a, sep, b = args.profile_steps.partition(":")
        if not (sep and re.fullmatch(r"[0-9]+", a) and re.fullmatch(r"[0-9]+", b) and int(a) < int(b)):
            parser.error(f"--profile-steps must be A:B with A < B, got {args.profile_steps!r}")
        args.profile_steps = (int(a), int(b))
    if args.watchdog_s is not None:
        try:
            ok = float(args.watchdog_s) >= 0
        except ValueError:
            ok = False
        if not ok:
            parser.error(f"--watchdog-s must be a number of seconds >= 0 (0: watchdog off), got {args.watchdog_s!r}")
    return args


def writable_folder(path: str) -> Path:
    """Create ``path`` (and parents) or raise OSError naming it - before any work is done."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's word for a file, or a symbolic-link loop, in the way
        why = "is a symbolic-link loop" if folder.is_symlink() and not folder.exists() else "exists and is not a folder"
        raise NotADirectoryError(20, why, str(folder)) from None
    if not os.access(folder, os.W_OK):
        raise PermissionError(13, "not writable", str(folder))
    return folder


def _dry_run(args: argparse.Namespace) -> int:
    out = writable_folder(args.output_dir)
    spec = spec_from_args(args)  # bad usage (an unknown recipe) refused before Megatron is imported
    from ..core import export  # start-up speed: the export module imports Megatron-Bridge

    outcome = judge(spec, predict=args.predict, all_rules=args.rules)
    print("\n".join(outcome.lines))
    if outcome.code:
        return outcome.code
    built = outcome.built
    yaml_path = out / f"{built.recipe.name.replace(':', '.')}.yaml"
    export.write_yaml(built.cfg, yaml_path)  # plain MB's ConfigContainer: loads without this package
    print(f"config: {yaml_path}")
    return 0


def _writable_file(path: str) -> Path:
    """``path``'s folder created and writable, and ``path`` not a folder - before any work is done."""
    file = Path(path)
    writable_folder(str(file.parent))
    if file.is_dir():
        raise IsADirectoryError(21, "is a folder, not a file", str(file))
    return file


def require_gpus() -> None:
    """Training runs MB's ``pretrain()`` on this machine's CUDA GPUs; without one it would die in
    Megatron's initialization with a bare assertion."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("CUDA GPUs", 0, "training runs on a GPU node; on this machine check the config for a "
                         "cluster with --dryrun --gpu NAME --num-gpus N", "cannot train on this machine:")


def train(args: argparse.Namespace) -> int:
    import faulthandler

    # a native crash (SIGSEGV in a kernel library) prints every thread's stack on the process's real stderr
    # (and, once the evidence starts, into the rank's evidence file as well)
    faulthandler.enable(file=crash_stream(), all_threads=True)
    out = writable_folder(args.output_dir)
    summary = str(_writable_file(args.summary_json)) if args.summary_json else None
    spec = spec_from_args(args, this_machine=True)  # bad usage refused before Megatron is imported
    from ..target import shims

    shims.install()
    from ..core.forward_step import forward_step
    from ..lab.evidence import ScheduleCounter

    counter = ScheduleCounter().install()
    try:
        return _train(args, spec, out, summary, counter, counter.wrap_forward_step(forward_step))
    finally:
        counter.uninstall()


REEXEC_MARK = "EP_OVERLAP_ENV_REEXEC"
"""Set in a rank that re-executed itself with ``cfg.env_vars`` exported (so it never loops)."""


def env_too_late(env_vars: dict, environ, cuda_initialized: bool) -> dict[str, str]:
    """The ``cfg.env_vars`` entries this process would get too late: those MB's ``setdefault`` would add
    (the launcher did not export them) once CUDA is already initialised here - CUDA reads
    ``CUDA_DEVICE_MAX_CONNECTIONS`` when its context is created, so MB's ``pretrain()`` applying it
    afterwards changes nothing. Empty when nothing is late, or after a re-execution."""
    if not cuda_initialized or environ.get(REEXEC_MARK):
        return {}
    from ..base.values import env_value  # start-up speed: the training path only

    return {str(k): env_value(v) for k, v in (env_vars or {}).items() if str(k) not in environ}


def reexec_if_env_too_late(cfg) -> None:
    """Re-execute this rank with the late ``cfg.env_vars`` exported, so they are in force before CUDA starts
    (importing Megatron initialises CUDA in this process before MB could apply them; measured on 1x H200,
    2026-12-01). The same PID and arguments; torchrun sees one worker."""
    import torch

    late = env_too_late(getattr(cfg, "env_vars", None) or {}, os.environ, torch.cuda.is_initialized())
    if not late:
        return
    print(f"run_script.py: CUDA was initialised before cfg.env_vars could apply ({', '.join(sorted(late))}); "
          "re-executing this rank with them exported so they are in force", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.environ.update({**late, REEXEC_MARK: "1"})
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _train(args: argparse.Namespace, spec, out: Path, summary: str | None, counter, step) -> int:
    from megatron.bridge.training.pretrain import pretrain

    from ..core import enforcement
    from ..pipeline import build
    from ..lab.evidence import RunRecorder
    from ..runtime.rank_evidence import evidence_callbacks

    built = build(spec, forward_step_func=step)
    if built.plan is not None and int(os.environ.get("RANK", "0")) == 0:
        print(built.plan.to_table(), flush=True)
    require_gpus()  # after the plan: a refused config is reported (exit 1) on any machine
    reexec_if_env_too_late(built.cfg)
    callbacks = evidence_callbacks(args, out, built.cfg, stderr=crash_stream())  # before pretrain()
    release_stderr()  # training's own logs stream from here
    name = built.recipe.name.replace(":", ".")
    summary = summary or str(out / f"{name}.summary.json")
    on_off = {value: word for word, value in ON_OFF.items()}
    meta = {"recipe": spec.recipe, "ep_overlap": on_off[spec.ep_overlap], "dispatcher_flag": spec.dispatcher,
            "delay_wgrad": None if spec.delay_wgrad is None else on_off[spec.delay_wgrad],
            "overrides": list(spec.overrides)}
    with enforcement.already_checked(built.cfg, built.report):
        pretrain(built.cfg, step, callbacks=[RunRecorder(summary, counter, meta, profile_steps=args.profile_steps),
                                             *callbacks])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_reporting_errors("run_script.py", lambda: _dry_run(args) if args.dryrun else train(args), hold_stderr=not args.verbose)
