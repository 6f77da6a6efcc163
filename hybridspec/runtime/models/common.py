"""Where each checkpoint tensor goes in the model: the routing shared by the checkpoint formats.

A format maps a checkpoint tensor's name to `Placement`s: the model parameter, the part of it
(an index, e.g. one expert's rows of a fused expert tensor) and, where the checkpoint's layout is
not a view of the model's, a `transform` of the whole tensor. The loader reads every tensor once
and copies it into its place, so per-expert checkpoints fill the fused expert tensors directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True, slots=True)
class Placement:
    """`param[index]` receives the checkpoint tensor, after `transform` when one is given."""

    param: str
    index: tuple = ()
    transform: Callable[[Tensor], Tensor] | None = None


def strip_prefix(name: str, prefixes: tuple[str, ...], drop: tuple[str, ...]) -> str | None:
    """The name without its first matching prefix; None for names starting with a `drop` prefix."""
    if name.startswith(drop):
        return None
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def expert_placement(name: str, intermediate: int) -> Placement | None:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` → its rows of the fused
    `experts.gate_up_proj` [E, 2I, H] (gate rows 0…I−1, up rows I…2I−1) or `experts.down_proj` [E, H, I];
    None for any other name (fused expert tensors are placed whole, by name)."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
    if proj == "down_proj":
        return Placement(f"{prefix}.down_proj", (expert,))
    rows = slice(0, intermediate) if proj == "gate_proj" else slice(intermediate, 2 * intermediate)
    return Placement(f"{prefix}.gate_up_proj", (expert, rows))
