"""The model behind `hybridspec serve`, its policies, and the FIFO queue in front of the engine.

One model instance, batch size one (as the paper): requests wait for an `asyncio.Lock` (FIFO) and
the engine runs round by round (`Engine.stream`) in one worker thread. A client that goes away is
noticed while its request waits (it leaves the queue) and before each round (the remaining rounds
are cancelled); either way the request is counted as cancelled. Tokenizing runs in a thread too,
so that a long prompt never holds up the event loop (/health, other clients).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.params import PolicyParameters
from ..runtime.engine import PrefillRecord
from ..runtime.ending import Ending, StopSequences, output_text
from ..runtime.generation import check_policy, default_policy
from ..runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from ..runtime.logprobs import TokenLogprobs
from ..runtime.policies import Policy, make_policy
from ..runtime.sampling import GREEDY_BELOW, SEED_MIN, SamplingParams
from ..runtime.session import Session, open_session
from ..runtime.tensor_parallel import mirrored
from ..runtime.tokenizer import ChatTemplateError, TextCodec
from .api import ChatRequest, RequestBody, RequestError
from .metrics import ServerMetrics
from .reasoning import THINK_CLOSE, THINK_OPEN, opens_in_prompt
from .reasoning import reasoning_parser as reasoning_parser_on
from .tools import CLOSE as TOOL_CLOSE
from .tools import OPEN as TOOL_OPEN
from .tools import tool_format

EMBEDDED_NAME = "hybridspec-embedded"  # the served model name of the default pair
QUEUE_POLL_S = 0.1  # how often a queued request checks that its client is still there
Abandoned = Callable[[], Awaitable[bool]]  # True once the client has gone away
PARSED_MARKERS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE)  # what the chat output's parsers look for


@dataclass(frozen=True)
class StreamRequest:
    """What the engine needs to run one request (and what the other ranks are told under tensor parallelism)."""

    prompt_ids: list[int]
    policy: str
    max_tokens: int
    sampling: SamplingParams
    end_ids: tuple[int, ...]  # the tokens that end it: the model's EOS (unless ignore_eos) and its stop_token_ids
    logprobs: int | None = None  # alternatives per token of the logprobs it asks for (None: none)
    prompt_logprobs: int | None = None  # the same of the prompt's tokens
    grammar: GrammarSpec | None = None  # what the output must match (`runtime/grammar.py`)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and its `top` alternatives (id, log-probability); None for the
    prompt's first token, which no row decides."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None


@dataclass(frozen=True)
class Delta:
    """What a request hands out after a round: text, and the logprobs of the tokens decoded since the
    last delta (they may run ahead of the text, which holds back what may become a stop sequence)."""

    text: str
    logprobs: list[TokenLogprob]


class Decoding:
    """One request on the engine: its round stream, the decoded text, stop sequences and usage.
    `advance` and `close` run in the worker thread only."""

    def __init__(self, service: Service, prompt_ids: list[int], policy_name: str, max_tokens: int,
                 sampling: SamplingParams, stops: list[str], arrived: float, ending: Ending,
                 logprobs: int | None = None, prompt_logprobs: int | None = None,
                 grammar: GrammarSpec | None = None, hidden: frozenset[int] | None = None):
        self.service, self.prompt_ids, self.stops, self.arrived = service, prompt_ids, stops or [], arrived
        self.ending = ending
        # the ids left out of the text (`Service.hidden_ids`; None: `ending`'s): stop sequences are
        # matched in the text the client gets
        self.hidden = ending.hidden() if hidden is None else hidden
        self.labels = {"model_name": service.model_name, "policy": policy_name}
        # max_tokens 0 (OpenAI's echo without a completion): the prefill scores the prompt, its token is dropped
        self.prompt_only = max_tokens == 0
        request = StreamRequest(prompt_ids, policy_name, max(max_tokens, 1), sampling, ending.end_ids, logprobs,
                                prompt_logprobs, grammar)
        self.steps = service.steps(request)
        self.ids: list[int] = []
        self.text, self.sent = "", 0  # visible text; characters already handed out
        self.logprobs = TokenLogprobs() if logprobs is not None else None  # of `ids`
        self.logprobs_sent = 0  # tokens whose logprobs were handed out
        self.prompt_logprobs: list[TokenLogprob] = []  # the prompt's, until handed out
        # stop sequences, matched in the text the client gets, after that of the first min_tokens ids
        self.stop_sequences = StopSequences(tuple(self.stops), lambda ids: service.visible_text(ids, self.hidden),
                                            sampling.min_tokens)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # vLLM's: the stop sequence or stop token id that ended it
        self.rounds, self.decode_tokens, self.draft_tokens, self.accepted_tokens = 0, 0, 0, 0
        self.verification: dict[int, int] = {}
        self.closed = False
        self.failed = False  # the engine raised: counted as failed, not cancelled

    def advance(self) -> None:
        """Run the prefill or one round; sets `finish_reason` when done."""
        step = next(self.steps, None)
        if step is None:
            ended = bool(self.ids) and self.ids[-1] in self.ending.end_ids
            self.finish_reason = "stop" if ended else "length"
            if ended:
                self.stop_reason = self.ending.stop_reason(self.ids[-1])
            return
        new, record = step
        if isinstance(record, PrefillRecord):  # the prefill's anchor: the first token
            self.service.metrics.time_to_first_token.labels(**self.labels).observe(time.monotonic() - self.arrived)
            if record.prompt_logprobs is not None:
                lps = record.prompt_logprobs
                self.prompt_logprobs = [TokenLogprob(self.prompt_ids[0], None, None)] + [
                    TokenLogprob(token, lps.chosen[i], lps.top[i]) for i, token in enumerate(self.prompt_ids[1:])]
            if self.prompt_only:
                self.finish_reason = "length"
                return
        else:
            self._count_round(record)
        start = len(self.ids)
        self.ids.extend(new)
        if self.logprobs is not None:
            self.logprobs.extend(record.logprobs)
        self.text = self.stop_sequences.text(self.ids)  # the text the stop search reads again
        if self.stops and self._stop_within(start):
            self.finish_reason = "stop"

    def _count_round(self, record) -> None:
        m, labels = self.service.metrics, self.labels
        self.rounds += 1
        self.decode_tokens += record.emitted
        self.verification[record.w] = self.verification.get(record.w, 0) + 1
        m.decode_tokens.labels(**labels).inc(record.emitted)
        m.verification_length.labels(**labels).observe(record.w)
        m.round_seconds.labels(**labels).observe(record.seconds.get("total", 0.0))
        if record.w0 is not None:  # a speculative round: w − 1 draft tokens verified, A accepted
            self.draft_tokens += record.w - 1
            self.accepted_tokens += record.accepted
            m.num_drafts.labels(**labels).inc()
            m.num_draft_tokens.labels(**labels).inc(record.w - 1)
            m.num_accepted_tokens.labels(**labels).inc(record.accepted)
            for position in range(1, record.accepted + 1):
                m.accepted_per_pos.labels(**labels, position=str(position)).inc()

    def _stop_within(self, start: int) -> bool:
        """Cut ids and text at the first stop sequence (`StopSequences`: vLLM's rule), keeping the
        fewest ids that produce it; `start`: the ids before this step's, which held none."""
        k = self.stop_sequences.length(self.ids, start)
        if k is None:
            return False
        text, stop = self.stop_sequences.cut(self.ids[:k])
        self.ids, self.text, self.stop_reason = self.ids[:k], text + stop if self.ending.include_stop else text, stop
        if self.logprobs is not None:  # only this step's tokens are cut: earlier ones never held a stop
            self.logprobs = self.logprobs.head(k)
        return True

    def delta(self) -> Delta:
        """Text not yet handed out, holding back what may still become a stop sequence or a
        partial UTF-8 character, and the logprobs of the tokens not yet handed out."""
        end = len(self.text)
        if self.finish_reason is None:
            end -= max((len(s) - 1 for s in self.stops), default=0)
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
        text = ""
        if end > self.sent:
            text, self.sent = self.text[self.sent:end], end
        logprobs, self.prompt_logprobs = self.prompt_logprobs, []
        if self.logprobs is not None:
            lps, done = self.logprobs, self.logprobs_sent
            logprobs += [TokenLogprob(token, lps.chosen[i], lps.top[i])
                         for i, token in enumerate(self.ids[done:], start=done)]
            self.logprobs_sent = len(self.ids)
        return Delta(text, logprobs)

    def close(self) -> None:
        """Stop decoding (cancels the remaining rounds) and add this request to the metrics."""
        if self.closed:
            return
        self.closed = True
        self.steps.close()
        m, labels = self.service.metrics, self.labels
        if self.failed:
            m.request_failed.labels(**labels).inc()
        elif self.finish_reason is None:
            m.request_cancelled.labels(**labels).inc()
        else:
            m.request_success.labels(**labels, finished_reason=self.finish_reason).inc()
            m.e2e_latency.labels(**labels).observe(time.monotonic() - self.arrived)
        m.prompt_tokens.labels(**labels).inc(len(self.prompt_ids))
        m.generation_tokens.labels(**labels).inc(len(self.ids))

    def usage(self) -> dict:
        n_prompt, n_out = len(self.prompt_ids), len(self.ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def stats(self) -> dict:
        """The request's round statistics (the `spec_decode_stats` extension of a response)."""
        return {"policy": self.labels["policy"], "rounds": self.rounds, "decode_tokens": self.decode_tokens,
                "acceptance_length": self.decode_tokens / self.rounds if self.rounds else 0.0,
                "num_draft_tokens": self.draft_tokens, "num_accepted_tokens": self.accepted_tokens,
                "verification_lengths": {str(w): n for w, n in sorted(self.verification.items())}}


GRAMMAR_TIMEOUT = 30.0  # seconds a request's grammar may take to compile (`Service.check_grammar`)
STUCK_COMPILES = 2  # compiles past the timeout that may still run before grammar requests are refused (503)


def _on_daemon_thread(fn: Callable[[], object]) -> Future:
    """fn() on a daemon thread of its own, as a future (no pool: none waits for it at exit)."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting request
                future.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="grammar").start()
    return future
PREPARE_SAMPLING = {"greedy": SamplingParams(), "sample": SamplingParams(1.0), "top-k": SamplingParams(1.0, 20),
                    "filter": SamplingParams(1.0, 0, 0.9)}  # a request of each `resident.sampling_mode`
PREPARE_EXTRAS = ("logprobs", "penalties", "grammar")


def prepare_flavours(specs: tuple[str, ...]) -> list[tuple[SamplingParams, bool, bool]]:
    """`serve --prepare` items (`sample`, `greedy+logprobs`, `top-k+penalties+logprobs`,
    `greedy+grammar`, …) → the (sampling, logprobs, grammar) whose graphs the server captures at
    start-up. ValueError names a bad item."""
    flavours = []
    for spec in specs:
        mode, *extras = (part.strip() for part in spec.split("+"))
        if mode not in PREPARE_SAMPLING or any(e not in PREPARE_EXTRAS for e in extras):
            raise ValueError(f"--prepare {spec!r}: a sampling mode ({', '.join(PREPARE_SAMPLING)}) with any of "
                             f"+{', +'.join(PREPARE_EXTRAS)}")
        sampling = PREPARE_SAMPLING[mode]
        if "penalties" in extras:
            sampling = dataclasses.replace(sampling, presence_penalty=0.5)
        flavours.append((sampling, "logprobs" in extras, "grammar" in extras))
    return flavours


class Service:
    """The model, its policies and the FIFO queue in front of the engine."""

    def __init__(self, session: Session, *, params: PolicyParameters | None, policy: str, model_name: str,
                 tensor_parallel: bool = False, prepare: tuple[str, ...] = (), tool_call_parser: str = "auto",
                 reasoning_parser: str = "auto", grammar_timeout: float = GRAMMAR_TIMEOUT):
        self.session, self.params, self.model_name = session, params, model_name
        # a request's grammar compiles on a daemon thread of its own (tokenizing never waits behind a
        # slow one, and a runaway compile does not hold the server's exit), refused past
        # `grammar_timeout` seconds; the compile runs on (xgrammar keeps what it made), counted in
        # `overrun` until it ends: while STUCK_COMPILES such run, grammar requests are refused at once
        self.grammar_timeout = grammar_timeout
        self.overrun = 0
        templates = list(session.codec.chat_templates.values()) if session.codec is not None else []
        # the call format chat outputs are parsed for (`tools.py`), and whether their reasoning is split off
        self.tool_format = tool_call_parser if tool_call_parser != "auto" else tool_format(
            session.codec.chat_templates.get("tool_use", session.codec.chat_template) if session.codec else None)
        self.reasoning = reasoning_parser_on(reasoning_parser, templates)
        self.thinking_template = any("</think>" in t for t in templates)  # the model may write a <think> block
        self.tensor_parallel = tensor_parallel  # every rank runs each engine step (`steps`)
        self.draft_len = session.drafter.draft_len if session.drafter is not None else 0
        self.policies: dict[str, Policy] = {}
        self.default_policy_name = policy
        self.default_policy = self.policy(policy)  # fails at start-up on a bad default
        # the default policy's greedy graphs, and those of the `prepare` flavours, are captured now, not
        # in the first such request's time; a tensor-parallel group captures in its first request of
        # each flavour, which every rank runs
        if not tensor_parallel:
            for sampling, logprobs, grammar in [(SamplingParams(), False, False), *prepare_flavours(prepare)]:
                session.engine.prepare(self.default_policy, sampling, logprobs=logprobs, grammar=grammar)
        self.lock = asyncio.Lock()  # FIFO: waiters are woken in arrival order
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.metrics = ServerMetrics(model_name, max_length=self.draft_len + 1)
        self._token_bytes: dict[int, bytes] = {}  # `token_bytes`, kept: logprobs name the same tokens often
        self._grammars: GrammarCompiler | None = None  # built by the first request with a grammar
        self._grammars_lock = threading.Lock()
        self.created = int(time.time())

    def policy(self, name: str) -> Policy:
        """The policy `name`, built once by `make_policy` (PolicyError: unknown name, bad length,
        no parameters)."""
        if name not in self.policies:
            self.policies[name] = make_policy(name, self.draft_len, self.params, device=str(self.session.engine.device))
        return self.policies[name]

    def steps(self, request: StreamRequest) -> Iterator:
        """The engine's round stream for `request`; under tensor parallelism every step runs on every
        rank (`tensor_parallel.mirrored`; the other ranks run `follow(service.engine_steps)`)."""
        if self.tensor_parallel:
            return mirrored(lambda: self.engine_steps(request), request)
        return self.engine_steps(request)

    def engine_steps(self, request: StreamRequest) -> Iterator:
        grammar = None
        if request.grammar is not None:  # compiled by `check_grammar` already: xgrammar's cache answers
            grammar = GrammarState(self.grammar_compiler().compile(request.grammar), request.end_ids,
                                   self.session.target.cfg.vocab_size)
        return self.session.engine.stream(request.prompt_ids, policy=self.policy(request.policy),
                                          max_new_tokens=request.max_tokens, sampling=request.sampling,
                                          eos_ids=request.end_ids, logprobs=request.logprobs,
                                          prompt_logprobs=request.prompt_logprobs, grammar=grammar)

    def grammar_compiler(self, param: str | None = None) -> GrammarCompiler:
        with self._grammars_lock:  # built once, by whichever thread comes first
            if self._grammars is None:
                codec = self._codec(param or "response_format")
                self._grammars = GrammarCompiler(codec.tokenizer, self.session.target.cfg.vocab_size,
                                                 self.session.eos_ids)
        return self._grammars

    async def check_grammar(self, body: RequestBody, prompt_ids: list[int], max_tokens: int | None, param: str,
                            thinking: bool = False) -> GrammarSpec | None:
        """The request's output constraint (`RequestBody.grammar_spec`, or the calls a chat request's
        tool_choice requires), after the reasoning block when the prompt opened one (`thinking`),
        compiled in a thread so that a bad one, or one that allows no output, is refused before the
        request runs; RequestError names the field. A constrained request's own checks (`check`)
        come first, so that a request the model cannot run pays no compile."""
        tools = isinstance(body, ChatRequest) and body.forced_calls()
        if tools:
            reasoning = "enabled" if thinking else "auto" if self.thinking_template else "disabled"
            spec = body.tool_grammar(self.tool_format, reasoning)
        else:
            spec = body.grammar_spec()
            spec = spec.after_reasoning() if spec is not None and thinking else spec
        if spec is None:
            return None
        self.check(body, prompt_ids, max_tokens, param)
        field = "tools" if tools else body.grammar_field()
        end_ids = self.ending(body).end_ids

        def compile_() -> None:
            try:
                compiled = self.grammar_compiler(field).compile(spec)
                if end_ids and not GrammarState(compiled, end_ids, self.session.target.cfg.vocab_size).allows_anything():
                    raise GrammarError(f"the {spec.kind} grammar allows no output")
            except GrammarError as exc:
                raise RequestError(str(exc), field) from None

        if self.overrun >= STUCK_COMPILES:
            raise RequestError(f"{self.overrun} grammars are still compiling past --grammar-timeout; retry later",
                               field, 503)
        done = _on_daemon_thread(compile_)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), self.grammar_timeout)
        except TimeoutError:
            self.overrun += 1
            loop = asyncio.get_running_loop()
            done.add_done_callback(lambda _: loop.call_soon_threadsafe(self._compile_ended))
            raise RequestError(f"the {spec.kind} grammar did not compile within {self.grammar_timeout:g} s "
                               "(--grammar-timeout)", field) from None
        return spec

    def _compile_ended(self) -> None:
        self.overrun -= 1

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes (`TextCodec.token_bytes`; its id's text for a model without a tokenizer)."""
        if token not in self._token_bytes:
            codec = self.session.codec
            self._token_bytes[token] = codec.token_bytes(token) if codec else f"token_id:{token}".encode()
        return self._token_bytes[token]

    def token_text(self, token: int) -> str:
        """One token's text as logprobs name it: its bytes as UTF-8, or as OpenAI writes a token that
        is part of a character, `bytes:\\xNN…` (`token_id:N` for a model without a tokenizer, as
        vLLM's `return_tokens_as_token_ids`). A special token is named by its text whatever
        skip_special_tokens says, as vLLM names it in logprobs."""
        raw = self.token_bytes(token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def prompt_text(self, ids: list[int]) -> str:
        """A token-id prompt's text as `echo` and /detokenize give it: every token, special ones
        included, whatever skip_special_tokens says (vLLM decodes a token-id prompt so)."""
        return self.session.codec.decode(ids) if self.session.codec else ""

    def visible_text(self, ids: list[int], hidden: frozenset[int] = frozenset()) -> str:
        """The text of output `ids` without the `hidden` ones (`hidden_ids`)."""
        codec = self.session.codec
        return output_text(codec.decode, ids, hidden) if codec else ""

    def hidden_ids(self, body: RequestBody, ending: Ending) -> frozenset[int]:
        """The ids left out of a request's output text (`Ending.hidden`): its end tokens unless
        include_stop_str_in_output, and with skip_special_tokens (the default) the tokens the
        tokenizer marks special (`TextCodec.special_ids`) but for the markers the request's parsers
        read (`parsed_markers`)."""
        codec = self.session.codec
        if codec is None or not body.skip_special_tokens:
            return ending.hidden()
        return ending.hidden(codec.special_ids - self.parsed_markers(body))

    def parsed_markers(self, body: RequestBody) -> frozenset[int]:
        """The ids of the tokens `<think>`, `</think>`, `<tool_call>` and `</tool_call>` where a chat
        request's output is split into reasoning or parsed for tool calls: they stay in its text even
        where the tokenizer marks them special (Qwen's tokenizers do not; vLLM's tool parsers turn
        skip_special_tokens off for such a request, which keeps every special token)."""
        if not isinstance(body, ChatRequest) or not (self.reasoning or body.calls_tools()):
            return frozenset()
        ids = (self.session.codec.tokenizer.token_to_id(marker) for marker in PARSED_MARKERS)
        return frozenset(i for i in ids if i is not None)

    async def encode(self, text: str, param: str) -> list[int]:
        """Token ids of `text`, tokenized in a thread (the tokenizer releases the GIL)."""
        return await asyncio.to_thread(self._codec(param).encode, text)

    async def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                          template_kwargs: dict | None = None) -> tuple[list[int], bool]:
        """(token ids, reasoning open) of chat messages (and tools, and the request's extra template
        variables) under the model's chat template, rendered and tokenized in a thread; reasoning
        open: the output starts inside a `<think>` block the prompt opened."""
        codec = self._codec("messages")

        def render() -> tuple[list[int], bool]:
            try:
                text = codec.render_chat(messages, tools, template_kwargs)
            except ChatTemplateError as exc:  # no template, or the template refused the messages or variables
                raise RequestError(str(exc), "chat_template_kwargs" if template_kwargs else "messages") from None
            return codec.encode(text), opens_in_prompt(text)

        return await asyncio.to_thread(render)

    def _codec(self, param: str) -> TextCodec:
        if self.session.codec is None:
            raise RequestError(f"model {self.model_name!r} has no tokenizer; give the prompt as token ids", param)
        return self.session.codec

    def start(self, body: RequestBody, prompt_ids: list[int], max_tokens: int | None, param: str,
              arrived: float | None = None, choice: int = 0, grammar: GrammarSpec | None = None) -> Decoding:
        """Validate against the model (`check`) and build the decoding of the request's choice
        `choice` (nothing runs yet); choice i samples with seed + i (a request without a seed: a
        random one each)."""
        name, room = self.check(body, prompt_ids, max_tokens, param)
        vocab = self.session.target.cfg.vocab_size
        ending = self.ending(body)
        seed = body.seed if body.seed is not None else random.randrange(2**31)
        seed = (seed + choice - SEED_MIN) % 2**64 + SEED_MIN  # wraps within the 64-bit seeds
        temperature = body.temperature if body.temperature >= GREEDY_BELOW else 0.0  # as vLLM: greedy below it
        logit_bias = body.logit_bias_pairs(vocab)
        try:
            sampling = SamplingParams(temperature, max(body.top_k, 0), body.top_p, seed, body.presence_penalty,
                                      body.frequency_penalty, body.repetition_penalty, logit_bias, body.min_tokens,
                                      body.min_p)
        except ValueError as exc:
            raise RequestError(str(exc), None) from None
        arrived = time.monotonic() if arrived is None else arrived
        if grammar is not None and not ending.end_ids:
            raise RequestError("structured output needs an end token: this model has no EOS; give stop_token_ids",
                               body.grammar_field() or "tool_choice")
        max_tokens = room if max_tokens is None else max_tokens  # 0: the prompt only (`Decoding.prompt_only`)
        return Decoding(self, prompt_ids, name, max_tokens, sampling, body.stop, arrived, ending,
                        body.logprob_count(), body.prompt_logprob_count(), grammar, self.hidden_ids(body, ending))

    def ending(self, body: RequestBody) -> Ending:
        """The request's end tokens: the model's EOS (unless ignore_eos) and its stop_token_ids."""
        return Ending(self.session.eos_ids, tuple(body.stop_token_ids), body.ignore_eos, body.include_stop_str_in_output)

    def check_model(self, model: str | None) -> None:
        """RequestError (404) unless `model` is None or the served name."""
        if model is not None and model != self.model_name:
            raise RequestError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                               "model", 404)

    def detokenize(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included (`prompt_text`); RequestError names
        `tokens` for an id outside the vocabulary or a model without a tokenizer."""
        self._check_ids(ids, "token ids", "tokens")
        if self.session.codec is None:
            raise RequestError(f"model {self.model_name!r} has no tokenizer", "tokens")
        return self.prompt_text(ids)

    def _check_ids(self, ids: list[int], what: str, param: str) -> None:
        """RequestError naming `param` for an id outside the model's vocabulary."""
        vocab = self.session.target.cfg.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"{what} must be in 0 … {vocab - 1}", param)

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's string in the tokenizer's vocabulary (as vLLM's /tokenize gives it)."""
        tokenizer = self._codec("return_token_strs").tokenizer
        return [tokenizer.id_to_token(i) or "" for i in ids]

    def check(self, body: RequestBody, prompt_ids: list[int], max_tokens: int | None, param: str) -> tuple[str, int]:
        """(policy name, room for output tokens) of a request that fits the model, its context and
        its policies; RequestError names the field that does not (run before a grammar's compile)."""
        self.check_model(body.model)
        engine = self.session.engine
        vocab = self.session.target.cfg.vocab_size
        if not prompt_ids:
            raise RequestError("the prompt is empty", param)
        self._check_ids(prompt_ids, "prompt token ids", param)
        room = engine.max_context - len(prompt_ids)
        if room < 1:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context holds {engine.max_context} "
                               "(prompt plus at least one generated token)", param)
        if max_tokens is not None and max_tokens > room:
            raise RequestError(f"max_tokens ({max_tokens}) + prompt ({len(prompt_ids)} tokens) exceeds the context "
                               f"of {engine.max_context} tokens", "max_tokens")
        budget = room if max_tokens is None else max_tokens  # 0: the prompt only (`Decoding.prompt_only`)
        name = body.policy if body.policy is not None else self.default_policy_name
        try:
            policy = self.policy(name)
        except ValueError as exc:  # make_policy's PolicyError
            raise RequestError(str(exc), "policy") from None
        try:
            engine.check(prompt_ids, policy=policy, max_new_tokens=max(budget, 1))
        except ValueError as exc:  # a speculative policy on a model served without a drafter
            raise RequestError(str(exc), "policy") from None
        if body.stop and self.session.codec is None:
            raise RequestError("stop sequences need a tokenizer", "stop")
        if body.min_tokens > budget:
            raise RequestError(f"min_tokens ({body.min_tokens}) exceeds max_tokens ({budget})", "min_tokens")
        if any(not 0 <= i < vocab for i in body.stop_token_ids):
            raise RequestError(f"stop_token_ids must be token ids in 0 … {vocab - 1}", "stop_token_ids")
        return name, room

    def discard(self, decoding: Decoding) -> None:
        """Count a decoding that will not run (or not run on) as cancelled, behind any round in flight."""
        if not decoding.closed:
            self.executor.submit(decoding.close)

    async def _acquire(self, abandoned: Abandoned | None) -> bool:
        """Wait for the engine in arrival order; False, and out of the queue, once `abandoned()`."""
        waiter = asyncio.ensure_future(self.lock.acquire())
        acquired = False
        try:
            while not waiter.done():
                await asyncio.wait({waiter}, timeout=QUEUE_POLL_S)
                if not waiter.done() and abandoned is not None and await abandoned():
                    return False
            acquired = waiter.result()
            return acquired
        finally:
            if not acquired:  # leaving the queue: a lock granted meanwhile goes to the next waiter
                waiter.cancel()
                waiter.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self.lock.release())

    async def run(self, decoding: Decoding, abandoned: Abandoned | None = None):
        """Async generator of `Delta`s; waits its turn, then runs each round in the worker thread.
        Leaving early (client gone: `abandoned()` or the generator closed) closes the decoding,
        which cancels the remaining rounds and counts the request as cancelled."""
        loop = asyncio.get_running_loop()
        self.metrics.waiting.inc()
        acquired = False
        try:
            acquired = await self._acquire(abandoned)
        finally:
            self.metrics.waiting.dec()
            if not acquired:
                self.discard(decoding)
        if not acquired:
            return
        self.metrics.running.inc()
        try:
            while decoding.finish_reason is None:
                if abandoned is not None and await abandoned():
                    break
                try:
                    await loop.run_in_executor(self.executor, decoding.advance)
                except Exception:
                    decoding.failed = True
                    raise
                delta = decoding.delta()
                if delta.text or delta.logprobs:
                    yield delta
            await loop.run_in_executor(self.executor, decoding.close)
        finally:
            self.metrics.running.dec()
            self.discard(decoding)  # queued behind a round still running, never beside it
            self.lock.release()


def open_service(*, artifact: Path | None = None, model: str | None = None, drafter: str | None = None,
                 policy: str | None = None, device: str = "cpu", dtype: str = "float32", backend: str = "auto",
                 max_context: int = 4096, force: bool = False, model_name: str | None = None,
                 graphs: bool = True, tensor_parallel: bool = False, expert_parallel: bool = False,
                 prepare: tuple[str, ...] = (), tool_call_parser: str = "auto",
                 reasoning_parser: str = "auto", grammar_timeout: float = GRAMMAR_TIMEOUT) -> Service:
    """Check the default policy and the artifact, then load the model and the drafter for `serve`
    (`check_policy`, before any weights load: the default policy needs an artifact when it needs
    parameters; one fitted for another pair is refused unless `force`). Without `policy`: `hybridspec`
    with an artifact, else `default_policy`'s choice. `tensor_parallel`: on one rank of a process
    group (`serve/parallel.py`); `expert_parallel`: its experts split whole across the ranks;
    `prepare`: the flavours whose graphs are captured at start-up besides greedy's (`prepare_flavours`);
    `tool_call_parser`, `reasoning_parser`: how chat outputs are read (`tools.py`, `reasoning.py`);
    `grammar_timeout`: seconds a request's grammar may take to compile."""
    prepare_flavours(prepare)  # a bad item fails before any weights load
    policy = policy or default_policy(artifact)
    params = check_policy(policy, artifact, model, drafter, force=force)
    session = open_session(model, drafter, device=device, dtype=dtype, backend=backend, max_context=max_context,
                           graphs=graphs, tensor_parallel=tensor_parallel, expert_parallel=expert_parallel)
    name = model_name or (model if model is not None else EMBEDDED_NAME)
    return Service(session, params=params, policy=policy, model_name=name, tensor_parallel=tensor_parallel,
                   prepare=prepare, tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                   grammar_timeout=grammar_timeout)
