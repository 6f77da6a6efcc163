"""A server on a live loopback socket for the serve tests: uvicorn in a thread, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

from hybridspec.serve.app import create_app
from hybridspec.serve.service import Service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(service: Service, **app_options):
    """Yields (base URL, the server's thread); the event loop runs on that thread."""
    port = free_port()
    config = uvicorn.Config(create_app(service, **app_options), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", thread
    finally:
        server.should_exit = True
        thread.join(timeout=10)
