"""One generation request end to end, as the `generate` command runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.params import PolicyParameters
from .config import ConfigError
from .ending import Ending, StopSequences, output_text
from .engine import GenerationResult
from .grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from .loading import RANDOM_BLOCK_SIZE, drafter_config, target_config
from .logprobs import finite
from .policies import make_policy, resolve_policy
from .presets import PRESETS
from .sampling import SamplingParams
from .session import Session, check_tensor_parallel, model_identity, open_session, resolve_pair


POLICY_WITHOUT_ARTIFACT = "static:7"  # the default without an artifact (why this one: bench/results/eval.md)


def default_policy(artifact: Path | None) -> str:
    """The policy `generate` and `serve` use when none is named: `hybridspec` with an artifact,
    else `static:7` (the calibrated policies need one)."""
    return "hybridspec" if artifact is not None else POLICY_WITHOUT_ARTIFACT


@dataclass(frozen=True)
class ModelIds:
    """The content ids of a model pair, computed without loading it (`resolve_policy`'s `ModelPair`)."""

    model_id: str
    drafter_id: str | None


def check_policy(name: str, artifact: Path | None, model: str | None, drafter: str | None, *,
                 need_drafter: bool = True, seed: int = 0, force: bool = False) -> PolicyParameters | None:
    """The parameters policy `name` decodes with, every check done before any weights load: the
    target's config, the drafter's config (a reference that is no drafter named before its files
    are read), the pair's content ids (`model_identity`, as `open_session` computes them for the
    same arguments), the artifact (`resolve_policy`: needed, valid, fitted for this pair unless
    `force`), then the name and length against the drafter's D read from its config (`make_policy`).
    ConfigError, PolicyError, ArtifactError (all ValueError)."""
    model, drafter = resolve_pair(model, drafter)
    target_config(model)  # neither a model directory, a preset nor a cached repo id: named here
    if need_drafter and drafter is None and model not in PRESETS:
        raise ConfigError(f"a speculative policy needs --drafter (a DFlash directory) for {model}")
    drafter = drafter if need_drafter else None
    dcfg = drafter_config(drafter) if drafter not in (None, "random") else None  # a bad reference named first
    ids = ModelIds(*model_identity(model, drafter, seed=seed, with_drafter=need_drafter))
    params, _ = resolve_policy(name, artifact, ids, force)
    if not need_drafter:
        draft_len = 0
    else:
        draft_len = RANDOM_BLOCK_SIZE - 1 if dcfg is None else dcfg.draft_len
    make_policy(name, draft_len, params)
    return params


@dataclass(frozen=True)
class GenerateRequest:
    model: str | None = None
    drafter: str | None = None
    prompt: str | None = None
    prompt_ids: str | None = None  # "1,2,3"
    policy: str | None = None  # None: default_policy(artifact)
    artifact: Path | None = None
    force: bool = False  # use an artifact fitted for another model/drafter
    max_new_tokens: int = 64
    max_context: int = 4096  # prompt + generated tokens the cache holds
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "auto"
    graphs: bool = True  # False: the resident round without CUDA graphs
    tp: int = 1  # tensor-parallel ranks (spawned, or this process one of torchrun's; `tensor_parallel.launch`)
    expert_parallel: bool = False  # with tp > 1: the experts split whole across the ranks
    logprobs: int | None = None  # each token's log-probability and this many alternatives (`logprobs.py`)
    presence_penalty: float = 0.0  # `penalties.py`
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [−100, 100]) pairs
    min_tokens: int = 0  # no end token and no stop sequence before this many output tokens
    min_p: float = 0.0  # sampled requests: tokens below min_p × the most likely one's probability are cut
    stop: tuple[str, ...] = ()  # stop sequences: the output ends before the first (`ending.StopSequences`)
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the output, as EOS does
    ignore_eos: bool = False  # decode past the model's EOS (to max_new_tokens, a stop sequence or stop token)
    include_stop: bool = False  # the stop sequence or end token that ends the output stays in its text
    skip_special_tokens: bool = True  # the tokenizer's special tokens are left out of the text, as vLLM's default
    grammar: GrammarSpec | None = None  # what the output must match (`grammar.py`)


def _prompt_ids(request: GenerateRequest) -> list[int] | None:
    """The prompt given as ids ("1,2,3"), or None for a text prompt."""
    if request.prompt_ids is None:
        return None
    try:
        return [int(x) for x in request.prompt_ids.split(",")]
    except ValueError:
        raise ValueError(f"prompt ids must be comma-separated integers, got {request.prompt_ids!r}") from None


def _prompt(request: GenerateRequest, session: Session) -> list[int]:
    if (request.prompt is None) == (request.prompt_ids is None):
        raise ValueError("give exactly one of a prompt text or prompt ids")
    ids = _prompt_ids(request)
    if ids is not None:
        return ids
    if session.codec is None:
        raise ValueError(f"model {session.model!r} has no tokenizer.json; give prompt ids")
    try:
        request.prompt.encode("utf-8")  # a command-line argument of invalid UTF-8 arrives as lone surrogates
    except UnicodeEncodeError as exc:
        raise ValueError(f"--prompt is not valid UTF-8 text ({exc.reason} at character {exc.start})") from None
    return session.codec.encode(request.prompt)


def run_generate(request: GenerateRequest) -> dict | None:
    """Check, load, decode, and summarise as the JSON object `generate --json` prints (None on the
    ranks other than 0 under torchrun, `tensor_parallel.launch`). The policy and the artifact are
    checked before any rank starts or any weights load (`check_policy`)."""
    top_k = 0 if request.top_k == -1 else request.top_k  # vLLM's −1: off
    sampling = SamplingParams(request.temperature, top_k, request.top_p, request.seed, request.presence_penalty,
                              request.frequency_penalty, request.repetition_penalty, request.logit_bias,
                              request.min_tokens, request.min_p)
    if request.tp < 1:
        raise ValueError(f"--tp must be at least 1, got {request.tp}")
    if (request.prompt is None) == (request.prompt_ids is None):  # before any rank is spawned
        raise ValueError("give exactly one of a prompt text or prompt ids")
    _check_ending(request)
    name = request.policy or default_policy(request.artifact)
    params = check_policy(name, request.artifact, request.model, request.drafter, need_drafter=name != "ar",
                          seed=request.seed, force=request.force)
    _check_vocabulary(request, target_config(resolve_pair(request.model, request.drafter)[0]).vocab_size)
    if request.tp > 1 or request.expert_parallel:
        from .tensor_parallel import launch

        check_tensor_parallel(request.model, request.tp, request.expert_parallel)
        return launch(_generate, request.tp, request.device, request, sampling, name, params, True)
    return _generate(request, sampling, name, params, False)


def _check_vocabulary(request: GenerateRequest, vocab: int) -> None:
    """The token ids the options name, against the target's vocabulary before any weights load
    (ValueError naming the option; `Engine.check` checks prompt and bias ids again for the library's
    other callers)."""
    given = {"--prompt-ids": _prompt_ids(request) or [], "--logit-bias": [i for i, _ in request.logit_bias],
             "--stop-token-id": request.stop_token_ids}
    for option, ids in given.items():
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"{option} {bad[0]} is outside the vocabulary of {vocab} (ids 0 … {vocab - 1})")


def _check_ending(request: GenerateRequest) -> None:
    """The request's stop sequences, min_tokens and ignore_eos, as far as they are checked before
    the model loads (ValueError naming the option)."""
    if any(not s for s in request.stop):
        raise ValueError("--stop: stop sequences must be non-empty")
    if request.min_tokens > request.max_new_tokens:
        raise ValueError(f"--min-tokens ({request.min_tokens}) exceeds --max-new-tokens ({request.max_new_tokens})")
    if request.ignore_eos and request.grammar is not None:
        raise ValueError("--ignore-eos cannot be combined with an output constraint (the grammar ends the output "
                         "with an end token)")


def _generate(request: GenerateRequest, sampling: SamplingParams, name: str, params: PolicyParameters | None,
              tensor_parallel: bool) -> dict:
    """Load the pair and decode with policy `name` and its `params` (`check_policy`'s)."""
    session = open_session(request.model, request.drafter, need_drafter=name != "ar",
                           device=request.device, dtype=request.dtype, backend=request.backend, seed=request.seed,
                           graphs=request.graphs, tensor_parallel=tensor_parallel,
                           expert_parallel=request.expert_parallel, max_context=request.max_context)
    draft_len = session.drafter.draft_len if session.drafter is not None else 0
    policy = make_policy(name, draft_len, params, device=request.device)
    ending = _ending(request, session)
    hidden = ending.hidden(session.codec.special_ids if session.codec and request.skip_special_tokens else frozenset())
    text_of = (lambda ids: output_text(session.codec.decode, ids, hidden)) if session.codec else (lambda ids: "")
    stops = _stop_sequences(request, session, text_of)
    grammar = _grammar(request.grammar, session, ending.end_ids)
    result = session.engine.generate(_prompt(request, session), policy=policy, max_new_tokens=request.max_new_tokens,
                                     sampling=sampling, eos_ids=ending.end_ids, logprobs=request.logprobs,
                                     grammar=grammar, stop=stops.length if stops is not None else None)
    if result.finish_reason == "stop":
        text, stop_reason = stops.cut(result.token_ids)
        text = text + stop_reason if ending.include_stop else text
    else:
        text = text_of(result.token_ids)
        stop_reason = ending.stop_reason(result.token_ids[-1]) if result.finish_reason == "eos" else None
    return summarize(result, session, name, text=text, stop_reason=stop_reason)


def _ending(request: GenerateRequest, session: Session) -> Ending:
    """The request's end tokens (their ids checked by `_check_vocabulary`)."""
    return Ending(session.eos_ids, request.stop_token_ids, request.ignore_eos, request.include_stop)


def _stop_sequences(request: GenerateRequest, session: Session,
                    text_of: Callable[[list[int]], str]) -> StopSequences | None:
    """The request's stop sequences over its output's text (`text_of`), or None without any."""
    if not request.stop:
        return None
    if session.codec is None:
        raise ValueError(f"model {session.model!r} has no tokenizer.json: stop sequences (--stop) need one")
    return StopSequences(request.stop, text_of, request.min_tokens)


def _grammar(spec: GrammarSpec | None, session: Session, end_ids: tuple[int, ...]) -> GrammarState | None:
    """The request's grammar compiled against the model's tokenizer, ending with one of `end_ids`
    (GrammarError: why not)."""
    if spec is None:
        return None
    if session.codec is None:
        raise GrammarError(f"model {session.model!r} has no tokenizer.json: structured output needs one")
    compiled = GrammarCompiler(session.codec.tokenizer, session.target.cfg.vocab_size, session.eos_ids).compile(spec)
    return GrammarState(compiled, end_ids, session.target.cfg.vocab_size)


def summarize(result: GenerationResult, session: Session, policy: str, *, text: str,
              stop_reason: str | int | None) -> dict:
    """`generate --json`'s object. `text`: the output's (`ending.output_text`, cut before a stop
    sequence that ended it); `stop_reason`: vLLM's, the stop sequence or stop token id that ended it."""
    seconds = result.decode_seconds
    return {
        "model": session.model,
        "random_weights": session.random_weights,
        "policy": policy,
        "token_ids": result.token_ids,
        "text": text,
        "finish_reason": result.finish_reason,
        "stop_reason": stop_reason,
        "rounds": len(result.rounds),
        "acceptance_length": result.acceptance_length,
        "mean_verification_length": result.mean_verification_length,
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": seconds,
        "decode_tokens_per_second": result.decode_tokens / seconds if seconds > 0 else 0.0,
    } | ({"logprobs": _logprobs(result, session)} if result.logprobs is not None else {})


def _logprobs(result: GenerationResult, session: Session) -> list[dict]:
    """Per generated token: its id, text, log-probability and alternatives [[id, logprob], …]."""
    lps, codec = result.logprobs, session.codec
    return [{"id": token, "text": codec.decode([token]) if codec else "", "logprob": finite(lps.chosen[i]),
             "top": [[t, finite(v)] for t, v in lps.top[i]]} for i, token in enumerate(result.token_ids)]
