"""An OpenAI-compatible HTTP server on the HybridSpec engine (`hybridspec serve`).

    POST /v1/completions, POST /v1/chat/completions   (both with `stream: true` as SSE chunks)
    GET  /v1/models, /health, /metrics (Prometheus text)

One model instance, batch size one (as the paper): requests wait for an `asyncio.Lock` (FIFO) and
the engine runs round by round (`Engine.stream`) in one worker thread, so a client that disconnects
mid-stream cancels its remaining rounds. Only /v1/* asks for the API key (as vLLM does).

Chat template (the embedded tokenizer has none; tokenizer chat templates are not read): a system
message is prepended as plain text plus a newline, a user message becomes `<|user|>{content}\\n`, an
assistant message `<|assistant|>{content}\\n`, and the prompt ends with `<|assistant|>`.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..artifacts.params import PolicyParameters
from .policies import POLICY_NAMES, Policy, PolicyError, make_policy
from .sampling import SamplingParams
from .session import Session


class RequestError(ValueError):
    """A bad request: answered with `status` and an OpenAI error object naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


# ---------------------------------------------------------------- request bodies
class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    policy: str | None = None  # extension: one of the engine's policy names

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n = 1 is supported (batch size one)")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The simple template of the module docstring."""
    parts = []
    for m in messages:
        text = m.content if isinstance(m.content, str) else "".join(p.get("text", "") for p in m.content)
        parts.append({"user": f"<|user|>{text}\n", "assistant": f"<|assistant|>{text}\n"}.get(m.role, f"{text}\n"))
    return "".join(parts) + "<|assistant|>"


# ---------------------------------------------------------------- metrics
@dataclass
class Metrics:
    """Counters for /metrics; written from the worker thread, read under `lock`."""

    max_length: int  # W, the histogram's largest bucket
    requests: int = 0
    cancelled: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    decode_tokens: int = 0  # tokens from rounds (after the prefill anchor)
    decode_seconds: float = 0.0
    rounds: int = 0
    verification: dict[int, int] = field(default_factory=dict)  # executed w → rounds
    waiting: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def render(self) -> str:
        with self.lock:
            al = self.decode_tokens / self.rounds if self.rounds else 0.0
            tps = self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            lines = [
                *_metric("requests_total", "counter", "Finished generation requests.", self.requests),
                *_metric("requests_cancelled_total", "counter", "Requests whose client went away.", self.cancelled),
                *_metric("request_errors_total", "counter", "Requests answered with a 4xx/5xx.", self.errors),
                *_metric("prompt_tokens_total", "counter", "Prompt tokens of served requests.", self.prompt_tokens),
                *_metric("generation_tokens_total", "counter", "Generated tokens (usage.completion_tokens).",
                         self.generation_tokens),
                *_metric("rounds_total", "counter", "Decoding rounds (AR steps or speculative rounds).", self.rounds),
                *_metric("acceptance_length", "gauge", "Decode tokens per round, all requests.", al),
                *_metric("decode_tokens_per_second", "gauge", "Decode tokens per decode second, all requests.", tps),
                *_metric("queue_depth", "gauge", "Requests waiting for the engine.", self.waiting),
                *_metric("requests_running", "gauge", "Requests on the engine (0 or 1).", self.running),
                "# HELP hybridspec_verification_length Executed verification length w per round.",
                "# TYPE hybridspec_verification_length histogram",
            ]
            cumulative = 0
            for w in range(1, self.max_length + 1):
                cumulative += self.verification.get(w, 0)
                lines.append(f'hybridspec_verification_length_bucket{{le="{w}"}} {cumulative}')
            lines += [f'hybridspec_verification_length_bucket{{le="+Inf"}} {self.rounds}',
                      f"hybridspec_verification_length_sum {sum(w * c for w, c in self.verification.items())}",
                      f"hybridspec_verification_length_count {self.rounds}"]
        return "\n".join(lines) + "\n"


def _metric(name: str, kind: str, help: str, value: float) -> list[str]:
    return [f"# HELP hybridspec_{name} {help}", f"# TYPE hybridspec_{name} {kind}", f"hybridspec_{name} {value}"]


# ---------------------------------------------------------------- one request's decoding
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


# ---------------------------------------------------------------- the service
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
        if name not in self.policies:
            if name.startswith("static:"):
                try:
                    length = int(name.split(":", 1)[1])
                except ValueError:
                    raise PolicyError(f"policy {name!r}: static:N needs an integer N") from None
                if not 1 <= length <= self.draft_len + 1:
                    raise PolicyError(f"policy {name!r}: N must be in 1 … {self.draft_len + 1}")
            elif name not in POLICY_NAMES:
                raise PolicyError(f"unknown policy {name!r}; policies: {', '.join(POLICY_NAMES)}")
            self.policies[name] = make_policy(name, self.draft_len, self.params, device=str(self.session.engine.device))
        return self.policies[name]

    def visible_text(self, ids: list[int]) -> str:
        codec = self.session.codec
        return codec.decode([i for i in ids if i not in self.session.eos_ids]) if codec else ""

    def encode(self, text: str, param: str) -> list[int]:
        if self.session.codec is None:
            raise RequestError(f"model {self.model_name!r} has no tokenizer; give the prompt as token ids", param)
        return self.session.codec.encode(text)

    def start(self, body: _Common, prompt_ids: list[int], max_tokens: int | None, param: str) -> Decoding:
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
        except PolicyError as exc:
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


# ---------------------------------------------------------------- responses
def _error(message: str, param: str | None, status: int) -> JSONResponse:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def _validation_param(exc: RequestValidationError) -> tuple[str, str]:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return "body", f"invalid JSON: {first.get('msg', '')}"
    param = loc[0] if loc else "body"
    return param, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"


class _ClosingStream(StreamingResponse):
    """Closes its body generator when the client goes away, so that the rounds stop at once."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _respond(service: Service, decoding: Decoding, body: _Common, chat: bool):
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    base = {"id": rid, "created": int(time.time()), "model": service.model_name}
    if not body.stream:
        text = "".join([t async for t in service.run(decoding)])
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = decoding.finish_reason
        obj = "chat.completion" if chat else "text_completion"
        return JSONResponse({**base, "object": obj, "choices": [choice], "usage": decoding.usage()})
    obj = "chat.completion.chunk" if chat else "text_completion"
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**base, "object": obj, "choices": [choice]} | ({"usage": None} if include_usage else {})

    async def events():
        if chat:
            yield _sse(chunk(None, None, first=True))
        async for text in service.run(decoding):
            yield _sse(chunk(text, None))
        yield _sse(chunk(None, decoding.finish_reason))
        if include_usage:
            yield _sse({**base, "object": obj, "choices": [], "usage": decoding.usage()})
        yield _sse("[DONE]")

    return _ClosingStream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# ---------------------------------------------------------------- the app
def create_app(service: Service, *, api_key: str | None = None) -> FastAPI:
    """The FastAPI app over one `Service`; with `api_key`, /v1/* needs `Authorization: Bearer KEY`."""
    app = FastAPI(title="hybridspec", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                service.metrics.errors += 1
                return _error("missing or wrong API key (Authorization: Bearer KEY)", None, 401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        param, message = _validation_param(exc)
        service.metrics.errors += 1
        return _error(message, param, 400)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        service.metrics.errors += 1
        return _error(str(exc), exc.param, exc.status)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        card = {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "hybridspec",
                "max_model_len": service.session.engine.max_context}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        if body.echo:
            raise RequestError("echo is not supported", "echo")
        if body.logprobs is not None:
            raise RequestError("logprobs are not supported", "logprobs")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise RequestError("one prompt per request (batch size one)", "prompt")
            prompt = prompt[0]
        ids = service.encode(prompt, "prompt") if isinstance(prompt, str) else list(prompt)
        decoding = service.start(body, ids, body.max_tokens if body.max_tokens is not None else 16, "prompt")
        return await _respond(service, decoding, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        if body.logprobs:
            raise RequestError("logprobs are not supported", "logprobs")
        ids = service.encode(chat_prompt(body.messages), "messages")
        decoding = service.start(body, ids, body.max_completion_tokens or body.max_tokens, "messages")
        return await _respond(service, decoding, body, chat=True)

    return app


def open_service(*, artifact=None, model: str | None = None, drafter: str | None = None, policy: str = "hybridspec",
                 device: str = "cpu", dtype: str = "float32", backend: str = "auto", max_context: int = 4096,
                 force: bool = False, model_name: str | None = None) -> Service:
    """Load the model, the drafter and the artifact for `serve`. Policies that need parameters need
    `artifact`; one fitted for another model/drafter is refused (both ids named) unless `force`."""
    from ..artifacts.artifact import check_identity, load_artifact
    from .policies import NEEDS_PARAMETERS
    from .session import open_session

    if artifact is None and policy in NEEDS_PARAMETERS:
        raise PolicyError(f"policy {policy!r} needs --artifact (the output of `hybridspec fit`); "
                          "ar, full and static:N need none")
    params, meta = load_artifact(artifact) if artifact is not None else (None, None)
    session = open_session(model, drafter, device=device, dtype=dtype, backend=backend, max_context=max_context)
    if meta is not None:
        check_identity(meta, model_id=session.model_id, drafter_id=session.drafter_id, force=force,
                       source=str(artifact))
    name = model_name or (model if model is not None else "hybridspec-embedded")
    return Service(session, params=params, policy=policy, model_name=name)
