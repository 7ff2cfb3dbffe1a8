#!/usr/bin/env python3
"""A/B benchmark of EP-overlap variants on a GPU node (``mbridge-ep-overlap bench run``; see
mbridge_ep_overlap.lab.bench).

    python scripts/benchmark_ep_overlap.py --variants off,overlap,overlap:hiprio --links throttled \
        --shape long-seq --out out/bench
"""

import sys

from mbridge_ep_overlap.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "run", *sys.argv[1:]]))
