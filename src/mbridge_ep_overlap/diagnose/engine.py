"""``diagnose(paths) -> Diagnosis``: every reader over what a run left behind, then the signatures.

Contract
--------
Reads each text source once, as a stream (``sources.lines``): every line is tried against the signatures'
patterns (each searched only in the lines holding the literal text every match of it has,
``Signature.matchers``: a large log costs a substring test a pattern a line), fed to the iteration
reader (numerics) and kept, boundedly, when it looks like a failure. Crashes are read with the crash
readers the launcher shares (``crashes.rank_crashes`` over the crash reports captured while streaming);
faulthandler files, facts and watchdog events per ``base.run_files``; an out-of-memory message's numbers
(``memory``); the timeout lines of NCCL's watchdog, DeepEP and HybridEP for the collective or op, the
ranks and the usual causes ranked (``timeouts``); flight-recorder dumps with torch's analyzer
(``flight_recorder``), the diverging collective's frames placed in the schedule (``schedule``); a hang
says which MoE layer each rank was last in when a watchdog event carries it, and that the layer is not in
the evidence otherwise. ``AssertionError`` / ``ValueError`` / ``RuntimeError`` lines no hand-written
signature names are looked up in the installed Megatron-Core / Megatron-Bridge source
(``upstream_checks``), by their message or, when the log has none, by the traceback's innermost ``raise``
frame (``raise_frames``; an ``assert`` line of another package by that line); an ``AttributeError`` on a class
or module of that source says who sets the attribute and what reads it first (``attribute_errors``: an
initialisation-order chain, or a name the installed version lacks), one across a package boundary names the
Megatron frame that reads another package's object and that package, or the module of another package that lacks
a name and who expects it (``foreign_attributes``); an ``ImportError`` / ``ModuleNotFoundError`` says which file
imports the name or module, whether the copy installed here has it, where the installed Megatron references it and the
requirement the importing distribution states (a version pair; a circular import or a package not installed told
apart, ``import_errors``); a fallback warning of
that source no hand-written signature names is found there too (``upstream_fallbacks``); a failed
C++/CUDA check of Transformer Engine, DeepEP (V1 and V2), HybridEP, NVSHMEM or torch's NCCL wrapper is named
from the line its macro prints (``native_checks``); a CUDA runtime error, a kernel's device-side assert, a cuBLAS
status or an NCCL error (torch's text, NCCL's WARN lines, an InfiniBand completion status) by the enum it names,
with the kernel, the frames and torchrun's root-cause rank (``runtime_errors``); a ``static_assert`` nvcc, gcc or clang
reports failed, in a build or a JIT compile at run time (HybridEP, DeepEP V2), by its message looked up in the known
static_asserts of DeepEP, HybridEP and Transformer Engine and in the headers installed here, with the run's template
parameters and what sets them (``static_asserts``); a ``TypeError`` where one package's frame meets another's (a patch
or a call written for another version's argument layout) by both packages and the installed signature of the function
it names, read before the upstream lookup (``type_errors``). Transformer Engine's
attention-backend lines say when it ran attention unfused, found no backend, or disabled the FP8 attention asked
for, with the reasons it logged (``attention_backends``). A NaN/Inf found by MCore names the rank and iteration.
Stacks ``py-spy dump`` printed say where each rank waits and which rank differs from the others (``pyspy``).
torchrun's failure summary names the root-cause rank, host and exit code; a Slurm time limit is judged against the
iteration lines before it; Slurm's OOM kills, node failures and c10d's store errors get their job, node, port and
address (``launcher``). A value outside what a kernel was built for ('Unsupported ...', a compile-time maximum, an
equality check's two values, a null-pointer check) is named with the config field that sets it, beside a native check
of the same line (``kernel_limits``); a call written for another release of a library's headers, ptxas refusing PTX
(with the arch-specific suffix a target lacks) and a CMake find_library line wrapped before its names
(``compile_errors``); Megatron-Bridge's Hugging Face export warnings by part and module (``conversion``); a gradient
norm that differs between the ranks of one run at one iteration (``rank_norms``); a version gate, a size one parallel
split apart, a checkpoint's MoE expert layout, a pickled class the installed release lacks and a configured value
missing from a lookup table (``mismatches``); an upstream check's tested sizes as the installed code computes them
(``upstream_source.operands``); a call's result unpacked into another number of names than the installed function of
that name gives (``unpacking``); a feature a library refuses on the run's platform, in its own words
(``capability_gates``, before the upstream lookup); a checkpoint whose tensors do not have the model's shapes, by part,
dimension and factor (``state_dict_shapes``).
Findings are ranked: specific before generic, then by confidence, then by how many lines matched.
Two or more PATHs that each hold iteration lines are also compared as runs (first = reference): a
candidate not faster than the reference is a no-speed-up finding, with the reasons the facts give;
every no-speed-up finding adds the step-time model's prediction from the plan.json beside the logs,
or says there is none (``prediction``). ``UsageError`` for a path that cannot be read; never any
other exception for what is inside the files.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections import deque
from pathlib import Path
from typing import BinaryIO

from ..base import run_files
from . import (attention_backends, attribute_errors, capability_gates, collective_stacks, compile_errors, conversion, crashes, device_links,
               divisibility, kernel_limits, mismatches, rank_norms, state_dict_shapes, unpacking,
               error_directives, extension_calls, flight_recorder, import_errors, launcher, memory, name_errors,
               native_checks, none_sections, passed_keywords, prediction, pyspy, runtime_errors, schedule,
               static_asserts, timeouts, type_errors, upstream_checks, upstream_fallbacks)
from .iterations import IterationSeries
from .report import Diagnosis, Finding
from .signatures import Signature, all_signatures
from .sources import Evidence, TextSource, collect, lines

SUSPICIOUS = re.compile(r"(\w(Error|Exception)\b:|^Traceback \(most recent call last\)|\bFAILED\b|Fatal |"
                        r"\b[Tt]imeout\b|TIMEOUT|timed out|received signal|Signal \d+ \(SIG|Killed|"
                        r"[Ff]alling back|CUDA error|NCCL WARN|Segmentation fault|core dumped|\bhangs?\b|"
                        r"exitcode\s*:\s*-?[1-9])")
MAX_SUSPICIOUS = 20
CRASH_CAPTURE_LINES = 200
NO_SPEEDUP_MARGIN = 0.02
_TORCHRUN_SUMMARY = re.compile(r"^\s*(rank|exitcode)\s*:")


def diagnose(paths: list[str] | str, stdin: BinaryIO | None = None) -> Diagnosis:
    paths = [paths] if isinstance(paths, str) else list(paths)
    ev = collect(paths, stdin)
    sigs = all_signatures()
    by_id = {s.id: s for s in sigs}
    findings: dict[str, Finding] = {}

    def finding(sig_id: str) -> Finding:
        return findings.setdefault(sig_id, Finding(by_id[sig_id]))

    matchers = [(s.id, p, literal) for s in sigs for p, literal in s.matchers()]
    series = IterationSeries()
    raised = upstream_checks.RaisedErrors()
    missing_attrs = attribute_errors.AttributeErrors()
    failed_imports = import_errors.ImportErrors()
    natives = native_checks.NativeChecks()
    stacks = collective_stacks.CollectiveStacks()
    spied = pyspy.PySpyDumps()
    timed_out = timeouts.TimeoutLines()
    fell_back = upstream_fallbacks.FallbackLines()
    out_of_memory = memory.OutOfMemory()
    attention = attention_backends.AttentionBackends()
    launched = launcher.LauncherLines()
    runtime = runtime_errors.RuntimeErrors()
    compiled = static_asserts.StaticAsserts()
    mismatched = type_errors.TypeErrors()
    passed = passed_keywords.PassedKeywords()
    bindings = extension_calls.ExtensionCalls()
    directives = error_directives.ErrorDirectives()
    linked = device_links.DeviceLinks()
    unset = none_sections.NoneSections()
    sizes = divisibility.Divisibility()
    undefined = name_errors.NameErrors()
    limits = kernel_limits.KernelLimits()
    builds = compile_errors.CompileErrors()
    unmapped = conversion.Unmapped()
    ranked_norms = rank_norms.RankNorms()
    mismatched_sizes = mismatches.Mismatches()
    unpacked = unpacking.Unpacking()
    gated = capability_gates.CapabilityGates()
    loaded = state_dict_shapes.StateDictShapes()
    suspicious: deque[str] = deque(maxlen=MAX_SUSPICIOUS)
    crash_text: dict[str, str] = {}
    per_path_series = {p: IterationSeries() for p in paths} if len(paths) >= 2 else {}
    diagnosis = Diagnosis()

    for src in ev.texts + ev.faulthandler:
        owner = _owner(src, paths, ev)
        captured: list[str] = []
        capture_left = 0
        for where, rank, text, raw in lines(src):
            hits = {sig_id: m.start() for sig_id, p, literal in matchers
                    if (literal is None or literal in text) and (m := p.search(text))}
            if hits:
                at = min(hits.values())
                shown = text.strip() if len(text) <= 300 else "..." + text[max(0, at - 60):at + 240]
                for sig_id in hits:
                    finding(sig_id).add(f"{where}: {shown}")
            series.feed(text, where)
            raised.feed(text, where)
            missing_attrs.feed(text, where)
            failed_imports.feed(text, where)
            natives.feed(text, where)
            stacks.feed(text, where)
            spied.feed(text, where)
            timed_out.feed(text, where)
            fell_back.feed(text, where)
            out_of_memory.feed(text, where)
            attention.feed(text, where, rank)
            launched.feed(text, where, rank or src.rank)
            runtime.feed(text, where)
            compiled.feed(text, where)
            mismatched.feed(text, where)
            passed.feed(text, where)
            bindings.feed(text, where)
            directives.feed(text, where)
            linked.feed(text, where)
            unset.feed(text, where)
            sizes.feed(text, where)
            undefined.feed(text, where)
            limits.feed(text, where)
            builds.feed(text, where)
            unmapped.feed(text, where)
            ranked_norms.feed(text, where, rank or src.rank, owner)
            mismatched_sizes.feed(text, where)
            unpacked.feed(text, where)
            gated.feed(text, where)
            loaded.feed(text, where)
            if owner in per_path_series:
                per_path_series[owner].feed(text, where)
            if SUSPICIOUS.search(text) and not _ITER_LINE.search(text):
                suspicious.append(f"{where}: {text.strip()[:300]}")
            if text.startswith("Fatal Python error:"):
                capture_left = CRASH_CAPTURE_LINES
            if capture_left or _TORCHRUN_SUMMARY.match(text):
                captured.append(raw)
                capture_left = max(capture_left - 1, 0)
        raised.finish()
        compiled.finish()
        mismatched.finish()
        passed.finish()
        bindings.finish()
        unset.finish()
        undefined.finish()
        builds.finish()
        mismatched_sizes.finish()
        unpacked.finish()
        if captured:
            crash_text[_crash_name(src)] = "\n".join(captured) + "\n"
    if ev.texts:
        diagnosis.read.append(f"{len(ev.texts)} log files" if len(ev.texts) > 1 else ev.texts[0].label)
    if ev.faulthandler:
        diagnosis.read.append(f"faulthandler output of rank(s) {', '.join(sorted(str(s.rank) for s in ev.faulthandler))}")

    _numerics(series, finding)
    _attention(attention, findings)
    _native(natives, ev, findings)
    _merge(findings, pyspy.findings(spied, ev.facts))
    _runtime(runtime, findings)
    _type_errors(mismatched, findings)  # before the upstream lookup: a call's TypeError is no check's message
    _merge(findings, passed_keywords.findings(_unnamed(passed.errors, lambda e: e.text, findings)))
    _merge(findings, extension_calls.findings(_unnamed(bindings.errors, lambda e: e.text, findings)))
    _merge(findings, error_directives.findings(_unnamed(directives.errors, lambda e: e.text, findings),
                                               directives.standards))
    _merge(findings, device_links.findings(linked))
    _merge(findings, compile_errors.findings(_unnamed(builds.errors, lambda e: e.text, findings)))
    _merge(findings, compile_errors.joined_findings(builds.joined))
    _merge(findings, conversion.findings(unmapped))
    _merge(findings, rank_norms.findings(ranked_norms))
    _merge(findings, none_sections.findings(unset.errors))
    _merge(findings, name_errors.findings(_unnamed(undefined.errors, lambda e: e.text, findings)))
    _merge(findings, unpacking.findings(_unnamed(unpacked.errors, lambda e: e.text, findings)))
    _merge(findings, capability_gates.findings(_unnamed(gated.lines, lambda g: g.text, findings)))
    _merge(findings, state_dict_shapes.findings(loaded))
    _upstream(raised, findings)
    _sizes(sizes, findings)  # after the upstream lookup: a check it names gets the values that would divide
    _limits(limits, findings)  # after the native and upstream checks: one of them gets the quantity and its field
    _merge(findings, mismatches.findings(mismatched_sizes))
    _attribute_errors(missing_attrs, findings)
    _import_errors(failed_imports, findings)
    _static_asserts(compiled, findings)
    _fallbacks(fell_back, findings)
    _crashes(crash_text, finding)
    _lost_peer_after_a_crash(findings)
    launched.details(findings, series)
    _facts(ev, sigs, finding, diagnosis)
    _watchdog(ev, finding, diagnosis)
    _timeout_stacks(ev, findings)
    _flight_recorder(ev, finding, diagnosis, stacks)
    if len(per_path_series) >= 2:
        _compare_runs(paths, per_path_series, ev, finding)
    _nan_iteration(findings)
    _predicted_gain(paths, findings)
    _hang_layer(ev, findings)
    _hang_step(ev, series, stacks, findings)
    timed_out.details(findings)
    out_of_memory.details(findings)

    for f in findings.values():
        if f.signature.rule and f.signature.facts_pass and ev.facts:
            verdicts = {f.signature.facts_pass(facts) for facts in ev.facts.values()}
            f.rule_passes = False if False in verdicts else True if verdicts == {True} else None
    diagnosis.findings = sorted(findings.values(), key=lambda f: f.score, reverse=True)
    diagnosis.suspicious = list(suspicious) if not diagnosis.recognised else []
    diagnosis.notes += [f"not read: {s}" for s in ev.skipped]
    return diagnosis


_ITER_LINE = re.compile(r"\biteration\s+[0-9]+/\s*[0-9]+\s*\|")


def _owner(src: TextSource, paths: list[str], ev: Evidence) -> str | None:
    if src.path is None:
        return "-"
    for p in paths:
        if p != "-" and (src.path == Path(p) or Path(p) in src.path.parents):
            return p
    return None


def _crash_name(src: TextSource) -> str:
    """A name ``crashes.rank_texts`` reads the rank from: torchrun's per-rank path, or the evidence file's rank."""
    if src.rank is not None and "attempt_" not in src.label:
        return f"attempt_0/{src.rank}/stderr.log"
    return src.label


def _numerics(series: IterationSeries, finding) -> None:
    for a in series.anomalies:
        if a.kind in ("non-finite-loss", "nan-iterations", "grad-norm-blowup", "loss-spike"):
            finding(a.kind).add(f"{a.where}: iteration {a.iteration}: {a.detail}")


def _named_lines(findings: dict[str, Finding], but: str = "") -> list[str]:
    """The evidence lines of the specific findings so far (those whose id starts with ``but`` left out, when given):
    a line they hold is already named."""
    return [e for f in findings.values() if not f.signature.generic and not (but and f.signature.id.startswith(but))
            for e in f.evidence]


def _unnamed(items: list, text, findings: dict[str, Finding]) -> list:
    """The items whose line (``text(item)``, its first 120 characters) no specific finding's evidence holds yet."""
    named = _named_lines(findings)
    return [i for i in items if not any(text(i)[:120] in line for line in named)]


def _merge(findings: dict[str, Finding], new: list[Finding]) -> None:
    """A reader's findings beside the others; an id already found keeps its first finding."""
    for f in new:
        findings.setdefault(f.signature.id, f)


def _attention(attention: attention_backends.AttentionBackends, findings: dict[str, Finding]) -> None:
    """Transformer Engine's attention-backend choice: unfused attention, no backend at all, FP8 attention disabled
    (read before the upstream checks, so that TE's no-backend ValueError is not looked up in MCore's source)."""
    _merge(findings, attention_backends.findings(attention))


def _upstream(raised: upstream_checks.RaisedErrors, findings: dict[str, Finding]) -> None:
    """The errors no hand-written signature already names, looked up in the installed upstream source."""
    _merge(findings, upstream_checks.findings(_unnamed(raised.errors, lambda e: e.message, findings)))


def _attribute_errors(missing: attribute_errors.AttributeErrors, findings: dict[str, Finding]) -> None:
    """The AttributeErrors on a class or module of the installed MCore / MB source, or across a package boundary,
    that no hand-written signature names."""
    _merge(findings, attribute_errors.findings(_unnamed(missing.errors, lambda e: e.line, findings)))


def _import_errors(failed: import_errors.ImportErrors, findings: dict[str, Finding]) -> None:
    """The ImportErrors / ModuleNotFoundErrors no hand-written signature names (deepep-not-installed and the like)."""
    _merge(findings, import_errors.findings(_unnamed(failed.errors, lambda e: e.line, findings)))


def _beside(lines: list, details, own, findings: dict[str, Finding]) -> None:
    """Lines a reader read (each with ``.text``): its ``details(lines)`` added to a finding another reader made of the
    same line, and ``own(lines)`` made of the lines no finding names yet."""
    for f in findings.values():
        mine = [s for s in lines if any(s.text[:120] in line for line in f.evidence)]
        f.detail += [d for d in details(mine) if d not in f.detail]
    _merge(findings, own(_unnamed(lines, lambda s: s.text, findings)))


def _sizes(sizes: divisibility.Divisibility, findings: dict[str, Finding]) -> None:
    """A size that does not divide another: the values that would, beside the check another reader named from the same
    line (an upstream check), else as a finding of its own."""
    _beside(sizes.lines, divisibility.details, divisibility.findings, findings)


def _limits(limits: kernel_limits.KernelLimits, findings: dict[str, Finding]) -> None:
    """A value outside what a kernel was built for: the quantity and the config field that sets it, beside the check
    another reader named from the same line (a native check), else as a finding of its own."""
    _beside(limits.lines, kernel_limits.details, kernel_limits.findings, findings)


def _static_asserts(compiled: static_asserts.StaticAsserts, findings: dict[str, Finding]) -> None:
    """The failed static_asserts no hand-written signature names (deepep-built-for-other-nvl-peers and the like)."""
    _merge(findings, static_asserts.findings(_unnamed(compiled.asserts, lambda a: a.text, findings)))


def _type_errors(mismatched: type_errors.TypeErrors, findings: dict[str, Finding]) -> None:
    """The TypeErrors across a package boundary no hand-written signature names (te-calls-newer-torch-api and the like)."""
    _merge(findings, type_errors.findings(_unnamed(mismatched.errors, lambda e: e.line, findings)))


def _fallbacks(fell_back: upstream_fallbacks.FallbackLines, findings: dict[str, Finding]) -> None:
    """The fallback warnings of the installed MCore / MB source no hand-written signature already names."""
    _merge(findings, upstream_fallbacks.findings(fell_back, _named_lines(findings)))


def _native(natives: native_checks.NativeChecks, ev: Evidence, findings: dict[str, Finding]) -> None:
    """The native checks no hand-written signature already names (its evidence holds the line)."""
    fresh = _unnamed(natives.checks, lambda c: c[2], findings)
    # an NVSHMEM chain follows from its first line (log order): named by a signature, the fresh ones all follow it
    first = next((c for c in natives.checks if c[0].library == "nvshmem"), None)
    chain = ("nvshmem",) if first is not None and first not in fresh else ()
    _merge(findings, native_checks.findings(fresh, ev.facts, chain))


def _runtime(runtime: runtime_errors.RuntimeErrors, findings: dict[str, Finding]) -> None:
    """CUDA runtime errors, device-side asserts, cuBLAS status and NCCL errors no hand-written signature names (torch's
    NCCL check, named as a native check, is read here too: for its ncclResult_t and NCCL's last error)."""
    _merge(findings, runtime_errors.findings(runtime, _named_lines(findings, but="native-check:nccl:")))


_UNEXPECTED = re.compile(r"Rank (\d+),.*?iteration (\d+): Unexpected result (\S+) \(message='([^']*)'")


def _predicted_gain(paths: list[str], findings: dict[str, Finding]) -> None:
    """A no-speed-up finding says what the step-time model predicted for the run's config, or why not."""
    slow = [f for f in findings.values() if f.signature.symptom == "no-speedup"]
    words = prediction.lines(paths) if slow else []
    for f in slow:
        f.detail += words


def _nan_iteration(findings: dict[str, Finding]) -> None:
    """Which rank saw which non-finite value at which iteration, from MCore's rerun state machine's line."""
    f = findings.get("non-finite-loss-detected")
    seen = set()
    for line in f.evidence if f else []:
        if (m := _UNEXPECTED.search(line)) and m.groups() not in seen:
            seen.add(m.groups())
            f.detail.append(f"rank {m.group(1)}: {m.group(3)} at iteration {m.group(2)} ({m.group(4)})")


_NOT_STUCK = ("progress-stalled", "slurm-time-limit-too-short", "slurm-cancelled")
"""Hang-class findings that get no hang details: the watchdog's own, a time limit hit while steady, a cancel."""


def _hang_layer(ev: Evidence, findings: dict[str, Finding]) -> None:
    """A hang names the MoE layer each rank was last in when a watchdog stall event carries it, and says
    that the layer is not in the evidence otherwise (frames and flight-recorder entries do not carry it)."""
    hangs = [f for f in findings.values() if f.signature.symptom == "hang" and f.signature.id not in _NOT_STUCK]
    if not hangs:
        return
    layers = [f"rank {e.get('rank')}: MoE layer {e['moe_position'].get('layer')}"
              for e in ev.watchdog if e.get("event") == "stall" and isinstance(e.get("moe_position"), dict)
              and e["moe_position"].get("layer") is not None]
    words = ("layer (the watchdog's last MoE position): " + "; ".join(layers) if layers else
             "layer not in the evidence (no watchdog position recorded; stacks and the flight recorder do not "
             "carry the layer)")
    for f in hangs:
        f.detail.append(words)


def _crashes(crash_text: dict[str, str], finding) -> None:
    if not crash_text:
        return
    for c in crashes.rank_crashes(crash_text):
        sig = "segmentation-fault" if c.signal == "SIGSEGV" else "abort-signal" if c.signal == "SIGABRT" else None
        if sig is None:
            continue
        f = finding(sig)
        place = schedule.place(schedule.faulthandler_frames(c.stack))
        f.detail.append(f"rank {c.rank}: {c.signal}{c.where()}" + (f"; {place.words()}" if place.phase or place.schedule else ""))
        f.detail += [f"  {frame}" for frame in c.stack[:8]]


_SIGNAL_ROWS = ("segmentation-fault", "abort-signal")


def _lost_peer_after_a_crash(findings: dict[str, Finding]) -> None:
    """A lost peer whose first failing rank (torchrun's Root Cause) died of a signal this diagnosis names ranks
    below that signal: the peer's error follows from the crash, the crash is the cause to read first."""
    remote = findings.get("nccl-remote-error")
    crash = next((findings[i] for i in _SIGNAL_ROWS if i in findings), None)
    if remote is None or crash is None or not any("Root Cause" in d and "(Signal " in d for d in remote.detail):
        return
    remote.signature = dataclasses.replace(remote.signature, generic=True,
                                           confidence=min(remote.signature.confidence, crash.signature.confidence / 2))
    remote.detail.append(f"ranked below [{crash.signature.id}]: the first failing rank died of that signal")


def _facts(ev: Evidence, sigs: tuple[Signature, ...], finding, diagnosis: Diagnosis) -> None:
    """A facts-raised signature whose condition a rank's facts show (``facts_pass`` False)."""
    if not ev.facts:
        return
    diagnosis.read.append(f"facts of rank(s) {', '.join(sorted(ev.facts, key=int))}")
    for rank, facts in sorted(ev.facts.items(), key=lambda kv: int(kv[0])):
        for s in sigs:
            if s.found_by == "facts" and s.facts_pass and s.facts_pass(facts) is False:
                shown = ", ".join(f"{k}={json.dumps(facts.get(k), sort_keys=True)}" for k in s.facts_keys)
                finding(s.id).add(f"{run_files.facts_file('', rank).as_posix()}: {shown}")


def _watchdog(ev: Evidence, finding, diagnosis: Diagnosis) -> None:
    stalls = [e for e in ev.watchdog if e.get("event") == "stall"]
    if ev.watchdog:
        diagnosis.read.append(f"{len(ev.watchdog)} watchdog event(s)")
    if not stalls:
        return
    f = finding("progress-stalled")
    for e in stalls:
        f.add(f"{e['where']}: rank {e.get('rank')}: no iteration for {e.get('seconds_since_progress')} s "
              f"(threshold {e.get('threshold_s')} s) after iteration {e.get('iteration')}")
        if words := position_words(e):
            f.detail.append(f"rank {e.get('rank')}: {words}")
    for src in ev.faulthandler:
        frames = crashes.main_thread_stack(_head(src))
        if frames:
            place = schedule.place(schedule.faulthandler_frames(frames))
            f.detail.append(f"rank {src.rank} training thread: {place.words()}")
            f.detail += [f"  {frame}" for frame in frames[:6]]


_C10D_FILE = "torch/distributed/distributed_c10d.py"


def _timeout_stacks(ev: Evidence, findings: dict[str, Finding]) -> None:
    """faulthandler's timeout dumps per rank: which rank's training thread waits in a torch.distributed call and
    which is elsewhere (the one that diverged). Beside a watchdog stall (whose dumps they are) the words go to the
    stall and the timeout finding is dropped: one hang, not two."""
    timeout = findings.get("faulthandler-timeout")
    if timeout is None:
        return
    where: dict[int, str] = {}
    waiting: dict[int, str] = {}
    for src in ev.faulthandler:
        frames = schedule.faulthandler_frames(crashes.main_thread_stack(_head(src)))
        if not frames or not (src.rank or "").isdigit():
            continue
        rank = int(src.rank or 0)
        c10d = [fn for fn, file, _ in frames if file.replace("\\", "/").endswith(_C10D_FILE)]
        user = next(((fn, file, line) for fn, file, line in frames if "/torch/" not in file.replace("\\", "/")),
                    frames[0])
        at = f"{Path(user[1]).name}:{user[2]} in {user[0]}"
        if c10d:
            waiting[rank] = c10d[0]
            where[rank] = f"rank {rank}: waits in torch.distributed.{c10d[0]} (called at {at})"
        else:
            where[rank] = f"rank {rank}: not in a torch.distributed call (at {at})"
    words = [where[r] for r in sorted(where)]
    others = sorted(set(where) - set(waiting))
    if waiting and others:
        ops = " / ".join(sorted(set(waiting.values())))
        words.append(f"rank(s) {', '.join(map(str, others))} are not in the {ops} that rank(s) "
                     f"{', '.join(map(str, sorted(waiting)))} wait in: the one(s) that diverged")
    target = findings.get("progress-stalled")
    if target is not None:
        del findings["faulthandler-timeout"]
        target.detail += [w for w in words if w not in target.detail]
    else:
        timeout.detail += words


# The watchdog's ``iteration`` is MB's ``train_state.step`` as ``on_train_step_end`` sees it, before MB
# increments it (megatron/bridge/training/train.py): the 0-based index of the last completed iteration.
# The iteration the rank is in, 1-based as MB logs it, is therefore that value + 2.
WATCHDOG_ITERATION_OFFSET = 2


def position_words(event: dict) -> str:
    """'in the forward dispatch of MoE layer 4, microbatch 1, iteration 3 (not returned)' from a
    watchdog stall event's ``moe_position``; '' when the event has none."""
    pos = event.get("moe_position")
    if not isinstance(pos, dict) or pos.get("op") not in ("dispatch", "combine"):
        return ""
    it = event.get("iteration")
    at = f", iteration {it + WATCHDOG_ITERATION_OFFSET}" if isinstance(it, int) else ""
    state = "returned; the rank is past it" if pos.get("done") else "not returned"
    return (f"last entered the {pos.get('phase', 'forward')} {pos['op']} of MoE layer {pos.get('layer')}, "
            f"microbatch {pos.get('microbatch')}{at} ({state})")


def _head(src: TextSource, limit: int = 4 << 20) -> str:
    with src.open() as fh:
        return fh.read(limit).decode("utf-8", errors="replace")


def _flight_recorder(ev: Evidence, finding, diagnosis: Diagnosis, stacks: collective_stacks.CollectiveStacks) -> None:
    for folder in ev.flight_recorder_dirs:
        diagnosis.read.append(f"flight recorder {folder}")
        result = flight_recorder.analyze(folder)
        if result.error:
            diagnosis.notes.append(result.error)
        for m in result.mismatches[:3]:
            f = finding("collective-not-joined")
            f.add(f"{folder} (torch fr_trace): {m.line}")
            frames, whose = list(m.frames), ""
            if not frames and (s := stacks.find(m.fields.get("group info", ""), m.sequence)):
                frames, whose = s.frames, f" (stack: rank {s.rank}'s NCCL watchdog, {s.where}; the dump has none)"
            place = schedule.place(frames)
            missing = m.missing_ranks or _missing_elsewhere(result.mismatches) or "none named"
            f.detail.append(f"collective {m.collective} (group {m.fields.get('group info', '?')}), sequence number "
                            f"{m.sequence}: rank(s) {missing} did not join; the ranks that did are "
                            f"{place.words()}{whose}")
            user = [fr for fr in frames if "/torch/" not in fr[1]]
            f.detail += [f"  {fn} at {Path(file).name}:{line}" for fn, file, line in user[:6]]


def _hang_step(ev: Evidence, series: IterationSeries, stacks: collective_stacks.CollectiveStacks,
               findings: dict[str, Finding]) -> None:
    """A hang says the step the ranks wait in (the iteration after the last one logged), where each rank
    waits when torch's NCCL watchdog printed the stack of its timed-out collective, and that the
    faulthandler stacks are not in the evidence when their files are empty."""
    hangs = [f for f in findings.values() if f.signature.symptom == "hang" and f.signature.id not in _NOT_STUCK]
    if not hangs:
        return
    last = max(series.numbers) if len(series) else None
    words = [f"step: iteration {last + 1} (the last iteration logged is {last}; none after it)" if last is not None
             else "step not in the evidence (no iteration line logged)"]
    for s in stacks.stacks:
        if s.frames:
            words.append(f"rank {s.rank} waits in {s.op or 'a collective'} (group {s.group}:{s.description}, sequence number "
                         f"{s.sequence}): {schedule.place(s.frames).words()} (the NCCL watchdog's stack, {s.where})")
    empty = [src for src in ev.faulthandler if src.path is not None and _is_empty(src.path)]
    if ev.faulthandler and len(empty) == len(ev.faulthandler):
        words.append("faulthandler stacks not in the evidence (" + ", ".join(sorted(p.path.name for p in empty))
                     + " empty: no dump was written before the run ended)")
    for f in hangs:
        f.detail += words


def _is_empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _missing_elsewhere(mismatches) -> str:
    """The ranks torch's analyzer names as missing from a later collective of the same run: the rank
    that skipped one collective issues one fewer, so it is missing at the end, and the earlier
    input/output mismatch is where it diverged."""
    return next((m.missing_ranks for m in mismatches if m.missing_ranks), "")


def _compare_runs(paths, per_path_series, ev: Evidence, finding) -> None:
    runs = [(p, s) for p, s in per_path_series.items() if len(s)]
    if len(runs) < 2:
        return
    (ref_path, ref), *others = runs
    ref_ms = statistics.median(ref.steady_ms(min(2, len(ref) - 1)))
    for path, s in others:
        ms = statistics.median(s.steady_ms(min(2, len(s) - 1)))
        if ms > 0 and ref_ms / ms < 1 + NO_SPEEDUP_MARGIN:
            _no_speedup_reason(ev, finding).add(f"{path}: steady median {ms:.1f} ms vs {ref_ms:.1f} ms in {ref_path} "
                       f"(speed-up {ref_ms / ms:.3f}x)")


def _no_speedup_reason(ev: Evidence, finding) -> Finding:
    facts = list(ev.facts.values())
    if facts and not any(f.get("overlap_moe_expert_parallel_comm") for f in facts):
        return finding("overlap-not-active")
    if any(str(f.get("cuda_device_max_connections")) == "1" for f in facts):
        return finding("cuda-device-max-connections-1")
    if any(f.get("microbatches_per_step") == 1 for f in facts):
        return finding("one-microbatch-per-rank")
    return finding("overlap-gained-nothing")
