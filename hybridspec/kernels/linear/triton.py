"""Triton dense product for calls of a few tokens: `reference.rows_linear`'s signature, one launch
(`rows.py`), no host read."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.linear.rows import launch_rows_linear

MAX_TOKENS = 16  # the kernel computes every token's sums from the same registers: a round's tokens at most
SMALL_TOKENS = 2  # `linear` takes the kernel for calls of at most this many tokens
# and, in fp32, for calls of at most FP32_TOKENS tokens by a weight of at most FP32_WEIGHT elements: the
# library's fp32 products (SIMT, K in steps of 8) are chains of memory round trips at such sizes
FP32_TOKENS = 16
FP32_WEIGHT = 1 << 22
MAX_K = 8192  # the widest row a program holds: 64 fp32 values a thread at 8,192
SLICE_BYTES = 4096  # weight bytes per program, at least one row (`bench/results/linear_notes.md`)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def slice_rows(k: int, element_size: int) -> int:
    """Rows of the weight per program: SLICE_BYTES of weight rounded up to a power of two, at least one."""
    return triton.next_power_of_2(max(1, SLICE_BYTES // (k * element_size)))


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


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """F.linear(x, weight) (no bias): calls of one to SMALL_TOKENS tokens (in fp32, to FP32_TOKENS
    tokens by a weight of at most FP32_WEIGHT elements) with a contiguous weight of x's dtype (bf16,
    fp16 or fp32), 0 < K ≤ MAX_K, and no autograd take `rows_linear`, the rest the library product.
    Chosen from the shapes alone (no host read)."""
    k = x.shape[-1]
    small = SMALL_TOKENS
    if x.dtype == torch.float32 and weight.numel() <= FP32_WEIGHT:
        small = FP32_TOKENS
    if (0 < k <= MAX_K and 0 < x.numel() <= small * k and x.dtype in DTYPES and weight.dtype == x.dtype
            and weight.is_contiguous() and not torch.is_grad_enabled() and (x.is_cuda or interpreted())):
        return rows_linear(x, weight)
    return F.linear(x, weight)
