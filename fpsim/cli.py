"""The ``fpsim`` command: ``fpsim formats``, ``fpsim round`` (and the subcommands later layers add)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from fractions import Fraction
from typing import Any, Callable, NoReturn

import numpy as np

from ._cliargs import CommandError, json_text, nonneg_int
from ._cliargs import flag_value as _flag
from ._cliargs import printable
from ._exact import decimal_str, fraction_str, parse_decimal
from ._fpenv import ieee_mode
from .rounding import round_rational

__all__ = ["main", "round_result", "ROUND_JSON_KEYS"]


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
        rows.append([str(d[c]) if c in ("name", "bits", "layout", "bias", "inf", "nan") else _fmt_num(d[c])
                     for c in cols])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """``fpsim devices [NAME | --device NAME] [--json]``: the preset table of :func:`fpsim.mma.preset_table`."""
    from .mma.presets import LEVELS, _norm_device, preset_table

    if args.name is not None and args.device is not None and _norm_device(args.name) != _norm_device(args.device):
        raise ValueError(f"give the device once: positional {args.name!r} and --device {args.device!r} differ")
    rows = preset_table(args.device if args.device is not None else args.name)
    if args.json:
        print(json_text({"levels": list(LEVELS), "presets": rows}, indent=2))
        return 0
    cols = ["device", "arch", "inputs -> outputs", "provenance", "caveats", "source"]
    table = []
    for r in rows:
        io = "-" if r["input"] is None else f"{r['input']} -> {r['output']}" + (f" [{r['path']}]" if r["path"] else "")
        src = r["source"] or r["note"]
        table.append([r["device"], r["arch"], io, r["provenance"], "; ".join(r["caveats"]) or "-",
                      src if len(src) <= 60 else src[:57] + "..."])
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
    print("(full sources, notes and the tests behind each claim: fpsim devices --json)")
    return 0


# Keys of ``fpsim round --json`` (documented in docs/getting-started.md; stable: new keys may be added, none removed).
ROUND_JSON_KEYS = ("input", "value", "value_fraction", "float64", "format", "rounding", "overflow", "seed",
                   "rounded", "rounded_exact", "rounded_hex", "bits", "code", "exact", "error", "error_fraction",
                   "relative_error")


def _nearest_float64(q: Fraction | float) -> float:
    if isinstance(q, float):
        return q
    try:
        return float(q)  # int / int: correctly rounded
    except OverflowError:
        return -math.inf if q < 0 else math.inf


def _to_float(q: Fraction) -> float | None:
    """q as the nearest float64, None beyond float64's range (JSON has no infinity)."""
    try:
        return float(q)
    except OverflowError:
        return None


def _approx(q: Fraction) -> str:
    """Three significant digits of any nonnegative rational, however large or small (``5.96e+392``)."""
    if q == 0:
        return "0"
    n, d = q.numerator, q.denominator
    e = int((n.bit_length() - d.bit_length()) * 0.30103)  # log10, within one
    for _ in range(4):
        t = e - 2  # v = round(q / 10**t) should have three digits
        v = Fraction(n, d * 10**t) if t >= 0 else Fraction(n * 10**-t, d)
        r = round(v)
        if r >= 1000:
            e += 1
        elif r < 100:
            e -= 1
        else:
            break
    txt = f"{r / 100:.2f}e{e:+d}"
    return f"{float(q):.3g}" if -300 < e < 300 else txt


def _short(s: str, limit: int = 60) -> str:
    """A long exact string abbreviated for the text output (``--json`` always has all digits)."""
    if len(s) <= limit:
        return s
    return f"{s[:24]}...{s[-12:]} ({len(s)} characters; --json has all)"


@ieee_mode
def round_result(text: str, fmt: str, rounding: str, overflow: str, seed: str | None = None) -> dict[str, Any]:
    """What ``fpsim round`` computes, as the dict ``--json`` prints (keys: :data:`ROUND_JSON_KEYS`).

    Every argument is the command-line text; a bad one raises ``ValueError`` naming its flag.

    >>> d = round_result("1.00048828125000000001", "fp16", "rne", "ieee")
    >>> d["rounded"], d["code"], d["error"]
    ('1.0009765625', '0x3C01', '0.00048828124999999999')
    """
    return _round(text, fmt, rounding, overflow, seed)[0]


def _round(text: str, fmt: str, rounding: str, overflow: str,
           seed: str | None) -> tuple[dict[str, Any], Fraction | float, float]:
    from .bits import bits_str, to_bits
    from .formats import as_format
    from .rounding import Rounding, as_overflow, as_rounding
    from .rounding import round as fround

    f = _flag("--format", as_format, fmt)
    mode = _flag("--rounding", as_rounding, rounding)
    ov = _flag("--overflow", as_overflow, overflow)
    sd = None if seed is None else _flag("--seed", nonneg_int, seed)
    q = _flag("value", parse_decimal, text)
    finite = not isinstance(q, float) or math.isfinite(q)
    x64 = _nearest_float64(q)
    rng = np.random.default_rng(sd or 0) if mode is Rounding.SR else None
    r = round_rational(q, f, mode, ov, True, rng=rng)
    code = int(to_bits(r, f))
    res: dict[str, Any] = {
        "input": text.strip(),
        "value": decimal_str(q) if finite else repr(q),
        "value_fraction": decimal_str(q) if isinstance(q, float) else fraction_str(q),
        "float64": repr(x64),
        "format": f.name,
        "rounding": mode.value,
        "overflow": ov.value,
        "seed": (sd or 0) if mode is Rounding.SR else None,
        "rounded": repr(r),
        "rounded_exact": decimal_str(r),
        "rounded_hex": r.hex(),
        "bits": str(bits_str(r, f)),
        "code": f"0x{code:0{(f.width + 3) // 4}X}",
        "exact": None, "error": None, "error_fraction": None, "relative_error": None,
    }
    if finite and math.isfinite(r):
        qf = Fraction(q)
        err = Fraction(r) - qf
        res["exact"] = err == 0
        res["error"] = decimal_str(err)
        res["error_fraction"] = fraction_str(err)
        res["relative_error"] = _to_float(abs(err) / abs(qf)) if qf != 0 else 0.0
    else:  # nan in, or an infinity/nan out: exact only when the same special value comes back
        res["exact"] = (not finite) and (repr(r) == repr(q))
    return res, q, r


def cmd_round(args: argparse.Namespace) -> int:
    d, q, r = _round(args.value, args.format, args.rounding, args.overflow, args.seed)
    if args.json:
        print(json_text(d, indent=1))
        return 0
    finite = not isinstance(q, float) or math.isfinite(q)
    extra = "  (no finite decimal expansion)" if d["value"] is None else ""
    x64 = float(d["float64"])
    if finite and (not math.isfinite(x64) or Fraction(q) != Fraction(x64)):
        extra += f"  (not a float64; nearest float64 {d['float64']})"
    print(f"input     {printable(_short(d['input']))}")
    print(f"exact     {_short(d['value'] if d['value'] is not None else d['value_fraction'])}{extra}")
    print(f"format    {d['format']}  rounding {d['rounding']}  overflow {d['overflow']}"
          + (f"  seed {d['seed']}" if d["seed"] is not None else ""))
    print(f"rounded   {d['rounded']}  ({d['rounded_hex']})")
    print(f"bits      {d['bits']}")
    print(f"hex       {d['code']}")
    if d["error"] is None and d["error_fraction"] is None:
        print(f"error     {_no_error_reason(d, q, r)}")
    else:
        e = d["error"] if d["error"] is not None else d["error_fraction"]
        qf = Fraction(q)
        rel = _approx(abs(Fraction(r) - qf) / abs(qf)) if qf else "0"
        print(f"error     {_short(e)}  (rounded - input, exact; relative {rel})")
    return 0


def _no_error_reason(d: dict[str, Any], q: Any, r: float) -> str:
    """Why a rounding has no finite error: a special value in, or a finite value that overflowed."""
    if isinstance(q, float) and not math.isfinite(q):
        return "- (a special value in: nothing to round)"
    from .formats import as_format

    largest = as_format(d["format"]).max
    what = ("-" if r < 0 else "+") + "infinity" if math.isinf(r) else "NaN (the format has no infinity)"
    return (f"overflow: |input| is beyond {d['format']}'s largest finite value {largest:g}, so it rounds to "
            f"{what} (--overflow saturate gives {-largest if r < 0 else largest:g} instead)")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``fpsim round: error: ...``), exit status 2, as argparse's own exit."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        PackageNotFoundError, version = Exception, None  # type: ignore[assignment,misc]
    try:
        if version is not None:
            return str(version("fpsim-precision"))
    except PackageNotFoundError:
        pass
    from . import __version__

    return str(__version__)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``fpsim`` parser; the subcommand `command` of a higher layer (demo, plan, ...) with all its options."""
    from .formats import format_names
    from .rounding import Overflow, Rounding

    p = _Parser(prog="fpsim", description="Bit-exact floating-point precision simulator.")
    p.add_argument("--version", action="version", version=f"fpsim {_version()}",
                   help="print the installed version (distribution fpsim-precision) and exit")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("formats", help="print a table of every format")
    s.set_defaults(func=cmd_formats)
    s = sub.add_parser("round", help="round a value into a format, once, from its exact value, and show its bits",
                       description="Round a number, parsed exactly (never through float64), into a format once, "
                                   "and show the result's bits and the exact rounding error.")
    s.add_argument("value", help="a decimal with any number of digits (0.1, 1e-400, -1.00048828125000000001), "
                                 "a hex float (0x1.8p-3), a fraction (1/3), inf or nan")
    s.add_argument("--format", "-f", default="bf16", metavar="FORMAT",
                   help=f"target format (case-insensitive; default bf16): {', '.join(format_names())}")
    s.add_argument("--rounding", "-r", default="rne", metavar="MODE",
                   help=f"rounding mode (default rne): {', '.join(m.value for m in Rounding)}")
    s.add_argument("--overflow", default="ieee", metavar="POLICY",
                   help=f"overflow policy (default ieee): {', '.join(m.value for m in Overflow)}")
    s.add_argument("--seed", default=None, metavar="S",
                   help="seed for --rounding sr (default 0): exact stochastic rounding of the exact value")
    s.add_argument("--json", action="store_true", help="print the result as JSON (keys in docs/getting-started.md)")
    s.set_defaults(func=cmd_round)
    s = sub.add_parser("devices", help="list every matrix-unit preset (device, formats) with its provenance",
                       description="Every device preset fpsim.mma.get_model knows, with how far it is validated: "
                                   "reproduces published hardware rows / agrees with MMA-Sim / from documentation "
                                   "only, and the source (docs/devices.md).")
    s.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help="only this device (any spelling get_model takes; same as --device)")
    s.add_argument("--device", default=None, metavar="NAME", help="only this device (any spelling get_model takes)")
    s.add_argument("--json", action="store_true", help="print the presets as JSON (keys in docs/devices.md)")
    s.set_defaults(func=cmd_devices)
    for name, (modname, help_text) in _EXTENSIONS.items():
        if command == name:
            __import__(modname, fromlist=["register_cli"]).register_cli(sub)
        else:  # listed for `fpsim --help`; its module (the trainer, the planner, ...) loads only when it runs
            sub.add_parser(name, help=help_text, add_help=False)
    return p


#: Subcommands provided by higher layers: name -> (module with ``register_cli``, the one-line help of
#: ``fpsim --help``). Kept here so that ``fpsim --help`` and ``fpsim round`` import none of them;
#: tests/test_lazy_import.py checks each line against what the module registers.
_EXTENSIONS: dict[str, tuple[str, str]] = {
    "demo": ("fpsim.train.cli", "train a tiny GPT under every precision policy and write a report"),
    "probe": ("fpsim.gpu.cli", "identify this GPU's Tensor Core arithmetic (needs CuPy and CUDA)"),
    "plan": ("fpsim.plan.cli", "memory per device and compute for training a model (ZeRO, checkpointing, "
                               "Chinchilla)"),
    "audit": ("fpsim.audit", "audit a safetensors checkpoint for low-precision casts (FP8, MXFP4, NVFP4, ...)"),
    "vectors": ("fpsim.testing.vectors", "write golden vectors of the casts into a format (binary, .npy, JSON "
                                         "manifest)"),
}


def _protect_negative(argv: list[str]) -> list[str]:
    """``fpsim round -1e-3``: argparse takes ``-1e-3``, ``-inf``, ``-0x1p3`` for options; a leading space
    makes them positional (parse_decimal ignores it). Only tokens that are numbers and only for ``round``."""
    if not argv or argv[0] != "round":
        return argv
    out = argv[:1]
    for i, a in enumerate(argv[1:], 1):
        if a == "--":
            return out + argv[i:]
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            try:
                parse_decimal(a)
            except ValueError:
                pass
            else:
                a = " " + a
        out.append(a)
    return out


@ieee_mode
def main(argv: list[str] | None = None) -> int:
    """The ``fpsim`` command: the exit status; every failure one line on stderr, never a traceback for bad input.

    Bad values (``ValueError``/``TypeError``, named by their flag): status 2, as argparse's usage errors.
    Failures the user acts on (``OSError``: missing, unwritable or full paths, unreachable schedulers;
    :class:`~fpsim._cliargs.CommandError`: e.g. sweep cells that failed on every try; ``MemoryError``;
    Dask's ``KilledWorker``): status 1. Ctrl-C: 130. A reader that left (``fpsim formats | head -1``):
    status 0 and nothing more. Anything else is a bug in fpsim: its traceback is kept (hiding it would hide
    the bug) and followed by one line asking for a report, status 1.
    """
    av = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    if av and isinstance(av[0], str) and av[0].strip().lower() in _subcommands(p):
        av[0] = av[0].strip().lower()  # the one name rule for subcommands too ("ROUND", " demo")
        if av[0] in _EXTENSIONS:
            p = build_parser(av[0])
    try:
        args = p.parse_args(_protect_negative(av))
    except BrokenPipeError:  # `fpsim --help | head -1` where print_help writes before the exit (Python 3.10)
        _quiet_stdout()
        return 0
    name = f"fpsim {args.command}"
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `fpsim formats | head -1`: the reader left; nothing to say
        _quiet_stdout()
        return 0
    except (ValueError, TypeError) as e:
        _say_error(f"{name}: error: {_one_line(e)}")
        return 2
    except KeyboardInterrupt:
        _say_error(f"{name}: interrupted")
        return 130
    except (OSError, CommandError) as e:  # disk full, folder removed mid-run, ...: the demo kept what it had finished
        _say_error(f"{name}: error: {_one_line(e)}")
        return 1
    except MemoryError:
        _say_error(f"{name}: error: out of memory")
        return 1
    except Exception as e:  # noqa: BLE001 - a bug: shown whole, with where to report it
        if _machine_failure(e):
            _say_error(f"{name}: error: {_one_line(e)}")
            return 1
        traceback.print_exc(file=sys.stderr)
        _say_error(f"{name}: internal error ({type(e).__name__}): this is a bug in fpsim; please report it with "
                   "the command line and the traceback above")
        return 1


def _machine_failure(e: BaseException) -> bool:
    """A failure of the machines rather than of fpsim: a Dask task whose workers kept dying (``KilledWorker``,
    e.g. out of memory in ``fpsim audit --scheduler``). distributed is looked at only if something imported it."""
    dist = sys.modules.get("distributed")
    killed = getattr(dist, "KilledWorker", None)
    return isinstance(killed, type) and isinstance(e, killed)


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the flush at exit does not raise BrokenPipeError again."""
    try:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
    except OSError:
        pass


def _say_error(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed too: the exit status is all that is left
        pass


def _one_line(e: BaseException) -> str:
    """The error as one line, safe for a terminal: whitespace runs become one space and any other
    control character (a hostile file name or tensor name in the message) is escaped."""
    return printable(" ".join(str(e).split())) or type(e).__name__


def _subcommands(p: argparse.ArgumentParser) -> list[str]:
    for a in p._actions:  # argparse keeps its subparsers here; no public accessor
        if isinstance(a, argparse._SubParsersAction):
            return list(a.choices)
    return []


if __name__ == "__main__":
    sys.exit(main())
