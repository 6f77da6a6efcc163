"""Static, preallocated caches of the target (DESIGN B.5).

Committed state: attention K/V up to `length`, each GDN layer's conv window and recurrent state.
Round buffers: what a verification pass retains so that the commit can advance every cache through
the `m` accepted tokens without re-running anything: the GDN compact factors `(z, k, g_cum)`
(DESIGN A.7) and the conv inputs of the tokens in flight. No per-token state buffer exists.

Deferred GDN commit: a commit advances the conv windows and attention length at once, but each GDN
layer's state only at that layer's next verification, which applies Eq. 7 to the state it reads
anyway (`gdn_verify_gated(pending=...)`: no commit launch, no second pass over the states). The
factors therefore live in two slots: a pass writes `slot`; a commit flips it, so the committed
round's factors stay in the other slot, `pending[layer]` marks each layer whose state still waits
for them and `accepted` holds their m on the device. `ssm` holds committed states only where
nothing is pending; `HybridTarget.flush` commits what is (before the states are read or copied).

Positions live on the device (`position`, the committed length), so that KV writes, the attention
mask and RoPE read them there; `length` is the host's copy. Eager decoding keeps both in step at
every commit. The GPU-resident round (`runtime/resident.py`, DESIGN B.9) advances only `position`
inside a round and updates `length` once the round's tokens are read; it reads keys over a static
span (`key_span`) masked on the device and folds pending commits over a fixed number of round
tokens (`pending_span`, the tokens past m weigh exactly 0 in Eq. 7), so that every tensor shape
of a round is fixed and the round can be captured as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .config import TargetConfig


@dataclass
class TargetCache:
    key: Tensor  # [n_attn, B, max_len, n_kv, head_dim]
    value: Tensor  # [n_attn, B, max_len, n_kv, head_dim]
    conv: Tensor  # [n_gdn, B, conv_dim, K-1]   last K-1 conv inputs
    ssm: Tensor  # [n_gdn, B, HV, dv, dk] fp32 recurrent state S (o = S q), committed where not pending
    z_slots: Tensor  # [2, n_gdn, B, T_max, HV, dv] fp32   round buffers: compact factors (z / |k|, …
    k_slots: Tensor  # [2, n_gdn, B, T_max, HK, dk] the raw keys, activation dtype (`raw_keys`)
    g_slots: Tensor  # [2, n_gdn, B, T_max, HV] fp32
    conv_in: Tensor  # [n_gdn, B, T_max, conv_dim]   … and conv inputs of the tokens in flight
    accepted: Tensor  # [B] long, m of the pending commit
    position: Tensor  # [B] long, committed tokens, on the device
    conv_columns: Tensor  # [K-1] long: 0 … K−2, the window columns past m that a commit keeps
    length: int = 0  # committed tokens, the host's copy
    key_span: int | None = None  # keys attention reads: None → length + T (host-known), else this static span
    fixed_pending: int | None = None  # round tokens a pending commit covers: None → pending_tokens
    slot: int = 0  # the factor slot the next pass writes
    pending: list[bool] = field(default_factory=list)  # per GDN layer: a commit waits in 1 - slot
    pending_tokens: int = 0  # w of the pass whose commit is pending

    def __post_init__(self):
        if not self.pending:
            self.pending = [False] * self.ssm.shape[0]

    @property
    def z(self) -> Tensor:  # [n_gdn, B, T_max, HV, dv] the slot this pass writes
        return self.z_slots[self.slot]

    @property
    def k(self) -> Tensor:  # [n_gdn, B, T_max, HK, dk]
        return self.k_slots[self.slot]

    @property
    def g_cum(self) -> Tensor:  # [n_gdn, B, T_max, HV]
        return self.g_slots[self.slot]

    @property
    def max_len(self) -> int:
        return self.key.shape[2]

    @property
    def max_tokens_per_pass(self) -> int:
        return self.z_slots.shape[3]

    def pending_commit(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """(z, k, g_cum [B, w, ...], accepted [B]) of the commit still waiting for GDN layer `layer`."""
        if not self.pending[layer]:
            return None
        old, w = 1 - self.slot, self.fixed_pending or self.pending_tokens
        return (self.z_slots[old, layer, :, :w], self.k_slots[old, layer, :, :w], self.g_slots[old, layer, :, :w],
                self.accepted)

    def pending_span(self, start: int, stop: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(z, k, g_cum [stop − start, B, w, ...], accepted [B]) of the pending commit for the GDN layers
        start … stop − 1."""
        old, w = 1 - self.slot, self.fixed_pending or self.pending_tokens
        return (self.z_slots[old, start:stop, :, :w], self.k_slots[old, start:stop, :, :w],
                self.g_slots[old, start:stop, :, :w], self.accepted)

    def waiting_layers(self) -> list[int]:
        """The GDN layers whose state still waits for the pending commit."""
        return [layer for layer, waiting in enumerate(self.pending) if waiting]

    def mark_committed(self, layer: int | None = None) -> None:
        """Layer `layer`'s state (every layer's with None) now includes the pending commit."""
        if layer is None:
            self.pending = [False] * len(self.pending)
        else:
            self.pending[layer] = False

    def defer_commit(self, w: int, m: int | Tensor) -> None:
        """Leave the pass's factors (w tokens, m accepted: a number, or [B] long on the device) for
        every GDN layer's next verification."""
        if any(self.pending):
            raise RuntimeError("a GDN commit is still pending; flush it before deferring another")
        if isinstance(m, Tensor):
            self.accepted.copy_(m)
        else:
            self.accepted.fill_(m)
        self.flip(w)

    def flip(self, w: int) -> None:
        """The host side of a deferred commit: the next pass writes the other factor slot, and every
        GDN layer waits for the factors of this pass (w tokens)."""
        self.slot, self.pending_tokens = 1 - self.slot, w
        self.pending = [True] * len(self.pending)

    def null_commit(self, span: int) -> None:
        """Make every GDN layer wait for a commit that leaves its state as it is (m = 1 over a token
        whose factors z = 0, g_cum = 0: S_1 = e^0 S_0 + 0), over `span` round tokens. The resident
        round starts from it after a flush, so that its first pass folds a pending commit of the
        same shape as every later one."""
        if any(self.pending):
            raise RuntimeError("a GDN commit is still pending; flush it first")
        old = 1 - self.slot
        self.z_slots[old, :, :, :span].zero_()
        self.g_slots[old, :, :, :span].zero_()
        self.accepted.fill_(1)
        self.pending_tokens = span
        self.pending = [True] * len(self.pending)

    def reset(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()
        self.position.zero_()
        self.length = 0
        self.key_span = self.fixed_pending = None
        self.mark_committed()

    @classmethod
    def allocate(
        cls, cfg: TargetConfig, *, max_len: int, tokens_per_pass: int, dtype: torch.dtype, device, batch: int = 1
    ) -> "TargetCache":
        n_attn, n_gdn = len(cfg.attention_layers), len(cfg.gdn_layers)
        hv, hk = cfg.linear_num_value_heads, cfg.linear_num_key_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kv_shape = (n_attn, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        f32 = torch.float32
        return cls(
            key=torch.zeros(kv_shape, dtype=dtype, device=device),
            value=torch.zeros(kv_shape, dtype=dtype, device=device),
            conv=torch.zeros(n_gdn, batch, cfg.gdn_conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=dtype, device=device),
            ssm=torch.zeros(n_gdn, batch, hv, dv, dk, dtype=f32, device=device),
            z_slots=torch.zeros(2, n_gdn, batch, tokens_per_pass, hv, dv, dtype=f32, device=device),
            k_slots=torch.zeros(2, n_gdn, batch, tokens_per_pass, hk, dk, dtype=dtype, device=device),
            g_slots=torch.zeros(2, n_gdn, batch, tokens_per_pass, hv, dtype=f32, device=device),
            conv_in=torch.zeros(n_gdn, batch, tokens_per_pass, cfg.gdn_conv_dim, dtype=dtype, device=device),
            accepted=torch.ones(batch, dtype=torch.long, device=device),
            position=torch.zeros(batch, dtype=torch.long, device=device),
            conv_columns=torch.arange(cfg.linear_conv_kernel_dim - 1, device=device),
        )
