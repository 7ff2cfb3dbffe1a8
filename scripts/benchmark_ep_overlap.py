#!/usr/bin/env python3
"""A/B benchmark of EP-overlap variants on a GPU node (see mbridge_ep_overlap.bench).

    python scripts/benchmark_ep_overlap.py --variants off,overlap --links nvlink,throttled --comm-bound \
        --out out/bench -- --seq-length 512 --micro-batch-size 16 --global-batch-size 512
"""

import sys

from mbridge_ep_overlap.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
