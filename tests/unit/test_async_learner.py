"""AsyncLearner's thread: what weights it computes on, which gradients it calls finite, and how
soon the main thread hears that it is done."""

import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import examples.vtrace.learner as learner_module
from examples.vtrace.learner import AsyncLearner, checked_gradients

FLAGS = SimpleNamespace(
    learner_passes=1, learner_minibatches=1, minibatch_steps=False, seed=0, batch_size=1,
    virtual_batch_size=1, total_steps=10**6, entropy_cost=0.01, entropy_cost_end=None,
)  # fmt: skip


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("running", torch.zeros(2))


def test_each_batch_starts_on_the_live_weights_and_buffers(monkeypatch):
    model = WithBuffer()
    learner = AsyncLearner(FLAGS, model)
    seen = []

    def record(flags, model_copy, batch, entropy_weight, compute):
        seen.append({k: v.clone() for k, v in model_copy.state_dict().items()})
        return [], {}, True

    monkeypatch.setattr(learner_module, "checked_gradients", record)
    for turn in range(3):
        # As the optimizer and the Accumulator do: the live tensors change in place.
        with torch.no_grad():
            model.linear.weight.add_(1.0)
            model.running.fill_(turn)
        learner.start("batch", sync_id=0)
        learner.jobs[0][0].result(timeout=10)
        for key, value in model.state_dict().items():
            assert torch.equal(seen[-1][key], value), key
        learner.jobs.clear()
    # The thread's model is its own: what it computes on never aliases the live weights.
    assert learner.model_copy.linear.weight.data_ptr() != model.linear.weight.data_ptr()
    learner.close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_one_bad_element_in_any_tensor_makes_the_gradients_not_finite(bad):
    model = nn.Linear(3, 2)
    for index in range(2):
        grads = [torch.ones(2, 3), torch.ones(2)]
        grads[index].view(-1)[1] = bad
        assert (
            checked_gradients(FLAGS, model, "batch", None, lambda *_, g=grads: (g, {}))[2] is False
        )
    large = [torch.full((2, 3), 1e30), torch.ones(2)]
    assert checked_gradients(FLAGS, model, "batch", None, lambda *_: (large, {}))[2] is True


def test_wait_returns_when_the_running_batch_is_done(monkeypatch):
    learner = AsyncLearner(FLAGS, nn.Linear(3, 2))
    release = threading.Event()

    def slow(*_):
        release.wait(10)
        return [], {}, True

    monkeypatch.setattr(learner_module, "checked_gradients", slow)
    learner.start("batch", sync_id=0)
    started = time.monotonic()
    learner.wait(0.05)  # still running: waits the whole timeout
    assert time.monotonic() - started >= 0.04
    threading.Timer(0.05, release.set).start()
    started = time.monotonic()
    learner.wait(10.0)  # wakes when the batch is done, not at the timeout
    assert time.monotonic() - started < 5.0
    assert learner.jobs[0][0].done()
    learner.jobs.clear()
    started = time.monotonic()
    learner.wait(0.02)  # nothing running: a plain sleep
    assert time.monotonic() - started >= 0.015
    learner.close()


class AlwaysABatch:
    def ready(self):
        return True

    def get(self):
        return "batch"


def test_the_next_batch_waits_behind_the_running_one_and_copies_the_weights_when_it_starts(
    monkeypatch,
):
    """The thread goes from batch to batch without waiting for the main thread's hand-over; the
    batch queued behind another computes on the weights of when it starts, so an optimizer step
    made meanwhile (under weights_lock) is in them, and none is copied halfway through one."""
    from helpers import LonePeerAccumulator

    model = nn.Linear(3, 2)
    learner = AsyncLearner(FLAGS, model)
    release_first, seen = threading.Event(), []

    def record(flags, model_copy, batch, entropy_weight, compute):
        seen.append(model_copy.weight.clone())
        if len(seen) == 1:
            release_first.wait(10)
        return [], {}, True

    monkeypatch.setattr(learner_module, "checked_gradients", record)
    accumulator = LonePeerAccumulator()
    try:
        learner.update(accumulator, 0, AlwaysABatch(), alone=True)  # the first batch starts
        learner.update(accumulator, 0, AlwaysABatch(), alone=True)  # the next waits behind it
        learner.update(accumulator, 0, AlwaysABatch(), alone=True)  # no third
        assert len(learner.jobs) == 2
        before = model.weight.clone()
        with learner.weights_lock:
            release_first.set()
            learner.jobs[0][0].result(timeout=10)
            time.sleep(0.1)
            assert len(seen) == 1  # the second has not copied the weights the step changes
            with torch.no_grad():
                model.weight.add_(1.0)  # as the optimizer step does
        learner.jobs[1][0].result(timeout=10)
        assert torch.equal(seen[0], before)
        assert torch.equal(seen[1], before + 1.0)
    finally:
        release_first.set()
        learner.close()
