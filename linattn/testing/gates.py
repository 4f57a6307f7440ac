"""Gate distributions of real hybrid models, for benchmarks, the fuzz suite and the GPU tests.

A model's log decay is ``g = -exp(A_log) * softplus(a + dt_bias)`` (GDN: one per value head; KDA:
one per key channel) or, with KDA's bounded gate, ``g = lower_bound * sigmoid(exp(A_log) * (a +
dt_bias))`` (docs/ops.md, "Gating"). Random ``A_log`` and ``logsigmoid(N(3, 1))`` gates (the "mild"
gates of the benchmarks) stay near ``-0.05`` per token; real models do not: Qwen3-Next's heads decay
by up to ``16 * softplus(1 + a)`` per token, and a strong KDA channel falls by more than ``e^-60``
over half a chunk, which sends linattn's KDA stage 1 to its exact "level path"
(docs/ops.md, "Numerical rules"). flashinfer-ai/flashinfer 3720 was a NaN that random ``A_log`` hid.

Each :class:`GateModel` holds one model's gate parameters **as its own initialisation draws them**
(read from transformers 5.24's modeling files, cited in ``source``) and its published head shape:

===================  ======  ====================  ======================================  ======
model                family  A = exp(A_log)        dt_bias                                 bound
===================  ======  ====================  ======================================  ======
qwen3-next           GDN     U(0.01, 16)           1                                        -
qwen3.5              GDN     U(0.01, 16)           1                                        -
olmo-hybrid          GDN     U(0, 16)              softplus^-1(max(logU(1e-3, 0.1), 1e-4))  -
kimi-linear          KDA     U(1, 16)              the same, per key channel               -
glm5-next            KDA     1 (A_log = 0)         the same, per key channel               -5
===================  ======  ====================  ======================================  ======

The gate input ``a`` is the gate projection's output at initialisation: weights ``N(0, 0.02^2)``
(``initializer_range``) on unit-RMS hidden states give ``a ~ N(0, (0.02 sqrt(d_in))^2)``, with
``d_in`` the hidden size (Kimi-Linear and GLM-5-Next: the product of the two low-rank projections,
hidden -> head_dim -> HV * K). ``beta = sigmoid(b)``, ``b ~ N(0, 1)``; OLMo-hybrid's
``allow_neg_eigval`` doubles it (beta in (0, 2)).

These are initialisations, not trained checkpoints (whose ``A_log`` and ``dt_bias`` move; none is
read here). They are far from the mild gates: Qwen3-Next's puts the median per-token log decay near
-10 (``A ~ U(0.01, 16)`` times ``softplus(1 + a) ~ 1.3``), so most of its heads forget within a few
tokens; Kimi-Linear's and GLM-5-Next's sit near -0.1 with a long tail.

**Strong-decay heads.** At initialisation no KDA channel decays by ``e^-60`` over half a chunk
(Kimi-Linear's steepest, ``A = 16`` and ``dt = 0.1``, decays by about 1.6 per token, 51 over 32
tokens); trained models have such heads (fast-forgetting, local heads), and they are the ones the
benchmarks never reached. So every ``strong_every``-th head (``hv % strong_every ==
strong_every - 1``; 1 in 8 by default) is a strong head: ``A`` at the top of the model's range,
``dt_bias`` at ``dt_max`` on every channel, and ``a`` shifted by ``strong_shift`` (4.0). This is
an assumption, stated as such (the shift is not from any checkpoint); with it, every full chunk of a
strong KDA head leaves the fast path (:func:`kda_fast_path_misses`) in both the softplus and the
bounded form.

Example:
    >>> from linattn.testing.gates import model_gates
    >>> mg = model_gates("qwen3-next", 128, hv=8, seed=0)
    >>> g, beta = mg.log_decay()
    >>> tuple(g.shape), bool((g <= 0).all()), mg.strong.tolist()[-1]
    ((128, 8), True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict

from linattn._namespace import public_dir

__all__ = ["KDA_FAST_SPAN", "KDA_BLOCK_K", "KDA_REF_ROW", "CHUNK", "G_FLOOR", "GATE_KINDS", "DEFAULT_MODEL",
           "STRONG_SHIFT", "STRONG_EVERY", "GateModel", "MODELS", "resolve", "ModelGates", "model_gates",
           "mild_gates", "gate_tensors", "kda_fast_path_misses", "decay_summary"]
__dir__ = public_dir(__name__, __all__)

#: The fast path of KDA's stage 1 needs every row's cumulative log decay within this of row 31's,
#: per block of ``KDA_BLOCK_K`` key channels (kernels/triton/chunk_intra.py, ``KDA_FAST_SPAN``; a
#: CPU test keeps the two equal).
KDA_FAST_SPAN = 60.0
KDA_BLOCK_K = 32
KDA_REF_ROW = 31
CHUNK = 64
#: The gating floor (docs/ops.md, "Gating": ``G_MIN``).
G_FLOOR = -1000.0
#: Gate kinds the benchmarks take: "mild" (``logsigmoid(N(3, 1))``, the gates measured before issue 32),
#: "realistic" (the family's default model below) or a model's name.
GATE_KINDS = ("mild", "realistic")
DEFAULT_MODEL = {"gdn": "qwen3-next", "kda": "kimi-linear"}
STRONG_SHIFT = 4.0
STRONG_EVERY = 8
_CHUNKS_PER_PASS = 64


class GateModel(BaseModel):
    """One model's gate parameters as its initialisation draws them, and its published heads.

    Fields:
        name: the model's short name (``qwen3-next``). family: ``gdn`` or ``kda``.
        a_range: ``A = exp(A_log) ~ U(lo, hi)``; ``(1, 1)`` means ``A_log = 0``.
        dt_bias: ``"ones"`` (Qwen: ``dt_bias = 1``) or ``"inverse_softplus"`` (``dt_bias =
            softplus^-1(dt)``, ``dt = max(exp(U(log dt_min, log dt_max)), dt_floor)``).
        dt_range, dt_floor: the ``dt`` draw of ``"inverse_softplus"``.
        a_std: the gate input's standard deviation (``0.02 * sqrt(d_in)``, module docstring).
        lower_bound: KDA's bounded gate (``None``: the softplus gate).
        beta_scale: 2 where the model allows negative eigenvalues (beta in (0, 2)), else 1.
        heads: ``(H, HV, K, V)`` of the published configuration.
        source: where the facts were read.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: Literal["gdn", "kda"]
    a_range: tuple[float, float]
    dt_bias: Literal["ones", "inverse_softplus"]
    dt_range: tuple[float, float] = (1e-3, 1e-1)
    dt_floor: float = 1e-4
    a_std: float
    lower_bound: Optional[float] = None
    beta_scale: float = 1.0
    heads: tuple[int, int, int, int]
    source: str

    def dt_bias_range(self) -> tuple[float, float]:
        """The closed range of ``dt_bias`` the initialisation can give."""
        if self.dt_bias == "ones":
            return (1.0, 1.0)
        lo, hi = max(self.dt_range[0], self.dt_floor), self.dt_range[1]
        return (_inverse_softplus(lo), _inverse_softplus(hi))


def _inverse_softplus(dt: float) -> float:
    return dt + math.log(-math.expm1(-dt))


_TF = "transformers 5.24 models/"
MODELS: dict[str, GateModel] = {m.name: m for m in (
    GateModel(name="qwen3-next", family="gdn", a_range=(0.01, 16.0), dt_bias="ones", a_std=0.02 * math.sqrt(2048),
              heads=(16, 32, 128, 128),
              source=_TF + "qwen3_next/modeling_qwen3_next.py (Qwen3NextGatedDeltaNet.__init__, _init_weights); "
              "configuration_qwen3_next.py defaults (hidden 2048, 16 key / 32 value heads of 128)"),
    GateModel(name="qwen3.5", family="gdn", a_range=(0.01, 16.0), dt_bias="ones", a_std=0.02 * math.sqrt(4096),
              heads=(16, 32, 128, 128),
              source=_TF + "qwen3_5/modeling_qwen3_5.py (Qwen3_5GatedDeltaNet.__init__, _init_weights); "
              "configuration_qwen3_5.py text defaults (hidden 4096, 16 key / 32 value heads of 128)"),
    GateModel(name="olmo-hybrid", family="gdn", a_range=(0.0, 16.0), dt_bias="inverse_softplus",
              a_std=0.02 * math.sqrt(3840), beta_scale=2.0, heads=(30, 30, 96, 192),
              source=_TF + "olmo_hybrid/modeling_olmo_hybrid.py (OlmoHybridGatedDeltaNet.__init__, _init_weights: "
              "linear_a_log_min/max 0/16, linear_dt_min/max 1e-3/0.1, floor 1e-4, allow_neg_eigval); "
              "configuration_olmo_hybrid.py defaults (hidden 3840, 30 heads, K = 0.75 * 3840 / 30, V = 2K)"),
    GateModel(name="kimi-linear", family="kda", a_range=(1.0, 16.0), dt_bias="inverse_softplus",
              a_std=0.02 * math.sqrt(2304) * 0.02 * math.sqrt(128), heads=(32, 32, 128, 128),
              source=_TF + "kimi_linear/modeling_kimi_linear.py (KimiLinearForgetGate, _init_weights: A U(1, 16), "
              "dt_bias inverse softplus of logU(1e-3, 0.1) per channel); configuration_kimi_linear.py (32 heads "
              "of 128); fla-core 0.6.0 fla/ops/kda/gate.py for the gate maths"),
    GateModel(name="glm5-next", family="kda", a_range=(1.0, 1.0), dt_bias="inverse_softplus",
              a_std=0.02 * math.sqrt(4096) * 0.02 * math.sqrt(128), lower_bound=-5.0, heads=(64, 64, 128, 128),
              source=_TF + "glm5_next/modeling_glm5_next.py (Glm5NextTextForgetGate: lower_bound * sigmoid(exp(A_log)"
              " * (a + dt_bias)), _init_weights: A_log = 0 with the bound); configuration_glm5_next.py "
              "(linear_lower_bound -5, 64 heads of 128); FLA 0.6 chunk_kda's safe_gate bound"),
)}


def resolve(model: Union[str, GateModel], family: Optional[str] = None) -> GateModel:
    """A :class:`GateModel` from a name, ``"realistic"`` (the family's default) or a model.

    Raises:
        ValueError: an unknown name, or a model of the other family.
    """
    if isinstance(model, str):
        name = DEFAULT_MODEL.get(family or "", "") if model == "realistic" else model
        if name not in MODELS:
            raise ValueError(f"unknown gate model {model!r} (family {family}); known: realistic, "
                             f"{', '.join(MODELS)}")
        model = MODELS[name]
    if family is not None and model.family != family:
        raise ValueError(f"gate model {model.name!r} is a {model.family.upper()} model, not {family.upper()}; "
                         f"pick one of {[m for m, v in MODELS.items() if v.family == family]}")
    return model


@dataclass(frozen=True)
class ModelGates:
    """One draw of a model's raw gate inputs: what its layers hand the gating.

    Fields:
        model: the :class:`GateModel`.
        A_log: ``[HV]`` fp32. dt_bias: ``[HV]`` (KDA ``[HV, K]``) fp32.
        a: ``[T, HV]`` (KDA ``[T, HV, K]``) fp32 gate input. b: ``[T, HV]`` fp32 beta logits.
        strong: ``[HV]`` bool, the strong-decay heads (module docstring).
    """

    model: GateModel
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    strong: torch.Tensor

    def log_decay(self, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g, beta)`` through linattn's gating op (:func:`linattn.gdn_gating` / ``kda_gating``),
        ``beta`` scaled by the model's ``beta_scale``; fp32 (fp64 when the draw is fp64)."""
        import linattn

        if self.model.family == "gdn":
            g, beta = linattn.gdn_gating(self.A_log, self.a, self.b, self.dt_bias, backend=backend)
        else:
            g, beta = linattn.kda_gating(self.A_log, self.a, self.b, self.dt_bias, backend=backend,
                                         lower_bound=self.model.lower_bound)
        return g, beta * self.model.beta_scale if self.model.beta_scale != 1.0 else beta


def _uniform(gen, n, lo, hi):
    return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)


def _draw_dt_bias(m: GateModel, gen, shape) -> torch.Tensor:
    if m.dt_bias == "ones":
        return torch.ones(shape, dtype=torch.float64)
    lo, hi = math.log(m.dt_range[0]), math.log(m.dt_range[1])
    dt = (lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)).exp().clamp_min(m.dt_floor)
    return dt + torch.log(-torch.expm1(-dt))


def model_gates(model: Union[str, GateModel], T: int, *, hv: Optional[int] = None, k: Optional[int] = None,
                seed: int = 0, device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32,
                strong_every: int = STRONG_EVERY, strong_shift: float = STRONG_SHIFT) -> ModelGates:
    """Draw one model's gate parameters (its initialisation) and gate inputs for ``T`` tokens.

    Args:
        model: a name of :data:`MODELS` or a :class:`GateModel`.
        T: tokens (rows of ``a`` and ``b``). hv, k: value heads and key channels (default: the
            model's published ``HV`` and ``K``; ``k`` is read by KDA only).
        seed: the draw (a CPU generator: the same tensors on every device).
        dtype: ``float32`` or ``float64`` (the oracle mode of the gating op).
        strong_every: every ``strong_every``-th head is a strong-decay head (0: none).
        strong_shift: how far a strong head's gate input is shifted up.
    Returns:
        :class:`ModelGates` on ``device``.
    Raises:
        ValueError: an unknown model, ``T < 0``, ``hv`` / ``k`` below 1 or ``strong_every < 0``.
    """
    m = resolve(model)
    hv = m.heads[1] if hv is None else hv
    k = m.heads[2] if k is None else k
    if T < 0 or hv < 1 or k < 1 or strong_every < 0:
        raise ValueError(f"model_gates: need T >= 0, hv >= 1, k >= 1, strong_every >= 0; got T={T}, hv={hv}, "
                         f"k={k}, strong_every={strong_every}")
    gen = torch.Generator().manual_seed(seed)
    kda = m.family == "kda"
    chan = (hv, k) if kda else (hv,)
    strong = torch.zeros(hv, dtype=torch.bool)
    if strong_every:
        strong[strong_every - 1::strong_every] = True
    A = _uniform(gen, hv, *m.a_range)
    A[strong] = m.a_range[1]
    dt_bias = _draw_dt_bias(m, gen, chan)
    dt_bias[strong] = m.dt_bias_range()[1]
    a = torch.randn((T, *chan), generator=gen, dtype=dtype) * m.a_std  # drawn in dtype: [T, HV, K] can be large
    a[:, strong] += strong_shift
    b = torch.randn((T, hv), generator=gen, dtype=dtype)
    to = dict(device=device, dtype=dtype)
    return ModelGates(m, A.log().to(**to), dt_bias.to(**to), a.to(device), b.to(device), strong.to(device))


def mild_gates(family: str, T: int, hv: int, k: int, *, seed: int = 0,
               device: Union[str, torch.device] = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmarks' gates before issue 32: ``g = logsigmoid(N(3, 1))``, ``beta = sigmoid(N(0, 1))``
    (fp32; about -0.05 per token)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (T, hv, k) if family == "kda" else (T, hv)
    g = torch.nn.functional.logsigmoid(torch.randn(shape, generator=gen) + 3.0)
    beta = torch.sigmoid(torch.randn(T, hv, generator=gen))
    return g.to(device), beta.to(device)


def gate_tensors(kind: str, family: str, T: int, hv: int, k: int, *, seed: int = 0,
                 device: Union[str, torch.device] = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(g [T, HV] or [T, HV, K], beta [T, HV])`` fp32 for a benchmark: ``kind`` is ``"mild"``,
    ``"realistic"`` (the family's default model, :data:`DEFAULT_MODEL`) or a model's name."""
    if kind == "mild":
        return mild_gates(family, T, hv, k, seed=seed, device=device)
    return model_gates(resolve(kind, family), T, hv=hv, k=k, seed=seed, device=device).log_decay()


def kda_fast_path_misses(g: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Which (chunk, value head, block of 32 key channels) leave KDA's stage-1 fast path.

    The rule of kernels/triton/chunk_intra.py: within a chunk of 64 rows of one sequence, with
    ``G`` the chunk-local cumulative log decay (``g`` floored at -1000, rows past the sequence's end
    adding nothing), the block takes the fast path when ``|G_r - G_31| <= 60`` for every row ``r``
    and channel of the block.

    Args:
        g: ``[T, HV, K]`` log decay (any float dtype; summed in float64).
        cu_seqlens: ``[N + 1]``.
    Returns:
        ``[num_chunks, HV, ceil(K / 32)]`` bool, True where the slow (level) path is taken; chunks in
        sequence order.
    """
    if g.dim() != 3:
        raise ValueError(f"kda_fast_path_misses: g must be [T, HV, K], got {list(g.shape)}")
    cu = [int(x) for x in cu_seqlens.tolist()]
    T, HV, K = g.shape
    nb = -(-K // KDA_BLOCK_K)
    starts = [(c, e) for s, e in zip(cu[:-1], cu[1:]) for c in range(s, e, CHUNK)]
    out = []
    rows = torch.arange(CHUNK, device=g.device)
    for i in range(0, len(starts), _CHUNKS_PER_PASS):  # bounded memory: float64 [64 chunks, 64, HV, K]
        part = torch.tensor(starts[i:i + _CHUNKS_PER_PASS], device=g.device)
        idx = part[:, :1] + rows  # [n, 64]
        inside = idx < part[:, 1:]
        blk = g[idx.clamp_max(max(T - 1, 0))].to(torch.float64).clamp_min(G_FLOOR)
        blk = torch.where(inside[:, :, None, None], blk, 0.0)
        G = blk.cumsum(1)
        span = (G - G[:, KDA_REF_ROW:KDA_REF_ROW + 1]).abs().amax(1)  # [n, HV, K]
        span = torch.nn.functional.pad(span, (0, nb * KDA_BLOCK_K - K))
        out.append((span > KDA_FAST_SPAN).view(-1, HV, nb, KDA_BLOCK_K).any(-1).cpu())
    return torch.cat(out) if out else torch.zeros(0, HV, nb, dtype=torch.bool)


def decay_summary(g: torch.Tensor, cu_seqlens: torch.Tensor) -> dict:
    """Numbers a benchmark row reports beside its timings: the per-token log decay's minimum,
    median and mean, and for KDA the fraction of (chunk, head, channel block) off the fast path."""
    gd = g.detach().float()
    out = dict(g_min=float(gd.min()) if gd.numel() else 0.0, g_median=float(gd.median()) if gd.numel() else 0.0,
               g_mean=float(gd.double().mean()) if gd.numel() else 0.0)
    if g.dim() == 3:
        miss = kda_fast_path_misses(g, cu_seqlens)
        out["kda_level_path_fraction"] = float(miss.double().mean()) if miss.numel() else 0.0
    return out
