"""Output paths checked before any work: a command that would fit for a minute and then fail to
write refuses at once, naming the option and the reason."""

from __future__ import annotations

import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the option."""


def _probe(directory: Path, option: str, path: Path) -> None:
    """Create and remove a file in `directory`: the one test that holds for every user, root included,
    and for read-only mounts."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".hybridspec-probe-"):
            pass
    except OSError as exc:
        raise OutputPathError(f"{option} {path}: directory {directory} is not writable ({exc.strerror})") from None


def check_output_file(path: Path, option: str = "--out") -> None:
    """A file that will be written (atomically, through a temporary file beside it)."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{option} {path}: is a directory, expected a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputPathError(f"{option} {path}: directory {parent} does not exist")
    _probe(parent, option, path)


def check_output_dir(path: Path, option: str = "--out") -> None:
    """A directory that will be created if needed and written into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {path}: exists and is not a directory")
    existing = path
    while not existing.exists():  # the nearest existing ancestor must let us create the rest
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"{option} {path}: {existing} is not a directory")
    _probe(existing, option, path)
