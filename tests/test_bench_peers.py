"""benchmarks/bench_peers.py and benchmarks/_cpfloat.py at a tiny size, so the peer benchmark does not rot.

CPFloat (built from its headers in $CPFLOAT_DIR, default /tmp/cpfloat) is also an independent oracle for fpsim's
rounding where the two model the same format; the CPFloat tests skip when its headers or a compiler are absent.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

import fpsim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _cpfloat
import bench_peers as B

TINY = ["--n", "4000", "--slow-n", "1000", "--repeat", "1", "--slow-repeat", "1"]


def _values(n: int = 20000) -> np.ndarray:
    """Both distributions of the benchmark plus specials, float32."""
    xs = B.inputs(n, seed=3)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, 240.0, 247.9, 248.0, 464.0, 65520.0,
                   2.0**-24 * 28.5, 2.0**-133 * 3], dtype=np.float32)
    return np.concatenate([*xs.values(), sp, -sp])


def _bad(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    return ~((y.view(np.uint32) == r.view(np.uint32)) | (np.isnan(y) & np.isnan(r)))


def test_mismatches_counts_bits_and_nan_equal() -> None:
    a = np.array([1.0, np.nan, 0.0, 2.0], dtype=np.float32)
    b = np.array([1.0, -np.nan, -0.0, 2.0000002], dtype=np.float32)
    assert B.mismatches(a, b) == 2  # signed zero and the last value; any NaN equals any NaN


def test_sr_stats_of_fpsim_sr_match_expectation() -> None:
    x = B.inputs(20000)["N(0,1)"]
    y = fpsim.round(x, "bf16", "sr", rng=np.random.default_rng(0))
    e, o, off = B.sr_stats(x, y, "bf16")
    assert off == 0 and abs(o - e) < 0.02


def _check_rne_agreement(out: dict[str, object]) -> None:
    """Peers that model fpsim's formats exactly agree on every RNE element (see benchmarks/README.md)."""
    for (dist, mode), table in out["rounding"].items():  # type: ignore[attr-defined]
        for name, cells in table.items():
            for fmt, cell in cells.items():
                if cell.ratio is None:
                    continue
                assert cell.ratio > 0
                exact_peer = name.startswith(("fpsim", "ml_dtypes", "NumPy", "gfloat")) or (
                    name.startswith(("CPFloat", "torch")) and (fmt != "fp8_e4m3" or dist == "N(0,1)"))
                if mode == "rne" and exact_peer:
                    assert cell.agree == "0", (dist, name, fmt, cell.agree)


def test_rounding_table_fast_peers_agree(capsys: pytest.CaptureFixture[str]) -> None:
    out = B.main([*TINY, "--no-gemm", "--skip", "torch,pychop,gfloat,qtorch"])
    text = capsys.readouterr().out
    assert "time / np.copyto" in text and "load average" in text and "SR: P(round up)" in text
    assert "skip: torch -- --skip" in text
    _check_rne_agreement(out)


@pytest.mark.slow
def test_script_runs_tiny_with_every_installed_peer_and_gemm(capsys: pytest.CaptureFixture[str]) -> None:
    out = B.main([*TINY, "--gemm-size", "32", "--mmasim-rows", "4", "--naive-rows", "1", "--gemm-repeat", "1"])
    text = capsys.readouterr().out
    assert "GEMM 32x32x32" in text
    _check_rne_agreement(out)
    for r in out["gemm"]:
        assert r["naive_bad"] == 0, r
        if "sim_bad" in r:
            assert r["sim_bad"] == 0, r


needs_cpfloat = pytest.mark.skipif(not _cpfloat.available(), reason=f"CPFloat unavailable: {_cpfloat.skip_reason()}")


@needs_cpfloat
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fmt", sorted(_cpfloat.FORMATS))
def test_cpfloat_rne_matches_fpsim_where_the_formats_agree(fmt: str, threads: int) -> None:
    x = _values()
    out = np.empty_like(x)
    assert _cpfloat.round(x, out, fmt, "rne", threads=threads) is out
    bad = _bad(out, fpsim.round(x, fmt))
    if fmt == "fp8_e4m3":  # CPFloat's E4M3 is IEEE-style (max 240, infinity): OCP E4M3 differs from 248 up
        assert not bad[np.abs(x) < 248].any()
        assert bad[np.isfinite(x) & (np.abs(x) >= 248)].all()
    else:
        assert not bad.any(), (fmt, x[bad][:5], out[bad][:5])


@needs_cpfloat
@pytest.mark.parametrize("mode", ["rtz", "rup", "rdn", "rna"])
def test_cpfloat_directed_modes_match_fpsim_bf16(mode: str) -> None:
    x = _values(5000)
    x = x[np.isfinite(x)]  # CPFloat's directed modes let NaN/inf through its bit masks unchanged or not: not compared
    out = _cpfloat.round(x, np.empty_like(x), "bf16", mode)
    bad = _bad(out, fpsim.round(x, "bf16", mode))
    assert not bad.any(), (mode, x[bad][:5], out[bad][:5])


@needs_cpfloat
def test_cpfloat_sr_is_unbiased_and_seeded() -> None:
    x = B.inputs(20000)["N(0,1)"]
    _cpfloat.seed(5)
    y1 = _cpfloat.round(x, np.empty_like(x), "bf16", "sr")
    _cpfloat.seed(5)
    y2 = _cpfloat.round(x, np.empty_like(x), "bf16", "sr")
    assert np.array_equal(y1, y2)
    e, o, off = B.sr_stats(x, y1, "bf16")
    assert off == 0 and abs(o - e) < 0.02


@needs_cpfloat
def test_cpfloat_bad_arguments() -> None:
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="fp4_e2m1"):
        _cpfloat.round(x, np.empty_like(x), "fp4_e2m1")
    with pytest.raises(ValueError, match="choose one of"):
        _cpfloat.round(x, np.empty_like(x), "bf16", "nearest")
    with pytest.raises(TypeError, match="float32"):
        _cpfloat.round(x.astype(np.float64), np.empty_like(x), "bf16")
    with pytest.raises(ValueError, match="shape"):
        _cpfloat.round(x, np.empty(3, dtype=np.float32), "bf16")


def test_cpfloat_skips_with_a_reason_without_headers(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPFLOAT_DIR", str(tmp_path))
    monkeypatch.setenv("FPSIM_BENCH_CACHE", str(tmp_path))
    try:
        mod = importlib.reload(_cpfloat)
        assert not mod.available()
        assert "headers not found" in mod.skip_reason() and str(tmp_path) in mod.skip_reason()
        with pytest.raises(RuntimeError, match="unavailable"):
            mod.round(np.ones(2, np.float32), np.empty(2, np.float32), "bf16")
    finally:
        monkeypatch.undo()
        importlib.reload(_cpfloat)
