"""A learner batch cut into minibatches: whole unrolls (learner_minibatches, V-trace along each
one's time axis) or single steps drawn from all of it (minibatch_steps, PPO's minibatches)."""

import torch

from examples.vtrace.loss import step_targets


def minibatches(batch, count, generator):
    """A learner batch ([T+1, B, ...] tensors, and an LSTM's core state [layers, B, hidden]) cut
    into `count` minibatches of B / count whole unrolls each, drawn in a random order; the batch
    itself when count is 1. Unrolls stay whole: V-trace runs along each one's time axis."""
    if count == 1:
        return [batch]
    size = batch["action"].shape[1]
    order = torch.randperm(size, generator=generator)
    parts = []
    for indices in order.chunk(count):
        part = {}
        for key, value in batch.items():
            if key == "core_state":
                part[key] = tuple(select_unrolls(v, indices) for v in value)
            else:
                part[key] = select_unrolls(value, indices)
        parts.append(part)
    return parts


class StepMinibatches:
    """A learner batch to be learned from in minibatches of single steps drawn from all of it
    (minibatch_steps=true, PPO's minibatches), each pass in a new random order. The V-trace
    targets of all its steps are computed once, by the learner thread, with the weights that
    learn from its first minibatch (loss.step_targets)."""

    def __init__(self, batch, generator):
        self.batch, self.generator, self.targets = batch, generator, None
        self.size = (batch["action"].shape[0] - 1) * batch["action"].shape[1]  # T x B steps

    def one_pass(self, count):
        order = torch.randperm(self.size, generator=self.generator)
        return [StepMinibatch(self, indices) for indices in order.chunk(count)]


class StepMinibatch:
    """Some of a StepMinibatches' steps: the inputs of loss.step_loss, made when needed."""

    def __init__(self, minibatches, indices):
        self.minibatches, self.indices = minibatches, indices

    def steps(self, flags, model):
        """The steps as a [1, N, ...] batch with their targets; the batch's targets are
        computed first if no minibatch of it has needed them yet."""
        whole = self.minibatches
        if whole.targets is None:
            whole.targets = step_targets(flags, model, whole.batch)
        steps = {key: whole.batch[key][:-1] for key in ("state", "done", "action", "policy_logits")}
        steps.update(whole.targets)
        # [T, B, ...] -> [1, T x B, ...] (a view, in the frames' own layout), then the picked.
        return {
            key: select_unrolls(value.flatten(0, 1).unsqueeze(0), self.indices)
            for key, value in steps.items()
        }


def select_unrolls(value, indices):
    """value.index_select(1, indices) in value's own memory layout (index_select alone returns
    a contiguous tensor): frames stored channels-last stay so (models.frames_for_encode)."""
    physical = sorted(range(value.dim()), key=lambda dim: -value.stride(dim))
    picked = value.permute(physical).index_select(physical.index(1), indices.to(value.device))
    return picked.permute([physical.index(dim) for dim in range(value.dim())])
