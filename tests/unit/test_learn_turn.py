"""experiment.learn: a lone peer's hand-over of gradients, its optimizer step and the start of
the learner's next minibatch happen in one turn of the loop, with no turn of acting between."""

from types import SimpleNamespace

import torch
from helpers import LonePeerAccumulator, Queue, linear_learner_state

from examples.vtrace.config import OptimizerConfig
from examples.vtrace.experiment import learn
from examples.vtrace.learner import AsyncLearner

FLAGS = SimpleNamespace(
    learner_passes=1, learner_minibatches=1, minibatch_steps=False, seed=0, unroll_length=20,
    batch_size=1,
    virtual_batch_size=1, total_steps=10**6, warmup=0, grad_norm_clipping=40.0,
    entropy_cost=0.01, entropy_cost_end=None,
    optimizer=OptimizerConfig(learning_rate=0.001),
)  # fmt: skip


class Counts:
    def __init__(self):
        self.counts = {}

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n


def test_one_turn_hands_over_steps_and_starts_the_next_minibatch():
    state = linear_learner_state()
    model = state.model
    learner = AsyncLearner(FLAGS, model)
    started, weights_at_start = [], []

    def start(
        batch, sync_id, env_train_steps=0
    ):  # no thread: a started batch's gradients are ready at once
        started.append(batch)
        weights_at_start.append(model.weight.detach().clone())
        learner.finished = batch, sync_id

    learner.start = start
    grads = [torch.ones(1, 2), torch.ones(1)]
    queue, accumulator = Queue([grads, grads, grads]), LonePeerAccumulator()
    group = SimpleNamespace(members=lambda: ["me"], sync_id=lambda: 0)
    log = Counts()
    before = model.weight.detach().clone()

    # The first turn starts the learner; nothing to hand over yet.
    assert learn(FLAGS, learner, accumulator, group, queue, state, log) is None
    assert len(started) == 1
    # The next: those gradients go to the group, its sum is in, the optimizer steps, and the
    # learner is on its next minibatch, all before this turn ends.
    stepped = learn(FLAGS, learner, accumulator, group, queue, state, log)
    assert stepped is not None and stepped["virtual_batch_size"] == 1
    assert accumulator.version == 1 and not torch.equal(model.weight, before)
    assert len(started) == 2
    # ... on the weights this step made: PPO's minibatches each start where the last one left
    # the model, none on the weights of the step before.
    assert torch.equal(weights_at_start[1], model.weight)
    assert log.counts.get("dropped_batches", 0) == 0
    learner.close()
