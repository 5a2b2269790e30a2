"""Gradients that are not finite never reach the weights: a peer keeps its own NaN batches out of
the group's sum (and stops after many in a row), and a reduced sum that is not finite skips the
optimizer step on every peer alike."""

import concurrent.futures
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from examples.vtrace import learner as learner_module
from examples.vtrace.config import OptimizerConfig
from examples.vtrace.learner import MAX_NONFINITE_BATCHES, AsyncLearner, NonFiniteGradients
from examples.vtrace.optimizer import create_optimizer, step_optimizer
from examples.vtrace.state import LearnerState

FLAGS = SimpleNamespace(
    learner_passes=1, learner_minibatches=1, minibatch_steps=False, seed=0, unroll_length=20,
    batch_size=4,
    virtual_batch_size=4, total_steps=10**6, entropy_cost=0.01, entropy_cost_end=None,
    warmup=0, grad_norm_clipping=40.0,
    optimizer=OptimizerConfig(learning_rate=0.01),
)  # fmt: skip


class Reduced:
    """The Accumulator as step_optimizer sees it: a batch of 4 unrolls was reduced."""

    def get_gradient_stats(self):
        return {"batch_size": 4}

    def zero_gradients(self):
        pass


def model_with_grads(value):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    for param in model.parameters():
        param.grad = torch.full_like(param, value)
    return model


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_reduced_sum_that_is_not_finite_skips_the_step(bad):
    model = model_with_grads(0.1)
    state = LearnerState(model, create_optimizer(FLAGS, model))
    step_optimizer(FLAGS, state, Reduced())  # a finite step first: Adam has state
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    adam = {k: v.clone() for k, v in state.optimizer.state[model.weight].items()}
    model.weight.grad[0, 0] = bad
    stats = step_optimizer(FLAGS, state, Reduced())
    assert not math.isfinite(stats["grad_norm"])
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(adam[k], v) for k, v in state.optimizer.state[model.weight].items())
    assert state.skipped_steps == 1
    assert state.env_train_steps == 2 * 4 * 20  # the samples still count as trained
    for param in model.parameters():  # the next reduced gradients, finite again
        param.grad.fill_(0.1)
    step_optimizer(FLAGS, state, Reduced())
    assert not torch.equal(weights["weight"], model.weight)
    assert state.skipped_steps == 1


def test_skipped_steps_are_checkpointed():
    model = model_with_grads(0.1)
    state = LearnerState(model, create_optimizer(FLAGS, model))
    state.skipped_steps = 3
    saved = state.state_dict()
    again = LearnerState(model, create_optimizer(FLAGS, model))
    again.load_state_dict(saved)
    assert again.skipped_steps == 3
    del saved["skipped_steps"]  # a checkpoint from before the counter
    again.load_state_dict(saved)
    assert again.skipped_steps == 0


class Group:
    def __init__(self):
        self.reduced, self.skipped = 0, 0

    def wants_gradients(self):
        return True

    def model_version(self):
        return 0

    def reduce_gradients(self, batch_size):
        self.reduced += 1

    def skip_gradients(self):
        self.skipped += 1


class Batches:
    def ready(self):
        return True

    def get(self):
        return "batch"


def synchronous(learner):
    """The learner, computing each batch at once on start (no thread): every update() takes in
    the batch the previous one started."""

    def start(batch, sync_id, env_train_steps=0):
        future = concurrent.futures.Future()
        # gradients as the test patched it
        compute = learner_module.gradients
        future.set_result(
            learner_module.checked_gradients(FLAGS, learner.model_copy, batch, None, compute)
        )
        learner.jobs.append((future, sync_id))

    learner.start = start
    return learner


def test_a_peer_keeps_its_nonfinite_gradients_from_the_group(monkeypatch):
    model = model_with_grads(0.0)
    good = [torch.ones_like(p) for p in model.parameters()]
    bad = [g.clone() for g in good]
    bad[1][0] = math.nan
    results = iter([bad, good])
    monkeypatch.setattr(learner_module, "gradients", lambda *_: (next(results, good), {}))
    learner = synchronous(AsyncLearner(FLAGS, model))
    group = Group()
    learner.update(group, 0, Batches())  # starts the NaN batch
    learner.update(group, 0, Batches())  # takes it in: kept out, the round skipped
    assert group.reduced == 0 and group.skipped >= 1
    assert learner.nonfinite_in_a_row == 1
    learner.update(group, 0, Batches())  # the finite batch: reduced, the count starts again
    assert group.reduced == 1 and learner.nonfinite_in_a_row == 0
    assert torch.equal(model.weight.grad, good[0])
    assert learner.take_nonfinite_count() == 1 and learner.take_nonfinite_count() == 0
    learner.close()


def test_a_peer_that_keeps_diverging_stops_with_one_line(monkeypatch):
    model = model_with_grads(0.0)
    bad = [torch.full_like(p, math.inf) for p in model.parameters()]
    monkeypatch.setattr(learner_module, "gradients", lambda *_: (bad, {}))
    learner = synchronous(AsyncLearner(FLAGS, model))
    group = Group()
    learner.update(group, 0, Batches(), alone=True)  # starts the first batch
    for _ in range(MAX_NONFINITE_BATCHES - 1):
        learner.update(group, 0, Batches(), alone=True)
    assert group.reduced == 0 and learner.nonfinite_in_a_row == MAX_NONFINITE_BATCHES - 1
    with pytest.raises(NonFiniteGradients, match="in a row gave NaN or infinite") as error:
        learner.update(group, 0, Batches(), alone=True)
    assert "\n" not in str(error.value) and "learning_rate" in str(error.value)
    learner.close()
