"""Triton dense products for calls of a few tokens (`reference.py`'s signatures, no host read):
`rows_linear` (one launch, `rows.py`); the dispatchers `linear`, `norm_linear` (the offset RMS norm of
the input applied inside the product's launch) and `gated_linear` (the GDN output norm applied
inside the out-projection's launch, `rows_gated.py`), which take the register-slice kernels for
calls of at most SMALL_TOKENS tokens and the norm kernel plus the library product otherwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.linear.rows import launch_rows_linear
from hybridspec.kernels.linear.rows_gated import launch_rows_gated_linear
from hybridspec.kernels.norm import triton as norm_triton

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


def takes_rows(rows: int, k: int, x: Tensor, weight: Tensor) -> bool:
    """Whether a product of `rows` rows of K = k values (x's dtype and device) by weight runs on the
    register-slice kernels: one to SMALL_TOKENS rows, a contiguous weight of x's dtype (bf16, fp16
    or fp32), 0 < K ≤ MAX_K, no autograd. Decided from the shapes alone (no host read)."""
    return (0 < k <= MAX_K and 0 < rows <= SMALL_TOKENS and x.dtype in DTYPES and weight.dtype == x.dtype
            and weight.is_contiguous() and not torch.is_grad_enabled() and (x.is_cuda or interpreted()))


def tokens(x: Tensor) -> int:
    """Rows of x [..., K] (from the shape: no host read)."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """F.linear(x, weight) (no bias): `rows_linear` where `takes_rows`, the library product otherwise."""
    return rows_linear(x, weight) if takes_rows(tokens(x), x.shape[-1], x, weight) else F.linear(x, weight)


def norm_linear(x: Tensor, norm_weight: Tensor, eps: float, residual: Tensor | None, weight: Tensor
                ) -> tuple[Tensor, Tensor]:
    """As `reference.norm_linear`: (offset_rms_norm(s) W^T, s), s = x (+ residual). Where `takes_rows`
    (and the rows are contiguous) one launch: each program normalises the rows itself and program 0
    stores s; otherwise the norm's launch, then `linear`."""
    k = x.shape[-1]
    rows_ok = x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1) and norm_weight.shape == (k,)
    if not (rows_ok and takes_rows(tokens(x), k, x, weight) and weight.shape[1] == k):
        h, s = norm_triton.offset_rms_norm(x, norm_weight, eps, residual)
        return linear(h, weight), s
    rows = x.reshape(-1, k)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"norm_linear: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    r = None if residual is None else residual.reshape(-1, k)
    s = x if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    launch_rows_linear(rows, weight, y, slice_rows(k, weight.element_size()), 4, pdl.options(x),
                       norm=(norm_weight, eps, r, None if r is None else s.view(-1, k)))
    return y.view(*x.shape[:-1], weight.shape[0]), s


def gated_linear(o: Tensor, z: Tensor, norm_weight: Tensor, eps: float, weight: Tensor) -> Tensor:
    """As `reference.gated_linear`: gated_rms_norm(o, z) [..., HV, D] flattened, times W^T, in z's
    dtype. Where `takes_rows` for the normalised rows, one launch (`rows_gated.py`); otherwise the
    norm's launch, then `linear`."""
    hv, d = z.shape[-2:]
    flat = z.shape[:-2] + (hv * d,)
    if (o.shape != z.shape or o.stride(-1) != 1 or z.stride(-1) != 1 or norm_weight.shape != (d,)
            or not takes_rows(z.numel() // max(1, hv * d), hv * d, z, weight) or weight.shape[1] != hv * d):
        return linear(norm_triton.gated_rms_norm(o, z, norm_weight, eps).reshape(flat), weight)
    os_, zs = o.reshape(-1, hv, d), z.reshape(-1, hv, d)
    y = torch.empty(zs.shape[0], weight.shape[0], dtype=z.dtype, device=z.device)
    launch_rows_gated_linear(os_, zs, norm_weight, eps, weight, y, slice_rows(hv * d, weight.element_size()), 4,
                             pdl.options(z))
    return y.view(*flat[:-1], weight.shape[0])
