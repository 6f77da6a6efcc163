"""The GDN layer's conv, gated verification and gated norm in one launch (`triton.gdn_mixer`,
`mixer.py`), under TRITON_INTERPRET=1 on CPU tensors: against the reference composition in fp32,
bit-equal to the three Triton launches it replaces in bf16 (every output the layer keeps: the normed
o, the factors, the raw keys, the conv inputs, the folded state), every output written (buffers
poisoned with NaN), its head counters back at zero, its errors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import inspect

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from hybridspec.kernels.gdn.mixer import MAX_HEADS, _counters  # noqa: E402
from hybridspec.kernels.gdn.tuning import SHIPPED  # noqa: E402
from hybridspec.kernels.interpreter import interpreted  # noqa: E402
from hybridspec.kernels.norm.triton import gated_rms_norm  # noqa: E402
from tests.kernels.gdn_cases import FP32_RATIO, MIXER_OUTPUTS, SHAPES, fresh_mixer_buffers, mixer_heads  # noqa: E402
from tests.kernels.gdn_cases import mixer_inputs, verify_table, with_pending  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402

if not interpreted():
    pytest.skip("hybridspec.kernels.gdn.triton was imported before TRITON_INTERPRET=1 was set",
                allow_module_level=True)

def test_signature_matches_reference():
    params = list(inspect.signature(gdn_triton.gdn_mixer).parameters.values())
    assert params[-1].name == "tuning" and params[-1].default is SHIPPED
    assert (inspect.signature(gdn_triton.gdn_mixer).replace(parameters=params[:-1])
            == inspect.signature(reference.gdn_mixer))


# the one-launch kernel at the recurrent program shapes (the shipped 8 and 4 rows among them: dv = 40
# spans five blocks of 8, or a full and a masked block of 32), and the three launches at a split length
CASES = [(1, "recurrent-8x1", None, "grouped"), (2, "recurrent-32x4", None, "ungrouped"),
         (3, "recurrent-4x1", 2, "ungrouped"), (4, "recurrent-8x1", 4, "grouped"),
         (2, "recurrent-32x4", 16, "grouped"), (6, "split", 3, "grouped"),
         (1, "recurrent-32x4", 20, "ungrouped")]  # 20: committed by the reference


@pytest.mark.parametrize(("T", "variant", "T1", "shape"), CASES)
def test_matches_the_reference_in_fp32(T, variant, T1, shape):
    inputs = mixer_inputs(10 * T + len(variant), T, torch.float32, **SHAPES[shape])
    if T1 is not None:
        inputs = with_pending(inputs, T1, seed=T1)
    want, got = fresh_mixer_buffers(inputs), fresh_mixer_buffers(inputs)

    o_ref = reference.gdn_mixer(**want)
    o = gdn_triton.gdn_mixer(**got, tuning=verify_table(variant))

    assert o.shape == o_ref.shape and o.dtype == torch.float32
    assert_close("o (normed, gated)", o_ref, o, FP32_RATIO)
    for name in MIXER_OUTPUTS:
        assert_close(name, want[name], got[name], FP32_RATIO)
    assert_close("state (the pending commit folded in place)", want["state"], got["state"], FP32_RATIO)
    assert not _counters(o.device).any(), "a head's counter was left non-zero"


@pytest.mark.parametrize(("T", "T1", "variant"), [(1, 4, "recurrent-32x4"), (2, None, "recurrent-32x4"),
                                                  (4, 1, "recurrent-8x1")])
def test_equals_the_three_launches_in_bf16(T, T1, variant):
    """bf16 activations as the model has them: the conv, verification and norm kernels launched
    one after another give bit for bit the same outputs (the same arithmetic in the same order);
    the one launch called twice on the same inputs gives them again (its counters reset)."""
    inputs = mixer_inputs(70 + T, T, torch.bfloat16, **SHAPES["grouped"])
    if T1 is not None:
        inputs = with_pending(inputs, T1, seed=80 + T1)
    table = verify_table(variant)
    three, one, again = fresh_mixer_buffers(inputs), fresh_mixer_buffers(inputs), fresh_mixer_buffers(inputs)

    q, k, v = reference.split_heads(gdn_triton.causal_conv_silu(three["x"], three["conv_state"], three["conv_weight"],
                                                                x_out=three["conv_out"]), **mixer_heads(inputs))
    o3, _, _ = gdn_triton.gdn_verify_gated(q, k, v, three["a"], three["b"], three["A_log"], three["dt_bias"],
                                           three["state"], three["scale"], z_out=three["z_out"],
                                           g_out=three["g_out"], k_out=three["k_out"], pending=three.get("pending"),
                                           raw_keys=True, tuning=table)
    o_three = gated_rms_norm(o3, three["gate"], three["norm_weight"], three["norm_eps"])
    o_one = gdn_triton.gdn_mixer(**one, tuning=table)
    o_again = gdn_triton.gdn_mixer(**again, tuning=table)

    assert o_one.dtype == torch.bfloat16
    for name, a, b, c in [("o", o_three, o_one, o_again), ("state", three["state"], one["state"], again["state"])]+[
            (n, three[n], one[n], again[n]) for n in MIXER_OUTPUTS]:
        assert torch.equal(a, b), f"{name}: one launch differs from the three"
        assert torch.equal(b, c), f"{name}: a second call differs from the first"


@pytest.mark.parametrize(("change", "message"), [
    (lambda i: dict(i, x=i["x"][..., 1:]), "x has 383 channels, expected 2·HK·dk"),
    (lambda i: dict(i, gate=i["gate"][:, :, 1:]), "gate has shape"),
    (lambda i: dict(i, norm_weight=i["norm_weight"][1:]), "norm_weight has shape"),
    (lambda i: dict(i, conv_state=i["conv_state"][..., 1:]), "conv_state has shape"),
    (lambda i: dict(i, conv_out=i["conv_out"].float()), "conv_out has dtype torch.float32, expected x's"),
])
def test_bad_arguments_are_named(change, message):
    inputs = change(mixer_inputs(5, 2, torch.bfloat16, **SHAPES["grouped"]))
    for op in (reference.gdn_mixer, gdn_triton.gdn_mixer):
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            op(**inputs)


def test_too_many_heads_are_refused():
    """One arrival counter per (sequence, value head): a call with more heads is refused before launch."""
    inputs = mixer_inputs(6, 1, torch.float32, HK=1, HV=1, dk=16, dv=16, B=MAX_HEADS + 1)
    with pytest.raises(ValueError, match=f"B \\* HV = {MAX_HEADS + 1} heads, at most {MAX_HEADS}"):
        gdn_triton.gdn_mixer(**inputs)
