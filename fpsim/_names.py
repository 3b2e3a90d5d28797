"""One rule for every name fpsim takes (formats, modes, policies, recipes, tasks, optimizers, CLI choices).

The rule: surrounding white space is ignored and case does not matter (``" BF16 "`` is ``"bf16"``).
Nothing else is rewritten here; a parser that accepts aliases lists them in its own table, keyed by the
normalized spelling. Layer 0: imports nothing from fpsim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

__all__ = ["norm_name", "parse_name"]

_T = TypeVar("_T")


def norm_name(value: object, what: str) -> str:
    """The normalized spelling of a name: stripped and lower-cased.

    Raises ``TypeError`` naming ``what`` and the value when it is not a string.

    >>> norm_name(" RNE ", "rounding mode")
    'rne'
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}: {value!r}")
    return value.strip().lower()


def parse_name(value: object, choices: Iterable[str] | Mapping[str, _T], what: str) -> str:
    """Parse ``value`` against ``choices`` (canonical lower-case names) by the one rule.

    Returns the canonical name; an unknown name raises ``ValueError`` listing the valid choices, a value
    that is not a string raises ``TypeError``.

    >>> parse_name("AdamW", ("adamw", "sgd"), "optimizer")
    'adamw'
    >>> parse_name("adam", ("adamw", "sgd"), "optimizer")
    Traceback (most recent call last):
    ...
    ValueError: unknown optimizer 'adam'; valid: adamw, sgd
    """
    key = norm_name(value, what)
    names = list(choices)
    for name in names:
        if name.lower() == key:
            return name
    raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(names)}")
