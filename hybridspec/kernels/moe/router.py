"""Triton router: the logits x Wᵀ, softmax over the experts, top-k and renormalization.

`router` (the model's router, `reference.router`): for calls of at most FUSED_TOKENS tokens
(decoding, verification, Stage 0) over at most FUSED_EXPERTS experts one launch does everything.
Its grid splits the experts into blocks of BE and the hidden dimension into SPLIT spans, so that
the router's weight (E·H values, 1 MB at the 35B shapes) is read by E/BE·SPLIT programs at once
instead of by the few tiles a GEMM library gives a one-row product; each program stores its
partial logits, and the program that arrives last sums the spans in a fixed order, rounds the
logits to x's dtype (what the model's linear layer returns) and runs softmax and top-k for every
token of the call. Other calls take the library's product and `router_topk`: prefill chunks, and
routers of more than 256 experts, where the last program's top-k over the wider row costs
more than the launch it saves (`bench/results/router_notes.md`). Calls of one and two
tokens (`RouterTiles.rows_tokens`) take the register-slice form of the same launch (`router_rows.py`),
whose programs each hold whole rows of the weight. Within each form a token routes the same
whatever the other tokens of the call; between the forms its logits are summed in another order
and may differ in the last bit (as the rest of a pass does between the register-slice kernels of
one or two tokens and the tile kernels and library products of more).

`norm_router` (`reference.norm_router`): the MoE's input norm and the router in one launch for the
calls the register-slice form takes (its programs normalise the row themselves); None for the
others, whose caller runs the norm's launch and `router`.

`router_topk` (`router_topk.py`, re-exported here): softmax, top-k and renormalization of given
logits, one program per token.

The k experts are found by k rounds of argmax over a token's probabilities held in registers
(`tiles.softmax_top_k`; k ≤ 16, E ≤ 1024), so ids come out by decreasing probability, ties to the
lower expert id. A token's result depends on its own logits only (batch invariance)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.moe.router_topk import check_top_k, router_topk
from hybridspec.kernels.moe.router_rows import launch_router_rows
from hybridspec.kernels.moe.tiles import route_partials
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt, last_to_arrive

FUSED_TOKENS, FUSED_EXPERTS = 16, 256  # calls the one-launch router takes


@dataclasses.dataclass(frozen=True)
class RouterTiles:
    """Launch shape of the one-launch router: experts per program, spans of the hidden dimension,
    hidden columns per step, warps per program, whether the last program's softmax / top-k
    tile has one row per token of the call rounded up to a power of two (`tail_rows="call"`) or
    always FUSED_TOKENS rows (`"fixed"`), and up to how many rows of that tile each argmax round
    is one reduction over packed (probability, expert) keys (`packed_rows`) instead of two (the
    largest probability, then the lowest expert that has it). Both forms choose the same experts
    and weights bit for bit, so the choice may follow the call's size; the int64 keys of a tall
    tile cost more than the reductions they save. Calls of at most `rows_tokens` tokens take the
    register-slice form instead (`router_rows.py`: rows_be experts' whole rows per program,
    rows_warps warps), whose logits are summed in another order than the tile form's."""

    BE: int = 16
    SPLIT: int = 4
    BK: int = 128
    warps: int = 4
    tail_rows: Literal["fixed", "call"] = "fixed"
    packed_rows: int = 0
    rows_tokens: int = 0
    rows_be: int = 1
    rows_warps: int = 4

    def __post_init__(self) -> None:
        if self.tail_rows not in ("fixed", "call"):
            raise ValueError(f"RouterTiles.tail_rows must be 'fixed' or 'call', got {self.tail_rows!r}")
        for name in ("BE", "SPLIT", "BK", "warps", "rows_be", "rows_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"RouterTiles.{name} must be a power of two, got {value}")
        if self.packed_rows < 0 or self.rows_tokens < 0:
            raise ValueError(f"RouterTiles: packed_rows and rows_tokens must be ≥ 0, got {self.packed_rows}, "
                             f"{self.rows_tokens}")

    def replace(self, **fields) -> "RouterTiles":
        return dataclasses.replace(self, **fields)


# `bench/results/router_notes.md`
ROUTER_TILES = RouterTiles(BE=32, SPLIT=8, tail_rows="call", packed_rows=2, rows_tokens=2)


@triton.jit
def _router_fused_kernel(x_ptr, r_ptr, part_ptr, counter_ptr, logits_ptr, ids_ptr, w_ptr, stride_xn, stride_re,
                         N, E, H: tl.constexpr, SPAN: tl.constexpr, K: tl.constexpr, RENORMALIZE: tl.constexpr,
                         SPLIT: tl.constexpr, BM: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                         WIDEN: tl.constexpr, TAIL_M: tl.constexpr, PACKED: tl.constexpr, USE_GDC: tl.constexpr):
    i_e, i_s = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_e = i_e * BE + tl.arange(0, BE)
    o_c = tl.arange(0, BK)
    m_ok, e_ok = o_m < N, o_e < E
    if USE_GDC:
        wait_then_release()
    acc = tl.zeros([BM, BE], dtype=tl.float32)
    for c in range(i_s * SPAN, i_s * SPAN + SPAN, BK):  # this program's span of the hidden dimension
        c_ok = c + o_c < H
        b_x = tl.load(x_ptr + o_m[:, None] * stride_xn + c + o_c[None, :], mask=m_ok[:, None] & c_ok[None, :],
                      other=0.0)  # [BM, BK]
        b_r = tl.load(r_ptr + o_e[:, None] * stride_re + c + o_c[None, :], mask=e_ok[:, None] & c_ok[None, :],
                      other=0.0)  # [BE, BK]
        acc = dot_bt(b_x, b_r, acc, PRECISION, WIDEN)
    tl.store(part_ptr + (i_s * N + o_m[:, None]) * E + o_e[None, :], acc, mask=m_ok[:, None] & e_ok[None, :])
    if last_to_arrive(counter_ptr, tl.num_programs(0) * SPLIT):  # the last program: softmax and top-k of every token
        route_partials(part_ptr, logits_ptr, ids_ptr, w_ptr, N, E, SPLIT, K, RENORMALIZE, BLOCK_E, BLOCK_K, TAIL_M,
                       PACKED)
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


def norm_router(x: Tensor, norm_weight: Tensor, eps: float, residual: Tensor | None, weight: Tensor, top_k: int,
                renormalize: bool, dtype: torch.dtype, *, tiles: RouterTiles | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """As `reference.norm_router`: x, residual [N, H] → (ids, weights, h, s), h = offset_rms_norm(s),
    s = x (+ residual), routed from h, in one launch (its programs normalise the rows; program 0
    stores h and s). None, launching nothing, for a call the register-slice form does not take: the
    caller then runs the norm and `router`."""
    tiles = tiles or ROUTER_TILES
    n, e = x.shape[0], weight.shape[0]
    if not (x.dim() == 2 and 0 < n <= tiles.rows_tokens and fused(n, e) and x.is_contiguous()
            and (residual is None or residual.is_contiguous())):
        return None
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"norm_router: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    h = torch.empty_like(x)
    s = x if residual is None else torch.empty_like(x)
    ids, weights = router(x, weight, top_k, renormalize, dtype, tiles=tiles, norm=(norm_weight, eps, residual, h, s))
    return ids, weights, h, s


def router(x: Tensor, weight: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
           *, logits: Tensor | None = None, tiles: RouterTiles | None = None, norm: tuple | None = None
           ) -> tuple[Tensor, Tensor]:
    """As `reference.router`: x [N, H], weight [E, H] → ids [N, k] (long), weights [N, k] in `dtype`.
    `logits` ([N, E] in x's dtype), when given, receives the logits the routing was taken from.
    tiles: this module's `ROUTER_TILES` when None, looked up at each call. norm (`norm_router`'s, for
    the calls the register-slice form takes): route from the offset norm of x (+ residual) instead."""
    tiles = tiles or ROUTER_TILES
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"router: x must be [N, H] and weight [E, H], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or x.dtype != weight.dtype:
        raise ValueError(f"router: x ({x.dtype}, strides {x.stride()}) and weight ({weight.dtype}, strides "
                         f"{weight.stride()}) must share a dtype and be contiguous in H")
    n, h = x.shape
    e = weight.shape[0]
    if norm is not None and not (0 < n <= tiles.rows_tokens and fused(n, e)):
        raise ValueError(f"router: norm= for {n} tokens of {e} experts, which the register-slice form does not take "
                         "(`norm_router` chooses)")
    if not fused(n, e):
        z = F.linear(x, weight)
        if logits is not None:
            logits.copy_(z)
        return router_topk(z, top_k, renormalize, dtype)
    check_top_k("router", e, top_k, x.device)
    ids = torch.empty(n, top_k, dtype=torch.long, device=x.device)
    weights = torch.empty(n, top_k, dtype=dtype, device=x.device)
    if logits is None:
        logits = torch.empty(n, e, dtype=x.dtype, device=x.device)
    elif tuple(logits.shape) != (n, e) or not logits.is_contiguous() or logits.dtype != x.dtype:
        raise ValueError(f"router: logits must be a contiguous [N, E] = {(n, e)} tensor of {x.dtype}, got "
                         f"{tuple(logits.shape)} {logits.dtype} with strides {logits.stride()}")
    if n and n <= tiles.rows_tokens:
        part = torch.empty(n, e, dtype=torch.float32, device=x.device)
        launch_router_rows(x, weight, part, _counter(x.device), logits, ids, weights, top_k, bool(renormalize),
                           tiles.rows_be, tiles.rows_warps, tiles.packed_rows, norm)
    elif n:
        span = triton.cdiv(triton.cdiv(h, tiles.SPLIT), tiles.BK) * tiles.BK
        part = torch.empty(tiles.SPLIT, n, e, dtype=torch.float32, device=x.device)
        tail = FUSED_TOKENS if tiles.tail_rows == "fixed" else triton.next_power_of_2(n)
        _router_fused_kernel[(triton.cdiv(e, tiles.BE), tiles.SPLIT)](
            x, weight, part, _counter(x.device), logits, ids, weights, x.stride(0), weight.stride(0), n, e,
            H=h, SPAN=span, K=top_k, RENORMALIZE=bool(renormalize), SPLIT=tiles.SPLIT, BM=FUSED_TOKENS, BE=tiles.BE,
            BK=tiles.BK, BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k),
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=interpreted(), TAIL_M=tail,
            PACKED=tail <= tiles.packed_rows, num_warps=tiles.warps, **pdl.options(x))
    return ids, weights
