"""The acting side of a V-trace peer: the model acts on EnvPool's batches of envs in turn, and
their steps are cut into unrolls of T+1 steps that the learner takes in batches."""

import collections

import moolib
import torch

from examples.common.stats import Stats
from examples.common.workers import WatchedStep


def use_acting_threads(flags):
    """acting_threads for this thread's torch ops (the main thread's, which acts); torch counts
    intra-op threads per thread, so a learner thread made earlier keeps its torch_threads."""
    if flags.acting_threads > 0:
        torch.set_num_threads(flags.acting_threads)


class Actor:
    """Acts on one batch of envs per `step()` while the other batches step in the EnvPool's
    worker processes, and keeps, for every batch, its core state, its last T+1 steps, and the
    running return of each of its episodes.

    With unroll_groups, each actor batch is cut into groups of learner-batch size whose unrolls
    end at different steps (unroll_phases): the learner's batches then come one at a time,
    evenly spaced, not all of an actor batch's at once. A burst of several batches fills the
    learner's queue, so acting waits while the learner works through it, and the learner then
    waits while acting makes the next burst (in idle MinAtar runs the learner was busy 71% of
    the time, 86% with the groups: docs/results.md)."""

    def __init__(self, flags, envs, model, device, workers=None, wakeup=None):
        self.workers = workers
        self.wakeup = wakeup  # an Event set when a batch's envs have stepped (with workers)
        self.envs = envs
        self.model = model
        self.device = device
        self.use_lstm = flags.use_lstm
        self.batch_size = flags.actor_batch_size
        self.unroll_length = flags.unroll_length
        batch_size, num_batches = flags.actor_batch_size, flags.num_actor_batches
        self.core_states = [model.initial_state(batch_size) for _ in range(num_batches)]
        self.windows = [StepWindow(self.unroll_length + 1, device) for _ in range(num_batches)]
        # With an LSTM, each batch's core states from before each of its last T+1 steps.
        self.window_core_states = [
            collections.deque(maxlen=self.unroll_length + 1) for _ in range(num_batches)
        ]
        self.steps_taken = [0] * num_batches
        self.group_size, self.phases = unroll_phases(flags)
        self.episode_returns = torch.zeros(num_batches, batch_size)
        no_action = torch.zeros(batch_size, dtype=torch.int64)
        self.futures = [self._step_envs(i, no_action) for i in range(num_batches)]
        self.current = 0  # the batch to act on next
        self.stats = Stats()  # env steps and finished episodes' returns, since the last take

    def step(self, model_version=0):
        """Act on the next batch of envs; returns the unrolls ([T+1, group_size, ...]) of the
        groups of its envs whose unroll this step completes (usually one or none). Each step
        carries `model_version` (the weights' version that acts now) as its `acting_version`,
        from which the learner tells how far its weights are ahead of the ones that acted."""
        i = self.current
        self.current = (i + 1) % len(self.futures)
        # Copy out of the shared memory that the next step of this batch overwrites.
        # Through workers.result when given: a dead env worker raises instead of hanging.
        future = self.futures[i]
        result = self.workers.result(future) if self.workers else future.result()
        window = self.windows[i]
        window.advance()
        for key, value in result.items():
            window.write(key, value)
        self._count_episodes(i, result["reward"], result["done"])
        with torch.no_grad():
            inputs = {key: window.newest(key).unsqueeze(0) for key in ("state", "done")}
            outputs, core_after = self.model(inputs, self.core_states[i])
        logits = outputs["policy_logits"][0]
        action = sample_actions(logits)
        self.futures[i] = self._step_envs(i, action.cpu())
        window.write("action", action)
        window.write("policy_logits", logits)
        window.write("acting_version", torch.full_like(action, model_version))
        if self.use_lstm:
            self.window_core_states[i].append(self.core_states[i])
        self.core_states[i] = core_after
        taken = self.steps_taken[i]
        self.steps_taken[i] += 1
        # A group's unrolls end at steps phase + T, phase + 2T, ...; each one's last step starts
        # the next. (Its first `phase` steps are in no unroll.)
        T = self.unroll_length
        return [
            self._unroll(i, group)
            for group, phase in enumerate(self.phases[i])
            if taken >= phase + T and (taken - phase) % T == 0
        ]

    def ready(self):
        """Whether the next batch's envs have stepped, so that step() would not wait for them
        (always true without workers: moolib's own future cannot tell). While they have not,
        raises EnvWorkerDied if a worker is gone (looked at every poll_interval at most)."""
        future = self.futures[self.current]
        if not isinstance(future, WatchedStep) or future.ready.is_set():
            return True
        self.workers.check_now_and_then()
        return False

    def _step_envs(self, i, action):
        """Send batch i its actions; with workers, their helper thread waits for the step from
        now on and sets `wakeup` when it is in."""
        future = self.envs.step(i, action)
        if self.workers is None:
            return future
        return self.workers.watch(future, None if self.wakeup is None else self.wakeup.set)

    def _unroll(self, i, group):
        # Only the group's envs: with groups, the rest of the batch is not due yet.
        envs = slice(group * self.group_size, (group + 1) * self.group_size)
        unroll = self.windows[i].unroll(envs)
        if self.use_lstm:
            unroll["core_state"] = tuple(c[:, envs] for c in self.window_core_states[i][0])
        return unroll

    def _count_episodes(self, i, reward, done):
        returns = self.episode_returns[i]
        returns += reward
        self.stats.add("env_steps", len(done))
        if not done.any():  # most steps: no episode ends, nothing to gather
            return
        finished = returns[done]
        self.stats.add("episode_return", finished.sum().item(), len(finished))
        returns[done] = 0

    def take_stats(self):
        """The stats gathered since the last call."""
        stats, self.stats = self.stats, Stats()
        return stats


def sample_actions(logits):
    """One action per row of [B, A] logits, drawn from their softmax: the index of the largest
    probability / Exp(1) draw (the exponential race), which torch.multinomial(probs, 1) also
    computes, after checks of the probabilities that took more time than the draw."""
    probs = torch.softmax(logits, dim=-1)
    return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)


class StepWindow:
    """One actor batch's last T+1 steps, each key's in one [T+1, B, ...] tensor whose slots are
    written in turn: a step is one copy per key, and an unroll one gather per key, where a
    stack of the T+1 steps' tensors took a copy per step and key (a tenth of the main thread's
    time in MinAtar runs)."""

    def __init__(self, length, device):
        self.length = length
        self.device = device
        self.tensors = {}
        self.slot = -1  # the newest step's
        slots = torch.arange(length, device=device)
        # Oldest step first, for each slot the newest can be in.
        self.orders = [(slots + newest + 1) % length for newest in range(length)]

    def advance(self):
        self.slot = (self.slot + 1) % self.length

    def write(self, key, value):
        """The newest step's `key`, copied (out of the EnvPool's shared memory, which its next
        step of this batch overwrites)."""
        if key not in self.tensors:
            shape = (self.length, *value.shape)
            self.tensors[key] = torch.empty(shape, dtype=value.dtype, device=self.device)
        self.tensors[key][self.slot].copy_(value)

    def newest(self, key):
        return self.tensors[key][self.slot]

    def unroll(self, envs):
        """[T+1, envs, ...] per key (envs: a slice of the batch), oldest step first, a copy."""
        order = self.orders[self.slot]
        return {key: t[:, envs].index_select(0, order) for key, t in self.tensors.items()}


def unroll_phases(flags):
    """The envs per emitted unroll, and for every actor batch, the step (0 to T-1) at which each
    group of its envs starts its first unroll. Without unroll_groups: the whole actor batch, from
    step 0. With: batch_size envs to a group when that divides actor_batch_size (else the whole
    actor batch), and the phases of all the groups of all the batches spread evenly over the
    T * num_actor_batches acting steps in which every group completes one unroll (batch b acts
    on every num_actor_batches-th step, from step b)."""
    T, num_batches = flags.unroll_length, flags.num_actor_batches
    if not flags.unroll_groups:
        return flags.actor_batch_size, [[0] for _ in range(num_batches)]
    fits = flags.actor_batch_size % flags.batch_size == 0
    group_size = flags.batch_size if fits else flags.actor_batch_size
    groups = flags.actor_batch_size // group_size
    phases = [
        [
            round((g * num_batches + b) * T / groups / num_batches - b / num_batches) % T
            for g in range(groups)
        ]
        for b in range(num_batches)
    ]
    return group_size, phases


class LearnerQueue:
    """Unrolls in, learner batches of batch_size unrolls out (a moolib.Batcher concatenating
    along B), holding at most max_queued_batches batches: acting waits when it is full, so the
    policy that acted is never far behind the one that learns. With max_queued_batches=0 it
    holds one batch, and acting also waits while the learner still learns from the one before
    (PPO's alternation of acting and learning: see waits_for)."""

    def __init__(self, flags, device):
        self.batcher = moolib.Batcher(flags.batch_size, str(device), dim=1)
        self.batch_size = flags.batch_size
        self.queued = 0  # unrolls in the Batcher, not yet taken by the learner
        self.limit = max(flags.max_queued_batches, 1) * flags.batch_size
        self.alternate = flags.max_queued_batches == 0

    def full(self):
        return self.queued >= self.limit

    def waits_for(self, learner):
        """Whether acting waits for learning now: the queue is full, or (alternating) the
        learner has a batch it has not finished. Each batch is then acted by the weights that
        finished learning the one before (the last optimizer step may still be in the group's
        reduction), as PPO's rollouts are, instead of by weights up to max_queued_batches
        batches of optimizer steps older."""
        return self.full() or (self.alternate and learner.has_batch())

    def put(self, unroll, count):
        self.batcher.cat(unroll)
        self.queued += count

    def ready(self):
        return not self.batcher.empty()

    def get(self):
        self.queued -= self.batch_size
        return self.batcher.get()
