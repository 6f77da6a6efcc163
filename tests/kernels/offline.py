"""Compile the Triton kernels that a launcher would run, for an SM90 GPU, on a machine with none.

The interpreter (TRITON_INTERPRET=1, which the CPU tests use) runs a kernel's body as Python and
does not apply the compiler's rules (a variable redefined with another shape in a branch, say), so
a kernel can pass every CPU test and still fail to compile on the GPU. `launch_offline(fn)` calls a
launcher with CPU tensors in a process without the interpreter, and each kernel launch in it
compiles the kernel with `triton.compile` for `GPUTarget("cuda", 90, 32)` (front end, LLVM and the
bundled ptxas) instead of running it, with the launch's argument types and constexprs and
programmatic dependent launch on. Returns the names of the kernels compiled. Run it in a fresh
process (`python -m tests.kernels.offline MODULE:FUNCTION`): it patches triton and the kernels'
device checks for the rest of the process.
"""

from __future__ import annotations

import importlib
import json
import sys

import torch

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1"}


def _signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """Triton's signature (name → type) and constexprs of one launch of the jit function fn."""
    values = dict(zip(fn.arg_names, args)) | kwargs
    signature, constexprs = {}, {}
    for param in fn.params:
        name, value = param.name, values.get(param.name, param.default)
        if param.is_constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__}")
    return signature, constexprs


def launch_offline(launcher, *args, **kwargs) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from hybridspec.kernels import interpreter, pdl

    compiled: list[str] = []

    def getitem(fn, grid):
        def launch(*a, num_warps: int = 4, num_stages: int = 3, launch_pdl: bool = False, **kw):
            signature, constexprs = _signature(fn, a, kw)
            target = GPUTarget("cuda", 90, 32)
            triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=target,
                           options=dict(num_warps=num_warps, num_stages=num_stages))
            compiled.append(fn.__name__)
        return launch

    JITFunction.__getitem__ = getitem
    interpreter.interpreted = lambda: True  # the launchers' device checks then take CPU tensors
    pdl.available = lambda x: True
    launcher(*args, **kwargs)
    return compiled


if __name__ == "__main__":  # python -m tests.kernels.offline CASES_MODULE:CASES → JSON {case: kernels}
    module, name = sys.argv[1].split(":")
    cases = getattr(importlib.import_module(module), name)()
    print(json.dumps({case: launch_offline(launcher, *args) for case, (launcher, args) in cases.items()}))
