"""The memory ledger, measured: what a real training step holds for its backward pass, and what it costs.

:func:`measure_step` runs real :meth:`Trainer.step` calls (forward, backward, optimizer update, with the
policy) while :func:`fpsim.nn.recompute.tracing` reports every point where the set of arrays kept for
the backward pass changes (end of the forward pass; each freed layer; each recomputed block or
attention core, whose cache exists only while its backward runs). At each point the arrays are walked
(:func:`fpsim.nn.saved.saved_tensors`) and their bytes counted from the arrays themselves, each
underlying buffer once (views share their base), parameters left out; the peak over the step is kept
with its breakdown by kind and by layer. Two counts: ``carrier`` bytes (what NumPy holds: fpsim carries
BF16 values in float32) and ``device`` bytes (the same elements at the width of the format the policy
rounded them to: what a GPU kernel would store). GEMM FLOPs are counted as the GEMMs run (a counting
wrapper around the runtime's ``matmul`` / ``matmul_backward``), split into forward, backward and
recomputation; time is the step's wall time.

>>> from fpsim.nn import GPTConfig
>>> from fpsim.train import TrainConfig, measure_step
>>> cfg = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 4}, batch_size=2, steps=1,
...                   model=GPTConfig(vocab_size=6, block_size=8, n_layer=2, n_head=2, n_embd=8))
>>> none, blocks = measure_step("fp32", cfg), measure_step("fp32", cfg, checkpoint="blocks")
>>> blocks.peak_bytes < none.peak_bytes, blocks.flops > none.flops
(True, True)
>>> blocks.flops_by_phase["recompute"] == none.flops_by_phase["forward"] - 2 * 2 * 8 * 8 * 6
True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .._checks import check_bool, check_int
from .._fpenv import ieee_mode
from .._names import parse_name
from ..amp import Policy, get_policy
from ..amp.policy import OPS
from ..formats import Format
from ..nn.gpt import GPTConfig
from ..nn.recompute import tracing
from ..nn.saved import SavedTensor, buffer_of, core_tensors, saved_tensors
from ._settings import demo_settings
from .data import get_task
from .loop import TrainConfig, Trainer

__all__ = ["StepLedger", "checkpoint_table", "expected_activation_bytes", "korthikanti_layer_bytes",
           "measure_checkpointing", "measure_step"]

#: Kinds that are weight memory, not activations (listed in ``by_kind`` but not in ``peak_bytes``).
WEIGHT_KINDS = frozenset({"weight_copy"})


@ieee_mode
@dataclass
class StepLedger:
    """What one training step held for its backward pass (at the peak) and what it computed.

    Bytes are ``carrier`` (NumPy's) unless named ``device`` (at the stored format's width); see
    :mod:`fpsim.train.ledger`. ``peak_bytes`` / ``peak_device_bytes`` count activations only (parameters
    and weight copies excluded); ``by_kind`` / ``by_layer`` (and ``*_device``, taken at the device peak)
    break the peak down (kind ``weight_copy`` is listed there but not in the totals);
    ``by_site_device``: per saved tensor (``"h0.attn.qk.a"``, ``"h1.gelu.tanh"``, ...) at the device peak.
    ``peak_event`` / ``peak_device_event``: where each peak happened (``"forward"``: the end of the
    forward pass; ``"recompute h1"``: while block 1's recomputed cache existed). ``timeline``: ``(event,
    carrier bytes, device bytes)`` in order. ``flops``: GEMM FLOPs (2 M N K each) of the step,
    ``flops_by_phase`` split into ``forward``, ``backward``, ``recompute``. ``seconds``: wall time of
    the step (median over the measured steps, the ledger's own walking time subtracted).
    ``policy_state_bytes``: the runtime's persistent FP8 scales and amax histories and QAT observers
    after the step (not activations; the same in every mode); ``fp8_state_bytes`` the FP8 part.
    """

    policy: str
    checkpoint: str | int
    attention: str
    n_layer: int
    batch: int
    seq_len: int
    peak_bytes: int
    peak_device_bytes: int
    peak_event: str
    peak_device_event: str
    by_kind: dict[str, int]
    by_kind_device: dict[str, int]
    by_layer: dict[str, int]
    by_layer_device: dict[str, int]
    by_site_device: dict[str, int]
    weight_copy_bytes: int
    timeline: list[tuple[str, int, int]]
    flops: int
    flops_by_phase: dict[str, int]
    seconds: float
    policy_state_bytes: int
    fp8_state_bytes: int
    steps: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Tokens in the step's batch (B x T)."""
        return self.batch * self.seq_len

    @property
    def bytes_per_token(self) -> float:
        """Measured peak activation bytes (carrier) per token."""
        return self.peak_bytes / self.tokens

    @property
    def device_bytes_per_token(self) -> float:
        """Measured peak activation bytes at the stored formats' widths, per token."""
        return self.peak_device_bytes / self.tokens

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able), with ``tokens``, ``bytes_per_token`` and ``device_bytes_per_token``."""
        d = asdict(self)
        d["timeline"] = [list(t) for t in self.timeline]
        d.update(tokens=self.tokens, bytes_per_token=self.bytes_per_token,
                 device_bytes_per_token=self.device_bytes_per_token)
        return d


def _width(t: SavedTensor, pol: Policy | None) -> float:
    """Bytes per element of ``t`` as the policy stores it (judged by the array, not its buffer, whose
    dtype may differ: a kernel may write a float32 result through a uint32 view)."""
    dt = np.asarray(t.array).dtype
    item = float(dt.itemsize)
    if dt.kind != "f" or pol is None:
        return item
    by = t.produced_by
    if isinstance(by, Format):
        w = by.width / 8
    elif by == "weight":
        w = pol.params.width / 8
    elif by == "gemm":
        w = pol.activations.width / 8
    elif isinstance(by, str) and by in OPS:
        w = 4.0 if by in pol.fp32_ops else pol.activations.width / 8
    else:
        w = item
    return min(w, item)


class _Tracer:
    """Counts the live arrays at each event of a traced step and the GEMM FLOPs by phase."""

    def __init__(self, pol: Policy | None) -> None:
        self.pol = pol
        self.param_ids: set[int] = set()
        self.live: Mapping[str, Any] = {}
        self.timeline: list[tuple[str, int, int]] = []
        self.peak: tuple[int, str, dict[str, int], dict[str, int], int] | None = None
        self.peak_d: tuple[int, str, dict[str, int], dict[str, int], dict[str, int]] | None = None
        self.phases: list[str] = []
        self.flops: dict[str, int] = {"forward": 0, "backward": 0, "recompute": 0}
        self.overhead = 0.0

    # -- nn.recompute.Tracer
    def event(self, name: str, live: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        if params:
            self.param_ids = {id(buffer_of(v)) for v in params.values() if isinstance(v, np.ndarray)}
        self.live = live
        self._measure(name, saved_tensors(live))
        self.overhead += time.perf_counter() - t0

    def transient(self, name: str, layer: str, cache: Any) -> None:
        t0 = time.perf_counter()
        core, prec = cache
        site = layer
        self._measure(name, _chain(saved_tensors(self.live), core_tensors(layer.split(".")[0], site, core, prec)))
        self.overhead += time.perf_counter() - t0

    def phase_begin(self, phase: str, what: str) -> None:
        self.phases.append(phase)

    def phase_end(self, phase: str, what: str) -> None:
        if self.phases:
            self.phases.pop()

    # -- counting
    def add_flops(self, n: int) -> None:
        ph = self.phases[-1] if self.phases else "forward"
        self.flops[ph] = self.flops.get(ph, 0) + int(n)

    def _measure(self, name: str, records: Iterable[SavedTensor]) -> None:
        keep: list[Any] = []  # hold every record: ids must stay unique during the walk
        seen: set[int] = set()
        kinds: dict[str, int] = {}
        kinds_d: dict[str, int] = {}
        layers: dict[str, int] = {}
        layers_d: dict[str, int] = {}
        sites_d: dict[str, int] = {}
        tot = tot_d = wcopy = 0
        for t in records:
            keep.append(t)
            buf = buffer_of(t.array)
            k = id(buf)
            if k in seen or k in self.param_ids:
                continue
            seen.add(k)
            nb = int(buf.nbytes)
            nd = int(round(nb / max(np.asarray(t.array).dtype.itemsize, 1) * _width(t, self.pol)))
            kinds[t.kind] = kinds.get(t.kind, 0) + nb
            kinds_d[t.kind] = kinds_d.get(t.kind, 0) + nd
            if t.kind in WEIGHT_KINDS:
                wcopy += nb
                continue
            layers[t.layer] = layers.get(t.layer, 0) + nb
            layers_d[t.layer] = layers_d.get(t.layer, 0) + nd
            sites_d[t.site] = sites_d.get(t.site, 0) + nd
            tot += nb
            tot_d += nd
        self.timeline.append((name, tot, tot_d))
        if self.peak is None or tot > self.peak[0]:
            self.peak = (tot, name, kinds, layers, wcopy)
        if self.peak_d is None or tot_d > self.peak_d[0]:
            self.peak_d = (tot_d, name, kinds_d, layers_d, sites_d)


def _chain(*its: Iterable[SavedTensor]) -> Iterable[SavedTensor]:
    for it in its:
        yield from it


def _mm_flops(a: np.ndarray, b: np.ndarray) -> int:
    """2 M N K times the batch of ``a (..., M, K) @ b (..., K, N)``."""
    batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))) if a.ndim > 2 or b.ndim > 2 else 1
    return 2 * batch * int(a.shape[-2]) * int(a.shape[-1]) * int(b.shape[-1])


class _Counting:
    """Wraps a runtime's GEMM entry points (instance attributes, removed again by :meth:`remove`)."""

    NAMES = ("matmul", "matmul_backward", "matmul_accumulate")

    def __init__(self, rt: Any, tracer: _Tracer) -> None:
        self.rt = rt
        self.installed: list[str] = []
        mm, mmb = rt.matmul, rt.matmul_backward

        def matmul(a: np.ndarray, b: np.ndarray, site: str, kind: str, bias: np.ndarray | None = None) -> Any:
            tracer.add_flops(_mm_flops(np.asarray(a), np.asarray(b)))
            return mm(a, b, site, kind, bias=bias)

        def matmul_backward(dout: np.ndarray, cache: Any) -> Any:
            da, db, dbias = mmb(dout, cache)
            d = np.asarray(dout)
            tracer.add_flops(2 * 2 * int(np.prod(d.shape[:-1])) * int(d.shape[-1]) * int(np.shape(da)[-1]))
            return da, db, dbias

        fns: dict[str, Any] = {"matmul": matmul, "matmul_backward": matmul_backward}
        acc = getattr(rt, "matmul_accumulate", None)
        if acc is not None:
            def matmul_accumulate(a: np.ndarray, b: np.ndarray, *args: Any, **kw: Any) -> Any:
                tracer.add_flops(_mm_flops(np.asarray(a), np.asarray(b)))
                return acc(a, b, *args, **kw)

            fns["matmul_accumulate"] = matmul_accumulate
        for k, f in fns.items():
            setattr(rt, k, f)
            self.installed.append(k)

    def remove(self) -> None:
        for k in self.installed:
            try:
                delattr(self.rt, k)
            except AttributeError:
                pass
        self.installed = []


def _policy_state_bytes(rt: Any) -> tuple[int, int]:
    fp8 = sum(int(np.asarray(ds.amax_history).nbytes) + 4 for ds in getattr(rt, "_fp8", {}).values())
    obs = sum(int(np.asarray(v).nbytes) for v in getattr(rt, "_obs", {}).values())
    return fp8 + obs, fp8


def _default_config() -> TrainConfig:
    return demo_settings(quick=True).train_config()


@ieee_mode
def measure_step(policy: Policy | str | Trainer = "fp32", config: TrainConfig | None = None, *,
                 checkpoint: str | int | None = None, attention: str | None = None,
                 repeat: int = 1) -> StepLedger:
    """Measure real training steps: peak activation bytes held for the backward pass, GEMM FLOPs, time.

    Parameters
    ----------
    policy : Policy, str or Trainer
        A policy (a fresh ``Trainer(policy, config)`` is built, so every call starts from the same
        weights and batch), or a :class:`Trainer` whose next steps are measured in place (they are real
        training steps and advance it).
    config : TrainConfig, optional
        Default: the quick demo's (:func:`fpsim.train.demo.demo_settings`). Must be None with a Trainer.
    checkpoint, attention : optional
        Override the model's ``GPTConfig.checkpoint`` / ``GPTConfig.attention`` for the measurement
        (validated by :class:`~fpsim.nn.GPTConfig`); None keeps the config's.
    repeat : int
        Steps to run; memory and FLOPs come from the first, ``seconds`` is the median over all.

    Returns
    -------
    StepLedger

    Examples
    --------
    >>> from fpsim.train import measure_step
    >>> led = measure_step("bf16-mixed")
    >>> led.peak_event, led.peak_device_bytes < led.peak_bytes
    ('forward', True)
    """
    repeat = check_int(repeat, "repeat", lo=1)
    if isinstance(policy, Trainer):
        if config is not None:
            raise ValueError("measure_step: config is the Trainer's own; pass config=None with a Trainer")
        tr = policy
    else:
        pol = get_policy(policy)
        cfg = _default_config() if config is None else config
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"config must be a TrainConfig or None, got {type(cfg).__name__}")
        tr = Trainer(pol, cfg)
    old_model = tr.model
    changes: dict[str, Any] = {}
    if checkpoint is not None:
        changes["checkpoint"] = checkpoint
    if attention is not None:
        changes["attention"] = attention
    model: GPTConfig = replace(old_model, **changes) if changes else old_model
    rt = tr.runtime
    tracer = _Tracer(tr.policy)
    x, _ = tr.batch(tr.step_count)
    B, T = (int(s) for s in x.shape)
    times: list[float] = []
    tr.model = model
    try:
        for r in range(int(repeat)):
            if r == 0:
                counting = _Counting(rt, tracer)
                try:
                    with tracing(tracer):
                        t0 = time.perf_counter()
                        tr.step()
                        times.append(time.perf_counter() - t0 - tracer.overhead)
                finally:
                    counting.remove()
            else:
                t0 = time.perf_counter()
                tr.step()
                times.append(time.perf_counter() - t0)
    finally:
        tr.model = old_model
    assert tracer.peak is not None and tracer.peak_d is not None
    tot, ev, kinds, layers, wcopy = tracer.peak
    tot_d, ev_d, kinds_d, layers_d, sites_d = tracer.peak_d
    ps, fp8 = _policy_state_bytes(rt)
    return StepLedger(
        policy=tr.policy.name, checkpoint=model.checkpoint, attention=model.attention, n_layer=model.n_layer,
        batch=B, seq_len=T, peak_bytes=tot, peak_device_bytes=tot_d, peak_event=ev, peak_device_event=ev_d,
        by_kind=kinds,
        by_kind_device=kinds_d, by_layer=layers, by_layer_device=layers_d, by_site_device=sites_d,
        weight_copy_bytes=wcopy,
        timeline=tracer.timeline, flops=int(sum(tracer.flops.values())), flops_by_phase=dict(tracer.flops),
        seconds=float(statistics.median(times)), policy_state_bytes=ps, fp8_state_bytes=fp8, steps=int(repeat))


#: The checkpointing modes the demo and the benchmark measure.
MODES: tuple[str | int, ...] = ("none", "blocks", 2, "selective")


@ieee_mode
def measure_checkpointing(policy: Policy | str = "fp32", config: TrainConfig | None = None, *,
                          modes: Sequence[str | int] = MODES, attention: str | None = None,
                          repeat: int = 1) -> dict[str, StepLedger]:
    """:func:`measure_step` for each checkpointing mode (each from the same fresh start), keyed by
    ``str(mode)``.

    >>> from fpsim.train.ledger import measure_checkpointing
    >>> t = measure_checkpointing("fp32", modes=("none", "selective"))
    >>> t["selective"].by_kind.get("softmax", 0) < t["none"].by_kind["softmax"]
    True
    """
    if isinstance(modes, (str, int)) or not isinstance(modes, Sequence) or not modes:
        raise TypeError(f"modes must be a non-empty sequence of checkpoint modes, got {modes!r}")
    return {str(m): measure_step(policy, config, checkpoint=m, attention=attention, repeat=repeat) for m in modes}


@ieee_mode
def expected_activation_bytes(cfg: GPTConfig, policy: Policy | str, batch: int, seq_len: int | None = None,
                              *, quant_active: bool = True) -> dict[str, int]:
    """Device bytes the tiny GPT keeps for its backward pass, from its layer inventory (not measured).

    The model's saved tensors, counted by hand per layer (standard attention, flash below; ``N = batch * seq_len``
    tokens, width ``C``, ``H`` heads, ``a`` the activation format's bytes, 4 for what stays FP32):

    - per block: LayerNorm x-hat and 1/std twice (``2 (4 N C + 4 N)``); the inputs of the four linear
      GEMMs (``N C a`` for qkv, attention output and MLP input, ``4 N C a`` for the MLP projection; 1
      byte each and two 4-byte scales per GEMM under FP8; plus a 1-byte straight-through mask per element
      under QAT); q, k, v (``3 N C a``); the GELU input (``4 N C a``) and its tanh (``4 N C 4``); the
      softmax output in FP32 (``4 B H T^2``), its copy in the activation format as the P @ V operand
      (``B H T^2 a``; the same array when the activations are FP32) and the causal mask (``T^2``);
      a recomputed attention core also re-casts q, k, v (``3 N C a`` more while it exists, unless the
      activations are FP32, where the cast is the identity);
    - outside the blocks: token ids (``8 N``), the final LayerNorm (``4 N C + 4 N``), the lm_head input
      (``N C a``), the cross-entropy probabilities, targets and valid flags (``4 N V + 8 N + N``);
    - a checkpointed block keeps only its input (the residual stream, ``4 N C`` under every built-in
      policy); selective recomputation drops the three T^2 tensors of each block;
    - with ``cfg.attention == "flash"`` the core keeps no T^2 tensor: q, k and v (views of one ``3 N C a``
      buffer, as before), the output O as the kernel stores it (``N C a``) and the row log-sum-exp in FP32
      (``4 B H T``): ``core = N C a + 4 B H T``, linear in T. Selective recomputation is then a no-op (the
      model recomputes nothing more), so it counts as ``"none"``.

    Returns the pieces (``block``, ``block_selective``, ``core``, ``block_input``, ``head``, ``ids``) and
    ``peak``: the peak for ``cfg.checkpoint`` over the schedule of the backward pass (a layer's tensors
    are released when its backward ends; a recomputed block's cache exists while its backward runs).
    :func:`measure_step` must find exactly this ``peak`` as ``peak_device_bytes``: the tests hold them
    against each other.

    >>> from fpsim.nn import GPTConfig
    >>> e = expected_activation_bytes(GPTConfig(vocab_size=17, block_size=20, n_layer=2), "bf16-mixed", 32)
    >>> e["peak"] == e["ids"] + 2 * e["block"] + e["head"]
    True
    """
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
    pol = get_policy(policy)
    B = check_int(batch, "batch", lo=1)
    T = cfg.block_size if seq_len is None else check_int(seq_len, "seq_len", lo=1)
    if T > cfg.block_size:
        raise ValueError(f"seq_len {T} exceeds the model's block_size {cfg.block_size}")
    quant_active = check_bool(quant_active, "quant_active")
    N, C, H, V, L = B * T, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_layer
    a = pol.activations.width // 8
    fp32_act = pol.activations.name == "fp32"

    def w(op: str) -> int:
        return 4 if op in pol.fp32_ops else a

    def gemm_in(kind: str, elems: int) -> int:
        if pol.fp8 is not None and kind in pol.fp8.kinds:
            return elems * (pol.fp8.forward.width // 8) + 8
        if pol.quant is not None and kind in pol.quant.kinds and quant_active:
            return elems * a + elems
        return elems * a

    ln = 4 * N * C + 4 * N
    lin = gemm_in("linear", N * C) * 3 + gemm_in("linear", 4 * N * C)
    P = B * H * T * T
    flash = cfg.attention == "flash"
    if flash:
        core = N * C * w("scale") + 4 * B * H * T      # O (stored by prec.act(..., "scale")) and the FP32 lse
    else:
        core = 4 * P + (0 if fp32_act else P * a) + T * T
    # the recomputed core casts q, k, v again: copies (while the kept ones live) unless activations are FP32
    core_transient = core + (0 if fp32_act else 3 * N * C * a)
    qkv = 3 * N * C * a
    gelu = 4 * N * C * a + 4 * N * C * 4
    block_sel = 2 * ln + lin + qkv + gelu
    block = block_sel + core
    head = ln + gemm_in("lm_head", N * C) + 4 * N * V + 8 * N + N
    ids = 8 * N
    inputs = [N * C * w("embedding" if i == 0 else "residual") for i in range(L)]

    ck: str | int = "none" if flash and cfg.checkpoint == "selective" else cfg.checkpoint
    def kept(i: int) -> int:
        if ck == "blocks" or (isinstance(ck, int) and i % ck == 0):
            return inputs[i]
        return block_sel if ck == "selective" else block

    peak = ids + sum(kept(i) for i in range(L)) + head
    for i in reversed(range(L)):
        below = ids + sum(kept(j) for j in range(i))
        if ck == "blocks" or (isinstance(ck, int) and i % ck == 0):
            now = below + inputs[i] + block
        elif ck == "selective":
            now = below + block_sel + core_transient
        else:
            now = below + block
        peak = max(peak, now)
    return {"block": block, "block_selective": block_sel, "core": core, "block_input": inputs[-1],
            "head": head, "ids": ids, "peak": peak}


@ieee_mode
def korthikanti_layer_bytes(seq_len: int, batch: int, hidden: int, heads: int, mode: str = "none") -> int:
    """Korthikanti et al. (arXiv 2205.05198) activation bytes per transformer layer, 16-bit, no tensor
    or sequence parallelism: ``34 s b h + 5 a s^2 b`` (``"none"``), ``34 s b h`` (``"selective"``: the
    attention core recomputed, also what flash attention keeps), ``2 s b h`` (``"blocks"``: full
    recomputation keeps the layer input).

    >>> korthikanti_layer_bytes(2048, 1, 12288, 96)
    2868903936
    """
    s, b, h, a = (check_int(v, n, lo=1) for v, n in ((seq_len, "seq_len"), (batch, "batch"), (hidden, "hidden"),
                                                        (heads, "heads")))
    m = {"none": 34 * s * b * h + 5 * a * s * s * b, "selective": 34 * s * b * h, "blocks": 2 * s * b * h}
    return m[parse_name(mode, tuple(m), "mode")]


def _flash_ok(model: GPTConfig) -> bool:
    try:
        from ..nn.gpt import _attention_impl

        _attention_impl(replace(model, attention="flash"))
    except (ImportError, NotImplementedError, ValueError):
        return False
    return True


@ieee_mode
def checkpoint_table(policy: Policy | str = "bf16-mixed", config: TrainConfig | None = None, *,
                     modes: Sequence[str | int] = MODES, flash: bool | None = None,
                     repeat: int = 1) -> dict[str, Any]:
    """The checkpointing ledger of a model as plain data (the ``fpsim demo`` report's section).

    One :func:`measure_step` per mode (and, with ``flash`` — default: when flash attention is
    available — ``attention="flash"`` without and with ``"blocks"``). Returns ``{"policy", "model",
    "batch", "seq_len", "rows": [...], "korthikanti": {...}}``; each row has ``mode``, the ledger's
    ``to_dict()`` fields and the ratios to the ``"none"`` row (``memory_ratio``: device peak bytes,
    ``flops_ratio``, ``time_ratio``). ``korthikanti`` holds the paper's per-layer bytes for this shape
    (``none``, ``selective``, ``blocks``) beside the measured per-layer device bytes of block 0.

    >>> t = checkpoint_table("fp32", modes=("none", "blocks"), flash=False)
    >>> [r["mode"] for r in t["rows"]], t["rows"][1]["memory_ratio"] < 1 < t["rows"][1]["flops_ratio"]
    (['none', 'blocks'], True)
    """
    cfg = _default_config() if config is None else config
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"config must be a TrainConfig or None, got {type(cfg).__name__}")
    if isinstance(modes, (str, int)) or not isinstance(modes, Sequence) or not modes:
        raise TypeError(f"modes must be a non-empty sequence of checkpoint modes, got {modes!r}")
    model = cfg.model if cfg.model is not None else cfg.model_for(get_task(cfg.task, **cfg.task_kwargs))
    runs: list[tuple[str, StepLedger]] = [(str(m), measure_step(policy, cfg, checkpoint=m, attention="standard",
                                                               repeat=repeat)) for m in modes]
    if flash is None:
        flash = _flash_ok(model)
    flash = check_bool(flash, "flash")
    if flash:
        for m in ("none", "blocks"):
            runs.append((f"flash+{m}" if m != "none" else "flash",
                         measure_step(policy, cfg, checkpoint=m, attention="flash", repeat=repeat)))
    ref = dict(runs).get("none", runs[0][1])
    rows = []
    for name, led in runs:
        d = led.to_dict()
        d.update(mode=name, memory_ratio=led.peak_device_bytes / ref.peak_device_bytes,
                 carrier_ratio=led.peak_bytes / ref.peak_bytes, flops_ratio=led.flops / ref.flops,
                 time_ratio=led.seconds / ref.seconds if ref.seconds > 0 else float("nan"))
        rows.append(d)
    B, T = ref.batch, ref.seq_len
    k = {m: korthikanti_layer_bytes(T, B, model.n_embd, model.n_head, m) for m in ("none", "selective", "blocks")}
    measured = {name: led.by_layer_device.get("h0", 0) for name, led in runs if led.peak_device_event == "forward"}
    return {"policy": get_policy(policy).name, "model": model.as_dict(), "batch": B, "seq_len": T, "rows": rows,
            "korthikanti": {"per_layer_16bit": k, "measured_h0_device_at_forward_peak": measured}}
