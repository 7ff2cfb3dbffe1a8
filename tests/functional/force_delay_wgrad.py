#!/usr/bin/env python3
"""Train with delayed wgrad forced on, *bypassing* mbridge_ep_overlap's checks: the GPU check of the
``delay-wgrad-needs-te`` rule (what really happens when delayed wgrad runs on local layers).

    torchrun --nproc_per_node 2 tests/functional/force_delay_wgrad.py --recipe qwen3_moe_proxy --ep 2 ...
    python tests/functional/force_delay_wgrad.py --recipe qwen3_moe_proxy --dryrun   # CPU: config only

Same flags as ``scripts/run_script.py`` (``--output-dir``, ``--summary-json``, ``--dryrun``, ...). It
builds the run as ``run_script`` does with delayed wgrad *off* (what the rules accept), removes the
finalize-time enforcement, then sets ``comm_overlap.delay_wgrad_compute=True`` and trains through
MB's ``pretrain()`` - MB's and MCore's own checks still run. The evidence summary records the
delayed-wgrad counters with the gradient probe on (``evidence.WgradCounter``). Where Transformer
Engine does not import, ``ddp.overlap_grad_reduce`` is turned off too (MB's setup asserts TE >= 2.7
for it with delayed wgrad), and the summary says so. ``--dryrun`` prints the finalized
``delay_wgrad_compute`` for the described target instead of training.
"""

from __future__ import annotations

import faulthandler
import os
import sys


def force_delay_wgrad(cfg, te_available: bool) -> dict:
    """Remove our enforcement from ``cfg`` and force delayed wgrad on; returns what was forced."""
    from mbridge_ep_overlap.core import enforcement

    enforcement.remove(cfg)
    co = cfg.comm_overlap
    co.delay_wgrad_compute = True
    if getattr(co, "user_comm_overlap_cfg", None) is not None:  # a finalized snapshot wins over the field
        co.user_comm_overlap_cfg.delay_wgrad_compute = True
    forced = {"comm_overlap.delay_wgrad_compute": True, "enforcement": "removed"}
    if not te_available and cfg.ddp.overlap_grad_reduce:
        cfg.ddp.overlap_grad_reduce = False
        forced["ddp.overlap_grad_reduce"] = False
    return forced


def main(argv: list[str] | None = None) -> int:
    from mbridge_ep_overlap.runtime.flags import spec_from_args
    from mbridge_ep_overlap.tools.run import parse_args, writable_folder

    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = writable_folder(args.output_dir)
    from mbridge_ep_overlap.target import shims

    shims.install()
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.target.shims import real_te_available

    if args.dryrun:
        from mbridge_ep_overlap.target.simulated_finalize import finalize_for

        built = build(spec_from_args(args).replace(ep_overlap=True, delay_wgrad=False))
        forced = force_delay_wgrad(built.cfg, te_available=(built.target.te_version or "") != "")
        result = finalize_for(built.cfg, built.target)
        print(f"forced: {forced}")
        for line in result.lines():
            print(line)
        return 0

    faulthandler.enable(all_threads=True)  # a native crash prints every thread's stack
    from megatron.bridge.training.pretrain import pretrain

    from mbridge_ep_overlap.core.forward_step import forward_step
    from mbridge_ep_overlap.lab.evidence import RunRecorder, ScheduleCounter
    from mbridge_ep_overlap.runtime.rank_evidence import evidence_callbacks

    counter = ScheduleCounter(probe_wgrad=True).install()
    step = counter.wrap_forward_step(forward_step)
    spec = spec_from_args(args, this_machine=True).replace(ep_overlap=True, delay_wgrad=False)
    built = build(spec, forward_step_func=step)
    forced = force_delay_wgrad(built.cfg, te_available=real_te_available())
    summary = args.summary_json or str(out / "summary.json")
    meta = {"recipe": spec.recipe, "ep_overlap": "on", "dispatcher_flag": args.dispatcher, "delay_wgrad": "forced",
            "forced": forced, "overrides": list(spec.overrides)}
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"force_delay_wgrad: {forced}", flush=True)
    evidence = evidence_callbacks(args, out, built.cfg)  # before pretrain(): see runtime.rank_evidence
    pretrain(built.cfg, step, callbacks=[RunRecorder(summary, counter, meta), *evidence])
    counter.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
