"""Triton dense product for calls of a few tokens: `reference.rows_linear`'s signature, one launch
(`rows.py`), no host read; and the GDN input projection with its causal conv + SiLU in the same
launch (`reference.linear_conv_silu`'s signature)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.gdn.conv import causal_conv_silu
from hybridspec.kernels.linear.rows import CONV_TAPS, launch_rows_linear

MAX_TOKENS = 4  # the kernel computes every token's sums from the same registers: a few tokens only
SMALL_TOKENS = 2  # `linear` takes the kernel for calls of at most this many tokens
MAX_K = 8192  # the widest row a program holds: 64 fp32 values a thread at 8,192 (bf16 measured to 4,096)
SLICE_BYTES = 4096  # weight bytes per program, at least MIN_ROWS rows (`bench/results/linear_notes.md`)
MIN_ROWS = 1


def slice_rows(k: int, element_size: int) -> int:
    """Rows of the weight per program: SLICE_BYTES of weight rounded up to a power of two, at least
    MIN_ROWS."""
    return max(MIN_ROWS, triton.next_power_of_2(max(1, SLICE_BYTES // (k * element_size))))


def rows_linear(x: Tensor, weight: Tensor, block_n: int | None = None, warps: int = 4) -> Tensor:
    """x [..., K] with at most MAX_TOKENS rows in all, weight [R, K] contiguous, same dtype → x W^T
    [..., R] in x's dtype (fp32 sums)."""
    if weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"rows_linear: weight must be a contiguous [R, K] matrix, got {tuple(weight.shape)} "
                         f"with strides {weight.stride()}")
    k = weight.shape[1]
    if x.shape[-1] != k or x.dtype != weight.dtype:
        raise ValueError(f"rows_linear: x {tuple(x.shape)} {x.dtype} does not match weight "
                         f"{tuple(weight.shape)} {weight.dtype}")
    if x.device != weight.device or not (x.is_cuda or interpreted()):
        raise ValueError(f"rows_linear: x on {x.device} and weight on {weight.device}: both must be on one CUDA "
                         "device (or the interpreter)")
    if not 0 < k <= MAX_K or x.dtype not in DTYPES:
        raise ValueError(f"rows_linear: K = {k} and dtype {x.dtype}: 0 < K <= {MAX_K}, one of {DTYPES}")
    rows = x.reshape(-1, k)
    if rows.shape[0] > MAX_TOKENS:
        raise ValueError(f"rows_linear: {rows.shape[0]} tokens, at most {MAX_TOKENS}")
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if rows.shape[0] and weight.shape[0]:
        launch_rows_linear(rows, weight, y, block_n or slice_rows(k, weight.element_size()), warps,
                           pdl.options(x))
    return y.view(*x.shape[:-1], weight.shape[0])


DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def takes_rows(x: Tensor, weight: Tensor) -> bool:
    """Whether `linear` takes the kernel: one to SMALL_TOKENS tokens, a contiguous weight of x's
    dtype (bf16, fp16 or fp32), 0 < K ≤ MAX_K, no autograd. From the shapes alone (no host read)."""
    k = x.shape[-1]
    return (0 < k <= MAX_K and 0 < x.numel() <= SMALL_TOKENS * k and x.dtype in DTYPES and weight.dtype == x.dtype
            and weight.is_contiguous() and not torch.is_grad_enabled() and (x.is_cuda or interpreted()))


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """F.linear(x, weight) (no bias): `rows_linear` where `takes_rows`, the library product otherwise."""
    return rows_linear(x, weight) if takes_rows(x, weight) else F.linear(x, weight)


def linear_conv_silu(x: Tensor, weight: Tensor, state: Tensor, conv_weight: Tensor, *,
                     x_out: Tensor) -> tuple[Tensor, Tensor]:
    """`reference.linear_conv_silu`: x [B, T, K], weight [R, K], state [B, C, KC − 1], conv_weight
    [C, 1, KC], x_out [B, T, C] → (silu(conv) of the leading C channels [B, T, C], the other channels
    [B, T, R − C]), both views of one [B, T, R] tensor. One launch (`rows.py`'s conv epilogue) for one
    sequence (B = 1) that `linear` gives the kernel, with KC = 4 taps; otherwise `linear`, then the
    conv's own launch."""
    c = conv_weight.shape[0]
    if (x.dim() == 3 and x.shape[0] == 1 and takes_rows(x, weight) and conv_weight.shape[-1] == CONV_TAPS
            and state.dtype == x.dtype and x_out.dtype == x.dtype and x_out.stride(-1) == 1 and c <= weight.shape[0]):
        t = x.shape[1]
        rows = x.reshape(t, x.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        y = torch.empty(1, t, weight.shape[0], dtype=x.dtype, device=x.device)
        launch_rows_linear(rows, weight, y[0], slice_rows(x.shape[-1], weight.element_size()), 4, pdl.options(x),
                           conv=(state[0], conv_weight, x_out[0]))
        return y[..., :c], y[..., c:]
    y = linear(x, weight)
    return causal_conv_silu(y[..., :c], state, conv_weight, x_out=x_out), y[..., c:]
