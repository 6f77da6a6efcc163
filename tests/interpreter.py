"""The Triton interpreter without its repeated set-up: only the test processes' speed changes.

Under TRITON_INTERPRET=1, a launch (`GridExecutor.__call__`) rebinds every builtin of the language
modules its kernel sees (`triton.language` and/or `triton.language.core`) to their interpreted form
(`_patch_lang`), runs the grid, and restores them. Every call of a `@triton.jit` function from
inside the kernel (`InterpretedFunction.__call__`: our helpers, and `tl.zeros`, `tl.sum`, … of
triton's standard library) rebinds the modules that function sees again and never restores them:
about 3 ms per call, most of the interpreter's time in kernels that call helpers in their loops.
Here, inside a launch, a rebinding is done once per language module; a call whose modules are all
rebound already skips it, which leaves every builtin bound exactly as the repeated rebinding would.

The interpreter also checks every 32-bit integer add, sub and mul of a kernel for overflow
(`sanitize_overflow`, which compiled kernels do only in debug builds): a widened copy of each
operation and an assert, about a quarter of the interpreter's time. No offset of the tests' shapes
comes near 2**31, so the check cannot fire here; `skip_the_overflow_checks` turns it off.
"""

from __future__ import annotations

import dataclasses
import inspect


class _Launch:
    """A launch's rebinding: restoring it ends the launch."""

    def __init__(self, scope, state: dict):
        self.scope, self.state = scope, state

    def restore(self) -> None:
        self.state["patched"] = None
        self.scope.restore()


class _Nothing:
    def restore(self) -> None:
        pass


def patch_the_language_once_per_launch() -> None:
    """Install the once-per-launch rebinding (module docstring); a no-op without triton, and where
    the interpreter's internals are not the ones described there."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "once_per_launch", False):
        return
    try:
        source = inspect.getsource(interpreter.InterpretedFunction.__call__)
    except (OSError, TypeError):  # triton installed without its sources
        return
    if "_patch_lang(self.fn)" not in source:
        return
    state = {"patched": None}  # ids of the language modules rebound in the running launch

    def patch_lang(fn):
        langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if state["patched"] is None:  # a launch
            scope = original(fn)
            state["patched"] = langs
            return _Launch(scope, state)
        if not langs <= state["patched"]:  # a call inside it that sees a module not rebound yet
            original(fn)
            state["patched"] |= langs
        return _Nothing()

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang


def skip_the_overflow_checks() -> None:
    """Turn off the interpreter's 32-bit overflow checks (module docstring); a no-op without triton
    or where its interpreter has no such option."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow"):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
