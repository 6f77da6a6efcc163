"""One generation request end to end, as the `generate` command runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .engine import GenerationResult
from .policies import make_policy, resolve_policy
from .sampling import SamplingParams
from .session import Session, check_tensor_parallel, open_session


POLICY_WITHOUT_ARTIFACT = "static:7"  # fastest artifact-free policy on the embedded pair (bench/results/eval.md)


def default_policy(artifact: Path | None) -> str:
    """The policy `generate` and `serve` use when none is named: `hybridspec` with an artifact,
    else `static:7` (the calibrated policies need one; `static:7` beats `full` and `ar` without)."""
    return "hybridspec" if artifact is not None else POLICY_WITHOUT_ARTIFACT


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
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "auto"
    graphs: bool = True  # False: the resident round without CUDA graphs
    tp: int = 1  # tensor-parallel ranks (spawned, or this process one of torchrun's; `tensor_parallel.launch`)
    expert_parallel: bool = False  # with tp > 1: the experts split whole across the ranks


def _prompt(request: GenerateRequest, session: Session) -> list[int]:
    if (request.prompt is None) == (request.prompt_ids is None):
        raise ValueError("give exactly one of a prompt text or prompt ids")
    if request.prompt_ids is not None:
        try:
            ids = [int(x) for x in request.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"prompt ids must be comma-separated integers, got {request.prompt_ids!r}") from None
        bad = [i for i in ids if not 0 <= i < session.target.cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt ids {bad[:5]} are outside the vocabulary of {session.target.cfg.vocab_size}")
        return ids
    if session.codec is None:
        raise ValueError(f"model {session.model!r} has no tokenizer.json; give prompt ids")
    try:
        request.prompt.encode("utf-8")  # a command-line argument of invalid UTF-8 arrives as lone surrogates
    except UnicodeEncodeError as exc:
        raise ValueError(f"--prompt is not valid UTF-8 text ({exc.reason} at character {exc.start})") from None
    return session.codec.encode(request.prompt)


def run_generate(request: GenerateRequest) -> dict | None:
    """Load, decode, and summarise as the JSON object `generate --json` prints (None on the ranks
    other than 0 under torchrun, `tensor_parallel.launch`)."""
    if not -(2**63) <= request.seed < 2**63:
        raise ValueError(f"--seed must be a 64-bit integer, got {request.seed}")
    sampling = SamplingParams(request.temperature, request.top_k, request.top_p, request.seed)
    if request.tp < 1:
        raise ValueError(f"--tp must be at least 1, got {request.tp}")
    if (request.prompt is None) == (request.prompt_ids is None):  # before any rank is spawned
        raise ValueError("give exactly one of a prompt text or prompt ids")
    if request.tp > 1 or request.expert_parallel:
        from .tensor_parallel import launch

        check_tensor_parallel(request.model, request.tp, request.expert_parallel)
        return launch(_generate, request.tp, request.device, request, sampling, True)
    return _generate(request, sampling, False)


def _generate(request: GenerateRequest, sampling: SamplingParams, tensor_parallel: bool) -> dict:
    name = request.policy or default_policy(request.artifact)
    session = open_session(request.model, request.drafter, need_drafter=name != "ar",
                           device=request.device, dtype=request.dtype, backend=request.backend, seed=request.seed,
                           graphs=request.graphs, tensor_parallel=tensor_parallel,
                           expert_parallel=request.expert_parallel)
    params, _ = resolve_policy(name, request.artifact, session, request.force)
    draft_len = session.drafter.draft_len if session.drafter is not None else 0
    policy = make_policy(name, draft_len, params, device=request.device)
    result = session.engine.generate(_prompt(request, session), policy=policy, max_new_tokens=request.max_new_tokens,
                                     sampling=sampling, eos_ids=session.eos_ids)
    return summarize(result, session, name)


def summarize(result: GenerationResult, session: Session, policy: str) -> dict:
    seconds = result.decode_seconds
    return {
        "model": session.model,
        "random_weights": session.random_weights,
        "policy": policy,
        "token_ids": result.token_ids,
        "text": session.codec.decode(result.token_ids) if session.codec else "",
        "finish_reason": result.finish_reason,
        "rounds": len(result.rounds),
        "acceptance_length": result.acceptance_length,
        "mean_verification_length": result.mean_verification_length,
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": seconds,
        "decode_tokens_per_second": result.decode_tokens / seconds if seconds > 0 else 0.0,
    }
