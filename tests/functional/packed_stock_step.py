"""DEMONSTRATION ONLY - trains with the configuration our rules refuse, to show the upstream bug.

This launcher exists only to demonstrate, on GPUs, the Megatron-Bridge 0.6.2 bug behind rule
``packed-sequences-forward-step``: MB's stock ``gpt_step.forward_step``, on MCore's
combined-1F1B (EP-overlap) schedule, builds the schedule plan without the ``packed_seq_params`` it
builds for the normal path, so with packed (THD) data attention silently crosses document
boundaries. Never use it to train.

It is ``scripts/run_script.py``'s training path (``tools.run.train``) with one change: the config is
built and checked with ``mbridge_ep_overlap.forward_step`` (so ``build`` accepts it - with MB's
stock step it refuses, and this script records that refusal in the summary as
``refused_with_mb_stock_step``), then MB's ``pretrain()`` trains with MB's *stock*
``gpt_step.forward_step``, wrapped by ``evidence.ScheduleCounter`` and recorded by
``evidence.RunRecorder``. Same flags as ``run_script.py`` (``runtime.flags``) plus ``--output-dir`` /
``--summary-json``; no ``--dryrun``. Launched by ``test_packed_sequences_gpu.py`` through
``lab.launch.launch(..., script="tests/functional/packed_stock_step.py")``.
"""

from __future__ import annotations

import os
import sys


def train(args) -> int:
    import faulthandler

    faulthandler.enable(all_threads=True)
    from mbridge_ep_overlap.target import shims

    shims.install()
    from megatron.bridge.training import gpt_step
    from megatron.bridge.training.pretrain import pretrain

    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.core import enforcement
    from mbridge_ep_overlap.base.errors import EPOverlapError
    from mbridge_ep_overlap.core.forward_step import forward_step
    from mbridge_ep_overlap.lab.evidence import RunRecorder, ScheduleCounter
    from mbridge_ep_overlap.runtime.rank_evidence import evidence_callbacks
    from mbridge_ep_overlap.runtime.flags import spec_from_args
    from mbridge_ep_overlap.tools.run import writable_folder

    out = writable_folder(args.output_dir)
    counter = ScheduleCounter().install()
    stock_step = counter.wrap_forward_step(gpt_step.forward_step)  # MB 0.6.2's own step: the one under test
    spec = spec_from_args(args, this_machine=True)
    refused: list[str] = []
    try:
        build(spec, forward_step_func=stock_step)
    except EPOverlapError as e:  # expected with overlap on: what our rule says about this very run
        refused = sorted({v.rule_id for v in e.violations})
    built = build(spec, forward_step_func=counter.wrap_forward_step(forward_step))  # the same config, accepted
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(f"packed_stock_step: DEMONSTRATION of the upstream bug; build with MB's stock step refused by {refused}; "
              "training with gpt_step.forward_step anyway", flush=True)
    name = built.recipe.name.replace(":", ".")
    summary = args.summary_json or str(out / f"{name}.stock_step.summary.json")
    meta = {"recipe": spec.recipe, "ep_overlap": args.ep_overlap, "dispatcher_flag": args.dispatcher,
            "delay_wgrad": args.delay_wgrad, "overrides": list(spec.overrides),
            "forward_step": f"{gpt_step.forward_step.__module__}.{gpt_step.forward_step.__qualname__}",
            "refused_with_mb_stock_step": refused}
    with enforcement.already_checked(built.cfg, built.report):
        evidence = evidence_callbacks(args, out, built.cfg)  # before pretrain(): see runtime.rank_evidence
        pretrain(built.cfg, stock_step, callbacks=[RunRecorder(summary, counter, meta), *evidence])
    counter.uninstall()
    return 0


def main(argv: list[str] | None = None) -> int:
    from mbridge_ep_overlap.runtime.exits import run_reporting_errors
    from mbridge_ep_overlap.tools.run import parse_args

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dryrun or args.profile_steps is not None:
        print("packed_stock_step.py: --dryrun / --profile-steps are not supported here (use scripts/run_script.py)",
              file=sys.stderr)
        return 2
    return run_reporting_errors("packed_stock_step.py", lambda: train(args))


if __name__ == "__main__":
    sys.exit(main())
