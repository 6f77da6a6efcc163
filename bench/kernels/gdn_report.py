"""The report of bench/kernels/gdn_kernels.py: the correctness and timing tables, the verification
memory per request, gdn_kernels.json and .md (`write_report`), and the report of a run that its
time cap stopped before writing one, from its log (`report_from_log`, no GPU)."""

from __future__ import annotations

import datetime
import importlib
import json
import platform
import re
import sys
from pathlib import Path

import torch
from gdn_impls import SGLANG_VERSION
from gdn_problems import QWEN36, REPLAYSSM_RING, T_MAX, TOLERANCE, Setting, floor_us



def correctness_table(rows: list[dict]) -> str:
    """Per implementation and input dtype: the worst relative errors over all (w, m)."""
    lines = ["| impl | inputs | max rel. error o | max rel. error S_m | tolerance | passed |",
             "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["impl"], r["dtype"]), []).append(r)
    for (impl, dtype), group in groups.items():
        failed = [r for r in group if "error" in r]
        tolerance = TOLERANCE[getattr(torch, dtype)]
        if failed:
            lines.append(f"| {impl} | {dtype} | error (w={failed[0]['w']}): {failed[0]['error']} | | {tolerance:.0e} | no |")
            continue
        o_err, s_err = max(r["o_err"] for r in group), max(r["state_err"] for r in group)
        passed = "yes" if all(r["passed"] for r in group) else "NO"
        lines.append(f"| {impl} | {dtype} | {o_err:.2e} | {s_err:.2e} | {tolerance:.0e} | {passed} |")
    return "\n".join(lines)


def verification_memory(s: Setting) -> dict[str, int]:
    """Bytes each verifier keeps per request for a window of T_MAX tokens in all layers."""
    L, HK, HV, dk, dv, T = s.layers, s.key_heads, s.value_heads, s.key_dim, s.value_dim, T_MAX
    slot = L * T * (HV * (dv + 1) * 4 + HK * dk * 2)  # z / |k| fp32, g_cum fp32, the raw k bf16
    return {
        "hybridspec (one round's factors: z / |k| fp32, g_cum fp32, raw k bf16)": slot,
        "hybridspec (the runtime's two slots: this round's and the pending commit's)": 2 * slot,
        "sglang_default (per-token states, 16 x 30 x 32 x 128 x 128 x 4 B)": T * L * HV * dv * dk * 4,
        "sglang_replayssm (ring of 16: d, k bf16 + low parts, g fp32)":
            L * REPLAYSSM_RING * (2 * (HV * dv + HK * dk) * 2 + HV * 4),
    }


def timing_table(rows: list[dict]) -> str:
    by_key = {(r["impl"], r["w"], r["m"]): r for r in rows}
    configs = sorted({(r["w"], r["m"]) for r in rows}, key=lambda c: (c[0], -c[1]))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    head = "| impl | " + " | ".join(f"w={w} m={m}" for w, m in configs) + " |"
    lines = [head, "|---|" + "---|" * len(configs)]
    for name in impls:
        cells = [_cell(by_key.get((name, w, m))) for w, m in configs]
        lines.append(f"| {name} (us) | " + " | ".join(cells) + " |")
    for name in impls:
        if name != "hybridspec":
            label = "ours / floor" if name == "floor" else f"{name} / ours"
            cells = [_ratio(by_key.get((name, w, m)), by_key.get(("hybridspec", w, m)), name == "floor")
                     for w, m in configs]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    return f"{row['median_us']:.1f}" if row["median_us"] is not None else "error"


def _ratio(other: dict | None, ours: dict | None, inverse: bool) -> str:
    if not other or not ours or other["median_us"] is None or ours["median_us"] is None:
        return ""
    ratio = ours["median_us"] / other["median_us"] if inverse else other["median_us"] / ours["median_us"]
    return f"{ratio:.2f}x"


def versions() -> dict[str, str]:
    found = dict(python=platform.python_version(), torch=torch.__version__, cuda=str(torch.version.cuda),
                 sglang_kernels=SGLANG_VERSION)
    for package in ("triton", "fla"):
        try:
            found[package] = importlib.import_module(package).__version__
        except Exception as error:
            found[package] = f"unavailable ({type(error).__name__})"
    return found


def write_report(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdn_kernels.json").write_text(json.dumps(result, indent=2))
    errors = [f"- {r['impl']} w={r['w']} m={r['m']}: {r['error']}" for r in result["rows"] if "error" in r]
    sections = [
        "# GDN verify + commit, 30 layers of Qwen3.6-35B-A3B, batch 1",
        f"device: {result['device']}  \ndate: {result['date']}  \ncommand: `{result['command']}`  \n"
        f"versions: {json.dumps(result['versions'])}  \n"
        f"copy bandwidth (read + write): {result['copy_bandwidth_GBps']:.0f} GB/s"
        + (f" ({result['copy_bandwidth_source']})" if "copy_bandwidth_source" in result else ""),
        "## Median us per round (verify 30 layers + commit; ours: the commit folded into the next round's verify), "
        "bf16 inputs, fp32 states",
        timing_table(result["rows"]),
        *(["## Errors", "\n".join(errors)] if errors else []),
        "## Verification memory per request",
        "\n".join(f"- {k}: {v:,} B ({v / 1e9:.3f} GB)" for k, v in result["memory_bytes"].items()),
        "## Correctness vs float64 Eq. 1 (relative Frobenius error, worst over all w, m; every row in the JSON)",
        correctness_table(result["correctness"]),
    ]
    (out / "gdn_kernels.md").write_text("\n\n".join(sections) + "\n")


def report_from_log(log: Path, reference: Path | None, out: Path) -> int:
    """The report of a run that its time cap stopped before `write_report`: the correctness table
    (its worst errors per impl and dtype, one row each) and every timing row the log printed; the
    rows of the configurations it began but did not finish are recorded as not measured. The copy
    bandwidth comes from the log, or from `reference` (a report of the same machine), and says so."""
    text = log.read_text()
    correctness = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[1] in ("float32", "bfloat16") and cells[-1] in ("yes", "NO", "no"):
            failed = re.match(r"error \(w=(\d+)\): (.*)", " | ".join(cells[2:-3]))
            if failed:  # `correctness_table`'s "error (w=N): message" (the message may hold a |)
                correctness.append(dict(impl=cells[0], dtype=cells[1], w=int(failed.group(1)), m="?",
                                        error=failed.group(2)))
            elif len(cells) == 6:
                correctness.append(dict(impl=cells[0], dtype=cells[1], w="all", m="all", o_err=float(cells[2]),
                                        state_err=float(cells[3]), passed=cells[5] == "yes"))
    timed = {}
    for impl, w, m, value in re.findall(r"^  (\w+)\s+w=\s*(\d+) m=\s*(\d+)  (.+)$", text, flags=re.M):
        row = dict(impl=impl, w=int(w), m=int(m), median_us=None)
        try:
            row["median_us"] = float(value)
        except ValueError:
            row["error"] = value
        timed[(impl, int(w), int(m))] = row
    found = re.search(r"copy bandwidth \(read \+ write\) ([\d.]+) GB/s", text)
    ref = json.loads(reference.read_text()) if reference else {}
    printed = re.search(r"^device (.+); versions (\{.*\})$", text, flags=re.M)
    run_command = re.search(r"^command (.+)$", text, flags=re.M)
    if printed:
        device, versions_found = printed.group(1), json.loads(printed.group(2))
    else:
        device = ref.get("device", "unknown")
        versions_found = dict(ref.get("versions", {}), source=f"the run of {ref.get('date')}; this one printed none")
    if found:
        bandwidth, source = float(found.group(1)) * 1e9, "measured in this run"
    elif ref:
        bandwidth = ref["copy_bandwidth_GBps"] * 1e9
        source = f"measured by the run of {ref.get('date')} on the same machine, not printed by this one"
    else:
        sys.exit("--from-log: the log has no copy bandwidth; name a report of the same machine with --bandwidth-from")
    impls = list(dict.fromkeys(impl for impl, _, _ in timed))
    rows = []
    for w, m in dict.fromkeys((w, m) for _, w, m in timed):
        for name in impls:
            rows.append(timed.get((name, w, m), dict(impl=name, w=w, m=m, median_us=None,
                                                       error="not measured: the run's time cap stopped it here")))
        rows.append(dict(impl="floor", w=w, m=m, median_us=round(floor_us(QWEN36, w, bandwidth), 2)))
    result = dict(device=device, date=f"{datetime.date.today().isoformat()} (from {log.name})",
                  command=f"{run_command.group(1) if run_command else 'not printed by the run'}, stopped before its "
                          f"report; report by --from-log", versions=versions_found,
                  copy_bandwidth_GBps=bandwidth / 1e9, copy_bandwidth_source=source,
                  memory_bytes=verification_memory(QWEN36), rows=rows, correctness=correctness,
                  tuning="hybridspec.kernels.gdn.tuning.SHIPPED")
    write_report(out, result)
    print(timing_table(rows))
    return 0
