"""Peak host memory while loading a random-weight checkpoint of a preset's shapes.

Writes a sharded safetensors checkpoint (bf16, the preset's config with optionally fewer layers,
per-expert tensors as `save_pretrained` names them, or fused) to --dir, then loads it in a fresh
process with `load_target` and reports, from /proc/self/status, the process's resident memory after
its imports and a load of the `random-tiny` preset (the baseline: the code's pages, CUDA initialised
when --device is cuda), the peak during the load
(VmHWM, reset to the baseline before loading) and the peak beyond the baseline. On --device cpu the
weights themselves live in host memory, so the overhead is the peak beyond baseline + weights.

    .venv/bin/python bench/serving/load_memory.py --preset random-tiny --dir /tmp/ckpt      # seconds
    .venv/bin/python bench/serving/load_memory.py --preset qwen3.6-35b-a3b --layers 4 --dir /tmp/ckpt
    python bench/serving/load_memory.py --preset qwen3.6-35b-a3b --device cuda --dir /data/ckpt  # GPU machine

--reader safe_open loads the same checkpoint through safetensors' memory-mapped `safe_open` instead
of the runtime's chunked reads, for comparison. One JSON line per measurement goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30


def status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM, RssAnon, RssFile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def write_checkpoint(preset: str, layers: int | None, directory: Path, shard_bytes: int, fused: bool,
                     seed: int) -> dict:
    """A random bf16 checkpoint of `preset`'s shapes in `directory` (config.json, shards, index)."""
    import torch
    from safetensors.torch import save_file

    from hybridspec.runtime.config import target_config_from_dict
    from hybridspec.runtime.models.hybrid import HybridTarget
    from hybridspec.runtime.presets import preset_config

    raw = preset_config(preset)
    if layers is not None:
        raw["num_hidden_layers"] = layers
    cfg = target_config_from_dict(raw, preset)
    with torch.device("meta"):
        shapes = HybridTarget(cfg)
    gen = torch.Generator().manual_seed(seed)

    def tensors():  # (checkpoint name, shape), in the model's order
        for name, p in shapes.named_parameters():
            if not fused and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                prefix, inter = name.rsplit(".", 1)[0], cfg.moe_intermediate_size
                for e in range(cfg.num_experts):
                    if name.endswith("gate_up_proj"):
                        yield f"model.{prefix}.{e}.gate_proj.weight", (inter, cfg.hidden_size)
                        yield f"model.{prefix}.{e}.up_proj.weight", (inter, cfg.hidden_size)
                    else:
                        yield f"model.{prefix}.{e}.down_proj.weight", (cfg.hidden_size, inter)
            else:
                yield (name if name.startswith("lm_head") else f"model.{name}"), tuple(p.shape)

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    weight_map, shard, size, index, total = {}, {}, 0, 0, 0

    def flush():
        nonlocal shard, size, index
        if shard:
            index += 1
            file = f"model-{index:05d}.safetensors"
            save_file(shard, directory / file, metadata={"format": "pt"})
            weight_map.update({n: file for n in shard})
            shard, size = {}, 0

    for name, shape in tensors():
        t = torch.randn(shape, generator=gen, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
        shard[name] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= shard_bytes:
            flush()
    flush()
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return {"preset": preset, "layers": cfg.num_hidden_layers, "shards": index, "checkpoint_gib": total / GIB,
            "tensors": len(weight_map), "experts": "fused" if fused else "per-expert"}


def safe_open_stream(model, plan, device) -> None:
    """The comparison reader: safetensors' `safe_open` (memory-mapped), one tensor at a time."""
    import torch
    from safetensors import safe_open

    params = dict(model.named_parameters())
    by_file = {}
    for tensor, places in plan:
        by_file.setdefault(tensor.file, []).append((tensor, places))
    with torch.no_grad():
        for file, items in by_file.items():
            with safe_open(file, framework="pt", device="cpu") as f:
                for tensor, places in items:
                    whole = f.get_tensor(tensor.name)
                    for p in places:
                        params[p.param][p.index].copy_(p.transform(whole) if p.transform else whole)


def measure(directory: Path, device: str, dtype: str, reader: str) -> dict:
    """Load `directory` in this process and report its resident memory (run in a fresh process)."""
    import torch

    from hybridspec.runtime import loading, weights

    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # the CUDA context belongs to the baseline
    if reader == "safe_open":
        loading.stream_ = safe_open_stream
    loading.load_target("random-tiny", device=device, dtype=dtype)  # code pages of the load path in the baseline
    baseline = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample():  # the peaks of the anonymous and file-backed parts (VmHWM only has their sum)
        while not done.is_set():
            for field in peaks:
                peaks[field] = max(peaks[field], status(field))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    model = loading.load_target(directory, device=device, dtype=dtype)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    peak = status("VmHWM")
    weight_bytes = weights.weight_bytes(model, next(model.parameters()).dtype)
    on_host = weight_bytes if device == "cpu" else 0
    return {"device": device, "dtype": dtype, "reader": reader, "load_s": round(seconds, 1),
            "weights_gib": round(weight_bytes / GIB, 2), "baseline_rss_gib": round(baseline / GIB, 3),
            "peak_rss_gib": round(peak / GIB, 3), "peak_beyond_baseline_gib": round((peak - baseline) / GIB, 3),
            "host_overhead_gib": round((peak - baseline - on_host) / GIB, 3),
            "peak_rss_anon_gib": round(peaks["RssAnon"] / GIB, 3),
            "peak_rss_file_gib": round(peaks["RssFile"] / GIB, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3.6-35b-a3b")
    parser.add_argument("--layers", type=int, help="fewer layers than the preset (a smaller checkpoint of its shapes)")
    parser.add_argument("--dir", type=Path, required=True, help="where the checkpoint is written (reused if there)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shard-gib", type=float, default=4.0, help="shard size (Qwen's are about 4 GB)")
    parser.add_argument("--fused-experts", action="store_true", help="3-D expert tensors instead of per-expert ones")
    parser.add_argument("--reader", choices=("stream", "safe_open", "both"), default="stream")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    readers = ("stream", "safe_open") if args.reader == "both" else (args.reader,)
    if args.measure:
        print(json.dumps(measure(args.dir, args.device, args.dtype, readers[0])), flush=True)
        return
    if not (args.dir / "model.safetensors.index.json").is_file():
        start = time.perf_counter()
        written = write_checkpoint(args.preset, args.layers, args.dir, int(args.shard_gib * GIB),
                                   args.fused_experts, seed=0)
        print(json.dumps({**written, "write_s": round(time.perf_counter() - start, 1)}), flush=True)
    for reader in readers:
        cmd = [sys.executable, __file__, "--measure", "--dir", str(args.dir), "--device", args.device,
               "--dtype", args.dtype, "--reader", reader]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
