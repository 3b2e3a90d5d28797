"""NVIDIA presets cross-checked against MMA-Sim, and the presets added from it (registered at import).

MMA-Sim (``mmasim.nv_ptx``, Microsoft) models ``mma.sync`` from Volta to sm_120, Hopper ``wgmma`` and Blackwell
``tcgen05.mma``. ``tests/test_mma_mmasim_nvidia.py`` compares every fpsim NVIDIA preset MMA-Sim has an
instruction for on random chained inputs (and the published hardware rows), and this module records the outcome
as the :data:`~fpsim.mma.presets.MMA_SIM` provenance level. It also registers the data paths that only MMA-Sim
describes:

* ``h100``/``h200`` ``path="wgmma"``: ``wgmma.mma_async`` FP8 -> fp32 (the default FP8 -> fp32 model) and FP8 ->
  fp16 (32 products, 13-bit grid, C inside, RNE to fp16; the default FP8 -> fp16 preset is ``mma.sync``, V1);
* ``b200`` ``path="tcgen05"`` FP8 -> fp16, and ``kind::f8f6f4`` with fp6/fp4 inputs of one type (A and B of
  different types: :func:`fpsim.mma.block_scaled_model`);
* ``rtx5090`` (sm_120 ``mma.sync``): fp16/bf16/tf32, FP8 and fp6/fp4 (``kind::f8f6f4``);
* ``t4`` (Turing, sm_75 ``mma.sync.m16n8k8``): fp16 -> fp32 / fp16, with Ampere's block parameters;
* the block-scaled kinds (``mxf8f6f4``, ``mxf4``, ``mxf4nvf4``) as table entries whose model is a
  :class:`~fpsim.mma.blockscaled.BlockScaledModel` (``usage`` says how to build it).

Known difference (all fp16-output presets, fpsim's and these): fpsim takes C's exponent from its binary32
encoding, MMA-Sim clamps it at fp16's ``emin`` (-14). The two differ only when C is an fp16 subnormal and the
products lie below ``2**-14``, near a rounding tie; no published hardware row exercises that case.
"""

from __future__ import annotations

from ..formats import as_format
from .model import MMAModel
from .presets import MMA_SIM, DeviceInfo, Provenance, add_provenance, register_device, register_preset

__all__: list[str] = []

_SRC = "MMA-Sim 2.1.1 (mmasim.nv_ptx.sim: {}), Microsoft"
_T = "tests/test_mma_mmasim_nvidia.py::{}"
_FP8 = ("fp8_e4m3", "fp8_e5m2")
_NARROW = ("fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
_FP16_NOTE = ("fp16 output: fpsim takes C's exponent from its binary32 encoding where MMA-Sim clamps it at -14; "
              "they differ only for an fp16-subnormal C with products below 2**-14 at a rounding tie "
              "(no published row has one; e.g. C = 2**-23 with products 2**-25 + 2**-40: fpsim 3*2**-24, MMA-Sim "
              "2*2**-24, tests/test_mma_mmasim_nvidia.py::test_fp16_output_subnormal_c_known_difference)")

# (device, input, output, path) of existing NVIDIA presets -> MMA-Sim operation they agree with.
_AGREE: dict[tuple[str, str, str, str | None], str] = {}
for _d in ("v100",):
    _AGREE[(_d, "fp16", "fp32", None)] = "MMA('Volta', 'm8n8k4.f32.f16.f16.f32')"
    _AGREE[(_d, "fp16", "fp16", None)] = "MMA('Volta', 'm8n8k4.f16.f16.f16.f16')"
for _d, _arch in (("a100", "Ampere"), ("ada", "Ada Lovelace"), ("h100", "Hopper"), ("b200", "Blackwell")):
    _AGREE[(_d, "fp16", "fp32", None)] = f"MMA('{_arch}', 'm16n8k16.f32.f16.f16.f32')"
    _AGREE[(_d, "fp16", "fp16", None)] = f"MMA('{_arch}', 'm16n8k16.f16.f16.f16.f16')"
    _AGREE[(_d, "bf16", "fp32", None)] = f"MMA('{_arch}', 'm16n8k16.f32.bf16.bf16.f32')"
    _AGREE[(_d, "tf32", "fp32", None)] = f"MMA('{_arch}', 'm16n8k8.f32.tf32.tf32.f32')"
for _f in _FP8:
    _t = _f[-4:]
    _AGREE[("ada", _f, "fp32", None)] = f"MMA('Ada Lovelace', 'm16n8k32.f32.{_t}.{_t}.f32')"
    _AGREE[("ada", _f, "fp16", None)] = f"MMA('Ada Lovelace', 'm16n8k32.f16.{_t}.{_t}.f16')"
    _AGREE[("h100", _f, "fp32", None)] = f"WGMMA('Hopper', 'm64nNk32.f32.{_t}.{_t}')"
    _AGREE[("b200", _f, "fp32", "tcgen05")] = f"TCGen05MMA('Blackwell', 'm128nNk32.kind::f8f6f4.f32.{_t}.{_t}')"


def _register() -> None:
    # 1. MMA-Sim level on the NVIDIA presets it agrees with.
    for (dev, fin, fout, path), op in _AGREE.items():
        note = "bit-identical on random chained inputs with zeros, subnormals and specials"
        if path == "tcgen05":
            note += "; no hardware rows"
        if dev in ("v100", "a100", "ada", "h100"):
            note += "; MMA-Sim also reproduces the shipped published rows of this pair"
        if fout == "fp16":
            note += "; " + _FP16_NOTE
        if dev == "h100" and fin in _FP8:
            note += "; MMA-Sim also puts a nonzero C inside the 13-bit window, as this model does"
        add_provenance(dev, fin, fout, MMA_SIM, source=_SRC.format(op), note=note, path=path,
                       tests=(_T.format("test_presets_agree_with_mmasim"),))

    def mk(name: str, fin: str, fout: str, k: int, neab: int, source: str, mel: int | None = None) -> MMAModel:
        to16 = fout == "fp16"
        m = MMAModel(name=name, kind="bfma", input=as_format(fin), output=as_format(fout), k=k, neab=neab,
                     mel=mel if mel is not None else -21 if to16 else -133, rounding="rne" if to16 else "rz",
                     mb=10 if to16 else (13 if neab == -10 else 23), source=source,
                     confidence="agrees with MMA-Sim (tests/test_mma_mmasim_nvidia.py); no hardware rows")
        object.__setattr__(m, "__doc__", m.describe())
        return m

    def reg(dev: str, fin: str, fout: str, path: str | None, k: int, neab: int, op: str, note: str = "",
            mel: int | None = None) -> None:
        src = _SRC.format(op)
        label = f"{dev} {fin}->{fout}" + ("" if path is None else f" ({path})")
        full = "bit-identical to MMA-Sim on random chained inputs with zeros, subnormals and specials; no hardware rows"
        if fout == "fp16":
            full += "; " + _FP16_NOTE
        if note:
            full += "; " + note
        register_preset(dev, fin, fout, path=path, provenance=Provenance(MMA_SIM, src, full,
                        (_T.format("test_added_presets_agree_with_mmasim"),)),
                        build=(lambda a, b, c, d, e, f, g: lambda: mk(a, b, c, d, e, f, g))(label, fin, fout, k, neab,
                                                                                          src, mel))

    # 2. Hopper wgmma FP8 (both outputs) as an explicit path.
    for dev in ("h100", "h200"):
        for f in _FP8:
            t = f[-4:]
            reg(dev, f, "fp32", "wgmma", 32, -10, f"WGMMA('Hopper', 'm64nNk32.f32.{t}.{t}')",
                "the same model as the default FP8 -> fp32 preset (published WGMMA rows, C = 0)")
            reg(dev, f, "fp16", "wgmma", 32, -10, f"WGMMA('Hopper', 'm64nNk32.f16.{t}.{t}')",
                "wgmma only: the default FP8 -> fp16 preset is mma.sync (variant V1), which MMA-Sim does not model")
    # 3. B200 tcgen05: FP8 -> fp16, and fp6/fp4 kind::f8f6f4 (one type for A and B).
    for f in _FP8 + _NARROW:
        t = f[-4:]
        outs = ("fp16",) if f in _FP8 else ("fp32", "fp16")
        for fout in outs:
            d = "f32" if fout == "fp32" else "f16"
            paths: tuple[str | None, ...] = ("tcgen05",) if f in _FP8 else (None, "tcgen05")
            for path in paths:
                reg("b200", f, fout, path, 32, 2, f"TCGen05MMA('Blackwell', 'm128nNk32.kind::f8f6f4.{d}.{t}.{t}')")
    # 4. sm_120 (RTX Blackwell) mma.sync.
    register_device(DeviceInfo("rtx5090", "RTX Blackwell (sm_120)", "rtx_blackwell",
                               "MMA-Sim only: no published hardware rows"),
                    aliases=("sm120", "sm120a", "rtxblackwell", "rtx5080", "rtxpro6000", "gb202"))
    arch = "RTX Blackwell"
    for fin, fout, k, shape in (("fp16", "fp32", 16, "m16n8k16.f32.f16.f16.f32"),
                                ("fp16", "fp16", 16, "m16n8k16.f16.f16.f16.f16"),
                                ("bf16", "fp32", 16, "m16n8k16.f32.bf16.bf16.f32"),
                                ("tf32", "fp32", 8, "m16n8k8.f32.tf32.tf32.f32")):
        reg("rtx5090", fin, fout, None, k, 2, f"MMA('{arch}', '{shape}')")
    for f in _FP8 + _NARROW:
        t = f[-4:]
        for fout in ("fp32", "fp16"):
            d = "f32" if fout == "fp32" else "f16"
            reg("rtx5090", f, fout, None, 32, 2, f"MMA('{arch}', 'm16n8k32.kind::f8f6f4.{d}.{t}.{t}.{d}')",
                "kind::f8f6f4 (the sm_89-style FP8 shape has the same numerics in MMA-Sim)" if f in _FP8 else "")
    # 5. Turing (sm_75) mma.sync.m16n8k8 fp16: MMA-Sim's Turing parameters are Ampere's (F = 24 bits, 8 products
    # per block, exponent floors -132 / -20); no hardware rows or document state them for Turing.
    for fout, mel in (("fp32", -132), ("fp16", -20)):
        d = "f32" if fout == "fp32" else "f16"
        reg("t4", "fp16", fout, None, 8, 1, f"MMA('Turing', 'm16n8k8.{d}.f16.f16.{d}')",
            "mma.sync.m16n8k8 (Turing's own shape; MMA-Sim gives Turing's m8n8k4 Volta's parameters, as v100)",
            mel=mel)
    # 6. Block-scaled kinds: table entries (their model is a BlockScaledModel).
    for dev, inst in (("b200", "TCGen05MMABlockScale('Blackwell', ...)"),
                      ("rtx5090", "MMABlockScale('RTX Blackwell', ...)")):
        for kind, elems in (("mxf8f6f4", ("fp8_e4m3", "fp8_e5m2") + _NARROW), ("mxf4", ("fp4_e2m1",)),
                            ("mxf4nvf4", ("fp4_e2m1",))):
            tname = "mxf8f6f4" if kind == "mxf8f6f4" else "mxf4"
            epi = ("; with NVFP4 ScaledTensor operands the per-tensor global-scale epilogue is an assumption "
                   "(cuBLAS alpha: D = RN(RN(g_a g_b) acc + C)): the block-scaled chain is MMA-Sim-checked, the "
                   "epilogue is not (its test re-applies the same formula)") if kind == "mxf4nvf4" else ""
            for f in elems:
                register_preset(
                    dev, f, "fp32", path=kind, build=None,
                    usage=(f"fpsim.mma.block_scaled_model({dev!r}, {kind!r}, {f!r}[, b]) with "
                           "fpsim.matmul(..., scales=)"),
                    provenance=Provenance(MMA_SIM, _SRC.format(inst),
                                          "bit-identical on random chained inputs (every A x B type pair, typical, "
                                          "extreme and NaN scales, zeros, specials); no hardware rows" + epi,
                                          (f"tests/test_mma_blackwell.py::test_{tname}_matches_mmasim",)))


_register()
