"""Compile the Triton kernels the interpreted tests launched, for an SM90 GPU, on a machine with none.

The interpreter (TRITON_INTERPRET=1, which the CPU tests use) runs a kernel's body as Python and
does not apply the compiler's rules (a variable redefined with another shape in a branch, say), so
a kernel can pass every CPU test and still fail to compile on the GPU. `record_launches(directory)`
keeps, per kernel, the argument types and constexprs of its first interpreted launch in this
process (written to `directory` at exit); `python -m tests.kernels.offline DIRECTORY` compiles each
recorded kernel with `triton.compile` for `GPUTarget("cuda", 90, 32)` (front end, LLVM and the
bundled ptxas) and prints one JSON object {kernel: "ok" or the error}. The switches that only the
interpreter turns (WIDEN: 16-bit products widened; FENCE off) take their GPU values, and
programmatic dependent launch (USE_GDC) is on, as the GPU launches them. `tests/conftest.py` records
in every test process and compiles at the end of the session.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

GPU_VALUES = {"USE_GDC": True, "WIDEN": False, "FENCE": True}  # constexprs the launchers set from the interpreter
OPTIONS = ("num_warps", "num_stages", "launch_pdl", "maxnreg", "num_ctas")  # launch options, not parameters


def _describe(value):
    """A launch argument as JSON: its type (tensors by dtype) and, for scalars, its value."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"other": repr(value)}


def record_launches(directory: Path, modules: str = "hybridspec."):
    """Record the first launch in this process of each interpreted kernel defined in a module whose
    name starts with `modules`; the returned function writes them to directory."""
    from triton.runtime.interpreter import InterpretedFunction

    launches: dict[str, dict] = {}
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        key = f"{self.fn.__module__}:{self.fn.__name__}"
        if key not in launches and self.fn.__module__.startswith(modules):
            named = dict(zip(self.arg_names, args)) | kwargs
            launches[key] = {name: _describe(value) for name, value in named.items()}
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    def write() -> None:
        if launches and directory.is_dir():
            (directory / f"launches-{os.getpid()}.json").write_text(json.dumps(launches))

    InterpretedFunction.run = recording_run
    return write


_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def compile_recorded(key: str, launch: dict) -> str:
    """'ok', or why the recorded launch of `key` (module:kernel) does not compile for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = key.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"
    signature, constexprs = {}, {}
    for param in fn.params:
        arg = launch.get(param.name, {"value": param.default})
        if "other" in arg:
            return f"skipped: argument {param.name} is {arg['other']}"
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = GPU_VALUES.get(param.name, arg.get("value"))
        elif "tensor" in arg:
            signature[param.name] = "*" + _TYPES[arg["tensor"]]
        elif arg["value"] is None:
            signature[param.name], constexprs[param.name] = "constexpr", None
        elif isinstance(arg["value"], bool):
            signature[param.name] = "i1"
        elif isinstance(arg["value"], int):
            signature[param.name] = "i32" if -2**31 <= arg["value"] < 2**31 else "i64"
        else:
            signature[param.name] = "fp32"
    options = {k: launch[k]["value"] for k in ("num_warps", "num_stages") if k in launch}
    try:
        triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options=options)
    except Exception as error:  # noqa: BLE001 - every compile error is the answer
        return f"{type(error).__name__}: {error}"[-2000:]
    return "ok"


def main(directory: str) -> int:
    launches = {}
    for path in sorted(Path(directory).glob("launches-*.json")):
        for key, launch in json.loads(path.read_text()).items():
            launches.setdefault(key, launch)
    print(json.dumps({key: compile_recorded(key, launches[key]) for key in sorted(launches)}))
    return 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("tests.kernels.offline compiles: run it with TRITON_INTERPRET unset")
    sys.exit(main(sys.argv[1]))
