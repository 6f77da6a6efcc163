"""One comparison helper for every kernel test (in the style of flash-linear-attention)."""

import torch
from torch import Tensor


def _rms(x: Tensor) -> float:
    return x.square().mean().sqrt().item()


def assert_close(name: str, ref: Tensor, got: Tensor, ratio: float, atol: float = 1e-7) -> None:
    """Assert rms(ref - got) <= ratio * rms(ref) + atol, after checking shape and finiteness.

    Both tensors are compared in float64. `atol` is an absolute floor for references that are
    (nearly) zero; the failure message names the output and the measured errors.
    """
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    ref, got = ref.detach().double().cpu(), got.detach().double().cpu()
    assert torch.isfinite(ref).all(), f"{name}: the reference contains NaN or Inf"
    assert torch.isfinite(got).all(), f"{name}: contains {(~torch.isfinite(got)).sum()} NaN/Inf values"
    err, base = _rms(ref - got), _rms(ref)
    max_abs = (ref - got).abs().max().item()
    assert err <= ratio * base + atol, (
        f"{name}: relative RMS error {err / max(base, 1e-30):.3e} > {ratio:.1e} "
        f"(rms error {err:.3e}, rms reference {base:.3e}, max abs error {max_abs:.3e})"
    )
