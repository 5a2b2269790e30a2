"""TracedGradients (examples/vtrace/loss.py): the learner's gradients in one TorchScript call,
equal to the last bit to gradients()'s for every net it takes, a trace per batch shape, and the
learner thread using it only where the trace records the whole model."""

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from examples.vtrace import loss
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
        assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), key


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
                assert torch.equal(got, want)
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
from examples.vtrace import loss
from examples.vtrace.models import create_model
torch.manual_seed(0)
model = create_model(SimpleNamespace(shape=(10, 10, 7)), 4, minatar_hidden=32)
traced = loss.TracedGradients(model)
learner_batch = batch((10, 10, 7), torch.bool)
grads, _ = traced(flags(), model, learner_batch, 0.02)
expected, _ = loss.gradients(flags(), model, learner_batch, 0.02)
assert all(torch.equal(a, b) for a, b in zip(grads, expected))
step = next(iter(traced.steps.values()))
print(type(step).__name__, type(step.outputs).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTORCH_JIT": "0"}, cwd=REPOSITORY,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_GradientStep", "_Outputs"]
