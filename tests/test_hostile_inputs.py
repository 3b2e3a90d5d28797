"""Hostile inputs to the recently added parts: each case gives the correct result or a clear
TypeError/ValueError naming the problem, never a wrong result or another library's internal error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpsim

# ------------------------------------------------------------------------------------ reveal_order


@pytest.mark.parametrize("fn", [lambda x: np.sum(np.abs(x)), lambda x: np.sum(x * x)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_reveal_order_transformed_terms_clear_error(fn, dtype):
    # fn(ones) == n passes the first check; the probe's +M and -M then overflow instead of cancelling
    with pytest.raises(ValueError, match="not a summation of its terms.*inf"):
        fpsim.testing.reveal_order(fn, 16, dtype)


def test_reveal_dot_order_transformed_terms_clear_error():
    with pytest.raises(ValueError, match="not a summation of its terms"):
        fpsim.testing.reveal_dot_order(lambda a, b: np.sum(np.abs(a * b)), 8)


def test_reveal_order_abs_n2():
    with pytest.raises(ValueError, match="not a summation of its terms"):
        fpsim.testing.reveal_order(lambda x: np.sum(np.abs(x)), 2)


def test_reveal_order_torch_results_read_exactly():
    torch = pytest.importorskip("torch")
    tree = fpsim.testing.reveal_order(lambda x: torch.tensor(x, requires_grad=True).sum(), 8, verify=8)
    assert tree.n == 8
    # a bfloat16 result is read (exactly), then found not to be a float32 summation
    with pytest.raises(ValueError, match="not a fixed summation tree"):
        fpsim.testing.reveal_order(lambda x: torch.from_numpy(x).sum().bfloat16(), 8)


def test_reveal_order_rng_checked():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        fpsim.testing.reveal_order(np.sum, 8, rng=3)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        fpsim.testing.reveal_dot_order(np.dot, 8, rng=3)


# ------------------------------------------------------------------------------------------- out=


def _out_ops():
    return {
        "round": lambda x, y, out: fpsim.round(x, "bf16", out=out),
        "add": lambda x, y, out: fpsim.add(x, y, "bf16", out=out),
        "sub": lambda x, y, out: fpsim.sub(x, y, "bf16", out=out),
        "mul": lambda x, y, out: fpsim.mul(x, y, "bf16", out=out),
        "div": lambda x, y, out: fpsim.div(x, y, "bf16", out=out),
        "sqrt": lambda x, y, out: fpsim.sqrt(np.abs(x), "bf16", out=out),
        "fma": lambda x, y, out: fpsim.fma(x, y, x, "bf16", out=out),
    }


@pytest.mark.parametrize("op", sorted(_out_ops()))
@pytest.mark.parametrize("mask", [[0, 1] * 4, False])
def test_out_masked_array_refused(op, mask):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    out = np.ma.masked_array(np.zeros(8, np.float32), mask=mask)
    with pytest.raises(TypeError, match="masked array"):
        _out_ops()[op](x, y, out)
    assert np.all(out.data == 0)


@pytest.mark.parametrize("op", sorted(_out_ops()))
def test_out_matrix_refused(op):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((1, 8)).astype(np.float32), rng.standard_normal((1, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        out = np.asmatrix(np.zeros((1, 8), np.float32))
    with pytest.raises(TypeError, match="numpy.matrix"):
        _out_ops()[op](x, y, out)


def test_round_exact_scalar_out_masked_refused():
    with pytest.raises(TypeError, match="masked array"):
        fpsim.round(2**60 + 1, "bf16", out=np.ma.masked_array(np.zeros(())))


@pytest.mark.parametrize("op", sorted(_out_ops()))
def test_out_hostile_but_valid(op):
    """Strided, reversed, byte-swapped-free subclass and aliasing outs give the plain result; bad ones
    are refused; the inputs are never modified."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    x0, y0 = x.copy(), y.copy()
    f = _out_ops()[op]
    want = f(x, y, None)

    class Sub(np.ndarray):
        pass

    for out in (np.zeros(16, np.float32)[::2], np.zeros(8, np.float32)[::-1], np.zeros(8, np.float32).view(Sub)):
        assert f(x, y, out) is out
        np.testing.assert_array_equal(np.asarray(out), want)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    for bad, exc in ((np.zeros(8, np.float64), ValueError), (np.zeros(4, np.float32), ValueError),
                     (np.zeros((), np.float32), ValueError), (ro, ValueError), ([0.0] * 8, TypeError)):
        with pytest.raises(exc, match="out"):
            f(x, y, bad)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    # out overlapping an input by one element: computed as if into a new array
    buf = np.concatenate([x, y])
    got = f(buf[0:8], buf[8:16], buf[1:9])
    np.testing.assert_array_equal(got, f(x, y, None))


# ------------------------------------------------------------------------------- interop converter


def _torch_kinds():
    torch = pytest.importorskip("torch")
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    with warnings.catch_warnings():  # prototype/beta/deprecation notices of torch itself
        warnings.simplefilter("ignore")
        cases = {
            "nested": (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
            "nested jagged": (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
                              "nested"),
            "sparse coo": (dense.to_sparse(), "layout"),
            "sparse csr": (dense.to_sparse_csr(), "layout"),
            "sparse csc": (dense.to_sparse_csc(), "layout"),
            "sparse bsr": (dense.to_sparse_bsr((1, 1)), "layout"),
            "qint8": (torch.quantize_per_tensor(dense, 0.5, 0, torch.qint8), "quantized"),
            "quint8": (torch.quantize_per_tensor(dense, 0.5, 0, torch.quint8), "quantized"),
            "complex32": (torch.ones(2, dtype=torch.complex32), "complex32"),
            "meta": (torch.empty(2, device="meta"), "device"),
        }
    return cases


@pytest.mark.parametrize("kind", ["nested", "nested jagged", "sparse coo", "sparse csr", "sparse csc", "sparse bsr",
                                  "qint8", "quint8", "complex32", "meta"])
def test_torch_unsupported_kinds_refused(kind):
    t, words = _torch_kinds()[kind]
    with pytest.raises(TypeError, match=words):
        fpsim.round(t, "bf16")
    with pytest.raises(TypeError, match=words):
        fpsim.add(t, 1.0, "bf16")


def test_torch_storageless_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="storage"):
        torch.vmap(lambda x: fpsim.round(x, "bf16"))(torch.ones(2, 3))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        ft = torch.ones(2)
    with pytest.raises(TypeError, match="FakeTensor"):
        fpsim.round(ft, "bf16")


def test_torch_views_and_grad_exact():
    torch = pytest.importorskip("torch")
    base = torch.arange(12.0).reshape(3, 4) / 8
    cases = [
        (torch.ones(3, requires_grad=True), np.ones(3)),
        (base.T, base.numpy().T),
        (base.flip(0), base.numpy()[::-1]),
        (base[1:, 2:], base.numpy()[1:, 2:]),
        (torch.tensor(1.5), np.float64(1.5)),
        (torch._neg_view(base), -base.numpy()),
        (torch.view_as_real(torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)).conj(), [[1, 2], [3, -1]]),
        (base.to(torch.bfloat16).T, base.numpy().T),
        (torch._neg_view(base.to(torch.bfloat16)), -base.numpy()),
        (base.to(torch.float8_e4m3fn).T, base.numpy().T),
        (torch.tensor(1.5, dtype=torch.bfloat16), np.float64(1.5)),
        (torch.ones(1).expand(4), np.ones(4)),
        (torch.tensor([1, 2], dtype=torch.uint16), [1.0, 2.0]),
    ]
    for t, want in cases:
        got = fpsim.round(t, "fp32")
        np.testing.assert_array_equal(np.asarray(got.detach() if hasattr(got, "detach") else got, np.float64),
                                      np.asarray(want, np.float64))
        assert not getattr(t, "requires_grad", False) or t.grad is None


@pytest.mark.parametrize("dt", ["float16", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"])
def test_jax_cpu_dtypes_exact(dt):
    jnp = pytest.importorskip("jax.numpy")
    if not hasattr(jnp, dt):
        pytest.skip(f"jax.numpy has no {dt}")
    vals = np.array([1.0, -2.0, 0.5, 0.0], np.float32)
    got = fpsim.round(jnp.asarray(vals).astype(getattr(jnp, dt)), "fp32")
    np.testing.assert_array_equal(np.asarray(got, np.float64), vals)


def test_dlpack_capsule_refused():
    with pytest.raises(TypeError, match="DLPack capsule"):
        fpsim.round(np.ones(2).__dlpack__(), "bf16")


@pytest.mark.parametrize("x", [
    np.ma.masked_array([1.0, 2.0], mask=[0, 1]), np.array([1.0, "a"], dtype=object),
    np.array([1.0, None], dtype=object), np.zeros(2, dtype=[("a", "f4"), ("b", "f4")]),
    np.array(["2020-01-01"], dtype="datetime64[D]"), np.array([1], dtype="timedelta64[s]"),
    np.array(["1.5"]), np.array([b"1.5"]), [1.0, None], np.array([True, False]), True, np.void(b"ab"),
    np.array([1 + 1j]), "1.5"])
def test_numpy_hostile_refused(x):
    with pytest.raises(TypeError):
        fpsim.round(x, "bf16")


# ------------------------------------------------------------------------------- fused optimizers

_ADAM_KW = dict(lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
_SGD_KW = dict(weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
               is_first_step=False)


def _adam_lists(n=2, k=1):
    f = np.float32
    return ([np.ones(n, f) for _ in range(k)], [np.full(n, 0.5, f) for _ in range(k)],
            [np.zeros(n, f) for _ in range(k)], [np.zeros(n, f) for _ in range(k)], [],
            [np.ones(1, f) for _ in range(k)])


def test_fused_adamw_max_exp_avg_sqs_without_amsgrad_names_the_option():
    p, g, m, v, _, st = _adam_lists()
    with pytest.raises(ValueError, match="max_exp_avg_sqs must be empty with amsgrad=False, got 1"):
        fpsim.amp.fused_adamw_step(p, g, m, v, [np.zeros(2, np.float32)], st, **_ADAM_KW)
    with pytest.raises(ValueError, match="max_exp_avg_sqs has 0 arrays, params has 1"):
        fpsim.amp.fused_adamw_step(p, g, m, v, [], st, **{**_ADAM_KW, "amsgrad": True})


def test_fused_sgd_buffers_without_momentum_names_the_option():
    f = np.float32
    with pytest.raises(ValueError, match="momentum_buffer_list must be empty with momentum=0"):
        fpsim.amp.fused_sgd_step([np.ones(2, f)], [np.ones(2, f)], [np.zeros(2, f)], **{**_SGD_KW, "momentum": 0.0})
    with pytest.raises(ValueError, match=r"dampening must be a finite number, got nan"):
        fpsim.amp.fused_sgd_step([np.ones(2, f)], [np.ones(2, f)], [np.zeros(2, f)],
                                 **{**_SGD_KW, "dampening": float("nan")})


@pytest.mark.parametrize("alias", ["p=g", "m=v", "p twice", "g overlaps p", "m=p second"])
def test_fused_adamw_aliasing_refused(alias):
    p, g, m, v, mx, st = _adam_lists(4, 2)
    if alias == "p=g":
        g[0] = p[0]
    elif alias == "m=v":
        v[1] = m[1]
    elif alias == "p twice":
        p[1] = p[0]
    elif alias == "g overlaps p":
        buf = np.ones(6, np.float32)
        p[0], g[0] = buf[:4], buf[2:]
    else:
        m[1] = p[0]
    before = [a.copy() for a in p + g + m + v]
    with pytest.raises(ValueError, match="share memory"):
        fpsim.amp.fused_adamw_step(p, g, m, v, mx, st, **_ADAM_KW, grad_scale=np.float32([2.0]))
    for a, b in zip(p + g + m + v, before):
        np.testing.assert_array_equal(a, b)  # nothing written (not even the unscaled gradients)


def test_fused_aliasing_check_allows_shared_step_counts_and_disjoint_views():
    p, g, m, v, mx, st = _adam_lists(4, 2)
    st[1] = st[0]   # only read: may be shared
    buf = np.ones(8, np.float32)
    p[0], p[1] = buf[:4], buf[4:]   # adjacent, disjoint
    fpsim.amp.fused_adamw_step(p, g, m, v, mx, st, **_ADAM_KW)
    p[0][0] = 1.0   # a valid step count, in a parameter's memory
    with pytest.raises(ValueError, match=r"state_steps\[0\] shares memory"):
        fpsim.amp.fused_adamw_step(p, g, m, v, mx, [p[0][:1], st[1]], **_ADAM_KW)


def test_fused_sgd_aliasing_refused():
    f = np.float32
    p = np.ones(2, f)
    with pytest.raises(ValueError, match="share memory"):
        fpsim.amp.fused_sgd_step([p], [p], [np.zeros(2, f)], **_SGD_KW)
    with pytest.raises(ValueError, match="share memory"):
        fpsim.amp.fused_sgd_step([p], [np.ones(2, f)], [p], **_SGD_KW)


@pytest.mark.parametrize("step", [0.0, -1.0, np.nan, np.inf])
def test_fused_adamw_bad_step_count(step):
    p, g, m, v, mx, _ = _adam_lists()
    with pytest.raises(ValueError, match=r"state_steps\[0\] must hold the step count"):
        fpsim.amp.fused_adamw_step(p, g, m, v, mx, [np.float32([step])], **_ADAM_KW)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cls", ["AdamW", "SGD"])
def test_optimizer_step_checks_lr_and_grads(cls, fused):
    opt = getattr(fpsim.amp, cls)
    f = np.float32
    for lr, exc in ((float("nan"), ValueError), (-1.0, ValueError), ("a", TypeError), (True, TypeError)):
        p = {"w": np.ones(2, f)}
        with pytest.raises(exc, match="lr"):
            opt(fused=fused).step(p, {"w": np.ones(2, f)}, lr=lr)
        np.testing.assert_array_equal(p["w"], 1.0)
    with pytest.raises(ValueError, match=r"grads\['w'\] has shape \(3,\)"):
        opt(fused=fused).step({"w": np.ones(2, f)}, {"w": np.ones(3, f)})
    with pytest.raises(TypeError, match=r"grads\['w'\] must be a float NumPy array, got list"):
        opt(fused=fused).step({"w": np.ones(2, f)}, {"w": [1.0, 1.0]})


# ------------------------------------------------------------------------------ NF4, MX, NVFP4: NaN/inf


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("n", [64 * 8, 64 * 8 + 40, 64 * 300])   # a partial last block; > 256 constants
def test_nf4_nonfinite_stays_in_its_block(bad, double_quant, n):
    from fpsim.quant import nf4_dequantize, nf4_quantize

    rng = np.random.default_rng(4)
    x = rng.standard_normal(n).astype(np.float32)
    clean_c, clean_a = nf4_quantize(x, 64, double_quant)
    want = nf4_dequantize(clean_c, clean_a, 64)
    for pos in (5, n - 1):
        y = x.copy()
        y[pos] = bad
        c, a = nf4_quantize(y, 64, double_quant)   # no RuntimeWarning (filterwarnings = error)
        d = nf4_dequantize(c, a, 64)
        blk = pos // 64
        other = np.ones(n, bool)
        other[blk * 64:(blk + 1) * 64] = False
        assert not np.isfinite(d[pos])
        assert np.isfinite(d[other]).all()
        if not double_quant:
            np.testing.assert_array_equal(d[other], want[other])   # blocks are independent
        # the block itself dequantizes as without double quantization
        c1, a1 = nf4_quantize(y, 64, False)
        np.testing.assert_array_equal(d[~other], nf4_dequantize(c1, a1, 64)[~other])


def test_nf4_double_quant_finite_input_unchanged_fields():
    from fpsim.quant import nf4_quantize

    x = np.random.default_rng(5).standard_normal(64 * 10).astype(np.float32)
    _, a = nf4_quantize(x, 64, True)
    assert a.nonfinite is None
    y = x.copy()
    y[70] = np.nan
    _, b = nf4_quantize(y, 64, True)
    assert b.nonfinite is not None and b.nonfinite[0].tolist() == [1]
    assert b.nbytes == a.nbytes + b.nonfinite[0].nbytes + b.nonfinite[1].nbytes


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_mx_nvfp4_nonfinite_local(bad):
    from fpsim import scaling

    x = np.random.default_rng(6).standard_normal(128).astype(np.float32)
    y = x.copy()
    y[5] = bad
    for elem in ("fp8_e4m3", "fp4_e2m1"):
        d = np.asarray(scaling.mx_dequantize(*scaling.mx_quantize(y, elem))).reshape(4, 32)
        assert np.isfinite(d[1:]).all()
        np.testing.assert_array_equal(d[1:], np.asarray(scaling.mx_dequantize(*scaling.mx_quantize(x, elem))
                                                        ).reshape(4, 32)[1:])
    d = np.asarray(scaling.nvfp4_dequantize(*scaling.nvfp4_quantize(y))).reshape(8, 16)
    assert np.isfinite(d[1:]).all()


# ------------------------------------------------------------------------------- LoRA, attention


def _lora_parts():
    from fpsim.nn.lora import lora_init

    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    A, B = lora_init(8, 3, 2, rng=np.random.default_rng(0))
    B = rng.standard_normal(B.shape).astype(np.float32)
    return rng.standard_normal((2, 8)).astype(np.float32), w, A, B


@pytest.mark.parametrize("case", ["w 1-D", "x 0-d", "x wrong Cin", "bias wrong", "w str", "A bool", "A rank != B rank"])
def test_lora_forward_bad_shapes_clear(case):
    from fpsim.nn.lora import lora_linear_forward

    x, w, A, B = _lora_parts()
    b = None
    exc: type[Exception] = ValueError
    if case == "w 1-D":
        w = w[:, 0]
    elif case == "x 0-d":
        x = np.float32(1.0)
    elif case == "x wrong Cin":
        x = x[:, :5]
    elif case == "bias wrong":
        b = np.ones(5, np.float32)
    elif case == "w str":
        w, exc = "w", TypeError
    elif case == "A bool":
        A, exc = A > 0, TypeError
    else:
        B = B[:, :1]
    with pytest.raises(exc, match=r"\b(w|x|b|A|LoRA shapes|base weight)\b"):
        lora_linear_forward(x, w, b, A, B, 2.0)


def test_lora_rank_zero_and_large_rank():
    from fpsim.nn.lora import lora_init, lora_linear_forward

    x, w, A, B = _lora_parts()
    out, _ = lora_linear_forward(x, w, None, A[:0], B[:, :0], 2.0)   # rank 0: the base layer exactly
    np.testing.assert_array_equal(out, lora_linear_forward(x, w, None, A, np.zeros_like(B), 2.0)[0])
    with pytest.raises(ValueError, match="r must be an int >= 1"):
        lora_init(8, 3, 0)
    A9, B9 = lora_init(8, 3, 9, rng=np.random.default_rng(0))       # r > both dims: allowed, as in peft
    assert A9.shape == (9, 8) and B9.shape == (3, 9)


@pytest.mark.parametrize("ab", ["not a pair", "three", "ranks differ", "A 1-D", "str"])
def test_lora_precision_adapters_checked(ab):
    from fpsim.nn import FULL
    from fpsim.nn.lora import LoRAPrecision

    _, _, A, B = _lora_parts()
    value = {"not a pair": A, "three": (A, B, B), "ranks differ": (A, B[:, :1]), "A 1-D": (A[0], B),
             "str": ("A", B)}[ab]
    with pytest.raises((TypeError, ValueError), match=r"adapters\['fc'\]"):
        LoRAPrecision(FULL, {"fc": value}, scale=1.0)


@pytest.mark.parametrize("which", ["w_qkv", "b_qkv", "w_proj", "b_proj"])
@pytest.mark.parametrize("flash", [False, True])
def test_attention_layer_weight_shapes_named(which, flash):
    from fpsim.nn import attention_forward
    from fpsim.nn.flash import flash_attention_forward

    rng = np.random.default_rng(8)
    C = 8
    args = {"w_qkv": rng.standard_normal((C, 3 * C)), "b_qkv": None, "w_proj": rng.standard_normal((C, C)),
            "b_proj": None}
    args[which] = np.ones((C, 3 * C - 4)) if which == "w_qkv" else np.ones(C + 1)
    f = flash_attention_forward if flash else attention_forward
    with pytest.raises(ValueError, match=which):
        f(rng.standard_normal((2, 3, C)), args["w_qkv"], args["b_qkv"], args["w_proj"], args["b_proj"], 2)


def test_flash_attention_degenerate_inputs():
    from fpsim.nn.flash import flash_attention, flash_attention_grads, reference_attention

    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
    for bad in ({"block_q": 0}, {"block_k": -1}, {"block_q": 2.0}):
        with pytest.raises((TypeError, ValueError), match="block_"):
            flash_attention(q, q, q, **bad)
    with pytest.raises(ValueError, match="one shape"):
        flash_attention(q, q[:, :, :4], q)
    # blocks that do not divide T, or exceed it: the same result as the reference (up to fp32 sums)
    ref = reference_attention(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64))
    for bq, bk in ((3, 5), (100, 100), (1, 7)):
        o, _ = flash_attention(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64), block_q=bq,
                               block_k=bk)
        np.testing.assert_allclose(o, ref[0] if isinstance(ref, tuple) else ref, rtol=1e-12, atol=1e-12)
    o, lse = flash_attention(q[:, :, :0], q[:, :, :0], q[:, :, :0])      # zero-length sequence
    assert o.shape == (1, 2, 0, 4) and lse.shape == (1, 2, 0)
    g = flash_attention_grads(q[:, :, :0], q[:, :, :0], q[:, :, :0], q[:, :, :0], o, lse)
    assert all(a.shape == (1, 2, 0, 4) for a in g)


# ------------------------------------------------------------------------------------- all_reduce


def test_all_reduce_masked_refused_and_ml_dtypes_accepted():
    import ml_dtypes

    from fpsim.train.parallel import all_reduce

    with pytest.raises(TypeError, match="masked array"):
        all_reduce([np.ma.masked_array([1.0, 2.0], mask=[0, 1])] * 2)
    bf = np.float32([1.5, -2.0]).astype(ml_dtypes.bfloat16)
    out = all_reduce([bf, bf, bf], wire="bf16")
    np.testing.assert_array_equal(out[0], [4.5, -6.0])
    np.testing.assert_array_equal(out[0], all_reduce([np.float64([1.5, -2.0])] * 3, wire="bf16")[0])
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    np.testing.assert_array_equal(all_reduce([t, t, t], wire="bf16")[0], [4.5, -6.0])


@pytest.mark.parametrize("alg", ["ring", "tree", "halving-doubling", "direct", "gloo"])
def test_all_reduce_edge_cases(alg):
    from fpsim.train.parallel import all_reduce

    f = np.float32
    assert [a.shape for a in all_reduce([np.zeros(0, f)] * 3, algorithm=alg)] == [(0,)] * 3
    one = all_reduce([f([1.5, 2.25])], algorithm=alg, op="avg")
    np.testing.assert_array_equal(one[0], [1.5, 2.25])
    np.testing.assert_array_equal(all_reduce([f(1.5), f(2.0)], algorithm=alg)[1], 3.5)
    np.testing.assert_array_equal(all_reduce([np.arange(3), np.arange(3)], algorithm=alg)[0], [0, 2, 4])
    with pytest.raises(ValueError, match="same shape"):
        all_reduce([np.zeros(3, f), np.zeros(4, f)], algorithm=alg)
    for bad in (np.array([True]), np.array([1j]), np.array([1.0], dtype=object)):
        with pytest.raises(TypeError, match="real numbers"):
            all_reduce([bad, bad], algorithm=alg)
    with pytest.raises(ValueError, match="at least one"):
        all_reduce([], algorithm=alg)


# ------------------------------------------------------- masked arrays and bf16 at the other entry points


def _entry_points():
    from fpsim.nn.flash import flash_attention, fp8_attention, reference_attention
    from fpsim.nn.lora import lora_init, lora_linear_forward
    from fpsim.quant import nf4_quantize
    from fpsim.quant_nf4 import torch_float32_sum

    rng = np.random.default_rng(10)
    q = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    A, B = lora_init(8, 3, 2, rng=rng)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    return {
        "flash_attention": (lambda a: flash_attention(a, q, q)[0], q),
        "reference_attention": (lambda a: reference_attention(a, q, q), q),
        "fp8_attention": (lambda a: fp8_attention(a, q, q), q),
        "nf4_quantize": (lambda a: nf4_quantize(a, 64)[0], q.reshape(-1)),
        "torch_float32_sum": (lambda a: torch_float32_sum(a), q.reshape(-1)),
        "lora_linear_forward": (lambda a: lora_linear_forward(a, w, None, A, B, 2.0)[0], x),
    }


@pytest.mark.parametrize("name", ["flash_attention", "reference_attention", "fp8_attention", "nf4_quantize",
                                  "torch_float32_sum", "lora_linear_forward"])
def test_masked_input_refused(name):
    f, a = _entry_points()[name]
    with pytest.raises(TypeError, match="masked"):
        f(np.ma.masked_array(a, mask=a > 1))


@pytest.mark.parametrize("name", ["flash_attention", "nf4_quantize", "lora_linear_forward"])
def test_bf16_input_read_exactly(name):
    import ml_dtypes

    torch = pytest.importorskip("torch")
    f, a = _entry_points()[name]
    a16 = a.astype(ml_dtypes.bfloat16)
    want = f(a16.astype(np.float32))
    np.testing.assert_array_equal(f(a16), want)
    np.testing.assert_array_equal(f(torch.from_numpy(a16.astype(np.float32)).bfloat16()), want)


def test_nf4_float64_beyond_float32_and_all_nan():
    from fpsim.quant import nf4_dequantize, nf4_quantize

    x = np.ones(128)
    x[3] = 1e300                                   # float32 +inf after the cast, no RuntimeWarning
    c, a = nf4_quantize(x, 64, True)
    d = nf4_dequantize(c, a, 64)
    assert np.isfinite(d[64:]).all() and not np.isfinite(d[3])
    c, a = nf4_quantize(np.full(128, np.nan, np.float32), 64, True)
    assert np.isnan(nf4_dequantize(c, a, 64)).all()


@pytest.mark.parametrize("cls", ["AdamW", "SGD"])
def test_optimizer_load_state_dict_checked(cls):
    opt = getattr(fpsim.amp, cls)()
    key = "m.w" if cls == "AdamW" else "buf.w"
    for d, exc, words in (({key: np.zeros(2)}, ValueError, "no step count"), ({"t": 2.5}, ValueError, "whole"),
                          ({"t": -1}, ValueError, "whole"), ([("t", 1)], TypeError, "mapping"),
                          ({"t": 1, key: np.array(["a"])}, TypeError, "real array")):
        with pytest.raises(exc, match=words):
            opt.load_state_dict(d)
    opt.load_state_dict({"t": np.int64(3), key: np.ones(2)})
    assert opt.t == 3 and opt.state_dict()["t"] == 3


def test_ddp_all_reduce_per_parameter_checks():
    from fpsim.train.parallel import ddp_all_reduce

    f = np.float32
    with pytest.raises(ValueError, match=r"per_rank_grads\[\.\.\.\]\['w'\].*same shape.*\(2, 3\), \(3, 2\)"):
        ddp_all_reduce([{"w": np.ones((2, 3), f)}, {"w": np.ones((3, 2), f)}])   # same size, transposed
    with pytest.raises(TypeError, match=r"per_rank_grads\[1\]\['w'\] is a masked array"):
        ddp_all_reduce([{"w": np.ones(2, f)}, {"w": np.ma.masked_array([1.0, 2.0], mask=[0, 1])}])
    with pytest.raises(TypeError, match=r"per_rank_grads\[0\]\['w'\] must hold real numbers, got dtype bool"):
        ddp_all_reduce([{"w": np.ones(2, bool)}] * 2)
    out = ddp_all_reduce([{"w": np.array([1e300])}] * 2)                  # float32 +inf, no RuntimeWarning
    assert np.isinf(out["w"]).all()
    np.testing.assert_array_equal(ddp_all_reduce([{"w": f([1.5, 2.0])}] * 4)["w"], [1.5, 2.0])


def test_lora_and_flash_backward_checks():
    from fpsim.nn.flash import flash_attention_backward, flash_attention_forward
    from fpsim.nn.lora import lora_linear_backward, lora_linear_forward

    x, w, A, B = _lora_parts()
    out, cache = lora_linear_forward(x, w, None, A, B, 2.0)
    for bad in (np.ones((2, 5), np.float32), np.ones((3, 3), np.float32), np.ones(3, np.float32)):
        with pytest.raises(ValueError, match=r"dout must have the forward output's shape \(2, 3\)"):
            lora_linear_backward(bad, cache)
    with pytest.raises(TypeError, match="cache"):
        lora_linear_backward(np.ones((2, 3), np.float32), None)
    dx, dA, dB = lora_linear_backward(np.ones((2, 3), np.float32), cache)
    assert dx.shape == x.shape and dA.shape == A.shape and dB.shape == B.shape
    rng = np.random.default_rng(11)
    _, fcache = flash_attention_forward(rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 24)), None,
                                        rng.standard_normal((8, 8)), None, 2)
    with pytest.raises(TypeError, match="cache"):
        flash_attention_backward(np.ones((2, 3, 8)), {})


def test_torch_dtype_without_numpy_equivalent_named():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="torch dtype torch.bits8 has no NumPy equivalent"):
        fpsim.round(torch.zeros(2, dtype=torch.uint8).view(torch.bits8), "bf16")
