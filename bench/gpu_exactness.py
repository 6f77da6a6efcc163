"""GPU checks of the runtime (not a test: run on purpose on a CUDA machine).

1. Triton vs PyTorch GDN path: logits of the same verification passes agree (fp32).
2. Greedy exactness on the GPU in fp32: every speculative policy with the Triton backend emits
   exactly the tokens of `ar`, on the embedded pair's test prompts.
Usage: python bench/gpu_exactness.py [--prompts N] [--tokens T]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hybridspec.artifacts.params import AcceptanceModel, PolicyParameters  # noqa: E402
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from hybridspec.workbench.prompts import load_prompts  # noqa: E402


def hand_parameters(D: int = 15) -> PolicyParameters:
    W = D + 1
    return PolicyParameters(
        draft_len=D, lengths=tuple(range(2, W + 1)), fixed_cost=2e-3, rho=300.0, s=1e-4, eta=1e-4,
        cost=tuple(0.0 if w < 2 else 1e-3 + 4e-4 * w + 2e-5 * w * w for w in range(W + 1)),
        nbar_all=(3.0,) * (W + 1), nbar_cond=((1.0, 3.0, 5.0, 7.0),) * (W + 1),
        acceptance=AcceptanceModel(iso_x=((0.0, 0.5, 1.0),) * D, iso_y=((0.02, 0.4, 0.98),) * D,
                                   coef=(-2.0, 6.0, -0.05, 0.0, -0.8, -0.3)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--policies", default="full,static:4,static:9,nominal,hybridspec",
                        help="comma-separated policies to check against ar")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    tri = open_session(device="cuda", backend="triton")
    ref = open_session(device="cuda", backend="torch")
    prompts_file = Path(__file__).resolve().parent.parent / "hybridspec/assets/embedded/prompts.jsonl"
    test = load_prompts(prompts_file, split="test")
    prompts = [tri.codec.encode(p.text) for p in test[:: max(1, len(test) // args.prompts)][: args.prompts]]
    # 1. logits of one verification pass after a prefill, both backends
    worst = 0.0
    for ids in prompts[:4]:
        outs = []
        for s in (tri, ref):
            cache = s.target.new_cache(max_len=1024, tokens_per_pass=64)
            s.target.prefill(torch.tensor([ids[:-16]], device="cuda"), cache)
            outs.append(s.target.forward_pass(torch.tensor([ids[-16:]], device="cuda"), cache).logits)
        worst = max(worst, float((outs[0] - outs[1]).norm() / outs[1].norm()))
    print(f"triton vs torch verification logits: max relative error {worst:.2e}")
    # 2. greedy exactness
    params = hand_parameters()
    failures = 0
    for name in args.policies.split(","):
        policy = make_policy(name, 15, params, device="cuda")
        start, rounds, tokens = time.time(), 0, 0
        for ids in prompts:
            want = ref.engine.generate(ids, policy=make_policy("ar", 15), max_new_tokens=args.tokens,
                                       eos_ids=tri.eos_ids).token_ids
            got = tri.engine.generate(ids, policy=policy, max_new_tokens=args.tokens, eos_ids=tri.eos_ids)
            rounds, tokens = rounds + len(got.rounds), tokens + len(got.token_ids)
            if got.token_ids != want:
                failures += 1
                first = next(i for i, (a, b) in enumerate(zip(got.token_ids + [-1], want + [-2])) if a != b)
                print(f"  {name}: MISMATCH at token {first}")
        print(f"{name:>10}: {len(prompts)} prompts × {args.tokens} tokens, equal to ar: "
              f"{'yes' if not failures else 'NO'}; AL {tokens / max(rounds, 1):.2f} ({time.time() - start:.1f}s)")
    ok = worst < 1e-4 and failures == 0
    print("GPU exactness:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
