"""Each env's steps come as unrolls of T+1 consecutive steps that overlap by one, with the core
state from before their first step. Without unroll_groups an actor batch's unrolls all end on
the same step; with them, the actor cuts every actor batch into groups of learner-batch size whose
unrolls end at different steps, and the learner's batches come evenly spaced instead of an actor
batch's worth at once."""

import pytest
import torch

from examples.vtrace.actor import Actor, unroll_phases
from tests.acting_fakes import CountingEnvs, StepCountingModel, actor_flags


def acted(settings, acts):
    """(act number, unroll) for every unroll the actor returns in `acts` steps."""
    torch.manual_seed(0)
    envs = CountingEnvs(settings.actor_batch_size, settings.num_actor_batches)
    actor = Actor(settings, envs, StepCountingModel(settings.use_lstm), "cpu")
    return [(n, unroll) for n in range(acts) for unroll in actor.step()], actor


@pytest.mark.parametrize("unroll_groups", [True, False])
@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("actor_batch_size,batch_size", [(8, 2), (8, 8), (6, 4), (16, 2)])
def test_every_env_gives_overlapping_unrolls_of_consecutive_steps(
    actor_batch_size, batch_size, use_lstm, unroll_groups
):
    settings = actor_flags(actor_batch_size, batch_size, use_lstm=use_lstm,
                           unroll_groups=unroll_groups)  # fmt: skip
    T = settings.unroll_length
    unrolls, actor = acted(settings, 200)
    envs_total = actor_batch_size * settings.num_actor_batches
    starts = {env: [] for env in range(envs_total)}
    for _, unroll in unrolls:
        assert unroll["state"].shape[:2] == (T + 1, actor.group_size)
        for column in range(actor.group_size):
            env = int(unroll["state"][0, column, 0])
            steps = unroll["state"][:, column, 1].tolist()
            assert (unroll["state"][:, column, 0] == env).all()  # one env per column
            assert steps == list(range(int(steps[0]), int(steps[0]) + T + 1))
            starts[env].append(int(steps[0]))
            if use_lstm:  # the core state from before the unroll's first step
                assert unroll["core_state"][0][0, column, 0] == steps[0]
    for first_steps in starts.values():
        # Back to back, each unroll's last step the next one's first, from a step before T.
        assert first_steps[0] < T
        assert first_steps == list(range(first_steps[0], first_steps[0] + T * len(first_steps), T))
        assert len(first_steps) >= (200 // settings.num_actor_batches - T) // T


def test_learner_batches_come_evenly_spaced():
    """MinAtar's preset: 2 actor batches of 32 envs, learner batches of 8, T = 20. In every
    40 acts each of the 8 groups completes one unroll, one every 5 acts."""
    settings = actor_flags(32, 8, unroll_length=20)
    unrolls, _ = acted(settings, 400)
    acts = [n for n, _ in unrolls]
    assert len(acts) == len(set(acts))  # never two at once
    gaps = {later - earlier for earlier, later in zip(acts[:-1], acts[1:], strict=True)}
    assert gaps <= {4, 5, 6}, gaps
    assert len(acts) >= 400 // 5 - 8


def test_without_groups_each_actor_batch_gives_all_its_unrolls_at_once():
    """unroll_groups=false: every T acts of a batch, its whole batch of unrolls, the two actor
    batches on consecutive acts (the bursts the groups spread out)."""
    settings = actor_flags(32, 8, unroll_length=20, unroll_groups=False)
    unrolls, actor = acted(settings, 200)
    assert actor.group_size == 32
    acts = [n for n, _ in unrolls]
    # Batch 0 acts on even acts, batch 1 on odd ones: each completes its first unroll at its 21st
    # act (T + 1 steps), then one every 20 of its own acts.
    assert acts == [n for k in range(1, 5) for n in (40 * k, 40 * k + 1)]


def test_one_group_per_actor_batch_still_staggers_the_batches():
    """When batch_size does not divide actor_batch_size, a whole actor batch is one group; the
    actor batches' unrolls still end about half an unroll apart, not on consecutive acts."""
    group_size, phases = unroll_phases(actor_flags(6, 4, unroll_length=20))
    assert group_size == 6
    assert phases == [[0], [10]]
    settings = actor_flags(6, 4, unroll_length=20)
    acts = [n for n, _ in acted(settings, 200)[0]]
    gaps = {later - earlier for earlier, later in zip(acts[:-1], acts[1:], strict=True)}
    assert gaps <= {19, 20, 21}


def test_more_groups_than_steps_are_all_returned():
    """More groups than steps in an unroll: some end on the same step, and all come back."""
    settings = actor_flags(16, 1, unroll_length=4)
    assert len({p for phases in unroll_phases(settings)[1] for p in phases}) <= 4
    unrolls, _ = acted(settings, 80)
    per_act = {}
    for n, _ in unrolls:
        per_act[n] = per_act.get(n, 0) + 1
    assert max(per_act.values()) > 1
    # Every env's unrolls from step phase on: 32 envs, ~(40 - phase) / 4 each.
    assert len(unrolls) >= 32 * (40 - 4) // 4 - 32
