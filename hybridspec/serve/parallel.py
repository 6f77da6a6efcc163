"""`serve --tp N`: every rank loads its part of the target and builds the same service; rank 0 serves
HTTP and the others run each of its engine steps with it (`tensor_parallel.mirrored` / `follow`).
Ctrl-C reaches rank 0's server, which shuts down and then stops the other ranks (under torchrun,
torchrun stops every rank itself)."""

from __future__ import annotations

from ..runtime.tensor_parallel import follow, rank, stop_followers
from .service import open_service


def serve_rank(service_options: dict, server_options: dict, banner: str) -> None:
    """One rank of `serve --tp`: `open_service(**service_options)` on every rank, then rank 0 prints
    `banner` (`{model}`: the served model name) and runs `app.serve(service, **server_options)`, the
    others follow it."""
    from rich.console import Console

    from .app import serve

    service = open_service(**service_options, tensor_parallel=True)
    if rank() != 0:
        follow(service.engine_steps)
        return
    Console().print(banner.format(model=service.model_name))
    try:
        serve(service, **server_options)
    finally:
        service.executor.shutdown(wait=True)  # no engine step left to announce beside the stop
        stop_followers()
