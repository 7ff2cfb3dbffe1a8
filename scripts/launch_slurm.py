#!/usr/bin/env python3
"""Render or submit the sbatch job for an EP-overlap recipe (see mbridge_ep_overlap.slurm).

    python scripts/launch_slurm.py --recipe qwen3_30b_a3b --nodes 2 --gpus-per-node 8 --dryrun > job.sbatch
"""

import os
import sys

# stdout carries the job script alone: Megatron logs on stdout while it imports and builds
# configs, so everything else goes to stderr.
script_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

from mbridge_ep_overlap.slurm import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(script_out=script_out))
