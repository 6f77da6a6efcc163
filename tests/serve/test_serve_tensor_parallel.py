"""`hybridspec serve --tp 2` as a user runs it (a subprocess; gloo ranks on CPU): greedy completions
equal one process's `generate`, streamed or not, with several requests in flight; a client that goes
away mid-stream leaves every rank able to serve the next request exactly; a bad request is answered
with its error and the server keeps serving; Ctrl-C to the process group shuts every rank down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

from hybridspec.runtime.generation import GenerateRequest, run_generate  # noqa: E402
from tests.serve.live import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("def add(a, b):\n    return", "import os\n", "class Stack:\n    def push(self, item):")
POLICY = "static:4"


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hybridspec", "serve", "--tp", "2", "--port", str(port),
                             "--policy", POLICY, "--max-context", "512", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.5)
    yield base, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _complete(base: str, prompt: str, stream: bool = False) -> str:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": stream}
    if not stream:
        return httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def _expected(prompt: str) -> str:
    ref = run_generate(GenerateRequest(prompt=prompt, policy=POLICY, max_new_tokens=16))
    return ref["text"].replace("<|endoftext|>", "")


def test_two_ranks_serve_one_processs_completions_and_stop_on_ctrl_c(server):
    base, proc = server
    want = {p: _expected(p) for p in PROMPTS}
    with ThreadPoolExecutor(3) as pool:  # queued behind each other, one engine step at a time on both ranks
        got = dict(zip(PROMPTS, pool.map(lambda p: _complete(base, p, stream=p != PROMPTS[0]), PROMPTS)))
    assert got == want
    body = {"prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0, "policy": "ar", "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        assert next(line for line in response.iter_lines() if line.startswith("data:"))  # then the client leaves
    bad = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPTS[0], "policy": "static:99"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "policy"
    assert _complete(base, PROMPTS[1]) == want[PROMPTS[1]]
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "over2ranks" in "".join(out.split()) and "Traceback" not in out, out  # rich wraps the banner
