"""The HTTP routes of `hybridspec serve` over one `Service`:

    POST /v1/completions, POST /v1/chat/completions   (both with `stream: true` as SSE chunks)
    GET  /v1/models, /health, /metrics (Prometheus text)

Only /v1/* asks for the API key (as vLLM does). Errors are OpenAI error objects naming the field.
"""

from __future__ import annotations

import json
import time
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .api import ChatRequest, CompletionRequest, RequestBody, RequestError, chat_prompt
from .service import Decoding, Service


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


async def _respond(service: Service, decoding: Decoding, body: RequestBody, chat: bool):
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


def serve(service: Service, *, host: str, port: int, api_key: str | None = None) -> None:
    """Run the app on host:port until interrupted (what `hybridspec serve` runs)."""
    uvicorn.run(create_app(service, api_key=api_key), host=host, port=port, log_level="warning")
