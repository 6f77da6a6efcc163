"""`bench/kernels/ncu_pass.py summary` on CSV pages in the layout `ncu --csv` prints (notes before
the table, quoted fields, thousands separators, a units row on the raw page), checked on the CPU
before any device time is spent on a profile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
ncu_pass = pytest.importorskip("ncu_pass")

HEAD = '"ID","Process ID","Process Name","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'


def _detail(i, kernel, name, unit, value):
    return f'"{i}","7","python3","{kernel}","S","{name}","{unit}","{value}"\n'


def test_summary_groups_launches_by_kernel_with_units_and_stalls(tmp_path, capsys):
    details = tmp_path / "pass.csv"
    details.write_text("==PROF== Disconnected from process 7\n" + HEAD
                       + _detail(0, "_moe_gate_up_kernel", "Duration", "usecond", "18.00")
                       + _detail(0, "_moe_gate_up_kernel", "DRAM Throughput", "%", "61.5")
                       + _detail(0, "_moe_gate_up_kernel", "Registers Per Thread", "register/thread", "128")
                       + _detail(1, "_router_fused_kernel", "Duration", "nsecond", "6,500.00")
                       + _detail(2, "_moe_gate_up_kernel", "Duration", "usecond", "20.00")
                       + _detail(2, "_moe_gate_up_kernel", "DRAM Throughput", "%", "58.5"))
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    names = [stall.format(r) for r in ("long_scoreboard", "barrier", "wait")]
    raw = tmp_path / "raw.csv"
    raw.write_text('"ID","Kernel Name",' + ",".join(f'"{n}"' for n in names) + "\n"
                   + '"","",' + ",".join('"ratio"' for _ in names) + "\n"
                   + '"0","_moe_gate_up_kernel","3.0","1.0","0.5"\n'
                   + '"1","_router_fused_kernel","0.2","4.0","1,000.5"\n'
                   + '"2","_moe_gate_up_kernel","5.0","1.0","0.5"\n')
    out = tmp_path / "summary.json"
    assert ncu_pass.main(["summary", str(details), "--raw", str(raw), "--out", str(out)]) == 0
    rows = {r["kernel"]: r for r in __import__("json").loads(out.read_text())}
    gate_up, router = rows["_moe_gate_up_kernel"], rows["_router_fused_kernel"]
    assert (gate_up["calls"], gate_up["us"], gate_up["total_us"]) == (2, 19.0, 38.0)
    assert gate_up["dram_pct"] == 60.0 and gate_up["registers"] == 128.0
    assert list(gate_up["stalls"]) == ["long_scoreboard", "barrier", "wait"]
    assert gate_up["stalls"]["long_scoreboard"] == 4.0
    assert router["us"] == 6.5 and list(router["stalls"])[0] == "wait" and router["stalls"]["wait"] == 1000.5
    table = capsys.readouterr().out
    assert table.index("_moe_gate_up_kernel") < table.index("_router_fused_kernel")  # by total time
