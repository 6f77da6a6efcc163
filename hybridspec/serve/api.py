"""Request bodies of the OpenAI-compatible API and the fields it refuses.

Every string a client sends must be encodable as UTF-8 (JSON admits lone surrogates such as
`"\\ud800"`, which no tokenizer accepts); `seed` is a signed 64-bit integer, as in vLLM. Values
keep their JSON types, as OpenAI's API holds them (`Strict`): `true` is no count, `"0.5"` no number,
`1.0` no integer, `"yes"` no switch. Chat messages are rendered by the model's own chat template
(`TextCodec.render_chat`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..runtime.grammar import GrammarError, GrammarSpec
from ..runtime.logprobs import MAX_TOP_LOGPROBS
from ..runtime.sampling import SEED_MAX, SEED_MIN



class RequestError(ValueError):
    """A bad request: answered with `status` and an OpenAI error object naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text ({exc.reason} at character {exc.start})") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]
MAX_CHOICES = 16  # the most choices (`n`) one request may ask for
MAX_BATCH = 64  # the most choices of a completion request over all its prompts

# OpenAI and vLLM fields this server does not implement, with the value that means "off": any
# other value is answered 400 naming the field rather than silently ignored.
UNSUPPORTED: dict[str, Any] = {
    "best_of": 1, "echo": False, "top_logprobs": None, "suffix": None, "prompt_logprobs": None, "tools": None,
    "tool_choice": None, "functions": None, "function_call": None,
    "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": None, "prediction": None, "audio": None,
    "add_generation_prompt": True, "continue_final_message": False, "chat_template": None,
}
_OFF_EQUIVALENTS = (None, {}, [], False, "none", "auto")  # also "off" for the fields above


def _off(value: Any, off: Any) -> bool:
    if isinstance(value, bool):  # True == 1 would pass for best_of and repetition_penalty
        return value is off if isinstance(off, bool) else value is False
    return any(value == v for v in (off, *_OFF_EQUIVALENTS))


def refuse_unsupported(body: BaseModel) -> None:
    """RequestError naming the first field of `UNSUPPORTED` that `body` sets to anything but "off"."""
    for name, value in (body.model_extra or {}).items():
        if name in UNSUPPORTED and not _off(value, UNSUPPORTED[name]):
            raise RequestError(f"{name} is not supported by this server", name)


class Strict(BaseModel):
    """A request object (or part of one) whose fields take only their own JSON type: pydantic's lax
    mode would read `true` as 1, `"1"` as 1 and `"yes"` as true, and so decode what the client did
    not mean instead of naming the field (an integer still reads as a number)."""

    model_config = ConfigDict(strict=True)


class Body(Strict):
    """A request object whose fields read an explicit null as their default, as OpenAI's do (clients
    that pass None for an option send it)."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, each chunk's choice's usage so far


class JsonSchemaFormat(Body):
    name: Text = "response"
    description: Text | None = None
    schema_: dict[str, Any] | bool = Field(True, alias="schema")  # absent: any JSON value
    strict: bool | None = None


class ResponseFormat(Strict):
    """OpenAI's `response_format`: text (no constraint), any JSON object, or a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError("json_schema", "type json_schema needs json_schema: {name, schema}")
        return self


class StructuredOutputs(Strict):
    """vLLM's `structured_outputs`: exactly one of its constraints."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | Text | None = Field(None, alias="json")  # a JSON schema (object or its text)
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None  # EBNF
    json_object: bool | None = None


JSON_OBJECT = '{"type": "object"}'  # OpenAI's json_object: any JSON object


class RequestBody(Body):
    """The fields completions and chat completions share. Other fields land in `model_extra`:
    those of `UNSUPPORTED` are refused by `refuse_unsupported`, the rest (such as `user`) ignored."""

    model_config = ConfigDict(extra="allow")
    model: Text | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)  # `runtime/penalties.py`
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0, allow_inf_nan=False)  # vLLM's
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] | None = None  # id → bias
    min_tokens: int = Field(0, ge=0)  # vLLM's: no end token before this many output tokens
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)  # vLLM's
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # choices, decoded one after another (batch size one)
    stream: bool = False
    stream_options: StreamOptions | None = None
    include_stop_str_in_output: bool = False  # vLLM's: the stop sequence that ended the output stays in its text
    stop_token_ids: list[int] = Field(default_factory=list)  # vLLM's: tokens that end the request, as EOS does
    ignore_eos: bool = False  # vLLM's: decode past the model's EOS (to max_tokens or a stop)
    # vLLM's: the tokens the tokenizer marks special are left out of the output text (`Service.hidden_ids`);
    # echo's prompt text and the logprobs' token strings keep them, as vLLM's do
    skip_special_tokens: bool = True
    # vLLM's, taken for its type only: the byte-level tokenizers this server decodes with put no
    # spaces between special tokens either way (vLLM's false changes only tokenizers that do)
    spaces_between_special_tokens: bool = True
    policy: Text | None = None  # extension: one of the engine's policy names
    spec_decode_stats: bool = False  # extension: the round statistics in the response (a list per choice when n > 1)
    # structured output (`runtime/grammar.py`): OpenAI's response_format, vLLM's structured_outputs or
    # its guided_* fields; at most one of them
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None
    guided_grammar: Text | None = None

    def check_fields(self) -> None:
        """RequestError naming a field that only means something beside another one left out."""
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options applies to streamed responses (stream: true)", "stream_options")

    def grammar_spec(self) -> GrammarSpec | None:
        """The request's output constraint, or None; RequestError names the field when two are
        given or one is malformed."""
        given = self._constraints()
        if len(given) > 1:
            raise RequestError(f"give one output constraint, not {' and '.join(n for n, _ in given)}", given[1][0])
        if given and self.ignore_eos:
            raise RequestError("ignore_eos cannot be combined with structured output (the grammar ends the "
                               "output with an end token)", "ignore_eos")
        return given[0][1] if given else None

    def grammar_field(self) -> str | None:
        """The field that gives the request's output constraint."""
        given = self._constraints()
        return given[0][0] if given else None

    def _constraints(self) -> list[tuple[str, GrammarSpec]]:
        given: list[tuple[str, GrammarSpec]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            given.append(("response_format", GrammarSpec("json_schema", JSON_OBJECT)))
        elif fmt is not None and fmt.type == "json_schema":
            given.append(("response_format", _schema_spec(fmt.json_schema.schema_)))
        so = self.structured_outputs
        if so is not None:
            items = [(name, value) for name, value in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                                        ("grammar", so.grammar), ("json_object", so.json_object or None))
                     if value is not None]
            if len(items) != 1:
                raise RequestError("structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                                   "structured_outputs")
            given.append(("structured_outputs", _spec(*items[0])))
        for name, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                           ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                given.append((name, _spec(kind, getattr(self, name), name)))
        return given

    def logprob_count(self) -> int | None:
        """The alternatives per output token of the logprobs asked for; None: no logprobs."""
        return None

    def prompt_logprob_count(self) -> int | None:
        """The alternatives per prompt token of the prompt logprobs asked for; None: none."""
        return None

    def logit_bias_pairs(self, vocab: int) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs, each id checked against the vocabulary."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not re.fullmatch(r"\s*-?[0-9]+\s*", key) or not 0 <= int(key) < vocab:
                raise RequestError(f"logit_bias keys must be token ids in 0 … {vocab - 1}, got {key!r}", "logit_bias")
            pairs.append((int(key), bias))
        return tuple(pairs)

    @field_validator("guided_json", "guided_regex", "guided_choice", "guided_grammar", mode="before")
    @classmethod
    def _guided_off(cls, value):
        return None if value in ({}, [], "") else value  # clients send empty values for "off"

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops


def _schema_spec(schema: dict | bool | str, field: str = "response_format") -> GrammarSpec:
    if schema is True:
        return GrammarSpec("json")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise RequestError(f"the JSON schema is not JSON: {exc}", field) from None
    if not isinstance(schema, dict):
        raise RequestError("the JSON schema must be an object", field)
    return GrammarSpec("json_schema", json.dumps(schema))


def _spec(kind: str, value, field: str = "structured_outputs") -> GrammarSpec:
    """One constraint of `structured_outputs` or a guided_* field as a GrammarSpec."""
    try:
        if kind == "json":
            return _schema_spec(value, field)
        if kind == "json_object":
            return GrammarSpec("json_schema", JSON_OBJECT)
        if kind == "choice":
            return GrammarSpec.choice(value)
        return GrammarSpec("regex" if kind == "regex" else "ebnf", value)
    except GrammarError as exc:
        raise RequestError(str(exc), field) from None


class CompletionRequest(RequestBody):
    prompt: Text | list[int] | list[Text] | list[list[int]]  # one prompt, or a batch (`prompts`)
    max_tokens: int | None = Field(None, ge=0)  # 0 with echo: the prompt (and its logprobs) only, as OpenAI's
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)  # alternatives per token (0: none)
    echo: bool = False  # the prompt's text before the completion's, and with logprobs the prompt's logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_form(cls, prompt):
        def ids(value) -> bool:
            return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)

        if isinstance(prompt, str) or ids(prompt) or (isinstance(prompt, list) and (
                all(isinstance(p, str) for p in prompt) or all(ids(p) for p in prompt))):
            return prompt
        raise PydanticCustomError("prompt", "must be a string, token ids (integers), a list of strings or a list of "
                                  "token-id lists")

    def check_fields(self) -> None:
        super().check_fields()
        if self.max_tokens == 0 and not self.echo:
            raise RequestError("max_tokens 0 asks for no completion: it needs echo: true (the prompt and, with "
                               "logprobs, its logprobs)", "max_tokens")

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, each a text or token ids: one, or a batch whose choices are numbered
        prompt by prompt (prompt p's choice j is choice p·n + j, as vLLM numbers them) and decoded one
        after another. RequestError past `MAX_BATCH` choices in all."""
        prompt = self.prompt
        prompts = [prompt] if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int) else list(prompt)
        if len(prompts) * self.n > MAX_BATCH:
            raise RequestError(f"{len(prompts)} prompts × n = {self.n} is {len(prompts) * self.n} choices; "
                               f"at most {MAX_BATCH} in one request", "prompt")
        return prompts

    def logprob_count(self) -> int | None:
        return self.logprobs

    def prompt_logprob_count(self) -> int | None:
        return self.logprobs if self.echo else None


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class ToolFunction(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule: a call's name must survive its JSON
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema, rendered by the chat template


class Tool(Strict):
    type: Literal["function"]
    function: ToolFunction


class CalledFunction(Strict):
    name: Text
    arguments: Text  # JSON, as OpenAI sends it back


class ToolCall(Strict):
    id: Text | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None  # None only beside an assistant's tool_calls
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # a tool's answer: to which call

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content):
        if isinstance(content, list):
            kinds = sorted({str(part.get("type")) for part in content if isinstance(part, dict)} - {"text"})
            if kinds:
                raise PydanticCustomError("content", "content parts of type {kinds} are not supported: this model "
                                          "reads text", {"kinds": ", ".join(kinds)})
        return content

    @model_validator(mode="after")
    def _content(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("content", "content is required (null only for an assistant message with tool_calls)")
        return self

    def for_template(self) -> dict:
        """The message as chat templates read it: an assistant's call arguments as objects (Qwen's
        templates write them with `tojson`), None fields left out."""
        message = self.model_dump(exclude_none=True)
        for call in message.get("tool_calls", []):
            try:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            except json.JSONDecodeError:
                pass  # a template that wants a string gets it as sent
        return message


class NamedFunction(Strict):
    name: Text


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


RESERVED_TEMPLATE_VARIABLES = {"messages", "tools", "documents", "chat_template", "add_generation_prompt",
                               "continue_final_message", "tokenize", "return_dict", "return_assistant_tokens_mask"}


def _template_variables(variables: dict[str, Any] | None) -> dict[str, Any] | None:
    """`chat_template_kwargs` as given; ValueError where it sets a name that the server itself passes
    to the template (the chat endpoint and /tokenize alike)."""
    if reserved := sorted(set(variables or {}) & RESERVED_TEMPLATE_VARIABLES):
        raise ValueError(f"{', '.join(reserved)} cannot be set through chat_template_kwargs")
    return variables


class ChatRequest(RequestBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    tools: list[Tool] | None = None  # rendered by the chat template; calls parsed from the output (`tools.py`)
    # "required": at least one call; a named function: a call of it (both held to the tools' schemas by a grammar)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # false: at most one call (the first; a forced call's grammar allows one)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra template variables (enable_thinking, …)

    _check_template_variables = field_validator("chat_template_kwargs")(_template_variables)

    def check_fields(self) -> None:
        super().check_fields()
        if self.tool_choice not in (None, "none") and self.tools is None:
            raise RequestError("tool_choice needs tools", "tool_choice")

    def calls_tools(self) -> bool:
        """Whether the output is parsed for tool calls: tools given and tool_choice not "none"."""
        return bool(self.tools) and self.tool_choice != "none"

    def forced_calls(self) -> bool:
        """Whether tool_choice requires calls (`required`, or a named function)."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def tool_grammar(self, fmt: str, reasoning: str) -> GrammarSpec | None:
        """The grammar of the calls tool_choice requires (`GrammarSpec.tool_calls`), or None;
        RequestError names the field when there are no tools, the named function is not one of
        them, or another output constraint is given too."""
        if not self.forced_calls():
            return None
        if not self.tools:
            raise RequestError("tool_choice requires calls but tools is empty", "tool_choice")
        names = [t.function.name for t in self.tools]
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise RequestError(f"tool_choice names {self.tool_choice.function.name!r}, which is not one of the "
                               f"tools ({', '.join(names)})", "tool_choice")
        if self.grammar_field() is not None:
            raise RequestError(f"tool_choice requires calls: {self.grammar_field()} cannot be given too", "tool_choice")
        if self.ignore_eos:
            raise RequestError("ignore_eos cannot be combined with a tool_choice that requires calls", "ignore_eos")
        choice = self.tool_choice if self.tool_choice == "required" else self.tool_choice.model_dump()
        tools = [t.model_dump(exclude_none=True) for t in self.tools]
        try:
            return GrammarSpec.tool_calls(fmt, tools, choice, reasoning, parallel=self.parallel_tool_calls)
        except GrammarError as exc:
            raise RequestError(str(exc), "tools") from None

    def logprob_count(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(Body):
    """vLLM's /tokenize: a prompt, or chat messages (with tools and template variables), to the token
    ids this server's completions or chat endpoint would decode from (no special tokens added,
    whatever `add_special_tokens` says, as those endpoints do; Qwen's tokenizers add none)."""

    model_config = ConfigDict(extra="allow")
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False  # each id's vocabulary string beside it

    _check_template_variables = field_validator("chat_template_kwargs")(_template_variables)

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages):
        if messages is not None and not messages:
            raise ValueError("messages must not be empty")
        return messages

    def check_input(self) -> None:
        """RequestError naming the field unless exactly one of prompt and messages is given, and
        tools and template variables only beside messages."""
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("give either prompt or messages", "prompt")
        for name in ("tools", "chat_template_kwargs"):
            if self.prompt is not None and getattr(self, name) is not None:
                raise RequestError(f"{name} applies to messages, not to a prompt", name)


class DetokenizeRequest(Strict):
    """vLLM's /detokenize: token ids to their text (special tokens included, as `echo` writes them)."""

    model_config = ConfigDict(extra="allow")
    model: Text | None = None
    tokens: list[Annotated[int, Field(strict=True)]]
