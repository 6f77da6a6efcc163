"""Compile the Triton kernels the interpreted tests launched, for an SM90 GPU, on a machine with none.

The interpreter (TRITON_INTERPRET=1, which the CPU tests use) runs a kernel's body as Python and
does not apply the compiler's rules (a variable redefined with another shape in a branch, say), so
a kernel can pass every CPU test and still fail to compile on the GPU. `record_launches(directory)`
keeps, per kernel, the argument types and constexprs of its interpreted launches in this process,
one per specialization (written to `directory` by the function it returns); `python -m
tests.kernels.offline DIRECTORY` compiles each recorded launch with this machine's Triton,
`triton.compile` for `GPUTarget("cuda", 90, 32)` (front end, LLVM and the bundled ptxas), and
prints one JSON object {kernel: "ok", or its first error, else why a launch was skipped}. The
switches that only the interpreter turns (WIDEN: 16-bit products widened; FENCE off) take their
GPU values, and programmatic dependent launch (USE_GDC) is on, as the GPU launches them.
`tests/conftest.py` records in every test process and compiles at the end of the session. To
compile with another Triton (the GPU machine's), keep the records and point PYTHONPATH at it:

    HYBRIDSPEC_TEST_LAUNCHES=DIR make test      # DIR exists; the records stay there
    PYTHONPATH=TRITON_DIR python -m tests.kernels.offline DIR

`HYBRIDSPEC_TEST_LAUNCHES=` (set, empty) turns the recording and the compile off.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

GPU_VALUES = {"USE_GDC": True, "WIDEN": False, "FENCE": True}  # constexprs the launchers set from the interpreter
OPTIONS = ("num_warps", "num_stages", "launch_pdl", "maxnreg", "num_ctas")  # launch options, not parameters
MAX_SPECIALIZATIONS = 4  # launches recorded per kernel and process


def _describe(value):
    """A launch argument as JSON: its type (tensors by dtype) and, for scalars, its value."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"other": repr(value)}


def record_launches(directory: Path, modules: str = "hybridspec."):
    """Record, in this process, the launches of interpreted kernels defined in a module whose name
    starts with `modules`: per kernel, the first launch of each specialization (tensor dtypes,
    constexpr values, scalar kinds, warps), at most MAX_SPECIALIZATIONS; the returned function
    writes them to directory."""
    from triton.runtime.interpreter import InterpretedFunction

    launches: dict[str, dict[str, dict]] = {}
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        key = f"{self.fn.__module__}:{self.fn.__name__}"
        if self.fn.__module__.startswith(modules) and len(launches.setdefault(key, {})) < MAX_SPECIALIZATIONS:
            named = {name: _describe(value) for name, value in (dict(zip(self.arg_names, args)) | kwargs).items()}
            constexpr = {name for name, p in inspect.signature(self.fn).parameters.items()
                         if "constexpr" in str(p.annotation)}
            specialization = json.dumps({name: arg if name in constexpr or name in OPTIONS or "value" not in arg
                                         else type(arg["value"]).__name__ for name, arg in named.items()})
            launches[key].setdefault(specialization, named)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    def write() -> None:
        if launches and directory.is_dir():
            recorded = {key: list(found.values()) for key, found in launches.items() if found}
            (directory / f"launches-{os.getpid()}.json").write_text(json.dumps(recorded))

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
    launches: dict[str, list[dict]] = {}
    for path in sorted(Path(directory).glob("launches-*.json")):
        for key, found in json.loads(path.read_text()).items():
            known = launches.setdefault(key, [])
            known += [launch for launch in found if launch not in known]
    jobs = [(key, launch) for key in sorted(launches) for launch in launches[key]]
    with ProcessPoolExecutor(os.cpu_count()) as pool:  # one compile per process at a time
        outcomes = list(pool.map(compile_recorded, *zip(*jobs))) if jobs else []
    def weight(outcome: str) -> int:  # a kernel's answer: its first error, else its first skip, else ok
        return 0 if outcome == "ok" else 1 if outcome.startswith("skipped") else 2

    results = {key: "ok" for key in launches}
    for (key, _), outcome in zip(jobs, outcomes):
        if weight(outcome) > weight(results[key]):
            results[key] = outcome
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("tests.kernels.offline compiles: run it with TRITON_INTERPRET unset")
    sys.exit(main(sys.argv[1]))
