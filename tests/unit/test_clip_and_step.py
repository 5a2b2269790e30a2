"""optimizer.clip_and_step: gradient clipping and Adam's step in one compiled call give the
weights and the optimizer state that clip_grad_norm_ and Adam.step give, to the bit."""

import io
import math

import pytest
import torch
from torch import nn

from examples.vtrace.optimizer import clip_and_step

MAX_NORM = 40.0


def model_and_adam(**adam):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 16, 3), nn.Flatten(), nn.Linear(16 * 8 * 8, 32))
    return model, torch.optim.Adam(model.parameters(), lr=0.002, **adam)


def give_gradients(model, step):
    """Gradients above the clipping norm every third step, below it otherwise; NaN at step 7."""
    generator = torch.Generator().manual_seed(step)
    for param in model.parameters():
        scale = 100.0 if step % 3 == 0 else 0.01
        param.grad = torch.randn(param.shape, generator=generator) * scale
        if step == 7:
            param.grad[0] = math.nan


def reference_step(model, optimizer):
    norm = float(nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
    if math.isfinite(norm):
        optimizer.step()
    return norm


def step_both(model_a, adam_a, model_b, adam_b, step, without_bias_grad=False):
    """The same gradients to both models; the reference step on a, clip_and_step on b.
    Returns both norms."""
    give_gradients(model_a, step)
    give_gradients(model_b, step)
    if without_bias_grad:
        model_a[2].bias.grad = model_b[2].bias.grad = None
    return reference_step(model_a, adam_a), clip_and_step(adam_b, MAX_NORM)


def assert_same(model_a, adam_a, model_b, adam_b):
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(adam_a.state.values(), adam_b.state.values(), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("adam", [{"fused": True}, {"fused": True, "amsgrad": True}, {}])
def test_the_same_weights_and_state_as_clip_grad_norm_and_adam_step(adam):
    model_a, adam_a = model_and_adam(**adam)
    model_b, adam_b = model_and_adam(**adam)
    norms = []
    for step in range(12):
        expected, norm = step_both(model_a, adam_a, model_b, adam_b, step)
        assert norm == pytest.approx(expected, rel=1e-6, nan_ok=True)
        norms.append(norm)
        assert_same(model_a, adam_a, model_b, adam_b)
    assert math.isnan(norms[7])  # skipped: the state's step counts stay at 11
    assert all(float(state["step"]) == 11 for state in adam_b.state.values())
    assert max(norms[0], norms[3]) > MAX_NORM > max(norms[1], norms[2])


def test_the_compiled_step_is_taken_once_adam_has_state():
    model, adam = model_and_adam(fused=True)
    give_gradients(model, 1)
    clip_and_step(adam, MAX_NORM)  # Adam's own first step makes its state

    def python_step(*args, **kwargs):
        raise AssertionError("Adam.step ran from Python")

    adam.step = python_step
    for step in range(2, 5):
        give_gradients(model, step)
        clip_and_step(adam, MAX_NORM)
    assert all(float(state["step"]) == 4 for state in adam.state.values())


def test_a_checkpointed_state_steps_on_alike():
    model_a, adam_a = model_and_adam(fused=True)
    model_b, adam_b = model_and_adam(fused=True)
    for step in range(3):
        give_gradients(model_a, step)
        reference_step(model_a, adam_a)
    saved = io.BytesIO()  # as through a checkpoint file: no tensor shared with model_a's
    torch.save({"model": model_a.state_dict(), "adam": adam_a.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved)
    model_b.load_state_dict(checkpoint["model"])
    adam_b.load_state_dict(checkpoint["adam"])
    for step in range(3, 6):
        step_both(model_a, adam_a, model_b, adam_b, step)
    assert_same(model_a, adam_a, model_b, adam_b)


def test_a_parameter_without_a_gradient_is_left_as_adam_leaves_it():
    model_a, adam_a = model_and_adam(fused=True)
    model_b, adam_b = model_and_adam(fused=True)
    for step in range(4):
        step_both(model_a, adam_a, model_b, adam_b, step, without_bias_grad=step == 2)
        assert_same(model_a, adam_a, model_b, adam_b)


def transposed_linear_and_adam():
    """model_and_adam's model with its Linear weight stored transposed, as MinAtarNet's is."""
    model, adam = model_and_adam(fused=True)
    linear = model[2]
    linear.weight = nn.Parameter(linear.weight.detach().t().contiguous().t())
    return model, torch.optim.Adam(model.parameters(), lr=0.002, fused=True)


def test_a_weight_stored_transposed_steps_as_a_contiguous_one():
    model_a, adam_a = model_and_adam(fused=True)
    model_b, adam_b = transposed_linear_and_adam()
    assert model_b[2].weight.t().is_contiguous()
    for step in range(6):
        expected, norm = step_both(model_a, adam_a, model_b, adam_b, step)
        assert norm == pytest.approx(expected, rel=1e-5)
    assert model_b[2].weight.t().is_contiguous()  # stepped in place, in its own layout
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_moments_of_a_contiguous_checkpoint_are_paired_by_index_with_a_transposed_weight():
    """A checkpoint of the net from before its weight was stored transposed: Adam's moments
    load contiguous. The step must pair them with the weight's elements by index."""
    model_a, adam_a = model_and_adam(fused=True)
    for step in range(3):
        give_gradients(model_a, step)
        reference_step(model_a, adam_a)
    saved = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "adam": adam_a.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved)
    model_b, adam_b = transposed_linear_and_adam()
    model_b.load_state_dict(checkpoint["model"])
    adam_b.load_state_dict(checkpoint["adam"])
    assert adam_b.state[model_b[2].weight]["exp_avg"].is_contiguous()
    for step in range(3, 6):
        step_both(model_a, adam_a, model_b, adam_b, step)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for a, b in zip(adam_a.state.values(), adam_b.state.values(), strict=True):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-5, atol=1e-9)
