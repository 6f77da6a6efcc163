"""The MoE benchmark's report: `moe_kernels.md` from its result (the dict written as `moe_kernels.json`)."""

from __future__ import annotations

import json
from pathlib import Path


def write_report(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_kernels.json").write_text(json.dumps(result, indent=2))
    lines = ["# One MoE layer (routed + shared expert), bf16, batch 1", "",
             "SGLang's fused_moe runs the routed experts only, its alignment prepared outside the timed call; "
             "`hybridspec[routed only]` does the same work (finding its experts included), beside the floor of the routed "
             "experts' bytes (`floor_routed`).", "",
             f"device: {result['device']}  ", f"date: {result['date']}  ", f"command: `{result['command']}`  ",
             f"versions: {json.dumps(result['versions'])}  ",
             f"copy bandwidth (read + write): {result['copy_bandwidth_GBps']:.0f} GB/s", ""]
    for model in result["models"]:
        rows = [r for r in result["rows"] if r["model"] == model]
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        for routing in ("random", "controlled"):
            sel = [r for r in rows if r["routing"] == routing]
            keys = list(dict.fromkeys((r["T"], r["distinct"]) for r in sel))
            if not keys:
                continue
            lines += [f"## {model}, {'random routing' if routing == 'random' else 'T = 16, controlled distinct experts'}: median µs per call", "",
                      "| T | distinct | " + " | ".join(impls) + " | ours / floor | SGLang / ours | routed: ours / floor "
                      "| routed: SGLang / ours |",
                      "|---|---|" + "---|" * (len(impls) + 4)]
            for T, d in keys:
                cell = {r["impl"]: r for r in sel if (r["T"], r["distinct"]) == (T, d)}
                us = {i: cell.get(i, {}).get("median_us") for i in impls}
                vals = [f"{us[i]:.1f}" if us[i] else "—" for i in impls]
                o, f, g = us.get("hybridspec"), us.get("floor"), us.get("sglang_fused_moe")
                r, fr = us.get("hybridspec[routed only]"), us.get("floor_routed")
                ratios = [f"{o / f:.2f}×" if o and f else "—", f"{g / o:.2f}×" if o and g else "—",
                          f"{r / fr:.2f}×" if r and fr else "—", f"{g / r:.2f}×" if r and g else "—"]
                lines.append(f"| {T} | {d:.1f} | " + " | ".join(vals + ratios) + " |")
            lines.append("")
    lines += ["## η (µs per distinct expert, T = 16, least squares over the controlled sweep)", "",
              "| model | impl | η | intercept | correlation |", "|---|---|---|---|---|"]
    lines += [f"| {e['model']} | {e['impl']} | {e['eta_us']} | {e['intercept_us']} | {e['correlation']} |"
              for e in result["eta"]]
    lines += ["", "## Correctness (relative Frobenius error against fp32 on the same bf16 weights)", "",
              "| model | T | impl | rel err |", "|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['T']} | {r['impl']} | {r['rel_err']:.2e} |" for r in result["checks"]
              if "rel_err" in r]
    lines += [f"- {r['model']}: " + (f"sync-free under set_sync_debug_mode('error'): {r['sync_free']}" if "sync_free" in r
                                     else f"graph replay on new inputs: rel err {r['graph_rel_err']:.2e}")
              for r in result["checks"] if "rel_err" not in r]
    if result.get("runtime"):
        lines += ["", "## qwen3.6-35b-a3b preset, 128-token prompt, eager rounds (Triton GDN)", "",
                  "| experts | policy | rounds | mean w | ms / round | ms / token |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['experts']} | {r['policy']} | {r['rounds']} | {r['mean_w']} | {r['ms_per_round']} | "
                  f"{r['ms_per_token']} |" for r in result["runtime"]]
    (out / "moe_kernels.md").write_text("\n".join(lines) + "\n")


