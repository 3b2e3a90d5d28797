"""Every CUDA kernel fpsim generates compiles for every architecture it claims, and is refused below: NVRTC through
ctypes (no CuPy, no GPU), with the options a CuPy run passes (``-ftz=true`` included).

NVRTC is the ``nvidia-cuda-nvrtc`` wheel (``.ci/run`` installs the CUDA 13 one) or ``FPSIM_NVRTC``; the CUDA
headers the ``nvidia-cuda-runtime`` wheel or ``FPSIM_CUDA_INCLUDE``. Without them the tests skip, saying so.
NVRTC 13 cannot target sm_70 (CUDA 13 dropped Volta): those cases skip with that reason; point FPSIM_NVRTC at a
CUDA 12 NVRTC (``nvidia-cuda-nvrtc-cu12``) to run them. Compiles are cached in memory for the session only.

Each kernel's boundary cases (its lowest claimed architecture and the one just below, or sm_90 for sm_90a) run
by default; the full kernel x architecture matrix is ``slow`` (about 320 compiles, 50 s on a loaded 2-core box).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest

from fpsim.gpu._compile import BASE_OPTIONS, compile_options
from fpsim.gpu._nvrtc import NVRTC, CompileResult, load_nvrtc, parse_arch
from fpsim.gpu.kernels import ARCHS, Check, Kernel, catalogue, check, judge, main, nvrtc_options, presets_for, table

KERNELS = catalogue()
BY_ID = {f"{k.family}:{k.label}": k for k in KERNELS}


@lru_cache(maxsize=1)
def _nvrtc() -> NVRTC | str:
    try:
        return load_nvrtc()
    except OSError as e:
        return str(e)


@pytest.fixture(scope="module")
def nvrtc() -> NVRTC:
    nv = _nvrtc()
    if isinstance(nv, str):
        pytest.skip(f"no NVRTC: {nv}")
    return nv


def _nvrtc_include() -> str | None:
    nv = _nvrtc()
    return nv.include_dir if isinstance(nv, NVRTC) else None


def _needs_headers(k: Kernel) -> bool:
    return "#include" in k.source


@lru_cache(maxsize=None)
def _result(kid: str, arch: str) -> CompileResult:
    nv = _nvrtc()
    assert isinstance(nv, NVRTC)
    return nv.compile(BY_ID[kid].source, nvrtc_options(arch, _nvrtc_include()))


def _check(kid: str, arch: str) -> Check:
    nv = _nvrtc()
    assert isinstance(nv, NVRTC) and nv.supports(arch)
    return judge(BY_ID[kid], arch, _result(kid, arch))


def _boundary(k: Kernel) -> set[str]:
    """The lowest claimed architecture and the refused one right below it (sm_90 beside sm_90a)."""
    first = k.claims[0]
    below = [a for a in k.refused if parse_arch(a)[0] <= parse_arch(first)[0]]
    return {first, below[-1]} if below else {first}


CASES = [pytest.param(kid, a, id=f"{kid}@{a}", marks=() if a in _boundary(k) else pytest.mark.slow)
         for kid, k in BY_ID.items() for a in ARCHS]


@pytest.mark.parametrize("kid,arch", CASES)
def test_compiles_where_claimed_and_is_refused_elsewhere(nvrtc: NVRTC, kid: str, arch: str) -> None:
    k = BY_ID[kid]
    if not nvrtc.supports(arch):
        pytest.skip(f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]} cannot target {arch} (its targets: "
                    f"sm_{', sm_'.join(map(str, nvrtc.archs))}); set FPSIM_NVRTC to a CUDA 12 NVRTC to test it")
    if _needs_headers(k) and _nvrtc_include() is None:
        pytest.skip("no CUDA headers (pip install nvidia-cuda-runtime, or set FPSIM_CUDA_INCLUDE)")
    c = _check(kid, arch)
    want = "compiles" if arch in k.claims else "refused"
    assert c.status == want and c.expected, f"{kid} on {arch}: {c.status} ({c.detail}); claims {k.claims}"


def test_catalogue_enumerates_every_generator() -> None:
    from fpsim.gpu.convert import CONVERSIONS
    from fpsim.gpu.fragments import _INSTRUCTIONS, BLOCK_SCALED_INSTRUCTIONS, GENERATION_INSTRUCTIONS
    from fpsim.gpu.run_all import WGMMA_PATHS

    fam = [k.family for k in KERNELS]
    assert fam.count("convert") == len(CONVERSIONS)
    assert fam.count("mma.sync") == len(_INSTRUCTIONS) + len(GENERATION_INSTRUCTIONS) + len(BLOCK_SCALED_INSTRUCTIONS)
    assert fam.count("wgmma") == 2 * len(WGMMA_PATHS)
    assert len(BY_ID) == len(KERNELS)  # labels are unique within a family
    for k in KERNELS:
        assert k.claims and set(k.claims) | set(k.refused) == set(ARCHS)
        assert re.search(rf"__global__ void (__launch_bounds__\(\d+\) )?{k.name}\(", k.source), k.label
    wg = [k for k in KERNELS if k.family == "wgmma"]
    assert all(k.claims == ("sm_90a",) for k in wg)
    assert BY_ID["convert:tf32 rna"].min_arch == "sm_80"


def test_presets_each_kernel_checks() -> None:
    mma = {k.label: presets_for(k) for k in KERNELS if k.family != "convert"}
    assert {"a100", "h200", "rtx5090"} <= set(mma["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"])
    assert "v100" not in mma["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]  # sm_70 has no m16n8k16
    assert "a100" not in mma["mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"]  # FP8 needs sm_89
    assert mma["wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"] == ("h100", "h200")
    assert presets_for(BY_ID["convert:fp16 rne"]) == ()


def test_options_are_the_runtime_helpers(nvrtc: NVRTC) -> None:
    """The compile tests pass NVRTC what build_kernel + CuPy 14.2 pass: fpsim's options, then CuPy's tail."""
    assert BASE_OPTIONS == ("-std=c++17", "-ftz=true")
    opts = nvrtc_options("sm_90a")
    assert opts[:2] == BASE_OPTIONS and "--gpu-architecture=sm_90a" in opts and opts[-1] == "-arch=sm_90"
    assert "--gpu-architecture=sm_90a" in compile_options(None, "sm_90a")
    assert not any(o.startswith("--gpu-architecture") for o in nvrtc_options("sm_90"))
    with pytest.raises(ValueError, match="sm_90a"):
        compile_options(None, "90a")


def test_sm_90a_survives_cupys_trailing_arch(nvrtc: NVRTC) -> None:
    """CuPy appends ``-arch=sm_90`` after fpsim's ``--gpu-architecture=sm_90a``: NVRTC must still make sm_90a.

    Measured with NVRTC 12.9 and 13.5: it takes the number of the last ``-arch`` and keeps the ``a``. Without
    fpsim's option (CuPy's plain ``sm_90``) ptxas refuses wgmma: the failure the first H200 run would have hit.
    """
    src = BY_ID["wgmma:wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"].source
    r = nvrtc.compile(src, nvrtc_options("sm_90a"))
    assert r.ok and r.target == "sm_90a" and r.cubin, r.log
    plain = nvrtc.compile(src, (*BASE_OPTIONS, "-arch=sm_90"))
    assert not plain.ok and "wgmma" in plain.log and "sm_90" in plain.first_error


_FTZ = re.compile(r"^\s*(\S*\.ftz\S*)", re.M)


def test_ftz_touches_no_data_path(nvrtc: NVRTC) -> None:
    """``-ftz=true`` (CuPy's default) changes only FP8's header emulation, where it cannot change a code.

    The fp16/bf16/tf32 conversions and the MMA kernels have no ``.ftz`` instruction. The FP8 emulation widens x
    with ``cvt.ftz.f64.f32``, flushing a float32 subnormal to a zero of its sign first; every float32
    subnormal is far below half of FP8's least subnormal, so round-to-nearest gives that signed zero anyway
    (checked against ml_dtypes below, all 2**24 - 2 nonzero float32 subnormals).
    """
    if _nvrtc_include() is None:
        pytest.skip("no CUDA headers")
    for kid, k in BY_ID.items():
        if k.family == "wgmma":
            continue
        for arch in ("sm_80", "sm_90"):  # below and above the FP8 and bf16-directed hardware instructions
            if arch not in k.claims:
                continue
            r = _result(kid, arch)
            assert r.ok, r.log
            ftz = {m.split()[0] for m in _FTZ.findall(r.ptx)}
            if k.label.startswith("fp8"):
                assert ftz <= {"cvt.ftz.f64.f32"}, (k.label, arch, ftz)
            else:
                assert not ftz, (k.label, arch, ftz)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mags = np.arange(1, 1 << 23, dtype=np.uint32)
    sub = np.concatenate([mags, mags | np.uint32(1 << 31)]).view(np.float32)
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        codes = sub.astype(dt).view(np.uint8)
        flushed = np.where(np.signbit(sub), np.float32(-0.0), np.float32(0.0)).astype(dt).view(np.uint8)
        assert int(np.count_nonzero(codes != flushed)) == 0


def test_refusals_name_the_instruction(nvrtc: NVRTC) -> None:
    """A refusal is ptxas's, about the instruction, not an option or header problem."""
    for kid, arch in (("mma.sync:mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "sm_86"),
                      ("convert:tf32 rna", "sm_75"),
                      ("wgmma:wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3", "sm_100a")):
        if not nvrtc.supports(arch):
            continue
        c = _check(kid, arch)
        assert c.status == "refused" and "ptxas" in c.detail, (kid, arch, c.detail)
        assert re.search(r"(not supported on|requires) \.target", c.detail), (kid, arch, c.detail)


def test_table_and_command(nvrtc: NVRTC, capsys: pytest.CaptureFixture[str]) -> None:
    ks = [BY_ID["convert:tf32 rna"], BY_ID["wgmma:wgmma.mma_async.sync.aligned.m64n8k32.f16.e5m2.e5m2"]]
    md = table([_check(f"{k.family}:{k.label}", a) for k in ks for a in ("sm_80", "sm_90a")])
    one = check(ks[0], "sm_80", nvrtc, _nvrtc_include())
    assert one.cell == "ok" and one.seconds > 0 and "cubin" in one.detail
    assert md.splitlines()[0] == "| family | kernel | min | sm_80 | sm_90a |"
    assert "| convert | `tf32 rna` | sm_80 | ok | ok |" in md
    assert "| sm_90a | refused | ok |" in md
    assert main([]) == 0 and "sm_90a" in capsys.readouterr().out
    assert main(["--table", "--nvrtc", "/nonexistent/libnvrtc.so"]) == 2
    assert "fpsim.gpu.kernels" in capsys.readouterr().err


def test_nvrtc_wrapper_basics(nvrtc: NVRTC) -> None:
    assert nvrtc.version >= (12, 0) and 80 in nvrtc.archs and 90 in nvrtc.archs
    r = nvrtc.compile('extern "C" __global__ void k(float* x) { x[0] = 2.0f * x[0]; }', ("-arch=compute_80",))
    assert isinstance(r, CompileResult) and r.ok and r.target == "sm_80" and r.cubin == b""  # PTX only
    bad = nvrtc.compile("this is not C++", ("-arch=sm_80",))
    assert not bad.ok and bad.status == "NVRTC_ERROR_COMPILATION" and "error" in bad.first_error
    with pytest.raises(ValueError, match="sm_80"):
        parse_arch("80")
    assert parse_arch("compute_120a") == (120, "a")
    assert "NVRTC(" in repr(nvrtc)


def test_docs_page_examples_run() -> None:
    """The worked example of docs/gpu-kernels.md gives what it shows (no NVRTC needed)."""
    import doctest
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "gpu-kernels.md"
    test = doctest.DocTestParser().get_doctest(page.read_text(encoding="utf-8"), {}, "gpu-kernels.md", str(page), 0)
    assert test.examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
