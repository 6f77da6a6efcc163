"""`hybridspec` command line: thin adapters over library functions, one module per group of
commands (`decode`: generate, demo, serve, train-embedded; `calibrate`: capture, merge, fit, eval,
estimate, report, inspect, export), all registered on one Typer `app`. The entry point is
`common.main` (a missing optional dependency becomes a one-line hint)."""

from . import decode  # noqa: F401  (registers generate, demo, serve, train-embedded first in --help)
from . import calibrate  # noqa: F401  (registers capture, merge, fit, eval, estimate, report, inspect, export)
from .common import app

__all__ = ["app"]
