"""Text ↔ ids through a model directory's `tokenizer.json` (the `tokenizers` library)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TextCodec:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def load_codec(directory: Path | None) -> TextCodec | None:
    """The directory's tokenizer, or None when it has none (random presets)."""
    if directory is None or not (Path(directory) / "tokenizer.json").is_file():
        return None
    return TextCodec(Tokenizer.from_file(str(Path(directory) / "tokenizer.json")))
