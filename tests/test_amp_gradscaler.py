"""fpsim.amp.GradScaler and clip_grad_norm_ against torch.amp.GradScaler("cpu") and
torch.nn.utils.clip_grad_norm_ (torch 2.13 CPU): the same scale trajectories, skip decisions, unscaled
bits, state dicts and errors; the same clipped bits for float32 gradients."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fpsim.amp import GradScaler, clip_grad_norm_
from fpsim.amp.clip import total_norm


class _Opt:
    """An fpsim-style optimizer: step(params, grads) counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def step(self, params: Any, grads: Any) -> str:
        self.calls += 1
        return "stepped"


def _stream(rng: np.random.Generator, n_iter: int, shapes: list[int]) -> list[list[np.ndarray]]:
    """Gradient streams with inf/NaN injected in about one iteration of five."""
    out = []
    for _ in range(n_iter):
        gs = [(rng.standard_normal(s) * 2.0 ** rng.integers(-10, 10)).astype(np.float32) for s in shapes]
        r = rng.random()
        if r < 0.1:
            gs[rng.integers(len(gs))][0] = np.inf
        elif r < 0.2:
            gs[rng.integers(len(gs))][-1] = np.nan
        elif r < 0.25:
            gs[0][0] = -np.inf
        out.append(gs)
    return out


@pytest.mark.parametrize("kw", [{}, {"init_scale": 1000.0, "growth_factor": 1.1, "backoff_factor": 0.3,
                                      "growth_interval": 3},
                                {"init_scale": 2.0 ** 120, "growth_interval": 1},   # growth overflows: refused
                                {"init_scale": 3.0, "growth_factor": 3.7, "backoff_factor": 0.77,
                                 "growth_interval": 2}])
def test_scale_trajectory_and_skips_match_torch(kw: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    shapes = [5, 17, 3]
    stream = _stream(rng, 120, shapes)
    ts = torch.amp.GradScaler("cpu", **kw)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    topt = torch.optim.SGD(params, lr=0.0)
    t_steps = []
    orig = topt.step

    def counting_step(*a: Any, **k: Any) -> Any:
        t_steps.append(len(t_scales))
        return orig(*a, **k)

    topt.step = counting_step  # type: ignore[method-assign]
    fs, fopt = GradScaler("cpu", **kw), _Opt()
    t_scales: list[float] = []
    f_scales: list[float] = []
    f_steps = []
    unscaled_same = 0
    for gs in stream:
        ts.scale(torch.ones(()))
        fs.scale(np.float32(1.0))
        for p, g in zip(params, gs):
            p.grad = torch.from_numpy(g.copy())
        fg = {f"g{i}": g.copy() for i, g in enumerate(gs)}
        ts.unscale_(topt)
        fs.unscale_(fopt, fg)
        unscaled_same += all(np.array_equal(p.grad.numpy().view(np.uint32), fg[f"g{i}"].view(np.uint32))
                             for i, p in enumerate(params))
        before = fopt.calls
        ts.step(topt)
        fs.step(fopt, None, fg)
        if fopt.calls > before:
            f_steps.append(len(f_scales))
        ts.update()
        fs.update()
        t_scales.append(ts.get_scale())
        f_scales.append(fs.get_scale())
        assert fs.state_dict() == ts.state_dict()
    assert f_scales == t_scales
    assert f_steps == t_steps and 0 < len(f_steps) < len(stream)
    assert unscaled_same == len(stream)          # NaN bit patterns included


def test_step_without_unscale_and_update_new_scale_match_torch() -> None:
    torch = pytest.importorskip("torch")
    ts, fs = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=2), GradScaler("cpu", init_scale=512.0,
                                                                                          growth_interval=2)
    p = torch.nn.Parameter(torch.zeros(4))
    topt, fopt = torch.optim.SGD([p], lr=0.0), _Opt()
    for it, new in enumerate([None, 300.0, None, None, 1e-3, None]):
        g = np.float32([1.0, -2.0, 3.0, 2.0 ** -140])
        p.grad = torch.from_numpy(g.copy())
        fg = {"p": g.copy()}
        ts.scale(torch.ones(()))
        fs.scale(1.0)
        ts.step(topt)                             # unscale_ inside step
        fs.step(fopt, None, fg)
        assert np.array_equal(p.grad.numpy(), fg["p"])
        ts.update(new)
        fs.update(new)
        assert fs.state_dict() == ts.state_dict(), it


def test_scale_values_match_torch() -> None:
    torch = pytest.importorskip("torch")
    ts, fs = torch.amp.GradScaler("cpu", init_scale=3.0e4), GradScaler("cpu", init_scale=3.0e4)
    x = np.float32([1.5, 2.0 ** -20, 65504.0, -0.0, 3e38])
    assert np.array_equal(ts.scale(torch.from_numpy(x)).numpy(), fs.scale(x))
    lt = ts.scale([torch.from_numpy(x), (torch.from_numpy(x[:2]),)])
    lf = fs.scale([x, (x[:2],)])
    assert isinstance(lf, list) and isinstance(lf[1], tuple)
    assert np.array_equal(lt[0].numpy(), lf[0]) and np.array_equal(lt[1][0].numpy(), lf[1][0])


def test_state_dict_round_trip_and_torch_keys() -> None:
    torch = pytest.importorskip("torch")
    fs = GradScaler(init_scale=8.0, growth_interval=3)
    fs.scale(1.0)
    fs.unscale_(_Opt(), {"g": np.float32([1.0])})
    fs.update()
    sd = fs.state_dict()
    ts = torch.amp.GradScaler("cpu")
    ts.load_state_dict(sd)                        # torch reads fpsim's dict
    assert ts.state_dict() == sd
    fresh = GradScaler()
    fresh.load_state_dict(ts.state_dict())        # and fpsim reads torch's
    assert fresh.state_dict() == sd and fresh.get_scale() == 8.0
    assert GradScaler(enabled=False).state_dict() == {} == torch.amp.GradScaler("cpu", enabled=False).state_dict()
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        GradScaler().load_state_dict({})
    GradScaler(enabled=False).load_state_dict({})  # a no-op, as torch


def _torch_error(torch: Any, calls: list[str]) -> tuple[type[BaseException], str] | None:
    ts = torch.amp.GradScaler("cpu")
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    opt = torch.optim.SGD([p], lr=0.0)
    try:
        for c in calls:
            {"scale": lambda: ts.scale(torch.ones(())), "unscale": lambda: ts.unscale_(opt),
             "step": lambda: ts.step(opt), "update": lambda: ts.update(),
             "closure": lambda: ts.step(opt, closure=lambda: 0)}[c]()
    except (RuntimeError, AssertionError) as e:
        return type(e), str(e)
    return None


def _fpsim_error(calls: list[str]) -> tuple[type[BaseException], str] | None:
    fs, opt = GradScaler("cpu"), _Opt()
    g = {"p": np.float32([1.0])}
    try:
        for c in calls:
            {"scale": lambda: fs.scale(1.0), "unscale": lambda: fs.unscale_(opt, g),
             "step": lambda: fs.step(opt, None, g), "update": lambda: fs.update(),
             "closure": lambda: fs.step(opt, None, g, closure=lambda: 0)}[c]()
    except (RuntimeError, AssertionError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("calls", [
    ["scale", "unscale", "unscale"], ["scale", "step", "unscale"], ["scale", "step", "step"],
    ["scale", "update"], ["unscale"], ["step"], ["update"], ["scale", "closure"],
    ["scale", "unscale", "step", "update", "unscale", "step", "update"],   # fine: no error
], ids=lambda c: "-".join(c))
def test_errors_as_torch(calls: list[str]) -> None:
    torch = pytest.importorskip("torch")
    assert _fpsim_error(calls) == _torch_error(torch, calls)


def test_disabled_is_a_pass_through() -> None:
    fs, opt = GradScaler(enabled=False), _Opt()
    x = np.float32([3.0])
    assert fs.scale(x) is x and fs.get_scale() == 1.0 and not fs.is_enabled()
    g = {"p": np.float32([np.inf])}
    fs.unscale_(opt, g)
    assert g["p"][0] == np.inf
    assert fs.step(opt, None, g) == "stepped" and opt.calls == 1   # no inf check when disabled
    fs.update()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="device"):
        GradScaler("tpu")
    with pytest.raises(TypeError, match="enabled"):
        GradScaler(enabled=1)  # type: ignore[arg-type]
    fs = GradScaler()
    fs.scale(1.0)
    with pytest.raises(TypeError, match="float32"):
        fs.unscale_(_Opt(), {"p": np.float64([1.0])})
    with pytest.raises(TypeError, match="mapping"):
        fs.unscale_(_Opt(), [np.float32([1.0])])
    ro = np.float32([1.0])
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fs.unscale_(_Opt(), {"p": ro})
    with pytest.raises(AssertionError, match="new_scale"):
        fs.update(np.float64([2.0]))


def test_fused_optimizer_gets_grad_scale_and_found_inf() -> None:
    seen: dict[str, Any] = {}

    class Fused:
        fused = True

        def step(self, params: Any, grads: Any, **kw: Any) -> None:
            seen.update(kw)

    fs = GradScaler(init_scale=64.0)
    fs.scale(1.0)
    g = {"p": np.float32([64.0, np.inf])}
    fs.step(Fused(), None, g)
    assert seen["grad_scale"].tolist() == [64.0] and seen["found_inf"].tolist() == [1.0]
    assert g["p"][0] == 64.0                      # not unscaled by the scaler: the kernel does it
    fs.update()
    assert fs.get_scale() == 32.0
    fs.scale(1.0)
    g = {"p": np.float32([64.0])}
    fs.unscale_(Fused(), g)
    fs.step(Fused(), None, g)                     # a new Fused(): a fresh optimizer, stage READY
    assert seen["found_inf"].tolist() == [0.0]


# ----------------------------------------------------------------------------------------- clip_grad_norm_

def _torch_clip(torch: Any, gs: list[np.ndarray], max_norm: float, p: float, foreach: bool | None) -> Any:
    ps = [torch.nn.Parameter(torch.zeros(g.shape)) for g in gs]
    for q, g in zip(ps, gs):
        q.grad = torch.from_numpy(g.copy())
    n = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=p, foreach=foreach)
    return n.numpy(), [q.grad.numpy() for q in ps]


@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("foreach", [None, True, False])
def test_clip_grad_norm_bit_identical_to_torch(p: float, foreach: bool | None) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(int(p) if math.isfinite(p) else 99)
    cases = same_norm = same_grads = 0
    for _ in range(60):
        k = int(rng.integers(1, 6))
        gs = [(rng.standard_normal(tuple(rng.integers(1, 40, size=rng.integers(1, 3)))) *
               2.0 ** rng.integers(-8, 8)).astype(np.float32) for _ in range(k)]
        max_norm = float(rng.choice([1e-3, 0.5, 1.0, 10.0, 1e6]))
        tn, tg = _torch_clip(torch, gs, max_norm, p, foreach)
        fg = [g.copy() for g in gs]
        fn = clip_grad_norm_(fg, max_norm, norm_type=p, foreach=foreach)
        cases += 1
        same_norm += np.float32(fn).view(np.uint32) == tn.view(np.uint32)
        same_grads += all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(fg, tg))
    assert (same_norm, same_grads) == (cases, cases)


def test_norm2_kernel_replay_on_long_vectors() -> None:
    """The 8-lane body, the sequential lane sum and the split tail, on every tail length."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    bad = total = 0
    for n in list(range(1, 70)) + [int(v) for v in rng.integers(70, 30000, size=60)]:
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
        bad += total_norm([x]) != torch.linalg.vector_norm(torch.linalg.vector_norm(torch.from_numpy(x))[None]).numpy()
        total += 1
    assert bad == 0, f"{bad} of {total}"


def test_clip_nonfinite_and_errors() -> None:
    torch = pytest.importorskip("torch")
    gs = [np.float32([1.0, np.inf]), np.float32([np.nan])]
    tn, tg = _torch_clip(torch, gs, 1.0, 2.0, None)
    fg = [g.copy() for g in gs]
    fn = clip_grad_norm_(fg, 1.0)
    assert np.isnan(fn) and np.isnan(tn)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(fg, tg))
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_([np.float32([np.inf])], 1.0, error_if_nonfinite=True)
    with pytest.raises(TypeError, match="float32"):
        clip_grad_norm_([np.float64([1.0])], 1.0)
    with pytest.raises(TypeError, match="max_norm"):
        clip_grad_norm_([np.float32([1.0])], "1")  # type: ignore[arg-type]
    assert float(clip_grad_norm_([], 1.0)) == 0.0
    d = {"a": np.float32([3.0]), "b": None, "c": np.float32([4.0])}
    assert float(clip_grad_norm_(d, 100.0, norm_type="inf")) == 4.0
