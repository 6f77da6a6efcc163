"""The launch-chain benchmark's kernel under the interpreter: each launch adds one to what the
previous wrote (so the chain is a true dependency), reading its own slice of the weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
launch_chain = pytest.importorskip("launch_chain")


@pytest.mark.parametrize("launches, grid, steps", [(3, 2, 2), (4, 1, 0)])
def test_a_chain_counts_its_launches(launches, grid, steps):
    asked = 2 * launch_chain.BLOCK * grid * steps
    links, last, read = launch_chain.chain(launches, grid, asked, False, "cpu")
    for link in links:
        link()
    assert last.tolist() == [float(launches)] * grid
    assert read == asked
