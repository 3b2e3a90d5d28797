"""Deprecation helper: the one way fpsim announces that a public name or argument will go away.

Policy (docs/oracle.md, "API stability"): a public name is deprecated in a minor release, keeps working
while warning for at least one full minor version, and is removed no earlier than the minor version
after that. The warning is a ``DeprecationWarning`` that names the version it was deprecated in, the
version that removes it, and what to use instead.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def warn_deprecated(what: str, *, since: str, removed_in: str, alternative: str | None = None,
                    stacklevel: int = 3) -> None:
    """Emit the standard ``DeprecationWarning`` for ``what`` (a name or ``"argument x of f()"``).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     warn_deprecated("fpsim.old", since="0.2", removed_in="0.4", alternative="fpsim.new")
    >>> str(w[0].message)
    'fpsim.old is deprecated since fpsim 0.2 and will be removed in 0.4; use fpsim.new instead'
    """
    msg = f"{what} is deprecated since fpsim {since} and will be removed in {removed_in}"
    if alternative:
        msg += f"; use {alternative} instead"
    warnings.warn(msg, DeprecationWarning, stacklevel=stacklevel)


def deprecated(*, since: str, removed_in: str, alternative: str | None = None) -> Callable[[F], F]:
    """Decorator: calling the function warns (see :func:`warn_deprecated`), then runs it unchanged.

    >>> @deprecated(since="0.2", removed_in="0.4", alternative="fpsim.round")
    ... def old_round(x):
    ...     return x
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     old_round(1.0)
    1.0
    >>> w[0].category.__name__
    'DeprecationWarning'
    """

    def wrap(func: F) -> F:
        name = f"{func.__module__}.{func.__qualname__}"

        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            warn_deprecated(name, since=since, removed_in=removed_in, alternative=alternative)
            return func(*args, **kwargs)

        note = f"\n\n.. deprecated:: {since}\n   Removed in {removed_in}." + (f" Use {alternative}." if alternative else "")
        inner.__doc__ = (func.__doc__ or "") + note
        return inner  # type: ignore[return-value]

    return wrap
