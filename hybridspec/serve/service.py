"""The model behind `hybridspec serve`, its policies, and the FIFO queue in front of the engine.

One model instance, batch size one (as the paper): requests wait for an `asyncio.Lock` (FIFO) and
the engine runs round by round (`Engine.stream`) in one worker thread, so a client that disconnects
mid-stream cancels its remaining rounds.
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..artifacts.params import PolicyParameters
from ..runtime.policies import Policy, make_policy, resolve_policy
from ..runtime.sampling import SamplingParams
from ..runtime.session import Session, open_session
from .api import RequestBody, RequestError
from .metrics import Metrics

EMBEDDED_NAME = "hybridspec-embedded"  # the served model name of the default pair


class Decoding:
    """One request on the engine: its round stream, the decoded text, stop sequences and usage.
    `advance` and `close` run in the worker thread only."""

    def __init__(self, service: Service, prompt_ids: list[int], policy: Policy, max_tokens: int,
                 sampling: SamplingParams, stops: list[str]):
        self.service, self.prompt_ids, self.stops = service, prompt_ids, stops or []
        self.steps = service.session.engine.stream(prompt_ids, policy=policy, max_new_tokens=max_tokens,
                                                   sampling=sampling, eos_ids=service.session.eos_ids)
        self.ids: list[int] = []
        self.text, self.sent = "", 0  # visible text; characters already handed out
        self.finish_reason: str | None = None
        self.rounds, self.decode_tokens, self.decode_seconds = 0, 0, 0.0
        self.verification: dict[int, int] = {}
        self.closed = False

    def advance(self) -> None:
        """Run the prefill or one round; sets `finish_reason` when done."""
        step = next(self.steps, None)
        if step is None:
            eos = bool(self.ids) and self.ids[-1] in self.service.session.eos_ids
            self.finish_reason = "stop" if eos else "length"
            return
        new, record = step
        if record is not None:
            self.rounds += 1
            self.decode_tokens += record.emitted
            self.decode_seconds += record.seconds.get("total", 0.0)
            self.verification[record.w] = self.verification.get(record.w, 0) + 1
        start = len(self.ids)
        self.ids.extend(new)
        self.text = self.service.visible_text(self.ids)
        if self.stops and self._stop_within(start):
            self.finish_reason = "stop"

    def _stop_within(self, start: int) -> bool:
        """Cut ids and text at the first stop sequence, keeping the fewest ids that produce it."""
        if _first_stop(self.text, self.stops) is None:
            return False
        for k in range(start + 1, len(self.ids) + 1):
            text = self.service.visible_text(self.ids[:k])
            at = _first_stop(text, self.stops)
            if at is not None:
                self.ids, self.text = self.ids[:k], text[:at]
                return True
        return False  # pragma: no cover (the full list matched above)

    def delta(self) -> str:
        """Text not yet handed out, holding back what may still become a stop sequence or a
        partial UTF-8 character."""
        end = len(self.text)
        if self.finish_reason is None:
            end -= max((len(s) - 1 for s in self.stops), default=0)
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out

    def close(self) -> None:
        """Stop decoding (cancels the remaining rounds) and add this request to the metrics."""
        if self.closed:
            return
        self.closed = True
        self.steps.close()
        m = self.service.metrics
        with m.lock:
            m.requests += self.finish_reason is not None
            m.cancelled += self.finish_reason is None
            m.prompt_tokens += len(self.prompt_ids)
            m.generation_tokens += len(self.ids)
            m.rounds += self.rounds
            m.decode_tokens += self.decode_tokens
            m.decode_seconds += self.decode_seconds
            for w, count in self.verification.items():
                m.verification[w] = m.verification.get(w, 0) + count

    def usage(self) -> dict:
        n_prompt, n_out = len(self.prompt_ids), len(self.ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


class Service:
    """The model, its policies and the FIFO queue in front of the engine."""

    def __init__(self, session: Session, *, params: PolicyParameters | None, policy: str, model_name: str):
        self.session, self.params, self.model_name = session, params, model_name
        self.draft_len = session.drafter.draft_len if session.drafter is not None else 0
        self.policies: dict[str, Policy] = {}
        self.default_policy = self.policy(policy)  # fails at start-up on a bad default
        self.lock = asyncio.Lock()  # FIFO: waiters are woken in arrival order
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.metrics = Metrics(max_length=self.draft_len + 1)
        self.created = int(time.time())

    def policy(self, name: str) -> Policy:
        """The policy `name`, built once by `make_policy` (PolicyError: unknown name, bad length,
        no parameters)."""
        if name not in self.policies:
            self.policies[name] = make_policy(name, self.draft_len, self.params, device=str(self.session.engine.device))
        return self.policies[name]

    def visible_text(self, ids: list[int]) -> str:
        codec = self.session.codec
        return codec.decode([i for i in ids if i not in self.session.eos_ids]) if codec else ""

    def encode(self, text: str, param: str) -> list[int]:
        if self.session.codec is None:
            raise RequestError(f"model {self.model_name!r} has no tokenizer; give the prompt as token ids", param)
        return self.session.codec.encode(text)

    def start(self, body: RequestBody, prompt_ids: list[int], max_tokens: int | None, param: str) -> Decoding:
        """Validate against the model and build the request's decoding (nothing runs yet)."""
        if body.model is not None and body.model != self.model_name:
            raise RequestError(f"the model {body.model!r} does not exist; this server serves {self.model_name!r}",
                               "model", 404)
        engine = self.session.engine
        vocab = self.session.target.cfg.vocab_size
        if not prompt_ids:
            raise RequestError("the prompt is empty", param)
        if any(not 0 <= i < vocab for i in prompt_ids):
            raise RequestError(f"prompt token ids must be in 0 … {vocab - 1}", param)
        room = engine.max_context - len(prompt_ids)
        if room < 1:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context holds {engine.max_context} "
                               "(prompt plus at least one generated token)", param)
        if max_tokens is not None and max_tokens > room:
            raise RequestError(f"max_tokens ({max_tokens}) + prompt ({len(prompt_ids)} tokens) exceeds the context "
                               f"of {engine.max_context} tokens", "max_tokens")
        try:
            policy = self.policy(body.policy) if body.policy is not None else self.default_policy
        except ValueError as exc:  # make_policy's PolicyError
            raise RequestError(str(exc), "policy") from None
        if body.stop and self.session.codec is None:
            raise RequestError("stop sequences need a tokenizer", "stop")
        seed = body.seed if body.seed is not None else random.randrange(2**31)
        top_k = max(body.top_k, 0)
        sampling = SamplingParams(body.temperature, top_k, body.top_p, seed)
        return Decoding(self, prompt_ids, policy, max_tokens or room, sampling, body.stop)

    async def run(self, decoding: Decoding):
        """Async generator of text deltas; waits its turn, then runs each round in the worker thread.
        Leaving early (client gone) closes the decoding, which cancels the remaining rounds."""
        loop = asyncio.get_running_loop()
        self.metrics.waiting += 1
        queued = True
        try:
            async with self.lock:
                self.metrics.waiting, queued = self.metrics.waiting - 1, False
                self.metrics.running = 1
                try:
                    while decoding.finish_reason is None:
                        await loop.run_in_executor(self.executor, decoding.advance)
                        text = decoding.delta()
                        if text:
                            yield text
                    await loop.run_in_executor(self.executor, decoding.close)
                finally:
                    self.metrics.running = 0
                    if not decoding.closed:  # queued behind a round still running, never beside it
                        self.executor.submit(decoding.close)
        finally:
            if queued:
                self.metrics.waiting -= 1


def open_service(*, artifact: Path | None = None, model: str | None = None, drafter: str | None = None,
                 policy: str = "hybridspec", device: str = "cpu", dtype: str = "float32", backend: str = "auto",
                 max_context: int = 4096, force: bool = False, model_name: str | None = None) -> Service:
    """Load the model, the drafter and the artifact for `serve` (`resolve_policy`: the default policy
    needs an artifact when it needs parameters; one fitted for another pair is refused unless `force`)."""
    session = open_session(model, drafter, device=device, dtype=dtype, backend=backend, max_context=max_context)
    params, _ = resolve_policy(policy, artifact, session, force)
    name = model_name or (model if model is not None else EMBEDDED_NAME)
    return Service(session, params=params, policy=policy, model_name=name)
