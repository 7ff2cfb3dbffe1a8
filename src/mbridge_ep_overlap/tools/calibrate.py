"""``mbridge-ep-overlap calibrate RESULTS... -o FILE``: refit the step-time model's cluster inputs.

Contract: reads bench ``results.json`` files (``lab.results.load_results``: every row checked) measured
on the cluster described by ``--gpu`` / ``--num-gpus`` (and ``--gpus-per-node`` / ``--nvlink-domain-size``
when they differ from the GPU kind's), fits the compute efficiencies, the all-to-all bandwidth inside
the NVLink domain and - when rows of multi-node runs (EP spanning NVLink domains) are among them - the
scale-out (inter-node) bandwidth from the overlap-off rows (``predict.cluster_calibration``; else it
says the default scale-out link was kept) and writes the calibration
file ``-o FILE`` that ``plan --predict --calibration FILE`` uses. Rows of other variants than ``off`` and
``overlap``, rows measured on another link than the machine as it is (bench's ``nvlink``; ``throttled``
is NCCL through host memory) and failed rows are not used, each named on stderr. stdout: what was fitted, from what, what
was not, and every used row's predicted / measured step after the fit. Exit 0 written; 2 for bad usage,
an unreadable results file, rows the fit cannot use (one line); nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..base.errors import UsageError
from ..runtime.exits import positive_int
from ..lab.results import load_calibration, load_results
from .plan_report import judge

_USED_VARIANTS = ("off", "overlap")


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="refit the step-time model's cluster inputs from your measured rows")
    p.add_argument("results", nargs="+", metavar="RESULTS", help="bench results.json files measured on one cluster")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the calibration file to write")
    p.add_argument("--gpu", required=True, help="the GPU kind the rows were measured on (h100, h200, b200, ...)")
    p.add_argument("--num-gpus", type=positive_int, required=True, metavar="N", help="GPUs of each measured run")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="N")
    p.add_argument("--nvlink-domain-size", type=positive_int, default=None, metavar="N")
    p.set_defaults(handler=main)


def measured_rows(paths: list[str]):
    """The usable rows of the results files as ``MeasuredRow``s (ids ``<file>#<row>``, 1-based)."""
    from ..predict.cluster_calibration import MeasuredRow  # start-up: the model only when used

    rows = []
    for path in paths:
        for i, r in enumerate(load_results(Path(path)), 1):
            rid = f"{path}#{i}"
            if not r.ok or r.median_s is None or r.variant not in _USED_VARIANTS or r.link != "nvlink":
                print(f"calibrate: not used: {rid} ({r.variant}, link {r.link}, {'ok' if r.ok else 'failed'})",
                      file=sys.stderr)
                continue
            rows.append(MeasuredRow(id=rid, variant=r.variant, median_s=r.median_s, finalized=dict(r.finalized),
                                    profile=r.overlap_efficiency))
    return rows


def main(args: argparse.Namespace) -> int:
    from ..predict.cluster_calibration import fit_cluster  # start-up: the model only when used
    from ..predict.costs import gpu_spec
    from ..predict.inputs import Cluster

    try:
        gpu_spec(args.gpu.lower())
    except KeyError as e:
        raise UsageError("--gpu", args.gpu, e.args[0].split(": ", 1)[-1], "unknown") from None
    cluster = Cluster(gpu=args.gpu.lower(), num_gpus=args.num_gpus, gpus_per_node=args.gpus_per_node,
                      nvlink_domain_size=args.nvlink_domain_size)
    rows = measured_rows(args.results)
    try:
        cal = fit_cluster(rows, cluster)
    except ValueError as e:
        raise UsageError("measured rows", ", ".join(args.results), str(e), "unusable") from None
    try:
        cal.save(args.output)
    except OSError as e:
        raise UsageError("-o", args.output, f"a file that can be written ({e.strerror or e})", "unwritable") from None
    lines = [f"calibration written: {args.output} ({cluster.num_gpus}x {cluster.gpu}, {len(cal.rows)} overlap-off rows)"]
    lines += [f"  {k:28s}: {v:.4g}" for k, v in cal.fitted.items()]
    lines += [f"  fitted      : {line}" for line in cal.how]
    lines += [f"  not fitted  : {line}" for line in cal.not_fitted]
    lines += [f"  {rid}: predicted / measured step {1 + e:.3f}" for rid, e in cal.errors.items()]
    print("\n".join(lines))
    print(f"use it: mbridge-ep-overlap plan ... --predict --calibration {args.output}")
    return 0


def judged_with(path: str, spec, *, predict: bool | None, all_rules: bool):
    """``plan_report.judge`` (``plan --calibration``) predicting with the calibration file ``path``; the
    report says so (a line after the verdict; ``"calibration"`` in the JSON). A file that is not a
    calibration is bad usage."""
    if predict is False:
        raise UsageError("--calibration", path, "with --predict (a calibration is for the step-time prediction)",
                         "unused")
    cal = load_calibration(path)
    outcome = judge(spec, predict=True, all_rules=all_rules, calibration=cal.calibration())
    if outcome.code == 0:
        fitted = ", ".join(f"{k} {v:.4g}" for k, v in cal.fitted.items())
        outcome.lines.insert(1, f"calibration in use: {path} (measured on {cal.cluster.get('num_gpus')}x {cal.gpu}; "
                                f"{fitted})")
        outcome.data["calibration"] = {"file": path, **cal.to_dict()}
    return outcome
