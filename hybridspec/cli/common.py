"""What every command module shares: the console, the common options and the one-line failure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="`hybridspec` command line: thin adapters over library functions.")
console = Console()

ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model directory or preset name (default: the embedded model).")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", help="DFlash drafter directory, or `random`.")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="ar, full, static:N, ratio, ratio4, nominal, hybridspec.")]
ArtifactOpt = Annotated[Optional[Path], typer.Option("--artifact", help="Policy parameters from `hybridspec fit`.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto (triton on CUDA), torch or triton (GDN kernels).")]


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)

