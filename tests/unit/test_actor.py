"""Each env's steps come as unrolls of T+1 consecutive steps that overlap by one, with the core
state from before their first step. Without unroll_groups an actor batch's unrolls all end on
the same step; with them, the actor cuts every actor batch into groups of learner-batch size whose
unrolls end at different steps, and the learner's batches come evenly spaced instead of an actor
batch's worth at once."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from examples.common.workers import EnvWorkerDied, EnvWorkers
from examples.vtrace.actor import Actor, sample_actions, unroll_phases
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


def test_an_unroll_is_a_copy_that_later_steps_leave_alone():
    settings = actor_flags(8, 2)
    torch.manual_seed(0)
    envs = CountingEnvs(8, 2)
    actor = Actor(settings, envs, StepCountingModel(False), "cpu")
    unrolls = []
    while not unrolls:
        unrolls = actor.step()
    kept = {key: value.clone() for key, value in unrolls[0].items()}
    for _ in range(3 * (settings.unroll_length + 1)):
        actor.step()
    for key, value in kept.items():
        assert torch.equal(unrolls[0][key], value), key


class EpisodeEnvs:
    """Env e of batch i gets reward 1 every step and ends its episode every e + 2 steps; each
    step's result lives in one buffer per batch that the next step overwrites, as EnvPool's
    shared memory does."""

    def __init__(self, batch_size, num_batches):
        self.lengths = torch.arange(batch_size) + 2
        self.counts = [0] * num_batches
        self.shared = [
            {"state": torch.zeros(batch_size, 2), "reward": torch.zeros(batch_size),
             "done": torch.zeros(batch_size, dtype=torch.bool)}
            for _ in range(num_batches)
        ]  # fmt: skip

    def step(self, i, actions):
        self.counts[i] += 1
        self.shared[i]["reward"].fill_(1.0)
        self.shared[i]["done"].copy_(self.counts[i] % self.lengths == 0)
        return SimpleNamespace(result=lambda: self.shared[i])


def test_finished_episodes_returns_are_counted_once_each():
    settings = actor_flags(4, 2)
    envs = EpisodeEnvs(4, 2)
    actor = Actor(settings, envs, StepCountingModel(False), "cpu")
    acts = 60
    for _ in range(acts):
        actor.step()
    stats = actor.take_stats()
    assert stats.sum("env_steps") == 4 * acts
    # Each batch acted on half the acts, each time on the result of its next step (1, 2, ...).
    steps = [acts // 2, acts // 2]
    ended = [steps_taken // length for steps_taken in steps for length in range(2, 6)]
    assert stats.counts["episode_return"] == sum(ended)
    returns = [n * length for n, length in zip(ended, [2, 3, 4, 5] * 2, strict=True)]
    assert stats.sum("episode_return") == sum(returns)
    assert actor.take_stats().counts["episode_return"] == 0  # taken: nothing counted twice


def test_sampled_actions_follow_the_softmax_and_the_seed():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0]])).expand(20_000, 4)
    torch.manual_seed(0)
    actions = sample_actions(logits)
    frequencies = torch.bincount(actions, minlength=4) / len(actions)
    torch.testing.assert_close(frequencies, torch.tensor([0.1, 0.6, 0.3, 0.0]), atol=0.015, rtol=0)
    torch.manual_seed(0)
    assert torch.equal(sample_actions(logits), actions)


class GatedEnvs(CountingEnvs):
    """CountingEnvs whose steps come in only once `gate` is set."""

    def __init__(self, batch_size, num_batches):
        super().__init__(batch_size, num_batches)
        self.gate = threading.Event()

    def step(self, i, actions):
        future = super().step(i, actions)

        def result():
            assert self.gate.wait(10), "the test never opened the gate"
            return future.result()

        return SimpleNamespace(result=result)


def test_actor_is_ready_when_the_next_batch_has_stepped_and_wakes_the_loop():
    settings = actor_flags(4, 2)
    envs = GatedEnvs(settings.actor_batch_size, settings.num_actor_batches)
    guard = EnvWorkers(env_factory=lambda: None, num_processes=1, poll_interval=0.01)
    wakeup = threading.Event()
    actor = Actor(settings, envs, StepCountingModel(False), "cpu", guard, wakeup)
    time.sleep(0.05)
    assert not actor.ready() and not wakeup.is_set()  # the loop would learn meanwhile
    envs.gate.set()
    assert wakeup.wait(5)
    assert actor.ready()
    actor.step()
    assert actor.ready()  # the other batch stepped too


def test_actor_not_ready_reports_a_dead_env_worker():
    settings = actor_flags(4, 2)
    envs = GatedEnvs(settings.actor_batch_size, settings.num_actor_batches)  # never open
    guard = EnvWorkers(env_factory=lambda: None, num_processes=1, poll_interval=0.01)
    actor = Actor(settings, envs, StepCountingModel(False), "cpu", guard, threading.Event())
    assert not actor.ready()
    guard._dead = "env worker 0 (pid 123) was killed by SIGKILL"
    with pytest.raises(EnvWorkerDied, match="was killed"):
        actor.ready()
    envs.gate.set()  # lets the helper thread's waits end
