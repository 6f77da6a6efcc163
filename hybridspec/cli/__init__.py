"""`hybridspec` command line: thin adapters over library functions, one module per group of
commands (`decode`: generate, serve, demo, train-embedded; `calibrate`: capture, merge, fit, eval,
report, inspect), all registered on one Typer `app`."""

from . import decode  # noqa: F401  (registers generate, demo, serve, train-embedded first in --help)
from . import calibrate  # noqa: F401  (registers capture, merge, fit, eval, report, inspect)
from .common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover
    app()
