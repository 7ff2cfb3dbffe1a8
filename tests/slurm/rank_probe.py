#!/usr/bin/env python3
"""Stand-in for scripts/run_script.py where training would need a GPU: one rank of a gloo group.

Joins the process group torchrun's c10d rendezvous set up (env://), all-reduces rank + 1, and prints
``PROBE {json}`` with its rank, the world size, the sum and the value of every variable named on the
command line. With PROBE_FAIL_RANK=R, rank R then exits with PROBE_EXIT_CODE.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([rank + 1])
dist.all_reduce(value)
print("PROBE " + json.dumps({"rank": rank, "world_size": dist.get_world_size(), "sum": int(value.item()),
                             "env": {name: os.environ.get(name) for name in sys.argv[1:]}}), flush=True)
dist.destroy_process_group()
if os.environ.get("PROBE_FAIL_RANK") == str(rank):
    sys.exit(int(os.environ.get("PROBE_EXIT_CODE", "1")))
