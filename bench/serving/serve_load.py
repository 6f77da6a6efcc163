"""Load test of `hybridspec serve`: C concurrent `openai` clients × R requests per policy.

    .venv/bin/python bench/serving/serve_load.py --artifact demo/policy.safetensors [--clients 8] [--requests 10] [--max-tokens 32]

Starts the server in-process on a free loopback port (the embedded pair; `--artifact`, the output of
`hybridspec fit`, e.g. `make demo`'s demo/policy.safetensors, for the calibrated policies), runs
the load once per policy, checks that every request succeeded and that /metrics totals equal the
responses' usage, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import platform
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import fastapi
import httpx
import openai
import torch
import uvicorn

from hybridspec.runtime.policies import NEEDS_PARAMETERS
from hybridspec.runtime.session import EMBEDDED
from hybridspec.serve.app import create_app
from hybridspec.serve.metrics import read_metrics
from hybridspec.serve.service import open_service
from hybridspec.workbench.prompts import load_prompts


def test_prompts(per_category: int = 2) -> list[str]:
    """The first test prompts of each category of the embedded set (stdlib source, ≤ 512 tokens)."""
    seen: dict[str, int] = {}
    out = []
    for p in load_prompts(EMBEDDED / "prompts.jsonl", split="test"):
        if seen.get(p.category, 0) < per_category:
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p.text)
    return out


PROMPTS = test_prompts()


def metrics(base: str) -> dict:
    return read_metrics(httpx.get(f"{base}/metrics").text)


def start(artifact: Path | None) -> tuple[uvicorn.Server, str]:
    service = open_service(artifact=artifact, policy="hybridspec" if artifact else "ar", max_context=1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def load(base: str, policy: str, clients: int, requests: int, max_tokens: int) -> dict:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=600)

    def worker(c: int) -> list:
        return [client.completions.create(model="hybridspec-embedded", prompt=PROMPTS[(c + r) % len(PROMPTS)],
                                          max_tokens=max_tokens, temperature=0, extra_body={"policy": policy}).usage
                for r in range(requests)]

    before = metrics(base)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        usages = [u for us in pool.map(worker, range(clients)) for u in us]
    seconds = time.perf_counter() - t0
    after = metrics(base)
    generated = sum(u.completion_tokens for u in usages)
    assert len(usages) == clients * requests
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == generated
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    rounds = after["rounds_total"] - before["rounds_total"]
    return {"policy": policy, "requests": len(usages), "seconds": seconds, "rps": len(usages) / seconds,
            "tps": generated / seconds, "generated": generated, "rounds": rounds,
            "al": (generated - len(usages)) / rounds if rounds else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--artifact", type=Path)
    parser.add_argument("--policies", default="ar,full,hybridspec")
    args = parser.parse_args()
    calibrated = [p for p in args.policies.split(",") if p in NEEDS_PARAMETERS]
    if calibrated and args.artifact is None:
        parser.error(f"--policies {','.join(calibrated)} need --artifact (the output of `hybridspec fit`)")
    server, base = start(args.artifact)
    load(base, "ar", 2, 1, 4)  # warm-up
    rows = [load(base, p, args.clients, args.requests, args.max_tokens) for p in args.policies.split(",")]
    server.should_exit = True
    print(f"date {datetime.now(timezone.utc).isoformat(timespec='seconds')}; python {platform.python_version()}, "
          f"torch {torch.__version__}, fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}, "
          f"openai {openai.__version__}; {torch.get_num_threads()} torch threads, {platform.processor() or platform.machine()}")
    print(f"command: python bench/serving/serve_load.py --clients {args.clients} --requests {args.requests} "
          f"--max-tokens {args.max_tokens}" + (f" --artifact {args.artifact}" if args.artifact else ""))
    print("\n| policy | requests | seconds | requests/s | generated tokens | tokens/s | rounds | AL |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['requests']} | {r['seconds']:.2f} | {r['rps']:.2f} | {r['generated']} | "
              f"{r['tps']:.1f} | {r['rounds']:.0f} | {r['al']:.2f} |")


if __name__ == "__main__":
    main()
