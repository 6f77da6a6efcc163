"""Training the embedded DFlash drafter against the frozen target (DESIGN B.4).

One training forward evaluates many blocks of a sequence at once: the context of block b is the
target's features at positions < a_b (its anchor), the block is [token a_b, MASK × (bs − 1)] at
positions a_b … a_b + bs − 1, and its labels are the next bs − 1 tokens. Keys are
[context (all S positions) ; every block], with a mask that lets each block see only its own
context prefix and itself — the same function `DFlashDrafter.propose` computes with its cache."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime.config import DrafterConfig, default_target_layer_ids
from ..runtime.drafter import DFlashDrafter
from ..runtime.layers.rope import apply_rope, rope_cos_sin
from .target import _autocast, lr_at


@dataclass(frozen=True)
class DrafterShape:
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    block_size: int = 16


@dataclass(frozen=True)
class DrafterSettings:
    steps: int = 3000
    batch_size: int = 32
    seq_len: int = 512
    blocks_per_seq: int = 16
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    position_decay: float = 0.85  # loss weight of draft position i ∝ decay^(i−1)
    time_limit_s: float = 300.0
    seed: int = 0


def drafter_config(shape: DrafterShape, *, hidden_size: int, target_layers: int, vocab_size: int,
                   mask_token_id: int) -> DrafterConfig:
    return DrafterConfig(
        hidden_size=hidden_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
        head_dim=hidden_size // shape.num_attention_heads, intermediate_size=shape.intermediate_size,
        block_size=shape.block_size, mask_token_id=mask_token_id,
        target_layer_ids=tuple(default_target_layer_ids(target_layers, shape.num_hidden_layers)),
        rope_theta=10000.0, vocab_size=vocab_size,
    )


def block_logits(drafter: DFlashDrafter, features: Tensor, tokens: Tensor, anchors: Tensor) -> Tensor:
    """features [B, S, n_taps·hidden], tokens [B, S], anchors [B, n] (1 ≤ a ≤ S − bs)
    → logits [B, n, bs − 1, vocab] of the draft positions of every block."""
    embed, lm_head = drafter._target
    cfg = drafter.cfg
    B, S = tokens.shape
    n, bs = anchors.shape[1], cfg.block_size
    offsets = torch.arange(bs, device=tokens.device)
    positions = (anchors[:, :, None] + offsets).reshape(B, n * bs)  # [B, n·bs]
    block = torch.full((B, n, bs), cfg.mask_token_id, dtype=torch.long, device=tokens.device)
    block[:, :, 0] = tokens.gather(1, anchors)
    x = embed(block.reshape(B, n * bs)).to(drafter.fc.weight.dtype)  # [B, n·bs, hidden]
    ctx = drafter.hidden_norm(drafter.fc(features.to(drafter.fc.weight.dtype)))  # [B, S, hidden]
    ctx_rope = rope_cos_sin(torch.arange(S, device=tokens.device), drafter.inv_freq, x.dtype)
    blk_rope = rope_cos_sin(positions, drafter.inv_freq, x.dtype)
    # block (i, j) sees context positions < a_i and every slot of block i
    block_id = torch.arange(n, device=tokens.device).repeat_interleave(bs)  # [n·bs]
    sees_ctx = torch.arange(S, device=tokens.device)[None, None, :] < anchors.repeat_interleave(bs, 1)[:, :, None]
    sees_blk = (block_id[:, None] == block_id[None, :]).expand(B, -1, -1)
    mask = torch.cat((sees_ctx, sees_blk), dim=-1)[:, None]  # [B, 1, n·bs, S + n·bs]
    for layer in drafter.layers:
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(att.q_norm(att.q_proj(h).view(B, n * bs, att.n_heads, att.head_dim)), *blk_rope)
        k_ctx, v_ctx = att.key_value(ctx, ctx_rope)
        k_blk, v_blk = att.key_value(h, blk_rope)
        groups = att.n_heads // att.n_kv
        keys = torch.cat((k_ctx, k_blk), 1).transpose(1, 2).repeat_interleave(groups, 1)
        values = torch.cat((v_ctx, v_blk), 1).transpose(1, 2).repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        x = x + att.o_proj(out.transpose(1, 2).reshape(B, n * bs, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = drafter.norm(x).view(B, n, bs, -1)[:, :, 1:]
    return lm_head(x).float()


def target_features(target, ids: Tensor, layer_ids: tuple[int, ...]) -> Tensor:
    """Hidden states after the listed target layers, concatenated: [B, S, n_taps·hidden]."""
    with torch.no_grad():
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i + 1] for i in layer_ids], dim=-1)


def train_drafter(drafter: DFlashDrafter, target, settings: DrafterSettings, train: Tensor, held_out: Tensor,
                  device: str, log=print) -> dict:
    """Trains `drafter` in place against the frozen HF `target`; returns the training record."""
    from .target import windows

    torch.manual_seed(settings.seed)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    params = [p for p in drafter.parameters()]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    D = drafter.cfg.block_size - 1
    weights = settings.position_decay ** torch.arange(D, dtype=torch.float32, device=device)
    weights = weights / weights.sum()
    layer_ids = drafter.cfg.target_layer_ids
    drafter.train()
    start, step, history = time.time(), 0, []

    def loss_on(ids: Tensor) -> tuple[Tensor, Tensor]:
        B, S = ids.shape
        anchors = torch.randint(1, S - D - 1, (B, settings.blocks_per_seq), generator=gen).to(device)
        with _autocast(device):
            feats = target_features(target, ids, layer_ids)
            logits = block_logits(drafter, feats, ids, anchors)  # [B, n, D, V]
        labels = ids.gather(1, (anchors[:, :, None] + torch.arange(1, D + 1, device=device)).reshape(B, -1))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        ce = ce.view(B, -1, D)
        hits = (logits.argmax(-1) == labels.view(B, -1, D)).float()
        return (ce * weights).sum(-1).mean(), hits.mean((0, 1))

    while step < settings.steps:
        elapsed = time.time() - start
        if elapsed > settings.time_limit_s:
            break
        progress = max(step / settings.steps, elapsed / settings.time_limit_s)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings, progress)
        ids = windows(train, settings.batch_size, settings.seq_len, gen).to(device)
        loss, _ = loss_on(ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0:
            history.append({"step": step, "seconds": round(time.time() - start, 1), "loss": float(loss.detach())})
            log(f"drafter step {step} loss {float(loss.detach()):.3f} ({time.time() - start:.0f}s)")
        step += 1
    drafter.eval()
    with torch.no_grad():
        ids = windows(held_out, min(16, settings.batch_size), settings.seq_len, torch.Generator().manual_seed(99))
        loss, hit = loss_on(ids.to(device))
    record = {"settings": asdict(settings), "steps_done": step, "seconds": round(time.time() - start, 1),
              "held_out_loss": float(loss), "held_out_top1_by_position": [round(float(h), 4) for h in hit],
              "history": history, "parameters": sum(p.numel() for p in params)}
    log(f"drafter: {step} steps, held-out weighted loss {float(loss):.3f}, top-1 at positions 1..3 "
        f"{[round(float(h), 3) for h in hit[:3]]}")
    return record
