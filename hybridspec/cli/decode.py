"""Commands that decode: generate, serve, demo, train-embedded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from .common import (ArtifactOpt, BackendOpt, DeviceOpt, DrafterOpt, DtypeOpt, ExpertParallelOpt, GraphsOpt, ModelOpt,
                     PolicyOpt, TensorParallelOpt, _fail, app, check_device, console, err_console, missing_extra)

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # runtime.sampling's (not imported: --help loads no torch)
LogLevel = Literal["debug", "info", "warning", "error"]


def _warn_poor_fit(artifact: Path | None) -> None:
    """A warning line per fit-quality check the artifact fails (as `inspect` runs them, under the
    thresholds it was fitted with): one written with --allow-poor-fit, or edited since, decodes with
    parameters its own checks reject. An artifact that does not load is left to the command's own
    checks, which name what is wrong."""
    if artifact is None:
        return
    from ..artifacts.artifact import ArtifactError, load_artifact
    from ..fitters.checks import checks_from_artifact, failed

    try:
        params, meta = load_artifact(artifact)
    except (ArtifactError, ValueError):
        return
    try:
        checks = checks_from_artifact(params, meta)
    except ValueError as exc:  # a limit the artifact records, outside its range
        err_console.print(f"warning: {artifact}: its fit-quality checks cannot run: {exc}", highlight=False,
                          markup=False, soft_wrap=True)
        return
    for check in failed(checks):
        err_console.print(f"warning: {artifact} fails a fit-quality check (`hybridspec inspect`): {check.line()}",
                          highlight=False, markup=False, soft_wrap=True)


def _policy_note(policy: str | None, artifact: Path | None) -> str:
    """The policy a command runs, and why when it was not named (printed to stderr)."""
    from ..runtime.generation import default_policy

    if policy is not None:
        policy = "".join(policy.split())  # `static: 4` is static:4
        if not policy:
            _fail("--policy is empty (a policy name: ar, full, static:N, hybridspec, …)")
    chosen = policy or default_policy(artifact)
    if policy is None and artifact is None:
        err_console.print(f"policy {chosen} (no --artifact: the calibrated policies hybridspec, nominal and ratio "
                          "need one)", highlight=False)
    return chosen


@app.command()
def generate(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="Prompt text.")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Prompt token ids, comma-separated.")] = None,
    policy: PolicyOpt = None,
    artifact: ArtifactOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
    max_context: Annotated[int, typer.Option("--max-context", min=2, help="Prompt + generated tokens (at most the model's max_position_embeddings).")] = 4096,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=-1, help="0 or -1: off.")] = 0,
    min_p: Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Sampled requests: cut the tokens less likely than this fraction of the most likely one.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", min=SEED_MIN, max=SEED_MAX, help="A 64-bit integer.")] = 0,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", min=-2.0, max=2.0)] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", min=-2.0, max=2.0)] = 0.0,
    repetition_penalty: Annotated[float, typer.Option("--repetition-penalty", max=2.0, help="In (0, 2]; 1 is off.")] = 1.0,
    logit_bias: Annotated[Optional[list[str]], typer.Option(
        "--logit-bias", metavar="ID=BIAS", help="Add BIAS (-100 … 100) to token ID's logit (repeat the option for each token).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", help="End the output before this text, which is left out unless --include-stop (repeat the option for each).")] = None,
    stop_token_ids: Annotated[Optional[list[int]], typer.Option(
        "--stop-token-id", help="End the output at this token, as EOS does (repeat the option for each).")] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Decode past the model's EOS (to --max-new-tokens, a --stop or a --stop-token-id).")] = False,
    min_tokens: Annotated[int, typer.Option("--min-tokens", min=0, help="No end token before this many output tokens, and no --stop that ends in their text.")] = 0,
    include_stop: Annotated[bool, typer.Option("--include-stop", help="Keep the --stop text or the end token that ended the output in its text (vLLM's include_stop_str_in_output).")] = False,
    keep_special_tokens: Annotated[bool, typer.Option("--keep-special-tokens", help="Keep the tokenizer's special tokens in the text (by default left out, as vLLM's skip_special_tokens does).")] = False,
    logprobs: Annotated[Optional[int], typer.Option(
        "--logprobs", min=0, max=20, help="Print each token's log-probability and this many alternatives.")] = None,
    json_schema: Annotated[Optional[Path], typer.Option(
        "--json-schema", help="Hold the output to this JSON schema file ('{}': any JSON object).")] = None,
    regex: Annotated[Optional[str], typer.Option("--regex", help="Hold the output to this regular expression.")] = None,
    choice: Annotated[Optional[list[str]], typer.Option(
        "--choice", help="Hold the output to one of these strings (repeat the option for each).")] = None,
    grammar: Annotated[Optional[Path], typer.Option(
        "--grammar", help="Hold the output to the EBNF grammar in this file (root rule `root`).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    graphs: GraphsOpt = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
    tp: TensorParallelOpt = 1,
    expert_parallel: ExpertParallelOpt = False,
) -> None:
    """Generate from one prompt with a length policy and print the tokens and round statistics."""
    from ..runtime.generation import GenerateRequest, run_generate

    biases = _logit_bias(logit_bias)
    policy = _policy_note(policy, artifact)
    _warn_poor_fit(artifact)
    spec = _grammar_spec(json_schema, regex, choice, grammar)
    request = GenerateRequest(model=model, drafter=drafter, prompt=prompt, prompt_ids=prompt_ids, policy=policy,
                              artifact=artifact, max_new_tokens=max_new_tokens, max_context=max_context,
                              temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed, device=device, dtype=dtype, backend=backend, graphs=graphs,
                              force=force, tp=tp, expert_parallel=expert_parallel, logprobs=logprobs,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              repetition_penalty=repetition_penalty, logit_bias=biases,
                              min_tokens=min_tokens, min_p=min_p, stop=tuple(stop or ()),
                              stop_token_ids=tuple(stop_token_ids or ()), ignore_eos=ignore_eos,
                              include_stop=include_stop, skip_special_tokens=not keep_special_tokens, grammar=spec)
    try:
        summary = run_generate(request)
    except ValueError as exc:  # ConfigError, PolicyError, ArtifactError, bad sampling values
        _fail(str(exc))
    if summary is None:  # a rank other than 0 under torchrun: rank 0 prints
        return
    if as_json:
        print(json.dumps(summary))
        return
    _print_summary(summary)


def _logit_bias(items: list[str] | None) -> tuple[tuple[int, float], ...]:
    """--logit-bias ID=BIAS items as (token id, bias) pairs, a later item for one id replacing an
    earlier one (exits naming a malformed item; the ids are checked against the vocabulary once the
    model loads, by `Engine.check`)."""
    biases: dict[int, float] = {}
    for item in items or ():
        token, _, bias = item.partition("=")
        try:
            token_id, value = int(token), float(bias)
        except ValueError:
            _fail(f"--logit-bias {item!r}: not ID=BIAS (a token id and a bias in [-100, 100], such as 42=-100)")
        if not (math.isfinite(value) and -100 <= value <= 100):
            _fail(f"--logit-bias {item!r}: the bias must be a finite number in [-100, 100]")
        biases[token_id] = value
    return tuple(biases.items())


def _grammar_spec(json_schema: Path | None, regex: str | None, choice: list[str] | None, grammar: Path | None):
    """The one output constraint the options give, or None (exits naming a bad option or file)."""
    from ..runtime.grammar import GrammarError, GrammarSpec

    given = [name for name, value in (("--json-schema", json_schema), ("--regex", regex), ("--choice", choice),
                                      ("--grammar", grammar)) if value]
    if len(given) > 1:
        _fail(f"give one output constraint, not {' and '.join(given)}")
    try:
        if json_schema is not None:
            text = _read(json_schema, "--json-schema")
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as exc:
                _fail(f"--json-schema {json_schema}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})")
            return GrammarSpec("json_schema", json.dumps(schema if schema != {} else {"type": "object"}))
        if regex is not None:
            return GrammarSpec("regex", regex)
        if choice:
            return GrammarSpec.choice(choice)
        if grammar is not None:
            return GrammarSpec("ebnf", _read(grammar, "--grammar"))
    except GrammarError as exc:
        _fail(str(exc))
    return None


def _read(path: Path, option: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"{option} {path}: {exc.strerror if isinstance(exc, OSError) else 'not UTF-8 text'}")


def _print_summary(summary: dict) -> None:
    if summary["random_weights"]:
        console.print(f"[yellow]model {summary['model']!r} has random weights: tokens are meaningless, "
                      "acceptance is near zero[/]")
    console.print(f"[bold]tokens[/] {summary['token_ids']}")
    if summary["text"]:
        console.print(f"[bold]text[/] {summary['text']}")
    table = Table("policy", "tokens", "rounds", "AL", "mean w", "decode s", "tok/s", title="generation")
    table.add_row(summary["policy"], str(len(summary["token_ids"])), str(summary["rounds"]),
                  f"{summary['acceptance_length']:.2f}", f"{summary['mean_verification_length']:.2f}",
                  f"{summary['decode_seconds']:.3f}", f"{summary['decode_tokens_per_second']:.1f}")
    console.print(table)
    if "logprobs" in summary:
        lps = Table("token", "id", "logprob", "alternatives (id: logprob)", title="logprobs")
        for entry in summary["logprobs"]:
            top = "  ".join(f"{i}: {v:.3f}" for i, v in entry["top"])
            lps.add_row(repr(entry["text"]), str(entry["id"]), f"{entry['logprob']:.4f}", top)
        console.print(lps)


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Folder for the store, the artifact, the server log and the report.")] = Path("demo"),
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Of the one served request.")] = 48,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads of torch in every step and the server (default: OMP_NUM_THREADS, else 1).")] = None,
) -> None:
    """The whole workflow on the embedded default: capture (quick) → fit → eval → serve + one request → report."""
    import os

    import torch

    try:
        from ..demo import DemoConfig, run_demo_workflow
    except ModuleNotFoundError as exc:
        _fail(missing_extra(exc) or str(exc))

    # one thread unless told otherwise: on small CPUs a thread team that waits for a descheduled
    # member stalls rounds of the fixed pass, and calibration and eval must share the thread count
    count = threads or int(os.environ.get("OMP_NUM_THREADS") or 1)
    os.environ["OMP_NUM_THREADS"] = str(count)  # the server process inherits it
    torch.set_num_threads(count)
    console.print(f"torch CPU threads: {count} (--threads or OMP_NUM_THREADS to change)")
    try:
        run_demo_workflow(DemoConfig(out=out, max_new_tokens=max_new_tokens), console)
    except (ValueError, RuntimeError) as exc:  # config, store, fit, artifact and server errors name what failed
        _fail(str(exc))


@app.command()
def serve(
    artifact: ArtifactOpt = None,
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    host: Annotated[str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes the server).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 30000,
    policy: PolicyOpt = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="HYBRIDSPEC_API_KEY", show_envvar=True, help="Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize (the environment variable keeps it out of `ps`).")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option("--api-key-file", help="Read the API key from this file (its first line).")] = None,
    max_request_bytes: Annotated[int, typer.Option("--max-request-bytes", min=1, help="Larger request bodies are answered 413 before they are parsed.")] = 1 << 20,
    allowed_origins: Annotated[Optional[list[str]], typer.Option("--allowed-origin", help="Let web pages of this origin call the server from a browser (CORS; repeat for several; * for any). Default: none.")] = None,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="info writes one access-log line per request (stderr).")] = "info",
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="The `model` clients send (default: --model, or hybridspec-embedded).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    graphs: GraphsOpt = True,
    max_context: Annotated[int, typer.Option("--max-context", min=2, help="Prompt + generated tokens per request (at most the model's max_position_embeddings).")] = 4096,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
    tp: TensorParallelOpt = 1,
    expert_parallel: ExpertParallelOpt = False,
    prepare: Annotated[str, typer.Option("--prepare", help="Also capture these flavours' graphs at start-up, comma-separated: greedy, sample, top-k or filter, each with any of +logprobs, +penalties, +grammar (default: greedy only; others are captured by their first request).")] = "",
    tool_call_parser: Annotated[Literal["auto", "hermes", "qwen3_xml"], typer.Option("--tool-call-parser", help="The format of the tool calls in the model's text: hermes (Qwen3, Qwen3-Next), qwen3_xml (Qwen3.5, Qwen3.6), or auto (qwen3_xml where the chat template shows <function=…> blocks).")] = "auto",
    grammar_timeout: Annotated[float, typer.Option("--grammar-timeout", min=0.001, help="Seconds a request's structured-output grammar (or forced tool calls' grammar) may take to compile before the request is refused (400).")] = 30.0,
    reasoning_parser: Annotated[Literal["auto", "none", "qwen3"], typer.Option("--reasoning-parser", help="qwen3: a chat output's <think> block comes back as reasoning_content; auto: where the chat template writes </think>.")] = "auto",
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (completions, chat, models, tokenize, detokenize,
    health, version, metrics)."""
    try:
        from ..serve.app import listen
        from ..serve.app import serve as run_server
        from ..serve.service import open_service
    except ModuleNotFoundError as exc:
        _fail(missing_extra(exc) or str(exc))
    if api_key_file is not None:
        try:
            api_key = api_key_file.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError) as exc:
            _fail(f"--api-key-file {api_key_file}: cannot read a key ({type(exc).__name__}: {exc})")
    parallel = tp > 1 or expert_parallel
    try:  # the address before the weights: a port in use is named now, not after the model loads
        sock = listen(host, port)
    except OSError as exc:
        _fail(f"--port {port}: {exc.strerror}")
    policy = _policy_note(policy, artifact)
    _warn_poor_fit(artifact)
    flavours = tuple(p for p in prepare.split(",") if p.strip())
    try:
        from ..serve.service import prepare_flavours

        prepare_flavours(flavours)
    except ValueError as exc:
        _fail(str(exc))
    if flavours and parallel:
        err_console.print("--prepare has no effect under --tp: a tensor-parallel group captures in each flavour's "
                          "first request, which every rank runs")
    options = dict(artifact=artifact, model=model, drafter=drafter, policy=policy, device=device, dtype=dtype,
                   backend=backend, max_context=max_context, force=force, graphs=graphs, model_name=served_model_name,
                   prepare=flavours, tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                   grammar_timeout=grammar_timeout)
    server = dict(host=host, port=port, api_key=api_key, max_request_bytes=max_request_bytes,
                  allowed_origins=tuple(allowed_origins or ()), log_level=log_level)
    port = server["port"] = sock.getsockname()[1]  # --port 0: the port the system picked
    if parallel:  # rank 0 binds the address again, in its own process
        sock.close()
    else:
        server["sock"] = sock
    banner = f"serving [bold]{{model}}[/] (policy {policy}) on http://{host}:{port}/v1"
    try:
        if parallel:  # rank 0 serves, the other ranks run its engine steps with it
            from ..runtime.session import check_tensor_parallel
            from ..runtime.tensor_parallel import launch
            from ..serve.parallel import serve_rank

            check_tensor_parallel(model, tp, expert_parallel)
            options["expert_parallel"] = expert_parallel
            launch(serve_rank, tp, device, options, server, banner + f" over {tp} ranks", quiet_interrupt=True)
            return
        service = open_service(**options)
    except ValueError as exc:  # ConfigError, PolicyError, ArtifactError
        sock.close()
        _fail(str(exc))
    console.print(banner.format(model=service.model_name))
    run_server(service, **server)


@app.command("train-embedded")
def train_embedded(
    out: Annotated[Path, typer.Option("--out", help="Output directory (target/, drafter/, prompts.jsonl).")],
    recipe: Annotated[str, typer.Option("--recipe", help="full (GPU) or tiny (CPU smoke).")] = "full",
    device: Annotated[Optional[str], typer.Option(
        "--device", metavar="[cpu|cuda|cuda:N]", callback=check_device,
        help="Where to train (default: cuda when torch has it, else cpu).")] = None,
    target_dir: Annotated[Optional[Path], typer.Option(
        "--target-dir", exists=True, file_okay=False, help="Reuse a trained target.")] = None,
    drafter_init: Annotated[Optional[Path], typer.Option(
        "--drafter-init", exists=True, file_okay=False,
        help="With --target-dir: continue training this drafter.")] = None,
    stdlib: Annotated[Optional[Path], typer.Option(
        "--stdlib", exists=True, file_okay=False,
        help="Standard-library folder to read (default: this interpreter's).")] = None,
    target_minutes: Annotated[Optional[float], typer.Option("--target-minutes", help="Cap on target training time.")] = None,
    drafter_minutes: Annotated[Optional[float], typer.Option("--drafter-minutes", help="Cap on drafter training time.")] = None,
) -> None:
    """Train the embedded default pair from a Python standard library (this interpreter's by default)."""
    import torch

    from ..training.embedded import recipe_for
    from ..training.embedded import train_embedded as train

    if drafter_init is not None and target_dir is None:
        _fail("--drafter-init needs --target-dir (the target it was trained against)")
    try:
        plan = recipe_for(recipe, target_minutes=target_minutes, drafter_minutes=drafter_minutes,
                          continued=drafter_init is not None)
        train(out, plan, device or ("cuda" if torch.cuda.is_available() else "cpu"),
              log=lambda m: console.print(m, markup=False, highlight=False), target_dir=target_dir, stdlib=stdlib,
              drafter_init=drafter_init)
    except (ValueError, OSError) as exc:  # a bad recipe, corpus, config or output folder: named in the message
        _fail(str(exc))
