"""What the launchers say when a multi-node job fails: torchrun's failure summary, Slurm's step messages (slurmstepd,
srun) and c10d's TCPStore errors. ``diagnose.launcher`` reads them for the rank, host, exit code, the time-limit
verdict and the store's address.

Contract
--------
torchrun's summary is read by ``diagnose.launcher`` (``found_by="launcher"``): no pattern of its own, its fixed
text is torch's (``torch/distributed/elastic/multiprocessing/errors/__init__.py``). A root cause that died of
SIGSEGV / SIGABRT stays with ``crash.segmentation-fault`` / ``crash.abort-signal``. Slurm's texts are the format
strings of the installed Slurm 22.05 binaries (``SLURM_BINARY`` in ``source``: the launcher test renders each
emitted line from one), newer wordings an excerpt of SchedMD/slurm; c10d's are what the installed torch's
TCPStore raises, triggered on CPU in the launcher test (``STORE_TRIGGERED`` in ``source``).
"""

from __future__ import annotations

from .base import Signature

SLURM_BINARY = "a format string of the installed binary"
"""Said in ``source`` where ``emitted`` is rendered from a format string the named Slurm binary holds."""
STORE_TRIGGERED = "raised by the installed TCPStore in the launcher test"
"""Said in ``source`` where the launcher test makes torch's TCPStore print the text on CPU."""
SLURM_AT = "SchedMD/slurm@284c3b95f08a2dc2478499837b03355e1b9c5c75"
"""SchedMD/slurm master (2026-08), where the newer wordings of the step messages are."""
_STEPD = f"installed:/usr/sbin/slurmstepd ({SLURM_BINARY})"
_TORCH_ERRORS = "installed:torch/distributed/elastic/multiprocessing/errors/__init__.py"
_STORE = f"installed:torch/lib/libtorch_cpu.so (c10d's TCPStore, {STORE_TRIGGERED})"

TEARDOWN = ("the other ranks' exit code -15 (SIGTERM) is torchrun tearing them down after the first failure, "
             "not a cause")

SIGNATURES = (
    Signature(
        id="torchrun-rank-killed", symptom="crash",
        patterns=(),
        cause="torchrun's root cause is a rank killed with SIGKILL (exit code -9) from outside the process: most "
              "often the kernel's OOM killer (host memory: dataloader workers, pinned memory, CPU offload, every "
              "rank's checkpoint buffers at once) or the scheduler (time limit, cancel); " + TEARDOWN + ".",
        fix="look at `dmesg -T | grep -i -E 'killed process|out of memory'` on the rank's host and at the Slurm step "
            "messages (`sacct -j JOB --format=JobID,State,ExitCode,MaxRSS,ReqMem`); for host memory: fewer dataloader "
            "workers, no pinned-memory or CPU-offload buffers beyond need, more --mem per node",
        source=_TORCH_ERRORS, emitted=("Signal 9 (SIGKILL) received by PID 716",),
        confidence=0.5, found_by="launcher", versions="torch 2.x"),
    Signature(
        id="torchrun-rank-failed", symptom="crash",
        patterns=(),
        cause="torchrun's root cause is one rank that failed by itself (an exit code above 0: it raised, or called "
              "sys.exit); its own error is the cause, and " + TEARDOWN + ".",
        fix="read the root-cause rank's traceback (its `[rankN]:` lines, its per-rank log under torchrun's --log-dir, "
            "or its error_file when the entry point is wrapped in torch.distributed.elastic's @record)",
        source=_TORCH_ERRORS,
        emitted=("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",),
        confidence=0.3, generic=True, found_by="launcher", versions="torch 2.x"),
    Signature(
        id="torchrun-ranks-terminated", symptom="crash",
        patterns=(),
        cause="Every rank torchrun lists ended with SIGTERM / SIGINT / SIGHUP: the agent itself was told to stop (the "
              "scheduler's time limit or cancel, or another node's failure that ended the rendezvous).",
        fix="look at the other nodes' logs and the Slurm step messages for the first failure",
        source=_TORCH_ERRORS, emitted=("Signal 15 (SIGTERM) received by PID 715",),
        confidence=0.2, generic=True, found_by="launcher", versions="torch 2.x"),
)

SIGNATURES += (
    Signature(
        id="slurm-time-limit", symptom="hang",
        patterns=(r"\*\*\* \S+(?: \S+)? ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*",),
        cause="Slurm cancelled the job at its time limit; the detail says whether iterations were still completing "
              "before the cancel or had stopped (then something hung first: the other findings say what).",
        fix="when iterations had stopped, read the other findings for what hung; when no iteration was logged, the "
            "initialisation (or checkpoint load) took the time",
        source=_STEPD, emitted=("slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT 2026-12-03T04:00:12 DUE "
                                "TO TIME LIMIT ***",),
        confidence=0.3, generic=True, versions="Slurm 22.05 and later"),
    Signature(
        id="slurm-time-limit-too-short", symptom="hang",
        patterns=(),
        cause="Slurm cancelled the job at its time limit while iterations were still completing at a steady pace: the "
              "time limit is simply too short for the iterations asked for.",
        fix="ask for more time (--time), or fewer iterations per job: save checkpoints (--save-interval) and resume "
            "in a follow-up job (sbatch --dependency=afterany:JOB)",
        source=_STEPD, emitted=(), confidence=0.7, found_by="launcher", versions="Slurm 22.05 and later"),
    Signature(
        id="slurm-node-failure", symptom="crash",
        patterns=(r"CANCELLED AT \S+ DUE TO NODE FAILURE", r"\bNode failure on \S+"),
        cause="Slurm lost a node of the job (it stopped answering slurmctld): the ranks there died with it, and the "
              "others' errors (NCCL / store connection lost) follow from it.",
        fix="resubmit excluding the node (--exclude=NODE) and report it to the cluster's admins (slurmctld's log "
            "says why it was marked down)",
        source=_STEPD, excerpts=(f"{SLURM_AT}:src/slurmd/slurmstepd/req.c:1121-1147",),
        emitted=("slurmstepd: error: *** STEP 4242.0 ON gpu-node-07 CANCELLED AT 2026-12-03T04:00:12 DUE TO NODE "
                 "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "srun: error: Node failure on gpu-node-07"),
        confidence=0.75, versions="Slurm 22.05 and later"),
    Signature(
        id="slurm-preempted", symptom="crash",
        patterns=(r"CANCELLED AT \S+ DUE TO PREEMPTION \*\*\*",),
        cause="Slurm preempted the job for a higher-priority one: nothing in the run failed.",
        fix="resume from the last checkpoint; submit to a partition / QOS that is not preemptible, or requeue "
            "automatically (--requeue with checkpoints)",
        source=_STEPD, emitted=("slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT 2026-12-03T04:00:12 DUE "
                                "TO PREEMPTION ***",),
        confidence=0.75, versions="Slurm 22.05 and later"),
    Signature(
        id="slurm-cancelled", symptom="hang",
        patterns=(r"\*\*\* \S+(?: \S+)? ON \S+ CANCELLED AT \S+ \*\*\*", r"CANCELLED AT \S+ DUE to SIGNAL \S+"),
        cause="Someone cancelled the job (scancel): not a failure by itself; the other findings say what was wrong "
              "when it was cancelled because it stopped progressing.",
        fix="when it was cancelled because it hung, read the other findings and the iteration lines before the cancel",
        source=_STEPD, excerpts=(f"{SLURM_AT}:src/slurmd/slurmstepd/req.c:1121-1147",),
        emitted=("slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT 2026-12-03T04:00:12 ***",),
        confidence=0.2, generic=True, versions="Slurm 22.05 and later"),
    Signature(
        id="slurm-oom-kill", symptom="oom",
        patterns=(r"Detected \S+ oom[-_]kill event.{0,12} in \S+\. Some of (?:your processes may have been killed by "
                  r"the cgroup out-of-memory handler|the step tasks have been OOM Killed)",
                  r"(?<!\S)\S+: tasks? [0-9,\-\[\]]+: Out Of Memory"),
        cause="The kernel's OOM killer killed processes of the Slurm step: the step's cgroup ran past its HOST memory "
              "limit (not GPU memory) - dataloader workers, pinned-memory buffers, CPU offload, or every rank of the "
              "node building its checkpoint in host memory at once. A rank killed this way shows as exit code -9 "
              "(SIGKILL) in torchrun's summary.",
        fix="`sacct -j JOB --format=JobID,MaxRSS,ReqMem` shows the step's peak host memory against what was asked: "
            "ask for more (--mem / --mem-per-gpu, or --mem=0 for the whole node), use fewer dataloader workers, less "
            "pinned memory, no CPU offload, or a checkpoint format that does not stage the whole state in host memory",
        source=f"installed:/usr/lib/x86_64-linux-gnu/slurm-wlm/task_cgroup.so ({SLURM_BINARY})",
        excerpts=(f"{SLURM_AT}:src/plugins/task/cgroup/task_cgroup_memory.c:290-294",),
        emitted=("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0. Some of your processes may have "
                 "been killed by the cgroup out-of-memory handler.",),
        confidence=0.85, versions="Slurm 22.05 (oom-kill event(s)); newer Slurm (oom_kill event ... OOM Killed)"),
    Signature(
        id="slurm-task-exit-code", symptom="crash",
        patterns=(r"(?<!\S)\S+: tasks? [0-9,\-\[\]]+: Exited with exit code \d+",),
        cause="srun reports a task that exited non-zero: with torchrun per node the task is that node's agent, which "
              "exits 1 when one of its ranks failed; the rank's own error is the cause.",
        fix="read torchrun's failure summary of that node (its root cause) and that rank's traceback",
        source=f"installed:/usr/lib/x86_64-linux-gnu/slurm-wlm/launch_slurm.so ({SLURM_BINARY})",
        emitted=("srun: error: gpu-node-07: task 3: Exited with exit code 1",),
        confidence=0.2, generic=True, versions="Slurm 22.05 and later"),
)

SIGNATURES += (
    Signature(
        id="c10d-store-port-in-use", symptom="config-error",
        patterns=(r"The server socket has failed to (?:listen|bind)\b.*(?:name: EADDRINUSE|\(errno: 98 - Address "
                  r"already in use\))",),
        cause="The rendezvous store (torch's TCPStore on MASTER_ADDR) could not listen on MASTER_PORT: another job or "
              "process on that node holds the port (a second run on the same node, or a previous one still exiting).",
        fix="pick another port per job, e.g. MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000)) (torchrun "
            "--master-port / --rdzv-endpoint HOST:PORT); `ss -ltnp | grep PORT` on the node shows who holds it",
        source=_STORE,
        emitted=("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                 "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
                 "[W1203 02:54:55.551935739 socket.cpp:525] [c10d] The server socket has failed to bind to "
                 "[::]:29500 (errno: 98 - Address already in use)."),
        confidence=0.85, versions="torch 2.x (libuv and classic TCPStore backends)"),
    Signature(
        id="c10d-store-connect-timeout", symptom="hang",
        patterns=(r"The client socket has timed out after \d+m?s while trying to connect to \(\S+, \d+\)",),
        cause="A rank could not reach the rendezvous store (torch's TCPStore on MASTER_ADDR:MASTER_PORT) before its "
              "timeout: rank 0 / the first node's agent not started yet or already failed, a wrong MASTER_ADDR or "
              "port, or a firewall between the nodes.",
        fix="check MASTER_ADDR / MASTER_PORT (the first node of the allocation: `scontrol show hostnames "
            "$SLURM_JOB_NODELIST | head -n1`), that rank 0's node started and did not fail first (its log), and "
            "that the port is reachable from the other nodes (`nc -zv HOST PORT`)",
        source=_STORE,
        emitted=("torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
                 "connect to (127.0.0.1, 29500).",),
        confidence=0.6, versions="torch 2.x"),
    Signature(
        id="c10d-store-connection-lost", symptom="crash",
        patterns=(r"(?:sendBytes|recvValue\w*|recvBytes|recvVector\w*|recvString) failed on SocketImpl\(.*\): "
                  r"(?:Connection reset by peer|Broken pipe|Failed to recv, got 0 bytes)",
                  r"DistNetworkError: (?:Connection reset by peer|Broken pipe|Failed to recv, got 0 bytes\.)"),
        cause="A rank lost its connection to the rendezvous store (torch's TCPStore): the process hosting it (rank 0, "
              "or torchrun's agent on the first node) exited first; its own error is the cause, not this one.",
        fix="read the log of the rank / node hosting the store (MASTER_ADDR) for its first error",
        source=_STORE,
        emitted=("[W1203 02:54:31.608612177 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=4, "
                 "addr=[::ffff:127.0.0.1]:46270, remote=[::ffff:127.0.0.1]:46225): Broken pipe",
                 "torch.distributed.DistNetworkError: Connection reset by peer",
                 "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did "
                 "the remote server shutdown or crash?"),
        confidence=0.4, generic=True, versions="torch 2.x"),
)

SIGNATURES += (
    Signature(
        id="nccl-duplicate-gpu", symptom="crash",
        patterns=(r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device",),
        cause="NCCL refused to build a communicator with two ranks on one GPU: more ranks were started per node than "
              "it has visible GPUs (nproc_per_node / --ntasks-per-node above the GPUs, or CUDA_VISIBLE_DEVICES / "
              "--gpus-per-task narrower than the launcher assumed), or the ranks do not pick their device from "
              "LOCAL_RANK.",
        fix="start one rank per visible GPU (nproc_per_node = GPUs per node; with Slurm, --ntasks-per-node and "
            "--gpus-per-node agree) and set each rank's device from LOCAL_RANK (torch.cuda.set_device)",
        source="installed:nvidia/nccl/lib/libnccl.so.2",
        emitted=("Duplicate GPU detected : rank 7 and rank 0 both on CUDA device f000",),
        confidence=0.9, versions="NCCL 2.x"),
)
