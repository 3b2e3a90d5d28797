"""The ``fpsim`` command: ``fpsim formats``, ``fpsim round`` (and the subcommands later layers add)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import numpy as np

__all__ = ["main"]


def _fmt_num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}"


def cmd_formats(args: argparse.Namespace) -> int:
    from .formats import all_formats

    cols = ["name", "bits", "layout", "bias", "max", "min_normal", "min_subnormal", "eps", "inf", "nan"]
    rows = []
    for f in all_formats():
        d = f.describe()
        rows.append([str(d[c]) if c in ("name", "bits", "layout", "bias", "inf", "nan") else _fmt_num(d[c]) for c in cols])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return 0


def cmd_round(args: argparse.Namespace) -> int:
    from .bits import bits_str, to_bits
    from .formats import as_format
    from .rounding import round as fround

    fmt = as_format(args.format)
    try:
        x = float(args.value)
    except ValueError:
        print(f"fpsim round: not a number: {args.value!r}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed) if args.rounding == "sr" else None
    r = float(fround(x, fmt, args.rounding, overflow=args.overflow, rng=rng))
    code = int(to_bits(r, fmt))
    err = r - x if np.isfinite(r) else float("nan")
    rel = abs(err) / abs(x) if x != 0 and np.isfinite(err) else 0.0
    print(f"input     {x!r}  ({x.hex()})")
    print(f"format    {fmt.name}  rounding {args.rounding}  overflow {args.overflow}")
    print(f"rounded   {r!r}")
    print(f"bits      {bits_str(r, fmt)}")
    print(f"hex       0x{code:0{(fmt.width + 3) // 4}X}")
    print(f"error     {err:.6g} (relative {rel:.3g})")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def build_parser() -> argparse.ArgumentParser:
    from .formats import format_names
    from .rounding import Overflow, Rounding

    p = argparse.ArgumentParser(prog="fpsim", description="Bit-exact floating-point precision simulator.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("formats", help="print a table of every format")
    s.set_defaults(func=cmd_formats)
    s = sub.add_parser("round", help="round a value into a format and show its bits")
    s.add_argument("value", help="a decimal or float literal, e.g. 0.1 or 1e-8")
    s.add_argument("--format", "-f", default="bf16", help=f"one of: {', '.join(format_names())}")
    s.add_argument("--rounding", "-r", default="rne", choices=[m.value for m in Rounding])
    s.add_argument("--overflow", default="ieee", choices=[m.value for m in Overflow])
    s.add_argument("--seed", type=int, default=0, help="seed for --rounding sr")
    s.set_defaults(func=cmd_round)
    for name, (register, _) in _EXTENSIONS.items():
        register(sub)
    return p


def _register_extensions() -> dict[str, tuple[Callable[..., None], None]]:
    """Subcommands provided by higher layers (demo, probe) register here when present."""
    ext: dict[str, tuple[Callable[..., None], None]] = {}
    for modname in ("fpsim.train.cli", "fpsim.gpu.cli"):
        try:
            mod = __import__(modname, fromlist=["register_cli"])
        except ImportError:
            continue
        ext[modname] = (mod.register_cli, None)
    return ext


_EXTENSIONS = _register_extensions()


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, TypeError) as e:
        print(f"fpsim {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
