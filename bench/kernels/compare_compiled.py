"""The GDN kernels' compiled code at two versions of the source, compared offline (no GPU).

    python bench/kernels/compare_compiled.py [--before REV] [--after REV|worktree] [--arch 90]
    PYTHONPATH=TREE python bench/kernels/compare_compiled.py --dump DIR      # one side only
    python bench/kernels/compare_compiled.py --dumps BEFORE_DIR AFTER_DIR    # compare two dumps

Each side's `hybridspec/kernels` is taken from git (REV) or the working tree, imported in a
subprocess of its own, and its shipped kernels are compiled with `triton.compile(ASTSource(...),
target=GPUTarget("cuda", ARCH, 32))` for every shipped configuration, each side with its own
shipped tuning table:
  verify   T = 1..16 (the recurrent kernel up to 4, the split kernel from 5), bf16 and fp32 inputs,
           with and without a pending commit (previous window T' = T), gated, k_out written,
           raw_keys=True, programmatic dependent launch on (as `gdn_verify_gated` launches on SM90)
  commit   window T = 1..16, bf16 and fp32 keys (z and g_cum fp32)
Shapes are those of Qwen3.6-35B-A3B's GDN layers (HV = 32, HK = 16, dk = dv = 128); pointers are
specialised as 16-byte aligned, integers are not specialised. PTX is compared without its debug
lines (.loc, .file, the debug sections) and with the kernel's name replaced; SASS (from the bundled
ptxas and cuobjdump) with the kernel's name replaced. Needs a triton matching the GPU's (3.6) and
torch (a CPU build is enough) in the running interpreter; prints one line per configuration and
exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPE = dict(HV=32, HK=16, DK=128, DV=128)


def configurations() -> list[dict]:
    out = []
    for T in range(1, 17):
        for dtype in ("bf16", "fp32"):
            for fold in (False, True):
                out.append(dict(kind="verify", T=T, dtype=dtype, fold=fold))
            out.append(dict(kind="commit", T=T, dtype=dtype))
    return out


# ---------------------------------------------------------------------------------------------
# one side, in its own process: compile every configuration, write normalised PTX and SASS
# ---------------------------------------------------------------------------------------------


def _kernels_of_tree():
    """(split kernel, recurrent kernel, commit kernel, verify tuning of T, commit tuning of T) of
    the `hybridspec.kernels.gdn` importable now: the split modules, or the single triton.py."""
    import importlib

    gdn = importlib.import_module("hybridspec.kernels.gdn.triton")
    if hasattr(gdn, "VERIFY_TUNING"):  # one module with module-level tables
        return (gdn._gdn_verify_split_kernel, gdn._gdn_verify_recurrent_kernel, gdn._gdn_commit_kernel,
                gdn.VERIFY_TUNING.__getitem__, gdn.COMMIT_TUNING.__getitem__)
    split = importlib.import_module("hybridspec.kernels.gdn.verify_split")
    recurrent = importlib.import_module("hybridspec.kernels.gdn.verify_recurrent")
    commit = importlib.import_module("hybridspec.kernels.gdn.commit")
    return (split.gdn_verify_split_kernel, recurrent.gdn_verify_recurrent_kernel, commit.gdn_commit_kernel,
            gdn.SHIPPED.verify.__getitem__, gdn.SHIPPED.commit.__getitem__)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _verify_source(fn, tuning, c: dict):
    """Signature and constants of one verify launch (`gdn_verify_gated(raw_keys=True)`)."""
    T, dt, fold = c["T"], c["dtype"], c["fold"]
    pointers = dict(q=dt, k=dt, v=dt, g=dt, beta=dt, state="fp32", o=dt, z="fp32", g_cum="fp32", A_log="fp32",
                    dt_bias="fp32", k_out=dt, pz="fp32", pk=dt if fold else "fp32", pg="fp32",
                    accepted="i64" if fold else "fp32")
    pt = T if fold else 0
    recurrent = tuning.method == "recurrent"
    constants = dict(T=T, HV=SHAPE["HV"], GROUP=SHAPE["HV"] // SHAPE["HK"], DK=SHAPE["DK"], DV=SHAPE["DV"],
                     BK=SHAPE["DK"], BV=tuning.block_v, GATED=True, WRITE_K=True, EPS=1e-6, RAW_KEYS=True,
                     USE_GDC=True, FOLD=fold, WIDEN=False, FENCE=True, LATE_KEYS=getattr(tuning, "late_keys", False),
                     EARLY_STATE=getattr(tuning, "early_state", False),
                     BT=_pow2(T) if recurrent else 16, BJ=_pow2(max(pt, 1)) if recurrent else max(16, _pow2(pt)),
                     PREFETCH=True, SOLVE_DOT="ieee", SPLIT=2 if dt == "bf16" else 0, PIECES=dt == "bf16")
    return pointers, constants, dict(num_warps=tuning.num_warps, num_stages=1, launch_pdl=True)


def _commit_source(fn, tuning, c: dict):
    T, dt = c["T"], c["dtype"]
    pointers = dict(states="fp32", z="fp32", k=dt, g_cum="fp32", accepted="i64")
    constants = dict(T=T, HV=SHAPE["HV"], GROUP=SHAPE["HV"] // SHAPE["HK"], DK=SHAPE["DK"], DV=SHAPE["DV"],
                     BK=SHAPE["DK"], BV=tuning.block_v, UNROLL=False, USE_GDC=False, DOT=tuning.method == "dot",
                     BT=max(16, _pow2(T)), DOT_PRECISION="tf32x3")
    return pointers, constants, dict(num_warps=tuning.num_warps)


def _normalise_ptx(ptx: str, name: str) -> str:
    """Without the debug sections, .loc / .file lines and comments (whose padding follows the
    kernel name's length); the kernel's name replaced."""
    ptx = ptx.split("\t.section\t.debug")[0].replace(name, "KERNEL")
    lines = [re.sub(r"\s*//.*$", "", line) for line in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", line)]
    return "\n".join(line for line in lines if line.strip())


def _sass(cubin: bytes, name: str, tools: Path) -> tuple[str, int]:
    """(SASS with the kernel's name replaced, registers per thread) from the bundled cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tools / "cuobjdump"), "-sass", "-res-usage", f.name], check=True,
                              capture_output=True, text=True).stdout
    registers = int(re.search(r"REG:(\d+)", text).group(1))
    return text.replace(name, "KERNEL").replace(f.name, "CUBIN"), registers


def dump(out: Path, arch: int) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    split, recurrent, commit, verify_tuning, commit_tuning = _kernels_of_tree()
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    target = GPUTarget("cuda", arch, 32)
    results = {}
    for c in configurations():
        if c["kind"] == "verify":
            tuning = verify_tuning(c["T"])
            fn = recurrent if tuning.method == "recurrent" else split
            pointers, constants, options = _verify_source(fn, tuning, c)
        else:
            tuning = commit_tuning(c["T"])
            fn = commit
            pointers, constants, options = _commit_source(fn, tuning, c)
        signature, constexprs, attrs = {}, {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in pointers:
                signature[name] = "*" + pointers[name]
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif fn.params[i].is_constexpr:
                signature[name] = "constexpr"
                constexprs[name] = constants[name]
            else:
                signature[name] = "fp32" if name == "scale" else "i32"
        kernel = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs), target=target,
                                options=options)
        key = "-".join(str(v) for v in c.values())
        (out / f"{key}.ptx").write_text(_normalise_ptx(kernel.asm["ptx"], kernel.name))
        sass, registers = _sass(kernel.asm["cubin"], kernel.name, tools)
        (out / f"{key}.sass").write_text(sass)
        results[key] = dict(kernel=fn.__name__, method=getattr(tuning, "method", None), block_v=tuning.block_v,
                            num_warps=tuning.num_warps, registers=registers, shared=kernel.metadata.shared)
        print(f"{key}: {fn.__name__} {results[key]}", flush=True)
    (out / "index.json").write_text(json.dumps(results, indent=1))


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------


def _tree(rev: str, workdir: Path) -> Path:
    """A directory holding `hybridspec/kernels` at REV (only the package's kernels are imported)."""
    if rev == "worktree":
        return ROOT
    tree = workdir / rev.replace("/", "_")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hybridspec/__init__.py", "hybridspec/kernels"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _side(rev: str, workdir: Path, arch: int) -> tuple[Path, subprocess.Popen]:
    """Start the dump of one side in a process of its own (both sides compile at once)."""
    out = workdir / f"out-{rev.replace('/', '_')}"
    out.mkdir()
    tree = _tree(rev, workdir)
    env = dict(os.environ, PYTHONPATH=str(tree), TRITON_CACHE_DIR=str(workdir / f"cache-{out.name}"))
    env.pop("TRITON_INTERPRET", None)
    return out, subprocess.Popen([sys.executable, __file__, "--dump", str(out), "--arch", str(arch)], env=env,
                                 cwd=workdir, stdout=subprocess.DEVNULL)


def _text(path: Path) -> str:
    """A dump's PTX or SASS, normalised again (dumps written before a change of the rules)."""
    text = path.read_text()
    return _normalise_ptx(text, "KERNEL") if path.suffix == ".ptx" else text


def compare(before: Path, after: Path) -> int:
    """Print one line per configuration; the number of configurations whose PTX or SASS differ."""
    index_before = json.loads((before / "index.json").read_text())
    index_after = json.loads((after / "index.json").read_text())
    differ = 0
    for key, meta in index_before.items():
        same = {ext: _text(before / f"{key}.{ext}") == _text(after / f"{key}.{ext}") for ext in ("ptx", "sass")}
        differ += not all(same.values())
        print(f"{key:22s} {meta['kernel']:30s} -> {index_after[key]['kernel']:28s} regs "
              f"{meta['registers']}/{index_after[key]['registers']}  PTX {'same' if same['ptx'] else 'DIFFERS'}"
              f"  SASS {'same' if same['sass'] else 'DIFFERS'}")
    return differ


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="HEAD", help="git revision (default HEAD)")
    parser.add_argument("--after", default="worktree", help="git revision or 'worktree' (default)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90, sm_90a)")
    parser.add_argument("--dump", type=Path, help="compile the importable tree's kernels into this folder only")
    parser.add_argument("--dumps", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two folders written by --dump instead of compiling")
    args = parser.parse_args(argv)
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        dump(args.dump, args.arch)
        return 0
    import triton

    if args.dumps:
        differ, count, label = compare(*args.dumps), len(configurations()), " vs ".join(map(str, args.dumps))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            sides = [_side(rev, Path(tmp), args.arch) for rev in (args.before, args.after)]
            if any(process.wait() for _, process in sides):
                sys.exit("a side failed to compile")
            differ, count = compare(sides[0][0], sides[1][0]), len(configurations())
            label = f"{args.before} vs {args.after}"
    print(f"triton {triton.__version__}, sm_{args.arch}: {count} configurations, {count - differ} identical, "
          f"{differ} differ ({label})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
