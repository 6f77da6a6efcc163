"""The whole workflow on one machine, as `hybridspec demo` (and `make demo`) runs it:

    capture (quick) → fit → eval (quick) → serve + one request with the `openai` client → report

Every step is the library function behind its CLI command, on the embedded default pair unless a
model is given; the console shows the command each step stands for. `fit_artifact` is also what
`hybridspec fit` runs. This module sits beside `cli.py` (it may import every package of ours).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .artifacts.artifact import save_artifact
from .artifacts.params import AcceptanceModel, PolicyParameters

CAMPAIGN = "demo"
SERVER_START_S = 180.0  # loading the pair and warming up takes a few seconds on a CPU


@dataclass(frozen=True)
class DemoConfig:
    out: Path = Path("demo")  # store.duckdb, policy.safetensors, report/
    max_new_tokens: int = 48  # of the one served request
    categories: int | None = None  # None: every category of the prompt set (tests use fewer)
    capture_tokens: int | None = None  # None: capture --quick's default
    eval_tokens: int | None = None  # None: eval --quick's default


def fit_artifact(db: Path, name: str, out: Path):
    """`hybridspec fit`: fit a campaign of the store and write the artifact; (fit, metadata)."""
    from .fitters.campaign import fit_campaign

    result = fit_campaign(db, name)
    meta = save_artifact(out, policy_parameters(result), model_id=result.model_id,
                         drafter_id=result.drafter_id or "", device=result.device,
                         store_digest=result.store_digest, diagnostics=result.diagnostics())
    return result, meta


def policy_parameters(result) -> PolicyParameters:
    """A campaign fit as the runtime's policy parameters."""
    acc = result.acceptance
    model = AcceptanceModel(iso_x=tuple(tuple(map(float, x)) for x in acc.iso_x_),
                            iso_y=tuple(tuple(map(float, y)) for y in acc.iso_y_), coef=tuple(map(float, acc.coef_)))
    return PolicyParameters(
        draft_len=result.draft_len, lengths=result.lengths,
        cost=tuple(map(float, result.cost.table(result.draft_len + 1))),
        fixed_cost=result.cost.fixed_cost_, rho=result.rho, s=result.stage0.slope_, eta=result.moe.slope_,
        nbar_all=tuple(map(float, result.routing.nbar_all_)),
        nbar_cond=tuple(tuple(map(float, row)) for row in result.routing.nbar_cond_), acceptance=model)


def print_fit(console: Console, result, out: Path, meta: dict) -> None:
    console.print(f"[bold]artifact[/] {out}  ({meta['content_sha256'][:19]}…)")
    console.print(f"ρ = {result.rho:.2f} tokens/s   s = {result.stage0.slope_ * 1e6:.2f} µs/token   "
                  f"η = {result.moe.slope_ * 1e6:.2f} µs/expert (r = {result.moe.correlation_:.3f})   "
                  f"fixed = {result.cost.fixed_cost_ * 1e3:.2f} ms   Dinkelbach iterations {len(result.iterations)}")
    table = result.cost.table(result.draft_len + 1)
    console.print("C_tgt(w) ms: " + "  ".join(f"{w}:{table[w] * 1e3:.2f}" for w in result.lengths))
    metrics = Table("estimate", "log-loss", "Brier", "ECE", "rows", title="acceptance, held-out rounds")
    for name, m in result.metrics.items():
        metrics.add_row(name, f"{m['log_loss']:.4f}", f"{m['brier']:.4f}", f"{m['ece']:.4f}", str(m["rows"]))
    console.print(metrics)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


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
        import httpx

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


def read_metrics(text: str) -> dict:
    """The round statistics of a Prometheus page of `hybridspec serve`."""
    values = {}
    for line in text.splitlines():
        match = re.match(r"^hybridspec_([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match and not match.group(2):
            values[match.group(1)] = float(match.group(3))
    buckets = {int(le): float(v) for le, v in
               re.findall(r'^hybridspec_verification_length_bucket\{le="(\d+)"\} ([0-9.]+)$', text, re.M)}
    histogram, previous = {}, 0.0
    for le in sorted(buckets):  # cumulative buckets → rounds per executed length
        histogram[le], previous = buckets[le] - previous, buckets[le]
    values["verification_lengths"] = {w: int(n) for w, n in histogram.items() if n}
    return values


def ask_server(base: str, prompt: str, max_tokens: int) -> tuple[dict, dict]:
    """One greedy completion with the official `openai` client, then the server's /metrics."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    response = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    metrics = read_metrics(httpx.get(base + "/metrics", timeout=10).text)
    return response.model_dump(), metrics


# ---------------------------------------------------------------------------------------------
# the demo
# ---------------------------------------------------------------------------------------------


def _step(console: Console, title: str, command: str) -> float:
    console.rule(f"[bold]{title}")
    console.print(f"[dim]$ {command}[/]")
    return time.monotonic()


def _prompt_subset(path: Path, categories: int | None, out: Path) -> Path | None:
    """The first `categories` categories of the embedded prompt set (a smaller demo for tests)."""
    if categories is None:
        return None
    import json

    lines = path.read_text().splitlines()
    line_categories = [json.loads(line)["category"] for line in lines]
    chosen = set(list(dict.fromkeys(line_categories))[:categories])
    subset = out / "prompts.jsonl"
    subset.write_text("".join(line + "\n" for line, c in zip(lines, line_categories) if c in chosen))
    return subset


def run_demo_workflow(config: DemoConfig, console: Console) -> dict:
    """Run every step into `config.out`; returns what each step produced (for tests)."""
    from .collectors.campaign import run_campaign
    from .collectors.common import ALL_PASSES, CaptureConfig
    from .collectors.eval_output import print_eval
    from .collectors.evaluate import EvalConfig, run_eval
    from .collectors.progress import RichReporter, summary_table
    from .report import build_report, summary
    from .runtime.generation import demo_prompt
    from .runtime.session import EMBEDDED

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

    t = _step(console, "2/5 fit", f"hybridspec fit --db {db} --run {CAMPAIGN} --out {artifact}")
    fit, meta = fit_artifact(db, CAMPAIGN, artifact)
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
    text, _ = demo_prompt()
    prompt = text or "def fibonacci(n):\n"
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
