#!/usr/bin/env python3
"""Train or dry-run an EP-overlap recipe through Megatron-Bridge (see mbridge_ep_overlap.tools.run).

    python scripts/run_script.py --recipe qwen3_30b_a3b --ep-overlap on --dispatcher alltoall --dryrun
    torchrun --nproc_per_node 2 scripts/run_script.py --recipe qwen3_moe_proxy --max-steps 8
"""

import sys

from mbridge_ep_overlap.tools.run import main

if __name__ == "__main__":
    sys.exit(main())
