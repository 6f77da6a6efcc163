"""Launch parameters of the MoE kernels per token count (frozen; passed as `tuning=`)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class MoETuning:
    """gate_up_*: tile of BN intermediate columns (gate and up rows) over BK hidden columns per step;
    down_*: tile of BH hidden outputs over BK intermediate columns per step. rows: the register-slice
    kernels instead (`gate_up_rows.py`, `down_rows.py`; calls of at most ROWS_MAX_TOKENS tokens), each
    program rows_bn intermediate columns of gate_up or rows_bh hidden outputs of down, rows_warps warps."""

    gate_up_bn: int = 32
    gate_up_bk: int = 256
    gate_up_warps: int = 4
    gate_up_stages: int = 3
    down_bh: int = 64
    down_bk: int = 128
    down_warps: int = 4
    down_stages: int = 3
    rows: bool = False
    rows_bn: int = 2
    rows_bh: int = 2
    rows_warps: int = 4

    def __post_init__(self):
        for name in ("gate_up_bn", "gate_up_bk", "down_bh", "down_bk"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"MoETuning.{name} = {value}: a power of two >= 16 (tl.dot's smallest tile)")
        for name in ("rows_bn", "rows_bh"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"MoETuning.{name} = {value}: a power of two")
        for name in ("gate_up_warps", "down_warps", "rows_warps"):
            if getattr(self, name) not in (1, 2, 4, 8):
                raise ValueError(f"MoETuning.{name} = {getattr(self, name)}: 1, 2, 4 or 8")
        for name in ("gate_up_stages", "down_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoETuning.{name} must be >= 1")


ROWS_MAX_TOKENS = 4  # the register-slice kernels unroll their tokens: a few only

# Keyed by the largest token count a row serves; a call takes the first row with key >= N.
MOE_TUNING = MappingProxyType({
    1: MoETuning(rows=True, rows_bn=1, rows_bh=1),
    2: MoETuning(rows=True, rows_bn=1),
    64: MoETuning(),
})


def tuning_for(n_tokens: int, table=MOE_TUNING) -> MoETuning:
    """The row of `table` for a call with n_tokens tokens (the last row beyond every key); a row with
    `rows` serves at most ROWS_MAX_TOKENS tokens."""
    for limit in sorted(table):
        if n_tokens <= limit:
            row = table[limit]
            break
    else:
        row = table[max(table)]
    if row.rows and n_tokens > ROWS_MAX_TOKENS:
        raise ValueError(f"MoE tuning: the register-slice row serves at most {ROWS_MAX_TOKENS} tokens, "
                         f"not {n_tokens} (its key must be <= {ROWS_MAX_TOKENS})")
    return row


SHARED_MEMORY = 160 * 1024  # bytes of pipelined tiles a program may hold (Hopper: 227 KB per block)


def step_width(bk: int, depth: int, rows: int, element_size: int, stages: int) -> int:
    """The step width BK for tiles of `rows` rows: the tuning's, no wider than the depth (a power
    of two >= 16), halved until `stages` buffered steps fit SHARED_MEMORY (fp32 tiles take twice
    the bytes of the bf16 ones a tuning is measured with)."""
    bk = min(bk, max(16, 1 << (depth - 1).bit_length()))
    while bk > 16 and stages * rows * bk * element_size > SHARED_MEMORY:
        bk //= 2
    return bk
