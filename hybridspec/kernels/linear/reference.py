"""Plain-PyTorch references of `triton.rows_linear` (y = x W^T with fp32 sums, rounded once to x's
dtype) and of `triton.linear_conv_silu` (that product, its leading channels through the GDN
layer's causal conv + SiLU)."""

from __future__ import annotations

from torch import Tensor

from hybridspec.kernels.gdn.reference import causal_conv_silu


def rows_linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K], weight [R, K] → [..., R] in x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)


def linear_conv_silu(x: Tensor, weight: Tensor, state: Tensor, conv_weight: Tensor, *,
                     x_out: Tensor) -> tuple[Tensor, Tensor]:
    """x [B, T, K], weight [R, K], state [B, C, KC − 1] (the KC − 1 inputs before x), conv_weight
    [C, 1, KC] → (silu(conv) of the product's leading C channels [B, T, C] (`gdn.reference.
    causal_conv_silu`), the other R − C channels [B, T, R − C]); x_out [B, T, C] receives the leading
    channels' raw product (the round buffer the commit advances the conv window from)."""
    y = rows_linear(x, weight)
    c = conv_weight.shape[0]
    return causal_conv_silu(y[..., :c], state, conv_weight, x_out=x_out), y[..., c:]
