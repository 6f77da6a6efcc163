"""Distinct experts of a call, found on the device in one single-program launch.

From ids [N, k] it writes, into an int32 workspace:
    slot_expert [N·k]    the distinct experts in increasing id order (entries >= count unused)
    slot_kpos   [N·k, BM] for slot s and token n, the position j with ids[n, j] = slot_expert[s], or -1
    count       [1]      the number of distinct experts
    arrivals    [tiles]  zeroed: the down kernel's per-column-tile arrival counters
so that the expert kernels run one slot per distinct expert (each expert's weights read once) over
a grid fixed by (N, k), and the host reads nothing. Phases are separated by CTA barriers: the
expert-presence map is scattered into global scratch [E], turned into slots by an exclusive prefix
sum, and each assignment then scatters its position into its expert's slot row. Under expert
parallelism the call holds experts [first, first + E) of the whole set: an assignment to another
expert is left out (no slot, no position), so it costs nothing here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release

@triton.jit
def _moe_slots_kernel(ids_ptr, scratch_ptr, slot_expert_ptr, slot_kpos_ptr, count_ptr, arrivals_ptr, TILES,
                      FIRST, N, K: tl.constexpr, E: tl.constexpr, EP: tl.constexpr,
                      NKP: tl.constexpr, BM: tl.constexpr, FILL: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    o_e = tl.arange(0, EP)
    o_a = tl.arange(0, NKP)
    a_ok = o_a < N * K
    b_ids = tl.load(ids_ptr + o_a, mask=a_ok, other=0).to(tl.int32) - FIRST  # [NKP] expert of each assignment
    a_ok = a_ok & (b_ids >= 0) & (b_ids < E)  # held by this call
    tl.store(scratch_ptr + o_e, tl.zeros([EP], tl.int32), mask=o_e < E)
    o_f = tl.arange(0, FILL)
    for r in range(0, N * K * BM, FILL):
        tl.store(slot_kpos_ptr + r + o_f, tl.full([FILL], -1, tl.int32), mask=r + o_f < N * K * BM)
    for r in range(0, TILES, FILL):
        tl.store(arrivals_ptr + r + o_f, tl.zeros([FILL], tl.int32), mask=r + o_f < TILES)
    tl.debug_barrier()
    tl.store(scratch_ptr + b_ids, tl.full([NKP], 1, tl.int32), mask=a_ok)
    tl.debug_barrier()
    b_present = tl.load(scratch_ptr + o_e, mask=o_e < E, other=0)  # [EP] 1 where some token routes
    b_slot = tl.cumsum(b_present, 0) - b_present  # [EP] exclusive prefix sum: slot of each expert
    tl.store(slot_expert_ptr + b_slot, o_e, mask=b_present > 0)
    tl.store(count_ptr, tl.sum(b_present, 0))
    tl.debug_barrier()
    tl.store(scratch_ptr + o_e, b_slot, mask=o_e < E)
    tl.debug_barrier()
    b_s = tl.load(scratch_ptr + b_ids, mask=a_ok, other=0)  # [NKP] slot of each assignment
    tl.store(slot_kpos_ptr + b_s * BM + o_a // K, o_a % K, mask=a_ok)


def expert_slots(ids, workspace, n_experts: int, block_m: int, tiles: int, first_expert: int = 0):
    """ids [N, k] (contiguous, N <= block_m) → (slot_expert [N·k], slot_kpos [N·k, BM], count [1],
    arrivals [tiles]) views of `workspace` (int32, `workspace_size` entries), written by one
    launch, over the experts [first_expert, first_expert + n_experts) of the ids (slot_expert
    indexes those). N is a runtime argument: one compiled kernel serves every N up to block_m."""
    n, k = ids.shape
    nk = n * k
    scratch, rest = workspace[:n_experts], workspace[n_experts:]
    slot_expert, slot_kpos = rest[:nk], rest[nk : nk + nk * block_m].view(nk, block_m)
    count = rest[nk + nk * block_m : nk + nk * block_m + 1]
    arrivals = rest[nk + nk * block_m + 1 : nk + nk * block_m + 1 + tiles]
    _moe_slots_kernel[(1,)](ids, scratch, slot_expert, slot_kpos, count, arrivals, tiles, first_expert,
                            N=n, K=k, E=n_experts,
                            EP=triton.next_power_of_2(n_experts), NKP=triton.next_power_of_2(block_m * k),
                            BM=block_m, FILL=1024, num_warps=4, **pdl.options(ids))
    return slot_expert, slot_kpos, count, arrivals


def workspace_size(n_tokens: int, top_k: int, n_experts: int, block_m: int, tiles: int) -> int:
    """int32 entries `expert_slots` needs."""
    nk = n_tokens * top_k
    return n_experts + nk * (block_m + 1) + 1 + tiles
