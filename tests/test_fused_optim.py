"""Fused AdamW / Adam / SGD steps against torch's fused CPU kernels (torch 2.13), bit for bit.

Every case runs many steps on several tensors of random shapes (sizes that are not multiples of the
vector width, so the kernels' scalar tail is hit), with random hyper-parameters, and counts the float32
weights whose bits differ from torch's after every step: the count must be 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from fpsim.amp import SGD, AdamW, fused_adamw_step, fused_sgd_step

torch = pytest.importorskip("torch")

F = np.float32


def _shapes(rng: np.random.Generator) -> list[tuple[int, ...]]:
    out = [tuple(int(s) for s in rng.integers(1, 40, size=int(rng.integers(1, 3)))) for _ in range(3)]
    return out + [(int(rng.integers(1, 8)),), (16 * int(rng.integers(1, 4)) + int(rng.integers(0, 16)),)]


def _grads(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    return [(rng.standard_normal(s) * 10 ** rng.uniform(-4, 1)).astype(F) for s in shapes]


def _diff(tp: list[Any], mine: list[np.ndarray]) -> tuple[int, int]:
    bad = sum(int(np.count_nonzero(a.detach().numpy().view(np.uint32) != b.view(np.uint32))) for a, b in zip(tp, mine))
    return bad, sum(b.size for b in mine)


def adam_case(seed: int, decoupled: bool = True, steps: int = 12) -> tuple[int, int, dict[str, Any]]:
    """(mismatching weights, weights compared, config) of one random case through the bare kernel."""
    rng = np.random.default_rng(seed)
    shapes = _shapes(rng)
    cfg = dict(lr=float(10 ** rng.uniform(-4, -1)), betas=(float(rng.choice([0.9, 0.3, 0.5, 0.0])),
                                                         float(rng.choice([0.999, 0.95, 0.5]))),
               eps=float(rng.choice([1e-8, 1e-3])), weight_decay=float(rng.choice([0.0, 0.01, 0.1])),
               amsgrad=bool(rng.integers(2)), maximize=bool(rng.integers(2)))
    scaled = bool(rng.integers(2))
    p0 = [rng.standard_normal(s).astype(F) for s in shapes]
    tp = [torch.tensor(x.copy(), requires_grad=True) for x in p0]
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)(tp, fused=True, **cfg)
    mp = [x.copy() for x in p0]
    m, v, vm = ([np.zeros_like(x) for x in p0] for _ in range(3))
    st = [np.zeros(1, F) for _ in p0]
    bad = tot = 0
    for _ in range(steps):
        gs = _grads(rng, shapes)
        scale = F(2.0 ** int(rng.integers(0, 16)))
        inf = scaled and rng.random() < 0.15
        if scaled:
            gs = [g * scale for g in gs]
        for p, g in zip(tp, gs):
            p.grad = torch.tensor(g.copy())
        if scaled:  # what torch.amp.GradScaler.step hands a fused optimizer
            opt.grad_scale, opt.found_inf = torch.tensor(float(scale)), torch.tensor(1.0 if inf else 0.0)
        opt.step()
        for s in st:
            s += 1
        fused_adamw_step(mp, [g.copy() for g in gs], m, v, vm if cfg["amsgrad"] else [], st, lr=cfg["lr"],
                         beta1=cfg["betas"][0], beta2=cfg["betas"][1], weight_decay=cfg["weight_decay"],
                         eps=cfg["eps"], amsgrad=cfg["amsgrad"], maximize=cfg["maximize"],
                         grad_scale=np.float32([scale]) if scaled else None,
                         found_inf=np.float32([1.0 if inf else 0.0]) if scaled else None, decoupled=decoupled)
        if scaled and inf:
            for s in st:
                s -= 1
        b, t = _diff(tp, mp)
        bad, tot = bad + b, tot + t
    return bad, tot, cfg


def sgd_case(seed: int, steps: int = 12) -> tuple[int, int, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    shapes = _shapes(rng)
    mom, damp = float(rng.choice([0.0, 0.9, 0.5])), float(rng.choice([0.0, 0.1]))
    cfg = dict(lr=float(10 ** rng.uniform(-4, -1)), momentum=mom, dampening=damp,
               nesterov=bool(rng.integers(2)) and mom > 0 and damp == 0,
               weight_decay=float(rng.choice([0.0, 0.01, 0.1])), maximize=bool(rng.integers(2)))
    scaled = bool(rng.integers(2))
    p0 = [rng.standard_normal(s).astype(F) for s in shapes]
    tp = [torch.tensor(x.copy(), requires_grad=True) for x in p0]
    opt = torch.optim.SGD(tp, fused=True, **cfg)
    mine = SGD(fused=True, **cfg)
    params = {f"p{i}": x.copy() for i, x in enumerate(p0)}
    bad = tot = 0
    for t in range(steps):
        gs = _grads(rng, shapes)
        scale = F(2.0 ** int(rng.integers(0, 16)))
        inf = scaled and t > 0 and rng.random() < 0.15  # (torch keeps an uninitialised buffer after a skipped first step)
        if scaled:
            gs = [g * scale for g in gs]
        for p, g in zip(tp, gs):
            p.grad = torch.tensor(g.copy())
        if scaled:
            opt.grad_scale, opt.found_inf = torch.tensor(float(scale)), torch.tensor(1.0 if inf else 0.0)
        opt.step()
        mine.step(params, {f"p{i}": g.copy() for i, g in enumerate(gs)},
                  grad_scale=np.float32([scale]) if scaled else None,
                  found_inf=np.float32([1.0 if inf else 0.0]) if scaled else None)
        b, n = _diff(tp, list(params.values()))
        bad, tot = bad + b, tot + n
    return bad, tot, cfg


BLOCKS = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow),
          pytest.param(3, marks=pytest.mark.slow)]


@pytest.mark.parametrize("block", BLOCKS)
def test_fused_adamw_kernel_is_bit_identical_to_torch(block: int) -> None:
    for seed in range(10 * block, 10 * block + (5 if block == 0 else 10)):
        bad, tot, cfg = adam_case(seed)
        assert bad == 0, f"seed {seed}: {bad} of {tot} weights differ from torch ({cfg})"


@pytest.mark.parametrize("block", BLOCKS[:2])
def test_fused_adam_l2_is_bit_identical_to_torch(block: int) -> None:
    for seed in range(100 + 8 * block, 100 + 8 * block + (3 if block == 0 else 8)):
        bad, tot, cfg = adam_case(seed, decoupled=False)
        assert bad == 0, f"seed {seed}: {bad} of {tot} weights differ from torch.optim.Adam ({cfg})"


@pytest.mark.parametrize("block", BLOCKS)
def test_fused_sgd_is_bit_identical_to_torch(block: int) -> None:
    for seed in range(10 * block, 10 * block + (5 if block == 0 else 10)):
        bad, tot, cfg = sgd_case(seed)
        assert bad == 0, f"seed {seed}: {bad} of {tot} weights differ from torch ({cfg})"


def test_adamw_class_with_torch_grad_scaler() -> None:
    """A real torch AMP loop (``torch.amp.GradScaler`` on CPU, an overflow injected) against
    ``fpsim.amp.AdamW(fused=True).step`` fed the same scaled gradients, scale and found_inf."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    lin = torch.nn.Linear(13, 5)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, weight_decay=0.05, amsgrad=True, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=2)
    names = ["weight", "bias"]
    params = {n: getattr(lin, n).detach().numpy().copy() for n in names}
    mine = AdamW(lr=1e-2, weight_decay=0.05, amsgrad=True, fused=True)
    skipped = 0
    for step in range(10):
        x = torch.tensor(rng.standard_normal((4, 13)).astype(F))
        if step == 4:
            x[0, 0] = float("inf")
        opt.zero_grad()
        scale = np.float32([scaler.get_scale()])
        scaler.scale(lin(x).pow(2).mean()).backward()
        grads = {n: getattr(lin, n).grad.detach().numpy().copy() for n in names}
        found = np.float32([0.0 if all(np.isfinite(g).all() for g in grads.values()) else 1.0])
        skipped += int(found[0])
        scaler.step(opt)
        scaler.update()
        copy = mine.step(params, grads, grad_scale=scale, found_inf=found, copy_format="bf16")
        for n in names:
            want = getattr(lin, n).detach().numpy()
            assert np.array_equal(params[n].view(np.uint32), want.view(np.uint32)), (step, n)
            assert copy is not None  # the BF16 copy, rounded once from the new master (oracle: ml_dtypes' cast)
            assert np.array_equal(copy[n], want.astype(ml_dtypes.bfloat16).astype(F))
    assert skipped == 1 and mine.t == 9


@pytest.mark.slow
def test_avx2_kernel_too() -> None:
    """The same agreement with torch's AVX2 kernel (8 wide; ATEN_CPU_CAPABILITY=avx2), in a subprocess."""
    code = ("import sys; sys.path.insert(0, %r); import torch, test_fused_optim as t; "
            "assert torch.backends.cpu.get_cpu_capability() == 'AVX2', torch.backends.cpu.get_cpu_capability(); "
            "r = [t.adam_case(s)[0] for s in range(8)] + [t.sgd_case(s)[0] for s in range(8)]; "
            "assert sum(r) == 0, r" % os.path.dirname(__file__))
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_scalar_tail_is_modelled() -> None:
    """The last n % 8 elements round differently from the vector body: replaying the body's formula for
    them as well disagrees with torch (so the tests above would catch a wrong split)."""
    rng = np.random.default_rng(3)
    worse = 0
    for _ in range(30):
        n = 7
        p0, g = rng.standard_normal(n).astype(F), rng.standard_normal(n).astype(F)
        v0 = (rng.random(n) * 4).astype(F)
        tp = torch.tensor(p0.copy(), requires_grad=True)
        opt = torch.optim.AdamW([tp], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
        opt.state[tp] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(n), "exp_avg_sq": torch.tensor(v0.copy())}
        tp.grad = torch.tensor(g.copy())
        opt.step()
        body = np.asarray(v0 * F(0.95)) + (F(1 - 0.95) * g) * g  # a plain two-rounding formula
        worse += int(np.count_nonzero(body != opt.state[tp]["exp_avg_sq"].numpy()))
        m, v, p = np.zeros(n, F), v0.copy(), p0.copy()
        fused_adamw_step([p], [g.copy()], [m], [v], [], [np.float32([2.0])], lr=1e-3, beta1=0.9, beta2=0.95,
                         weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        assert np.array_equal(v, opt.state[tp]["exp_avg_sq"].numpy())
        assert np.array_equal(p, tp.detach().numpy())
    assert worse > 0


def test_fused_and_unfused_differ_by_rounding_points() -> None:
    """fpsim's unfused AdamW (its own rounding points: ``lr*wd*w`` added to the update instead of the
    float32 decay factor ``1 - lr*wd``) and the fused kernel agree closely, not bitwise."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(4096).astype(F)
    a, b = {"w": w0.copy()}, {"w": w0.copy()}
    fused, plain = AdamW(lr=1e-3, weight_decay=0.01, fused=True), AdamW(lr=1e-3, weight_decay=0.01)
    for _ in range(20):
        g = rng.standard_normal(4096).astype(F)
        fused.step(a, {"w": g.copy()})
        plain.step(b, {"w": g.copy()})
    differ = int(np.count_nonzero(a["w"] != b["w"]))
    gap = float(np.max(np.abs(a["w"] - b["w"])))
    assert differ > 1000 and gap < 1e-5  # 20 steps moved each weight by up to 2e-2


def test_fma32_is_rounded_once() -> None:
    """The float32 FMA behind the kernels against MPFR (ties and float32-subnormal results included)."""
    gmpy2 = pytest.importorskip("gmpy2")
    from fpsim.amp.fused import _fma32

    rng = np.random.default_rng(0)
    n = 3000
    a = rng.standard_normal(n).astype(F)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F)
    a[:1000] = b[:1000] = F(1 + 2 ** -12)               # a*b = 1 + 2**-11 + 2**-24: c nudges it off the tie
    c[:1000] = F(2 ** -24) * rng.integers(-3, 3, 1000).astype(F)
    a[1000:2000] = F(2 ** -70)
    b[1000:2000] = (rng.standard_normal(1000) * 2 ** -60).astype(F)
    c[1000:2000] = (rng.standard_normal(1000) * 2 ** -130).astype(F)
    got = _fma32(a, b, c)
    with gmpy2.context(gmpy2.ieee(32)):
        want = np.array([float(gmpy2.fma(gmpy2.mpfr(float(x)), gmpy2.mpfr(float(y)), gmpy2.mpfr(float(z))))
                         for x, y, z in zip(a, b, c)], F)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bad_input() -> None:
    p = [np.zeros(3, F)]
    kw: dict[str, Any] = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                              maximize=False)
    with pytest.raises(TypeError, match="float32"):
        fused_adamw_step([np.zeros(3)], [np.zeros(3)], [np.zeros(3)], [np.zeros(3)], [], [np.ones(1, F)], **kw)
    with pytest.raises(ValueError, match="grads has 2 arrays"):
        fused_adamw_step(p, p * 2, p, p, [], [np.ones(1, F)], **kw)
    with pytest.raises(ValueError, match="shape"):
        fused_adamw_step(p, [np.zeros(4, F)], p, p, [], [np.ones(1, F)], **kw)
    with pytest.raises(ValueError, match="beta1"):
        fused_adamw_step(p, p, p, p, [], [np.ones(1, F)], **{**kw, "beta1": 1.0})
    with pytest.raises(TypeError, match="grad_scale"):
        fused_sgd_step(p, p, [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False,
                       maximize=False, is_first_step=True, grad_scale=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="updates"):
        AdamW(fused=True).updates({"w": p[0]}, {"w": p[0]})
    with pytest.raises(ValueError, match="need fused=True"):
        SGD().step({"w": p[0]}, {"w": p[0]}, grad_scale=np.float32([2.0]))
    with pytest.raises(ValueError, match="nesterov"):
        SGD(momentum=0.0, nesterov=True)
    with pytest.raises(TypeError, match="fused"):
        AdamW(fused=1)  # type: ignore[arg-type]
