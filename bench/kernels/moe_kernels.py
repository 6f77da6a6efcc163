"""One MoE layer on the GPU: ours (`hybridspec.kernels.moe.triton`) beside SGLang's Triton
fused_moe, the PyTorch loop and the weight-read floor, for the Qwen3.6-35B-A3B and
Qwen3.5-122B-A10B shapes (bf16), then the 35B preset's decoding rounds with each MoE.

    python3 bench/kernels/moe_kernels.py --out OUT [--quick] [--models 35b,122b] [--no-runtime]

Phases, each printed as it runs and written to OUT/moe_kernels.json and .md:
1. correctness (before any timing): ours, the PyTorch loop and SGLang against an fp32 per-token
   computation on the same bf16 weights, T in {1, 4, 16, 40}; ours under
   `torch.cuda.set_sync_debug_mode("error")` (a host read raises) and captured in a CUDA graph;
2. timing: median µs per call of one CUDA graph of ROTATIONS calls, each on its own copy of the
   layer's weights and its own inputs (so neither the weights nor the inputs sit in L2 from the
   previous call), 20 samples of 10 replays; T in {1, 2, 4, 8, 12, 16} with random routing, and
   at T = 16 a sweep of exactly n distinct experts (n = 8 ... 128) from which η (µs per distinct
   expert) and the intercept are fitted; SGLang's alignment step runs before capture (untimed),
   as the routing it prepares is the call's; the PyTorch loop (host reads, not capturable) is
   timed eagerly; the floor is the bytes of the distinct experts' weights plus the shared expert
   over the device-to-device copy bandwidth measured in the same run; ours on the routed experts
   only (`hybridspec[routed only]`, SGLang's kernel's work) beside `floor_routed`, the routed
   experts' bytes alone; with --sweep also the tables of SWEEP, the down launches of DOWN_SWEEP and
   the gate_up launch alone
   (`hybridspec[gate_up]`; the down launch takes the rest of the whole call);
3. runtime: the `qwen3.6-35b-a3b` preset (random weights, bf16, Triton GDN, random drafter),
   `ar`, `static:4` and `full` on a 128-token prompt, ms per round and per token, with the
   experts of every layer run by the PyTorch loop and by ours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import copy_bandwidth, graph_us
from moe_report import write_report

from hybridspec.collectors.moe import routing_with_distinct
from hybridspec.kernels.moe import SharedExpert
from hybridspec.kernels.moe import reference as moe_reference
from hybridspec.kernels.moe import down_rows
from hybridspec.kernels.moe import triton as moe_triton
from hybridspec.kernels.moe.down import column_tiles
from hybridspec.kernels.moe.gate_up import launch_gate_up
from hybridspec.kernels.moe.gate_up_rows import launch_gate_up_rows
from hybridspec.kernels.moe.tuning import MOE_TUNING, MoETuning, tuning_for
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import open_session

ROTATIONS = 4
MODELS = {  # name: (E, k, hidden, moe_intermediate, shared_intermediate)
    "35b": (256, 8, 2048, 512, 512),
    "122b": (256, 8, 3072, 1024, 1024),
}
LENGTHS = (1, 2, 4, 8, 12, 16)
DISTINCT = (8, 16, 32, 48, 64, 80, 96, 112, 128)
# tuning tables timed beside the shipped one (name: {largest T of a row: MoETuning}): the tile kernels
# at every T, and the register-slice kernels with two gate and up rows a program at one token (a tie)
SWEEP: dict[str, dict] = {
    "tiles": {64: MoETuning()},
    "rows bn2 at 1": {1: MoETuning(rows=True, rows_bh=1), 2: MoETuning(rows=True, rows_bn=1), 64: MoETuning()},
}
# the register-slice down launch alone changed: name → (down_rows.ONE_LOAD_ELEMENTS, BH, warps; None keeps
# the shipped value); ONE_LOAD_ELEMENTS 0: every call reads one assignment's id and slice at a time after the wait
DOWN_SWEEP: dict[str, tuple] = {
    "down one at a time": (0, None, None),
    "down bh1 w8": (None, 1, 8),
    "down bh1 at 2": (None, 1, None),
    "down one at a time, bh1 at 2": (0, 1, None),
}


class Layer:
    """One MoE layer's weights (bf16, random) on the GPU."""

    def __init__(self, model: str, seed: int):
        e, _, h, i, i_s = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def rand(*shape):
            return (torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5).to(torch.bfloat16)

        self.gate_up, self.down = rand(e, 2 * i, h), rand(e, h, i)
        self.shared = SharedExpert(rand(i_s, h), rand(i_s, h), rand(h, i_s), rand(1, h))


class Inputs:
    """x, ids, weights of one call: random routing, or exactly `distinct` experts at T = 16."""

    def __init__(self, model: str, T: int, seed: int, distinct: int | None = None):
        e, k, h, _, _ = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.x = torch.randn(T, h, device="cuda", generator=gen).to(torch.bfloat16)
        if distinct is None:
            scores = torch.rand(T, e, device="cuda", generator=gen)
            self.ids = torch.topk(scores, k, dim=-1).indices
        else:
            self.ids = routing_with_distinct(T, k, distinct, e, seed).cuda()
        self.weights = torch.rand(T, k, device="cuda", generator=gen).softmax(-1).to(torch.bfloat16)
        self.distinct = int(torch.unique(self.ids).numel())


def fp32_reference(layer: Layer, inp: Inputs, with_shared: bool = True) -> torch.Tensor:
    """Token by token in fp32 on the bf16 weights  [T, H] (routed experts only without the shared)."""
    x = inp.x.float()
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(inp.ids.shape[1]):
            e = int(inp.ids[n, j])
            gate, up = (layer.gate_up[e].float() @ x[n]).chunk(2)
            out[n] += inp.weights[n, j].float() * (layer.down[e].float() @ (F.silu(gate) * up))
    if not with_shared:
        return out
    s = [t.float() for t in layer.shared]
    return out + torch.sigmoid(x @ s[3].T) * ((F.silu(x @ s[0].T) * (x @ s[1].T)) @ s[2].T)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------------------------------------
# Implementations: each `make(layer, inp)` returns a zero-argument call (capturable or not)
# ---------------------------------------------------------------------------------------------


def ours(tuning=MOE_TUNING, shared: bool = True):
    """Ours; without the shared expert when `shared` is False (its launches then run the routed
    experts only)."""
    def make(layer: Layer, inp: Inputs):
        return lambda: moe_triton.moe_experts(inp.x, inp.ids, inp.weights, layer.gate_up, layer.down,
                                              layer.shared if shared else None, tuning=tuning)
    return make


def ours_down(elements, block_h, warps):
    """Ours with the register-slice down launch changed (`DOWN_SWEEP`) while the call is made (and
    captured)."""
    def make(layer: Layer, inp: Inputs):
        def call():
            shipped, shipped_elements = moe_triton.launch_down_rows, down_rows.ONE_LOAD_ELEMENTS

            def down(act, down_w, shared, ids, out, bh, w, first):
                shipped(act, down_w, shared, ids, out, block_h or bh, warps or w, first)
            moe_triton.launch_down_rows = down
            down_rows.ONE_LOAD_ELEMENTS = shipped_elements if elements is None else elements
            try:
                return moe_triton.moe_experts(inp.x, inp.ids, inp.weights, layer.gate_up, layer.down, layer.shared)
            finally:
                moe_triton.launch_down_rows, down_rows.ONE_LOAD_ELEMENTS = shipped, shipped_elements
        return call
    return make


def ours_gate_up(shared: bool = True):
    """The first of ours's two launches alone (gate_up, which in the tile form also zeroes the down
    kernel's counters; the register-slice form where the shipped table takes it), to take a call
    apart: down = whole - gate_up."""
    def make(layer: Layer, inp: Inputs):
        n, k = inp.ids.shape
        i = layer.gate_up.shape[1] // 2
        tuning = tuning_for(n)
        arrivals = torch.empty(column_tiles(inp.x.shape[1], tuning)[1], dtype=torch.int32, device="cuda")
        act = torch.empty((n, k + 1, max(i, layer.shared.gate.shape[0])), dtype=inp.x.dtype, device="cuda")
        block_m = max(16, 1 << (n - 1).bit_length())

        def call():
            experts = layer.shared if shared else None
            if tuning.rows:
                launch_gate_up_rows(inp.x, inp.ids, inp.weights, layer.gate_up, experts, act, tuning.rows_bn,
                                    tuning.rows_warps)
            else:
                launch_gate_up(inp.x, inp.ids, inp.weights, layer.gate_up, experts, arrivals, act, block_m, tuning,
                               False)
        return call
    return make


def torch_loop(layer: Layer, inp: Inputs):
    return lambda: moe_reference.moe_experts(inp.x, inp.ids, inp.weights, layer.gate_up, layer.down, layer.shared)


class SGLang:
    """SGLang's fused_moe on the routed experts (its alignment prepared before the call)."""

    def __init__(self, baselines: Path):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        self.module = importlib.import_module("moe_sglang")
        self.baselines = baselines
        self.prepared: dict[int, object] = {}

    def __call__(self, layer: Layer, inp: Inputs):
        key = (layer.gate_up.data_ptr(), tuple(layer.gate_up.shape))
        if key not in self.prepared:
            self.prepared[key] = self.module.SglangMoE(layer.gate_up, layer.down, inp.ids.shape[1], max_tokens=64,
                                                       baselines_dir=self.baselines)
        moe = self.prepared[key]
        aligned = moe.align(inp.ids)
        return lambda: moe.run(inp.x, inp.ids, inp.weights, aligned)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def eager_us(calls, samples: int) -> float:
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for fn in calls:
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    return statistics.median(times)


def floor_us(model: str, distinct: float, bandwidth: float, shared: bool = True) -> float:
    """µs to read the distinct experts' weights (and the shared expert's with its gate) once."""
    _, _, h, i, i_s = MODELS[model]
    return (distinct * 3 * i * h + (3 * i_s * h + h) * shared) * 2 / bandwidth * 1e6


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------


def check(model: str, layer: Layer, impls: dict, log) -> list[dict]:
    rows = []
    for T in (1, 4, 16, 40):
        inp = Inputs(model, T, seed=T)
        refs = {True: fp32_reference(layer, inp), False: fp32_reference(layer, inp, with_shared=False)}
        for name, make in impls.items():
            ref = refs[name != "sglang_fused_moe" and "routed only" not in name]  # the routed experts only
            rows.append(dict(model=model, T=T, impl=name, rel_err=rel_err(make(layer, inp)(), ref)))
            log(f"  check {model} T={T:2d} {name:18s} rel err {rows[-1]['rel_err']:.2e}")
    inp = Inputs(model, 16, seed=99)
    call = ours()(layer, inp)
    call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        rows.append(dict(model=model, T=16, impl="hybridspec", sync_free=True))
    except RuntimeError as error:
        rows.append(dict(model=model, T=16, impl="hybridspec", sync_free=False, error=str(error)[:200]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    inp.x.copy_(torch.randn_like(inp.x))
    graph.replay()
    rows.append(dict(model=model, T=16, impl="hybridspec", graph_rel_err=rel_err(out, fp32_reference(layer, inp))))
    log(f"  sync-free: {rows[-2]['sync_free']}, graph replay on new inputs: rel err {rows[-1]['graph_rel_err']:.2e}")
    return rows


def time_all(model: str, layers: list[Layer], impls: dict, samples: int, replays: int, bandwidth: float,
             lengths, distincts, log) -> list[dict]:
    rows = []
    cases = [(T, None) for T in lengths] + [(16, n) for n in distincts]
    for T, n in cases:
        inputs = [Inputs(model, T, seed=1000 * T + r + (n or 0) * 7, distinct=n) for r in range(ROTATIONS)]
        distinct = statistics.mean(inp.distinct for inp in inputs)
        for name, make in impls.items():
            row = dict(impl=name, model=model, T=T, distinct=distinct, routing="random" if n is None else "controlled")
            try:
                calls = [make(layer, inp) for layer, inp in zip(layers, inputs)]
                row["median_us"] = round((eager_us(calls, max(3, samples // 4)) if name == "torch_loop"
                                          else graph_us(calls, samples, replays)), 2)
            except Exception as error:  # a baseline that fails is reported, not fatal
                row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
            rows.append(row)
            log(f"  {model} T={T:2d} distinct={distinct:6.1f} {name:18s} {row.get('median_us', row.get('error'))}")
            torch.cuda.empty_cache()
        for impl, shared in (("floor", True), ("floor_routed", False)):
            rows.append(dict(impl=impl, model=model, T=T, distinct=distinct,
                             routing="random" if n is None else "controlled",
                             median_us=round(floor_us(model, distinct, bandwidth, shared), 2)))
    return rows


def fit_eta(rows: list[dict], impl: str, model: str) -> dict | None:
    pts = [(r["distinct"], r["median_us"]) for r in rows if r["impl"] == impl and r["model"] == model
           and r["routing"] == "controlled" and r.get("median_us")]
    if len(pts) < 3:
        return None
    xs, ys = zip(*pts)
    slope, intercept = statistics.linear_regression(xs, ys)
    return dict(impl=impl, model=model, eta_us=round(slope, 3), intercept_us=round(intercept, 2),
                correlation=round(statistics.correlation(xs, ys), 5))


def runtime_rounds(log, tokens: int, model: str = "qwen3.6-35b-a3b", device: str = "cuda",
                   dtype: str = "bfloat16") -> list[dict]:
    session = open_session(model, "random", device=device, dtype=dtype, backend="triton", max_context=1024)
    moes = [layer.mlp for layer in session.target.layers if layer.is_moe]
    prompt = torch.randint(0, session.target.cfg.vocab_size, (128,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    for experts, op in (("torch_loop", moe_reference.moe_experts), ("hybridspec", moe_triton.moe_experts)):
        for moe in moes:
            moe.experts_op = op
        for policy in ("ar", "static:4", "full"):
            p = make_policy(policy, session.drafter.draft_len)
            session.engine.generate(prompt, policy=p, max_new_tokens=4)  # compiles every kernel it meets
            result = session.engine.generate(prompt, policy=p, max_new_tokens=tokens)
            row = dict(experts=experts, policy=policy, rounds=len(result.rounds),
                       ms_per_round=round(result.decode_seconds * 1e3 / len(result.rounds), 2),
                       ms_per_token=round(result.decode_seconds * 1e3 / result.decode_tokens, 2),
                       mean_w=round(result.mean_verification_length, 2))
            rows.append(row)
            log(f"  runtime {experts:10s} {policy:8s} {row}")
    return rows


def versions() -> dict:
    found = dict(python=platform.python_version(), torch=torch.__version__, cuda=str(torch.version.cuda))
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError as error:
        found["triton"] = f"unavailable ({error})"
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="35b,122b")
    ap.add_argument("--quick", action="store_true", help="T in {1, 16}, 3 distinct counts, 5 samples")
    ap.add_argument("--sweep", action="store_true", help="also time the tuning variants of SWEEP")
    ap.add_argument("--sweep-rows", default=None,
                    help="with --sweep: comma list of SWEEP / DOWN_SWEEP names to time (default all)")
    ap.add_argument("--no-runtime", action="store_true")
    ap.add_argument("--no-sglang", action="store_true")
    ap.add_argument("--baselines", type=Path, default=Path(".baselines/site"))
    ap.add_argument("--runtime-tokens", type=int, default=24)
    ap.add_argument("--lengths", default=None, help="comma list of T (default: all of LENGTHS, or 1,16 with --quick)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    log = lambda line: print(line, flush=True)  # noqa: E731
    result = dict(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(),
                  command="python3 bench/kernels/moe_kernels.py " + " ".join(argv or sys.argv[1:]),
                  versions=versions(), models=[m for m in args.models.split(",") if m],
                  tuning={str(k): asdict(v) for k, v in MOE_TUNING.items()},
                  checks=[], rows=[], eta=[], runtime=[])
    log(f"{result['device']} {result['versions']}")
    impls = {"hybridspec": ours()}
    if not args.no_sglang:
        try:
            impls["sglang_fused_moe"] = SGLang(args.baselines)
        except Exception as error:
            log(f"SGLang baseline unavailable: {type(error).__name__}: {error}")
    impls["hybridspec[routed only]"] = ours(shared=False)  # SGLang's kernel's work: the routed experts
    impls["torch_loop"] = torch_loop
    if args.sweep:
        rows = [r for r in args.sweep_rows.split(",") if r] if args.sweep_rows else [*SWEEP, *DOWN_SWEEP]
        unknown = [r for r in rows if r not in SWEEP and r not in DOWN_SWEEP]
        if unknown:
            print(f"--sweep-rows: no SWEEP or DOWN_SWEEP row named {unknown} (rows: {[*SWEEP, *DOWN_SWEEP]})",
                  file=sys.stderr)
            return 2
        impls.update({f"hybridspec[{name}]": ours(SWEEP[name]) if name in SWEEP else ours_down(*DOWN_SWEEP[name])
                      for name in rows})
        impls.update({"hybridspec[gate_up]": ours_gate_up(),
                      "hybridspec[gate_up, routed only]": ours_gate_up(shared=False)})
    bandwidth = copy_bandwidth(samples=10)
    result["copy_bandwidth_GBps"] = bandwidth / 1e9
    log(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    samples, replays = (5, 5) if args.quick else (20, 10)
    lengths = tuple(int(t) for t in args.lengths.split(",")) if args.lengths else (1, 16) if args.quick else LENGTHS
    distincts = (8, 64, 128) if args.quick else DISTINCT
    for model in result["models"]:
        layers = [Layer(model, seed=r) for r in range(ROTATIONS)]
        checked = {k: v for k, v in impls.items()
                   if "[" not in k or k == "hybridspec[routed only]" or k[len("hybridspec["):-1] in SWEEP
                   or k[len("hybridspec["):-1] in DOWN_SWEEP}
        result["checks"] += check(model, layers[0], checked, log)
        result["rows"] += time_all(model, layers, impls, samples, replays, bandwidth, lengths, distincts, log)
        result["eta"] += [e for e in (fit_eta(result["rows"], i, model) for i in impls) if e]
        write_report(args.out, result)
        if "sglang_fused_moe" in impls:
            impls["sglang_fused_moe"].prepared.clear()  # holds the layers' weights
        del layers
        torch.cuda.empty_cache()
    for e in result["eta"]:
        log(f"  eta {e}")
    if not args.no_runtime:
        result["runtime"] = runtime_rounds(log, args.runtime_tokens)
    write_report(args.out, result)
    log((args.out / "moe_kernels.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
