"""Whether the Triton kernels run under the interpreter (TRITON_INTERPRET=1 set before triton was
imported), as every op's launcher needs to know: CPU tensors are then allowed, and 16-bit tile
products are widened (the interpreter's tl.dot multiplies them as raw integers)."""

import functools

import triton
from torch import Tensor


@triton.jit
def _probe():
    pass


@functools.cache
def interpreted() -> bool:
    """Fixed at import, so looked up once, not at every launch of the decoding round."""
    return type(_probe).__name__ == "InterpretedFunction"


def check_device(fn: str, **tensors: Tensor | None) -> None:
    """ValueError naming `fn` unless every given tensor is on one CUDA device (or, under the
    interpreter, on one device of any kind); None entries are skipped."""
    given = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in given.values()}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in given.items())
        raise ValueError(f"{fn}: tensors on several devices ({where})")
    if devices and next(iter(devices)).type != "cuda" and not interpreted():
        raise ValueError(f"{fn}: tensors are on {next(iter(devices))}; the Triton kernels need CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
