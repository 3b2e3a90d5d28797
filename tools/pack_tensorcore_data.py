"""Pack the published Tensor Core measurements into the compact form the tests ship with.

Source: a folder laid out as ``<GPU>/<input format>/{a,b,c,d}_*.txt`` (Khattak & Mikaitis,
``north-numerical-computing/MATLAB-tensor-core``, ``model_validation/``, BSD-2-Clause), e.g. the project's
``../shared/data/tensorcore-hw``. Output: ``tests/data/tensorcore-hw/rows.npz``, one uint32 array per file
(the binary32 words, nothing converted), plus the SHA-256 of every source file in ``SOURCES.txt`` so that
a reader can check the packed rows against the published text. ``allow_pickle=False`` loads it.

    python tools/pack_tensorcore_data.py ../shared/data/tensorcore-hw
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "tensorcore-hw"


def read_words(path: Path) -> np.ndarray:
    """A text file of the published layout as uint32 words: hex words per row (a, b) or 32-bit binary strings."""
    lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
    base = 16 if path.name[0] in "ab" else 2
    return np.array([[int(w, base) for w in ln] for ln in lines], dtype=np.uint32).squeeze(axis=-1 if base == 2 else ())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    src = Path(argv[0])
    arrays: dict[str, np.ndarray] = {}
    sums = []
    for f in sorted(src.glob("*/*/*.txt")):
        rel = f.relative_to(src)
        arrays[str(rel.with_suffix(""))] = read_words(f)
        sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {rel}")
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "rows.npz", **arrays)
    (OUT / "SOURCES.txt").write_text("\n".join(sums) + "\n")
    print(f"{len(arrays)} files -> {OUT / 'rows.npz'} ({(OUT / 'rows.npz').stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
