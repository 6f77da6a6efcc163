"""The training corpus: the running interpreter's standard-library sources.

Files are read in sorted path order; a file is held out when a hash of its relative path falls
in the held-out fraction, so the split is the same on every machine with the same Python."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the standard library root
    text: str
    held_out: bool


@dataclass(frozen=True)
class Corpus:
    root: str
    python_version: str
    files: tuple[SourceFile, ...]

    def texts(self, *, held_out: bool) -> list[str]:
        return [f.text for f in self.files if f.held_out == held_out]

    def summary(self) -> dict:
        train = [f for f in self.files if not f.held_out]
        held = [f for f in self.files if f.held_out]
        return {"root": self.root, "python_version": self.python_version, "files": len(self.files),
                "bytes": sum(len(f.text.encode()) for f in self.files), "train_files": len(train),
                "held_out_files": len(held), "held_out_bytes": sum(len(f.text.encode()) for f in held)}


def is_held_out(relative_path: str, fraction: float) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def build_corpus(*, held_out_fraction: float = 0.1, max_files: int | None = None,
                 root: Path | None = None) -> Corpus:
    """Every `*.py` under the standard library (not site-packages), sorted by path. `root` is another
    interpreter's standard library (e.g. a copy carried to a machine whose own is stripped); its
    Python version is then read from the folder name (`python3.11`)."""
    version = platform.python_version()
    if root is not None and Path(root).name.startswith("python"):
        version = Path(root).name.removeprefix("python")
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder {root} does not exist")
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    files = []
    if max_files:  # an even spread over the tree, not its first files
        paths = paths[:: max(1, len(paths) // max_files)][:max_files]
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test files are deliberately not UTF-8
        rel = path.relative_to(root).as_posix()
        files.append(SourceFile(rel, text, is_held_out(rel, held_out_fraction)))
    if not files:
        raise ValueError(f"standard library folder {root} holds no readable .py files")
    return Corpus(str(root), version, tuple(files))
