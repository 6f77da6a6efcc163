"""The Triton gated attention (under TRITON_INTERPRET on CPU) and its PyTorch reference against a
float64 oracle written from the definition: fp32 within fp32 rounding, bf16 within the error the
reference itself makes; keys past the context never read (NaN there changes nothing); the result
the same whatever the cache's size beyond the context or the span passed; bad arguments named."""

from __future__ import annotations

import math

import pytest
import torch

from hybridspec.kernels.attention import reference
from hybridspec.kernels.attention import triton as attention_triton
from hybridspec.kernels.interpreter import interpreted


def oracle(q, gate, key, value, p: int, causal: bool = True) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over keys 0 … p + t for token t (causal; else 0 … p + T − 1 for
    every token), times sigmoid(gate) (None: no gate), in float64."""
    B, T, H, D = q.shape
    G = H // key.shape[2]
    q, key, value = (t.double() for t in (q, key, value))
    out = torch.empty(B, T, H, D, dtype=torch.float64)
    for t in range(T):
        n = p + t + 1 if causal else p + T
        for h in range(H):
            s = torch.einsum("bd,bnd->bn", q[:, t, h], key[:, :n, h // G]) / math.sqrt(D)
            out[:, t, h] = torch.einsum("bn,bnd->bd", torch.softmax(s, -1), value[:, :n, h // G])
    return (out if gate is None else out * torch.sigmoid(gate.double())).reshape(B, T, H * D)


def _case(B, T, H, H_kv, D, S, p, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, gate = (torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(2))
    key, value = (torch.randn(B, S, H_kv, D, generator=g).to(dtype) for _ in range(2))
    return q, gate, key, value, torch.full((B,), p, dtype=torch.long)


CASES = [  # B, T, H, H_kv, D, S, p
    (1, 1, 4, 2, 48, 40, 0),  # the embedded target's heads, first token
    (1, 1, 16, 2, 256, 300, 217),  # the 35B shapes, decode
    (1, 16, 8, 2, 128, 300, 280),  # a 16-token verification reaching the end of the cache (35B: tests/gpu)
    (1, 5, 8, 8, 64, 70, 33),  # no grouping
    (2, 3, 4, 1, 32, 50, 9),  # batch of 2, one KV head
    (1, 40, 4, 2, 48, 130, 60),  # a prefill chunk: several row blocks
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-T{}-H{}-kv{}-D{}-S{}-p{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_oracle(case, dtype):
    *shape, p = case
    q, gate, key, value, position = _case(*shape, p, dtype, seed=sum(case))
    want = oracle(q, gate, key, value, p)
    got = attention_triton.gated_attention(q, gate, key, value, position)
    ref = reference.gated_attention(q, gate, key, value, position)
    assert got.shape == ref.shape == want.shape and got.dtype == ref.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=2e-6)
    else:  # bf16: the kernel's error no larger than the reference's (up to one more rounding)
        err, err_ref = (got.double() - want).abs().max(), (ref.double() - want).abs().max()
        assert err <= 2 * err_ref + 2 ** -8, (float(err), float(err_ref))


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_the_combine_reads_the_splits_in_chunks_of_any_size(chunk, monkeypatch):
    """The combine's online rescaling across chunks (several chunks, the last one partly dead): the
    oracle's result within fp32 rounding, as with every live split in one chunk."""
    from hybridspec.kernels.attention import combine

    q, gate, key, value, position = _case(1, 3, 8, 2, 64, 600, 450, torch.float32, seed=chunk)  # 15 live splits of 19
    whole = attention_triton.gated_attention(q, gate, key, value, position)
    assert attention_triton.layout(1, 3, 8, 2, 64, 600, 4, q.device)["splits"] > 4 * chunk
    monkeypatch.setattr(combine, "CHUNK", chunk)
    got = attention_triton.gated_attention(q, gate, key, value, position)
    want = oracle(q, gate, key, value, 450)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)


SPLIT_CASES = [  # B, T, H, H_kv, D, S, p: contexts far below the cache, at its end, and a prefill chunk
    (1, 1, 16, 2, 256, 1100, 30), (1, 4, 8, 2, 64, 600, 596), (2, 3, 4, 1, 32, 300, 120), (1, 40, 4, 2, 48, 130, 60),
    (1, 2, 8, 2, 64, 4000, 1500)]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "B{}-T{}-H{}-kv{}-D{}-S{}-p{}".format(*c))
def test_splits_divide_the_live_context(case):
    """The splits divide [0, p + T), not the cache's S positions: the oracle's result within fp32
    rounding, keys past the context never read (NaN there changes nothing), and the splits with keys
    all of the grid's up to one key block each, at least half of it beyond."""
    *shape, p = case
    q, gate, key, value, position = _case(*shape, p, torch.float32, seed=sum(case))
    T, S = shape[1], shape[5]
    key[:, p + T:], value[:, p + T:] = float("nan"), float("nan")
    got = attention_triton.gated_attention(q, gate, key, value, position)
    torch.testing.assert_close(got.double(), oracle(q, gate, key, value, p), rtol=1e-5, atol=2e-6)
    lay = attention_triton.layout(*shape[:5], S, 4, q.device)
    splits, n = lay["splits"], p + T
    live = math.ceil(n / (math.ceil(math.ceil(n / splits) / lay["BN"]) * lay["BN"]))
    wanted = min(splits, math.ceil(n / lay["BN"]))
    assert live <= splits and (live == wanted if n <= splits * lay["BN"] else 2 * live >= splits)


BLOCK_CASES = [  # B, T, H, H_kv, D, S, p: the drafter's block (16 queries, 32 heads on 4 KV heads) over a
    # context far below the cache, at its end, and on a small one
    (1, 16, 32, 4, 128, 700, 100), (1, 16, 8, 2, 64, 300, 284), (2, 4, 4, 1, 32, 50, 0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: "B{}-T{}-H{}-kv{}-D{}-S{}-p{}".format(*c))
def test_block_attention_sees_the_whole_context(case, dtype):
    """The drafter's attention: every query attends to [0, p + T), no gate; the float64 oracle's
    result (bf16: no further from it than the reference), keys past p + T never read."""
    *shape, p = case
    q, _, key, value, position = _case(*shape, p, dtype, seed=sum(case))
    T = shape[1]
    key[:, p + T:], value[:, p + T:] = float("nan"), float("nan")
    got = attention_triton.block_attention(q, key, value, position)
    want = oracle(q, None, key, value, p, causal=False)
    ref = reference.block_attention(q, key, value, position, p + T)
    assert got.shape == ref.shape == want.shape and got.dtype == ref.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=2e-6)
    else:
        err, err_ref = (got.double() - want).abs().max(), (ref.double() - want).abs().max()
        assert err <= 2 * err_ref + 2 ** -8, (float(err), float(err_ref))


def test_keys_past_the_context_are_never_read():
    q, gate, key, value, position = _case(1, 4, 4, 2, 48, 64, 20, torch.float32)
    before = attention_triton.gated_attention(q, gate, key, value, position)
    key[:, 24:], value[:, 24:] = float("nan"), float("nan")  # past p + T
    after = attention_triton.gated_attention(q, gate, key, value, position)
    assert torch.isfinite(after).all() and torch.equal(before, after)


def test_the_span_passed_changes_nothing():
    q, gate, key, value, position = _case(1, 3, 4, 2, 48, 64, 10, torch.float32)
    full = attention_triton.gated_attention(q, gate, key, value, position)
    assert torch.equal(full, attention_triton.gated_attention(q, gate, key, value, position, 13))
    # the reference reads `span` keys; masked beyond the context, the result agrees
    torch.testing.assert_close(reference.gated_attention(q, gate, key, value, position, 13), full, rtol=1e-5, atol=2e-6)


def test_strided_q_and_gate_from_one_projection():
    """q and gate as the two halves of the q projection's heads, the layout the model passes."""
    g = torch.Generator().manual_seed(1)
    qg = torch.randn(1, 5, 4, 2 * 48, generator=g)
    q, gate = qg.chunk(2, dim=-1)
    key, value = (torch.randn(1, 32, 2, 48, generator=g) for _ in range(2))
    position = torch.tensor([7])
    torch.testing.assert_close(attention_triton.gated_attention(q, gate, key, value, position),
                               oracle(q, gate, key, value, 7).float(), rtol=1e-5, atol=2e-6)


def test_layout_depends_on_shapes_only():
    """The grid is fixed by (B, T, S): no more splits than the cache has key blocks, rows covered."""
    for T in (1, 2, 16, 64):
        lay = attention_triton.layout(1, T, 16, 2, 256, 1100, 2, torch.device("cpu"))
        assert 1 <= lay["splits"] <= math.ceil(1100 / lay["BN"]) and lay["row_blocks"] * lay["BM"] >= T * 8


@pytest.mark.parametrize("bad, message", [
    (lambda q, g, k, v: (q, g[:, :1], k, v), "q and gate"),
    (lambda q, g, k, v: (q, g, k[..., :32], v[..., :32]), "does not fit"),
    (lambda q, g, k, v: (q, g, k, v[:, :10]), "key and value"),
    (lambda q, g, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), g, k, v), "contiguous"),
])
def test_bad_arguments_are_named(bad, message):
    q, gate, key, value, position = _case(1, 2, 4, 2, 48, 16, 3, torch.float32)
    with pytest.raises(ValueError, match=message):
        attention_triton.gated_attention(*bad(q, gate, key, value), position)


# ---------------------------------------------------------------- norm_rope_store (q/k norms, RoPE, cache writes)

def _prepare_case(B, T, H, H_kv, D, R, S, p, dtype, seed=0):
    """q as the first half of each head of a q+gate projection and k, v as slices of one fused
    projection (the strided views the model passes); cos, sin [S, R] tables of random frequencies."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, T, H, 2 * D, generator=g) * 3).to(dtype)[..., :D]
    kv = (torch.randn(B, T, 2 * H_kv * D, generator=g) * 3).to(dtype)
    k, v = kv[..., : H_kv * D].view(B, T, H_kv, D), kv[..., H_kv * D :].view(B, T, H_kv, D)
    q_weight, k_weight = (torch.randn(D, generator=g) * 0.2 for _ in range(2))
    angle = torch.arange(S)[:, None].float() * torch.rand(R // 2, generator=g)
    angle = torch.cat((angle, angle), dim=-1)
    cache = torch.full((B, S, H_kv, D), float("nan"), dtype=dtype)
    return (q, k, v, q_weight, k_weight, 1e-6, angle.cos().to(dtype), angle.sin().to(dtype), cache,
            cache.clone(), torch.full((B,), p, dtype=torch.long))


def _prepare_oracle(x, weight, eps, cos, sin):
    """The definition in float64: x / rms(x) · (1 + weight), then RoPE on the first R features."""
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight.double())
    return reference.apply_rope(y, cos.double(), sin.double())


PREPARE_CASES = [  # B, T, H, H_kv, D, R, S, p
    (1, 1, 16, 2, 256, 64, 40, 7),  # the 35B attention layers' heads, decode
    (1, 16, 16, 2, 256, 64, 40, 24),  # a 16-token verification ending at the cache's last slot
    (1, 3, 4, 2, 48, 48, 20, 0),  # the embedded target's shapes (rotary over the whole head)
    (2, 3, 4, 1, 40, 16, 20, 5),  # batch of 2, one KV head, a head dim not a power of two
]


@pytest.mark.parametrize("case", PREPARE_CASES, ids=lambda c: "B{}-T{}-H{}-kv{}-D{}-R{}-S{}-p{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_rope_store_matches_the_reference(case, dtype):
    B, T, H, H_kv, D, R, S, p = case
    args = _prepare_case(*case, dtype, seed=sum(case))
    q, k, v, q_weight, k_weight, eps, cos, sin, key, value, position = args
    ref_key, ref_value = key.clone(), value.clone()
    got = attention_triton.norm_rope_store(*args)
    want = reference.norm_rope_store(q, k, v, q_weight, k_weight, eps, cos, sin, ref_key, ref_value, position)
    assert got.shape == (B, T, H, D) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(value.nan_to_num(), ref_value.nan_to_num())  # values copied bitwise, nothing else
    written = torch.zeros(S, dtype=torch.bool)
    written[p : p + T] = True
    assert not key[:, written].isnan().any() and key[:, ~written].isnan().all()  # only the pass's slots
    assert torch.equal(value[:, written], v)
    got_key, want_key = key[:, written], ref_key[:, written]
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_key, want_key, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.double(), _prepare_oracle(q, q_weight, eps, cos[p : p + T], sin[p : p + T]),
                                   rtol=1e-5, atol=1e-5)
    else:  # three roundings on each path (the norm, the product, the sum), each within 2^-8 of the
        # value rounded on a GPU (to nearest) and 2^-7 under the interpreter (towards zero): within 3
        # (interpreted: 6) units of 2^-8 of the terms' size from the float64 definition
        for out, x, w, ref_out in ((got, q, q_weight, want), (got_key, k, k_weight, want_key)):
            normed = _prepare_oracle(x, w, eps, torch.ones(T, 0), torch.zeros(T, 0))
            partner = torch.cat((normed[..., R // 2 : R], normed[..., : R // 2], normed[..., R:] * 0), dim=-1)
            scale = (normed.abs() + partner.abs()) * 2**-8
            exact = _prepare_oracle(x, w, eps, cos[p : p + T], sin[p : p + T])
            assert ((ref_out.double() - exact).abs() <= 3 * scale).all()
            assert ((out.double() - exact).abs() <= (6 if interpreted() else 3) * scale).all()


@pytest.mark.parametrize("heads", [4, 0], ids=["queries", "keys-only"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_rope_store_with_the_plain_norm_matches_the_reference(heads, dtype):
    """The drafter's form (`offset=False`: weight · normalize(x), RoPE over the whole head) against the
    reference and the float64 definition; with no query heads it writes keys and values only."""
    B, T, H_kv, D, S, p = 1, 16, 2, 48, 40, 9
    args = list(_prepare_case(B, T, 4, H_kv, D, D, S, p, dtype, seed=11))
    args[0] = args[0][:, :, :heads]
    args[3], args[4] = (1 + args[3]).to(dtype), (1 + args[4]).to(dtype)  # plain-norm weights: around one, in k's dtype
    q, k, v, q_weight, k_weight, eps, cos, sin, key, value, position = args
    ref_key, ref_value = key.clone(), value.clone()
    got = attention_triton.norm_rope_store(*args, offset=False)
    want = reference.norm_rope_store(q, k, v, q_weight, k_weight, eps, cos, sin, ref_key, ref_value, position,
                                     offset=False)
    assert got.shape == (B, T, heads, D) and torch.equal(value.nan_to_num(), ref_value.nan_to_num())
    assert not key[:, p : p + T].isnan().any() and key[:, : p].isnan().all() and key[:, p + T :].isnan().all()
    for out, x, w, ref_out in ((got, q, q_weight, want), (key[:, p : p + T], k, k_weight, ref_key[:, p : p + T])):
        # the definition in float64: weight · x / rms(x), then RoPE
        normed = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps) * w.double()
        exact = reference.apply_rope(normed, cos[p : p + T].double(), sin[p : p + T].double())
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)
        else:  # four roundings on each path (the norm, its product with the weight, the products, the sum)
            partner = torch.cat((normed[..., D // 2 :], normed[..., : D // 2]), dim=-1)
            scale = (normed.abs() + partner.abs()) * 2**-8
            assert ((ref_out.double() - exact).abs() <= 4 * scale).all()
            assert ((out.double() - exact).abs() <= (8 if interpreted() else 4) * scale).all()


def test_norm_rope_store_drops_positions_past_the_cache():
    """A pass reaching past the cache writes the slots that exist and nothing else (the resident
    round checks its budget per request; a stray position must not write out of bounds)."""
    args = _prepare_case(1, 5, 4, 2, 48, 16, 8, 5, torch.float32)
    key, value = args[8], args[9]
    guard = torch.full((1, 8, 2, 48), float("nan"))
    key_big = torch.cat((key, guard), dim=1)  # the real cache's slots followed by memory it must not touch
    out = attention_triton.norm_rope_store(*args[:8], key_big[:, :8], value, args[10])
    assert out.shape == (1, 5, 4, 48) and torch.isfinite(out).all()
    assert not key_big[:, 5:8].isnan().any() and key_big[:, :5].isnan().all() and key_big[:, 8:].isnan().all()
    assert torch.equal(value[:, 5:8], args[2][:, :3])


@pytest.mark.parametrize("bad, message", [
    (lambda a: (a[0][:, :1], *a[1:]), "q must be"),
    (lambda a: (*a[:3], a[3][:8], *a[4:]), "norm weights"),
    (lambda a: (*a[:6], a[6][:, :5], a[7][:, :5], *a[8:]), "cos and sin"),
    (lambda a: (*a[:8], a[8][..., :8], a[9][..., :8], a[10]), "does not hold"),
    (lambda a: (*a[:10], a[10].int()), "position"),
    (lambda a: (*a[:3], a[3].double(), *a[4:], False), "plain norm's weights"),
])
def test_norm_rope_store_names_bad_arguments(bad, message):
    args = _prepare_case(1, 2, 4, 2, 48, 16, 16, 3, torch.float32)
    for impl in (attention_triton.norm_rope_store, reference.norm_rope_store):
        with pytest.raises(ValueError, match=message):
            impl(*bad(args))
