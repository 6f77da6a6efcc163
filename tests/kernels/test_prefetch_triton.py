"""The L2 prefetch's launch covers exactly the tensor's bytes, widened to whole units, once each:
per-line prefetches (128-byte lines) and bulk ones (units of 16 bytes, cut at the span's end)."""

import pytest
import torch

from hybridspec.kernels.prefetch import reference
from hybridspec.kernels.prefetch.triton import l2_prefetch, span


def issued_units(t: torch.Tensor, line: int) -> list[tuple[int, int]]:
    first, n_bytes = span(t, line)
    units = -(-n_bytes // line)
    out = torch.full((units + 3, 2), -1, dtype=torch.int64)  # 3 spare rows: nothing may land there
    l2_prefetch(t, line=line, issued=out)
    assert (out[units:] == -1).all()
    return [tuple(row) for row in out[:units].tolist()]


@pytest.mark.parametrize("line", [128, 16, 4096, 65536])
@pytest.mark.parametrize("dtype,numel,offset", [(torch.bfloat16, 1, 0), (torch.bfloat16, 37, 3), (torch.float32, 1000, 5),
                                                (torch.float32, 70_001, 0), (torch.bfloat16, 33_000, 17)])
def test_units_tile_the_span_once(line, dtype, numel, offset):
    base = torch.zeros(numel + offset, dtype=dtype)
    t = base[offset:]  # a view that starts off any alignment
    first, n_bytes = span(t, line)
    unit = 128 if line == 128 else 16
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    assert first % unit == 0 and (first + n_bytes) % unit == 0
    assert first <= start < first + unit and end <= first + n_bytes < end + unit
    units = issued_units(t, line)
    assert [o for o, _ in units] == [i * line for i in range(len(units))]
    assert all(size == min(line, n_bytes - o) and size > 0 and size % 16 == 0 for o, size in units)
    assert sum(size for _, size in units) == n_bytes
    assert torch.equal(t, torch.zeros_like(t))


def test_reference_and_kernel_change_nothing():
    t = torch.arange(300, dtype=torch.float32)
    reference.l2_prefetch(t)
    l2_prefetch(t)
    l2_prefetch(torch.empty(0))
    assert torch.equal(t, torch.arange(300, dtype=torch.float32))


@pytest.mark.parametrize("t,line,message", [
    (torch.zeros(4, 4).T, 128, "contiguous"),
    (torch.zeros(8), 24, "line"),
    (torch.zeros(8), 1 << 21, "line"),
])
def test_refused_with_the_reason(t, line, message):
    with pytest.raises(ValueError, match=message):
        l2_prefetch(t, line=line)


def test_issued_must_have_room():
    with pytest.raises(ValueError, match="room"):
        l2_prefetch(torch.zeros(1000), line=128, issued=torch.zeros(4, dtype=torch.int64))
