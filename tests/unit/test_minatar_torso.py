"""minatar_torso: the compiled op gives the dense torch ops' outputs and gradients, whether few
or most features fire, whichever way the hidden layer's weight is stored, in the net, through
the learner's traced step and in a checkpoint."""

import math

import pytest
import torch
from torch import nn

from examples.vtrace import loss, minatar_torso, ops
from examples.vtrace.models import MinAtarNet

FRAMES = 168


@pytest.fixture(scope="module")
def op():
    op = minatar_torso.compiled_op()
    assert op is not None, f"not built: {ops.library_path()} (make install builds it)"
    return op


def layers(channels, hidden, conv_bias, seed=0, fc_stored_transposed=True):
    torch.manual_seed(seed)
    conv = nn.Conv2d(channels, 16, kernel_size=3)
    fc = nn.Linear(16 * 8 * 8, hidden)
    with torch.no_grad():
        conv.bias.fill_(conv_bias)
    if fc_stored_transposed:
        fc.weight = nn.Parameter(fc.weight.detach().t().contiguous().t())
    return conv, fc


def frames_of(channels, density, seed=1, dtype=torch.uint8):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(FRAMES, 10, 10, channels, generator=generator) < density).to(dtype)


def outputs_and_gradients(torso, frames, conv, fc):
    params = [conv.weight, conv.bias, fc.weight, fc.bias]
    out = torso(frames, conv, fc)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    return [out, *torch.autograd.grad(out, params, upstream)]


def features_per_frame(frames, conv):
    with torch.no_grad():
        return (conv(frames.permute(0, 3, 1, 2).float()) > 0).flatten(1).sum(1).float().mean()


# (channels, frame density, conv bias, features a frame): few features (the rows, as trained
# nets), and about half of them (the dense products, as a fresh net), for MinAtar's 4-10 channels.
CASES = [(4, 0.05, -0.5, "few"), (7, 0.1, -0.4, "few"), (10, 0.05, -0.3, "few"),
         (4, 0.1, 0.0, "many"), (6, 0.3, 0.0, "many")]  # fmt: skip


@pytest.mark.parametrize("channels,density,conv_bias,fired", CASES)
@pytest.mark.parametrize("stored_transposed", [True, False])
# 256 and 128: the kernels that hold 16 and 8 vectors of weights in registers; 100: 6 single
# vectors and a scalar tail.
@pytest.mark.parametrize("hidden", [256, 128, 100])
def test_same_outputs_and_gradients_as_the_dense_ops(
    op, channels, density, conv_bias, fired, stored_transposed, hidden
):
    conv, fc = layers(channels, hidden, conv_bias, fc_stored_transposed=stored_transposed)
    frames = frames_of(channels, density)
    per_frame = features_per_frame(frames, conv)
    # Each case runs the path it is named for: the rows below a fifth, dense above.
    assert (per_frame < 0.2 * 1024) == (fired == "few"), per_frame
    expected = outputs_and_gradients(minatar_torso.dense_torso, frames, conv, fc)
    got = outputs_and_gradients(minatar_torso.minatar_torso, frames, conv, fc)
    names = ["output", "conv weight's gradient", "conv bias's gradient", "fc weight's gradient",
             "fc bias's gradient"]  # fmt: skip
    for name, want, have in zip(names, expected, got, strict=True):
        assert have.shape == want.shape, name
        scale = want.abs().max().item()
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5 * scale, msg=name)
    # The fc weight's gradient comes back in the weight's own layout (no copy to match).
    assert got[3].stride() == fc.weight.stride()


def test_empty_frames_give_the_bias_path_and_no_gradient_to_silent_weights(op):
    conv, fc = layers(4, 256, conv_bias=-1.0)
    frames = torch.zeros(FRAMES, 10, 10, 4)
    out, conv_w, conv_b, fc_w, fc_b = outputs_and_gradients(
        minatar_torso.minatar_torso, frames, conv, fc
    )
    torch.testing.assert_close(out, fc.bias.detach().expand(FRAMES, -1))
    assert not conv_w.any() and not conv_b.any() and not fc_w.any() and fc_b.any()


def test_nan_in_a_frame_reaches_the_output_as_in_the_dense_ops(op):
    conv, fc = layers(4, 128, conv_bias=-0.5)
    frames = frames_of(4, 0.05, dtype=torch.float32)
    frames[3, 5, 5, 0] = math.nan
    with torch.no_grad():
        dense = minatar_torso.dense_torso(frames, conv, fc)
        sparse = minatar_torso.minatar_torso(frames, conv, fc)
    assert torch.equal(dense.isnan(), sparse.isnan())
    assert sparse[3].isnan().any() and not sparse[4].isnan().any()


@pytest.mark.parametrize(
    "frames,message",
    [
        (torch.zeros(8, 10, 10, 3), "conv_weight must be"),  # 3 channels for a 4-channel conv
        (torch.zeros(8, 10, 10), "frames must be"),
        (torch.zeros(8, 2, 2, 4), "frames must be"),
    ],
)
def test_a_wrong_shape_is_a_clear_error(op, frames, message):
    conv, fc = layers(4, 128, conv_bias=0.0)
    with pytest.raises(RuntimeError, match=message):
        op(frames, conv.weight, conv.bias, fc.weight, fc.bias)


def test_the_net_stores_its_hidden_weight_transposed_and_loads_old_checkpoints():
    net = MinAtarNet((10, 10, 4), 3, hidden_size=256)
    assert net.fc.weight.shape == (256, 1024) and net.fc.weight.t().is_contiguous()
    # A checkpoint of before (a contiguous weight) loads into the transposed layout, values kept.
    old = {key: value.contiguous() for key, value in net.state_dict().items()}
    old["fc.weight"] = torch.randn(256, 1024)
    fresh = MinAtarNet((10, 10, 4), 3, hidden_size=256)
    fresh.load_state_dict(old)
    assert torch.equal(fresh.fc.weight, old["fc.weight"]) and fresh.fc.weight.t().is_contiguous()


def test_the_trace_of_the_net_records_the_op_as_one_call(op):
    """The learner's TracedGradients records the net's forward pass with torch.jit.trace
    (test_traced_gradients.py checks its gradients against the eager ones)."""
    net = MinAtarNet((10, 10, 4), 5, hidden_size=256)
    frames = frames_of(4, 0.1).view(4, FRAMES // 4, 10, 10, 4)
    traced = torch.jit.trace(loss._Outputs(net), (frames,))
    assert "moolib_examples::minatar_torso" in str(traced.inlined_graph)
    torch.testing.assert_close(traced(frames)[0], net({"state": frames})[0]["policy_logits"])
