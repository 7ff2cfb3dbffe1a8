"""Values that reach a generated Slurm job script: checked here, once, before anything is built.

Contract
--------
* ``sbatch_value(flag, value)``: ``value`` unchanged when it is one plain word, else ``UsageError``:
  sbatch reads an ``#SBATCH`` value up to the first blank and does not unquote it like a shell, so a
  blank, quote, backslash, newline or NUL would silently cut it short or start a line of its own.
* ``time_limit_minutes(value)``: the minutes Slurm gives a job for ``--time=value`` (Slurm rounds
  seconds up to a minute), ``None`` for ``UNLIMITED`` / ``INFINITE``. The forms are Slurm's own
  (``sbatch(1)``): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``. Stricter than Slurm in
  two ways, each a silent surprise there: a field after the first that is out of its clock range
  (minutes or seconds over 59, hours over 23 after a day) is refused - Slurm carries it over, so
  ``99:99:99`` becomes 4-04:41:00 - and a zero time is refused - Slurm reads ``0`` (and ``-1``) as
  no limit at all; write ``UNLIMITED`` to mean that. What this accepts, the real sbatch accepts with
  the same limit (checked against a real Slurm in ``tests/slurm``).
* ``job_environment(cfg)``: ``cfg.env_vars`` as strings; a name a shell cannot export is bad usage.
"""

from __future__ import annotations

import math
import re

from ..base.errors import UsageError
from ..base.values import env_value

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_UNSAFE = set(" \t\n\r\0\v\f'\"\\")
_D = r"([0-9]+)"
_F = r"([0-9]{1,2})"  # a field after the first: at most two digits, range checked below
TIME_FORMS = {  # Slurm's name of the form -> (pattern, the field each group is)
    "minutes": (re.compile(rf"{_D}"), ("m",)),
    "minutes:seconds": (re.compile(rf"{_D}:{_F}"), ("m", "s")),
    "hours:minutes:seconds": (re.compile(rf"{_D}:{_F}:{_F}"), ("h", "m", "s")),
    "days-hours": (re.compile(rf"{_D}-{_F}"), ("d", "h")),
    "days-hours:minutes": (re.compile(rf"{_D}-{_F}:{_F}"), ("d", "h", "m")),
    "days-hours:minutes:seconds": (re.compile(rf"{_D}-{_F}:{_F}:{_F}"), ("d", "h", "m", "s")),
}
_RANGE = {"h": 23, "m": 59, "s": 59}
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_ALLOWED_TIME = ("a Slurm time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
                 "days-hours:minutes:seconds (fields after the first within 0-59, hours after a day 0-23, not zero) "
                 "or UNLIMITED")


def sbatch_value(flag: str, value: str) -> str:
    if not value or any(c in _SBATCH_UNSAFE for c in value):
        raise UsageError(flag, value, "a non-empty value without blanks, quotes, backslashes, newlines or NUL "
                         "(sbatch cuts an #SBATCH value at the first blank)", "invalid")
    return value


def time_limit_minutes(value: str, flag: str = "--time") -> int | None:
    sbatch_value(flag, value)
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    for pattern, names in TIME_FORMS.values():
        m = pattern.fullmatch(value)
        if m is None:
            continue
        fields = dict(zip(names, (int(g) for g in m.groups())))
        leading = names[0]
        if any(v > _RANGE[k] for k, v in fields.items() if k != leading):
            break
        seconds = sum(_SECONDS[k] * v for k, v in fields.items())
        if seconds == 0:
            break
        return math.ceil(seconds / 60)
    raise UsageError(flag, value, _ALLOWED_TIME, "invalid")


def format_minutes(minutes: int | None) -> str:
    """Minutes as Slurm prints a time limit (``scontrol show job``: ``[D-]HH:MM:SS``)."""
    if minutes is None:
        return "UNLIMITED"
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def job_environment(cfg) -> dict[str, str]:
    """``cfg.env_vars`` as the job exports them. Its values were judged by the rule table
    (``env-var-values``: str, a number or a bool) before this runs; a name a shell cannot export is
    bad usage."""
    env = {str(k): env_value(v) for k, v in (cfg.env_vars or {}).items()}
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError("environment variable name", name, "letters, digits and _ (not starting with a digit)",
                             "invalid")
    return env
