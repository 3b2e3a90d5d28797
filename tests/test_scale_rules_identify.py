"""Named block-scale rules (SCALE_RULES, scale_rule=, scale_format=) and "which rule made these bytes?"
(identify_scale_rule, identify_quantizer) on bytes produced by the oracles: torchao's to_mx in each
ScaleCalculationMode and the onnx reference evaluator's opset-25 Cast in each round_mode."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
import fpsim.scaling as S
from fpsim.scaling import SCALE_RULES, identify_quantizer, identify_scale_rule, mx_quantize, mx_scales

from test_scale_rules_oracles import (  # the oracles' drivers and the data with special blocks
    ONNX_MODES,
    TAO_MODES,
    e8m0_bytes,
    onnx_known_deviation,
    onnx_scales,
    rceil_log2_inexact,
    special_blocks,
    torchao_mx,
)

N = 4000


def _coincide(x: np.ndarray, elem: str, given: np.ndarray) -> set[str]:
    """Every MX rule whose scales equal ``given`` (computed rule by rule, not through identify)."""
    with np.errstate(invalid="ignore"):
        am = np.max(np.abs(x), axis=1)
    return {n for n, r in SCALE_RULES.items() if r.applies_to == "mx"
            and np.array_equal(e8m0_bytes(mx_scales(am, elem, scale_rule=n)), given)}


@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp4_e2m1"])
@pytest.mark.parametrize("rule", list(TAO_MODES))
def test_identify_torchao_scales(rule: str, elem: str) -> None:
    x = special_blocks(N, 41, elem)
    sb, _ = torchao_mx(x, elem, TAO_MODES[rule])
    keep = ~rceil_log2_inexact(x, elem) if rule == "torchao-rceil" else np.ones(N, bool)  # torchao 0.18 bug
    x, sb = x[keep], sb.reshape(-1)[keep]
    rep = identify_scale_rule(x, sb, elem=elem)
    assert rule in rep.consistent, str(rep)
    assert set(rep.consistent) == _coincide(x, elem, sb)
    for n, d in rep.diffs.items():
        assert (d.mismatches == 0) == (n in rep.consistent)
        assert 0.0 <= d.fraction <= 1.0


@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp6_e3m2"])
@pytest.mark.parametrize("rule", list(ONNX_MODES))
def test_identify_onnx_scales(rule: str, elem: str) -> None:
    pytest.importorskip("onnx", reason="the onnx reference evaluator is the oracle")
    x = special_blocks(N, 42, elem)
    given = onnx_scales(x, elem, ONNX_MODES[rule])
    keep = ~onnx_known_deviation(x, elem, ONNX_MODES[rule])  # onnx 1.23's departures from its spec
    rep = identify_scale_rule(x[keep], given[keep], elem=elem)
    assert rule in rep.consistent, str(rep)
    assert set(rep.consistent) == _coincide(x[keep], elem, given[keep])


def test_identify_ocp_from_torchao_floor_finite() -> None:
    """OCP's floor: torchao FLOOR's bytes on finite blocks are OCP's (the two coincide there)."""
    x = special_blocks(N, 43, "fp8_e5m2")
    with np.errstate(invalid="ignore"):
        fin = np.isfinite(np.max(np.abs(x), axis=1))
    sb, _ = torchao_mx(x, "fp8_e5m2", "FLOOR")
    rep = identify_scale_rule(x[fin], sb.reshape(-1)[fin], elem="fp8_e5m2")
    assert {"ocp", "torchao-floor"} <= set(rep.consistent)
    assert "neuron-emax" not in rep.consistent and rep.diffs["neuron-emax"].steps == -1


def test_identify_reports_first_block_and_steps() -> None:
    rng = np.random.default_rng(44)
    x = (rng.standard_normal((6, 64)) * 100).astype(np.float32)
    _, s = mx_quantize(x, "fp8_e4m3", scale_rule="ocp")
    bytes_ = e8m0_bytes(s).astype(np.int64)
    bytes_[3, 1] += 2  # one block two steps up
    rep = identify_scale_rule(x, bytes_.astype(np.uint8), elem="fp8_e4m3")
    d = rep.diffs["ocp"]
    assert (d.mismatches, d.first, d.steps) == (1, (3, 1), 2)
    assert d.fraction == pytest.approx(1 / 12)
    assert "ocp" not in rep.consistent and "consistent" in str(rep)
    # float scale values are accepted as well as codes; flat scales too
    assert identify_scale_rule(x, s, elem="fp8_e4m3").consistent == \
        identify_scale_rule(x, e8m0_bytes(s).reshape(-1), elem="fp8_e4m3").consistent


def test_identify_along_axis_0() -> None:
    rng = np.random.default_rng(45)
    x = (rng.standard_normal((64, 3)) * 10).astype(np.float32)
    _, s = mx_quantize(x, "fp6_e2m3", axis=0, scale_rule="torchao-even")
    rep = identify_scale_rule(x, s, elem="fp6_e2m3", axis=0)
    assert "torchao-even" in rep.consistent


@pytest.mark.parametrize(("rule", "divisor"), [("torchao-floor", "2**-126"), ("torchao-rceil", "1")])
@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
def test_identify_quantizer_torchao(rule: str, divisor: str, elem: str) -> None:
    x = special_blocks(N, 46, elem)
    sb, codes = torchao_mx(x, elem, TAO_MODES[rule])
    rep = identify_quantizer(x, sb.reshape(-1, 1), codes, elem=elem)
    assert f"rne/saturate/{divisor}" in rep.consistent, str(rep)
    assert f"sr/saturate/{divisor}" in rep.consistent  # RNE's choices are among SR's two
    assert not any(c.startswith(("rtz", "rup", "rdn")) for c in rep.consistent)
    assert any("NaN-scale blocks" in n for n in rep.notes)


def test_identify_quantizer_overflow_and_rounding() -> None:
    rng = np.random.default_rng(47)
    x = (rng.standard_normal((50, 32)) * 50).astype(np.float32)
    _, s = mx_quantize(x, "fp8_e5m2")  # OCP floor: the block max may overflow the element format
    v = x.reshape(50, 1, 32) / s.reshape(50, 1, 1)
    for mode in ("rtz", "rup"):
        for over in ("saturate", "ieee"):
            q = fpsim.round(v.reshape(50, 32), "fp8_e5m2", mode, overflow=over)
            rep = identify_quantizer(x, s, np.asarray(q), elem="fp8_e5m2")
            assert f"{mode}/{over}/scale" in rep.consistent, str(rep)
            other = "ieee" if over == "saturate" else "saturate"
            if mode == "rup":  # rounding up overflows past max for some block: the two overflow modes split
                assert f"{mode}/{other}/scale" not in rep.consistent


def test_identify_rejects_bad_input() -> None:
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="not a value of e8m0"):
        identify_scale_rule(x, np.float32([0.75, 1.0]), elem="fp8_e4m3")
    with pytest.raises(ValueError, match="needs 2|blocks need 2"):
        identify_scale_rule(x, np.uint8([127, 127, 127]), elem="fp8_e4m3")
    with pytest.raises(ValueError, match="valid rules: .*ocp"):
        identify_scale_rule(x, np.uint8([127, 127]), elem="fp8_e4m3", rules=["nope"])
    with pytest.raises(ValueError, match="shape"):
        identify_quantizer(x, np.uint8([127, 127]), np.zeros((2, 31), np.uint8), elem="fp8_e4m3")


# ------------------------------------------------------------------------------------- the rule table


def test_rule_table_and_lookup() -> None:
    assert S.scale_rule("floor") is SCALE_RULES["ocp"] and S.scale_rule("CEIL") is SCALE_RULES["te"]
    for r in SCALE_RULES.values():
        assert r.source and r.formula and r.validated
    assert SCALE_RULES["neuron-emax"].validated == "unvalidated"
    assert S.rules_table().count("\n") == len(SCALE_RULES) + 1
    with pytest.raises(ValueError, match="valid rules"):
        S.scale_rule("round")
    with pytest.raises(TypeError, match="rule name"):
        S.scale_rule(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nvfp4_quantize"):
        mx_scales([1.0], "fp4_e2m1", scale_rule="nvfp4")


def test_scale_rounding_and_scale_rule_spellings() -> None:
    am = np.float32([500.0, 3.0, 0.0])
    assert np.array_equal(mx_scales(am, "fp8_e4m3", scale_rounding="ceil"), mx_scales(am, "fp8_e4m3",
                                                                                       scale_rule="te"))
    assert np.array_equal(mx_scales(am, "fp8_e4m3"), mx_scales(am, "fp8_e4m3", scale_rule="ocp"))
    with pytest.raises(ValueError, match="disagree"):
        mx_scales(am, "fp8_e4m3", scale_rounding="floor", scale_rule="te")


def test_neuron_emax_is_twice_ocp() -> None:
    rng = np.random.default_rng(48)
    am = np.abs(rng.standard_normal(1000) * 2.0 ** rng.integers(-60, 60, 1000)).astype(np.float32)
    for elem in ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1"):
        assert np.array_equal(mx_scales(am, elem, scale_rule="neuron-emax"),
                              2 * mx_scales(am, elem, scale_rule="ocp"))
        x = np.repeat(am[:, None], 32, axis=1)
        e, _ = mx_quantize(x, elem, scale_rule="neuron-emax")
        assert np.abs(e).max() <= fpsim.formats.as_format(elem).max  # the headroom: nothing needs to saturate


def test_inputs_not_modified() -> None:
    x = special_blocks(200, 49, "fp8_e4m3")
    x0 = x.copy()
    e, s = mx_quantize(x, "fp8_e4m3", scale_rule="torchao-even")
    s0, e0 = s.copy(), e.copy()
    identify_scale_rule(x, s, elem="fp8_e4m3")
    identify_quantizer(x, s, e, elem="fp8_e4m3")
    assert np.array_equal(x, x0, equal_nan=True) and np.array_equal(s, s0, equal_nan=True)
    assert np.array_equal(e, e0, equal_nan=True)


def test_scale_format_ue4m3_values() -> None:
    """Another scale format: rounded onto its grid in the rule's direction (fp8_e4m3's positive values, UE4M3)."""
    am = np.float32([6.0, 7.0, 100.0, 0.0, np.nan, 1e-9])
    s = mx_scales(am, "fp4_e2m1", scale_rule="onnx-up", scale_format="fp8_e4m3")
    assert s[0] == 1.0 and s[1] == 1.25 and s[2] == np.float32(18.0)  # 7/6 -> 1.25, 100/6 -> 18 (up)
    assert s[3] == 2.0**-9 and np.isnan(s[4]) and s[5] == 2.0**-9  # smallest positive e4m3
    e, s2 = mx_quantize(np.full((1, 16), 7.0, np.float32), "fp4_e2m1", block=16, scale_rule="onnx-up",
                        scale_format="fp8_e4m3")
    assert float(s2[0, 0]) == 1.25 and float(e[0, 0]) == 6.0  # 7 / 1.25 = 5.6 -> 6


def test_scale_format_ue5m3() -> None:
    try:
        fmt = fpsim.formats.as_format("ue5m3")
    except ValueError:
        pytest.skip("ue5m3 is not registered in this build (issue 28, item 4)")
    am = np.float32([6.0, 7.0, 1000.0])
    s = mx_scales(am, "fp4_e2m1", scale_rule="onnx-up", scale_format=fmt)
    assert np.all(s >= am / 6) and np.all(np.asarray(fpsim.round(s, fmt)) == s)
