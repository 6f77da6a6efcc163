"""The whole workflow on one machine, as `hybridspec demo` (and `make demo`) runs it:

    capture (quick) → fit → eval (quick) → serve + one request with the `openai` client → report

Every step is the library function behind its CLI command, on the embedded default pair; the
console shows the command each step stands for. This module sits beside `cli/` (it may import
every package of ours).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import OpenAI
from rich.console import Console
from rich.table import Table

from .collectors.campaign import run_campaign
from .collectors.common import ALL_PASSES, CaptureConfig
from .collectors.eval_output import print_eval
from .collectors.evaluate import EvalConfig, run_eval
from .collectors.progress import RichReporter, summary_table
from .fitters.export import fit_artifact
from .fitters.fit_output import print_fit
from .report import build_report, summary
from .runtime.session import EMBEDDED, default_model
from .serve.metrics import read_metrics
from .workbench.prompts import load_prompts

CAMPAIGN = "demo"
SERVER_START_S = 180.0  # loading the pair and warming up takes a few seconds on a CPU


@dataclass(frozen=True)
class DemoConfig:
    out: Path = Path("demo")  # store.duckdb, policy.safetensors, report/
    max_new_tokens: int = 48  # of the one served request
    categories: int | None = None  # None: every category of the prompt set (tests use fewer)
    capture_tokens: int | None = None  # None: capture --quick's default
    eval_tokens: int | None = None  # None: eval --quick's default


# ---------------------------------------------------------------------------------------------
# serve + one request
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`hybridspec serve` in a child process on 127.0.0.1; stopped (SIGINT, then kill) on exit."""

    def __init__(self, args: list[str], port: int, log: Path):
        self.port, self.log = port, log
        self.base = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "hybridspec", "serve", *args, "--port", str(port)]
        self._log_file = open(log, "w")
        try:
            self.proc = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError:
            self._log_file.close()
            raise

    def __enter__(self) -> "Server":
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"hybridspec serve exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"hybridspec serve did not answer /health within {SERVER_START_S:.0f} s; log: {self.log}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
        return self.proc.returncode


def ask_server(base: str, prompt: str, max_tokens: int) -> tuple[dict, dict]:
    """One greedy completion with the official `openai` client, then the server's /metrics."""
    client = OpenAI(base_url=base + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    response = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    metrics = read_metrics(httpx.get(base + "/metrics", timeout=10).text)
    return response.model_dump(), metrics


# ---------------------------------------------------------------------------------------------
# the demo
# ---------------------------------------------------------------------------------------------


def demo_prompt() -> str:
    """The served request's prompt: the first `test` prompt of the embedded set (a fixed line of
    code when the embedded pair is not installed)."""
    if default_model()[1] is None:
        return "def fibonacci(n):\n"
    prompts = load_prompts(EMBEDDED / "prompts.jsonl", split="test")
    return next(p.text for p in prompts if p.category == "test")


def _step(console: Console, title: str, command: str) -> float:
    console.rule(f"[bold]{title}")
    console.print(f"[dim]$ {command}[/]")
    return time.monotonic()


def _prompt_subset(path: Path, categories: int | None, out: Path) -> Path | None:
    """The first `categories` categories of the embedded prompt set (a smaller demo for tests)."""
    if categories is None:
        return None
    lines = path.read_text().splitlines()
    line_categories = [json.loads(line)["category"] for line in lines]
    chosen = set(list(dict.fromkeys(line_categories))[:categories])
    subset = out / "prompts.jsonl"
    subset.write_text("".join(line + "\n" for line, c in zip(lines, line_categories) if c in chosen))
    return subset


def run_demo_workflow(config: DemoConfig, console: Console) -> dict:
    """Run every step into `config.out`; returns what each step produced (for tests)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    db, artifact, report_dir = out / "store.duckdb", out / "policy.safetensors", out / "report"
    prompts = _prompt_subset(EMBEDDED / "prompts.jsonl", config.categories, out)
    timings = {}

    t = _step(console, "1/5 capture", f"hybridspec capture --quick --passes all --db {db} --name {CAMPAIGN} --overwrite")
    capture = CaptureConfig(prompts=prompts, db=db, name=CAMPAIGN, passes=ALL_PASSES, quick=True, overwrite=True,
                            max_new_tokens=config.capture_tokens)
    with RichReporter(console) as reporter:
        passes = run_campaign(capture, reporter)
    console.print(summary_table(passes, db))
    timings["capture"] = time.monotonic() - t

    # a quick campaign may fail a fit-quality check: the demo goes on, and the report shows the check
    t = _step(console, "2/5 fit", f"hybridspec fit --db {db} --name {CAMPAIGN} --out {artifact} --allow-poor-fit")
    fit, meta = fit_artifact(db, CAMPAIGN, artifact, allow_poor_fit=True)
    print_fit(console, fit, artifact, meta)
    timings["fit"] = time.monotonic() - t

    t = _step(console, "3/5 eval", f"hybridspec eval --quick --db {db} --name {CAMPAIGN} --artifact {artifact} --overwrite")
    evaluation = EvalConfig(artifact=artifact, prompts=prompts, db=db, name=CAMPAIGN, quick=True, overwrite=True,
                            max_new_tokens=config.eval_tokens)
    with RichReporter(console) as reporter:
        eval_result = run_eval(evaluation, reporter)
    print_eval(console, eval_result)
    timings["eval"] = time.monotonic() - t

    port = free_port()
    t = _step(console, "4/5 serve", f"hybridspec serve --artifact {artifact} --port {port}   "
              "(+ one request with the openai client)")
    prompt = demo_prompt()
    with Server(["--artifact", str(artifact)], port, out / "serve.log") as server:
        response, metrics = ask_server(server.base, prompt, config.max_new_tokens)
    console.print(f"[bold]prompt[/] (last lines)\n{prompt[-300:]}")
    console.print(f"[bold]answer[/] ({response['usage']['completion_tokens']} tokens, "
                  f"finish {response['choices'][0]['finish_reason']})\n{response['choices'][0]['text']}")
    rounds = Table("rounds", "acceptance length", "executed verification lengths w: rounds", "decode tok/s",
                   title="the server's round statistics (/metrics)")
    rounds.add_row(f"{metrics.get('rounds_total', 0):.0f}", f"{metrics.get('acceptance_length', 0):.2f}",
                   "  ".join(f"{w}:{n}" for w, n in metrics["verification_lengths"].items()),
                   f"{metrics.get('decode_tokens_per_second', 0):.1f}")
    console.print(rounds)
    console.print("server stopped")
    timings["serve"] = time.monotonic() - t

    t = _step(console, "5/5 report", f"hybridspec report --db {db} --artifact {artifact} --out {report_dir}")
    report = build_report(db, report_dir, artifact=artifact, campaign=CAMPAIGN)
    console.print(summary(report))
    timings["report"] = time.monotonic() - t
    console.print(f"\n[bold green]report:[/] {report.path.resolve()}")
    return dict(passes=passes, fit=fit, artifact=artifact, eval=eval_result, response=response, metrics=metrics,
                report=report, seconds=timings)
