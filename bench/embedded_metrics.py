"""Measurements of the embedded pair on its test prompts (CPU): acceptance by category, ROC AUC of
the drafter's confidence per draft position, Layer-0 expert reuse, and decode tokens/s.

Usage: python bench/embedded_metrics.py [--per-category N] [--tokens T] [--out FILE.json]"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.session import EMBEDDED, open_session  # noqa: E402
from hybridspec.workbench.prompts import load_prompts  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-category", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    session = open_session()
    prompts = load_prompts(EMBEDDED / "prompts.jsonl", split="test")
    by_cat = defaultdict(list)
    for p in prompts:
        if len(by_cat[p.category]) < args.per_category:
            by_cat[p.category].append(p)
    result = {"device": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "tokens": args.tokens, "per_category": args.per_category,
              "categories": {}, "policies": {}}
    conf, hit = defaultdict(list), defaultdict(list)
    distinct, top_k = [], session.target.cfg.num_experts_per_tok
    for name in ("ar", "full"):
        policy = make_policy(name, session.drafter.draft_len)
        tokens = seconds = rounds = 0
        for category, items in by_cat.items():
            emitted = cat_rounds = 0
            for p in items:
                r = session.engine.generate(session.codec.encode(p.text), policy=policy, max_new_tokens=args.tokens,
                                            eos_ids=session.eos_ids)
                tokens, seconds, rounds = tokens + r.decode_tokens, seconds + r.decode_seconds, rounds + len(r.rounds)
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
        result["policies"][name] = {"decode_tokens": tokens, "decode_seconds": seconds,
                                    "tokens_per_second": tokens / seconds, "rounds": rounds}
    result["auc_by_position"] = {i: roc_auc(conf[i], hit[i]) for i in sorted(conf)}
    result["samples_by_position"] = {i: [len(hit[i]), sum(hit[i])] for i in sorted(conf)}
    result["layer0_distinct_experts_16_tokens"] = {"mean": float(np.mean(distinct)) if distinct else None,
                                                   "upper_bound": min(16 * top_k, session.target.cfg.num_experts),
                                                   "rounds": len(distinct)}
    als = [c["acceptance_length"] for c in result["categories"].values()]
    result["acceptance_length_mean"] = float(np.mean(als))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
