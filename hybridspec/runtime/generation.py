"""One generation request end to end, as the `generate` command runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..artifacts.artifact import check_identity, load_artifact
from .engine import GenerationResult
from .policies import NEEDS_PARAMETERS, PolicyError, make_policy
from .sampling import SamplingParams
from .session import Session, open_session


@dataclass(frozen=True)
class GenerateRequest:
    model: str | None = None
    drafter: str | None = None
    prompt: str | None = None
    prompt_ids: str | None = None  # "1,2,3"
    policy: str = "hybridspec"
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
    return session.codec.encode(request.prompt)


def demo_prompt() -> tuple[str | None, str | None]:
    """(text, ids) of the demo: a test prompt of the embedded set, or ids for the random fallback."""
    from ..workbench.prompts import load_prompts
    from .session import EMBEDDED, default_model

    if default_model()[1] is None:
        return None, "1,2,3,4,5,6,7,8"
    prompts = load_prompts(EMBEDDED / "prompts.jsonl", split="test")
    return next(p.text for p in prompts if p.category == "test"), None


def run_generate(request: GenerateRequest) -> dict:
    """Load, decode, and summarise as the JSON object `generate --json` prints."""
    if request.policy in NEEDS_PARAMETERS and request.artifact is None:
        raise PolicyError(f"policy {request.policy!r} needs --artifact (the output of `hybridspec fit`)")
    sampling = SamplingParams(request.temperature, request.top_k, request.top_p, request.seed)
    params, meta = load_artifact(request.artifact) if request.artifact is not None else (None, None)
    session = open_session(request.model, request.drafter, need_drafter=request.policy != "ar",
                           device=request.device, dtype=request.dtype, backend=request.backend, seed=request.seed)
    if meta is not None and request.policy != "ar":
        check_identity(meta, model_id=session.model_id, drafter_id=session.drafter_id, force=request.force,
                       source=str(request.artifact))
    draft_len = session.drafter.draft_len if session.drafter is not None else 0
    policy = make_policy(request.policy, draft_len, params, device=request.device)
    result = session.engine.generate(_prompt(request, session), policy=policy, max_new_tokens=request.max_new_tokens,
                                     sampling=sampling, eos_ids=session.eos_ids)
    return summarize(result, session, request.policy)


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
