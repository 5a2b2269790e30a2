"""learner_passes: every learner batch is learned from that many times, and only its first pass
counts as new env steps (the learning-rate schedule and total_steps are in env steps)."""

from types import SimpleNamespace

import pytest
import torch
from helpers import Queue, linear_learner_state
from torch import nn

from examples.vtrace.config import OptimizerConfig
from examples.vtrace.learner import AsyncLearner
from examples.vtrace.minibatches import minibatches
from examples.vtrace.optimizer import learning_rate, step_optimizer


class Accumulator:
    def __init__(self, batch_size):
        self.batch_size = batch_size

    def get_gradient_stats(self):
        return {"batch_size": self.batch_size}

    def zero_gradients(self):
        pass


def flags(passes, minibatches=1):
    return SimpleNamespace(
        learner_passes=passes, learner_minibatches=minibatches, minibatch_steps=False, seed=0,
        unroll_length=20, batch_size=8, virtual_batch_size=8 // minibatches,
        total_steps=10**6, warmup=0, grad_norm_clipping=40.0, entropy_cost=0.01,
        entropy_cost_end=None, optimizer=OptimizerConfig(learning_rate=0.001),
    )  # fmt: skip


def test_each_batch_comes_back_for_every_pass():
    learner = AsyncLearner(flags(3), nn.Linear(2, 1))
    queue = Queue(["a", "b"])
    taken = [learner.next_batch(queue) for _ in range(7)]
    learner.close()
    assert taken == ["a", "a", "a", "b", "b", "b", None]


def batch(first_unroll, size=8, T=3):
    """A learner batch whose unroll b holds the number first_unroll + b everywhere."""
    ids = torch.arange(first_unroll, first_unroll + size, dtype=torch.float32)
    return {
        "state": ids.view(1, size, 1).expand(T, size, 2).clone(),
        "action": ids.view(1, size).expand(T, size).long(),
        "core_state": (ids.view(1, size, 1).clone(), ids.view(1, size, 1).clone()),
    }


def unroll_ids(minibatch):
    ids = minibatch["action"][0].tolist()
    # Every key of a minibatch holds the same unrolls, all of each one's steps.
    assert (minibatch["action"] == minibatch["action"][:1]).all()
    assert minibatch["state"][0, :, 0].long().tolist() == ids
    assert minibatch["core_state"][0][0, :, 0].long().tolist() == ids
    return ids


def test_minibatches_cover_the_batch_once_per_pass_in_new_orders():
    learner = AsyncLearner(flags(passes=3, minibatches=4), nn.Linear(2, 1))
    queue = Queue([batch(0), batch(100)])
    taken = [learner.next_batch(queue) for _ in range(3 * 4 * 2 + 1)]
    learner.close()
    assert taken[-1] is None
    passes = [[unroll_ids(m) for m in taken[i : i + 4]] for i in range(0, 24, 4)]
    for i, pass_ in enumerate(passes):
        assert all(len(ids) == 2 for ids in pass_)
        first = 0 if i < 3 else 100
        assert sorted(sum(pass_, [])) == list(range(first, first + 8))
    orders = [sum(p, []) for p in passes[:3]]
    assert len({tuple(order) for order in orders}) > 1  # reshuffled between passes


def test_minibatches_keep_channels_last_frames_so():
    frames = torch.arange(3 * 8 * 2 * 5 * 5, dtype=torch.float32).view(3, 8, 2, 5, 5)
    stored = frames.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    generator = torch.Generator().manual_seed(0)
    for part in minibatches({"state": stored, "action": torch.zeros(3, 8)}, 4, generator):
        picked = part["state"]
        assert picked.flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
        ids = (picked[0, :, 0, 0, 0] // (2 * 5 * 5)).long()  # the unrolls it holds
        assert torch.equal(picked, frames.index_select(1, ids))


def test_minibatches_count_as_env_steps_once():
    s = linear_learner_state()
    for _ in range(3 * 4):  # one batch of 8 unrolls: 3 passes of 4 minibatches of 2
        step_optimizer(flags(3, minibatches=4), s, Accumulator(2))
    assert s.env_train_steps == 8 * 20
    assert s.learned_samples == 3 * 8 * 20


def test_one_pass_takes_a_new_batch_every_time():
    learner = AsyncLearner(flags(1), nn.Linear(2, 1))
    queue = Queue(["a", "b"])
    assert [learner.next_batch(queue) for _ in range(3)] == ["a", "b", None]
    learner.close()


def test_env_steps_count_new_samples_only():
    s = linear_learner_state()
    for _ in range(4):  # two batches of 8 unrolls, two passes each
        step_optimizer(flags(2), s, Accumulator(8))
    assert s.env_train_steps == 2 * 8 * 20
    assert s.learned_samples == 4 * 8 * 20


def test_one_pass_counts_as_before():
    s = linear_learner_state()
    step_optimizer(flags(1), s, Accumulator(8))
    assert s.env_train_steps == 8 * 20


def test_a_step_of_two_peers_batches_takes_the_rate_scaled_by_its_unrolls():
    s = linear_learner_state()
    settings = flags(1)
    settings.optimizer.batch_scaling = "linear"
    step_optimizer(settings, s, Accumulator(16))  # both peers' batches of 8 in one step
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(2 * learning_rate(settings, 320))
    step_optimizer(settings, s, Accumulator(8))  # one peer's batch alone
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(learning_rate(settings, 480))


def test_checkpoint_from_before_learner_passes():
    s = linear_learner_state()
    saved = s.state_dict()
    del saved["learned_samples"]
    saved["env_train_steps"] = 1000
    s.load_state_dict(saved)
    step_optimizer(flags(2), s, Accumulator(8))
    assert s.env_train_steps == 1000 + 8 * 20 // 2


class GroupAccumulator:
    """Always wants gradients; its version moves only when the test says the group stepped."""

    def __init__(self):
        self.version, self.reduced, self.skipped = 0, 0, 0

    def wants_gradients(self):
        return True

    def model_version(self):
        return self.version

    def reduce_gradients(self, batch_size):
        self.reduced += 1

    def skip_gradients(self):
        self.skipped += 1


def learner_for_a_linear_model(batch_size=1, virtual=1):
    model = nn.Linear(2, 1)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    f = SimpleNamespace(
        **{**vars(flags(1)), "batch_size": batch_size, "virtual_batch_size": virtual}
    )
    learner = AsyncLearner(f, model)
    # No thread: a started batch is finished at once, its "gradients" being the batch itself.
    learner.start = lambda batch, sync_id, env_train_steps=0: setattr(
        learner, "finished", (batch, sync_id)
    )
    return learner


def test_one_batch_per_optimizer_step_while_the_group_is_slow():
    learner = learner_for_a_linear_model()
    grads = [torch.ones(1, 2), torch.ones(1)]
    queue = Queue([grads, grads, grads])
    accumulator = GroupAccumulator()
    for _ in range(5):  # the group takes no step: only the first batch is handed on
        learner.update(accumulator, 0, queue)
    assert accumulator.reduced == 1 and accumulator.skipped >= 3
    accumulator.version += 1  # the group stepped: the next batch may go
    learner.update(accumulator, 0, queue)
    assert accumulator.reduced == 2
    learner.close()


def test_a_group_change_releases_the_batch_in_flight():
    learner = learner_for_a_linear_model()
    grads = [torch.ones(1, 2), torch.ones(1)]
    queue = Queue([grads, grads, grads])
    accumulator = GroupAccumulator()
    learner.update(accumulator, 0, queue)
    learner.update(accumulator, 0, queue)
    assert accumulator.reduced == 1
    # A new sync id: the reduction in flight is gone, nothing to wait for (the held batch was
    # computed in the old group and is dropped).
    assert learner.update(accumulator, 1, queue) == 1
    learner.update(accumulator, 1, queue)
    assert accumulator.reduced == 2
    learner.close()


def test_a_lone_peer_can_fill_a_virtual_batch_larger_than_its_batch():
    learner = learner_for_a_linear_model(batch_size=4, virtual=8)
    grads = [torch.ones(1, 2), torch.ones(1)]
    queue = Queue([grads] * 4)
    accumulator = GroupAccumulator()
    for _ in range(6):
        learner.update(accumulator, 0, queue)
    assert accumulator.reduced == 2  # 2 x 4 = the virtual batch of 8, then it waits
    accumulator.version += 1
    for _ in range(3):
        learner.update(accumulator, 0, queue)
    assert accumulator.reduced == 4
    learner.close()


def test_a_lone_peer_never_skips_a_round():
    learner = learner_for_a_linear_model()
    grads = [torch.ones(1, 2), torch.ones(1)]
    queue = Queue([grads])
    accumulator = GroupAccumulator()
    for _ in range(4):  # one batch handed on, then nothing to give: a group peer would skip
        learner.update(accumulator, 0, queue, alone=True)
    assert accumulator.reduced == 1 and accumulator.skipped == 0
    learner.update(accumulator, 0, queue, alone=False)
    assert accumulator.skipped == 1
    learner.close()
