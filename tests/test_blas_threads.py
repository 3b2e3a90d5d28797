"""Training gives the same bits whatever the BLAS thread count (fpsim/_blas.py).

OpenBLAS splits a large GEMM between its threads in a way that changes the summation order, so the same float32
product differs in the last bits at 1 and 2 threads; before the fix, 20 steps of ``Trainer("fp32",
TrainConfig())`` ended with different weights under ``OPENBLAS_NUM_THREADS=1`` and ``=2``, and a checkpoint saved
at 2 threads and resumed at 1 differed from the uninterrupted run. The environment variables act only before
NumPy loads, hence the subprocesses; threadpoolctl and :func:`fpsim._blas.set_threads` change the count in the
running process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fpsim import _blas
from fpsim.train import TrainConfig, Trainer
from fpsim.mma.gemm import _cgemm as G_C
from fpsim.train._threads import blas_threads, limit_blas_threads

from _loops import compiled_loops

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("fp32", "bf16-mixed", "fp16-mixed")

needs_blas = pytest.mark.skipif(_blas.get_threads() is None,
                                reason="no controllable BLAS library (OpenBLAS, MKL, BLIS) in this process")


def _config(steps: int = 3) -> TrainConfig:
    # Width 64, batch 32: the GEMMs have 32 * 10 rows, where OpenBLAS's threaded split changes the bits.
    return TrainConfig(steps=steps, eval_every=0, telemetry_every=0)


def _digest(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(np.ascontiguousarray(weights[k]).tobytes())
    return h.hexdigest()


@pytest.fixture
def restore_threads():
    """The process's BLAS thread count, put back after the test."""
    old = _blas.get_threads()
    yield old
    if old is not None:
        _blas.set_threads(old)


# ----------------------------------------------------------------------------- subprocesses: env variables

_CHILD = r"""
import hashlib, json, sys
import numpy as np
from fpsim.train import TrainConfig, Trainer, load_checkpoint

def digest(w):
    h = hashlib.sha256()
    for k in sorted(w):
        h.update(k.encode()); h.update(np.ascontiguousarray(w[k]).tobytes())
    return h.hexdigest()

mode, ckdir, steps, half = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = TrainConfig(steps=steps, eval_every=0, telemetry_every=0)
out = {}
for pol in ("fp32", "bf16-mixed", "fp16-mixed"):
    path = f"{ckdir}/{pol}.npz"
    if mode == "save":          # the first half, saved
        tr = Trainer(pol, cfg); tr.run(half, checkpoint=path, progress=False)
    else:                       # resumed from the other process's checkpoint
        tr = load_checkpoint(path); tr.run(progress=False)
        out[pol + ".resumed"] = digest(tr.store.weights)
    tr = Trainer(pol, cfg); tr.run(progress=False)
    out[pol] = digest(tr.store.weights)
from fpsim.train.demo import demo_settings
tr = Trainer("bf16-mixed", demo_settings(quick=True, steps=steps).train_config()); tr.run(progress=False)
out["demo"] = digest(tr.store.weights)
print(json.dumps(out))
"""


def _child(threads: int, mode: str, ckdir: Path, steps: int, half: int) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, str(ckdir), str(steps), str(half)], env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    out: dict[str, str] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_thread_count_from_the_environment_changes_no_bit(tmp_path: Path) -> None:
    # Two threads first: it writes the checkpoints of the first half, which the one-thread process resumes.
    two = _child(2, "save", tmp_path, 4, 2)
    one = _child(1, "resume", tmp_path, 4, 2)
    assert one["demo"] == two["demo"], "the quick demo's bf16-mixed weights differ between 1 and 2 BLAS threads"
    for pol in POLICIES:
        assert one[pol] == two[pol], f"{pol}: weights differ between 1 and 2 BLAS threads"
        assert one[pol + ".resumed"] == one[pol], f"{pol}: saved at 2 threads, resumed at 1 != uninterrupted"


_KERNEL_CHILD = r"""
import hashlib, json, sys
import numpy as np
import fpsim.mma.gemm as G
from fpsim.train import TrainConfig, Trainer
from fpsim.train.bitexact import bit_exact_policy

if sys.argv[1] != "auto":
    G._cgemm.impl(sys.argv[1])
cfg = TrainConfig(steps=6, eval_every=0, telemetry_every=0)
out = {}
for pol in ("fp32", "bf16-mixed", "fp16-mixed"):
    tr = Trainer(pol if pol == "fp32" else bit_exact_policy(pol, "h100"), cfg)
    tr.run(progress=False)
    h = hashlib.sha256()
    for k in sorted(tr.store.weights):
        h.update(k.encode()); h.update(np.ascontiguousarray(tr.store.weights[k]).tobytes())
    out[pol] = h.hexdigest()
print(json.dumps(out))
"""


def _narrow_cpu_env() -> dict[str, str]:
    """The environment of an AVX2 machine on this one, where it has wider kernels: OpenBLAS's Haswell kernels
    (OPENBLAS_CORETYPE, read by its DYNAMIC_ARCH builds such as NumPy's wheels) and NumPy's loops without its
    AVX-512 targets (NPY_DISABLE_CPU_FEATURES, only the features this NumPy reports available)."""
    env = {"OPENBLAS_CORETYPE": "Haswell"}
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats  # NumPy 2
    except ImportError:  # pragma: no cover - NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as feats
    wide = [f for f, on in feats.items() if on and f.startswith("AVX512")]
    if wide:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(wide)
    return env


@pytest.mark.slow
@pytest.mark.skipif(G_C is None, reason="fpsim._cgemm (the compiled GEMM) is not built")
def test_bit_exact_policies_give_the_same_bits_on_any_cpu_kernels() -> None:
    """gemm='h100' trains to the same weights with the widest kernels this machine has and with an AVX2
    machine's (OpenBLAS's Haswell kernels, NumPy without AVX-512, fpsim's AVX2 GEMM loop): the GEMMs are
    fpsim's own, whose bits do not depend on the vector width. The fp32 fast path goes through the CPU's
    BLAS kernel, whose summation order may differ between the two (it does on a Zen 4: OpenBLAS's SkylakeX
    sgemm against its Haswell one), so its weights are not compared."""
    base = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    runs = {}
    for name, extra, loop in (("widest", {}, "auto"), ("avx2-like", _narrow_cpu_env(), "avx2")):
        if loop == "avx2" and "avx2" not in compiled_loops(G_C.impl):
            loop = "auto"
        r = subprocess.run([sys.executable, "-c", _KERNEL_CHILD, loop], env={**base, **extra},
                           capture_output=True, text=True, timeout=600, check=False)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout.strip().splitlines()[-1])
    for pol in ("bf16-mixed", "fp16-mixed"):
        assert runs["widest"][pol] == runs["avx2-like"][pol], f"{pol}@h100: weights differ between CPU kernels"


# ----------------------------------------------------------------------------- in process

@needs_blas
@pytest.mark.parametrize("policy", POLICIES)
def test_thread_count_set_in_process_changes_no_bit(policy: str, restore_threads: Any) -> None:
    got = []
    for n in (1, 2):
        limit_blas_threads(n)
        tr = Trainer(policy, _config())
        tr.run(progress=False)
        got.append(_digest(tr.store.weights))
        assert _blas.get_threads() == n  # the run gave the count back
    assert got[0] == got[1]


@needs_blas
def test_threadpoolctl_limits_change_no_bit() -> None:
    tpc = pytest.importorskip("threadpoolctl")
    got = []
    for n in (1, 2):
        with tpc.threadpool_limits(n, user_api="blas"):
            tr = Trainer("bf16-mixed", _config())
            tr.run(progress=False)
            got.append(_digest(tr.store.weights))
    assert got[0] == got[1]


@needs_blas
def test_checkpoint_saved_at_two_threads_resumes_at_one(tmp_path: Path, restore_threads: Any) -> None:
    from fpsim.train import load_checkpoint

    path = str(tmp_path / "ck.npz")
    limit_blas_threads(2)
    Trainer("fp16-mixed", _config(4)).run(2, checkpoint=path, progress=False)
    limit_blas_threads(1)
    resumed = load_checkpoint(path)
    resumed.run(progress=False)
    whole = Trainer("fp16-mixed", _config(4))
    whole.run(progress=False)
    assert _digest(resumed.store.weights) == _digest(whole.store.weights)


@needs_blas
def test_this_blas_differs_between_thread_counts(restore_threads: Any) -> None:
    """The guard above is exercised here: raw ``@`` gives other bits at 2 threads (else nothing to fix)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((320, 64)).astype(np.float32)
    b = rng.standard_normal((64, 256)).astype(np.float32)
    limit_blas_threads(1)
    one = a @ b
    limit_blas_threads(2)
    two = a @ b
    if np.array_equal(one, two):
        pytest.skip("this BLAS gives the same bits at 1 and 2 threads for this shape")
    assert np.array_equal(_blas.matmul(a, b), one)  # pinned: the one-thread bits, at 2 threads


@needs_blas
@pytest.mark.parametrize("where", ["layers", "lora", "flash", "data_parallel"])
def test_other_gemm_paths_change_no_bit(where: str, restore_threads: Any) -> None:
    rng = np.random.default_rng(1)

    def run() -> list[np.ndarray]:
        if where == "layers":   # FULL precision: plain NumPy in the inputs' dtype
            from fpsim.nn import FULL, linear_backward, linear_forward

            x = rng.standard_normal((320, 64)).astype(np.float32)
            w = rng.standard_normal((64, 96)).astype(np.float32)
            out, cache = linear_forward(x, w, None, prec=FULL)
            return [out, *[g for g in linear_backward(out, cache) if g is not None]]
        if where == "lora":
            from fpsim.amp import get_policy
            from fpsim.nn.lora import lora_linear_backward, lora_linear_forward

            x = rng.standard_normal((320, 64)).astype(np.float32)
            w = rng.standard_normal((64, 96)).astype(np.float32)
            a = rng.standard_normal((8, 64)).astype(np.float32)
            b = rng.standard_normal((96, 8)).astype(np.float32)
            rt = get_policy("bf16-mixed").runtime(seed=0)
            out, cache = lora_linear_forward(x, w, None, a, b, 2.0, prec=rt)
            return [out, *[g for g in lora_linear_backward(out, cache) if g is not None]]
        if where == "flash":
            from fpsim.nn import KernelPrecision, flash_attention

            q, k, v = (rng.standard_normal((2, 2, 256, 64)).astype(np.float32) for _ in range(3))
            o, lse = flash_attention(q, k, v, prec=KernelPrecision("bf16"), block_q=256, block_k=256)
            return [o, lse]
        from fpsim.train import DataParallelTrainer

        tr = DataParallelTrainer("bf16-mixed", _config(2), world_size=2)
        tr.run(progress=False)
        return [tr.store.weights[k] for k in sorted(tr.store.weights)]

    state = rng.bit_generator.state
    results = []
    for n in (1, 2):
        rng.bit_generator.state = state
        limit_blas_threads(n)
        results.append(run())
    for x, y in zip(*results):
        assert np.array_equal(x, y)


def test_no_gemm_outside_the_pinned_helper() -> None:
    """No ``@``/``np.matmul``/``np.dot``/``einsum``/``tensordot``/... on float arrays in the training path's
    packages except through :func:`fpsim._blas.matmul` (the class of bug, not only the sites fixed)."""
    calls = {"matmul", "dot", "einsum", "tensordot", "inner", "vdot", "outer", "multi_dot", "kron"}
    bad = []
    for pkg in ("nn", "amp", "train"):
        for path in sorted((ROOT / "fpsim" / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
                    bad.append(f"{where}: @")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in calls:
                    base = node.func.value
                    # np.matmul, np.linalg.*, x.dot(...); the Precision hooks (prec.matmul, rt.matmul) are fine
                    if (isinstance(base, ast.Name) and base.id in ("np", "numpy")) \
                            or (isinstance(base, ast.Attribute) and base.attr == "linalg") \
                            or node.func.attr == "dot":
                        bad.append(f"{where}: {node.func.attr}()")
    assert not bad, "GEMMs outside fpsim._blas.matmul (results would depend on the BLAS thread count):\n" \
        + "\n".join(bad)


# ----------------------------------------------------------------------------- the pin itself

@needs_blas
def test_single_threaded_pins_and_restores(restore_threads: Any) -> None:
    get = _blas._libraries()[0][0]
    limit_blas_threads(2)
    with _blas.single_threaded():
        assert get() == 1
        with _blas.single_threaded():  # nested: still one, and the outer one still restores
            assert get() == 1
        assert get() == 1
        assert _blas.get_threads() == 2  # the count outside the region
        _blas.set_threads(3)             # inside a region: applies when it closes
        assert get() == 1
    assert get() == 3
    with pytest.raises(RuntimeError, match="boom"), _blas.single_threaded():
        raise RuntimeError("boom")
    assert get() == 3  # restored on an exception


@needs_blas
def test_trainer_restores_the_count_when_a_step_raises(monkeypatch: pytest.MonkeyPatch,
                                                       restore_threads: Any) -> None:
    import fpsim.train.loop as loop

    def fail(*a: Any, **k: Any) -> None:
        raise RuntimeError("boom")

    limit_blas_threads(2)
    tr = Trainer("fp32", _config(1))
    monkeypatch.setattr(loop, "gpt_forward", fail)
    with pytest.raises(RuntimeError, match="boom"):
        tr.run(progress=False)
    assert _blas._libraries()[0][0]() == 2


@needs_blas
def test_regions_in_several_threads(restore_threads: Any) -> None:
    """The pin is process-wide: a thread leaving its region does not unpin another thread's."""
    get = _blas._libraries()[0][0]
    limit_blas_threads(2)
    inside, leave = threading.Barrier(2), threading.Event()
    seen: list[int] = []

    def worker() -> None:
        with _blas.single_threaded():
            inside.wait(timeout=30)
            leave.wait(timeout=30)
            seen.append(int(get()))

    t = threading.Thread(target=worker)
    t.start()
    with _blas.single_threaded():
        inside.wait(timeout=30)
    seen.append(int(get()))  # main left its region; the worker's is still open
    leave.set()
    t.join(timeout=30)
    assert seen == [1, 1]
    assert get() == 2


@needs_blas
def test_blas_threads_context(restore_threads: Any) -> None:
    get = _blas._libraries()[0][0]
    limit_blas_threads(1)
    with blas_threads(2):
        assert get() == 2
        with _blas.single_threaded():
            assert get() == 1
        assert get() == 2
    assert get() == 1


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError),
                                      (True, TypeError)])
def test_set_threads_rejects(bad: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc, match="BLAS thread count"):
        _blas.set_threads(bad)


@needs_blas
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fallback reads /proc/self/maps")
def test_libraries_found_without_threadpoolctl(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def without_threadpoolctl(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "threadpoolctl":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", without_threadpoolctl)
    found = _blas._find_controls()
    assert found, "no BLAS library found in /proc/self/maps"
    assert _blas.get_threads() in [int(get()) for get, _ in found]


@needs_blas
def test_one_thread_bits_unchanged(restore_threads: Any) -> None:
    """At one thread the helper is plain ``@``: the bits of every run pinned to one thread before stay."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 320, 64)).astype(np.float32)
    b = rng.standard_normal((64, 256)).astype(np.float32)
    limit_blas_threads(1)
    assert np.array_equal(_blas.matmul(a, b), a @ b)
