"""Stand-ins for the actor's surroundings: EnvPool's interface over envs whose every step can be
told apart, a model whose core state counts steps, and the actor's settings."""

from types import SimpleNamespace

import torch


class CountingEnvs:
    """EnvPool's interface (step(batch, actions) -> a future) over envs whose observation is
    (env, step count): every step of every env can be told apart in an unroll."""

    def __init__(self, batch_size, num_batches):
        self.batch_size = batch_size
        self.counts = [0] * num_batches

    def step(self, i, actions):
        assert actions.shape == (self.batch_size,)
        count, self.counts[i] = self.counts[i], self.counts[i] + 1
        envs = torch.arange(self.batch_size) + i * self.batch_size
        state = torch.stack([envs, torch.full_like(envs, count)], dim=1).float()
        done = torch.zeros(self.batch_size, dtype=torch.bool)
        reward = torch.zeros(self.batch_size)
        return SimpleNamespace(result=lambda: {"state": state, "done": done, "reward": reward})


class StepCountingModel(torch.nn.Module):
    """Uniform logits; with use_lstm its core state counts the steps it has acted on, so the
    core state an unroll carries tells which step it came before."""

    def __init__(self, use_lstm):
        super().__init__()
        self.use_lstm = use_lstm

    def initial_state(self, batch_size):
        return (torch.zeros(1, batch_size, 1),) if self.use_lstm else ()

    def forward(self, inputs, core_state=()):
        batch = inputs["state"].shape[1]
        outputs = {"policy_logits": torch.zeros(1, batch, 2), "baseline": torch.zeros(1, batch)}
        return outputs, tuple(c + 1 for c in core_state)


def actor_flags(
    actor_batch_size, batch_size, num_actor_batches=2, unroll_length=4, use_lstm=False,
    unroll_groups=True,
):  # fmt: skip
    return SimpleNamespace(
        actor_batch_size=actor_batch_size, batch_size=batch_size,
        num_actor_batches=num_actor_batches, unroll_length=unroll_length, use_lstm=use_lstm,
        unroll_groups=unroll_groups,
    )  # fmt: skip
