"""The mixers' projections on one tile kernel, the split-K product:

    parts[s] = x[:, span s] W[:, span s]ᵀ     fp32, grid (N / BN, K / SPAN, M / 16)

`linear_add_norm`: the out-projection, residual add and offset RMS norm in two launches, the
product into fp32 parts, then y, s = norm(Σ_s parts[s] + residual) (`kernels/norm`'s launch,
summing the parts in order), in place of the product, its split-K reduction and the norm's launch;
calls of more than MAX_ROWS rows take `F.linear` and the norm's launch. `linear`: an input
projection in one launch, one span over the whole depth, stored in the activations' dtype; calls of
more than LINEAR_MAX_ROWS rows take `F.linear`. Below those bounds every row runs the same [16, BK]
tiles whatever the call's row count (tokens × batch), so a token's result does not depend on the
other tokens of its call (batch invariance, which exactness relies on); each further 16 rows read
the weights again, a cost only prefill chunks pay. Each program reads its first weight tile before
the programmatic-dependent-launch wait: the weights are not the previous kernel's output. With a
gate (the GDN layer's output), the parts kernel also applies the gated RMS norm to each head of x
as it loads it, in place of the norm's own launch before the product.

    x [..., K]   weight [N, K]   residual [..., N]   norm_weight [N]   →   y, s [..., N]
    gated: x, gate [..., H, dv] (K = H·dv)   gate_weight [dv]
    linear: x [..., K]   weight [N, K]   →   [..., N]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.norm import triton as norm_triton
from hybridspec.kernels.norm.tiles import gated_rms
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt

MAX_ROWS = 256
LINEAR_MAX_ROWS = 64  # a batch of 4 verifications of 16 tokens; prefill chunks take F.linear
BM = 16  # rows per program


@dataclass(frozen=True, slots=True)
class LinearTiles:
    """Launch shape of the split-K product: BN output columns and SPAN of the K dimension per
    program, in steps of BK (SPAN a multiple of BK), `warps` warps each; `early_weights`: the first
    weight tile read before the PDL wait (after it otherwise, to measure what that buys). `linear`
    takes no span from it: its one span is K rounded up to a multiple of BK."""

    block_n: int = 32
    span: int = 512
    block_k: int = 512
    warps: int = 4
    early_weights: bool = True

    def __post_init__(self):
        for name in ("block_n", "span", "block_k", "warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"LinearTiles.{name} must be a power of two, not {value}")
        if self.block_n < 16 or self.block_k < 16:
            raise ValueError(f"LinearTiles: block_n and block_k of at least 16 (tile products), not "
                             f"{self.block_n}, {self.block_k}")
        if self.span % self.block_k:
            raise ValueError(f"LinearTiles.span {self.span} must be a multiple of block_k {self.block_k}")


TILES = LinearTiles()
INPUT_TILES = LinearTiles(block_n=32, span=256, block_k=256)  # `linear` (its span: the whole depth)


@triton.jit
def _split_k_kernel(x_ptr, g_ptr, gw_ptr, w_ptr, p_ptr, M, N, K, stride_xm, stride_gm, stride_wn, stride_ps, stride_pm,
                    gate_eps, SPAN: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    DV: tl.constexpr, GATED: tl.constexpr, EARLY: tl.constexpr, PRECISION: tl.constexpr,
                    WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    i_n, i_s, i_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = i_s * SPAN + tl.arange(0, BK)
    m_ok, n_ok = o_m < M, o_n < N
    p_w = w_ptr + o_n[:, None].to(tl.int64) * stride_wn + o_k[None, :]  # [BN, BK]
    p_x = x_ptr + o_m[:, None] * stride_xm + o_k[None, :]  # [BM, BK]
    w_ok = n_ok[:, None] & (o_k < K)[None, :]
    if EARLY:  # weights: no kernel writes them, so they may be read before the wait
        b_w = tl.load(p_w, mask=w_ok, other=0.0)
    if GATED:
        b_gw = tl.load(gw_ptr + tl.arange(0, DV))  # [DV] the gated norm's weight, one head's
    if USE_GDC:
        wait_then_release()
    if not EARLY:
        b_w = tl.load(p_w, mask=w_ok, other=0.0)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for c in tl.static_range(0, SPAN, BK):
        k_ok = o_k + c < K
        if c > 0:
            b_w = tl.load(p_w + c, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        b_x = tl.load(p_x + c, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if GATED:  # x = the heads' raw output: each DV-wide head normed and gated here (BK, SPAN: whole heads)
            b_g = tl.load(g_ptr + o_m[:, None] * stride_gm + o_k[None, :] + c, mask=m_ok[:, None] & k_ok[None, :],
                          other=0.0)
            b_x = tl.reshape(gated_rms(tl.reshape(b_x, (BM, BK // DV, DV)), tl.reshape(b_g, (BM, BK // DV, DV)),
                                       b_gw[None, None, :], DV, gate_eps, 2, w_ptr.dtype.element_ty), (BM, BK))
        acc = dot_bt(b_x, b_w, acc, PRECISION, WIDEN)
    p_p = p_ptr + i_s * stride_ps + o_m[:, None] * stride_pm + o_n[None, :]
    tl.store(p_p, acc.to(p_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _check(x: Tensor, weight: Tensor, residual: Tensor, norm_weight: Tensor, gate: Tensor | None,
           gate_weight: Tensor | None) -> None:
    n, k = weight.shape if weight.dim() == 2 else (None, None)
    width = x.shape[-1] if gate is None else x.shape[-2] * x.shape[-1] if x.dim() >= 2 else None
    if k is None or width != k:
        raise ValueError(f"linear_add_norm: weight {tuple(weight.shape)} is not [N, {width}] for x {tuple(x.shape)}")
    if weight.stride(-1) != 1 or weight.stride(0) < k:
        raise ValueError(f"linear_add_norm: weight rows must be contiguous (stride {weight.stride()})")
    rows = x.shape[:-1] if gate is None else x.shape[:-2]
    if residual.shape != (*rows, n):
        raise ValueError(f"linear_add_norm: residual {tuple(residual.shape)} does not match x {tuple(x.shape)} "
                         f"and weight {tuple(weight.shape)}")
    if norm_weight.shape != (n,):
        raise ValueError(f"linear_add_norm: norm weight {tuple(norm_weight.shape)} is not [{n}]")
    if not weight.dtype == residual.dtype == (x.dtype if gate is None else gate.dtype):
        raise ValueError(f"linear_add_norm: x {x.dtype} (or the gate), weight {weight.dtype} and residual "
                         f"{residual.dtype} must share a dtype")
    if gate is not None and (gate.shape != x.shape or gate_weight is None or gate_weight.shape != x.shape[-1:]
                             or gate_weight.dtype != gate.dtype):
        raise ValueError(f"linear_add_norm: gate {tuple(gate.shape)} {gate.dtype} and gate weight "
                         f"{None if gate_weight is None else (tuple(gate_weight.shape), gate_weight.dtype)} do not "
                         f"match heads {tuple(x.shape)} (the weight in the gate's dtype)")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"linear_add_norm: tensors are on {x.device}; the Triton kernels need CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")


def _rows(name: str, t: Tensor, k: int, op: str = "linear_add_norm") -> Tensor:
    rows = t.reshape(-1, k)
    if rows.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must be contiguous in its last dimension (stride {t.stride()})")
    return rows


def linear(x: Tensor, weight: Tensor, *, tiles: LinearTiles = INPUT_TILES) -> Tensor:
    """As `reference.linear`: x Wᵀ [..., N] in the weight's dtype; x [..., K] with at most
    LINEAR_MAX_ROWS rows in one launch (each program the whole depth K in steps of block_k, its
    first weight tile read before the PDL wait where `tiles.early_weights`), more through
    `F.linear`."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: weight {tuple(weight.shape)} is not [N, {x.shape[-1]}] for x {tuple(x.shape)}")
    if weight.stride(-1) != 1 or weight.stride(0) < weight.shape[1]:
        raise ValueError(f"linear: weight rows must be contiguous (stride {weight.stride()})")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"linear: x ({x.dtype} on {x.device}) and weight ({weight.dtype} on {weight.device}) "
                         "must share a dtype and a device")
    if weight.shape[1] == 0:
        raise ValueError(f"linear: weight {tuple(weight.shape)} has no depth (K = 0)")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"linear: tensors are on {x.device}; the Triton kernels need CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
    n, k = weight.shape
    m = x.numel() // k
    if m > LINEAR_MAX_ROWS or m == 0:
        return F.linear(x, weight)
    rows = _rows("x", x, k, "linear")
    y = torch.empty((m, n), dtype=weight.dtype, device=weight.device)
    span = triton.cdiv(k, tiles.block_k) * tiles.block_k
    _split_k_kernel[(triton.cdiv(n, tiles.block_n), 1, triton.cdiv(m, BM))](
        rows, rows, weight, weight, y, m, n, k, rows.stride(0), rows.stride(0), weight.stride(0), 0, y.stride(0),
        0.0, SPAN=span, BM=BM, BN=tiles.block_n, BK=tiles.block_k, DV=1, GATED=False, EARLY=tiles.early_weights,
        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
        WIDEN=interpreted() and weight.element_size() < 4, num_warps=tiles.warps, **pdl.options(weight))
    return y.view(*x.shape[:-1], n)


def linear_add_norm(x: Tensor, weight: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, *,
                    gate: Tensor | None = None, gate_weight: Tensor | None = None, gate_eps: float = 1e-6,
                    tiles: LinearTiles = TILES) -> tuple[Tensor, Tensor]:
    """As `reference.linear_add_norm`: (normalize(s) · (1 + norm_weight), s), s = x Wᵀ + residual, in
    the weight's dtype; x [..., K] with at most MAX_ROWS rows in two launches, more through `F.linear`.
    With `gate`, x [..., H, dv] is the raw output of H heads, each normed and gated first
    (`gated_rms_norm(x, gate, gate_weight, gate_eps)`, K = H·dv), inside the product's launch where
    the tiles hold whole heads."""
    _check(x, weight, residual, norm_weight, gate, gate_weight)
    n, k = weight.shape
    m = residual.numel() // n
    dv = x.shape[-1]
    inline = gate is None or (dv & (dv - 1) == 0 and tiles.block_k % dv == 0 and tiles.span % dv == 0)
    if m > MAX_ROWS or m == 0 or not inline:
        if gate is not None:
            x = norm_triton.gated_rms_norm(x, gate, gate_weight, gate_eps).reshape(*residual.shape[:-1], k)
        if m > MAX_ROWS or m == 0:
            return norm_triton.offset_rms_norm(F.linear(x, weight), norm_weight, eps, residual)
        gate = None
    rows = _rows("x", x, k)
    g_rows = rows if gate is None else _rows("gate", gate, k)
    parts = torch.empty((triton.cdiv(k, tiles.span), m, n), dtype=torch.float32, device=weight.device)
    _split_k_kernel[(triton.cdiv(n, tiles.block_n), parts.shape[0], triton.cdiv(m, BM))](
        rows, g_rows, weight if gate_weight is None else gate_weight, weight, parts, m, n, k, rows.stride(0),
        g_rows.stride(0), weight.stride(0), parts.stride(0), parts.stride(1), gate_eps, SPAN=tiles.span, BM=BM,
        BN=tiles.block_n, BK=tiles.block_k, DV=dv if gate is not None else 1, GATED=gate is not None,
        EARLY=tiles.early_weights,
        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
        WIDEN=interpreted() and weight.element_size() < 4, num_warps=tiles.warps, **pdl.options(weight))
    return norm_triton.offset_rms_norm_of_parts(parts, residual, norm_weight, eps)
