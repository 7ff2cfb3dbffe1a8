"""Record real ``py-spy dump`` output of a stuck two-rank job, for the diagnose tests.

Contract: ``python scripts/diagnose/record_pyspy_dumps.py PY_SPY OUT_FILE`` starts two CPU ranks (gloo) with
torchrun; rank 0 enters an all-reduce while rank 1 sits in a slow data-loading function, so rank 0 waits for
rank 1. After a few seconds it runs ``PY_SPY dump --pid PID`` on each rank's process, writes both dumps, one after
the other as a user pastes them, to OUT_FILE, and stops the job. Needs py-spy (``pip install py-spy``) and
permission to read the ranks' memory (ptrace). The text is kept unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

_RANK = """
    import os, time, datetime, torch, torch.distributed as dist

    def load_next_batch(step):
        time.sleep(3600)

    def train_step(step, x):
        if dist.get_rank() == 1:
            load_next_batch(step)
        dist.all_reduce(x)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    open(os.path.join(os.environ["PID_DIR"], str(dist.get_rank())), "w").write(str(os.getpid()))
    x = torch.ones(1024)
    for step in range(3):
        train_step(step, x)
"""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: record_pyspy_dumps.py PY_SPY OUT_FILE", file=sys.stderr)
        return 2
    py_spy, out = argv
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(textwrap.dedent(_RANK))
        env = {**os.environ, "PID_DIR": tmp}
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--master_port", "29547", str(script)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            pids = {}
            for _ in range(120):
                pids = {r: Path(tmp, str(r)).read_text() for r in (0, 1) if Path(tmp, str(r)).exists()}
                if len(pids) == 2:
                    break
                time.sleep(0.5)
            time.sleep(3)
            dumps = [subprocess.run([py_spy, "dump", "--pid", pids[r]], capture_output=True, text=True,
                                    timeout=60).stdout for r in (0, 1)]
            Path(out).write_text("\n".join(dumps))
        finally:
            os.killpg(job.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
