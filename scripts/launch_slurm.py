#!/usr/bin/env python3
"""Render or submit the sbatch job for an EP-overlap recipe (see mbridge_ep_overlap.tools.slurm).

    python scripts/launch_slurm.py --recipe qwen3_30b_a3b --nodes 2 --gpus-per-node 8 --dryrun > job.sbatch

stdout carries the job script alone; Megatron's log lines go to stderr.
"""

import sys

from mbridge_ep_overlap.tools.slurm import main

if __name__ == "__main__":
    sys.exit(main())
