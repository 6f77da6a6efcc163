"""The HTTP routes of `hybridspec serve` over one `Service`:

    POST /v1/completions, POST /v1/chat/completions   (both with `stream: true` as SSE chunks)
    POST /tokenize, /detokenize
    GET  /v1/models, /v1/models/{model}, /health, /version, /metrics (Prometheus text)

`Gate`, an ASGI middleware around the whole app, answers what must not reach the routes (a missing
or wrong API key on /v1/*, /tokenize and /detokenize, as vLLM asks it; a body over
`max_request_bytes`), turns any unhandled exception into a 500, counts every response by its route
and the status it is sent with in /metrics and writes
one access-log line per request (499 for a client that went away; `tokens=P+O1+O2…`: the prompt's
tokens, summed over a batch's prompts, then each choice's output). Every 4xx/5xx body is an OpenAI error object naming the field at fault.
A stream starts only after the request is validated, and always ends with `[DONE]`, after an error
event when the engine fails mid-stream.
"""

from __future__ import annotations

import codecs
import hmac
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from .. import __version__
from ..runtime.logprobs import finite
from .api import (ChatRequest, CompletionRequest, DetokenizeRequest, RequestBody, RequestError, TokenizeRequest,
                  refuse_unsupported)
from .service import Decoding, Service, TokenLogprob
from .reasoning import ReasoningStream, split_reasoning
from .tools import ToolStream, parse_tool_calls

access_log = logging.getLogger("hybridspec.access")
error_log = logging.getLogger("hybridspec.serve")
MAX_REQUEST_BYTES = 1 << 20  # default cap on a request body, checked before any parsing or tokenizing
INTERNAL = "internal server error (the server log has the traceback)"
CLIENT_CLOSED = 499  # the status logged and counted for a request whose client went away (nginx's)
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "invalid_request_error"}


def error_body(message: str, param: str | None, status: int) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _error(message: str, param: str | None, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, param, status), status)


def _is_field(part) -> bool:
    """A part of a pydantic error's `loc` that names a field or an index, not the tag of a validator
    or of a union member (`function-after[_utf8(), str]`, `list[TextPart]`), which means nothing to a client."""
    if isinstance(part, int):
        return True
    return part != "body" and "[" not in part and not part.startswith("function-")


def _validation_param(exc: RequestValidationError) -> tuple[str, str]:
    """(param, message) of the first error: `messages.0.content: Input should be a valid string`."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if _is_field(x)]
    if first.get("type") == "json_invalid":
        return "body", f"invalid JSON: {first.get('ctx', {}).get('error') or first.get('msg', '')}"
    if not loc and first.get("type") in ("model_attributes_type", "missing"):  # no body, or no JSON object
        # FastAPI reads JSON only under a JSON Content-Type: any other (curl -d sends a form's) leaves bytes
        unread = isinstance(first.get("input"), bytes)
        return "body", "the body must be a JSON object" + (" sent as Content-Type: application/json" if unread else "")
    param = loc[0] if loc else "body"
    return param, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"


class Gate:
    """The ASGI middleware of the module docstring."""

    def __init__(self, app, service: Service, api_key: str | None, max_request_bytes: int):
        self.app, self.service, self.max_request_bytes = app, service, max_request_bytes
        self.expected = f"bearer {api_key}".encode() if api_key is not None else None
        self.paths = {route.path for route in app.routes}

    def _path_label(self, scope) -> str:
        """A response's `path` label: the route that answered (its template: `/v1/models/{model:path}`),
        for a request refused before routing the route of that exact path, else "other": one label
        per route, whatever paths clients send."""
        if (route := scope.get("route")) is not None:
            return route.path
        return scope["path"] if scope["path"] in self.paths else "other"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, sent = time.monotonic(), [500], [False]

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":  # counted before the client can see it
                status[0], sent[0] = message["status"], True
                self.service.metrics.response(scope["method"], self._path_label(scope), status[0])
            await send(message)

        async def reply(response: Response) -> None:
            await response(scope, receive, send_and_note)

        scope.setdefault("state", {})
        try:
            refusal = self._authorize(scope)
            body_or_refusal = refusal or await self._read_body(scope, receive)
            if isinstance(body_or_refusal, Response):
                await reply(body_or_refusal)
            else:
                await self.app(scope, body_or_refusal, send_and_note)
        except Exception:
            error_log.exception("%s %s failed", scope["method"], scope["path"])
            if not sent[0]:
                await reply(_error(INTERNAL, None, 500))
        finally:
            decoding: Decoding | None = scope["state"].get("decoding")
            if decoding is not None and decoding.finish_reason is None and not decoding.failed and status[0] < 400:
                status[0] = CLIENT_CLOSED  # a stream whose client left: logged so, counted as the 200 it was sent
            choices = scope["state"].get("decodings") or []  # every choice's output, each prompt once
            prompt = scope["state"].get("prompt_tokens", 0)
            tokens = f" tokens={prompt}+{'+'.join(str(len(d.ids)) for d in choices)}" if decoding is not None else ""
            access_log.info('%s "%s %s" %d%s %.3fs', _client(scope), scope["method"], scope["path"], status[0],
                            tokens, time.monotonic() - start)

    def _authorize(self, scope) -> Response | None:
        if self.expected is None or not scope["path"].startswith(("/v1", "/tokenize", "/detokenize")):
            return None
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, key = given.partition(b" ")
        if not hmac.compare_digest(scheme.lower() + b" " + key.strip(), self.expected):
            return _error("missing or wrong API key (Authorization: Bearer KEY)", None, 401)
        return None

    async def _read_body(self, scope, receive):
        """The whole body, read before the app sees it, or a 413 once it passes the cap; returns
        a `receive` that hands the app the body and then the client's own messages."""
        limit = self.max_request_bytes
        too_large = _error(f"the request body exceeds {limit} bytes (serve --max-request-bytes)", "body", 413)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            return too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                replay = [message]
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return too_large
            if not message.get("more_body", False):
                replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replayed():
            return replay.pop() if replay else await receive()

        return replayed


def _client(scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


class _ClosingStream(StreamingResponse):
    """Closes its body generator when the client goes away, so that the rounds stop at once."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class TextOffsets:
    """Where each token's text begins in a completion's text (`text_offset`, in characters): the
    characters that the tokens before it complete, so a token that ends inside a UTF-8 character
    moves the offset only once a later token completes the character."""

    def __init__(self):
        self.chars, self._decoder = 0, codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, raw: bytes) -> int:
        """The offset of the token whose bytes are `raw`, the tokens before it taken already."""
        pending, _ = self._decoder.getstate()
        if pending and raw and not 0x80 <= raw[0] <= 0xBF:  # no continuation: the unfinished character is a U+FFFD
            self.chars += len(self._decoder.decode(b"", final=True))
        at = self.chars
        self.chars += len(self._decoder.decode(raw))
        return at


def completion_logprobs(service: Service, entries: list[TokenLogprob], offsets: TextOffsets) -> dict:
    """The `logprobs` of a completion choice (OpenAI's legacy form) for `entries`, the choice's tokens
    after those `offsets` has taken. Each token's alternatives include the token itself, as vLLM
    gives them (up to logprobs + 1). Special tokens keep their strings, and count in `text_offset`,
    whatever skip_special_tokens says, as in vLLM (`Service.token_text`)."""
    tokens = [service.token_text(e.token) for e in entries]
    top = [None if e.top is None else
           {service.token_text(i): finite(v) for i, v in [*e.top, (e.token, e.logprob)]} for e in entries]
    return {"tokens": tokens, "token_logprobs": [finite(e.logprob) for e in entries], "top_logprobs": top,
            "text_offset": [offsets.take(service.token_bytes(e.token)) for e in entries]}


def chat_logprobs(service: Service, entries: list[TokenLogprob]) -> dict:
    """The `logprobs` of a chat choice for `entries`: per token its text (a special token's too,
    whatever skip_special_tokens says, as in vLLM), log-probability, UTF-8 bytes and alternatives."""
    def item(token: int, logprob: float) -> dict:
        return {"token": service.token_text(token), "logprob": finite(logprob), "bytes": list(service.token_bytes(token))}

    return {"content": [item(e.token, e.logprob) | {"top_logprobs": [item(i, v) for i, v in e.top]} for e in entries]}


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _respond(service: Service, choice: Callable[[int], Decoding], body: RequestBody, chat: bool,
                   request: Request, echoes: Sequence[str] = ("",), thinking: bool | None = None):
    """The response to a validated request: JSON, or an SSE stream. One prompt, or a batch of
    `len(echoes)` (completions): `n` choices each, choice i of prompt i // n. `choice(i)` builds the
    decoding of choice i (`choice(0)` already built, so validated); the choices decode one after
    another, each streamed whole before the next. `echoes[p]` (prompt p's text, or "") goes before
    each of its choices' text. `thinking` (chat, when the server splits reasoning off): whether the
    output starts inside a `<think>` block (`reasoning.py`); None: no split."""
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    base = {"id": rid, "created": int(time.time()), "model": service.model_name}
    obj = ("chat.completion" if chat else "text_completion") + (".chunk" if body.stream and chat else "")
    tools = chat and body.calls_tools()  # the output is parsed for tool calls (`tools.py`)
    parallel = not tools or body.parallel_tool_calls  # false: the first call only
    specs = [t.model_dump(exclude_none=True) for t in body.tools] if tools else None
    done: list[Decoding] = []
    count = len(echoes) * body.n  # choices

    def begin(i: int) -> Decoding:
        decoding = choice(i)
        request.state.decoding = decoding  # the current choice: for the access log's status and the cancellation count
        request.state.decodings = [*getattr(request.state, "decodings", []), decoding]  # the access log's tokens
        if i % body.n == 0:  # a prompt's first choice: its tokens counted once in the access log
            request.state.prompt_tokens = getattr(request.state, "prompt_tokens", 0) + len(decoding.prompt_ids)
        return decoding

    def logprobs(decoding: Decoding, entries: list[TokenLogprob], offsets: TextOffsets) -> dict | None:
        if decoding.logprobs is None:
            return None
        return chat_logprobs(service, entries) if chat else completion_logprobs(service, entries, offsets)

    def usage() -> dict:  # each prompt counted once, as vLLM counts a batch's
        n_prompt, n_out = sum(len(d.prompt_ids) for d in done[:: body.n]), sum(len(d.ids) for d in done)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def stats() -> dict:
        if not body.spec_decode_stats:
            return {}
        return {"spec_decode_stats": done[0].stats() if count == 1 else [d.stats() for d in done]}

    if not body.stream:
        choices = []
        for i in range(count):
            decoding = begin(i)
            deltas = [d async for d in service.run(decoding, request.is_disconnected)]
            if decoding.finish_reason is None:  # the client went away; nobody reads this
                return _error("the client closed the request", None, CLIENT_CLOSED)
            done.append(decoding)
            text, entries = echoes[i // body.n] + "".join(d.text for d in deltas), [e for d in deltas for e in d.logprobs]
            finish = decoding.finish_reason
            reasoning = {}
            if chat and thinking is not None:
                thought, text = split_reasoning(text, thinking)
                reasoning = {"reasoning_content": thought}
            if not chat:
                item = {"index": i, "text": text}
            elif tools:
                content, calls = parse_tool_calls(text, service.tool_format, specs)
                calls = calls if parallel else calls[:1]
                message = {"role": "assistant", "content": content} | reasoning | ({"tool_calls": calls} if calls else {})
                item, finish = {"index": i, "message": message}, "tool_calls" if calls else finish
            else:
                item = {"index": i, "message": {"role": "assistant", "content": text} | reasoning}
            choices.append(item | {"logprobs": logprobs(decoding, entries, TextOffsets()), "finish_reason": finish,
                                   "stop_reason": decoding.stop_reason})
        return JSONResponse({**base, "object": obj, "choices": choices, "usage": usage(), **stats()})
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    # vLLM's continuous_usage_stats: every chunk carries its choice's usage so far
    continuous = include_usage and body.stream_options.continuous_usage_stats
    live: list[Decoding] = []  # the choice being streamed

    def chunk(i: int, text: str | None, finish: str | None, lps: dict | None = None, first: bool = False,
              thought: str = "") -> dict:
        if chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {}) | (
                {"reasoning_content": thought} if thought else {})
            item = {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}
        else:
            item = {"index": i, "text": text or "", "logprobs": lps, "finish_reason": finish}
        item["stop_reason"] = live[0].stop_reason if finish else None
        out = {**base, "object": obj, "choices": [item]}
        if continuous:
            n_prompt, n_out = len(live[0].prompt_ids), len(live[0].ids)
            return out | {"usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                    "total_tokens": n_prompt + n_out}}
        return out | ({"usage": None} if include_usage else {})

    def call_chunk(i: int, delta: dict) -> dict | None:
        """A `tool_calls` delta of choice i as a chunk; None past the first call without
        parallel_tool_calls."""
        if delta["index"] and not parallel:
            return None
        out = chunk(i, None, None)
        out["choices"][0]["delta"] = {"tool_calls": [delta]}
        return out

    async def events():
        decoding = None
        try:
            for i in range(count):
                decoding, pending, offsets = begin(i), echoes[i // body.n], TextOffsets()  # echo: with the first chunk
                live[:] = [decoding]
                calls = ToolStream(service.tool_format, specs) if tools else None  # content until a call may begin
                thoughts = ReasoningStream(thinking) if chat and thinking is not None else None
                if chat:
                    yield _sse(chunk(i, None, None, first=True))
                async for delta in service.run(decoding, request.is_disconnected):
                    lps = logprobs(decoding, delta.logprobs, offsets) if delta.logprobs else None
                    thought, text = thoughts.feed(delta.text) if thoughts else ("", delta.text)
                    text, found = calls.feed(text) if calls else (text, [])
                    if pending or text or thought or lps:  # no chunk for a round whose text is held back
                        yield _sse(chunk(i, pending + text, None, lps, thought=thought))
                        pending = ""
                    for call in found:
                        if sent := call_chunk(i, call):
                            yield _sse(sent)
                if decoding.finish_reason is None:  # the client went away
                    return
                done.append(decoding)
                found = []
                if thoughts:  # what the reasoning split held back
                    thought, text = thoughts.finish()
                    text, found = calls.feed(text) if calls else (text, [])
                    if thought or text:
                        yield _sse(chunk(i, text, None, thought=thought))
                for call in found:  # closed by what the reasoning split held back
                    if sent := call_chunk(i, call):
                        yield _sse(sent)
                if calls:
                    rest, more = calls.finish()  # content before any call, or after a block that is not one
                    if rest:
                        yield _sse(chunk(i, rest, None))
                    for call in more:
                        if sent := call_chunk(i, call):
                            yield _sse(sent)
                finish = "tool_calls" if calls and calls.calls else decoding.finish_reason
                yield _sse(chunk(i, pending or None, finish) | (stats() if i == count - 1 else {}))
            if include_usage:
                yield _sse({**base, "object": obj, "choices": [], "usage": usage()})
        except Exception:  # the engine failed mid-stream: the status is sent, so an error event says it
            error_log.exception("stream %s failed", rid)
            yield _sse(error_body(INTERNAL, None, 500))
        finally:
            if decoding is not None:
                service.discard(decoding)
        yield _sse("[DONE]")

    return _ClosingStream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def create_app(service: Service, *, api_key: str | None = None, max_request_bytes: int = MAX_REQUEST_BYTES,
               allowed_origins: tuple[str, ...] = ()):
    """The ASGI app over one `Service`: FastAPI routes inside `Gate`. With `api_key`, /v1/* needs
    `Authorization: Bearer KEY` (the scheme in any case). With `allowed_origins` ("*": any), web
    pages of those origins may call the server from a browser: CORS preflights are answered before
    `Gate` (a browser sends them without the key) and every response carries the CORS headers."""
    app = FastAPI(title="hybridspec", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        param, message = _validation_param(exc)
        return _error(message, param, 400)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return _error(str(exc), exc.param, exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # 404, 405, an unparsable body
        response = _error(str(exc.detail), "body" if exc.status_code == 400 else None, exc.status_code)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):  # Starlette answers with it, then re-raises to `Gate`
        return _error(INTERNAL, None, 500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def card() -> dict:
        return {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "hybridspec",
                "root": str(service.session.model), "parent": None,  # vLLM's: the checkpoint served, no adapter
                "max_model_len": service.session.engine.max_context}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        service.check_model(model)
        return card()

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        refuse_unsupported(body)
        body.check_input()
        service.check_model(body.model)
        if body.prompt is not None:
            ids = await service.encode(body.prompt, "prompt")
        else:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            ids, _ = await service.encode_chat([m.for_template() for m in body.messages], tools,
                                               body.chat_template_kwargs)
        strs = service.token_strings(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": service.session.engine.max_context, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        service.check_model(body.model)
        return {"prompt": service.detokenize(body.tokens)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        arrived = time.monotonic()
        refuse_unsupported(body)
        body.check_fields()
        prompts = body.prompts()
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        params = ["prompt"] if len(prompts) == 1 else [f"prompt.{p}" for p in range(len(prompts))]
        ids, grammar = [], None
        for prompt, param in zip(prompts, params):  # every prompt checked before any decoding starts
            ids.append(await service.encode(prompt, param) if isinstance(prompt, str) else list(prompt))
            grammar = await service.check_grammar(body, ids[-1], max_tokens, param)
            service.check(body, ids[-1], max_tokens, param)
        first = service.start(body, ids[0], max_tokens, params[0], arrived, grammar=grammar)
        # echo: the prompt as sent, or a token-id prompt's text with its special tokens whatever
        # skip_special_tokens says (it applies to the output, as in vLLM)
        echoes = [(p if isinstance(p, str) else service.prompt_text(i)) if body.echo else "" for p, i in zip(prompts, ids)]

        def choice(k: int) -> Decoding:  # prompt k // n, its choice k % n
            return first if k == 0 else service.start(body, ids[k // body.n], max_tokens, params[k // body.n],
                                                      choice=k % body.n, grammar=grammar)

        return await _respond(service, choice, body, False, request, echoes)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        arrived = time.monotonic()
        refuse_unsupported(body)
        body.check_fields()
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None  # "none" too, as vLLM
        ids, thinking = await service.encode_chat([m.for_template() for m in body.messages], tools,
                                                  body.chat_template_kwargs)
        max_tokens = body.max_completion_tokens or body.max_tokens
        grammar = await service.check_grammar(body, ids, max_tokens, "messages", thinking)
        first = service.start(body, ids, max_tokens, "messages", arrived, grammar=grammar)
        choice = lambda i: first if i == 0 else service.start(body, ids, max_tokens, "messages", choice=i,  # noqa: E731
                                                              grammar=grammar)
        return await _respond(service, choice, body, True, request, thinking=thinking if service.reasoning else None)

    gate = Gate(app, service, api_key, max_request_bytes)
    if not allowed_origins:
        return gate
    return CORSMiddleware(gate, allow_origins=list(allowed_origins), allow_methods=["*"], allow_headers=["*"])


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening (port 0: one the system picks). `hybridspec
    serve` makes it before the model loads, so that an address in use is named at once, not after
    minutes of loading weights. OSError naming the address where it cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a stopped server left in TIME_WAIT
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's backlog
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(service: Service, *, host: str, port: int, sock: socket.socket | None = None, api_key: str | None = None,
          max_request_bytes: int = MAX_REQUEST_BYTES, allowed_origins: tuple[str, ...] = (),
          log_level: str = "info") -> None:
    """Run the app until interrupted (what `hybridspec serve` runs) on `sock` (from `listen`), or
    on a socket bound to host:port here when None. Logs (the access log at info) go to stderr
    through `logging`. SystemExit(3), uvicorn's status, where the server did not start."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(service, api_key=api_key, max_request_bytes=max_request_bytes, allowed_origins=allowed_origins)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False))
    try:
        server.run(sockets=[sock if sock is not None else listen(host, port)])
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C it caught again once it has shut down: a clean stop
        pass
    if not server.started:
        raise SystemExit(3)
