"""Triton router: the logits x Wᵀ, softmax over the experts, top-k and renormalization.

`router` (the model's router, `reference.router`): for calls of at most FUSED_TOKENS tokens
(decoding, verification, Stage 0) over at most FUSED_EXPERTS experts one launch does everything.
Its grid splits the experts into blocks of BE and the hidden dimension into SPLIT spans, so that
the router's weight (E·H values, 1 MB at the 35B shapes) is read by E/BE·SPLIT programs at once
instead of by the few tiles a GEMM library gives a one-row product; each program stores its
partial logits, and the program that arrives last sums the spans in a fixed order, rounds the
logits to x's dtype (what the model's linear layer returns) and runs softmax and top-k for every
token of the call. Other calls take the library's product and `router_topk`: prefill chunks, and
routers of more than 256 experts, where on the H200 the last program's top-k over the wider row
costs more than the launch it saves (`bench/results/router_notes.md`). One path serves every call
size of a model up to 16 tokens, so a token routes the same in a one-token and a w-token pass.

`norm_router` (the model's post-attention add + offset RMS norm, then its router): in the same one
launch, each program first computes the scale 1/sqrt(mean(s²) + eps) of every row s = x + residual
(whole rows, summed in the same order by every program, so all hold the same scales), then
normalizes its own span of the hidden dimension on the fly before its product; the programs of the
first expert block store the normalized rows and s for the experts and the next layer. This saves
the norm's launch in every MoE layer. The sum of squares runs in column steps, so a normalized
value may differ from the norm kernel's by one rounding; every call of up to FUSED_TOKENS tokens
takes this path, so a token's value does not depend on the call's size. Other calls take the norm's
launch and `router`.

`router_topk`: softmax, top-k and renormalization of given logits, one program per token.

The k experts are found by k rounds of argmax over a token's probabilities held in registers
(k ≤ 16, E ≤ 1024), so ids come out by decreasing probability, ties to the lower expert id. A
token's result depends on its own logits only (batch invariance)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

import torch.nn.functional as F

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.norm import triton as norm_triton
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt

MAX_EXPERTS, MAX_TOP_K = 1024, 16
FUSED_TOKENS, FUSED_EXPERTS = 16, 256  # calls the one-launch router takes


class RouterTiles(NamedTuple):
    """Launch shape of the one-launch router: experts per program, spans of the hidden dimension,
    hidden columns per step, warps per program, whether the last program's softmax / top-k
    tile has one row per token of the call rounded up to a power of two (`tail_rows="call"`) or
    always FUSED_TOKENS rows (`"fixed"`), and whether each argmax round is one reduction over
    packed (probability, expert) keys (`packed_topk`) or two (the largest probability, then the
    lowest expert that has it); both choose the same experts and weights."""

    BE: int = 16
    SPLIT: int = 4
    BK: int = 128
    warps: int = 4
    tail_rows: str = "fixed"
    packed_topk: bool = False


ROUTER_TILES = RouterTiles(BE=32, SPLIT=8, tail_rows="call", packed_topk=True)  # `bench/results/router_notes.md`


@triton.jit
def _softmax_top_k(z, e_ok, K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_K: tl.constexpr, PACKED: tl.constexpr = False):
    """Rows of logits z [R, BLOCK_E] (fp32; columns outside e_ok ignored) → (weights, ids)
    [R, BLOCK_K]: the top K of each row's softmax by decreasing probability, ties to the lower id,
    renormalized to sum 1 when asked. PACKED: each round takes one max over int64 keys
    (probability bits << 32 | BLOCK_E − 1 − expert): probabilities are ≥ 0, whose fp32 bits order
    as the values do, and the masked −1 is negative, so the largest key is the largest
    probability's lowest expert."""
    cols = tl.arange(0, BLOCK_E)
    z = tl.where(e_ok[None, :], z, float("-inf"))
    p = tl.exp(z - tl.max(z, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    p = tl.where(e_ok[None, :], p, -1.0)
    slots = tl.arange(0, BLOCK_K)
    chosen_w = tl.zeros([z.shape[0], BLOCK_K], dtype=tl.float32)
    chosen_i = tl.zeros([z.shape[0], BLOCK_K], dtype=tl.int64)
    if PACKED:
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - cols[None, :]).to(tl.int64)
    for j in tl.static_range(K):
        if PACKED:
            top = tl.max(key, axis=1)  # [R]
            index = (BLOCK_E - 1) - (top & 0xFFFFFFFF)
            best = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            key = tl.where(cols[None, :] == index[:, None], -(1 << 62), key)
        else:
            best = tl.max(p, axis=1)  # [R]
            index = tl.min(tl.where(p == best[:, None], cols[None, :], BLOCK_E), axis=1)
            p = tl.where(cols[None, :] == index[:, None], -1.0, p)
        chosen_w = tl.where(slots[None, :] == j, best[:, None], chosen_w)
        chosen_i = tl.where(slots[None, :] == j, index[:, None].to(tl.int64), chosen_i)
    if RENORMALIZE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=1)[:, None]
    return chosen_w, chosen_i


@triton.jit
def _router_kernel(logits_ptr, ids_ptr, w_ptr, stride_l, E, K: tl.constexpr, RENORMALIZE: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ok = cols < E
    z = tl.load(logits_ptr + row * stride_l + cols, mask=ok, other=float("-inf")).to(tl.float32)
    chosen_w, chosen_i = _softmax_top_k(z[None, :], ok, K, RENORMALIZE, BLOCK_E, BLOCK_K)  # [1, BLOCK_K]
    slots = tl.arange(0, BLOCK_K)
    keep = (slots < K)[None, :]
    tl.store(ids_ptr + row * K + slots[None, :], chosen_i, mask=keep)
    tl.store(w_ptr + row * K + slots[None, :], chosen_w.to(w_ptr.dtype.element_ty), mask=keep)


def router_topk(logits: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """As `reference.router_topk`: logits [N, E] → ids [N, k] (long), weights [N, k] in `dtype`."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"router_topk: logits must be [N, E] and contiguous in E, got {tuple(logits.shape)} "
                         f"with strides {logits.stride()}")
    n, e = logits.shape
    if not 1 <= top_k <= min(e, MAX_TOP_K) or e > MAX_EXPERTS:
        raise ValueError(f"router_topk: top-{top_k} of {e} experts (k ≤ {MAX_TOP_K}, E ≤ {MAX_EXPERTS})")
    if logits.device.type != "cuda" and not interpreted():
        raise ValueError(f"router_topk: tensors are on {logits.device}; the Triton kernel needs CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
    ids = torch.empty(n, top_k, dtype=torch.long, device=logits.device)
    weights = torch.empty(n, top_k, dtype=dtype, device=logits.device)
    if n:
        _router_kernel[(n,)](logits, ids, weights, logits.stride(0), e, K=top_k, RENORMALIZE=bool(renormalize),
                             BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k))
    return ids, weights


@triton.jit
def _row_scales(x_ptr, res_ptr, stride_xn, stride_rn, N, eps, H: tl.constexpr, BM: tl.constexpr,
                BH: tl.constexpr, DTYPE: tl.constexpr):
    """[BM] 1/sqrt(mean(s²) + eps) of each row s = x + residual (the sum rounded to DTYPE, as torch's
    add rounds it), the squares summed over column steps of BH in a fixed order: a row's scale
    depends on that row alone."""
    o_m = tl.arange(0, BM)
    o_h = tl.arange(0, BH)
    m_ok = o_m < N
    total = tl.zeros([BM], dtype=tl.float32)
    for c in range(0, H, BH):
        ok = m_ok[:, None] & (c + o_h < H)[None, :]
        b_x = tl.load(x_ptr + o_m[:, None] * stride_xn + c + o_h[None, :], mask=ok, other=0.0)
        b_r = tl.load(res_ptr + o_m[:, None] * stride_rn + c + o_h[None, :], mask=ok, other=0.0)
        b_s = (b_x.to(tl.float32) + b_r.to(tl.float32)).to(DTYPE).to(tl.float32)
        total += tl.sum(b_s * b_s, axis=1)
    return tl.rsqrt(total / H + eps)


@triton.jit
def _router_fused_kernel(x_ptr, r_ptr, part_ptr, counter_ptr, logits_ptr, ids_ptr, w_ptr, res_ptr, nw_ptr, y_ptr,
                         s_ptr, stride_xn, stride_re, stride_rn, stride_yn, stride_sn, N, E, eps, H: tl.constexpr,
                         SPAN: tl.constexpr, K: tl.constexpr, RENORMALIZE: tl.constexpr, SPLIT: tl.constexpr,
                         BM: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                         TAIL_M: tl.constexpr, NORM: tl.constexpr, BH: tl.constexpr, PACKED: tl.constexpr,
                         USE_GDC: tl.constexpr):
    i_e, i_s = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_e = i_e * BE + tl.arange(0, BE)
    o_c = tl.arange(0, BK)
    m_ok, e_ok = o_m < N, o_e < E
    if USE_GDC:
        wait_then_release()
    if NORM:  # x is the mixer's output: the router's input is normalize(x + residual) · (1 + norm weight)
        inv = _row_scales(x_ptr, res_ptr, stride_xn, stride_rn, N, eps, H, BM, BH, s_ptr.dtype.element_ty)
    acc = tl.zeros([BM, BE], dtype=tl.float32)
    for c in range(i_s * SPAN, i_s * SPAN + SPAN, BK):  # this program's span of the hidden dimension
        c_ok = c + o_c < H
        ok = m_ok[:, None] & c_ok[None, :]
        b_x = tl.load(x_ptr + o_m[:, None] * stride_xn + c + o_c[None, :], mask=ok, other=0.0)  # [BM, BK]
        if NORM:
            b_res = tl.load(res_ptr + o_m[:, None] * stride_rn + c + o_c[None, :], mask=ok, other=0.0)
            b_s = (b_x.to(tl.float32) + b_res.to(tl.float32)).to(s_ptr.dtype.element_ty)
            b_nw = tl.load(nw_ptr + c + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [BK]
            b_x = (b_s.to(tl.float32) * inv[:, None] * (1.0 + b_nw[None, :])).to(y_ptr.dtype.element_ty)
            if i_e == 0:  # one expert block stores the rows: the same values in every block
                tl.store(s_ptr + o_m[:, None] * stride_sn + c + o_c[None, :], b_s, mask=ok)
                tl.store(y_ptr + o_m[:, None] * stride_yn + c + o_c[None, :], b_x, mask=ok)
        b_r = tl.load(r_ptr + o_e[:, None] * stride_re + c + o_c[None, :], mask=e_ok[:, None] & c_ok[None, :],
                      other=0.0)  # [BE, BK]
        acc = dot_bt(b_x, b_r, acc, PRECISION, WIDEN)
    tl.store(part_ptr + (i_s * N + o_m[:, None]) * E + o_e[None, :], acc, mask=m_ok[:, None] & e_ok[None, :])
    tl.debug_barrier()  # every thread's partial logits (and rows) stored before the release below
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) * SPLIT - 1:  # the last program: softmax and top-k of every token
        t_m = tl.arange(0, TAIL_M)
        t_ok = t_m < N
        cols = tl.arange(0, BLOCK_E)
        ok = t_ok[:, None] & (cols < E)[None, :]
        z = tl.zeros([TAIL_M, BLOCK_E], dtype=tl.float32)
        for s in tl.static_range(SPLIT):  # the spans summed in a fixed order
            z += tl.load(part_ptr + (s * N + t_m[:, None]) * E + cols[None, :], mask=ok, other=0.0,
                         cache_modifier=".cg")
        z = z.to(logits_ptr.dtype.element_ty)  # the logits in x's dtype, as the linear layer returns them
        tl.store(logits_ptr + t_m[:, None] * E + cols[None, :], z, mask=ok)
        chosen_w, chosen_i = _softmax_top_k(z.to(tl.float32), cols < E, K, RENORMALIZE, BLOCK_E, BLOCK_K, PACKED)
        slots = tl.arange(0, BLOCK_K)
        keep = t_ok[:, None] & (slots < K)[None, :]
        tl.store(ids_ptr + t_m[:, None] * K + slots[None, :], chosen_i, mask=keep)
        tl.store(w_ptr + t_m[:, None] * K + slots[None, :], chosen_w.to(w_ptr.dtype.element_ty), mask=keep)
        tl.atomic_xchg(counter_ptr, 0)  # every program has arrived: ready for the next call


_COUNTERS: dict[torch.device, Tensor] = {}


def _counter(device: torch.device) -> Tensor:
    """The arrival counter of a device (zero between calls: the last program resets it). Calls on
    one device run one after another on its stream, so one counter serves them all."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def fused(tokens: int, experts: int) -> bool:
    """Whether `router` takes the one-launch kernel for a call of this size."""
    return tokens <= FUSED_TOKENS and experts <= FUSED_EXPERTS


def _check_router(name: str, x: Tensor, weight: Tensor, top_k: int) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: x must be [N, H] and weight [E, H], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or x.dtype != weight.dtype:
        raise ValueError(f"{name}: x ({x.dtype}, strides {x.stride()}) and weight ({weight.dtype}, strides "
                         f"{weight.stride()}) must share a dtype and be contiguous in H")
    if not 1 <= top_k <= min(weight.shape[0], MAX_TOP_K) or weight.shape[0] > MAX_EXPERTS:
        raise ValueError(f"{name}: top-{top_k} of {weight.shape[0]} experts (k ≤ {MAX_TOP_K}, E ≤ {MAX_EXPERTS})")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"{name}: tensors are on {x.device}; the Triton kernel needs CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")


def _launch(x, weight, top_k, renormalize, dtype, logits, tiles, norm=None) -> tuple[Tensor, Tensor]:
    """The one-launch router over x [N ≤ FUSED_TOKENS, H]; norm: None, or (residual, norm weight, eps,
    y, s) to route normalize(x + residual) · (1 + norm weight), storing it in y and the sum in s."""
    n, h = x.shape
    e = weight.shape[0]
    ids = torch.empty(n, top_k, dtype=torch.long, device=x.device)
    weights = torch.empty(n, top_k, dtype=dtype, device=x.device)
    if logits is None:
        logits = torch.empty(n, e, dtype=x.dtype, device=x.device)
    if n:
        residual, norm_weight, eps, y, s = norm if norm is not None else (x, x, 0.0, x, x)
        span = triton.cdiv(triton.cdiv(h, tiles.SPLIT), tiles.BK) * tiles.BK
        part = torch.empty(tiles.SPLIT, n, e, dtype=torch.float32, device=x.device)
        tail = FUSED_TOKENS if tiles.tail_rows == "fixed" else triton.next_power_of_2(n)
        _router_fused_kernel[(triton.cdiv(e, tiles.BE), tiles.SPLIT)](
            x, weight, part, _counter(x.device), logits, ids, weights, residual, norm_weight, y, s, x.stride(0),
            weight.stride(0), residual.stride(0), y.stride(0), s.stride(0), n, e, eps,
            H=h, SPAN=span, K=top_k, RENORMALIZE=bool(renormalize), SPLIT=tiles.SPLIT, BM=FUSED_TOKENS, BE=tiles.BE,
            BK=tiles.BK, BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k),
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=interpreted(), TAIL_M=tail,
            NORM=norm is not None, BH=min(512, triton.next_power_of_2(h)), PACKED=tiles.packed_topk,
            num_warps=tiles.warps, **pdl.options(x))
    return ids, weights


def router(x: Tensor, weight: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
           *, logits: Tensor | None = None, tiles: RouterTiles | None = None) -> tuple[Tensor, Tensor]:
    """As `reference.router`: x [N, H], weight [E, H] → ids [N, k] (long), weights [N, k] in `dtype`.
    `logits` ([N, E] in x's dtype), when given, receives the logits the routing was taken from.
    tiles: this module's `ROUTER_TILES` when None, looked up at each call."""
    _check_router("router", x, weight, top_k)
    if not fused(x.shape[0], weight.shape[0]):
        z = F.linear(x, weight)
        if logits is not None:
            logits.copy_(z)
        return router_topk(z, top_k, renormalize, dtype)
    return _launch(x, weight, top_k, renormalize, dtype, logits, tiles or ROUTER_TILES)


def norm_router(x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, top_k: int,
                renormalize: bool, dtype: torch.dtype, *, tiles: RouterTiles | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """As `reference.norm_router`: x, residual [N, H], norm_weight [H] (zero-centred), router weight
    [E, H] → (normed [N, H], s = x + residual [N, H], ids [N, k] long, weights [N, k] in `dtype`),
    normed = normalize(s) · (1 + norm_weight) in x's dtype. One launch for calls `fused` takes."""
    _check_router("norm_router", x, weight, top_k)
    if residual.shape != x.shape or residual.stride(-1) != 1 or residual.dtype != x.dtype:
        raise ValueError(f"norm_router: residual ({residual.dtype}, {tuple(residual.shape)}, strides "
                         f"{residual.stride()}) must match x ({x.dtype}, {tuple(x.shape)}) and be contiguous in H")
    if tuple(norm_weight.shape) != (x.shape[1],) or norm_weight.stride(-1) != 1:
        raise ValueError(f"norm_router: norm_weight {tuple(norm_weight.shape)} must be [H] = [{x.shape[1]}] and "
                         "contiguous")
    if not fused(x.shape[0], weight.shape[0]):
        normed, s = norm_triton.offset_rms_norm(x, norm_weight, eps, residual)
        return (normed, s, *router(normed, weight, top_k, renormalize, dtype, tiles=tiles))
    normed, s = torch.empty_like(x), torch.empty_like(x)
    ids, weights = _launch(x, weight, top_k, renormalize, dtype, None, tiles or ROUTER_TILES,
                           (residual, norm_weight, eps, normed, s))
    return normed, s, ids, weights
