"""Bring a tensor's bytes into the L2 cache ahead of the kernel that reads them (a hint: no value
changes). With `line` = 128 each thread issues `prefetch.global.L2` for cache lines of the span;
with a larger `line` (a multiple of 16) each thread issues one `cp.async.bulk.prefetch.L2` of that
many bytes, which the SM's copy engine carries out after the program has left. The span is the
tensor's bytes widened to whole 16-byte units (128-byte lines for the per-line form): a unit that
holds one byte of an allocation lies wholly inside its page, so nothing unmapped is touched."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import check_device, interpreted

PER_PROGRAM = {128: (1024, 4)}  # line bytes → (prefetches per program, warps); other lines: (32, 1)


@triton.jit
def l2_prefetch_kernel(start, n_bytes, p_issued, LINE: tl.constexpr, BLOCK: tl.constexpr, ISSUE: tl.constexpr,
                       RECORD: tl.constexpr):
    """Program i prefetches units i·BLOCK … i·BLOCK + BLOCK − 1 of LINE bytes from address `start`
    (aligned to LINE for lines of 128, to 16 otherwise); the last unit is cut at n_bytes. ISSUE: the
    PTX (off under the interpreter, which cannot run it); RECORD: each unit's (offset, bytes) in
    p_issued [units, 2] (tests)."""
    i_p = tl.program_id(0)
    o_unit = i_p * BLOCK + tl.arange(0, BLOCK)
    o_byte = o_unit.to(tl.int64) * LINE
    b_size = tl.minimum(tl.maximum(n_bytes - o_byte, 0), LINE).to(tl.int32)  # 0: past the span
    if ISSUE:
        if LINE == 128:
            tl.inline_asm_elementwise(
                "{ .reg .pred %p; setp.gt.s32 %p, $2, 0; @%p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [start + o_byte, b_size], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred %p; setp.gt.s32 %p, $2, 0; @%p cp.async.bulk.prefetch.L2.global [$1], $2; "
                "mov.u32 $0, 0; }",
                "=r,l,r", [start + o_byte, b_size], dtype=tl.int32, is_pure=False, pack=1)
    if RECORD:
        mask = b_size > 0
        tl.store(p_issued + o_unit * 2, o_byte, mask=mask)
        tl.store(p_issued + o_unit * 2 + 1, b_size.to(tl.int64), mask=mask)


def span(t: Tensor, line: int) -> tuple[int, int]:
    """(first address, bytes) that `l2_prefetch` covers for t: its bytes widened to whole units of
    128 bytes (line 128) or 16 bytes (bulk)."""
    unit = 128 if line == 128 else 16
    first = t.data_ptr() // unit * unit
    end = -(-(t.data_ptr() + t.numel() * t.element_size()) // unit) * unit
    return first, end - first


def l2_prefetch(t: Tensor, *, line: int = 128, issued: Tensor | None = None) -> None:
    """t: a contiguous tensor (a weight) → its bytes on their way into the L2 cache, on the current
    stream, in one launch. line: 128 (per-line prefetches) or a multiple of 16 of at most 2**20
    (bulk prefetches of that size). issued: int64 [units, 2], where the launch writes each unit's
    (offset from the span's first address, bytes) instead of issuing it (tests under the
    interpreter)."""
    if not t.is_contiguous():
        raise ValueError(f"l2_prefetch: the tensor must be contiguous, got shape {tuple(t.shape)} strides {t.stride()}")
    if line != 128 and not (line % 16 == 0 and 0 < line <= 1 << 20):
        raise ValueError(f"l2_prefetch: line must be 128 or a multiple of 16 up to 2**20 bytes, got {line}")
    check_device("l2_prefetch", t=t, issued=issued)
    if t.numel() == 0:
        return
    first, n_bytes = span(t, line)
    block, warps = PER_PROGRAM.get(line, (32, 1))
    units = -(-n_bytes // line)
    if issued is not None and (issued.dtype.itemsize != 8 or issued.is_floating_point() or issued.numel() < 2 * units):
        raise ValueError(f"l2_prefetch: issued must be int64 with room for {units} × 2 entries")
    l2_prefetch_kernel[(triton.cdiv(units, block),)](
        first, n_bytes, t if issued is None else issued, LINE=line, BLOCK=block, ISSUE=not interpreted(),
        RECORD=issued is not None, num_warps=warps)
