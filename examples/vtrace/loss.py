"""The V-trace actor-critic loss of a learner batch, and its gradients."""

import torch
import torch.nn.functional as F

from examples.common import vtrace
from examples.common.torchscript import compiled, traced
from examples.vtrace import ops
from examples.vtrace.models import ActorCriticBase

LOSS_NAMES = ["pg_loss", "baseline_loss", "entropy_loss", "clip_fraction"]


def entropy_cost(flags, env_train_steps):
    """The entropy bonus's weight after env_train_steps: entropy_cost, or with entropy_cost_end
    set, the linear way from entropy_cost at step 0 to entropy_cost_end at total_steps."""
    if flags.entropy_cost_end is None:
        return flags.entropy_cost
    progress = min(1.0, env_train_steps / flags.total_steps)
    return flags.entropy_cost + progress * (flags.entropy_cost_end - flags.entropy_cost)


def compute_loss(flags, model, batch, entropy_weight=None):
    """V-trace actor-critic loss on a learner batch of T+1 steps ([T+1, B, ...]), or, for a
    minibatch of single steps that carries its targets (`vs`, see step_targets), PPO's loss on
    those steps (step_loss). `entropy_weight`: the entropy bonus's weight now (entropy_cost()),
    flags.entropy_cost when None. Returns the loss and its terms for the log (LOSS_NAMES).

    Step t holds observation t, whether it starts a new episode (done), the reward that led to
    it, the action taken from it and the acting policy's logits there.
    """
    if entropy_weight is None:
        entropy_weight = flags.entropy_cost
    if "vs" in batch:
        return step_loss(flags, model, batch, entropy_weight)
    core_state = batch.get("core_state", ())
    outputs, _ = model({"state": batch["state"], "done": batch["done"]}, core_state)
    loss, terms = actor_critic_loss(
        *returns_arguments(flags, batch, outputs),
        float(flags.pg_clip), bool(flags.normalize_advantages), float(flags.baseline_cost),
        float(entropy_weight),
    )  # fmt: skip
    return loss, loss_stats(terms)


def vtrace_returns(flags, batch, outputs):
    """V-trace's targets and advantages for a batch of whole unrolls, from the model's outputs
    on it; and the mask of its real transitions (None when it has no time-limit cuts)."""
    return batch_returns(*returns_arguments(flags, batch, outputs))


def returns_arguments(flags, batch, outputs):
    """batch_returns()'s arguments (the first ones of actor_critic_loss too): TorchScript
    functions take tensors and numbers, not the batch's dict and the flags."""
    return (outputs["policy_logits"], outputs["baseline"], *batch_arguments(flags, batch))


def batch_arguments(flags, batch):
    """returns_arguments() after the model's outputs: the batch's and the flags' part."""
    return (
        batch["policy_logits"], batch["action"], batch["reward"], batch["done"],
        batch.get("truncated"), batch.get("life_lost"),
        float(flags.reward_clip), float(flags.discounting), float(flags.vtrace_lambda),
    )  # fmt: skip


@torch.no_grad()
def step_targets(flags, model, batch):
    """The V-trace targets (vs) and advantages of every step of a learner batch [T+1, B, ...],
    from the model's current weights, and the mask of its real transitions: computed once per
    batch for minibatch_steps (as PPO computes its returns once per rollout). [T, B] each."""
    outputs, _ = model({"state": batch["state"], "done": batch["done"]})
    returns, mask = vtrace_returns(flags, batch, outputs)
    if mask is None:
        mask = torch.ones_like(returns.vs, dtype=torch.bool)
    # log pi(a) of the policy at the batch's start: decoupled_clip's centre for the ratio.
    return {"vs": returns.vs, "advantages": returns.advantages, "mask": mask,
            "start_log_probs": returns.target_action_log_probs}  # fmt: skip


def step_loss(flags, model, steps, entropy_weight):
    """PPO's loss on a minibatch of single steps ([1, N, ...]: the acting policy's logits, the
    action, and the targets from step_targets): the clipped surrogate on the advantages (its
    ratio to the acting policy, or with decoupled_clip to the batch's starting one), the value's
    squared error to vs, and the entropy bonus."""
    outputs, _ = model({"state": steps["state"], "done": steps["done"]})
    logits = outputs["policy_logits"]
    log_probs = vtrace.action_log_probs(logits, steps["action"])
    acting_log_probs = vtrace.action_log_probs(steps["policy_logits"], steps["action"])
    mask = steps["mask"]
    advantages = steps["advantages"]
    if flags.normalize_advantages:
        advantages = normalized(advantages, mask)
    if flags.decoupled_clip:
        # The ratio to the batch's starting policy, each step weighted by that policy's
        # truncated importance weight over the acting one (as V-trace's rho-bar = 1).
        log_rhos = log_probs - steps["start_log_probs"]
        weights = (steps["start_log_probs"] - acting_log_probs).exp().clamp(max=1.0)
    else:
        log_rhos, weights = log_probs - acting_log_probs, None
    pg_loss = vtrace.clipped_surrogate_loss(log_rhos, advantages, flags.pg_clip, mask, weights)
    errors = (steps["vs"] - outputs["baseline"]) * mask
    loss, terms = total_loss(mask.numel(), pg_loss, errors, logits, log_rhos, mask,
                             float(flags.pg_clip), float(flags.baseline_cost),
                             float(entropy_weight))  # fmt: skip
    return loss, loss_stats(terms)


@compiled
def transitions(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    truncated: torch.Tensor | None,
    life_lost: torch.Tensor | None,
    reward_clip: float,
    discounting: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The rewards, discounts and mask of a batch's first T steps ([T, B] each), from its T+1
    steps: the reward that followed each step (clipped to reward_clip unless it is 0), its
    discount (0 where an episode ended, or with env.episodic_life a life), and whether it is a
    real transition (None when the batch has no time-limit cuts)."""
    rewards = rewards[1:]
    if reward_clip != 0:
        rewards = rewards.clamp(-reward_clip, reward_clip)
    ends = dones[1:]
    if life_lost is not None:
        ends = ends | life_lost[1:]
    discounts = (~ends).float() * discounting
    # The step that leaves the last observation of a time-limit cut is a filler
    # (envs.truncation_step): it bootstraps nothing and teaches nothing.
    mask = None if truncated is None else ~truncated[:-1]
    return rewards, discounts, mask


@compiled
def batch_returns(
    logits: torch.Tensor,
    baselines: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    truncated: torch.Tensor | None,
    life_lost: torch.Tensor | None,
    reward_clip: float,
    discounting: float,
    vtrace_lambda: float,
) -> tuple[vtrace.VTraceFromLogitsReturns, torch.Tensor | None]:
    """vtrace_returns() from the model's outputs and the batch's tensors, all [T+1, B, ...]."""
    rewards, discounts, mask = transitions(
        rewards, dones, truncated, life_lost, reward_clip, discounting
    )
    returns = vtrace.from_logits(
        behavior_policy_logits=behavior_logits[:-1],
        target_policy_logits=logits[:-1],
        actions=actions[:-1],
        discounts=discounts,
        rewards=rewards,
        values=baselines[:-1],
        bootstrap_value=baselines[-1],
        mask=mask,
        lambda_=vtrace_lambda,
    )
    return returns, mask


@compiled
def clip_fraction(
    log_rhos: torch.Tensor, clip: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The share of samples whose ratio pi/mu is outside [1 - clip, 1 + clip] (NaN without
    pg_clip): those give no policy gradient. It grows with the policy's lag behind the learner."""
    if clip == 0:
        return torch.full((), float("nan"), device=log_rhos.device)
    outside = (log_rhos.detach().exp() - 1).abs() > clip
    if mask is not None:
        outside = outside[mask]
    return outside.float().mean()


@compiled
def normalized(advantages: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages scaled to mean 0 and standard deviation 1 over the batch's real transitions
    (as PPO does): the policy's share of the gradient no longer shrinks with sparse rewards."""
    real = advantages if mask is None else advantages[mask]
    if real.numel() < 2:
        return advantages
    scaled = (advantages - real.mean()) / (real.std() + 1e-8)
    return scaled if mask is None else scaled * mask


@compiled
def total_loss(
    num_samples: int,
    pg_loss: torch.Tensor,
    value_errors: torch.Tensor,
    logits: torch.Tensor,
    log_rhos: torch.Tensor,
    mask: torch.Tensor | None,
    pg_clip: float,
    baseline_cost: float,
    entropy_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted sum of the policy, baseline and entropy terms, each a mean over the samples,
    and the terms of LOSS_NAMES for the log, in one tensor (see loss_stats)."""
    pg_loss = pg_loss / num_samples
    baseline_loss = vtrace.baseline_loss(value_errors) / num_samples
    entropy_loss = vtrace.entropy_loss(logits, mask) / num_samples
    total = pg_loss + baseline_cost * baseline_loss + entropy_weight * entropy_loss
    terms = [pg_loss, baseline_loss, entropy_loss, clip_fraction(log_rhos, pg_clip, mask)]
    return total, torch.stack(terms).detach()


def loss_stats(terms):
    return dict(zip(LOSS_NAMES, terms.tolist(), strict=True))


@compiled
def actor_critic_loss(
    logits: torch.Tensor,
    baselines: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    truncated: torch.Tensor | None,
    life_lost: torch.Tensor | None,
    reward_clip: float,
    discounting: float,
    vtrace_lambda: float,
    pg_clip: float,
    normalize_advantages: bool,
    baseline_cost: float,
    entropy_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of compute_loss from the learner's outputs on T+1 steps (logits [T+1, B, A],
    baselines [T+1, B]) and the batch's [T+1, B, ...] tensors, and its terms: one TorchScript
    call, so that the learner thread holds the GIL for none of it (torchscript.py)."""
    returns, mask = batch_returns(
        logits, baselines, behavior_logits, actions, rewards, dones, truncated, life_lost,
        reward_clip, discounting, vtrace_lambda,
    )  # fmt: skip
    actions, target_logits, values = actions[:-1], logits[:-1], baselines[:-1]
    # With pg_clip the surrogate weights each sample by its ratio itself (APPO: PPO's loss on
    # V-trace's advantages); without, V-trace's policy gradient, weighted by the clipped ratio.
    advantages = returns.advantages if pg_clip > 0 else returns.pg_advantages
    if normalize_advantages:
        advantages = normalized(advantages, mask)
    if pg_clip > 0:
        pg_loss = vtrace.clipped_surrogate_loss(returns.log_rhos, advantages, pg_clip, mask)
    else:
        pg_loss = vtrace.policy_gradient_loss(target_logits, actions, advantages)
    return total_loss(actions.numel(), pg_loss, returns.vs - values, target_logits,
                      returns.log_rhos, mask, pg_clip, baseline_cost, entropy_weight)  # fmt: skip


@compiled
def output_gradients(
    logits: torch.Tensor,
    baselines: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    truncated: torch.Tensor | None,
    life_lost: torch.Tensor | None,
    reward_clip: float,
    discounting: float,
    vtrace_lambda: float,
    pg_clip: float,
    normalize_advantages: bool,
    baseline_cost: float,
    entropy_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of actor_critic_loss's loss with respect to its logits and baselines
    ([T+1, B, A] and [T+1, B], the last step's zero), worked out by hand, and its terms: the
    backward pass then starts at the net's outputs instead of going back through the loss's
    ~100 small ops (a trained SpaceInvaders net's learner minibatch on a 2-core AMD EPYC without
    AVX-512, 3.57 -> 3.33 ms; with this function as the compiled op, 2.59; docs/results.md).
    The same gradients up to rounding (tests/unit/test_traced_gradients.py)."""
    logits, baselines = logits.detach(), baselines.detach()
    returns, mask = batch_returns(
        logits, baselines, behavior_logits, actions, rewards, dones, truncated, life_lost,
        reward_clip, discounting, vtrace_lambda,
    )  # fmt: skip
    actions, target_logits, values = actions[:-1], logits[:-1], baselines[:-1]
    num_samples = actions.numel()
    advantages = returns.advantages if pg_clip > 0 else returns.pg_advantages
    if normalize_advantages:
        advantages = normalized(advantages, mask)
    # The policy's loss is -sum(weights * log pi(a)) for constant weights: the advantages, or
    # for the clipped surrogate the ratio times the advantage where its unclipped side is the
    # minimum (elsewhere the clipped side is flat in the ratio).
    if pg_clip > 0:
        ratio = returns.log_rhos.exp()
        unclipped = ratio * advantages
        clipped = ratio.clamp(1 - pg_clip, 1 + pg_clip) * advantages
        surrogate = torch.min(unclipped, clipped)
        weights = unclipped * (unclipped <= clipped)
        if mask is not None:
            surrogate, weights = surrogate * mask, weights * mask
        pg_loss = -surrogate.sum()
    else:
        weights = advantages
        pg_loss = -(returns.target_action_log_probs * advantages).sum()
    log_policy = F.log_softmax(target_logits, dim=-1)
    policy = log_policy.exp()
    # d log pi(a) / d logits = onehot(a) - pi.
    grad_logits = policy * weights.unsqueeze(-1)
    grad_logits.scatter_add_(-1, actions.unsqueeze(-1), -weights.unsqueeze(-1))
    # The entropy term sum(pi log pi): its gradient is pi (log pi - sum(pi log pi)).
    negative_entropy = (policy * log_policy).sum(-1)
    entropy_grad = policy * (log_policy - negative_entropy.unsqueeze(-1))
    if mask is not None:
        negative_entropy = negative_entropy * mask
        entropy_grad = entropy_grad * mask.unsqueeze(-1)
    grad_logits = (grad_logits + entropy_weight * entropy_grad) / num_samples
    errors = returns.vs - values
    grad_values = errors * (-baseline_cost / num_samples)
    terms = [
        pg_loss / num_samples,
        vtrace.baseline_loss(errors) / num_samples,
        negative_entropy.sum() / num_samples,
        clip_fraction(returns.log_rhos, pg_clip, mask),
    ]
    return (
        torch.cat([grad_logits, torch.zeros_like(grad_logits[:1])]),
        torch.cat([grad_values, torch.zeros_like(grad_values[:1])]),
        torch.stack(terms),
    )


def gradients(flags, model, batch, entropy_weight=None):
    """The gradients (one per parameter, in order) and the losses of one learner batch."""
    loss, losses = compute_loss(flags, model, batch, entropy_weight)
    return torch.autograd.grad(loss, list(model.parameters())), losses


class TracedGradients:
    """gradients() for one model as a single TorchScript call: its forward pass as
    torch.jit.trace records it (once per shape of the batch's frames), the loss and the backward
    pass. The learner thread then calls 3 torch functions from Python per batch instead of 19
    (each takes the GIL again when its kernel returns), while the main thread, which acts,
    steps the optimizer and calls moolib, holds the GIL a third of the time: in idle MinAtar
    runs a minibatch took 6.7-7.2 ms instead of 8.1-8.6, and the run made a fifth more env
    steps/s (docs/results.md). The loss's gradient with respect to the net's outputs is worked
    out by hand (output_gradients, or its compiled op where ops.py's library is built), so the
    backward pass starts at the outputs: gradients()'s up to rounding, and a SpaceInvaders
    minibatch 2.6 ms instead of 3.6 (docs/results.md).

    Only where the trace records everything the model computes (fits()); elsewhere the learner
    calls gradients()."""

    def __init__(self, model):
        self.model = model
        self.parameters = list(model.parameters())
        self.steps = {}  # (frame shape, dtype) -> the compiled step for such batches

    @staticmethod
    def fits(flags, model):
        """One of models.py's nets without an LSTM (its chunks between episode ends are Python
        control flow), in fp32 (autocast is not traced), on batches of whole unrolls (not
        minibatch_steps' loss), on the CPU (the only device it was measured on)."""
        return (
            isinstance(model, ActorCriticBase)
            and not model.use_lstm
            and model.precision == "fp32"
            and next(model.parameters()).device.type == "cpu"
            and not flags.minibatch_steps
        )

    def __call__(self, flags, model, batch, entropy_weight=None):
        """gradients(flags, model, batch, entropy_weight), for the model given when made."""
        assert model is self.model, "a TracedGradients computes the gradients of one model"
        if entropy_weight is None:
            entropy_weight = flags.entropy_cost
        frames = batch["state"]
        key = (tuple(frames.shape), frames.dtype)
        if key not in self.steps:
            step = _CompiledGradientStep if ops.loaded() else _GradientStep
            self.steps[key] = compiled(step(traced(_Outputs(model), (frames,))))
        grads, terms = self.steps[key](
            frames, self.parameters, *batch_arguments(flags, batch),
            float(flags.pg_clip), bool(flags.normalize_advantages), float(flags.baseline_cost),
            float(entropy_weight),
        )  # fmt: skip
        return grads, loss_stats(terms)


class _Outputs(torch.nn.Module):
    """The model's logits and baselines for a batch's frames: what the trace records."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, frames):
        outputs, _ = self.model({"state": frames})
        return outputs["policy_logits"], outputs["baseline"]


class _GradientStep(torch.nn.Module):
    """The traced forward pass, actor_critic_loss and the backward pass, for TorchScript."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def forward(
        self,
        frames: torch.Tensor,
        parameters: list[torch.Tensor],
        behavior_logits: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        dones: torch.Tensor,
        truncated: torch.Tensor | None,
        life_lost: torch.Tensor | None,
        reward_clip: float,
        discounting: float,
        vtrace_lambda: float,
        pg_clip: float,
        normalize_advantages: bool,
        baseline_cost: float,
        entropy_weight: float,
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        logits, baselines = self.outputs(frames)
        grad_logits, grad_baselines, terms = self.loss_gradients(
            logits.detach(), baselines.detach(), behavior_logits, actions, rewards, dones,
            truncated, life_lost, reward_clip, discounting, vtrace_lambda, pg_clip,
            normalize_advantages, baseline_cost, entropy_weight,
        )  # fmt: skip
        grads: list[torch.Tensor] = []
        outputs = [logits, baselines]
        output_grads: list[torch.Tensor | None] = [grad_logits, grad_baselines]
        for grad in torch.autograd.grad(outputs, parameters, output_grads):
            assert grad is not None  # every parameter is in the loss (as for gradients())
            grads.append(grad)
        return grads, terms

    def loss_gradients(
        self,
        logits: torch.Tensor,
        baselines: torch.Tensor,
        behavior_logits: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        dones: torch.Tensor,
        truncated: torch.Tensor | None,
        life_lost: torch.Tensor | None,
        reward_clip: float,
        discounting: float,
        vtrace_lambda: float,
        pg_clip: float,
        normalize_advantages: bool,
        baseline_cost: float,
        entropy_weight: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return output_gradients(
            logits, baselines, behavior_logits, actions, rewards, dones, truncated, life_lost,
            reward_clip, discounting, vtrace_lambda, pg_clip, normalize_advantages,
            baseline_cost, entropy_weight,
        )  # fmt: skip


class _CompiledGradientStep(_GradientStep):
    """_GradientStep with output_gradients as the compiled op (csrc/vtrace_loss.cpp, ops.py):
    one call instead of about 150 small tensor ops, whose dispatch cost more than their
    arithmetic (0.4 ms against 0.03 for a MinAtar minibatch)."""

    def loss_gradients(
        self,
        logits: torch.Tensor,
        baselines: torch.Tensor,
        behavior_logits: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        dones: torch.Tensor,
        truncated: torch.Tensor | None,
        life_lost: torch.Tensor | None,
        reward_clip: float,
        discounting: float,
        vtrace_lambda: float,
        pg_clip: float,
        normalize_advantages: bool,
        baseline_cost: float,
        entropy_weight: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if truncated is not None:
            truncated = truncated.to(torch.bool).contiguous()
        if life_lost is not None:
            life_lost = life_lost.to(torch.bool).contiguous()
        return torch.ops.moolib_examples.vtrace_output_gradients(
            logits.float().contiguous(), baselines.float().contiguous(),
            behavior_logits.float().contiguous(), actions.long().contiguous(),
            rewards.float().contiguous(), dones.to(torch.bool).contiguous(), truncated, life_lost,
            reward_clip, discounting, vtrace_lambda, pg_clip, normalize_advantages,
            baseline_cost, entropy_weight,
        )  # fmt: skip
