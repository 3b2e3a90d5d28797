"""``fpsim plan``: the planner on the command line (memory per device, compute optimum, time on a device).

Every option value arrives as text and is parsed here, so that a bad value is one line on stderr naming
the flag and exit status 2 (the ``fpsim`` convention, fpsim/_cliargs.py).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .._fpenv import ieee_mode

__all__ = ["PLAN_JSON_KEYS", "COMPUTE_JSON_KEYS", "cmd_plan", "plan_result", "register_cli"]

#: Top-level keys of ``fpsim plan --json`` (stable: new keys may be added, none removed; docs/planner.md).
PLAN_JSON_KEYS = ("memory", "compute")
#: Keys of its ``"compute"`` object (null when neither --budget nor --tokens is given).
COMPUTE_JSON_KEYS = ("budget_flops", "budget_from", "method", "n_params_optimal", "n_tokens_optimal",
                     "tokens_per_param_optimal", "device", "mfu", "n_devices", "seconds", "days")


def _real(text: str, *, lo: float = 0.0, lo_open: bool = True, hi: float | None = None) -> float:
    v = text.strip()
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if not math.isfinite(x) or (x <= lo if lo_open else x < lo) or (hi is not None and x > hi):
        rng = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        raise ValueError(f"expected a finite number {rng}, got {v!r}")
    return x


#: The largest --params, --budget and --tokens taken: far beyond any model or budget, and small enough that no
#: byte count, FLOP count or time derived from them overflows a float (1e308) or meets a budget below one FLOP.
MAX_AMOUNT = 1e30


def _amount(text: str) -> float:
    """A FLOP budget or a token count: a finite number from 1 to :data:`MAX_AMOUNT`."""
    return _real(text, lo=1.0, lo_open=False, hi=MAX_AMOUNT)


def _count(text: str) -> int:
    """A whole number from 1 to :data:`MAX_AMOUNT` written as an integer or in exponent form (7.5e9)."""
    x = _amount(text)
    if x != math.floor(x):
        raise ValueError(f"expected a whole number >= 1, got {text.strip()!r}")
    return int(x)


def _checkpoint(text: str) -> str | int:
    from .._cliargs import pos_int
    from .memory import CHECKPOINT_MODES, _parse_checkpoint

    v = text.strip()
    if v.isascii() and v.isdigit():
        return pos_int(v)
    try:
        return _parse_checkpoint(v)
    except ValueError:
        raise ValueError(f"expected one of {', '.join(CHECKPOINT_MODES)} or an integer k >= 1 (every k-th block), "
                         f"got {v!r}") from None


def _model(args: argparse.Namespace) -> Any:
    """The model from --model or the size flags (None when neither is given)."""
    from .._cliargs import flag_value, pos_int
    from .models import ModelSpec, get_model

    sizes = {"--layers": args.layers, "--hidden": args.hidden, "--heads": args.heads, "--vocab": args.vocab}
    given = [k for k, v in sizes.items() if v is not None]
    if args.model is not None and given:
        raise ValueError(f"--model: give a named model or the size flags ({', '.join(sizes)}), not both")
    if args.model is not None:
        return flag_value("--model", get_model, args.model)
    if not given:
        return None
    missing = [k for k, v in sizes.items() if v is None]
    if missing:
        raise ValueError(f"{missing[0]}: a model given by size needs {', '.join(sizes)} and --seq-len")
    if args.seq_len is None:
        raise ValueError("--seq-len: a model given by size needs the sequence length")
    v = {k: flag_value(k, pos_int, t) for k, t in sizes.items()}
    kw: dict[str, Any] = {}
    if args.kv_heads is not None:
        kw["n_kv_head"] = flag_value("--kv-heads", pos_int, args.kv_heads)
    if args.ffn is not None:
        kw["ffn_hidden"] = flag_value("--ffn", pos_int, args.ffn)
    spec = flag_value("--hidden", lambda _: ModelSpec(
        "custom", n_layer=v["--layers"], n_embd=v["--hidden"], n_head=v["--heads"], vocab_size=v["--vocab"],
        seq_len=flag_value("--seq-len", pos_int, args.seq_len), gated_mlp=args.gated,
        tied_embeddings=not args.gated, learned_positions=not args.gated, bias=not args.gated,
        dropout=args.dropout, **kw), None)
    return spec


@ieee_mode
def plan_result(args: argparse.Namespace) -> dict[str, Any]:
    """What ``fpsim plan`` computes, as the dict ``--json`` prints (keys :data:`PLAN_JSON_KEYS`)."""
    from .._cliargs import flag_value, nonneg_int, pos_int
    from .compute import compute_optimal, get_accelerator, training_flops, training_time
    from .memory import get_recipe, memory

    spec = _model(args)
    n = None if args.params is None else flag_value("--params", _count, args.params)
    recipe = flag_value("--recipe", get_recipe, args.recipe)
    from .._names import parse_name
    from .memory import OPTIMIZERS

    opt = flag_value("--optimizer", lambda o: parse_name(o, tuple(OPTIMIZERS), "optimizer"), args.optimizer)
    dp = flag_value("--dp", pos_int, args.dp)
    zero = flag_value("--zero", nonneg_int, args.zero)
    if zero > 3:
        raise ValueError(f"--zero: expected a ZeRO stage 0, 1, 2 or 3, got {args.zero.strip()!r}")
    tp = flag_value("--tp", pos_int, args.tp)
    ck = flag_value("--checkpoint", _checkpoint, args.checkpoint)
    mb = flag_value("--micro-batch", pos_int, args.micro_batch)
    sl = None if args.seq_len is None or spec is None else flag_value("--seq-len", pos_int, args.seq_len)
    rank = flag_value("--lora-rank", pos_int, args.lora_rank)
    budget = None if args.budget is None else flag_value("--budget", _amount, args.budget)
    tokens = None if args.tokens is None else flag_value("--tokens", _amount, args.tokens)
    mfu = flag_value("--mfu", lambda t: _real(t, hi=1.0), args.mfu)
    ndev = flag_value("--devices", pos_int, args.devices)
    acc = None if args.device is None else flag_value("--device", get_accelerator, args.device)
    method = flag_value("--method", lambda m: parse_name(m, ("rule", "table3"), "method"), args.method)
    if budget is not None and tokens is not None:
        raise ValueError("--tokens: give a budget (--budget) or tokens to train on (--tokens), not both")

    mem = None
    if spec is not None or n is not None:
        plan = flag_value("--recipe", lambda _: memory(
            n, model=spec, recipe=recipe, optimizer=opt, dp=dp, zero=zero, checkpoint=ck, flash=not args.no_flash,
            micro_batch=mb, seq_len=sl, activations=not args.no_activations, tp=tp, lora_rank=rank), None)
        mem = plan.to_dict()
    compute = None
    if tokens is not None:
        if mem is None:
            raise ValueError("--tokens: the budget 6 N D needs the model (--model, the size flags or --params)")
        budget, source = training_flops(mem["n_params"], tokens), "6ND"
    else:
        source = "--budget"
    if budget is not None:
        n_opt, d_opt = compute_optimal(budget, method=method)
        compute = {"budget_flops": budget, "budget_from": source, "method": method, "n_params_optimal": n_opt,
                   "n_tokens_optimal": d_opt, "tokens_per_param_optimal": d_opt / n_opt,
                   "device": None, "mfu": mfu, "n_devices": ndev, "seconds": None, "days": None}
        if acc is not None:
            secs = training_time(budget, acc, mfu=mfu, n_devices=ndev)
            compute.update(device=acc.name, seconds=secs, days={k: v / 86400 for k, v in secs.items()})
    elif acc is not None:
        raise ValueError("--device: the time on a device needs a budget (--budget FLOPS or --tokens D)")
    if mem is None and compute is None:
        raise ValueError("--model: give a model (--model NAME, the size flags or --params N) and/or a budget "
                         "(--budget FLOPS)")
    return {"memory": mem, "compute": compute}


def _text(res: dict[str, Any], unit: str) -> str:
    from .memory import MEMORY_KEYS, _unit

    out: list[str] = []
    m = res["memory"]
    if m is not None:
        scale = _unit(unit)
        out.append(f"model       {m['model']}  ({m['n_params']:,} parameters"
                   + (f", {m['trainable_params']:,} trained" if m["trainable_params"] != m["n_params"] else "") + ")")
        out.append(f"recipe      {m['recipe']}  optimizer {m['optimizer']}  dp {m['dp']}  ZeRO-{m['zero']}  "
                   f"tp {m['tp']}")
        out.append(f"activations checkpoint {m['checkpoint']}  flash {'on' if m['flash'] else 'off'}  "
                   f"micro-batch {m['micro_batch']}  sequence {m['seq_len'] if m['seq_len'] else '-'}")
        out.append("")
        out.append(f"{'':12s} {'bytes/param':>11s} {'per device (' + unit + ')':>18s}")
        for k in MEMORY_KEYS:
            bpp = m["bytes_per_param"].get(k)
            cell = "n/a" if k == "activations" and not m["activations_included"] else f"{m['per_device'][k] / scale:.4g}"
            out.append(f"{k:12s} {'' if bpp is None else f'{bpp:.4g}':>11s} {cell:>18s}")
        for note in m["notes"]:
            out.append(f"note: {note}")
    c = res["compute"]
    if c is not None:
        if out:
            out.append("")
        out.append(f"budget      {c['budget_flops']:.3g} FLOPs ({c['budget_from']})")
        out.append(f"optimum     N = {c['n_params_optimal']:.3g} parameters, D = {c['n_tokens_optimal']:.3g} tokens "
                   f"({c['tokens_per_param_optimal']:.1f} tokens/parameter; Chinchilla, method {c['method']})")
        if c["device"] is not None:
            out.append(f"time        on {c['n_devices']} x {c['device']} at {c['mfu']:.0%} of dense peak:")
            for p, d in c["days"].items():
                out.append(f"  {p:5s} {d:12.4g} days")
    return "\n".join(out)


@ieee_mode
def cmd_plan(args: argparse.Namespace) -> int:
    from .._cliargs import flag_value, json_text
    from .memory import _unit

    unit = args.unit.strip()
    flag_value("--unit", _unit, unit)
    res = plan_result(args)
    if args.json:
        print(json_text(res, indent=1))  # strict JSON: an infinite time is "inf", never Infinity
    else:
        print(_text(res, unit))
    return 0


def register_cli(subparsers: Any) -> None:
    """Add ``plan`` to the ``fpsim`` command's subparsers."""
    from .compute import accelerator_names
    from .memory import CHECKPOINT_MODES, OPTIMIZERS, recipe_names
    from .models import model_names

    s = subparsers.add_parser(
        "plan", help="memory per device and compute for training a model (ZeRO, checkpointing, Chinchilla)",
        description="Bytes per parameter and per device (weights, gradients, master copy, optimizer states, "
                    "activations) for a model and a precision recipe; the Chinchilla-optimal size for a FLOP "
                    "budget and the time on a named accelerator. Formulas and sources: docs/planner.md.")
    g = s.add_argument_group("model (a name, or the size flags with --seq-len)")
    g.add_argument("--model", default=None, metavar="NAME", help=f"named model: {', '.join(model_names())}")
    g.add_argument("--params", default=None, metavar="N",
                   help="number of parameters (7.5e9; at most 1e30); overrides the count from the model's shape")
    g.add_argument("--layers", default=None, metavar="L")
    g.add_argument("--hidden", default=None, metavar="H")
    g.add_argument("--heads", default=None, metavar="A")
    g.add_argument("--vocab", default=None, metavar="V")
    g.add_argument("--kv-heads", default=None, metavar="K", help="key/value heads (grouped-query attention)")
    g.add_argument("--ffn", default=None, metavar="F", help="MLP width (default 4H)")
    g.add_argument("--gated", action="store_true", help="SwiGLU MLP, untied embeddings, no biases (Llama layout)")
    g.add_argument("--dropout", action="store_true", help="the model uses dropout (Korthikanti's GPT accounting)")
    g.add_argument("--seq-len", default=None, metavar="S", help="sequence length (default: the model's)")
    t = s.add_argument_group("training")
    t.add_argument("--recipe", default="bf16-mixed", metavar="R", help=f"precision recipe (default bf16-mixed): "
                                                                       f"{', '.join(recipe_names())}")
    t.add_argument("--optimizer", default="adamw", metavar="O", help=f"default adamw: {', '.join(OPTIMIZERS)}")
    t.add_argument("--dp", default="1", metavar="N", help="data-parallel degree (default 1)")
    t.add_argument("--zero", default="0", metavar="STAGE", help="ZeRO stage 0-3 (default 0)")
    t.add_argument("--tp", default="1", metavar="T", help="tensor-parallel degree (default 1)")
    t.add_argument("--checkpoint", default="none", metavar="MODE",
                   help=f"activation checkpointing: {', '.join(CHECKPOINT_MODES)} or k (every k-th block)")
    t.add_argument("--no-flash", action="store_true", help="standard attention (keeps the s x s softmax)")
    t.add_argument("--micro-batch", default="1", metavar="B", help="sequences per micro-batch (default 1)")
    t.add_argument("--no-activations", action="store_true", help="model states only")
    t.add_argument("--lora-rank", default="64", metavar="R", help="LoRA rank for --recipe qlora (default 64)")
    c = s.add_argument_group("compute")
    c.add_argument("--budget", default=None, metavar="FLOPS", help="training budget in FLOPs (5.76e23; from 1 to 1e30)")
    c.add_argument("--tokens", default=None, metavar="D", help="tokens to train on: budget = 6 N D (from 1 to 1e30)")
    c.add_argument("--method", default="rule", metavar="M",
                   help="compute-optimal fit: rule (20 tokens/parameter, default) or table3")
    c.add_argument("--device", default=None, metavar="NAME", help=f"accelerator: {', '.join(accelerator_names())}")
    c.add_argument("--mfu", default="0.4", metavar="U", help="model FLOPs utilisation, 0 < U <= 1 (default 0.4)")
    c.add_argument("--devices", default="1", metavar="K", help="number of devices (default 1)")
    s.add_argument("--unit", default="GB", metavar="U", help="GB (1e9 bytes, default), GiB, MB, MiB, TB, TiB")
    s.add_argument("--json", action="store_true", help="print the result as strict JSON (keys in docs/planner.md; "
                                                           "a number too large for a float is the string \"inf\")")
    s.set_defaults(func=cmd_plan)
