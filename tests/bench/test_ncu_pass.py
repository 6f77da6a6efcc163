"""`bench/kernels/ncu_pass.py summary` on CSV pages in the layout Nsight Compute's `--csv` prints
(notes before the table, launch columns and rule columns, quoted fields with thousands separators
and line breaks, a metric name in two sections with different units, a units row on the raw page),
checked on the CPU before any device time is spent on a profile."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path


_spec = importlib.util.spec_from_file_location(
    "ncu_pass", Path(__file__).resolve().parents[2] / "bench" / "kernels" / "ncu_pass.py")
ncu_pass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_pass)

COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
           "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name",
           "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")


def _line(values) -> str:
    return ",".join(f'"{v}"' for v in values) + "\n"


def _detail(i, kernel, section, name, unit, value, rule=""):
    return _line((i, 7, "python3", "host", kernel, 1, 7, "(128, 1, 1)", "(9, 16, 1)", 0, "9.0", section, name, unit,
                  value, "", "", rule, "", ""))


def test_summary_groups_launches_by_kernel_with_units_sections_and_stalls(tmp_path, capsys):
    details = tmp_path / "pass.csv"
    details.write_text(
        "==PROF== Connected to process 7\n==PROF== Disconnected from process 7\n" + _line(COLUMNS)
        + _detail(0, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "Duration", "us", "18.00")
        + _detail(0, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "Memory Throughput", "%", "55.10")
        + _detail(0, "_moe_gate_up_kernel", "Memory Workload Analysis", "Memory Throughput", "Tbyte/s", "1.60",
                  rule="This kernel\nis latency bound, \"see\" the stalls")
        + _detail(0, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "61.5")
        + _detail(0, "_moe_gate_up_kernel", "Launch Statistics", "Registers Per Thread", "register/thread", "128")
        + _detail(1, "_router_fused_kernel", "GPU Speed Of Light Throughput", "Duration", "nsecond", "6,500.00")
        + _detail(2, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "Duration", "usecond", "20.00")
        + _detail(2, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "58.5")
        + _detail(2, "_moe_gate_up_kernel", "GPU Speed Of Light Throughput", "Memory Throughput", "%", "57.10")
        + _detail(2, "_moe_gate_up_kernel", "Memory Workload Analysis", "Memory Throughput", "Tbyte/s", "1.70"))
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    names = [stall.format(r) for r in ("long_scoreboard", "barrier", "wait", "selected")]
    raw = tmp_path / "raw.csv"
    raw.write_text(_line(("ID", "Kernel Name", "dram__bytes_read.sum", "dram__bytes_write.sum", *names))
                   + _line(("", "", "Mbyte", "Kbyte", *["ratio"] * len(names)))
                   + _line((0, "_moe_gate_up_kernel", "37.70", "100.00", "3.0", "1.0", "0.5", "9.0"))
                   + _line((1, "_router_fused_kernel", "1.05", "2.00", "0.2", "4.0", "1,000.5", "9.0"))
                   + _line((2, "_moe_gate_up_kernel", "37.70", "300.00", "5.0", "1.0", "0.5", "9.0")))
    out = tmp_path / "summary.json"
    assert ncu_pass.main(["summary", str(details), "--raw", str(raw), "--out", str(out)]) == 0
    rows = {r["kernel"]: r for r in json.loads(out.read_text())}
    gate_up, router = rows["_moe_gate_up_kernel"], rows["_router_fused_kernel"]
    assert (gate_up["calls"], gate_up["us"], gate_up["total_us"]) == (2, 19.0, 38.0)
    assert gate_up["dram_pct"] == 60.0 and gate_up["memory_pct"] == 56.1  # the % rows, not the Tbyte/s ones
    assert gate_up["registers"] == 128.0
    assert gate_up["dram_mb"] == 37.9 and gate_up["tb_per_s"] == 1.995  # 37.7 MB read + 0.1 / 0.3 written, 19 µs
    assert router["dram_mb"] == 1.052
    assert list(gate_up["stalls"]) == ["long_scoreboard", "barrier", "wait"]  # `selected` is issuing
    assert gate_up["stalls"]["long_scoreboard"] == 4.0
    assert router["us"] == 6.5 and list(router["stalls"])[0] == "wait" and router["stalls"]["wait"] == 1000.5
    table = capsys.readouterr().out
    assert table.index("_moe_gate_up_kernel") < table.index("_router_fused_kernel")  # by total time


def test_a_page_without_the_table_is_refused_by_name(tmp_path, capsys):
    page = tmp_path / "empty.csv"
    page.write_text("==ERROR== the application returned an error code (1)\n")
    assert ncu_pass.main(["summary", str(page)]) == 2
    assert "empty.csv" in capsys.readouterr().err
