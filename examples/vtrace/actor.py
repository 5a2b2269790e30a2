"""The acting side of a V-trace peer: the model acts on EnvPool's batches of envs in turn, and
their steps are cut into unrolls of T+1 steps that the learner takes in batches."""

import moolib
import torch

from examples.common.stats import Stats


def use_acting_threads(flags):
    """acting_threads for this thread's torch ops (the main thread's, which acts); torch counts
    intra-op threads per thread, so a learner thread made earlier keeps its torch_threads."""
    if flags.acting_threads > 0:
        torch.set_num_threads(flags.acting_threads)


class Actor:
    """Acts on one batch of envs per `step()` while the other batches step in the EnvPool's
    worker processes, and keeps, for every batch, its core state, its unroll so far, and the
    running return of each of its episodes."""

    def __init__(self, flags, envs, model, device, workers=None):
        self.workers = workers
        self.envs = envs
        self.model = model
        self.device = device
        self.use_lstm = flags.use_lstm
        self.batch_size = flags.actor_batch_size
        self.unroll_steps = flags.unroll_length + 1
        batch_size, num_batches = flags.actor_batch_size, flags.num_actor_batches
        self.core_states = [model.initial_state(batch_size) for _ in range(num_batches)]
        self.unrolls = [[] for _ in range(num_batches)]
        self.unroll_core_states = list(self.core_states)  # before each unroll's first step
        self.episode_returns = torch.zeros(num_batches, batch_size)
        no_action = torch.zeros(batch_size, dtype=torch.int64)
        self.futures = [envs.step(i, no_action) for i in range(num_batches)]
        self.current = 0  # the batch to act on next
        self.stats = Stats()  # env steps and finished episodes' returns, since the last take

    def step(self):
        """Act on the next batch of envs; returns its unroll when that is complete, else None."""
        i = self.current
        self.current = (i + 1) % len(self.futures)
        # Copy out of the shared memory that the next step of this batch overwrites.
        # Through workers.result when given: a dead env worker raises instead of hanging.
        future = self.futures[i]
        result = self.workers.result(future) if self.workers else future.result()
        env_out = {key: value.clone() for key, value in result.items()}
        step = {key: value.to(self.device) for key, value in env_out.items()}
        with torch.no_grad():
            inputs = {"state": step["state"].unsqueeze(0), "done": step["done"].unsqueeze(0)}
            outputs, core_after = self.model(inputs, self.core_states[i])
        logits = outputs["policy_logits"][0]
        action = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
        self.futures[i] = self.envs.step(i, action.cpu())
        step["action"] = action
        step["policy_logits"] = logits
        self._count_episodes(i, env_out["reward"], env_out["done"])

        core_before = self.core_states[i]
        self.core_states[i] = core_after
        if not self.unrolls[i]:
            self.unroll_core_states[i] = core_before
        self.unrolls[i].append(step)
        if len(self.unrolls[i]) < self.unroll_steps:
            return None
        steps = self.unrolls[i]
        unroll = {key: torch.stack([s[key] for s in steps]) for key in steps[0]}
        if self.use_lstm:
            unroll["core_state"] = self.unroll_core_states[i]
        # The last step of an unroll starts the next one, with the core state it had.
        self.unrolls[i] = steps[-1:]
        self.unroll_core_states[i] = core_before
        return unroll

    def _count_episodes(self, i, reward, done):
        self.episode_returns[i] += reward
        finished = self.episode_returns[i][done]
        self.stats.add("env_steps", len(done))
        self.stats.add("episode_return", finished.sum().item(), len(finished))
        self.episode_returns[i][done] = 0

    def take_stats(self):
        """The stats gathered since the last call."""
        stats, self.stats = self.stats, Stats()
        return stats


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
