"""TracedGradients (examples/vtrace/loss.py): the learner's gradients in one TorchScript call,
gradients()'s up to rounding for every net it takes (the loss's gradient with respect to the
net's outputs worked out by hand, output_gradients), a trace per batch shape, and the learner
thread using it only where the trace records the whole model."""

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from examples.vtrace import loss, ops
from examples.vtrace.learner import AsyncLearner
from examples.vtrace.models import create_model

REPOSITORY = Path(__file__).resolve().parents[2]
A = 4


def flags(**changes):
    return SimpleNamespace(
        **{
            "reward_clip": 1.0, "discounting": 0.99, "vtrace_lambda": 0.95, "pg_clip": 0.0,
            "normalize_advantages": False, "baseline_cost": 0.5, "entropy_cost": 0.01,
            "minibatch_steps": False, "learner_passes": 1, "learner_minibatches": 1, "seed": 0,
            "batch_size": 4, "virtual_batch_size": 4, **changes,
        }
    )  # fmt: skip


def batch(shape, dtype, T=5, B=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        frames = torch.rand(T + 1, B, *shape, generator=generator) < 0.1
    elif dtype == torch.uint8:
        frames = torch.randint(256, (T + 1, B, *shape), generator=generator, dtype=torch.uint8)
    else:
        frames = torch.randn(T + 1, B, *shape, generator=generator)
    return {
        "state": frames,
        "done": torch.rand(T + 1, B, generator=generator) < 0.2,
        "truncated": torch.rand(T + 1, B, generator=generator) < 0.1,
        "reward": torch.randn(T + 1, B, generator=generator),
        "action": torch.randint(A, (T + 1, B), generator=generator),
        "policy_logits": torch.randn(T + 1, B, A, generator=generator),
    }


NETS = {
    "minatar": ((10, 10, 7), torch.bool, {"minatar_hidden": 32}),
    "mlp": ((6,), torch.float32, {}),
    "nature": ((4, 84, 84), torch.uint8, {"atari_net": "nature_half", "center_frames": True}),
    "resnet": ((4, 84, 84), torch.uint8, {"atari_net": "resnet"}),
}


def same_losses(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-7) or (
            math.isnan(a[key]) and math.isnan(b[key])
        ), key


def loss_inputs(T=6, B=5, seed=0, truncated=True, life_lost=True):
    """actor_critic_loss's tensors: logits far enough from the behaviour's that many ratios
    leave pg_clip's range, and episode ends, time-limit cuts and lost lives in the batch."""
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T + 1, B, A, generator=generator) * 2,
        torch.randn(T + 1, B, generator=generator),
        torch.randn(T + 1, B, A, generator=generator) * 2,
        torch.randint(A, (T + 1, B), generator=generator),
        torch.randn(T + 1, B, generator=generator) * 3,
        torch.rand(T + 1, B, generator=generator) < 0.2,
        torch.rand(T + 1, B, generator=generator) < 0.15 if truncated else None,
        torch.rand(T + 1, B, generator=generator) < 0.15 if life_lost else None,
    )


@pytest.mark.parametrize("pg_clip", [0.0, 0.2])
@pytest.mark.parametrize("normalize_advantages", [False, True])
@pytest.mark.parametrize("cuts", [False, True])
def test_output_gradients_are_autograds_through_the_loss(pg_clip, normalize_advantages, cuts):
    for seed in range(3):
        logits, baselines, *rest = loss_inputs(seed=seed, truncated=cuts, life_lost=cuts)
        settings = (1.0 if seed else 0.0, 0.99, 0.95, pg_clip, normalize_advantages, 0.5, 0.03)
        outputs = [logits.requires_grad_(), baselines.requires_grad_()]
        total, terms = loss.actor_critic_loss(*outputs, *rest, *settings)
        want = torch.autograd.grad(total, outputs)
        *got, got_terms = loss.output_gradients(
            logits.detach(), baselines.detach(), *rest, *settings
        )
        for mine, autograds in zip(got, want, strict=True):
            torch.testing.assert_close(mine, autograds, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(got_terms, terms, rtol=1e-5, atol=1e-7, equal_nan=True)
        # The bootstrap step's outputs only feed the targets, which are constants.
        assert not got[0][-1].any() and not got[1][-1].any()


@pytest.mark.parametrize("pg_clip", [0.0, 0.2])
@pytest.mark.parametrize("normalize_advantages", [False, True])
@pytest.mark.parametrize("cuts", [False, True])
def test_the_compiled_op_gives_output_gradients(pg_clip, normalize_advantages, cuts):
    assert ops.loaded(), f"not built: {ops.library_path()} (make install builds it)"
    op = torch.ops.moolib_examples.vtrace_output_gradients
    for seed, (T, B) in enumerate([(6, 5), (20, 8), (1, 1), (80, 2)]):
        inputs = loss_inputs(T, B, seed=seed, truncated=cuts, life_lost=cuts)
        settings = (1.0 if seed % 2 else 0.0, 0.99, 0.95, pg_clip, normalize_advantages, 0.5, 0.03)
        want = loss.output_gradients(*inputs, *settings)
        got = op(*inputs, *settings)
        for mine, script in zip(got, want, strict=True):
            torch.testing.assert_close(mine, script, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_the_compiled_op_says_what_is_wrong_with_its_inputs():
    assert ops.loaded()
    op = torch.ops.moolib_examples.vtrace_output_gradients
    logits, baselines, behavior, actions, rewards, dones, _, _ = loss_inputs()
    settings = (0.0, 0.99, 0.95, 0.0, False, 0.5, 0.01)
    with pytest.raises(RuntimeError, match="action 4 is outside"):
        op(logits, baselines, behavior, actions.clamp(max=A - 1).fill_(A), rewards, dones,
           None, None, *settings)  # fmt: skip
    with pytest.raises(RuntimeError, match="rewards must be"):
        op(logits, baselines, behavior, actions, rewards.double(), dones, None, None, *settings)
    with pytest.raises(RuntimeError, match="baselines must be"):
        op(logits, baselines[:-1], behavior, actions, rewards, dones, None, None, *settings)


@pytest.mark.parametrize("built", [True, False])
def test_the_learner_step_calls_the_op_where_it_is_built(built, monkeypatch):
    """Without the compiled ops (not built for this torch), output_gradients runs in TorchScript:
    the same gradients up to rounding either way."""
    if built:
        assert ops.loaded(), f"not built: {ops.library_path()} (make install builds it)"
    else:
        monkeypatch.setattr(loss.ops, "loaded", lambda: False)
    model = create_model(SimpleNamespace(shape=(10, 10, 7)), A, minatar_hidden=32)
    traced = loss.TracedGradients(model)
    learner_batch = batch((10, 10, 7), torch.bool)
    grads, _ = traced(flags(), model, learner_batch, 0.02)
    step = next(iter(traced.steps.values()))
    assert ("vtrace_output_gradients" in str(step.loss_gradients.graph)) == built
    expected, _ = loss.gradients(flags(), model, learner_batch, 0.02)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("net", NETS)
def test_the_same_gradients_as_gradients_for_every_net_and_batch_shape(net):
    shape, dtype, options = NETS[net]
    torch.manual_seed(0)
    model = create_model(SimpleNamespace(shape=shape), A, **options)
    traced = loss.TracedGradients(model)
    for settings in [flags(), flags(pg_clip=0.2, normalize_advantages=True)]:
        # B=4, then B=2 (a new trace), then B=4 again (the first trace, on other numbers).
        for seed, B in enumerate([4, 2, 4]):
            learner_batch = batch(shape, dtype, B=B, seed=seed)
            expected, expected_losses = loss.gradients(settings, model, learner_batch, 0.02)
            grads, losses = traced(settings, model, learner_batch, 0.02)
            assert len(grads) == len(expected)
            for got, want in zip(grads, expected, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            same_losses(losses, expected_losses)
    assert len(traced.steps) == 2


def test_it_takes_what_the_trace_records_and_nothing_else():
    minatar = create_model(SimpleNamespace(shape=(10, 10, 4)), A)
    assert loss.TracedGradients.fits(flags(), minatar)
    assert not loss.TracedGradients.fits(flags(minibatch_steps=True), minatar)
    with_lstm = create_model(SimpleNamespace(shape=(10, 10, 4)), A, use_lstm=True)
    assert not loss.TracedGradients.fits(flags(), with_lstm)
    bf16 = create_model(SimpleNamespace(shape=(10, 10, 4)), A, precision="bf16")
    assert not loss.TracedGradients.fits(flags(), bf16)
    assert not loss.TracedGradients.fits(flags(), torch.nn.Linear(3, 2))
    assert isinstance(AsyncLearner(flags(), minatar).compute, loss.TracedGradients)
    assert AsyncLearner(flags(), with_lstm).compute is loss.gradients


class CountTorchCalls(TorchFunctionMode):
    """Counts the torch functions called from Python: each is a point where the calling thread
    takes the GIL (and waits for it while the main thread holds it)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_the_learner_thread_takes_the_gil_a_few_times_per_batch_not_at_every_op():
    model = create_model(SimpleNamespace(shape=(10, 10, 7)), A, minatar_hidden=32)
    traced = loss.TracedGradients(model)
    learner_batch = batch((10, 10, 7), torch.bool)
    traced(flags(), model, learner_batch, 0.01)  # the trace is made on the first call
    calls = {}
    for name, compute in [("python", loss.gradients), ("traced", traced)]:
        with CountTorchCalls() as counter:
            compute(flags(), model, learner_batch, 0.01)
        calls[name] = counter.calls
    assert calls["traced"] <= 3 and calls["python"] >= 15, calls


def test_without_torchscript_it_runs_the_same_modules_in_python(tmp_path):
    """PYTORCH_JIT=0: torch.jit.trace and torch.jit.script hand the modules back as they are."""
    script = """
import sys, torch
from types import SimpleNamespace
sys.path.insert(0, "tests/unit")
from test_traced_gradients import batch, flags
from examples.vtrace import loss, ops
from examples.vtrace.models import create_model
torch.manual_seed(0)
model = create_model(SimpleNamespace(shape=(10, 10, 7)), 4, minatar_hidden=32)
traced = loss.TracedGradients(model)
learner_batch = batch((10, 10, 7), torch.bool)
grads, _ = traced(flags(), model, learner_batch, 0.02)
expected, _ = loss.gradients(flags(), model, learner_batch, 0.02)
assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(grads, expected))
step = next(iter(traced.steps.values()))
print(type(step).__name__, type(step.outputs).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTORCH_JIT": "0"}, cwd=REPOSITORY,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    step, outputs = done.stdout.split()  # not RecursiveScriptModule: the Python classes
    assert step in ("_GradientStep", "_CompiledGradientStep") and outputs == "_Outputs"
