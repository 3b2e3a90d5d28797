"""The device script ``tools/gpu_crosscheck.sh`` and the cuBLAS-through-torch check (:mod:`fpsim.gpu.torch_check`),
without a GPU.

The script runs in a child process against the fake CuPy of ``tests/_fake_cupy.py`` (its "GPU" computes with
fpsim's presets) with fpsim's C extensions hidden, as on a device machine where nothing was built; the torch
calls run on torch's CPU kernels where torch is installed (their numbers are not Tensor Core numbers: these tests
check that every call is made and recorded, never the numerics). The numerics are checked on a real GPU by
running the script there (docs/hardware-results.md).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import _fake_cupy
from fpsim.gpu import torch_check as T

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_crosscheck.sh"

# Hides fpsim's C extensions from the child process (sitecustomize runs before the script's Python code).
_NO_C_EXTENSIONS = '''\
import importlib.abc, sys
class _NoCExtensions(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("fpsim._ckernel", "fpsim._carith", "fpsim._cgemm", "fpsim._cfpenv"):
            raise ImportError(f"{name} hidden by tests/test_gpu_crosscheck_script.py")
        return None
sys.meta_path.insert(0, _NoCExtensions())
'''


def _has(mod: str) -> bool:
    try:
        __import__(mod)
        return True
    except Exception:  # noqa: BLE001  (a broken install counts as absent)
        return False


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the device script needs bash and coreutils' timeout")
def test_script_quick_runs_every_part_against_a_fake_gpu(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    _fake_cupy.write_shim(shim)
    (shim / "sitecustomize.py").write_text(_NO_C_EXTENSIONS)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FPSIM_"))}
    # The script's wall-clock budget is for an idle device machine; a loaded CI runner is judged by CPU time.
    env.update(PYTHONPATH=str(shim), PYTHON=sys.executable, HOME=str(tmp_path), FPSIM_BUDGET_S="900")
    torch_ok = _has("torch")
    if torch_ok:
        env["FPSIM_TORCH_DEVICE"] = "cpu"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(["bash", str(SCRIPT), str(out), "--quick"], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"gpu_crosscheck.sh --quick against the fake CuPy: {cpu:.1f} s of CPU")
    log = (out / "log.txt").read_text()
    assert p.stdout == log  # everything printed is in the log
    # torch's CPU kernels are not Tensor Cores, so the torch step may disagree (status 1); nothing else may fail
    assert p.returncode in (0, 1), log
    assert "finished in" in log and "C extension _ckernel absent" in log
    assert "== run_all: exit 0" in log, log
    res = json.loads((out / "results.json").read_text())
    assert res["ok"] and res["errors"] == [] and res["preset_device"] == "NVIDIA H200" and "partial" not in res
    assert len(res["conversions"]) > 10 and all(c["mismatches"] == 0 for c in res["conversions"])
    paths = [m["path"] for m in res["mma"]]
    # 8 sm_80 shapes, Volta's 2 (skipped: not a V100), Turing's 2 (an H200 runs them), sm_120a's 10 + 9
    # block-scaled (skipped: not an sm_120 GPU), 4 wgmma
    assert sum(p.startswith("wgmma") for p in paths) == 4 and len(paths) == 35
    ran = [m for m in res["mma"] if "skipped" not in m]
    assert len(ran) == 14 and all(m["mismatches"] == 0 and m["n"] > 0 for m in ran)
    assert all("compute capability 120 exactly" in m["skipped"] or "on Volta only" in m["skipped"]
               for m in res["mma"] if "skipped" in m)
    assert res["probe"] and all(f["exact"] for f in res["probe"]["fits"])
    tc = res["torch_checks"]
    md = (out / "results.md").read_text()
    assert "## cuBLAS through PyTorch" in md and "# fpsim GPU cross-check: NVIDIA H200" in md
    if torch_ok:
        assert tc["preset_device"] == "NVIDIA H200" and len(tc["cases"]) == len(T.CASES)
        for c in tc["cases"]:
            assert "error" not in c, c
            assert "skipped" in c or (c["n"] == 1024 * 16 and c["models"][0]["n"] == c["n"]), c
    else:
        assert "torch is not available" in tc["unavailable"]
    assert cpu < 120, f"--quick took {cpu:.0f} s of CPU"


def test_script_refuses_a_missing_out_folder_argument() -> None:
    if shutil.which("bash") is None:
        pytest.skip("the device script needs bash")
    for args in ([], ["--quick"]):
        p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "usage:" in p.stderr


# ------------------------------------------------------------------------------------------------------
# fpsim.gpu.torch_check in this process


def test_emulated_backend_agrees_and_a_changed_output_is_counted() -> None:
    res = T.run_torch_checks("h200", backend=T.emulated_backend("h200"), rows=32, cols=16, seed=3)
    assert res["ok"] and [c["path"] for c in res["cases"]] == [c.label for c in T.CASES]
    assert all(c["n"] == 512 and c["models"][0]["mismatches"] == 0 for c in res["cases"])
    emu = T.emulated_backend("h200")
    flipped: list[str] = []

    def one_bit_off(a, b, case):  # type: ignore[no-untyped-def]
        out = emu(a, b, case).copy()
        out[5, 7] ^= 1  # the last bit of one output
        out[2, 3] ^= 1 << (case.output.width - 1)  # the sign bit of another
        flipped.append(case.label)
        return out

    res = T.run_torch_checks("h200", backend=one_bit_off, rows=16, cols=16, seed=3, cases=T.CASES[:3])
    assert not res["ok"] and flipped == [c.label for c in T.CASES[:3]]
    for c in res["cases"]:
        r = c["models"][0]
        # a flipped sign of a zero output is a signed-zero difference, not a mismatch
        assert r["mismatches"] + r["zero_sign_diffs"] == 2 and c["matches"] == []
        assert {(e["row"], e["col"]) for e in r["examples"]} <= {(5, 7), (2, 3)}
    md = T.render_markdown(res)
    assert "| scaled_mm fp8_e4m3->fp32 | 32 | 256 |" in md and "First mismatches" in md


def test_candidates_and_argument_errors() -> None:
    b200 = T.candidates("b200", T.CASES[0])
    assert [lb for lb, _ in b200] == ["b200 fp8_e4m3->fp32", "b200 fp8_e4m3->fp32 (path tcgen05)"]
    assert b200[0][1].c_entry != b200[1][1].c_entry  # two different models
    assert [lb for lb, _ in T.candidates("h100", T.CASES[2])] == ["h100 bf16->fp32"]
    for bad in (0, 20, -16, True, 16.0):
        with pytest.raises(ValueError, match="multiple of 16"):
            T.run_torch_checks("h200", backend=T.emulated_backend("h200"), rows=bad)  # type: ignore[arg-type]
    res = T.run_torch_checks("v100", backend=T.emulated_backend("h200"), rows=16, cols=16)
    # V100 has no FP8 or bf16 path: each such case is an error naming why, the fp16 ones still run
    errs = {c["path"]: c["error"] for c in res["cases"] if "error" in c}
    assert set(errs) == {c.label for c in T.CASES if c.input.name != "fp16"}
    assert all("ValueError" in e for e in errs.values())
    assert [c["path"] for c in res["cases"] if "n" in c] == ["matmul fp16->fp16", "mm_out fp16->fp32"]


def test_main_adds_a_section_to_existing_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"preset_device": "h100", "ok": True}))
    (tmp_path / "results.md").write_text("# fpsim GPU cross-check: X\n\nrun_all's part\n")
    seen: list[str | None] = []
    real = T.run_torch_checks

    def fake_run(device_name, **kw):  # type: ignore[no-untyped-def]
        seen.append(device_name)
        return real(device_name, backend=T.emulated_backend("h100"), rows=16, cols=16,
                                  cases=T.CASES[:1])

    monkeypatch.setattr(T, "run_torch_checks", fake_run)
    for _ in range(2):  # a second run replaces the section instead of adding another
        assert T.main(["--out", str(tmp_path), "--quick"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert seen == ["h100", "h100"] and res["ok"] and res["torch_checks"]["cases"][0]["n"] == 256
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# fpsim GPU cross-check: X\n\nrun_all's part\n") and md.count("## cuBLAS") == 1


def test_main_without_torch_or_gpu_records_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert T.main(["--out", str(tmp_path / "new"), "--as", "h200"]) == 2
    res = json.loads((tmp_path / "new" / "results.json").read_text())
    assert "torch is not available" in res["torch_checks"]["unavailable"]
    assert "Not run: torch is not available" in (tmp_path / "new" / "results.md").read_text()


@pytest.mark.skipif(not _has("torch"), reason="torch is not installed")
def test_torch_backend_makes_every_call_on_the_cpu() -> None:
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(T.GPUUnavailable, match="sees no CUDA device"):
            T.torch_backend("cuda:0")
    run, info = T.torch_backend("cpu")
    assert info["name"] == "cpu" and info["torch"] == torch.__version__
    rng = np.random.default_rng(7)
    for case in T.CASES:
        if case.op == "mm_out":
            continue  # torch has mm(out_dtype=) on CUDA only
        a = rng.integers(0, 0x40, size=(16, case.k)).astype(np.uint16)  # small positive codes of every format
        b = rng.integers(0, 0x40, size=(case.k, 16)).astype(np.uint16)
        a_in, b_in = a.copy(), b.copy()
        got = run(a, b, case)
        assert got.shape == (16, 16) and got.dtype == (np.uint32 if case.output.width == 32 else np.uint16)
        assert np.array_equal(a, a_in) and np.array_equal(b, b_in)  # inputs never modified
        assert np.all(np.isfinite(T._values_of(got, case.output)))


def test_run_all_leaves_what_it_finished_when_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed by the time limit (here: the probe never returns) keeps the checks done before it."""
    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra

    _fake_cupy.install(monkeypatch)
    monkeypatch.setattr(ra, "PATHS", (("bf16", "fp32"),))
    monkeypatch.setattr(ra, "WGMMA_PATHS", (("fp8_e4m3", "fp32"),))
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {k: v for k, v in ra.GENERATION_INSTRUCTIONS.items()
                                                        if k == "sm_75 m16n8k8 fp16->fp32"})
    monkeypatch.setattr(ra, "BLOCK_SCALED_INSTRUCTIONS", {})  # tests/test_gpu_blockscaled.py
    monkeypatch.setattr(conv, "CONVERSIONS", {k: v for k, v in conv.CONVERSIONS.items() if k[0] == "fp8_e4m3"})

    def killed(*a, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # as SIGINT/SIGTERM would: not an Exception, so nothing records it

    monkeypatch.setattr(prb, "probe", killed)
    with pytest.raises(KeyboardInterrupt):
        ra.main(["--out", str(tmp_path), "--rows", "64", "--conv-random", "100"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["partial"] and len(res["conversions"]) == 2 and [m["mismatches"] for m in res["mma"]] == [0, 0, 0]
    assert res["probe"] is None and "finished" not in res
    assert "**Partial: the run stopped" in (tmp_path / "results.md").read_text()
