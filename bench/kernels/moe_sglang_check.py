"""The self-check of bench/kernels/moe_sglang.py (SGLang's Triton fused MoE as the baseline) and the
configs SGLang picks for the presets.

    python bench/kernels/moe_sglang_check.py              # self-check (CPU: under TRITON_INTERPRET=1)
    python bench/kernels/moe_sglang_check.py --configs    # the configs SGLang picks for the presets

The self-check runs `SglangMoE.run` against the routed experts token by token in float64
(`reference`) on small shapes, compares the two aligners (the wheel's Triton `moe_align_small_numel`
and `align_block_size_torch`), runs the TMA path with tuned-style config files, and on a GPU the
bf16 presets' shape and a CUDA-graph replay on new routing. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from moe_sglang import ROOT, MoeAlignment, SglangMoE  # this script's folder, bench/kernels, is on sys.path
from torch import Tensor


def reference(x: Tensor, ids: Tensor, weights: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    """The routed experts token by token in float64."""
    x, w13, w2, weights = x.double(), w13.double(), w2.double(), weights.double()
    out = torch.zeros_like(x)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (x[t] @ w13[e].T).chunk(2)
            out[t] += weights[t, j] * ((F.silu(gate) * up) @ w2[e].T)
    return out


def _routing(T: int, E: int, k: int, generator: torch.Generator, device) -> tuple[Tensor, Tensor]:
    logits = torch.randn(T, E, generator=generator).to(device)
    weights, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return ids.to(torch.int32).contiguous(), (weights / weights.sum(-1, keepdim=True)).float().contiguous()


def _same_alignment(a: MoeAlignment, b: MoeAlignment) -> bool:
    total = int(a.num_tokens_post_padded[0])
    block = a.config["BLOCK_SIZE_M"]
    return (total == int(b.num_tokens_post_padded[0])
            and torch.equal(a.sorted_token_ids[:total], b.sorted_token_ids[:total])
            and torch.equal(a.expert_ids[: total // block], b.expert_ids[: total // block])
            and all(bool((c.expert_ids[total // block:] == -1).all()) for c in (a, b)))


def self_check(device, dtype: torch.dtype, E: int, k: int, H: int, I: int, tokens, tol: float,
               device_name: str | None = None, seed: int = 0) -> bool:
    """run(...) against `reference` on random inputs (output poisoned with NaN first), both
    aligners against each other; prints one line per T; True if all pass."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(device, dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(device, dtype)
    moe = SglangMoE(w13, w2, k, device_name, max_tokens=max(tokens), aligner="torch")
    moe_triton = SglangMoE(w13, w2, k, device_name, max_tokens=max(tokens), aligner="triton")
    ok = True
    print(f"E={E} k={k} H={H} I={I} {dtype} device_name={moe.device_name!r} config files: {moe.config_files}")
    for T in tokens:
        x = torch.randn(T, H, generator=g).to(device, dtype)
        ids, weights = _routing(T, E, k, g, device)
        aligned = moe.align(ids)
        same = _same_alignment(aligned, moe_triton.align(ids))
        moe.out.fill_(float("nan"))
        moe.cache3.fill_(float("nan"))
        y = moe.run(x, ids, weights, aligned).double()
        ref = reference(x, ids, weights, w13, w2)
        err = ((y - ref).norm() / ref.norm()).item()
        max_abs = (y - ref).abs().max().item()
        good = bool(torch.isfinite(y).all()) and err < tol and same
        ok &= good
        c = moe.config_for(T)
        print(f"  T={T}: rel err {err:.2e}  max abs err {max_abs:.2e}  (tol {tol:g})  aligners agree: {same}  "
              f"BLOCK_SIZE_M={c['up']['BLOCK_SIZE_M']} down_tma={c['down_tma']}  {'ok' if good else 'FAIL'}")
    return ok


def _config_report(device_name: str, max_tokens: int) -> None:
    """The up/down configs SGLang picks at each T for the presets' expert shapes (bf16), with the
    M keys of the config files they come from."""
    from hybridspec.runtime.presets import preset_config  # noqa: E402 (repo root on sys.path)

    seen = set()
    for name in ("qwen3.5-35b-a3b", "qwen3.5-122b-a10b"):
        c = preset_config(name)
        E, k, H, I = c["num_experts"], c["num_experts_per_tok"], c["hidden_size"], c["moe_intermediate_size"]
        if (E, k, H, I) in seen:
            continue
        seen.add((E, k, H, I))
        w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="meta")  # shapes only
        w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device="meta")
        moe = SglangMoE(w13, w2, k, device_name, max_tokens=max_tokens)
        with moe.device_lookup() as cfg:
            tables = [cfg.get_moe_configs(E, I, None, 0, 0, down_moe=down) for down in (False, True)]
        print(f"{name}: E={E} k={k} H={H} I={I} bf16 on {device_name!r}")
        print(f"  files: {moe.config_files}")
        previous, start = None, 1
        for t in range(1, max_tokens + 2):
            keys = tuple(min(table, key=lambda m: abs(m - t)) if table else None for table in tables)
            row = (keys, moe.configs[t][:4]) if t <= max_tokens else None
            if previous is not None and row != previous:
                (up_key, down_key), (config, down, down_tma, up_tma) = previous
                print(f"  T={start}..{t - 1}: up key {up_key} {config}; down key {down_key} "
                      f"{down if down is not None else '(the up config)'}; down_tma={down_tma} up_tma={up_tma}")
                start = t
            previous = row


def _alignment_check(device, E: int = 256, k: int = 8) -> bool:
    """The wheel's Triton `moe_align_small_numel` against `align_block_size_torch` for E = 256,
    k = 8 (the path SGLang takes for T*k <= 64 on CUDA) and block sizes 16 and 64."""
    g = torch.Generator().manual_seed(1)
    w13 = torch.empty(E, 64, 32, device="meta")
    w2 = torch.empty(E, 32, 32, device="meta")
    ok = True
    for block in (16, 64):
        moes = [SglangMoE(w13, w2, k, "none", max_tokens=8, aligner=a) for a in ("triton", "torch")]
        for moe in moes:  # the block size under test, whatever the default config says
            moe.configs = [None] + [({**c[0], "BLOCK_SIZE_M": block},) + c[1:] for c in moe.configs[1:]]
        for T in (1, 3, 8):
            ids, _ = _routing(T, E, k, g, device)
            a, b = (moe.align(ids) for moe in moes)
            same = _same_alignment(a, b)
            ok &= same
            print(f"alignment E={E} k={k} T={T} BLOCK_SIZE_M={block}: padded count "
                  f"{int(b.num_tokens_post_padded[0])}, Triton and torch agree: {same}")
    return ok


def _graph_check(device, E: int = 256, k: int = 8, H: int = 2048, I: int = 512, T: int = 4) -> bool:
    """`run` captured in a CUDA graph, replayed after re-aligning new routing into the same
    alignment buffers, against `reference` (bf16, this GPU's configs)."""
    g = torch.Generator().manual_seed(2)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(device, torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(device, torch.bfloat16)
    moe = SglangMoE(w13, w2, k, max_tokens=16)
    x = torch.randn(T, H, generator=g).to(device, torch.bfloat16)
    ids, weights = _routing(T, E, k, g, device)
    aligned = moe.align(ids)
    moe.run(x, ids, weights, aligned)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe.run(x, ids, weights, aligned)
    ok = True
    for _ in range(2):
        new_ids, new_weights = _routing(T, E, k, g, device)
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        x.copy_(torch.randn(T, H, generator=g).to(device, torch.bfloat16))
        moe.align(ids, into=aligned)
        y.fill_(float("nan"))
        graph.replay()
        ref = reference(x, ids, weights, w13, w2)
        err = ((y.double() - ref).norm() / ref.norm()).item()
        good = bool(torch.isfinite(y).all()) and err < 1e-2
        ok &= good
        print(f"CUDA graph replay E={E} k={k} H={H} I={I} T={T} bf16: rel err {err:.2e}  "
              f"{'ok' if good else 'FAIL'}")
    return ok


def _tma_case(device) -> bool:
    """The self-check with tuned-style config files for the tiny shape under the name "NVIDIA H200"
    (a down config with USE_TMA), through SGLang's SGLANG_MOE_CONFIG_DIR."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "configs" / "triton_3_6_0"
        folder.mkdir(parents=True)
        base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 2}
        for suffix, extra in (("", {}), ("_down", {"USE_TMA": True})):
            (folder / f"E=8,N=32,device_name=NVIDIA_H200,dtype=float32{suffix}.json").write_text(
                json.dumps({"1": {**base, **extra}, "64": {**base, **extra}}))
        saved = os.environ.get("SGLANG_MOE_CONFIG_DIR")
        os.environ["SGLANG_MOE_CONFIG_DIR"] = tmp
        try:
            return self_check(device, torch.float32, E=8, k=2, H=64, I=32, tokens=(1, 4), tol=5e-3,
                              device_name="NVIDIA H200")
        finally:
            if saved is None:
                os.environ.pop("SGLANG_MOE_CONFIG_DIR")
            else:
                os.environ["SGLANG_MOE_CONFIG_DIR"] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", action="store_true", help="print the configs SGLang picks for the presets")
    parser.add_argument("--device-name", default="NVIDIA H200", help="device name for --configs")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--tma-case", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # SGLang's "using default config" warnings
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when SGLang's kernels are decorated
        torch.set_num_threads(1)
    if args.configs:
        sys.path.insert(0, str(ROOT))
        _config_report(args.device_name, args.max_tokens)
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    ok = True
    if args.tma_case:
        return 0 if _tma_case(device) else 1
    # SGLang casts the kernel's fp32 accumulator to fp16 unless the activations are bf16, so fp32
    # inputs are checked at fp16 precision (on a GPU the fp32 dots also run in tf32: about 2.4e-3
    # seen on an H200, 5e-4 under the interpreter).
    ok &= self_check(device, torch.float32, E=8, k=2, H=64, I=32, tokens=(1, 2, 3, 4), tol=5e-3)
    ok &= self_check(device, torch.float32, E=8, k=4, H=64, I=32, tokens=(1, 3), tol=5e-3)  # Triton sum over k
    # The TMA path (sorted up-GEMM rows, TensorDescriptors in the down GEMM, filtered activation).
    # Under the interpreter the kernel's Python `assert use_fp8_w8a8 and group_n > 0 …` on the A
    # descriptor runs (compiled Triton drops asserts unless TRITON_DEBUG is set), so that case runs
    # in a `python -O` child there.
    ok &= _alignment_check(device)
    if cuda or sys.flags.optimize:
        ok &= _tma_case(device)
    else:
        import subprocess
        sys.stdout.flush()
        child = subprocess.run([sys.executable, "-O", __file__, "--tma-case"], env=os.environ)
        ok &= child.returncode == 0
    if cuda:
        ok &= self_check(device, torch.bfloat16, E=256, k=8, H=2048, I=512, tokens=(1, 4, 8, 16, 64), tol=1e-2)
        ok &= _graph_check(device)
    print("self-check", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
