#!/usr/bin/env bash
# Run fpsim's GPU cross-checks on CUDA device 0 from this source tree, installing nothing, and write every file
# under OUT: log.txt (everything printed), results.json / results.md (conversions, mma.sync and wgmma
# instructions, the probe = `fpsim probe`, cuBLAS through torch), env.txt, probe.json and pytest.txt (full mode).
#
#   tools/gpu_crosscheck.sh OUT [--quick] [--as PRESET_DEVICE]
#
# Needs: python3 with numpy; CuPy for the instruction checks, torch with CUDA for the cuBLAS checks (a part
# whose package or GPU is missing is recorded, the others still run). The C extensions are optional.
# Budget: the full run stays within 8 minutes and --quick within 2 (each step gets what is left of the budget).
# Exit status: 0 when everything ran and agreed, 1 otherwise (the files say what).
# Environment: PYTHON (default python3), FPSIM_BUDGET_S (overrides the time budget in seconds),
# FPSIM_TORCH_DEVICE (default cuda:0; cpu runs the torch calls on the CPU: wiring only, for tests).
set -uo pipefail

usage() { echo "usage: $0 OUT [--quick] [--as PRESET_DEVICE]" >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -*) usage ;; esac
out="$1"; shift
quick=0; as=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --as) [ $# -ge 2 ] || usage; as=(--as "$2"); shift ;;
        *) usage ;;
    esac
    shift
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out" || exit 1
out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
# Matplotlib and friends write caches under HOME: keep them under OUT too.
export MPLCONFIGDIR="$out/.cache/mpl" XDG_CACHE_HOME="$out/.cache"
py="${PYTHON:-python3}"
torch_device="${FPSIM_TORCH_DEVICE:-cuda:0}"  # "cpu" exercises the torch calls without a GPU (tests)
exec > >(tee "$out/log.txt") 2>&1
tee_pid=$!

if [ "$quick" = 1 ]; then budget="${FPSIM_BUDGET_S:-110}"; else budget="${FPSIM_BUDGET_S:-470}"; fi
start=$SECONDS
status=0
left() { echo $(( budget - (SECONDS - start) )); }
# step NAME PCT CMD...: run CMD with a timeout of min(PCT% of the budget, time left), record its status, never
# stop the script.
step() {
    local name="$1" cap=$(( budget * $2 / 100 )); shift 2
    local t; t=$(left); [ "$cap" -lt "$t" ] && t="$cap"
    if [ "$t" -lt 5 ]; then
        echo "== $name: not run, the time budget is spent"; status=1; return
    fi
    echo "== $name (at most ${t}s): $*"
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$t" "$@" || rc=$?
    [ "$rc" = 124 ] && echo "== $name: stopped after ${t}s (time budget)"
    echo "== $name: exit $rc after $(( SECONDS - t0 ))s"
    [ "$rc" = 0 ] || status=1
}

echo "fpsim GPU cross-check: repo $repo, out $out, quick=$quick, budget ${budget}s, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
{
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1 || echo "nvidia-smi: not available"
    "$py" - <<'EOF' 2>&1
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for mod in ("numpy", "cupy", "torch", "jax", "ml_dtypes", "fpsim"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"), getattr(m, "__file__", ""))
    except Exception as e:  # a missing package is a finding, not a failure
        print(mod, "not importable:", type(e).__name__, e)
try:
    import cupy
    print("cupy CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(), "devices", cupy.cuda.runtime.getDeviceCount())
except Exception as e:
    print("cupy device query:", type(e).__name__, e)
try:
    import torch
    print("torch CUDA", torch.version.cuda, "available", torch.cuda.is_available())
except Exception as e:
    print("torch device query:", type(e).__name__, e)
for ext in ("_ckernel", "_carith", "_cgemm", "_cfpenv"):  # optional: fpsim falls back to NumPy without them
    try:
        importlib.import_module("fpsim." + ext)
        print("C extension", ext, "built")
    except ImportError:
        print("C extension", ext, "absent (NumPy fallback)")
EOF
} | tee "$out/env.txt" || true
"$py" -c "import fpsim, fpsim.gpu; print('fpsim', fpsim.__version__ if hasattr(fpsim, '__version__') else '', 'from', fpsim.__file__)" \
    || { echo "fpsim does not import from $repo: nothing else can run"; exit 1; }

if [ "$quick" = 1 ]; then
    step run_all 68 "$py" -m fpsim.gpu.run_all --out "$out" ${as[@]+"${as[@]}"} --rows 512 --conv-random 65536
    step torch_check 23 "$py" -m fpsim.gpu.torch_check --out "$out" ${as[@]+"${as[@]}"} --torch-device "$torch_device" --quick
else
    step run_all 64 "$py" -m fpsim.gpu.run_all --out "$out" ${as[@]+"${as[@]}"}
    step torch_check 19 "$py" -m fpsim.gpu.torch_check --out "$out" ${as[@]+"${as[@]}"} --torch-device "$torch_device"
    # The probe as users run it (`fpsim probe`; run_all's probe section is the same call).
    step "fpsim probe" 9 sh -c '"$0" -m fpsim.cli probe --json --random-rows 8 > "$1/probe.json"' "$py" "$out"
    if "$py" -c "import pytest" 2>/dev/null; then
        step "pytest -m gpu" 13 "$py" -m pytest "$repo"/tests/test_gpu_device.py "$repo"/tests/test_gpu_wgmma.py \
            -q -m gpu -p no:cacheprovider -p no:randomly --junitxml "$out/pytest.xml"
    else
        echo "== pytest -m gpu: not run, pytest is not installed here"
    fi
fi
[ -s "$out/results.json" ] || { echo "no results.json was written"; status=1; }
echo "fpsim GPU cross-check: finished in $(( SECONDS - start ))s, status $status; files in $out:"
ls -l "$out"
# Let tee write the last lines of log.txt before the machine takes OUT back.
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null || true
exit $status
