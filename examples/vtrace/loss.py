"""The V-trace actor-critic loss of a learner batch, and its gradients."""

import torch

from examples.common import vtrace

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
    flags.entropy_cost when None.

    Step t holds observation t, whether it starts a new episode (done), the reward that led to
    it, the action taken from it and the acting policy's logits there.
    """
    if entropy_weight is None:
        entropy_weight = flags.entropy_cost
    if "vs" in batch:
        return step_loss(flags, model, batch, entropy_weight)
    core_state = batch.get("core_state", ())
    outputs, _ = model({"state": batch["state"], "done": batch["done"]}, core_state)
    returns, mask = vtrace_returns(flags, batch, outputs)
    logits = outputs["policy_logits"][:-1]
    values = outputs["baseline"][:-1]
    actions = batch["action"][:-1]
    num_samples = actions.numel()
    # With pg_clip the surrogate weights each sample by its ratio itself (APPO: PPO's loss on
    # V-trace's advantages); without, V-trace's policy gradient, weighted by the clipped ratio.
    advantages = returns.advantages if flags.pg_clip else returns.pg_advantages
    if flags.normalize_advantages:
        advantages = normalized(advantages, mask)
    if flags.pg_clip:
        pg_loss = vtrace.clipped_surrogate_loss(returns.log_rhos, advantages, flags.pg_clip, mask)
    else:
        pg_loss = vtrace.policy_gradient_loss(logits, actions, advantages)
    return total_loss(
        flags,
        num_samples,
        pg_loss,
        returns.vs - values,
        logits,
        returns.log_rhos,
        mask,
        entropy_weight,
    )


def vtrace_returns(flags, batch, outputs):
    """V-trace's targets and advantages for a batch of whole unrolls, from the model's outputs
    on it; and the mask of its real transitions (None when it has no time-limit cuts)."""
    logits = outputs["policy_logits"][:-1]
    values = outputs["baseline"][:-1]
    rewards = batch["reward"][1:]
    if flags.reward_clip:
        rewards = rewards.clamp(-flags.reward_clip, flags.reward_clip)
    ends = batch["done"][1:]
    if "life_lost" in batch:  # env.episodic_life: a lost life ends the returns as well
        ends = ends | batch["life_lost"][1:]
    discounts = (~ends).float() * flags.discounting
    actions = batch["action"][:-1]
    # The step that leaves the last observation of a time-limit cut is a filler
    # (envs.truncation_step): it bootstraps nothing and teaches nothing.
    mask = ~batch["truncated"][:-1] if "truncated" in batch else None
    returns = vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"][:-1],
        target_policy_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=outputs["baseline"][-1].detach(),
        mask=mask,
        lambda_=flags.vtrace_lambda,
    )
    return returns, mask


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
    return total_loss(flags, mask.numel(), pg_loss, errors, logits, log_rhos, mask, entropy_weight)


def total_loss(flags, num_samples, pg_loss, value_errors, logits, log_rhos, mask, entropy_weight):
    """The weighted sum of the policy, baseline and entropy terms, each a mean over the samples,
    and the numbers for the log."""
    pg_loss = pg_loss / num_samples
    baseline_loss = vtrace.baseline_loss(value_errors) / num_samples
    entropy_loss = vtrace.entropy_loss(logits, mask) / num_samples
    total = pg_loss + flags.baseline_cost * baseline_loss + entropy_weight * entropy_loss
    stats = {"pg_loss": pg_loss.item(), "baseline_loss": baseline_loss.item(),
             "entropy_loss": entropy_loss.item(),
             "clip_fraction": clip_fraction(log_rhos, flags.pg_clip, mask)}  # fmt: skip
    return total, stats


def clip_fraction(log_rhos, clip, mask=None):
    """The share of samples whose ratio pi/mu is outside [1 - clip, 1 + clip] (NaN without
    pg_clip): those give no policy gradient. It grows with the policy's lag behind the learner."""
    if not clip:
        return float("nan")
    outside = (log_rhos.detach().exp() - 1).abs() > clip
    return (outside if mask is None else outside[mask]).float().mean().item()


def normalized(advantages, mask=None):
    """Advantages scaled to mean 0 and standard deviation 1 over the batch's real transitions
    (as PPO does): the policy's share of the gradient no longer shrinks with sparse rewards."""
    real = advantages if mask is None else advantages[mask]
    if real.numel() < 2:
        return advantages
    scaled = (advantages - real.mean()) / (real.std() + 1e-8)
    return scaled if mask is None else scaled * mask


def gradients(flags, model, batch, entropy_weight=None):
    """The gradients (one per parameter, in order) and the losses of one learner batch."""
    loss, losses = compute_loss(flags, model, batch, entropy_weight)
    return torch.autograd.grad(loss, list(model.parameters())), losses
