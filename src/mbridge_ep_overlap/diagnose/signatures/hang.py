"""Hang: ranks stop making progress. NCCL collectives are seen by torch's flight recorder and the NCCL
watchdog; DeepEP and HybridEP kernels are not NCCL collectives, so their stalls show as the backends'
own timeouts or as this library's progress watchdog with every rank's Python stack."""

from __future__ import annotations

from .base import DEEPEP_AT, DEEPEP_V2_AT, HYBRID_EP_AT, Signature, github_blob

_STACKS_FIX = ("find the rank that diverged: `diagnose RUN_FOLDER` on a run launched by this library reads "
               "every rank's stack (watchdog) and the flight recorder; the rank that is not in the same "
               "dispatch/combine as the others is the one to debug")

SIGNATURES = (
    Signature(
        id="deepep-dispatch-timeout", symptom="hang",
        patterns=(r"DeepEP error: timeout \((dispatch|combine) CPU\)",),
        cause="DeepEP's dispatch did not receive the peers' data within its CPU-side wait: a peer rank did not "
              "reach the same dispatch (it diverged, stalled or died), or the internode RDMA/NVSHMEM path is not "
              "delivering (a DeepEP x NVSHMEM build mismatch does this too).",
        fix=_STACKS_FIX + "; check the other ranks' logs for the first error, and DeepEP's own internode "
            "test on the same nodes (NVSHMEM/IBGDA set-up)",
        source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/1335",
        emitted=("RuntimeError: DeepEP error: timeout (dispatch CPU)",), corpus_report="megatron-bridge-1335",
        confidence=0.85,
        rule="deepep-built-with-nvshmem", versions="DeepEP 1.x (deep_ep/buffer.py)"),
    Signature(
        id="deepep-v2-dispatch-cpu-wait-timeout", symptom="hang",
        patterns=(r"Dispatch CPU wait exception \(\S+:\d+\): CPU side received count",),
        cause="DeepEP V2's dispatch (ElasticBuffer, CPU-synchronised mode) waited longer than its CPU timeout for "
              "the token counts of its peers: a peer rank did not reach the same dispatch (it diverged, stalled or "
              "died), or the NCCL GIN / RDMA path is not delivering; the counts it did receive are printed after the "
              "colon (one per scale-up rank, then per local expert).",
        fix=_STACKS_FIX + "; a count that stays 0 names the peer that did not send; check the other ranks' logs for "
            "their first error",
        source=github_blob(DEEPEP_V2_AT, "csrc/elastic/buffer.hpp"),
        emitted=("RuntimeError: Dispatch CPU wait exception (/opt/DeepEP/csrc/elastic/buffer.hpp:1063): CPU side "
                 "received count (scaleup: 0): 128 0 # 64 64",),
        quote='                    throw EPExceptionWithLineInfo("Dispatch CPU wait", get_buffer_info());',
        quoted_at=f"{DEEPEP_V2_AT}:csrc/elastic/buffer.hpp:1063",
        confidence=0.85, versions="DeepEP V2 (ElasticBuffer)"),
    Signature(
        id="deepep-rdma-counters-never-arrived", symptom="hang",
        patterns=(r"num_recv_tokens: -1, num_rdma_recv_tokens: -1",),
        cause="DeepEP's internode dispatch did not receive the peers' token-count metadata over RDMA within its "
              "CPU-side wait (every receive counter stays -1).",
        fix="check the RDMA path between the nodes (NVSHMEM/IBGDA set-up, DeepEP's own internode test) and the "
            "DeepEP x NVSHMEM versions the job's image pairs",
        source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/5067",
        emitted=("Global rank: 6, num_recv_tokens: -1, num_rdma_recv_tokens: -1",),
        corpus_report="megatron-bridge-5067", confidence=0.9, rule="deepep-built-with-nvshmem",
        versions="DeepEP 1.x internode kernels"),
    Signature(
        id="deepep-peer-exited", symptom="hang",
        patterns=(r"destroy\(\) was not called before DeepEP buffer destruction",),
        cause="A rank failed and exited (its DeepEP buffer was destroyed without destroy()); the other ranks "
              "wait for it in the next dispatch or combine.",
        fix="find the first error in the rank that exited (its own log, or `diagnose` on the run folder); "
            "the hang on the others is a consequence",
        source="https://github.com/deepseek-ai/DeepEP/issues/368",
        emitted=("WARNING: destroy() was not called before DeepEP buffer destruction, which can leak resources.",),
        corpus_report="deepep-368", confidence=0.7, versions="DeepEP 1.x"),
    Signature(
        id="collective-not-joined", symptom="hang",
        patterns=(r"Not all ranks joining collective, sequence number",),
        cause="One or more ranks did not issue a collective the others issued (torch's flight-recorder "
              "analysis): the ranks' schedules diverged.",
        fix=_STACKS_FIX, source="installed:torch/distributed/flight_recorder/components/utils.py",
        emitted=("Not all ranks joining collective, sequence number: 12",), confidence=0.8,
        found_by="flight-recorder", versions="torch 2.6+"),
    Signature(
        id="progress-stalled", symptom="hang", patterns=(),
        cause="No iteration completed for longer than the progress watchdog's threshold.",
        fix=_STACKS_FIX, source="installed:mbridge_ep_overlap/base/run_files.py", emitted=(),
        confidence=0.5, generic=True, found_by="watchdog"),
    Signature(
        id="nccl-watchdog-timeout", symptom="hang",
        patterns=(r"Watchdog caught collective operation timeout",),
        cause="An NCCL collective did not complete within the process-group timeout: some rank did not join "
              "it, or is stuck before it.",
        fix=_STACKS_FIX, source="installed:torch/lib/libtorch_cuda.so",
        emitted=("[rank0]:[E1201 10:00:00.000000000 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog caught "
                 "collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLTOALL_BASE, NumelIn=2048, "
                 "NumelOut=2048, Timeout(ms)=20000) ran for 20074 milliseconds before timing out.",),
        confidence=0.4, generic=True, versions="torch 2.x"),
)

SIGNATURES += (
    Signature(
        id="hybridep-allgather-short", symptom="hang",
        patterns=(r"HYBRID-EP ALLGATHER TIMEOUT:SM \d+ \[\d+\]:expecting \d+ got \d+",),
        cause="HybridEP's NVLink allgather waited for every rank of the NVLink domain to arrive at the same call "
              "(a flag each rank raises by one per call, expected = calls x ranks) and too few arrived: a rank "
              "issued fewer HybridEP calls than the others (its code path or its token/microbatch count "
              "diverged), or stopped before this one.",
        fix=_STACKS_FIX + "; 'got' short of 'expecting' by k means k rank-calls missing (the detail says it); "
            "compare the ranks' numbers of dispatches per step (CUDA graphs on some ranks only, a skipped "
            "microbatch, uneven sequence packing)",
        source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/2012", corpus_report="megatron-bridge-2012",
        emitted=("HYBRID-EP ALLGATHER TIMEOUT:SM 13 [0]:expecting 5792 got 5791",),
        quote='          printf("HYBRID-EP ALLGATHER TIMEOUT:SM %d [%d]:expecting %llu got %llu\\n", blockIdx.x,',
        quoted_at=f"{HYBRID_EP_AT}:csrc/hybrid_ep/extension/allgather.cu:84",
        confidence=0.8, versions="DeepEP hybrid-ep (HybridEP)"),
    Signature(
        id="deepep-kernel-timeout", symptom="hang",
        patterns=(r"DeepEP (?:timeout for (?:dispatch|combine) (?:senders|receivers)|"
                  r"(?:dispatch|combine) [\w ()]*?timeout|RDMA sender coordinator timeout)",),
        cause="A DeepEP dispatch or combine kernel waited for a peer's queue head/tail beyond its device-side "
              "timeout: a peer rank did not enter the same dispatch/combine (it diverged or died), or the NVLink / "
              "RDMA path is not delivering (NVSHMEM transport, queue pairs).",
        fix=_STACKS_FIX + "; the line names the role (sender, receiver, forwarder) and, for internode kernels, the "
            "RDMA and NVLink ranks: a forwarder or RDMA receiver stuck on every rank points at the network, one "
            "rank's sender at that rank",
        source=github_blob(DEEPEP_AT, "csrc/kernels/intranode.cu"),
        emitted=("DeepEP timeout for dispatch receivers, rank 3, responsible_channel = 5, tokens remained: 17",),
        quote='                    printf("DeepEP timeout for dispatch receivers, rank %d, responsible_channel = %d, '
              'tokens remained: %d\\n", rank, responsible_channel, num_tokens_to_recv);',
        quoted_at=f"{DEEPEP_AT}:csrc/kernels/intranode.cu:385",
        confidence=0.75, rule="deepep-built-with-nvshmem", versions="DeepEP 1.x kernels"),
)

_C10D_SO = "installed:torch/lib/libtorch_cpu.so"
"""Where torch's process-group wrappers (ProcessGroupWrapper, ProcessGroupGloo) and gloo are compiled in."""

SIGNATURES += (
    Signature(
        id="faulthandler-timeout", symptom="hang",
        patterns=(r"^Timeout \(\d+:\d{2}:\d{2}(?:\.\d+)?\)!$",),
        cause="A process printed faulthandler's timeout dump (`faulthandler.dump_traceback_later`, this library's "
              "progress watchdog among them): it was alive but had not moved on within the timeout, and the stacks "
              "below the line are where each thread was waiting; per rank, the detail says which rank waits in a "
              "collective and which is elsewhere.",
        fix=_STACKS_FIX + "; a rank whose training thread is not in the collective the others wait in is the one "
            "that diverged (a skipped or extra call on its code path)",
        source="installed:python3.12 (faulthandler)",
        emitted=("Timeout (0:00:08)!",), confidence=0.6, versions="Python 3"),
    Signature(
        id="monitored-barrier-missing-ranks", symptom="hang",
        patterns=(r"Ranks? (?P<ranks>\d+(?:, ?\d+)*) failed to pass monitoredBarrier in \d+ ms",),
        cause="torch's monitored barrier (gloo; TORCH_DISTRIBUTED_DEBUG=DETAIL runs one before collectives) timed "
              "out waiting for the ranks it names: they did not reach the same point - stuck in an earlier call, "
              "or on another code path.",
        fix="read the named ranks' stacks (faulthandler, py-spy dump, or `diagnose` on a run folder of this "
            "library) for where they are instead; a rank in another collective or outside any is the one that "
            "diverged",
        source=_C10D_SO,
        emitted=("[rank0]: RuntimeError: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 10000 ms",),
        confidence=0.8, versions="torch 2.x (gloo)"),
    Signature(
        id="gloo-operation-timeout", symptom="hang",
        patterns=(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation to complete",),
        cause="A gloo collective (or send / recv) waited past the process group's timeout for a peer's data: the "
              "peer was alive but did not take part - stuck in an earlier call, or on a code path that skipped this "
              "one (the ranks diverged). The rank that prints it is the one that waited, not the one that diverged.",
        fix="find where the other ranks were: rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL (its monitored barrier "
            "names the ranks that did not arrive) or dump each rank's stacks at the timeout "
            "(faulthandler.dump_traceback_later, py-spy dump; this library's run folders keep both); a rank not "
            "waiting in the same call is the one that diverged",
        source=_C10D_SO,
        emitted=("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                 "Timed out waiting 10000ms for recv operation to complete",),
        confidence=0.7, versions="torch 2.x (gloo)"),
    Signature(
        id="collective-mismatch", symptom="config-error",
        patterns=(r"Detected mismatch between collectives on ranks",
                  r"Received data size doesn't match expected size\. Is there a distributed collective mismatch"),
        cause="The ranks issued different collectives at the same point (another operation, another tensor shape or "
              "dtype, or a different order): their code paths diverged - a rank-dependent branch, a tensor sized "
              "from per-rank data (token counts without padding), or a skipped call. torch's DETAIL check "
              "(TORCH_DISTRIBUTED_DEBUG=DETAIL) prints each rank's fingerprint; gloo only sees the size.",
        fix="compare the fingerprints in the line (OpType, TensorShape, SequenceNumber) between the ranks; without "
            "them rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL; make the call and its shape the same on every rank of "
            "the group",
        source=_C10D_SO,
        emitted=("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
                 "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float",
                 "what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
                 "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there "
                 "a distributed collective mismatch in your code?"),
        confidence=0.85, versions="torch 2.x"),
)

PY_SPY_AT = "benfred/py-spy@d230d8208d652ba168256ffb66170d1c6cd8b650"
"""py-spy, where the dump format ``diagnose.pyspy`` reads is printed (``src/dump.rs``, ``src/stack_trace.rs``)."""

SIGNATURES += (
    Signature(
        id="py-spy-stacks", symptom="hang", patterns=(),
        cause="py-spy's dumps show where each process was waiting (below): the processes all wait in the same call, "
              "so the one that stopped is not among the dumped processes, or is below Python (a kernel, the network, "
              "a DeepEP / HybridEP buffer that never received its tokens), or the ranks' collectives went out of step "
              "earlier (one rank skipped or added a call, and the calls they now wait in are not the same one: the "
              "flight recorder's sequence numbers show it).",
        fix="dump every rank of the job (`py-spy dump --pid PID` on each node, `--native` for the frames below "
            "Python) and compare: the rank not in the same dispatch / combine / collective as the others is the one "
            "to debug; a run launched by this library writes every rank's stack itself (watchdog, faulthandler)",
        source=github_blob(PY_SPY_AT, "src/dump.rs"), emitted=(),
        excerpts=(f"{PY_SPY_AT}:src/dump.rs:33-38", f"{PY_SPY_AT}:src/dump.rs:100-146",
                  f"{PY_SPY_AT}:src/stack_trace.rs:241-247"),
        confidence=0.4, generic=True, found_by="py-spy"),
)
