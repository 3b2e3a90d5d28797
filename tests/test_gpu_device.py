"""Checks on a real CUDA GPU (marker ``gpu``; skipped without CuPy or a device).

Run on a GPU machine with ``python -m pytest tests/test_gpu_device.py -m gpu``; the full recorded run is
``tools/gpu_crosscheck.sh`` (see docs/hardware-results.md).
"""

from __future__ import annotations

import pytest

from fpsim.gpu import GPUUnavailable, crosscheck_mma, crosscheck_round, device_info, probe
from fpsim.gpu.convert import CONVERSIONS
from fpsim.gpu.fragments import PATHS, instruction_for
from fpsim.mma import get_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def info():  # type: ignore[no-untyped-def]
    try:
        return device_info(0)
    except GPUUnavailable as e:
        pytest.skip(str(e))


def _preset(name: str, inp: str, out: str):  # type: ignore[no-untyped-def]
    try:
        return get_model(name, inp, out)
    except ValueError as e:
        pytest.skip(f"no fpsim preset for {name} {inp}->{out}: {e}")


@pytest.mark.parametrize("fmt, rnd, sat", list(CONVERSIONS), ids=[f"{f}-{r}-{'sat' if s else 'nosat'}" for f, r, s in CONVERSIONS])
def test_conversion_intrinsics_match(info, fmt: str, rnd: str, sat: bool) -> None:  # type: ignore[no-untyped-def]
    if fmt == "tf32" and info.cc < 80:
        pytest.skip("cvt.rna.tf32.f32 needs sm_80")
    r = crosscheck_round(fmt, 1 << 16, rnd, saturate=sat)
    assert r.ok, r.to_markdown()


@pytest.mark.parametrize("path", PATHS, ids=[f"{i}->{o}" for i, o in PATHS])
def test_mma_matches_device_preset(info, path: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    ins = instruction_for(*path)
    if info.cc < ins.min_cc:
        pytest.skip(f"{ins.ptx} needs compute capability {ins.min_cc}")
    model = _preset(info.name, *path)
    r = crosscheck_mma(model, n=2048)
    assert r.ok, r.to_markdown()


def test_probe_identifies_the_device(info) -> None:  # type: ignore[no-untyped-def]
    res = probe(0, paths=[("fp16", "fp32")], random_rows=16)
    fit = res.fits[0]
    model = _preset(info.name, "fp16", "fp32")
    assert fit.exact, fit.summary()
    assert (fit.k, fit.neab) == (model.k, model.neab)
