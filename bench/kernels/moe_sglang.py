"""SGLang 0.5.23's Triton `fused_moe_kernel` as the routed-experts baseline, run from its wheel
(its self-check and config report: bench/kernels/moe_sglang_check.py).

Nothing of SGLang is copied here: `shared/tools/gdn-baselines.sh` extracts its kernel files into
the git-ignored `.baselines/site`, and `load_sglang_moe` imports them with small stand-ins in
`sys.modules` for the helpers they import from the parts of SGLang that are not extracted.

What `SglangMoE.run` launches is the bf16 sequence of SGLang's `fused_experts_impl`
(`srt/layers/moe/moe_runner/triton_utils/fused_moe.py`) for one GPU (no expert parallelism, so
`filter_expert=False`, no routed scaling factor, no shared expert):
  1. `invoke_fused_moe_kernel(x, w13)`: `fused_moe_kernel`, `[T*k, 2I]` gate|up rows (in the sorted,
     block-padded order when the down projection uses TMA, `c_sorted`);
  2. SiLU-and-mul: SGLang's Triton `act_and_mul_triton` (SGLang's default on CUDA is a JIT CUDA
     `silu_and_mul` built at run time, which is not in the wheel's Python files); with TMA it skips
     the blocks past the padded count, as SGLang's sorted-filtered CUDA activation does;
  3. `invoke_fused_moe_kernel(act, w2)`: `fused_moe_kernel` with the routing weight applied
     (`MUL_ROUTED_WEIGHT`), `[T, k, H]`, with the down config and TMA as SGLang decides;
  4. the sum over k as SGLang does it on CUDA: `torch.add` for k = 2, else SGLang's Triton
     `moe_sum_reduce_triton` (what SGLang runs with PDL for T <= 32; above 32 SGLang runs
     sgl-kernel's CUDA `moe_sum_reduce`, which is not available, and the Triton one stands in).

Configs: SGLang's own `try_get_optimal_moe_config` (nearest-M key of
`E={E},N={I},device_name={name}[,dtype=float32].json` and its `_down` variant, looked up first in the
running Triton's version folder, then in the other version folders present, newest first; else
SGLang's `get_default_config`). Only `configs/triton_3_6_0/` is extracted; the GPU image runs
Triton 3.6.0, so there the lookup is the exact one SGLang does.

Alignment (`SglangMoE.align`, outside the timed region): SGLang's `moe_align_block_size` sizing and
dispatch: for `T*k <= 64` with more than 63 experts on CUDA, the wheel's single-launch Triton
`moe_align_small_numel` (what SGLang runs there); otherwise SGLang calls sgl-kernel's CUDA
`moe_align_block_size`, which is not available, and `align_block_size_torch` below computes the
same result with torch ops (same "+1 bucket" convention, buckets padded to the block size, pad
slots holding `T*k`, stable order inside a bucket where the CUDA op's order is
scheduling-dependent).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import types
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / ".baselines" / "site"
SGLANG_VERSION = "0.5.23"  # what shared/tools/gdn-baselines.sh extracts
SMALL_NUMEL_LIMIT = 64  # moe_align_small_numel.SMALL_NUMEL_LIMIT: T*k up to which SGLang uses it
CUDA_SMALL_BATCH_MAX_BUCKETS = 64  # moe_align_block_size.py: buckets the CUDA small-batch path covers

_TRITON_UTILS = "sglang/srt/layers/moe/moe_runner/triton_utils"
_REQUIRED = (  # the extracted files this module imports or reads
    "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
    "sglang/kernels/ops/moe/moe_align_small_numel.py",
    f"{_TRITON_UTILS}/fused_moe_triton_config.py",
    f"{_TRITON_UTILS}/configs",
)


# ---------------------------------------------------------------------------------------------
# Loading SGLang's files from .baselines/site
# ---------------------------------------------------------------------------------------------


def _stub(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    """Put a stand-in module `name` in sys.modules, or add the attributes it lacks to the one
    already there (bench/kernels/gdn_impls.py installs some of the same stand-ins). With `path`,
    the module is a package whose `__init__` (importing SGLang's registries) is skipped."""
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        sys.modules[name] = module
    for key, value in attrs.items():
        if not hasattr(module, key):
            setattr(module, key, value)
    if path is not None and not hasattr(module, "__path__"):
        module.__path__ = [str(path)]
    return module


class _Flag:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _quantization_unavailable(*args, **kwargs):
    raise NotImplementedError("the fp8/int8 activation quantizers are not loaded: bf16/fp16/fp32 only")


def load_sglang_moe(baselines_dir: str | Path | None = None, *, pdl: bool | None = None) -> types.SimpleNamespace:
    """Import SGLang's Triton MoE files from `baselines_dir` (default `.baselines/site` of the repo).

    Returns a namespace with `kernels` (sglang.kernels.ops.moe.fused_moe_triton_kernels),
    `config` (…/triton_utils/fused_moe_triton_config), `align_small` (…/moe_align_small_numel),
    `pdl` and `root`. Raises FileNotFoundError naming the missing files if the extraction is absent.

    `pdl`: what the stand-in for `sglang.kernels.jit.utils.is_arch_support_pdl` answers (SGLang:
    True on CUDA with compute capability >= 9, which is the default here). The stand-ins are
    process-wide: when bench/kernels/gdn_impls.py has installed its own first, its answer is kept.
    """
    root = Path(baselines_dir) if baselines_dir is not None else BASELINES
    missing = [p for p in _REQUIRED if not (root / p).exists()]
    if missing:
        raise FileNotFoundError(
            f"SGLang {SGLANG_VERSION}'s MoE files are missing under {root}: {', '.join(missing)}; "
            f"run `bash /work/shared/tools/gdn-baselines.sh` from the repo root")
    cuda = torch.cuda.is_available() and torch.version.cuda is not None
    major, minor = torch.cuda.get_device_capability() if cuda else (0, 0)
    if pdl is None:
        pdl = cuda and major >= 9
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))

    sg = root / "sglang"
    helpers = dict(
        is_cuda=lambda: cuda, is_hip=lambda: torch.version.hip is not None,
        is_cpu=lambda: False, is_npu=lambda: False, is_xpu=lambda: False, is_musa=lambda: False,
        cpu_has_amx_support=lambda: False, get_bool_env_var=lambda name, default="false": False,
        is_sm90_supported=lambda: cuda and major == 9,
        get_device_name=lambda device_id=0: torch.cuda.get_device_name(device_id) if cuda else "cpu",
    )
    exec_context = types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=False),
        moe=types.SimpleNamespace(enable_fused_moe_sum_all_reduce=False))
    _stub("sglang.srt", path=sg / "srt")
    _stub("sglang.srt.utils", path=sg / "srt" / "utils", **helpers)
    _stub("sglang.srt.utils.common", **helpers)
    _stub("sglang.srt.environ", envs=types.SimpleNamespace(SGLANG_USE_AITER=_Flag(False)))
    _stub("sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False)
    _stub("sglang.srt.runtime_context", get_exec=lambda: exec_context)
    _stub("sglang.srt.layers.moe.utils", get_moe_padding_size=lambda use_aiter=False: 0)  # fp8 only
    _stub("sglang.srt.layers.moe.moe_runner.triton_utils", path=root / _TRITON_UTILS,
          get_config=lambda: None)  # no `override_config` in effect
    _stub("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: pdl)
    _stub("sglang.kernels.ops.moe", path=sg / "kernels" / "ops" / "moe")
    _stub("sglang.kernels.ops.quantization", path=sg / "kernels" / "ops" / "quantization")
    # The quantized paths (fp8/int8) are not run; their modules import sgl-kernel on CUDA.
    _stub("sglang.kernels.ops.quantization.fp8_kernel", per_token_group_quant_fp8=_quantization_unavailable,
          scaled_fp8_quant=_quantization_unavailable,
          sglang_per_token_group_quant_fp8=_quantization_unavailable)
    _stub("sglang.kernels.ops.quantization.int8_kernel", per_token_group_quant_int8=_quantization_unavailable,
          per_token_quant_int8=_quantization_unavailable,
          sglang_per_token_group_quant_int8=_quantization_unavailable)

    kernels = importlib.import_module("sglang.kernels.ops.moe.fused_moe_triton_kernels")
    config = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config")
    align_small = importlib.import_module("sglang.kernels.ops.moe.moe_align_small_numel")
    if not hasattr(config.logger, "warning_once"):  # SGLang adds it to logging.Logger elsewhere
        config.logger.warning_once = config.logger.warning
    pdl_now = importlib.import_module("sglang.kernels.jit.utils").is_arch_support_pdl()
    return types.SimpleNamespace(kernels=kernels, config=config, align_small=align_small, pdl=pdl_now, root=root)


# ---------------------------------------------------------------------------------------------
# Alignment
# ---------------------------------------------------------------------------------------------


def align_sizes(numel: int, block_size: int, num_experts: int) -> tuple[int, int]:
    """(sorted_token_ids length, expert_ids length) as SGLang's `moe_align_block_size` sizes them."""
    if numel < num_experts + 1:
        padded = numel * block_size
    else:
        padded = numel + (num_experts + 1) * (block_size - 1)
    padded = (padded + 3) // 4 * 4  # the CUDA align kernel pads with int4 stores
    return padded, math.ceil(padded / block_size)


def align_block_size_torch(topk_ids: Tensor, block_size: int, num_experts: int, sorted_token_ids: Tensor,
                           expert_ids: Tensor, num_tokens_post_pad: Tensor) -> None:
    """sgl-kernel's `moe_align_block_size(topk_ids, num_experts + 1, block_size, …,
    pad_sorted_token_ids=True)` in torch ops, writing the three buffers in place, no host sync.

    The (token, slot) pairs `i = t * k + j` are grouped by bucket `ids + 1` (expert -1, filtered,
    is bucket 0), each bucket padded to a multiple of `block_size`, buckets in order; pad slots and
    the rest of `sorted_token_ids` hold `numel`; `expert_ids[b]` is the expert of block b (-1 for
    bucket 0 and for blocks past the padded count); `num_tokens_post_pad[0]` is the padded count.
    Pairs keep their index order inside a bucket (the CUDA op's order there depends on scheduling;
    the kernels do not depend on it)."""
    device = topk_ids.device
    numel = topk_ids.numel()
    bucket = topk_ids.reshape(-1).to(torch.int64) + 1
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    order = torch.sort(bucket, stable=True).indices
    in_order = bucket[order]
    rank = torch.arange(numel, device=device) - (counts.cumsum(0) - counts)[in_order]
    sorted_token_ids.fill_(numel)
    sorted_token_ids.scatter_(0, (ends - padded)[in_order] + rank, order.to(sorted_token_ids.dtype))
    starts = torch.arange(expert_ids.numel(), device=device) * block_size
    owner = torch.searchsorted(ends, starts, right=True)  # the bucket whose padded range holds the block
    expert_ids.copy_(torch.where(starts < ends[-1], owner - 1, -1))
    num_tokens_post_pad[:1].copy_(ends[-1:])


class MoeAlignment(NamedTuple):
    """What `SglangMoE.align` returns and `SglangMoE.run` consumes (buffers stay valid for reuse)."""
    sorted_token_ids: Tensor  # int32 [padded]: pair index t*k+j per sorted slot, T*k for padding
    expert_ids: Tensor  # int32 [padded / BLOCK_SIZE_M]: expert of each block, -1 if unused
    num_tokens_post_padded: Tensor  # int32 [1]
    tokens: int  # T
    config: dict  # the up-projection (w13) config: its BLOCK_SIZE_M is the alignment's block size
    down_config: dict | None  # the down-projection (w2) config, None: the up config
    down_tma: bool  # down projection through TMA descriptors (and the up GEMM writes sorted rows)
    up_tma: bool  # up projection's weights through a TMA descriptor


# ---------------------------------------------------------------------------------------------
# The baseline
# ---------------------------------------------------------------------------------------------


class SglangMoE:
    """SGLang's Triton fused MoE (routed experts only) for one weight set, prepared once.

    w13: [E, 2I, H] (rows 0..I-1 the gate projection, rows I..2I-1 the up projection: SGLang's
         `w13_weight` layout, the same as ours: `gate, up = (x @ w13[e].T).chunk(2)`);
    w2:  [E, H, I]; both contiguous, in the activation dtype (bf16 on the GPU; fp16/fp32 also run,
         fp32 with SGLang's `dtype=float32` config name and its fp16 output rounding, as SGLang does).
    top_k: k. device_name: the name the config lookup uses (default: this GPU's, as SGLang's
    `get_device_name`), e.g. "NVIDIA H200". max_tokens: the largest T `run` takes; every buffer
    `run` writes is allocated here, so `run` can be captured in a CUDA graph.
    aligner: "auto" (SGLang's dispatch, see the module docstring), "triton" (the wheel's
    `moe_align_small_numel` for any T*k) or "torch". use_tma: None (as SGLang decides from the
    configs' USE_TMA and Triton's TensorDescriptor) or a forced answer for the down projection.
    """

    def __init__(self, w13: Tensor, w2: Tensor, top_k: int, device_name: str | None = None, *,
                 max_tokens: int = 256, baselines_dir: str | Path | None = None,
                 aligner: str = "auto", use_tma: bool | None = None, pdl: bool | None = None):
        self.sg = load_sglang_moe(baselines_dir, pdl=pdl)
        E, N2, H = w13.shape
        if w2.shape != (E, H, N2 // 2) or N2 % 2:
            raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} are not [E, 2I, H] and [E, H, I]")
        if not (w13.is_contiguous() and w2.is_contiguous()) or w13.dtype != w2.dtype:
            raise ValueError("w13 and w2 must be contiguous and of one dtype")
        if aligner not in ("auto", "triton", "torch"):
            raise ValueError(f"aligner must be auto, triton or torch, not {aligner!r}")
        self.w13, self.w2, self.top_k = w13, w2, top_k
        self.E, self.I, self.H = E, N2 // 2, H
        self.dtype, self.device = w13.dtype, w13.device
        self.max_tokens, self.aligner, self.use_tma = max_tokens, aligner, use_tma
        if device_name is None:
            device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self.device_name = device_name
        self.config_dtype = self.sg.config.get_config_dtype_str(dtype=self.dtype)  # None, or "float32"
        self.configs = [None] + [self._lookup(t) for t in range(1, max_tokens + 1)]  # by T

        rows = max(c[4] for c in self.configs[1:])  # intermediate rows: the largest any T needs
        numel = max_tokens * top_k
        # Zeroed once: with TMA the pad rows of the sorted layout are read but never written.
        self.cache1 = torch.zeros(rows * 2 * self.I, dtype=self.dtype, device=self.device)
        self.cache2 = torch.zeros(rows * self.I, dtype=self.dtype, device=self.device)
        self.cache3 = torch.empty(numel * H, dtype=self.dtype, device=self.device)
        self.out = torch.empty(max_tokens * H, dtype=self.dtype, device=self.device)
        self.config_files = self._config_files()

    # -- configs ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def device_lookup(self):
        """SGLang's lookup under this instance's device name (its get_moe_configs cache is keyed
        without the name, so it is cleared around the lookup)."""
        cfg = self.sg.config
        saved = cfg.get_device_name
        cfg.get_device_name = lambda device_id=0: self.device_name
        cfg.get_moe_configs.cache_clear()
        try:
            yield cfg
        finally:
            cfg.get_device_name = saved
            cfg.get_moe_configs.cache_clear()

    def _lookup(self, tokens: int):
        """(config, down_config, down_tma, up_tma, intermediate rows) for T = tokens, as
        `_prepare_fused_moe_run` and `_fused_moe_kernel_sequence` derive them."""
        with self.device_lookup() as cfg:
            config, (down_config, _) = cfg.try_get_optimal_moe_config(
                tuple(self.w13.shape), tuple(self.w2.shape), self.top_k, self.config_dtype, tokens,
                return_down_config=True)
        config = dict(config)
        support = self.sg.kernels.support_tensor_descriptor()
        up_tma = bool(config.pop("USE_TMA", False)) and support  # the key never reaches the kernel
        down_tma = down_config is not None and bool(down_config.pop("USE_TMA", False)) and support
        if self.use_tma is not None:
            down_tma = self.use_tma
        numel = tokens * self.top_k
        rows = numel + (min(numel, self.E + 1) * (config["BLOCK_SIZE_M"] - 1) if down_tma else 0)
        return config, down_config, down_tma, up_tma, rows

    def _config_files(self) -> dict[str, str | None]:
        """The config files SGLang's lookup finds for this shape (up, down), or None (default)."""
        import triton

        found = {}
        with self.device_lookup() as cfg:
            base = os.environ.get("SGLANG_MOE_CONFIG_DIR", os.path.dirname(os.path.realpath(cfg.__file__)))
            for down in (False, True):
                name = cfg.get_config_file_name(self.E, self.I, self.config_dtype, [0, 0], False, down_moe=down)
                dirs = sorted((d for d in os.listdir(os.path.join(base, "configs")) if d.startswith("triton_")),
                              key=lambda d: tuple(int(x) for x in d[7:].split("_")), reverse=True)
                exact = "triton_" + triton.__version__.replace(".", "_")
                dirs = [exact] + [d for d in dirs if d != exact]
                path = next((os.path.join(base, "configs", d, name) for d in dirs
                             if os.path.exists(os.path.join(base, "configs", d, name))), None)
                found["down" if down else "up"] = path
        return found

    def config_for(self, tokens: int) -> dict:
        """The configs SGLang uses at T = tokens: {"up": …, "down": …, "down_tma": …, "up_tma": …}."""
        config, down_config, down_tma, up_tma, _ = self.configs[tokens]
        return dict(up=config, down=down_config or config, down_tma=down_tma, up_tma=up_tma)

    # -- alignment -------------------------------------------------------------------------------

    def align(self, ids: Tensor, into: MoeAlignment | None = None) -> MoeAlignment:
        """Sort the (token, slot) pairs of `ids` [T, k] by expert into blocks of the config's
        BLOCK_SIZE_M. Allocates the alignment buffers, or writes into `into`'s (an alignment of
        the same T returned earlier, e.g. one a captured graph reads)."""
        T, k = ids.shape
        if k != self.top_k or not 1 <= T <= self.max_tokens:
            raise ValueError(f"ids {tuple(ids.shape)}: k must be {self.top_k} and T in 1..{self.max_tokens}")
        config, down_config, down_tma, up_tma, _ = self.configs[T]
        block = config["BLOCK_SIZE_M"]
        n_sorted, n_blocks = align_sizes(ids.numel(), block, self.E)
        if into is None:
            into = MoeAlignment(
                torch.empty(n_sorted, dtype=torch.int32, device=ids.device),
                torch.empty(n_blocks, dtype=torch.int32, device=ids.device),
                torch.empty(1, dtype=torch.int32, device=ids.device),
                T, config, down_config, down_tma, up_tma)
        elif into.tokens != T or into.sorted_token_ids.numel() != n_sorted:
            raise ValueError(f"`into` is an alignment of T={into.tokens}, not of T={T}")
        use_triton = self.aligner == "triton" or (
            self.aligner == "auto" and ids.is_cuda and ids.numel() <= SMALL_NUMEL_LIMIT
            and self.E + 1 > CUDA_SMALL_BATCH_MAX_BUCKETS)
        if use_triton:
            into.expert_ids.fill_(-1)  # the kernel writes the used blocks only
            self.sg.align_small.moe_align_small_numel(
                ids, self.E + 1, block, into.sorted_token_ids, into.expert_ids, into.num_tokens_post_padded)
        else:
            align_block_size_torch(ids, block, self.E, into.sorted_token_ids, into.expert_ids,
                                   into.num_tokens_post_padded)
        return into

    # -- the experts -----------------------------------------------------------------------------

    def run(self, x: Tensor, ids: Tensor, weights: Tensor, aligned: MoeAlignment,
            out: Tensor | None = None) -> Tensor:
        """Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) for x [T, H], ids and weights [T, k]: SGLang's
        two `fused_moe_kernel` launches with SiLU-and-mul between and the sum over k. Allocates
        nothing: writes the instance's buffers and returns a view of its output buffer [T, H] (valid
        until the next `run`), or writes `out` [T, H] and returns it."""
        T, k = ids.shape
        if aligned.tokens != T or x.shape != (T, self.H) or weights.shape != (T, k):
            raise ValueError(f"x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights {tuple(weights.shape)}, "
                             f"alignment of T={aligned.tokens}")
        kern = self.sg.kernels
        _, _, _, _, rows = self.configs[T]
        I2, I, H = 2 * self.I, self.I, self.H
        cache1 = self.cache1[: rows * I2].view(rows, I2)
        cache2 = self.cache2[: rows * I].view(rows, I)
        cache3 = self.cache3[: T * k * H].view(T, k, H)
        if out is None:
            out = self.out[: T * H].view(T, H)
        config, down_config, down_tma = aligned.config, aligned.down_config, aligned.down_tma
        import triton.language as tl
        compute_type = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16  # as SGLang
        routing = (weights, ids, aligned.sorted_token_ids, aligned.expert_ids, aligned.num_tokens_post_padded)
        flags = dict(compute_type=compute_type, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                     use_int4_w4a16=False, per_channel_quant=False, block_shape=None, filter_expert=False)

        kern.invoke_fused_moe_kernel(x, self.w13, None, cache1, None, None, None, *routing, False, k, config,
                                     c_sorted=down_tma, b_use_tma=aligned.up_tma, **flags)
        kern.act_and_mul_triton(cache1, cache2, config, topk_ids=None,
                                expert_ids=aligned.expert_ids if down_tma else None,
                                down_moe_use_tma=down_tma, activation="silu")
        target = cache3 if k != 1 else out.unsqueeze(0)  # k = 1: SGLang writes the output directly
        kern.invoke_fused_moe_kernel(cache2, self.w2, None, target, None, None, None, *routing, True, 1,
                                     down_config or config, a_use_tma=down_tma, b_use_tma=down_tma,
                                     fuse_sum_all_reduce=False, router_topk=k, **flags)
        if k == 2:
            torch.add(cache3[:, 0], cache3[:, 1], out=out)
        elif k > 2:
            if self.sg.pdl or T > 32:
                kern.moe_sum_reduce_triton(cache3, out, 1.0)
            else:  # SGLang: torch.compile'd torch.sum for T <= 32 without PDL
                torch.sum(cache3, dim=1, out=out)
        return out
