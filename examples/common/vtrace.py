"""V-trace off-policy targets and the IMPALA loss terms (Espeholt et al. 2018, section 4).

All sequence tensors are time-major: [T, B] (or [T, B, A] for logits).
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from examples.common.torchscript import compiled


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] V-trace value targets
    pg_advantages: torch.Tensor  # [T, B] importance-weighted policy-gradient advantages
    # [T, B] the same advantages before the importance weight, r + gamma * vs_{s+1} - V(x_s):
    # for losses that weight by the ratio themselves (PPO's clipped surrogate)
    advantages: torch.Tensor


class VTraceFromLogitsReturns(NamedTuple):
    vs: torch.Tensor
    pg_advantages: torch.Tensor
    advantages: torch.Tensor
    log_rhos: torch.Tensor
    behavior_action_log_probs: torch.Tensor
    target_action_log_probs: torch.Tensor


@compiled
def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a) for logits [T, B, A] and actions [T, B]; returns [T, B]."""
    log_probs = F.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


@compiled
def discounted_sums(terms: torch.Tensor, decays: torch.Tensor) -> torch.Tensor:
    """x_s = terms_s + decays_s x_{s+1} for every s, x_T = 0 ([T, B] each): the sum over t >= s
    of terms_t times decays_s ... decays_{t-1}, as one [T, T, B] product rather than a loop over
    the T steps (T x T x B is 3,200 numbers for MinAtar's minibatches, 51k for T=80, B=8)."""
    T = terms.shape[0]
    later = torch.ones(T, T, dtype=torch.bool, device=terms.device).triu().unsqueeze(-1)
    # products[s, j] = decays_s * ... * decays_j where j >= s, 0 where j < s.
    products = torch.where(later, decays, torch.ones_like(decays)).cumprod(1) * later
    next_terms = torch.cat([terms[1:], torch.zeros_like(terms[:1])])
    return terms + (products * next_terms).sum(1)


@compiled
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    mask: torch.Tensor | None = None,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance weights log(pi(a)/mu(a)).

    Targets are constants for the learner: the inputs are detached. A threshold of None disables
    clipping.
    ``mask`` ([T, B], false = not a real transition, such as the filler step after a time-limit
    cut) zeroes that step's TD error, trace and advantage: there vs = V(x), so its value is
    neither trained nor passed on, and the step before still bootstraps from V(x).
    ``lambda_`` scales the traces (c_s = lambda * min(1, rho_s), the paper's section 4.2): on
    policy, vs is then the lambda-return of GAE (Schulman et al. 2016) instead of the n-step one.
    """
    log_rhos, discounts, rewards = log_rhos.detach(), discounts.detach(), rewards.detach()
    values, bootstrap_value = values.detach(), bootstrap_value.detach()
    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    # The paper's c-bar is fixed at 1: traces are cut as soon as the target policy is less
    # likely than the behaviour policy, which keeps the variance of the product bounded.
    cs = lambda_ * rhos.clamp(max=1.0)
    if mask is not None:
        clipped_rhos = clipped_rhos * mask
        cs = cs * mask

    # V(x_{s+1}) for every s, with the bootstrap value standing in for V(x_T).
    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

    # vs_s - V(x_s) = delta_s + gamma_s c_s (vs_{s+1} - V(x_{s+1})), and vs_T - V(x_T) = 0.
    vs_minus_v_xs = discounted_sums(deltas, discounts * cs)
    vs = vs_minus_v_xs + values

    # The policy gradient bootstraps from vs_{s+1} (a better estimate than V(x_{s+1})).
    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    if clip_pg_rho_threshold is None:
        clipped_pg_rhos = rhos
    else:
        clipped_pg_rhos = rhos.clamp(max=clip_pg_rho_threshold)
    advantages = rewards + discounts * vs_t_plus_1 - values
    if mask is not None:
        clipped_pg_rhos = clipped_pg_rhos * mask
        advantages = advantages * mask
    pg_advantages = clipped_pg_rhos * advantages

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, advantages=advantages)


@compiled
def from_logits(
    behavior_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    mask: torch.Tensor | None = None,
    lambda_: float = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace from the actor's (behaviour) and learner's (target) policy logits."""
    target_action_log_probs = action_log_probs(target_policy_logits, actions)
    behavior_action_log_probs = action_log_probs(behavior_policy_logits, actions)
    log_rhos = target_action_log_probs - behavior_action_log_probs
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        mask=mask,
        lambda_=lambda_,
    )
    return VTraceFromLogitsReturns(
        vs=vtrace_returns.vs,
        pg_advantages=vtrace_returns.pg_advantages,
        advantages=vtrace_returns.advantages,
        log_rhos=log_rhos,
        behavior_action_log_probs=behavior_action_log_probs,
        target_action_log_probs=target_action_log_probs,
    )


# Loss terms. They are sums over T and B, not means: the learner weights each one by its own
# cost coefficient (baseline_cost, entropy_cost), so the batch-size scaling is left to it.


@compiled
def policy_gradient_loss(
    logits: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """Sum of -log pi(a) * advantage; the advantages are treated as constants."""
    return -(action_log_probs(logits, actions) * advantages.detach()).sum()


@compiled
def clipped_surrogate_loss(
    log_rhos: torch.Tensor,
    advantages: torch.Tensor,
    clip: float,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate (Schulman et al. 2017), negated and summed: with the ratio
    r = pi(a) / mu(a) = exp(log_rhos), -min(r * A, clamp(r, 1 - clip, 1 + clip) * A). Once the
    learner's policy has moved past the clip range on a sample, that sample gives no gradient:
    several passes over one batch cannot push the policy far from the one that acted.
    ``weights`` (constants) scale each sample's term: the decoupled objective's importance
    weights when mu is not the policy that acted."""
    ratio = log_rhos.exp()
    advantages = advantages.detach()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    if weights is not None:
        surrogate = surrogate * weights.detach()
    if mask is not None:
        surrogate = surrogate * mask
    return -surrogate.sum()


@compiled
def baseline_loss(advantages: torch.Tensor) -> torch.Tensor:
    """0.5 * sum of squared advantages (e.g. vs - V(x))."""
    return 0.5 * (advantages**2).sum()


@compiled
def entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of pi * log pi, i.e. the negative entropy; minimising it encourages exploration.

    ``mask`` ([T, B]) leaves out the steps where it is false."""
    log_policy = F.log_softmax(logits, dim=-1)
    negative_entropy = (log_policy.exp() * log_policy).sum(-1)
    if mask is not None:
        negative_entropy = negative_entropy * mask
    return negative_entropy.sum()
