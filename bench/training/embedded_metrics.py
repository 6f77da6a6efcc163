"""Measurements of the embedded pair on its test prompts (fp32, greedy decoding).

Acceptance length by category, ROC AUC of the drafter's confidence per draft position, Layer-0
expert reuse, and decode tokens/s.

Usage: python bench/training/embedded_metrics.py [--per-category N] [--tokens T] [--out FILE.json]
           [--device cpu|cuda] [--backend auto|torch|triton] [--drafter DIR] [--prompts FILE]
           [--policies ar,full] [--categories a,b]
The defaults measure the shipped pair on CPU with both policies; `bench/training/drafter_sweep.py` runs
this script with `--device cuda --policies full`, one process per drafter and group of categories."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import EMBEDDED, Session, open_session
from hybridspec.workbench.prompts import Prompt, load_prompts


def roc_auc(scores: list[float], labels: list[int]) -> float | None:
    """Probability that a random positive outranks a random negative (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if len(pos) < 10 or len(neg) < 10:
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def prompts_by_category(path: Path, per_category: int,
                        categories: list[str] | None = None) -> dict[str, list[Prompt]]:
    """The first `per_category` test prompts of each category (or of the listed ones), in file order."""
    by_cat = defaultdict(list)
    for p in load_prompts(path, split="test"):
        if (categories is None or p.category in categories) and len(by_cat[p.category]) < per_category:
            by_cat[p.category].append(p)
    missing = set(categories or ()) - set(by_cat)
    if missing:
        raise SystemExit(f"{path}: no test prompts of the categories {', '.join(sorted(missing))}")
    return dict(by_cat)


def measure(session: Session, by_cat: dict[str, list[Prompt]], tokens: int,
            policies: tuple[str, ...] = ("ar", "full")) -> dict:
    """Greedy decoding of every prompt with each policy. Acceptance length per category is
    tokens / rounds of `full` (D = 15); AUC and expert reuse come from `full`'s rounds."""
    result = {"tokens": tokens, "per_category": max(len(v) for v in by_cat.values()), "categories": {},
              "policies": {}}
    conf, hit = defaultdict(list), defaultdict(list)
    distinct, top_k = [], session.target.cfg.num_experts_per_tok
    for name in policies:
        policy = make_policy(name, session.drafter.draft_len)
        total_tokens = seconds = rounds = 0
        for category, items in by_cat.items():
            emitted = cat_rounds = 0
            for p in items:
                r = session.engine.generate(session.codec.encode(p.text), policy=policy, max_new_tokens=tokens,
                                            eos_ids=session.eos_ids)
                total_tokens, seconds = total_tokens + r.decode_tokens, seconds + r.decode_seconds
                rounds += len(r.rounds)
                emitted, cat_rounds = emitted + r.decode_tokens, cat_rounds + len(r.rounds)
                if name == "full":
                    for rec in r.rounds:
                        if rec.accepted_full is None:
                            continue
                        for i, c in enumerate(rec.confidence, start=1):
                            conf[i].append(c)
                            hit[i].append(int(rec.accepted_full >= i))
                        if rec.u == 16:
                            distinct.append(len(set(rec.layer0_experts.reshape(-1).tolist())))
            if name == "full":
                result["categories"][category] = {"prompts": len(items), "acceptance_length": emitted / cat_rounds}
        result["policies"][name] = {"decode_tokens": total_tokens, "decode_seconds": seconds,
                                    "tokens_per_second": total_tokens / seconds, "rounds": rounds}
    result["auc_by_position"] = {i: roc_auc(conf[i], hit[i]) for i in sorted(conf)}
    result["samples_by_position"] = {i: [len(hit[i]), sum(hit[i])] for i in sorted(conf)}
    result["layer0_distinct_experts_16_tokens"] = {"mean": float(np.mean(distinct)) if distinct else None,
                                                   "upper_bound": min(16 * top_k, session.target.cfg.num_experts),
                                                   "rounds": len(distinct)}
    als = [c["acceptance_length"] for c in result["categories"].values()]
    result["acceptance_length_mean"] = float(np.mean(als))
    result["acceptance_length_spread"] = float(max(als) - min(als))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=40, help="test prompts per category")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way)")
    parser.add_argument("--backend", default="auto", help="auto (triton on CUDA), torch or triton")
    parser.add_argument("--model", help="target directory (default: the embedded target)")
    parser.add_argument("--drafter", help="drafter directory (default: the embedded drafter)")
    parser.add_argument("--prompts", type=Path, default=EMBEDDED / "prompts.jsonl", help="prompt set (JSONL)")
    parser.add_argument("--policies", default="ar,full", help="comma-separated; full is needed for AL")
    parser.add_argument("--categories", help="comma-separated subset of the prompt set's categories (default: all)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 on CUDA too
    policies = tuple(args.policies.split(","))
    if "full" not in policies:
        parser.error("--policies must include full (acceptance length, AUC and expert reuse come from it)")
    session = open_session(args.model, args.drafter, device=args.device, dtype="float32", backend=args.backend)
    cuda = args.device.startswith("cuda")
    device = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    result = {"device": device, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "model": session.model, "drafter": args.drafter or "embedded", "backend": session.target.backend,
              "prompts": str(args.prompts)}
    categories = args.categories.split(",") if args.categories else None
    by_cat = prompts_by_category(args.prompts, args.per_category, categories)
    result.update(measure(session, by_cat, args.tokens, policies))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
