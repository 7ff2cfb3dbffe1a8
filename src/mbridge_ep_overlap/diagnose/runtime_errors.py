"""CUDA runtime errors, ATen device-side asserts, cuBLAS status and NCCL errors, read from the formats they print.

Contract
--------
``RuntimeErrors.feed(text, where)`` is fed every line of a log (prefix stripped) and keeps, boundedly:

- a kernel's device-side assert ``FILE:LINE: KERNEL: block: [x,y,z], thread: [x,y,z] Assertion `COND` failed.``
  (every thread prints one: kept once per FILE:LINE, KERNEL and COND, with the count and the blocks);
- torch's ``CUDA error: MESSAGE`` (``torch.AcceleratorError`` / ``RuntimeError``) and the enum of the
  ``Search for `cudaErrorXxx'`` line after it; without that line the message is mapped to the enum by
  ``cudaGetErrorString``'s text (``signatures.runtime.CUDA_ERRORS``);
- torch's cuBLAS check ``CUDA error: CUBLAS_STATUS_XXX when calling `FN(...)```: the status and FN;
- torch's ``NCCL error: MESSAGE, NCCL version X`` / ``NCCL error in: FILE:LINE, MESSAGE, ...`` (MESSAGE mapped to
  its ``ncclResult_t`` by ``ncclGetErrorString``'s text), torch's ``ncclXxx: DESCRIPTION`` line and the line
  after ``Last error:``; NCCL's ``NCCL WARN`` lines and gloo's errors: a socket closed or reset by the peer
  (``peer_lost(text)`` tells whether a line says that), ``Cuda failure [N]
  'TEXT'``, and an InfiniBand completion ``NET/IB: Got completion from peer P with status=NAME(N)`` (NCCL
  2.28) or ``status=N`` (the GIN / older format: N read as its ``ibv_wc_status`` name);
- torchrun's failure summary ``Root Cause (first observed failure)``: the rank, host, exit code and signal;
- traceback frames (Python ``File "F", line N, in FN`` and the code line after it, C++ ``frame #N: FN``): whether
  they show an embedding, the MoE layer (moe, token_dispatcher, router, experts) or DeepEP / HybridEP, and the
  last Python frame before each CUDA error (where it surfaced).

``findings(errors, named)`` gives one ``Finding`` per row of ``signatures.runtime`` the evidence raises (each
evidence line as ``where: line``, the detail naming the kernel and condition, the enum / status / result and
the call, and what the frames and the root-cause rank add); a line in ``named`` (a non-generic finding's
evidence) is left to that finding. A ``cudaErrorAssert`` with its kernel's assert line is read as that
assert; without it, it is ``device-assert-without-kernel-line``. Reads nothing but the lines; never raises
for their text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .report import Finding
from .signatures.runtime import CUBLAS_STATUSES, CUDA_ERRORS, IBV_WC_NAMES, IBV_WC_STATUS, NCCL_RESULTS, SIGNATURES

MAX_KEPT = 16
BY_ID = {s.id: s for s in SIGNATURES}

_ASSERT = re.compile(r"(?<![^\s'\"(=])(?P<file>[^\s'\":(]+\.(?:cu|cuh|cpp|cc|h|hpp)):(?P<line>\d{1,9}): (?P<kernel>[^`]{1,400}?): "
                     r"block: \[(?P<block>[\d,\s]{1,40})\], thread: \[(?P<thread>[\d,\s]{1,40})\] "
                     r"Assertion `(?P<cond>[^`]{1,1000})` failed\.")  # bounded: no backtracking over a long line
_CUBLAS = re.compile(r"\bCUDA error: (?P<status>CUBLAS_STATUS_[A-Z_]+)(?: when calling `(?P<call>[^`]*)`?)?")
_CUDA = re.compile(r"\bCUDA error: (?P<msg>[^`\n]*[^`\s.])[\s.]*$")
_SEARCH = re.compile(r"Search for `(?P<name>cudaError\w+)'")
_NCCL = re.compile(r"\bNCCL error(?: in: (?P<at>[^\s,]+),|:) (?P<msg>.*?\S)(?:, NCCL version (?P<version>[\w.+-]+))?\s*$")
_NCCL_NAME = re.compile(r"^\s*(?P<name>" + "|".join(NCCL_RESULTS) + r"): (?P<desc>\S.*)$")
_LAST_ERROR = re.compile(r"^\s*Last error:\s*(?P<rest>.*)$")
_PEER_GONE = re.compile(r"(?:(?:Read|Write) error (?P<before>\S+?):?\s+)?(?:Connection closed by (?:remote )?peer|"
                        r"Connection reset by peer)(?:\s+(?P<peer>[\w\[][^\s,)]*?))?\.?(?=\s|,|\)|$)")
"""NCCL's ``Connection closed by remote peer HOST<PORT>`` (the peer after), gloo's ``Read error [ADDR]:PORT: Connection
reset by peer.`` (the peer before) and ``Connection closed by peer [ADDR]:PORT.`` (the peer after, the sentence's
full stop not part of it)."""
_PEER_WORDS = ("by remote peer", "reset by peer", "closed by peer")
_CUDA_FAILURE = re.compile(r"Cuda failure (?:(?P<code>\d{1,4}) )?'(?P<msg>[^']+)'")
_IB = re.compile(r"NET/IB(?:/GIN)?\s*: Got completion from peer (?P<peer>\S+) with (?:status=|error )"
                 r"(?:(?P<name>IBV_WC_\w+)\()?(?P<code>\d{1,4})")
_FRAME = re.compile(r"^\s*File \"(?P<file>[^\"]+)\", line (?P<line>\d{1,9}),? in (?P<fn>\S+)")
_NATIVE_FRAME = re.compile(r"^frame #\d+: (?P<fn>.+?)(?: \+ 0x[0-9a-f]+)?(?: \(0x[0-9a-f]+ in (?P<lib>\S+)\))?\s*$")
_EMBEDDING = re.compile(r"(?i)embedding")
_MOE = re.compile(r"(?i)\bmoe\b|moe_|/moe/|token_dispatcher|router|experts?\b|permut")
_DEEPEP = re.compile(r"(?i)deep_ep|deepep|hybrid_ep|hybridep")
_ROOT = re.compile(r"Root Cause \(first observed failure\)")
_ROOT_FIELD = re.compile(r"^\s*(?P<key>rank|host|exitcode|traceback)\s*:\s*(?P<value>.+?)\s*$")
_CUDA_BY_MESSAGE = {message: name for name, (_, message, _) in CUDA_ERRORS.items()}
_NCCL_BY_MESSAGE = {message.split(" (run with")[0]: name for name, (_, message, _) in NCCL_RESULTS.items()}
"""ncclGetErrorString's text without the "(run with NCCL_DEBUG=... for details)" hint older NCCL releases lack."""


@dataclass
class Seen:
    """One distinct error: its key, the first line and where, how often, what it adds."""
    key: tuple
    where: str
    line: str
    count: int = 1
    info: dict = field(default_factory=dict)

    @property
    def evidence(self) -> str:
        return f"{self.where}: {self.line[:300]}"


@dataclass
class Frames:
    embedding: str = ""
    moe: str = ""
    deepep: str = ""
    last: str = ""
    """The last Python frame of the traceback being read (file:line in fn)."""


def peer_lost(text: str) -> bool:
    """Whether the line says the connection to a peer was closed or reset by it (NCCL's socket, gloo's pair)."""
    return any(w in text for w in _PEER_WORDS) and _PEER_GONE.search(text) is not None


class RuntimeErrors:
    def __init__(self) -> None:
        self.asserts: dict[tuple, Seen] = {}
        self.cuda: dict[tuple, Seen] = {}
        self.cublas: dict[tuple, Seen] = {}
        self.nccl: dict[tuple, Seen] = {}
        self.peer_gone: dict[tuple, Seen] = {}
        self.cuda_failures: dict[tuple, Seen] = {}
        self.ib: dict[tuple, Seen] = {}
        self.root_cause: dict[str, str] = {}
        self.root_where = ""
        self.frames = Frames()
        self._in_root = False
        self._last_cuda: Seen | None = None
        self._last_nccl: Seen | None = None
        self._since_cuda = 0
        self._await_last_error = False
        self._frame_pending = False
        self._pending_frame = ""

    def feed(self, text: str, where: str) -> None:
        try:
            self._feed(text, where)
        except (ValueError, IndexError, KeyError):  # a line in no format these read
            pass

    def _keep(self, table: dict, key: tuple, where: str, line: str, **info) -> Seen:
        if key in table:
            table[key].count += 1
            return table[key]
        seen = Seen(key, where, line.strip(), info=info)
        if len(table) < MAX_KEPT:
            table[key] = seen
        return seen

    def _feed(self, text: str, where: str) -> None:
        self._since_cuda += 1
        self._frames(text)
        if self._await_last_error and text.strip():
            self._await_last_error = False
            if self._last_nccl is not None:
                self._last_nccl.info.setdefault("last_error", (where, text.strip()))
        if self._in_root or _ROOT.search(text):
            self._root(text, where)
        if "Assertion `" in text and "block: [" in text and (m := _ASSERT.search(text)):
            file = m["file"]
            key = (file[file.find("aten/src/"):] if "aten/src/" in file else file, int(m["line"]), m["kernel"].strip(),
                   m["cond"])
            seen = self._keep(self.asserts, key, where, text, blocks=set())
            if "blocks" in seen.info and len(seen.info["blocks"]) < 8:
                seen.info["blocks"].add(m["block"].replace(" ", ""))
            return
        if "CUDA error: " in text:
            if m := _CUBLAS.search(text):
                call = m["call"] or ""
                fn = (re.match(r"\s*(\w+)", call) or re.match(r"()", "")).group(1)
                self._keep(self.cublas, (m["status"], fn), where, text, call=call, function=fn)
                return
            if m := _CUDA.search(text):
                msg = m["msg"].strip()
                name = _CUDA_BY_MESSAGE.get(msg, "")
                self._last_cuda = self._keep(self.cuda, (msg,), where, text, name=name, message=msg,
                                             frame=self.frames.last)
                self._since_cuda = 0
                return
        if "Search for `" in text and (m := _SEARCH.search(text)):
            if self._last_cuda is not None and self._since_cuda <= 3:
                self._last_cuda.info["name"] = m["name"]
            else:
                self._last_cuda = self._keep(self.cuda, (m["name"],), where, text, name=m["name"], message="",
                                             frame=self.frames.last)
            return
        if "NCCL error" in text and (m := _NCCL.search(text)):
            msg = m["msg"].strip()
            name = next((n for message, n in _NCCL_BY_MESSAGE.items() if msg.startswith(message)), "")
            self._last_nccl = self._keep(self.nccl, (name or msg,), where, text, name=name, message=msg,
                                         version=m["version"] or "")
            return
        if text.lstrip().startswith("nccl") and (m := _NCCL_NAME.match(text)):
            last = self._last_nccl
            if last is not None and last.info.get("name") in ("", m["name"]):
                last.info["name"] = m["name"]
                last.info["detail_line"] = (where, text.strip())
            else:
                self._last_nccl = self._keep(self.nccl, (m["name"],), where, text, name=m["name"], message=m["desc"],
                                             version="")
            return
        if "Last error:" in text and (m := _LAST_ERROR.match(text)):
            if m["rest"].strip() and self._last_nccl is not None:
                self._last_nccl.info.setdefault("last_error", (where, m["rest"].strip()))
            else:
                self._await_last_error = True
        if "Cuda failure" in text and (m := _CUDA_FAILURE.search(text)):
            self._keep(self.cuda_failures, (m["msg"],), where, text, message=m["msg"], code=m["code"] or "")
        if "Got completion from peer" in text and (m := _IB.search(text)):
            code = int(m["code"])
            name = m["name"] or (IBV_WC_NAMES[code] if code < len(IBV_WC_NAMES) else f"ibv_wc_status {code}")
            self._keep(self.ib, (name,), where, text, name=name, code=code, peer=m["peer"])
        if peer_lost(text):
            if m := _PEER_GONE.search(text):
                peer = m["peer"] or m["before"] or ""
                self._keep(self.peer_gone, (peer,), where, text, peer=peer,
                           backend="gloo" if "gloo" in text else "NCCL")

    def _frames(self, text: str) -> None:
        shown = ""
        if self._frame_pending:
            self._frame_pending = False
            if text.startswith("    ") and not text.lstrip().startswith("File "):
                shown = text.strip()
                self._mark(shown, f"{self._pending_frame}: {shown}")
                shown = ""
        if 'File "' in text and (m := _FRAME.match(text)):
            self.frames.last = f"{m['file']}:{m['line']} in {m['fn']}"
            self._frame_pending = True
            # what a frame says: its folders and its function (a file's own name may be a script's: not read)
            shown = f"{m['file'].rpartition('/')[0]}/ in {m['fn']}"
            self._pending_frame = self.frames.last
        elif text.startswith("frame #") and (m := _NATIVE_FRAME.match(text)):
            shown = f"{m['fn']}" + (f" ({m['lib']})" if m["lib"] else "")
        elif text.startswith("Traceback (most recent call last)"):
            self.frames.last = ""
        if shown:
            self._mark(shown, self.frames.last if 'File "' in text else shown)

    def _mark(self, words: str, shown: str) -> None:
        for attr, pattern in (("embedding", _EMBEDDING), ("moe", _MOE), ("deepep", _DEEPEP)):
            if not getattr(self.frames, attr) and pattern.search(words):
                setattr(self.frames, attr, shown[:200])

    def _root(self, text: str, where: str) -> None:
        if _ROOT.search(text):
            self._in_root, self.root_cause, self.root_where = True, {}, where
            return
        if re.match(r"^\s*={5,}\s*$", text) or len(self.root_cause) >= 4:
            self._in_root = False
            return
        if m := _ROOT_FIELD.match(text):
            self.root_cause[m["key"]] = m["value"]

    def root_words(self) -> str:
        """'rank 1 (local_rank: 1) on localhost, exit code 3 (pid: 643)' from torchrun's Root Cause; '' when none."""
        rc = self.root_cause
        if "rank" not in rc:
            return ""
        words = f"rank {rc['rank']}" + (f" on {rc['host']}" if rc.get("host") else "")
        if code := rc.get("exitcode"):
            words += f", exit code {code}"
        if (tb := rc.get("traceback", "")).startswith("Signal"):
            words += f" ({tb})"
        return words


def _cause_words(seen: Seen) -> str:
    file, line, kernel, cond = seen.key
    blocks = ", ".join(sorted(seen.info.get("blocks", ())))
    return (f"kernel {kernel} at {file}:{line} asserts `{cond}` (printed by {seen.count} thread(s)"
            + (f", block(s) [{blocks}]" if blocks else "") + ")")


def _assert_row(seen: Seen, frames: Frames) -> str:
    file, _, kernel, cond = seen.key
    base = file.rsplit("/", 1)[-1]
    if base == "Indexing.cu" and (kernel.startswith("indexSelect") or "srcSelectDimSize" in cond):
        return "device-assert-token-id-past-vocab" if frames.embedding else "device-assert-index-select"
    if base == "Loss.cu" and (kernel.startswith("nll_loss") or "n_classes" in cond):
        return "device-assert-loss-target"
    if base == "ScatterGatherKernel.cu" or "scatter gather kernel index out of bounds" in cond:
        return "device-assert-gather-scatter-index"
    return "device-assert-kernel"


def findings(errors: RuntimeErrors, named: list[str] | tuple[str, ...] = ()) -> list[Finding]:
    """One finding per row the evidence raises (module docstring)."""
    try:
        return _findings(errors, named)
    except (ValueError, IndexError, KeyError, TypeError):
        return []


def _fresh(seen: Seen, named) -> bool:
    return not any(seen.line[:120] in line for line in named)


def _findings(errors: RuntimeErrors, named) -> list[Finding]:
    out: dict[str, Finding] = {}
    frames = errors.frames

    def finding(sig_id: str) -> Finding:
        return out.setdefault(sig_id, Finding(BY_ID[sig_id]))

    def add(f: Finding, seen: Seen) -> None:
        f.add(seen.evidence)
        f.count += seen.count - 1

    for seen in errors.asserts.values():
        if not _fresh(seen, named):
            continue
        f = finding(_assert_row(seen, frames))
        add(f, seen)
        f.detail.append(_cause_words(seen))
        if f.signature.id == "device-assert-token-id-past-vocab":
            f.detail.append(f"the frames show an embedding: {frames.embedding}")
        if f.signature.id == "device-assert-gather-scatter-index":
            f.detail.append(f"MoE frame: {frames.moe}" if frames.moe else "no MoE frame in the traceback")
    assert_findings = [f for f in out.values() if f.signature.id.startswith("device-assert-")]
    for seen in errors.cuda.values():
        name = seen.info.get("name") or ""
        if not _fresh(seen, named):
            continue
        if name in CUDA_ERRORS:
            code, message, sig_id = CUDA_ERRORS[name]
        else:
            code, message, sig_id = None, seen.info.get("message", ""), "cuda-runtime-error"
        if sig_id is None:
            continue
        if name == "cudaErrorAssert" and assert_findings:
            for f in assert_findings:
                f.add(seen.evidence)
                f.detail.append(_async_words(seen))
            continue
        f = finding(sig_id)
        add(f, seen)
        enum = f"{name} ({code})" if name and code is not None else name or "an enum the log does not name"
        f.detail.append(f"CUDA error {enum}: {seen.info.get('message') or message}")
        f.detail.append(_async_words(seen))
        if sig_id == "cuda-illegal-address" and frames.deepep:
            f.detail.append(f"DeepEP / HybridEP frames are in the log ({frames.deepep}): check the dispatcher's "
                            "buffer sizes against the tokens, hidden size and ranks of this run")
        if sig_id == "cuda-graph-capture-unsupported-op":
            f.detail.append(f"the frames are the MoE layer's ({frames.moe}): MoE with CUDA graphs needs static shapes "
                            "(no host sync on token counts in the captured region)" if frames.moe
                            else "no MoE / token-dispatcher frame in the evidence")
    for seen in errors.cublas.values():
        if _fresh(seen, named):
            status, fn = seen.key
            code, sig_id = CUBLAS_STATUSES.get(status, (None, "cublas-error"))
            f = finding(sig_id)
            add(f, seen)
            f.detail.append(f"cuBLAS {status}" + (f" ({code})" if code is not None else "")
                            + (f" when calling {fn}" if fn else ""))
    _nccl(errors, named, finding, add)
    if remote := out.get("nccl-remote-error"):
        words = errors.root_words()
        remote.detail.append(f"the first rank to exit (torchrun's Root Cause, {errors.root_where}): {words}; a lost "
                             "peer is a consequence: that rank's own log says why, unless its error is the lost peer "
                             "too (then the rank with an error of its own, named below when the logs show one)" if words
                             else "no torchrun Root Cause in the evidence: read every rank's log for the one that "
                                  "failed first")
    for seen in errors.ib.values():
        if _fresh(seen, named):
            name = seen.info["name"]
            f = finding(IBV_WC_STATUS.get(name, (0, "nccl-ib-completion-error"))[1])
            add(f, seen)
            f.detail.append(f"InfiniBand completion status {name} ({seen.info['code']}) from peer {seen.info['peer']}")
    return list(out.values())


def _async_words(seen: Seen) -> str:
    where = seen.info.get("frame") or ""
    shown = f" (here: {where})" if where else ""
    return (f"the Python frame shown{shown} may not be where it failed: CUDA reports a kernel's error at a later call "
            "(torch's own warning says so); CUDA_LAUNCH_BLOCKING=1 makes the failing launch raise at its call")


def _nccl(errors: RuntimeErrors, named, finding, add) -> None:
    oom = [s for s in errors.cuda_failures.values() if "out of memory" in s.info.get("message", "")]
    for seen in errors.nccl.values():
        if not _fresh(seen, named):
            continue
        name = seen.info.get("name") or ""
        last = seen.info.get("last_error")
        if name not in NCCL_RESULTS:
            continue
        code, _, sig_id = NCCL_RESULTS[name]
        if name == "ncclUnhandledCudaError" and (oom or (last and "out of memory" in last[1])):
            sig_id = "nccl-out-of-memory"
        f = finding(sig_id)
        add(f, seen)
        if line := seen.info.get("detail_line"):
            f.add(f"{line[0]}: {line[1][:300]}")
        f.detail.append(f"NCCL result {name} ({code})" + (f", NCCL {seen.info['version']}" if seen.info.get("version") else ""))
        if last:
            f.add(f"{last[0]}: {last[1][:300]}")
            f.detail.append(f"NCCL's last error: {last[1][:200]}")
    for seen in oom:
        if _fresh(seen, named):
            f = finding("nccl-out-of-memory")
            add(f, seen)
    for seen in errors.peer_gone.values():
        if _fresh(seen, named):
            f = finding("nccl-remote-error")
            add(f, seen)
            f.detail.append(f"the connection to peer {seen.info['peer'] or '(not named)'} was closed by the peer"
                            + (" (gloo's TCP transport, not NCCL: the same reading holds)"
                               if seen.info.get("backend") == "gloo" else ""))
