"""A check named from the traceback frame that raised it, when the log holds no message to look up (or one
that no installed check raises).

Contract
--------
``named(error)`` takes a ``upstream_checks.RaisedError`` whose innermost frame is a ``raise X(`` /
``assert`` line in megatron/core or megatron/bridge (``error.raise_frame``) and gives the signature and
detail lines of the check that raised it, read from the installed source (``upstream_source``): the
frame's file (its path after ``megatron/``) and function, the exception the ``raise`` line names, the
nearest line (line numbers move between versions). The check found in that file and function, raising
that exception, is named at ``FRAME_CONFIDENCE`` when the log has no message (with a message that no installed
check raises the nearest line is a guess: ``FUNCTION_CONFIDENCE``, and said so); one found by the function alone (another exception,
or the function now lives in another file: "moved to FILE") at ``FUNCTION_CONFIDENCE``. A function
that is in no installed file is said to be not in the installed version, at ``ABSENT_CONFIDENCE``,
with the frame that called it. ``named_assert(error)`` names an ``AssertionError`` whose innermost frame is
an ``assert`` line in any other package (``error.assert_frame``: DeepEP's Python, TE's Python, a script)
from that line alone (``signatures.config_error.FAILED_ASSERT``): id ``failed-assert:PATH:LINE``, PATH from
the package's folder (``deep_ep/buffer.py``), the condition and the message when the log has one. Never
raises for what the frames hold.
"""

from __future__ import annotations

import ast
import dataclasses

from . import upstream_source
from .signatures.config_error import FAILED_ASSERT, UPSTREAM_CHECK

FRAME_CONFIDENCE = 0.7
FUNCTION_CONFIDENCE = 0.5
ABSENT_CONFIDENCE = 0.35


def relative(path: str) -> str:
    """``megatron/core/...`` from a frame's path."""
    return "megatron/" + path.split("/megatron/", 1)[-1] if "/megatron/" in path else path


_PACKAGE_ROOTS = ("site-packages/", "dist-packages/")


def package_path(path: str) -> str:
    """``deep_ep/buffer.py`` from ``/usr/.../site-packages/deep_ep/buffer.py`` or ``/opt/DeepEP/deep_ep/buffer.py``:
    the path from the package's folder, so that two installations name the same assert."""
    for root in _PACKAGE_ROOTS:
        if root in path:
            return path.rsplit(root, 1)[1]
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) >= 2 else path


def named_assert(error) -> tuple:
    """(signature, detail lines) for an ``AssertionError`` whose ``assert_frame`` is set."""
    path, line, function, code = error.assert_frame
    rel = package_path(path)
    condition = _assert_condition(code)
    message = f" ({error.message})" if error.message else ""
    cause = f"The assert at {rel}:{line} in {function} requires {condition}{message}; it failed."
    sig = dataclasses.replace(
        FAILED_ASSERT, id=f"{FAILED_ASSERT.id}:{rel}:{line}", cause=cause,
        fix=f"the assert at {rel}:{line} requires {condition}: change what the run passes it"
            + (f" ({_caller(error)[0]})" if _caller(error) else "") + ", or use a release whose check accepts it",
        source=f"traceback frame {rel}:{line} ({function})", emitted=(code,))
    detail = [f"failed assert: {rel}:{line} in {function}: `{code}`" + (f"; message: {error.message}" if error.message
                                                                          else "; no message")] + _caller(error)
    return sig, detail


def _assert_condition(code: str) -> str:
    """The condition of an ``assert COND, MSG`` line (the whole line after ``assert`` where it does not parse,
    a statement the traceback shows only the first line of)."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, ValueError, IndexError):
        return code.removeprefix("assert").strip()
    if not isinstance(node, ast.Assert):
        return code.removeprefix("assert").strip()
    return ast.get_source_segment(code, node.test) or ast.unparse(node.test)


def named(error) -> tuple:
    """(signature, detail lines) for an error whose ``raise_frame`` is set."""
    path, line, function, code = error.raise_frame
    rel = relative(path)
    check, found_in, by_frame = _check(rel, function, error.kind, line)
    said = (f"(its message is in no installed check: {error.message[:160]})" if error.message
            else "(no message in the log)")
    raised = f"raised at {rel}:{line} in {function} in the run: `{code}` {said}"
    detail = [raised] + _caller(error)
    version = upstream_source.installed_version(rel)
    if check is None:
        same_name = [r for r, _ in upstream_source.sources() if r.rsplit("/", 1)[-1] == rel.rsplit("/", 1)[-1]]
        detail.append(f"{function} is not in the installed {version}: no installed file defines it"
                      + (f" (files of that name: {', '.join(same_name)})" if same_name else
                         f"; {rel} is not installed either"))
        cause = (f"A check in {rel}, function {function}, raised {error.kind} (`{code}`; the log has no message); "
                 f"{function} is not in the installed {version}: the run used another version"
                 + (f". Reached from {_caller(error)[0][len('called from '):]}" if _caller(error) else "") + ".")
        return dataclasses.replace(
            UPSTREAM_CHECK, id=f"{UPSTREAM_CHECK.id}:{rel}:{function}", cause=cause,
            fix=f"read {function} in {rel} of the run's version of the source: its check refuses what the frame "
                "that called it does; or run the installed version to get its message",
            source=f"traceback frame {rel}:{line} ({function})", emitted=(), confidence=ABSENT_CONFIDENCE,
            versions=f"not the installed {version} (the function is not in its source)"), detail
    moved = found_in != rel
    where = f"{check.where} (in {function}" + (f"; moved to {found_in} from {rel})" if moved else ")")
    message = (f'its message: "{check.literal}"' if check.literal != upstream_source.NO_LITERAL
               else "it has no literal message")
    detail += [f"upstream check: {where}: {check.kind}, requires {check.condition}; {message}"]
    if moved:
        detail.append(f"{rel} does not define {function} in the installed {version}: moved to {found_in}")
    unmatched = " (the log's message is in no installed check: the run's version raises another one here)" \
        if error.message else " (the log has no message)"
    cause = (f"The check at {where} requires {check.condition}; {message}. Named from the traceback's innermost "
             f"frame{unmatched}: by file, function and the exception raised" if by_frame else
             f"The check at {where} requires {check.condition}; {message}. Named by the function alone "
             "(the file or the exception differ in the installed source)") + "."
    # a message the installed source does not hold makes the nearest line a guess, however well the frame fits
    sure = FRAME_CONFIDENCE if by_frame and not error.message else FUNCTION_CONFIDENCE
    return dataclasses.replace(
        UPSTREAM_CHECK, id=f"{UPSTREAM_CHECK.id}:{check.where}", cause=cause,
        fix=f"change the configuration so that {check.condition} holds (the check at {check.where})",
        source=f"installed:{check.where}", emitted=(),
        confidence=sure,
        versions=f"the installed {version} (named from the frame: file, function"
                 + (", exception" if by_frame else "") + "; the nearest line)"), detail


def _check(rel: str, function: str, kind: str, line: int):
    """(check, file it is in, matched by file + function + exception) or (None, '', False)."""
    files = [rel] if function_checks(rel, function) else []
    others = [f for f in upstream_source.defining_files(function) if f != rel and function_checks(f, function)]
    files += sorted(others, key=lambda f: _likeness(rel, f, function, kind), reverse=True)
    for found_in in files:
        checks = function_checks(found_in, function)
        same_kind = [c for c in checks if c.kind == kind]
        pool = same_kind or list(checks)
        best = min(pool, key=lambda c: abs(c.line - line))
        return best, found_in, bool(same_kind) and found_in == rel
    return None, "", False


def _likeness(rel: str, other: str, function: str, kind: str) -> tuple:
    """How likely ``other`` is where ``rel``'s function moved: the same file name, then the most path
    parts in common, then a check raising the same exception (``__post_init__`` is in many files)."""
    a, b = rel.split("/"), other.split("/")
    return (a[-1] == b[-1], len(set(a[:-1]) & set(b[:-1])),
            any(c.kind == kind for c in function_checks(other, function)), other)


def function_checks(rel: str, function: str):
    return upstream_source.function_checks(rel, function)


def _caller(error) -> list[str]:
    """'called from FILE:LINE in FN: `code`' for the frame above the raise, when there is one."""
    if len(error.frames) < 2:
        return []
    path, line, function = error.frames[-2]
    code = error.code[-2] if len(error.code) == len(error.frames) else ""
    return [f"called from {relative(path)}:{line} in {function}" + (f": `{code}`" if code else "")]
