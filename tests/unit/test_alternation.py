"""max_queued_batches=0: acting waits while the learner learns, so that every learner batch is
acted by the weights that finished learning the one before (PPO's alternation); with 1 or more,
acting goes on as soon as the learner has taken its batch from the queue."""

from types import SimpleNamespace

import pytest
import torch
from helpers import LonePeerAccumulator, linear_learner_state

from examples.vtrace.actor import LearnerQueue
from examples.vtrace.config import OptimizerConfig
from examples.vtrace.experiment import learn
from examples.vtrace.learner import AsyncLearner

PASSES, MINIBATCHES = 2, 2


def flags(max_queued_batches):
    return SimpleNamespace(
        max_queued_batches=max_queued_batches, learner_passes=PASSES,
        learner_minibatches=MINIBATCHES, minibatch_steps=False, seed=0, unroll_length=2,
        batch_size=2, virtual_batch_size=1, total_steps=10**6, warmup=0, entropy_cost=0.01,
        entropy_cost_end=None,
        grad_norm_clipping=40.0, optimizer=OptimizerConfig(learning_rate=0.001),
    )  # fmt: skip


def unroll():
    """One env's unroll of T+1 = 3 steps, as Actor.step returns it."""
    return {"state": torch.zeros(3, 1, 2), "action": torch.zeros(3, 1, dtype=torch.int64)}


def a_turn_at_a_time(max_queued_batches):
    """The loop's learning side, one turn at a time after one learner batch was queued: whether
    acting waits after each turn, and the optimizer steps taken by then."""
    state = linear_learner_state()
    model = state.model
    settings = flags(max_queued_batches)
    learner = AsyncLearner(settings, model)

    def start(
        batch, sync_id, env_train_steps=0
    ):  # no thread: a started minibatch's gradients are ready at once
        learner.finished = [torch.ones(1, 2), torch.ones(1)], sync_id

    learner.start = start
    queue, accumulator = LearnerQueue(settings, "cpu"), LonePeerAccumulator()
    group = SimpleNamespace(members=lambda: ["me"], sync_id=lambda: 0)
    log = SimpleNamespace(count=lambda key, n=1: None)
    assert not queue.waits_for(learner)
    for _ in range(settings.batch_size):
        queue.put(unroll(), 1)
    # A whole batch queued is as many as the queue holds with 0 or 1.
    assert queue.waits_for(learner) == (max_queued_batches <= 1)
    turns = []
    for _ in range(2 * PASSES * MINIBATCHES + 2):
        learn(settings, learner, accumulator, group, queue, state, log)
        turns.append((queue.waits_for(learner), accumulator.version))
    learner.close()
    return turns


def test_acting_waits_until_the_last_minibatch_is_stepped():
    steps_per_batch = PASSES * MINIBATCHES
    turns = a_turn_at_a_time(max_queued_batches=0)
    # Acting waits while any minibatch of the batch is still to be learned from...
    waiting = [steps for waits, steps in turns if waits]
    assert waiting and max(waiting) < steps_per_batch
    # ...and acts again only once the batch's last optimizer step is taken.
    acting = [steps for waits, steps in turns if not waits]
    assert acting and min(acting) == steps_per_batch


@pytest.mark.parametrize("max_queued_batches", [1, 2])
def test_acting_goes_on_while_the_learner_learns(max_queued_batches):
    turns = a_turn_at_a_time(max_queued_batches)
    # The batch left the queue at the first turn: acting may go on from then on.
    assert not turns[0][0] and turns[0][1] == 0
    assert all(not waits for waits, _ in turns)
