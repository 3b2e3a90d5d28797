"""CPU tests of fpsim.gpu.wgmma (Hopper wgmma.mma_async FP8): layouts, descriptors, kernel source, comparison.

Oracles: the PTX ISA's wgmma D-fragment table and the canonical no-swizzle K-major shared-memory layout,
transcribed here as plain loops independently of fpsim.gpu.wgmma; MMA-Sim's WGMMA for the model the
comparison uses. A test marked ``gpu`` runs the kernel on a Hopper GPU when CuPy and one are present.
"""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.gpu import GPUUnavailable
from fpsim.gpu import wgmma as W
from fpsim.mma import get_model

PATHS = [(i, o) for i in ("fp8_e4m3", "fp8_e5m2") for o in ("fp32", "fp16")]
IDS = [f"{i}->{o}" for i, o in PATHS]


def _emu(model):  # type: ignore[no-untyped-def]
    return lambda a, b, c, ins: W.emulate_wgmma(a, b, c, ins, model)


@pytest.mark.parametrize("inp,out", PATHS, ids=IDS)
def test_ptx_mnemonic_and_register_counts(inp: str, out: str) -> None:
    for n in (8, 16, 64, 256):
        ins = W.wgmma_instruction(inp, out, n)
        t, d = inp[-4:], "f32" if out == "fp32" else "f16"
        assert ins.ptx == f"wgmma.mma_async.sync.aligned.m64n{n}k32.{d}.{t}.{t}"
        assert ins.d_regs * 128 * (1 if out == "fp32" else 2) == 64 * n  # every D element held once
        assert (ins.a_bytes, ins.b_bytes) == (2048, 32 * n)
    with pytest.raises(ValueError, match="multiple of 8"):
        W.wgmma_instruction(inp, out, 12)
    with pytest.raises(ValueError, match="fp8_e4m3 or fp8_e5m2"):
        W.wgmma_instruction("fp16", out)
    with pytest.raises(TypeError):
        W.wgmma_instruction(inp, out, 8.0)  # type: ignore[arg-type]


def _ptx_d_fragment(n: int) -> dict[tuple[int, int], tuple[int, int]]:
    """PTX ISA, 'wgmma .m64nNk32 register fragment D': (thread, element index) -> (row, col)."""
    table = {}
    for tid in range(128):
        warp, lane = divmod(tid, 32)
        group, tig = divmod(lane, 4)
        for i in range(n // 2):
            pair, half = divmod(i, 2)       # d(2p), d(2p+1) are horizontal neighbours
            rowblk, colblk = pair % 2, pair // 2  # alternate rows +0 / +8, then the next 8 columns
            table[(tid, i)] = (16 * warp + group + 8 * rowblk, 8 * colblk + 2 * tig + half)
    return table


@pytest.mark.parametrize("n", [8, 24, 256])
def test_accumulator_coords_follow_the_ptx_isa(n: int) -> None:
    ins = W.wgmma_instruction("e4m3", "fp32", n)
    rows, cols = W.accumulator_coords(ins)
    table = _ptx_d_fragment(n)
    assert all((rows[t, i], cols[t, i]) == table[(t, i)] for t in range(128) for i in range(n // 2))
    cover = np.zeros((64, n), dtype=int)
    np.add.at(cover, (rows, cols), 1)
    assert (cover == 1).all()


def test_smem_layout_is_the_canonical_interleaved_k_major_layout() -> None:
    off = W.smem_offsets(64)
    for r in (0, 7, 8, 63):
        for k in (0, 15, 16, 31):
            core = (r // 8, k // 16)  # core matrix (8 rows x 16 bytes), 128 contiguous bytes
            assert off[r, k] == core[0] * W.SBO + core[1] * W.LBO + 16 * (r % 8) + (k % 16)
    assert sorted(off.ravel().tolist()) == list(range(64 * 32))  # a bijection onto the 2048-byte image
    assert W.descriptor(0x400) == (0x400 >> 4) | (128 >> 4) << 16 | (256 >> 4) << 32
    d = W.descriptor(0xFFF0, 128, 256, swizzle=1)
    assert (d & 0x3FFF, (d >> 16) & 0x3FFF, (d >> 32) & 0x3FFF, d >> 62) == (0xFFF, 8, 16, 1)
    with pytest.raises(ValueError, match="multiple of 16"):
        W.descriptor(8)
    with pytest.raises(ValueError, match="swizzle"):
        W.descriptor(0, swizzle=4)


@pytest.mark.parametrize("inp,out", PATHS, ids=IDS)
def test_pack_unpack_roundtrip(inp: str, out: str) -> None:
    ins = W.wgmma_instruction(inp, out, 16)
    rng = np.random.default_rng(0)
    codes_a = rng.integers(0, 256, (3, 64, 32)).astype(np.uint8)
    codes_b = rng.integers(0, 256, (3, 32, 16)).astype(np.uint8)
    fin = fpsim.formats.as_format(inp)
    a = np.asarray(fpsim.from_bits(codes_a, fin), dtype=np.float64)
    b = np.asarray(fpsim.from_bits(codes_b, fin), dtype=np.float64)
    ia, ib = W.pack_smem(a, ins, "a"), W.pack_smem(b, ins, "b")
    assert ia.shape == (3, 2048) and ib.shape == (3, 512) and ia.dtype == np.uint8
    # byte (r, k) of A and (n, k) of B (B stored transposed) hold that element's code
    assert ia[1, W.SBO * 2 + W.LBO + 16 * 3 + 5] == np.asarray(fpsim.to_bits(a[1, 19, 21], fin))
    assert ib[2, W.LBO + 16 * 4 + 1] == np.asarray(fpsim.to_bits(b[2, 17, 4], fin))
    ua, ub = W.unpack_smem(ia, ins, "a"), W.unpack_smem(ib, ins, "b")
    np.testing.assert_array_equal(np.asarray(fpsim.from_bits(ua, fin)), a)  # NaNs in equal places
    np.testing.assert_array_equal(np.asarray(fpsim.from_bits(ub, fin)), b)
    fo = fpsim.formats.as_format(out)
    c = np.asarray(fpsim.round(rng.standard_normal((3, 64, 16)), fo, "rne"), dtype=np.float64)
    words = W.pack_accumulator(c, ins)
    assert words.shape == (3, 128, ins.d_regs) and words.dtype == np.uint32
    got = W.unpack_accumulator(words, ins)
    want = np.asarray(c, dtype=np.float32).view(np.uint32) if out == "fp32" else \
        np.asarray(c, dtype=np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)
    if out == "fp16":  # element 2j in the low half: thread 0's first register holds D[0,0] (low), D[0,1]
        assert words[0, 0, 0] == (int(want[0, 0, 0]) | int(want[0, 0, 1]) << 16)
    with pytest.raises(ValueError, match="shape"):
        W.unpack_accumulator(words[:, :64], ins)


@pytest.mark.parametrize("inp,out", PATHS, ids=IDS)
def test_kernel_source(inp: str, out: str) -> None:
    ins = W.wgmma_instruction(inp, out, 8)
    src = W.wgmma_kernel_source(ins)
    nr = ins.d_regs
    assert f"{ins.ptx} {{" + ", ".join(f"%{i}" for i in range(nr)) + f"}}, %{nr}, %{nr + 1}, p, 1, 1;" in src
    assert f"setp.ne.b32 p, %{nr + 2}, 0;" in src
    assert src.count('"+f"') == (nr if out == "fp32" else 0) and src.count('"+r"') == (0 if out == "fp32" else nr)
    for needle in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                   "fence.proxy.async.shared::cta", "__cvta_generic_to_shared", "unsigned sa[512]",
                   "unsigned sb[64]", f'extern "C" __global__ void __launch_bounds__(128) {W.WGMMA_KERNEL_NAME}'):
        assert needle in src, needle
    assert src.count("{") == src.count("}")


@pytest.mark.parametrize("inp,out", PATHS, ids=IDS)
def test_crosscheck_pipeline_agrees_with_itself(inp: str, out: str) -> None:
    m = get_model("h200", inp, out, path="wgmma")
    r = W.crosscheck_wgmma(m, n=1024, runner=_emu(m))
    assert r.mismatches == 0 and r.n == 64 * 8 * (2 + 2) and r.instruction.startswith("wgmma")


def test_crosscheck_detects_the_mma_sync_model_and_a_wrong_layout() -> None:
    # synthetic "GPU" outputs from another data path: the mma.sync V1 model differs from wgmma's fp16 path
    wg = get_model("h100", "fp8_e4m3", "fp16", path="wgmma")
    v1 = get_model("h100", "fp8_e4m3", "fp16")
    r = W.crosscheck_wgmma(wg, n=4096, runner=_emu(v1))
    assert r.mismatches > 0 and r.examples and len(r.examples[0]["a"]) == 32

    m = get_model("h100", "fp8_e5m2", "fp32", path="wgmma")

    def wrong_lbo(a, b, c, ins):  # type: ignore[no-untyped-def]
        # a GPU reading the A image with LBO and SBO swapped: the one-hot layout tiles break
        codes = a[:, (np.arange(64)[:, None] // 8) * W.LBO + (np.arange(32)[None, :] // 16) * W.SBO
                  + (np.arange(64)[:, None] % 8) * 16 + (np.arange(32)[None, :] % 16) % 2048]
        fixed = W.pack_smem(np.asarray(fpsim.from_bits(codes, ins.input), dtype=np.float64), ins, "a")
        return W.emulate_wgmma(fixed, b, c, ins, m)

    r = W.crosscheck_wgmma(m, n=512, runner=wrong_lbo)
    assert r.mismatches > 0 and r.examples[0]["tile"] == 0  # caught by the first layout tile


def test_wgmma_model_is_mmasims_wgmma() -> None:
    """The model the comparison expects is MMA-Sim's WGMMA (independent oracle), on whole 64 x 8 tiles."""
    torch = pytest.importorskip("torch")
    sim = pytest.importorskip("mmasim.nv_ptx.sim")
    from fpsim.gpu.mma_check import expected_d, random_tiles

    for inp, out in PATHS:
        ins = W.wgmma_instruction(inp, out, 8)
        a, b, c = random_tiles(ins, 6, seed=1)
        want = expected_d(a, b, c, get_model("h100", inp, out, path="wgmma"))
        t, d = inp[-4:], "f32" if out == "fp32" else "f16"
        op = sim.WGMMA("Hopper", f"m64n8k32.{d}.{t}.{t}")
        dt = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[inp]
        ct = torch.float32 if out == "fp32" else torch.float16
        for i in range(a.shape[0]):
            ref = op(torch.from_numpy(a[i]).to(dt), torch.from_numpy(b[i]).to(dt), torch.from_numpy(c[i]).to(ct))
            np.testing.assert_array_equal(ref.double().numpy(), want[i])


def test_gpu_runner_without_cupy_or_hopper() -> None:
    try:
        import cupy  # noqa: F401
    except Exception:  # noqa: BLE001
        with pytest.raises(GPUUnavailable):
            W.wgmma_gpu_runner()
        with pytest.raises(GPUUnavailable):
            W.crosscheck_wgmma("h200", n=64)
    else:  # pragma: no cover - machines with CuPy
        pytest.skip("CuPy is installed: the gpu-marked test covers the runner")


@pytest.mark.gpu
@pytest.mark.parametrize("inp,out", PATHS, ids=IDS)
def test_wgmma_on_a_hopper_gpu(inp: str, out: str) -> None:  # pragma: no cover - needs an H100/H200
    try:
        r = W.crosscheck_wgmma(None, inp, out, n=64 * 8 * 200)
    except GPUUnavailable as e:
        pytest.skip(str(e))
    assert r.mismatches == 0, r.summary()


def test_run_all_runs_the_wgmma_paths(monkeypatch: pytest.MonkeyPatch,
                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    """python -m fpsim.gpu.run_all on a (fake) H200 with the REAL wgmma runner: the four wgmma paths are built
    through RawModule for sm_90a, launched one CTA of 128 threads per tile, and reported.

    The fake is CuPy 14 (no ``cupy.cuda.compiler.compile_with_cache``): the runner that called it recorded four
    AttributeErrors here and run_all exited 1, which is what the first H200 run would have done.
    """
    import json
    import sys

    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra
    from test_gpu import _fake_cupy

    cp = _fake_cupy()
    assert not hasattr(cp.cuda.compiler, "compile_with_cache")
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(ra, "PATHS", ())
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {})
    monkeypatch.setattr(ra, "BLOCK_SCALED_INSTRUCTIONS", {})  # tests/test_gpu_blockscaled.py
    monkeypatch.setattr(prb, "PATHS", ())
    monkeypatch.setattr(conv, "CONVERSIONS", {})
    assert ra.main(["--out", str(tmp_path), "--rows", "512", "--conv-random", "10"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert not res["errors"]
    assert [m["path"] for m in res["mma"]] == [f"wgmma {i}->{o}" for i, o in ra.WGMMA_PATHS]
    assert all(m["mismatches"] == 0 and m["instruction"].startswith("wgmma.mma_async") for m in res["mma"])
    assert all(m["n"] == 64 * 8 * (2 + 1) for m in res["mma"])  # two layout tiles and ceil(512 / 512) random
    assert "wgmma.mma_async.sync.aligned.m64n8k32.f16.e5m2.e5m2" in (tmp_path / "results.md").read_text()
    assert len(cp.modules) == 4 and all("--gpu-architecture=sm_90a" in opts for _, opts in cp.modules)
    assert [n for _, _, n in cp.launches] == [3] * 4 and all(th == 3 * 128 for _, th, _ in cp.launches)


def test_a_refused_wgmma_kernel_is_skipped_not_failed(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A toolkit that cannot build wgmma (CuPy's CompileException) marks the paths skipped; run_all still passes."""
    import json
    import sys

    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra
    from fpsim.gpu._compile import KernelBuildError, is_compile_error
    from test_gpu import _fake_cupy

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(refuse=("wgmma.fence",)))
    monkeypatch.setattr(ra, "PATHS", ())
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {})  # tests/test_gpu_generations.py
    monkeypatch.setattr(ra, "BLOCK_SCALED_INSTRUCTIONS", {})  # tests/test_gpu_blockscaled.py
    monkeypatch.setattr(prb, "PATHS", ())
    monkeypatch.setattr(conv, "CONVERSIONS", {})
    assert ra.main(["--out", str(tmp_path), "--rows", "64", "--conv-random", "10"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert not res["errors"] and len(res["mma"]) == 4
    assert all(m["skipped"].startswith("the CUDA toolkit cannot build it: cannot build fpsim_wgmma for sm_90a: "
                                       "ptxas") for m in res["mma"])
    with pytest.raises(KernelBuildError, match="wgmma.fence"):
        W.crosscheck_wgmma("h200", n=64)
    assert not is_compile_error(AttributeError("module 'cupy.cuda.compiler' has no attribute 'compile_with_cache'"))
    assert not is_compile_error(RuntimeError("cudaErrorNotSupported: operation not supported"))
