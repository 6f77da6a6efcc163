"""What every command module shares: the console, the common options (their choices checked while
the command line is parsed, before any model loads), the one-line failure, `--version`, and
`main`, the entry point that turns a missing optional dependency into a hint naming its extra."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="`hybridspec` command line: thin adapters over library functions.")
console = Console()
err_console = Console(stderr=True)  # errors and warnings

Dtype = Literal["float32", "bfloat16", "float16"]  # Typer offers a Literal's values as choices
Backend = Literal["auto", "torch", "triton", "triton-torch-gdn"]
POLICIES = "ar, full, static:N, ratio, ratio4, nominal, hybridspec"
EXTRAS = {"fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve", "openai": "serve", "httpx": "serve",
          "jinja2": "serve", "matplotlib": "report", "transformers": "train", "triton": "gpu"}


def _fail(message: str) -> None:
    """One line on stderr, exit status 2."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


def check_device(device: Optional[str]) -> Optional[str]:
    """`cpu`, `cuda` or `cuda:N`, and CUDA only where torch has it (one line, exit 2, otherwise)."""
    if device is None or device == "cpu":
        return device
    if not re.fullmatch(r"cuda(:\d+)?", device):
        _fail(f"--device {device!r}: not one of cpu, cuda, cuda:N")
    import torch

    if not torch.cuda.is_available():
        _fail(f"--device {device}: this torch ({torch.__version__}) has no CUDA device; use --device cpu")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        _fail(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")
    return device


ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Hugging Face repo id (org/name[@revision]; the cache first), model directory or preset name (default: the embedded model).")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", help="DFlash drafter: Hugging Face repo id (org/name[@revision]), directory, or `random`.")]
PolicyOpt = Annotated[Optional[str], typer.Option("--policy", metavar="POLICY", help=f"One of {POLICIES}. Default: hybridspec with --artifact, else static:7 (the fastest policy that needs no artifact on the embedded pair).")]
ArtifactOpt = Annotated[Optional[Path], typer.Option("--artifact", help="Policy parameters from `hybridspec fit`.")]
DeviceOpt = Annotated[str, typer.Option("--device", metavar="[cpu|cuda|cuda:N]", callback=check_device, help="Where the model runs.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Weights and activations.")]
BackendOpt = Annotated[Backend, typer.Option("--backend", help="Kernels: auto (triton on CUDA), torch, triton, or triton-torch-gdn (Triton kernels except the GDN layers', which run PyTorch: the paper's Table 3 ablation).")]
ExpertParallelOpt = Annotated[bool, typer.Option("--expert-parallel", help="With --tp N: each rank holds 1/N of the routed experts whole (expert parallelism) instead of 1/N of every expert's intermediate columns.")]
TensorParallelOpt = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel ranks: the command spawns them (or is one of torchrun's: torchrun --nproc-per-node N -m hybridspec … --tp N); one GPU each on CUDA (NCCL), gloo on CPU.")]
GraphsOpt = Annotated[bool, typer.Option("--graphs/--no-graphs", help="CUDA graphs for the GPU-resident round (--no-graphs: the same round run eagerly, the graphs' oracle).")]


def package_version() -> str:
    try:
        return version("hybridspec")
    except PackageNotFoundError:  # pragma: no cover (a source tree that was never installed)
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        console.print(f"hybridspec {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="Print the version and exit.")] = False,
) -> None:
    """`hybridspec` command line: thin adapters over library functions."""


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line hint for an optional dependency that is not installed, or None."""
    module = (exc.name or "").split(".")[0]
    if module not in EXTRAS:
        return None
    return (f"this command needs {module}, part of the [{EXTRAS[module]}] extra: "
            f"pip install 'hybridspec[{EXTRAS[module]}]'")


def main() -> None:
    """The `hybridspec` entry point: `app`, with a missing optional dependency as one line, exit 2."""
    from . import app as full_app  # registers every command

    try:
        full_app()
    except ModuleNotFoundError as exc:
        hint = missing_extra(exc)
        if hint is None:
            raise
        err_console.print(f"[bold red]error:[/] {escape(hint)}", soft_wrap=True, highlight=False)
        raise SystemExit(2) from None
