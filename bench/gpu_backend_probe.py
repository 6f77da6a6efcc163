"""Where the triton and torch backends part on the GPU in fp32 (TF32 off): one verification pass of
16 tokens after a prefill on the embedded pair, every layer's output tapped, for the triton backend
as shipped and with one op family at a time put back on its PyTorch reference. The family whose
swap brings the logits back to fp32 rounding (about 3e-7 relative) is the one that parts.

    python3 bench/gpu_backend_probe.py [cpu]   (cpu: under TRITON_INTERPRET=1, a dry run)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import hybridspec  # noqa: E402
from hybridspec.kernels.attention import reference as attention_reference  # noqa: E402
from hybridspec.kernels.gdn import reference as gdn_reference  # noqa: E402
from hybridspec.kernels.moe import reference as moe_reference  # noqa: E402
from hybridspec.kernels.norm import reference as norm_reference  # noqa: E402
from hybridspec.runtime import backends  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from hybridspec.workbench.prompts import load_prompts  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
SWAPS = {
    "shipped": {},
    "norms": {"norm_ops": lambda backend: (norm_reference.offset_rms_norm, norm_reference.gated_rms_norm)},
    "attention": {"attention_ops": lambda backend: (attention_reference.gated_attention,
                                                    attention_reference.norm_rope_store)},
    "router": {"router_ops": lambda backend: (moe_reference.router, moe_reference.norm_router)},
    "experts": {"moe_experts_op": lambda backend: moe_reference.moe_experts},
    "conv": {"gdn_conv_op": lambda backend: gdn_reference.causal_conv_silu},
    "gdn": {"gdn_ops": lambda backend: (gdn_reference.gdn_verify_gated, gdn_reference.gdn_commit)},
}


def features(session, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    target = session.target
    taps, target.feature_layers = target.feature_layers, tuple(range(len(target.layers)))
    try:
        cache = target.new_cache(max_len=1024, tokens_per_pass=64)
        target.prefill(torch.tensor([ids[:-16]], device=DEVICE), cache)
        out = target.forward_pass(torch.tensor([ids[-16:]], device=DEVICE), cache)
        return out.features.clone(), out.logits.clone()
    finally:
        target.feature_layers = taps


def main() -> int:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = load_prompts(Path(hybridspec.__file__).parent / "assets" / "embedded" / "prompts.jsonl", split="test")
    reference = open_session(device=DEVICE, dtype="float32", backend="torch")
    ids = reference.codec.encode(prompts[0].text)
    want_f, want_l = features(reference, ids)
    L, H = len(reference.target.layers), reference.target.cfg.hidden_size
    types = reference.target.cfg.layer_types
    for name, swap in SWAPS.items():
        saved = {attr: getattr(backends, attr) for attr in swap}
        try:
            for attr, fn in swap.items():
                setattr(backends, attr, fn)
            session = open_session(device=DEVICE, dtype="float32", backend="triton")
            got_f, got_l = features(session, ids)
        finally:
            for attr, fn in saved.items():
                setattr(backends, attr, fn)
        w = got_f.shape[1]
        gf, wf = got_f.view(w, L, H), want_f.view(w, L, H)
        per_layer = [float((gf[:, i] - wf[:, i]).norm() / wf[:, i].norm()) for i in range(L)]
        first = next((i for i, e in enumerate(per_layer) if e > 1e-5), None)
        logits = float((got_l - want_l).norm() / want_l.norm())
        where = f"first layer above 1e-5: {first} ({types[first]})" if first is not None else "no layer above 1e-5"
        print(f"{name:10s} logits rel err {logits:.2e}  {where}  per layer: "
              + " ".join(f"{e:.1e}" for e in per_layer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
