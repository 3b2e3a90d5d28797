"""Option values of the ``fpsim`` command, parsed with one-line errors that name the flag.

The subcommands (``fpsim round`` in fpsim/cli.py, ``fpsim demo`` in fpsim/train/cli.py) take their option
values as text and parse them here, so that a bad value is one line on stderr naming the flag and exit
status 2, never a traceback. Layer 0: imports nothing from fpsim.
"""

from __future__ import annotations

from typing import Callable, TypeVar

__all__ = ["flag_value", "nonneg_int", "pos_int", "printable"]

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
