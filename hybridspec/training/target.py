"""Training the embedded target: a small `qwen3_5_moe_text` model trained with transformers' own
implementation (the same code that is the runtime's numerical oracle)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class TargetShape:
    vocab_size: int = 4096
    hidden_size: int = 192
    num_hidden_layers: int = 8  # layers 3 and 7 are attention, the rest GDN
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 48
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_head_dim: int = 48
    num_experts: int = 32
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 192


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 3000
    batch_size: int = 32
    seq_len: int = 512
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    time_limit_s: float = 540.0
    seed: int = 0


def hf_config(shape: TargetShape, eos_id: int):
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim, linear_key_head_dim=shape.linear_head_dim, linear_value_head_dim=shape.linear_head_dim,
        linear_num_key_heads=shape.linear_num_key_heads, linear_num_value_heads=shape.linear_num_value_heads,
        num_experts=shape.num_experts, num_experts_per_tok=shape.num_experts_per_tok,
        moe_intermediate_size=shape.moe_intermediate_size,
        shared_expert_intermediate_size=shape.shared_expert_intermediate_size,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=True, eos_token_id=eos_id, max_position_embeddings=4096, router_aux_loss_coef=0.01,
    )


def windows(tokens: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows [batch, seq_len] of a token stream."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


def lr_at(step: int, settings: TrainSettings, progress: float) -> float:
    """Linear warm-up, then cosine decay over the run's progress (steps or time, whichever binds)."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def evaluate(model, tokens: torch.Tensor, seq_len: int, device, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over consecutive held-out windows."""
    model.eval()
    n = min(max_windows, (len(tokens) - 1) // seq_len)
    losses = []
    with torch.no_grad(), autocast(device):
        for i in range(0, n, 8):
            ids = torch.stack([tokens[j * seq_len : (j + 1) * seq_len] for j in range(i, min(i + 8, n))]).to(device)
            losses.append(float(model(input_ids=ids, labels=ids).loss) * ids.shape[0])
    model.train()
    return sum(losses) / n


def autocast(device):
    """bf16 autocast on CUDA; off elsewhere (CPU training stays fp32)."""
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda")


def train_target(shape: TargetShape, settings: TrainSettings, train: torch.Tensor, held_out: torch.Tensor,
                 eos_id: int, device: str, log=print):
    """Returns (model, record). `train`/`held_out` are 1-D token streams."""
    from transformers import Qwen3_5MoeForCausalLM

    torch.manual_seed(settings.seed)
    model = Qwen3_5MoeForCausalLM(hf_config(shape, eos_id)).to(device)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(settings.seed)
    start, step, history = time.time(), 0, []
    while step < settings.steps:
        elapsed = time.time() - start
        if elapsed > settings.time_limit_s:
            break
        progress = max(step / settings.steps, elapsed / settings.time_limit_s)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings, progress)
        ids = windows(train, settings.batch_size, settings.seq_len, gen).to(device)
        with autocast(device):
            out = model(input_ids=ids, labels=ids, output_router_logits=True)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            history.append({"step": step, "seconds": round(time.time() - start, 1), "loss": float(out.loss.detach())})
            log(f"target step {step} loss {float(out.loss.detach()):.3f} ({time.time() - start:.0f}s)")
        step += 1
    held = evaluate(model, held_out, settings.seq_len, device)
    record = {"shape": asdict(shape), "settings": asdict(settings), "steps_done": step,
              "seconds": round(time.time() - start, 1), "held_out_loss": held,
              "held_out_perplexity": math.exp(held), "history": history,
              "parameters": sum(p.numel() for p in model.parameters())}
    log(f"target: {step} steps, held-out loss {held:.3f} (perplexity {math.exp(held):.1f})")
    return model.eval(), record
