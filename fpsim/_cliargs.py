"""Option values of the ``fpsim`` command, parsed with one-line errors that name the flag.

The subcommands (``fpsim round`` in fpsim/cli.py, ``fpsim demo`` in fpsim/train/cli.py) take their option
values as text and parse them here, so that a bad value is one line on stderr naming the flag and exit
status 2, never a traceback. Layer 0: imports nothing from fpsim.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, TypeVar

__all__ = ["CommandError", "flag_value", "int_range", "json_safe", "json_text", "nonneg_int", "pos_int",
           "printable"]

_T = TypeVar("_T")
_V = TypeVar("_V")


def flag_value(flag: str, parse: Callable[[_V], _T], value: _V) -> _T:
    """``parse(value)``, with a ``ValueError``/``TypeError`` turned into a ``ValueError`` naming ``flag``.

    >>> flag_value("--seed", nonneg_int, "-1")
    Traceback (most recent call last):
    ...
    ValueError: --seed: expected a non-negative integer, got '-1'
    """
    try:
        return parse(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{flag}: {e}") from None


def nonneg_int(value: str) -> int:
    """A non-negative decimal integer of at most 30 digits (``--seed``); ``ValueError`` naming the value."""
    v = value.strip()
    if not v.isascii() or not v.isdigit() or len(v) > 30:
        raise ValueError(f"expected a non-negative integer, got {v!r}")
    return int(v)


def pos_int(value: str) -> int:
    """A decimal integer >= 1 (``--steps``)."""
    v = value.strip()
    if not v.isascii() or not v.isdigit() or len(v) > 30 or int(v) < 1:
        raise ValueError(f"expected an integer >= 1, got {v!r}")
    return int(v)


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """A parser of decimal integers in ``lo..hi`` (a count whose excess would run for ever or fill memory).

    >>> int_range(1, 1000)("99999999999999999999")
    Traceback (most recent call last):
    ...
    ValueError: expected an integer from 1 to 1000, got '99999999999999999999'
    """

    def parse(value: str) -> int:
        v = value.strip()
        # the digit count first: int() of a 5000-digit text is slow, and refused by Python beyond 4300
        if not v.isascii() or not v.isdigit() or len(v) > 30 or not lo <= int(v) <= hi:
            raise ValueError(f"expected an integer from {lo} to {hi}, got {v!r}")
        return int(v)

    return parse


class CommandError(Exception):
    """An error a command reports as one line (``fpsim X: error: ...``, exit status 1), never a traceback.

    For failures that are not a bad value (those are ``ValueError``) but an outcome the user must act on,
    e.g. sweep cells that failed on every try (:class:`fpsim.train.sweep.SweepError`).
    """


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float made JSON: NaN as null, +-infinity as the strings ``"inf"``/``"-inf"``.

    JSON has no NaN or infinity (Python's ``json`` writes ``NaN``/``Infinity``, which strict parsers refuse);
    numpy scalars become Python numbers, tuples lists.

    >>> json_safe({"a": float("inf"), "b": [float("nan"), 1.5]})
    {'a': 'inf', 'b': [None, 1.5]}
    """
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    item = getattr(obj, "item", None)  # a NumPy or ml_dtypes scalar, a 0-d array (no numpy import in layer 0)
    if item is not None and getattr(obj, "ndim", None) == 0:
        return json_safe(item())
    return obj


def json_text(obj: Any, **kw: Any) -> str:
    """Strict JSON of ``obj`` (``allow_nan=False`` after :func:`json_safe`): what every ``--json`` prints."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


def printable(text: str) -> str:
    """``text`` with every non-printable character written as its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``): C0 and C1 controls, DEL, bidi overrides and other format characters, line separators,
    lone surrogates. For any text a file or a user controls (tensor names, paths, error messages) before
    it reaches the terminal, where an escape sequence could clear the screen, move the cursor or forge
    output, and a newline break a table line. Printable text, non-ASCII letters included, is kept.

    >>> printable("w\\x1b[2J\\n\\u202eé")
    'w\\\\x1b[2J\\\\n\\\\u202eé'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
