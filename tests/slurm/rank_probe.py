#!/usr/bin/env python3
"""Stand-in for scripts/run_script.py where training would need a GPU: one rank of a gloo group.

Joins the process group torchrun's c10d rendezvous set up (env://), all-reduces rank + 1, and prints
``PROBE {json}`` with its rank, the world size, the sum and the value of every variable named on the
command line. With PROBE_FAIL_RANK=R, rank R then exits with PROBE_EXIT_CODE.

Called with run_script.py's arguments instead (a job array task: ``--spec FILE ... --summary-json
PATH``), it times a few all-reduces as "steps" and rank 0 writes an evidence summary at PATH in
run_script's form (``steps``: iteration, step_time_s, loss; ``finalized``: what the spec file sets) -
what ``bench report`` reads - naming the arguments it was given and the spec it read
(``probe_spec``), so a test sees which variant each task ran.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([rank + 1])
dist.all_reduce(value)
argv = sys.argv[1:]
run_flags = "--summary-json" in argv
names = [] if run_flags else argv
# one write of the whole line (print writes the newline separately): the ranks share srun's output pipe,
# where a write under PIPE_BUF is not interleaved with another rank's
line = "PROBE " + json.dumps({"rank": rank, "world_size": dist.get_world_size(), "sum": int(value.item()),
                             "env": {name: os.environ.get(name) for name in names},
                             **({"argv": argv} if run_flags else {})})
sys.stdout.write(line + "\n")
sys.stdout.flush()
if run_flags:
    steps = []
    for i in range(4):
        start = time.perf_counter()
        dist.all_reduce(torch.ones(1024))
        steps.append({"iteration": i + 1, "step_time_s": max(time.perf_counter() - start, 1e-6), "loss": 10.0 - i})
    if rank == 0:
        flag = dict(zip(argv, argv[1:]))
        with open(flag["--spec"]) as f:
            spec = json.load(f)
        summary = {"steps": steps, "probe_argv": argv, "probe_spec": spec,
                   "finalized": {"overlap_moe_expert_parallel_comm": spec["ep_overlap"],
                                 "global_batch_size": dist.get_world_size(), "seq_length": 16}}
        with open(flag["--summary-json"], "w") as f:
            json.dump(summary, f)
dist.destroy_process_group()
if os.environ.get("PROBE_FAIL_RANK") == str(rank):
    sys.exit(int(os.environ.get("PROBE_EXIT_CODE", "1")))
