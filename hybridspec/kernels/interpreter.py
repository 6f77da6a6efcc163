"""Whether the Triton kernels run under the interpreter (TRITON_INTERPRET=1 set before triton was
imported), as every op's launcher needs to know: CPU tensors are then allowed, and 16-bit tile
products are widened (the interpreter's tl.dot multiplies them as raw integers)."""

import functools

import triton


@triton.jit
def _probe():
    pass


@functools.cache
def interpreted() -> bool:
    """Fixed at import, so looked up once, not at every launch of the decoding round."""
    return type(_probe).__name__ == "InterpretedFunction"
