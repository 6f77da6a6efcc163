"""`hybridspec generate` end to end through the CLI: JSON output and the errors it names."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import save_artifact
from hybridspec.runtime.session import open_session
from hybridspec.cli import app
from tests.runtime.helpers import policy_parameters

runner = CliRunner()


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, ["generate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_generate_json_fields_and_ar_equality(tmp_path):
    ar = _json(["--model", "random-tiny", "--prompt-ids", "3,1,4", "--policy", "ar", "--max-new-tokens", "20"])
    assert {"token_ids", "text", "rounds", "acceptance_length", "mean_verification_length",
            "decode_seconds"} <= set(ar)
    assert len(ar["token_ids"]) == 20 and ar["rounds"] == 19 and ar["mean_verification_length"] == 1
    session = open_session("random-tiny")
    save_artifact(tmp_path / "p.safetensors", policy_parameters(), model_id=session.model_id,
                  drafter_id=session.drafter_id, device="cpu", store_digest="none", diagnostics={})
    for policy in ("full", "static:5", "hybridspec"):
        extra = ["--artifact", str(tmp_path / "p.safetensors")] if policy == "hybridspec" else []
        spec = _json(["--model", "random-tiny", "--prompt-ids", "3,1,4", "--policy", policy, "--max-new-tokens",
                      "20", *extra])
        assert spec["token_ids"] == ar["token_ids"], policy
        assert spec["random_weights"] is True


def test_generate_logprobs_json_and_table():
    """--logprobs K: every generated token's log-probability and K alternatives, the same under any
    policy up to rounding; greedy tokens are their own first alternative. The table prints them."""
    args = ["--prompt", "def add(a, b):", "--max-new-tokens", "10", "--logprobs", "2"]
    ar, full = (_json([*args, "--policy", policy]) for policy in ("ar", "full"))
    assert [e["id"] for e in ar["logprobs"]] == ar["token_ids"] == full["token_ids"]
    for a, f in zip(ar["logprobs"], full["logprobs"]):
        assert len(a["top"]) == 2 and a["top"][0][0] == a["id"] and a["logprob"] == pytest.approx(a["top"][0][1])
        assert f["logprob"] == pytest.approx(a["logprob"], abs=2e-4)
    assert "logprobs" not in _json(["--prompt", "x", "--max-new-tokens", "2", "--policy", "ar"])
    shown = runner.invoke(app, ["generate", *args, "--policy", "ar"])
    assert shown.exit_code == 0 and "logprobs" in shown.stdout and f"{ar['logprobs'][0]['logprob']:.4f}" in shown.stdout
    assert runner.invoke(app, ["generate", *args[:-1], "21"]).exit_code == 2


def test_generate_holds_the_output_to_a_schema_a_regex_or_choices(tmp_path):
    """--json-schema / --regex / --choice: the output matches, `full` emits `ar`'s tokens (greedy)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    args = ["--prompt", "x = {", "--max-new-tokens", "24"]
    for option, check in ((["--json-schema", str(tmp_path / "s.json")], lambda t: isinstance(json.loads(t)["n"], int)),
                          (["--regex", "[a-z]{2,6}"], lambda t: t.isalpha() and 2 <= len(t) <= 6),
                          (["--choice", "red", "--choice", "blue"], lambda t: t in ("red", "blue"))):
        ar, full = (_json([*args, *option, "--policy", policy]) for policy in ("ar", "full"))
        assert ar["token_ids"] == full["token_ids"] and ar["finish_reason"] == "eos", option
        assert check(ar["text"].replace("<|endoftext|>", "")), (option, ar["text"])


@pytest.mark.parametrize("args,message", [
    (["--regex", "[a-"], "regex grammar does not compile"),
    (["--regex", "a", "--choice", "b"], "not --regex and --choice"),
    (["--json-schema", "/nonexistent/s.json"], "--json-schema /nonexistent/s.json: No such file"),
])
def test_generate_names_a_bad_output_constraint(args, message):
    result = runner.invoke(app, ["generate", "--prompt", "x", "--policy", "ar", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_artifact_for_another_model_is_refused_unless_forced(tmp_path):
    save_artifact(tmp_path / "p.safetensors", policy_parameters(), model_id="sha256:other", drafter_id="sha256:d",
                  device="cpu", store_digest="none", diagnostics={})
    args = ["generate", "--model", "random-tiny", "--prompt-ids", "1,2", "--policy", "nominal", "--artifact",
            str(tmp_path / "p.safetensors"), "--max-new-tokens", "4"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "sha256:other" in " ".join(refused.output.split())
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_generate_with_a_checkpoint_directory(qwen35_dir):
    ar = _json(["--model", str(qwen35_dir), "--prompt-ids", "5,6", "--policy", "ar", "--max-new-tokens", "8"])
    assert len(ar["token_ids"]) == 8 and ar["random_weights"] is False


@pytest.mark.parametrize("args,message", [
    (["--prompt-ids", "1,2", "--policy", "nominal"], "needs --artifact"),
    (["--prompt-ids", "1,2", "--policy", "sometimes"], "unknown policy"),
    (["--prompt-ids", "1,2", "--policy", "static:x"], "static:N needs an integer"),
    (["--model", "qwen9-unknown", "--prompt-ids", "1", "--policy", "ar"], "is neither a model directory"),
    (["--model", "random-tiny", "--prompt", "hello", "--policy", "ar"], "no tokenizer.json"),
    (["--prompt-ids", "1,2", "--prompt", "x", "--policy", "ar"], "exactly one"),
    (["--prompt-ids", "1,99999", "--policy", "ar"], "--prompt-ids 99999 is outside the vocabulary"),
    (["--prompt-ids", "1", "--policy", "ar", "--top-p", "0"], "top_p"),
    (["--prompt-ids", "1", "--policy", "ar", "--logit-bias", "99999=1"], "--logit-bias 99999 is outside the vocabulary"),
    (["--prompt-ids", "1", "--policy", "ar", "--stop-token-id", "99999"], "--stop-token-id 99999 is outside the vocabulary"),
    (["--model", "random-tiny", "--prompt-ids", "1", "--policy", "ar", "--stop", "x"], "stop sequences (--stop) need one"),
])
def test_generate_errors_name_what_is_wrong(args, message):
    result = runner.invoke(app, ["generate", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_directory_model_needs_a_drafter_for_speculative_policies(qwen35_dir):
    result = runner.invoke(app, ["generate", "--model", str(qwen35_dir), "--prompt-ids", "1", "--policy", "full"])
    assert result.exit_code == 2 and "needs --drafter" in " ".join(result.output.split())


def test_unsupported_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = runner.invoke(app, ["generate", "--model", str(tmp_path), "--prompt-ids", "1", "--policy", "ar"])
    assert result.exit_code == 2 and "model_type 'llama'" in result.output


def test_default_model_is_the_embedded_pair_with_text():
    out = _json(["--prompt", "def add(a, b):\n    return", "--policy", "full", "--max-new-tokens", "12"])
    assert out["random_weights"] is False and out["model"].endswith("embedded/target")
    ar = _json(["--prompt", "def add(a, b):\n    return", "--policy", "ar", "--max-new-tokens", "12"])
    assert out["token_ids"] == ar["token_ids"] and out["text"] == ar["text"] and out["text"]


@pytest.mark.parametrize(("env", "flag", "expected"), [(None, [], 1), ("3", [], 3), ("3", ["--threads", "2"], 2)])
def test_demo_sets_one_thread_count_for_every_step_and_the_server(monkeypatch, tmp_path, env, flag, expected):
    import os

    import torch

    import hybridspec.demo as demo

    monkeypatch.setenv("OMP_NUM_THREADS", env or "")  # records the variable's state for the undo
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    seen = {}
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.setdefault("torch", n))
    monkeypatch.setattr(demo, "run_demo_workflow",
                        lambda config, console: seen.update(env=os.environ["OMP_NUM_THREADS"], out=config.out))
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "d"), *flag])
    assert result.exit_code == 0, result.output
    assert seen == {"torch": expected, "env": str(expected), "out": tmp_path / "d"}
    assert f"torch CPU threads: {expected}" in result.output


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("command", [["generate", "--prompt-ids", "1"], ["serve"], ["capture", "--quick"],
                                     ["eval", "--quick"]])
def test_unknown_device_is_one_line_before_any_model_loads(monkeypatch, command):
    import hybridspec.runtime.session as session

    monkeypatch.setattr(session, "open_session", lambda *a, **k: pytest.fail("a model was loaded"))
    _one_line_error(runner.invoke(app, [*command, "--device", "tpu"]), "--device 'tpu'", "cpu, cuda, cuda:N")


def test_cuda_without_cuda_is_one_line(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command in (["generate", "--prompt-ids", "1"], ["capture"], ["serve"]):
        _one_line_error(runner.invoke(app, [*command, "--device", "cuda"]), "--device cuda", "no CUDA device")


@pytest.mark.parametrize("command", ["generate", "serve", "capture", "eval"])
def test_help_lists_the_choices(command):
    text = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "220", "TERMINAL_WIDTH": "220"}).stdout.split())
    for choices in ("[cpu|cuda|cuda:N]", "<float32|bfloat16|float16>", "<auto|torch|triton|triton-torch-gdn>"):
        assert choices in text, (choices, text)
    if command in ("generate", "serve"):
        assert "ar, full, static:N, ratio, ratio4, nominal, hybridspec" in text and "else static:7" in text


def test_bad_dtype_and_backend_are_usage_errors():
    for flag, value in (("--dtype", "float64"), ("--backend", "cuda")):
        result = runner.invoke(app, ["generate", "--prompt-ids", "1", flag, value])
        assert result.exit_code == 2 and flag in result.output


@pytest.mark.parametrize("seed", [str(2**70), str(-(2**63) - 1)])
def test_seed_out_of_range_names_the_option(seed):
    result = runner.invoke(app, ["generate", "--prompt-ids", "1", "--policy", "ar", "--seed", seed])
    assert result.exit_code == 2 and "--seed" in result.output and "Overflow" not in result.output


def test_prompt_that_is_not_utf8_is_one_line():
    # bytes b"\xed\xa0\x80" on the command line reach Python as surrogate escapes
    result = runner.invoke(app, ["generate", "--prompt", "\udced\udca0\udc80", "--policy", "ar",
                                 "--max-new-tokens", "2"])
    _one_line_error(result, "--prompt is not valid UTF-8")


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("hybridspec ")


def test_without_an_artifact_generate_says_which_policy_it_uses():
    result = runner.invoke(app, ["generate", "--prompt-ids", "3,1,4", "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["policy"] == "static:7"
    assert "policy static:7 (no --artifact" in result.stderr


class _Listening:
    """What `serve_app.listen` returns, without a port taken."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)

    def getsockname(self) -> tuple[str, int]:
        return self.address

    def close(self) -> None:
        pass


@pytest.fixture
def real_listen():
    """Asked for by the tests that bind a real socket (`_stand_in_listen` then leaves `listen` alone)."""


@pytest.fixture(autouse=True)
def _stand_in_listen(monkeypatch, request):
    """`serve` binds its address before the model loads; the tests that run it with the server
    patched out bind nothing (port 30000 may be taken on the machine, or by another test)."""
    if "real_listen" not in request.fixturenames:
        import hybridspec.serve.app as serve_app

        monkeypatch.setattr(serve_app, "listen", _Listening)


def test_serve_reads_the_key_from_a_file_or_the_environment(monkeypatch, tmp_path):
    import hybridspec.serve.app as serve_app
    import hybridspec.serve.service as serve_service

    seen = {}
    monkeypatch.setattr(serve_service, "open_service", lambda **kw: seen.update(open=kw) or
                        type("S", (), {"model_name": "m"})())
    monkeypatch.setattr(serve_app, "serve", lambda service, **kw: seen.update(serve=kw))
    (tmp_path / "key").write_text("from-file\n")
    assert runner.invoke(app, ["serve", "--api-key-file", str(tmp_path / "key")]).exit_code == 0
    assert seen["serve"]["api_key"] == "from-file" and seen["open"]["policy"] == "static:7"
    result = runner.invoke(app, ["serve", "--log-level", "warning", "--max-request-bytes", "99", "--allowed-origin",
                                 "http://a.test", "--allowed-origin", "*"], env={"HYBRIDSPEC_API_KEY": "from-env"})
    assert result.exit_code == 0, result.output
    sock = seen["serve"].pop("sock")
    assert sock.address == ("127.0.0.1", 30000)
    assert seen["serve"] == {"host": "127.0.0.1", "port": 30000, "api_key": "from-env", "max_request_bytes": 99,
                             "allowed_origins": ("http://a.test", "*"), "log_level": "warning"}
    _one_line_error(runner.invoke(app, ["serve", "--api-key-file", str(tmp_path / "none")]), "--api-key-file")


def test_serve_binds_its_address_before_the_model_loads(monkeypatch, real_listen):
    """A port in use is one line naming it, and no model is loaded; --port 0 serves on the port the
    system picked, which the banner names, on the socket bound before loading."""
    import socket

    import hybridspec.serve.app as serve_app
    import hybridspec.serve.service as serve_service

    loaded, served = [], {}
    monkeypatch.setattr(serve_service, "open_service", lambda **kw: loaded.append(kw) or
                        type("S", (), {"model_name": "m"})())
    monkeypatch.setattr(serve_app, "serve", lambda service, **kw: served.update(kw))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        _one_line_error(runner.invoke(app, ["serve", "--port", str(port)]), f"--port {port}", f"127.0.0.1:{port}")
        assert loaded == []
    result = runner.invoke(app, ["serve", "--port", "0"])
    assert result.exit_code == 0, result.output
    bound = served.pop("sock")
    try:
        picked = bound.getsockname()[1]
        assert picked != 0 and f"http://127.0.0.1:{picked}/v1" in result.stdout and len(loaded) == 1
        with socket.create_connection(("127.0.0.1", picked), timeout=5):  # listening before any server runs
            pass
    finally:
        bound.close()


def test_a_missing_extra_is_a_one_line_hint(monkeypatch, capsys):
    import sys

    from hybridspec.cli.common import main

    for module in ("hybridspec.serve.app", "hybridspec.serve.service", "hybridspec.serve"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ModuleNotFoundError
    monkeypatch.setattr(sys, "argv", ["hybridspec", "serve"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[serve] extra" in err and "pip install 'hybridspec[serve]'" in err


@pytest.mark.parametrize("command", ["generate", "serve", "capture", "eval"])
def test_no_graphs_reaches_the_engine(monkeypatch, tmp_path, command):
    """--no-graphs: every command that decodes builds its Engine with graphs=False (the resident
    round run eagerly); by default the Engine decides (graphs wherever the resident round runs on CUDA)."""
    from hybridspec.runtime import engine as engine_module
    from hybridspec.runtime import session as session_module

    built = []

    class Recorder(engine_module.Engine):
        def __init__(self, *args, **kwargs):
            built.append(kwargs.get("graphs"))
            raise SystemExit(0)  # the model loaded and the engine was asked for: enough

    monkeypatch.setattr(session_module, "Engine", Recorder)
    args = {"generate": ["--prompt-ids", "1,2", "--max-new-tokens", "2"], "serve": [],
            "capture": ["--quick", "--db", str(tmp_path / "c.duckdb")],
            "eval": ["--quick", "--db", str(tmp_path / "e.duckdb")]}[command]
    for flag, expected in ((["--no-graphs"], False), ([], None)):
        runner.invoke(app, [command, *args, *flag])
        assert built and built.pop() is expected, (command, flag)


def test_the_parallel_layout_reaches_generate_and_serve(monkeypatch):
    """`--tp 2 --expert-parallel` hands the layout to the library (nothing is spawned here); without
    ranks to split over it is refused with the option named."""
    from hybridspec.runtime import generation, tensor_parallel

    seen = {}
    monkeypatch.setattr(generation, "run_generate", lambda request: seen.setdefault("request", request) and None)
    assert runner.invoke(app, ["generate", "--prompt", "x", "--tp", "2", "--expert-parallel"]).exit_code == 0
    assert (seen["request"].tp, seen["request"].expert_parallel) == (2, True)
    monkeypatch.setattr(tensor_parallel, "launch", lambda fn, world, device, options, *rest, **kw: seen.update(
        world=world, options=options))
    assert runner.invoke(app, ["serve", "--tp", "2", "--expert-parallel"]).exit_code == 0
    assert (seen["world"], seen["options"]["expert_parallel"]) == (2, True)
    result = runner.invoke(app, ["serve", "--expert-parallel"])
    assert result.exit_code == 2 and "needs --tp 2 or more" in " ".join(result.output.split())


def test_generate_penalties_reach_the_engine():
    """--presence-penalty and friends change the greedy output, the same under `full` as under `ar`."""
    args = ["--prompt", "def add(a, b):", "--max-new-tokens", "16"]
    plain = _json([*args, "--policy", "ar"])["token_ids"]
    ar, full = (_json([*args, "--policy", policy, "--presence-penalty", "1.5", "--repetition-penalty", "1.3"])["token_ids"]
                for policy in ("ar", "full"))
    assert ar == full != plain
    assert runner.invoke(app, ["generate", *args, "--presence-penalty", "3"]).exit_code == 2


def test_serve_prepare_captures_the_named_flavours_at_start_up(monkeypatch):
    """`serve --prepare` hands each flavour to the engine's capture before the server starts (greedy
    always first); a bad item is refused before any weights load, naming it."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.serve import app as app_module

    calls = []
    monkeypatch.setattr(Engine, "prepare", lambda self, policy, sampling, *, logprobs=False, grammar=False: calls.append(
        (policy.name, sampling.temperature, sampling.top_k, sampling.top_p, sampling.penalized, logprobs, grammar)))
    monkeypatch.setattr(app_module, "serve", lambda service, **kw: None)
    result = runner.invoke(app, ["serve", "--policy", "full", "--prepare",
                                 "greedy+logprobs, top-k+penalties, greedy+grammar"])
    assert result.exit_code == 0, result.output
    assert calls == [("full", 0.0, 0, 1.0, False, False, False), ("full", 0.0, 0, 1.0, False, True, False),
                     ("full", 1.0, 20, 1.0, True, False, False), ("full", 0.0, 0, 1.0, False, False, True)]
    bad = runner.invoke(app, ["serve", "--prepare", "sample+fast"])
    assert bad.exit_code == 2 and "sample+fast" in " ".join(bad.output.split())


@pytest.mark.parametrize("diagnostics,exit_code,message", [
    ({"acceptance": 5, "dinkelbach": 7, "cost": {"cells": "x"}}, 0, "not recorded"),
    ({"thresholds": {"cost_r2": 5.0}}, 2, "threshold cost_r2: 5.0 outside [0, 1]"),
    ({"thresholds": {"cost_r2": "high"}}, 2, "diagnostics.thresholds must be an object of finite numbers"),
])
def test_inspect_names_hand_edited_diagnostics_or_leaves_their_checks_unknown(tmp_path, diagnostics, exit_code,
                                                                             message):
    """Diagnostics written by hand (the hash made to match): sections of another shape are checks not
    recorded; a recorded limit that is unusable is one line naming the file, never a traceback."""
    path = tmp_path / "p.safetensors"
    save_artifact(path, policy_parameters(), model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                  store_digest="none", diagnostics=diagnostics)
    result = runner.invoke(app, ["inspect", str(path)], terminal_width=200)
    assert result.exit_code == exit_code and not isinstance(result.exception, (TypeError, AttributeError)), result.output
    shown = " ".join(result.output.split())
    assert message in shown and (exit_code != 2 or str(path.name) in shown), result.output


def test_generate_warns_of_an_artifact_whose_recorded_limit_is_out_of_range(tmp_path):
    """An artifact whose recorded fit-quality limit is out of its range (its hash made to match)
    decodes with one warning line naming the file and the limit, never a traceback."""
    session = open_session("random-tiny")
    path = tmp_path / "p.safetensors"
    save_artifact(path, policy_parameters(), model_id=session.model_id, drafter_id=session.drafter_id, device="cpu",
                  store_digest="none", diagnostics={"thresholds": {"cost_r2": 5.0}})
    result = runner.invoke(app, ["generate", "--model", "random-tiny", "--prompt-ids", "3,1,4", "--artifact",
                                 str(path), "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "p.safetensors" in warnings[0] and "cost_r2" in warnings[0], result.stderr
    assert len(json.loads(result.stdout)["token_ids"]) == 4


CODE = ["--prompt", "def add(a, b):"]  # greedy: " pass\n        self.assertEqual(a, b)\n …", no EOS in 24 tokens


def _vllm_stop(pieces: list[str], stops: list[str], min_tokens: int) -> tuple[int, int, str]:
    """(tokens, where, which) of the stop that ends the output as vLLM's detokenizer finds it, a
    token at a time (`pieces`: each token's text): after each token past the first min_tokens, the
    first of `stops`, in their order, that ends in the text that token added."""
    for k in range(min_tokens + 1, len(pieces) + 1):
        text, new = "".join(pieces[:k]), len(pieces[k - 1])
        for stop in stops:
            at = text.find(stop, max(0, len(text) - new - len(stop) + 1))
            if at >= 0:
                return k, at, stop
    raise AssertionError(f"no stop of {stops} in {''.join(pieces)!r}")


@pytest.mark.parametrize("stops, min_tokens", [(["(a"], 0), (["f.a"], 0), (["b)", "(a"], 0), (["pa"], 0), (["a"], 1),
                                               (["al(", "Equal("], 0), (["Equal(", "al("], 0), (["s\n"], 1)])
def test_generate_stop_cuts_the_output_where_its_text_holds_the_stop(stops, min_tokens):
    """--stop: the output ends at the first token whose text ends a stop sequence, past the first
    --min-tokens tokens (it may begin in theirs); the first of the stops given wins where several
    end in one token; its text is the plain text up to the stop, which is left out (vLLM's rule,
    `_vllm_stop`); under `full` the round is cut within."""
    plain = _json([*CODE, "--policy", "full", "--max-new-tokens", "24", "--logprobs", "0"])
    pieces = [entry["text"] for entry in plain["logprobs"]]
    text = "".join(pieces)
    assert text == plain["text"]
    length, at, stop = _vllm_stop(pieces, stops, min_tokens)
    options = [a for s in stops for a in ("--stop", s)] + ["--min-tokens", str(min_tokens)]
    cut = _json([*CODE, "--policy", "full", "--max-new-tokens", "24", *options])
    assert cut["token_ids"] == plain["token_ids"][:length] and length < 24
    assert (cut["text"], cut["finish_reason"], cut["stop_reason"]) == (text[:at], "stop", stop)
    assert 1 + cut["rounds"] * cut["acceptance_length"] == pytest.approx(length)
    if stops == ["(a"]:
        assert _json([*CODE, "--policy", "ar", "--max-new-tokens", "24", *options])["token_ids"] == cut["token_ids"]
        kept = _json([*CODE, "--policy", "full", "--max-new-tokens", "24", *options, "--include-stop"])
        assert (kept["token_ids"], kept["text"]) == (cut["token_ids"], text[:at] + stop)


def test_generate_min_tokens_holds_off_an_end_token():
    """--stop-token-id T, T greedy's first token, ends the output at once; with --min-tokens 4 no T
    comes before the fifth token, even with T's logit raised by 100 (then T is the fifth), the same
    under `full` as under `ar`."""
    args = [*CODE, "--max-new-tokens", "12"]
    first = _json([*args, "--policy", "ar"])["token_ids"][0]
    end = ["--stop-token-id", str(first)]
    ended = _json([*args, *end, "--policy", "full"])
    assert (ended["token_ids"], ended["finish_reason"], ended["stop_reason"]) == ([first], "eos", first)
    held = [_json([*args, *end, "--min-tokens", "4", "--policy", policy])["token_ids"] for policy in ("ar", "full")]
    assert held[0] == held[1] and first not in held[0][:4] and len(held[0]) > 4
    forced = _json([*args, *end, "--min-tokens", "4", "--logit-bias", f"{first}=100", "--policy", "full"])
    assert forced["token_ids"][4:] == [first] and first not in forced["token_ids"][:4]
    assert forced["finish_reason"] == "eos"


def test_generate_logit_bias_steers_greedy_decoding():
    """--logit-bias ID=100 makes greedy decoding emit ID at every step; ID=-100 on greedy's first
    token keeps it out; the same under `full` as under `ar`."""
    args = [*CODE, "--max-new-tokens", "8"]
    plain = _json([*args, "--policy", "ar"])["token_ids"]
    token = next(t for t in range(40, 100) if t not in plain)
    raised = [_json([*args, "--logit-bias", f"{token}=100", "--policy", p])["token_ids"] for p in ("ar", "full")]
    assert raised[0] == raised[1] == [token] * 8
    lowered = _json([*args, "--logit-bias", f"{plain[0]}=-100", "--logit-bias", f"{token}=0", "--policy", "full"])
    assert plain[0] not in lowered["token_ids"]


def test_generate_ignore_eos_decodes_past_the_models_eos():
    """The model's EOS, raised by 100, ends the output at its first token; --ignore-eos decodes on to
    --max-new-tokens."""
    from hybridspec.runtime.loading import target_config
    from hybridspec.runtime.session import default_model, eos_ids

    model = default_model()[0]
    eos = eos_ids(model, target_config(model))[0]
    args = [*CODE, "--max-new-tokens", "5", "--policy", "full", "--logit-bias", f"{eos}=100"]
    ended = _json(args)
    assert (ended["token_ids"], ended["finish_reason"], ended["stop_reason"]) == ([eos], "eos", None)
    ignored = _json([*args, "--ignore-eos"])
    assert (ignored["token_ids"], ignored["finish_reason"]) == ([eos] * 5, "length")
    # the text, as serve's: the end token left out unless --include-stop, special tokens unless kept
    kept = _json([*args, "--ignore-eos", "--keep-special-tokens"])["text"]
    special = kept[: len(kept) // 5]  # the EOS's text, a special token of this tokenizer
    assert special and kept == special * 5 and ignored["text"] == ""
    assert ended["text"] == _json([*args, "--keep-special-tokens"])["text"] == ""
    assert _json([*args, "--keep-special-tokens", "--include-stop"])["text"] == special


def test_generate_min_p_one_samples_the_most_likely_token():
    """--min-p 1 cuts every token less likely than the most likely one: sampling decodes greedily."""
    args = [*CODE, "--max-new-tokens", "12", "--policy", "full"]
    sampled = ["--temperature", "1", "--seed", "3"]
    greedy = _json(args)["token_ids"]
    assert _json([*args, *sampled, "--min-p", "1"])["token_ids"] == greedy != _json([*args, *sampled])["token_ids"]


def test_generate_top_k_minus_one_is_off():
    """--top-k -1 samples as --top-k 0 (off), as vLLM and the server read it; --top-k 1 is greedy."""
    args = [*CODE, "--max-new-tokens", "12", "--policy", "full", "--temperature", "1", "--seed", "3"]
    off, minus_one, one = (_json([*args, "--top-k", k])["token_ids"] for k in ("0", "-1", "1"))
    assert minus_one == off != one
    assert runner.invoke(app, ["generate", *args, "--top-k", "-2"]).exit_code == 2
