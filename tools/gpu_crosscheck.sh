#!/usr/bin/env bash
# Run fpsim's GPU cross-checks and probe on CUDA device 0 and write results.json / results.md.
# Needs CuPy and an NVIDIA GPU (sm_80+, FP8 paths sm_89+). About 2-4 minutes on an H200.
#   tools/gpu_crosscheck.sh [OUT_DIR] [extra args for python -m fpsim.gpu.run_all, e.g. --as h200]
set -euo pipefail
out="${1:-gpu-results}"
shift || true
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv 2>/dev/null || true
python3 -c "import cupy; print('cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion())" 2>/dev/null || echo "cupy: not importable"
rc=0
python3 -m fpsim.gpu.run_all --out "$out" "$@" || rc=$?
python3 -m pytest tests/test_gpu*.py -q -m gpu -p no:cacheprovider || true
exit $rc
