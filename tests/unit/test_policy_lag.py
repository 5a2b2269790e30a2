"""Every acted step carries the version of the weights that acted it, and the learner logs how
far its own weights were ahead of those when it started on a batch (policy_lag)."""

import math
from types import SimpleNamespace

import torch
from torch import nn

from examples.vtrace.actor import Actor, LearnerQueue
from examples.vtrace.learner import AsyncLearner
from tests.acting_fakes import CountingEnvs, StepCountingModel, actor_flags
from tests.helpers import LonePeerAccumulator


def test_each_step_of_an_unroll_carries_the_version_that_acted_it():
    settings = actor_flags(actor_batch_size=4, batch_size=4, num_actor_batches=1, unroll_length=3)
    envs = CountingEnvs(settings.actor_batch_size, settings.num_actor_batches)
    actor = Actor(settings, envs, StepCountingModel(False), "cpu")
    unrolls = [unroll for version in range(10) for unroll in actor.step(model_version=version)]
    assert unrolls
    for unroll in unrolls:
        versions = unroll["acting_version"]
        assert versions.shape == (4, 4) and versions.dtype == torch.int64
        # The steps were acted one version apart, in order; all envs of a step alike.
        assert (versions == versions[:, :1]).all()
        assert versions[:, 0].diff().eq(1).all()
        # The version is the step's own: the env's step count (its observation) equals it here.
        assert torch.equal(versions[:, 0], unroll["state"][:, 0, 1].long())


def learner_settings(passes=1):
    return SimpleNamespace(
        seed=0, batch_size=2, learner_minibatches=1, virtual_batch_size=2,
        learner_passes=passes, minibatch_steps=False, max_queued_batches=2,
    )  # fmt: skip


def queued_batch(settings, acting_versions):
    """A LearnerQueue holding one learner batch of two unrolls acted at `acting_versions`
    ([T+1] each; the last step belongs to the next unroll's learning)."""
    queue = LearnerQueue(settings, "cpu")
    for versions in acting_versions:
        versions = torch.tensor(versions).unsqueeze(1)
        queue.put({"state": torch.zeros(len(versions), 1, 3), "acting_version": versions}, 1)
    return queue


def started_lags(acting_versions, learner_version, passes=1):
    settings = learner_settings(passes)
    learner = AsyncLearner(settings, nn.Linear(3, 2))
    learner.start = lambda batch, sync_id, env_train_steps=0: setattr(learner, "batch", batch)
    queue = queued_batch(settings, acting_versions)
    accumulator = LonePeerAccumulator()
    accumulator.version = learner_version
    lags = []
    for _ in range(passes):
        learner.jobs.clear()  # the pass before is done
        learner.finished = None
        learner.update(accumulator, 0, queue, alone=True)
        lags.append(learner.take_policy_lag())
    learner.close()
    return lags, learner.batch


def test_the_lag_is_the_learner_version_minus_the_mean_acting_version_of_the_learned_steps():
    # Steps 0-2 of each unroll are learned from; step 3 (version 90) is the next unroll's first.
    lags, batch = started_lags([[10, 11, 12, 90], [20, 21, 22, 90]], learner_version=30)
    assert lags == [30 - 16]
    # The versions stay out of the batch the loss sees.
    assert "acting_version" not in batch


def test_every_pass_over_a_batch_counts_with_the_learner_version_of_its_start():
    lags, _ = started_lags([[4, 4, 4, 4], [4, 4, 4, 4]], learner_version=10, passes=2)
    assert lags == [6, 6]  # the version stood still here: no optimizer step in between


def test_no_minibatch_started_gives_nan():
    settings = learner_settings()
    learner = AsyncLearner(settings, nn.Linear(3, 2))
    assert math.isnan(learner.take_policy_lag())
    learner.close()
