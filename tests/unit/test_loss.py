"""The V-trace loss's parts: normalize_advantages (mean 0, std 1 over a batch's real transitions,
the filler steps of time-limit cuts left out and kept at 0), the clipped surrogate,
clip_fraction and the entropy cost's schedule."""

import math

import pytest
import torch

from examples.vtrace.loss import clip_fraction, normalized


def test_advantages_are_scaled_over_the_real_transitions_only():
    torch.manual_seed(0)
    advantages = torch.randn(20, 4) * 0.01 + 0.003  # sparse rewards: small advantages
    mask = torch.ones(20, 4, dtype=torch.bool)
    mask[5, 1] = mask[12, 3] = False
    advantages[~mask] = 0.0
    scaled = normalized(advantages, mask)
    real = scaled[mask]
    assert torch.allclose(real.mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(real.std(), torch.tensor(1.0), atol=1e-5)
    assert torch.equal(scaled[~mask], torch.zeros(2))
    # The order of the advantages is kept: the same actions are preferred, more strongly.
    assert torch.equal(real.argsort(), advantages[mask].argsort())


def test_without_a_mask_and_with_too_few_samples():
    advantages = torch.tensor([[1.0, 3.0]])
    assert torch.allclose(normalized(advantages), torch.tensor([[-0.7071, 0.7071]]), atol=1e-4)
    one = torch.tensor([[2.0]])
    assert torch.equal(normalized(one), one)


def test_clipped_surrogate_gives_no_gradient_once_the_ratio_left_the_clip_range():
    from examples.common.vtrace import clipped_surrogate_loss

    # Ratios 0.5, 1.0 and 1.5 with clip 0.2: positive advantages push the ratio up, so only a
    # ratio below 1.2 gets a gradient; negative ones push it down, so only one above 0.8 does.
    log_rhos = torch.tensor([[0.5, 1.0, 1.5]]).log().requires_grad_()
    # d(-r A)/d(log r) = -r A where the ratio counts, 0 where it is clipped.
    for advantage, expected in [(1.0, [-0.5, -1.0, 0.0]), (-1.0, [0.0, 1.0, 1.5])]:
        loss = clipped_surrogate_loss(log_rhos, torch.full((1, 3), advantage), clip=0.2)
        (grad,) = torch.autograd.grad(loss, log_rhos)
        torch.testing.assert_close(grad, torch.tensor([expected]))
    masked = clipped_surrogate_loss(log_rhos, torch.ones(1, 3), 0.2, torch.tensor([[1, 0, 1]]))
    torch.testing.assert_close(masked, -torch.tensor(0.5 + 1.2))


def linear_net_and_batch(T=5, B=3, A=4):
    """A linear actor-critic on 2 features, its forward as the models' (inputs, core_state) ->
    (outputs, core_state), and a learner batch [T+1, B] of random steps and acting logits."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, A + 1)

    def net(inputs, core_state):
        out = model(inputs["state"])
        return {"policy_logits": out[..., :A], "baseline": out[..., A]}, ()

    batch = {"state": torch.randn(T + 1, B, 2), "done": torch.zeros(T + 1, B, dtype=torch.bool),
             "reward": torch.randn(T + 1, B), "action": torch.randint(A, (T + 1, B)),
             "policy_logits": torch.randn(T + 1, B, A)}  # fmt: skip
    return model, net, batch


def test_pg_clip_loss_equals_the_policy_gradient_on_policy():
    """With the actor's own policy (ratio 1), PPO's surrogate and V-trace's policy gradient have
    the same gradient: pg_clip changes the passes after the first, not the first one."""
    from types import SimpleNamespace

    from examples.vtrace.loss import compute_loss

    model, net, batch = linear_net_and_batch()
    with torch.no_grad():  # the batch acted by the net itself
        batch["policy_logits"] = net(batch, ())[0]["policy_logits"]
    grads = []
    for pg_clip in (0.0, 0.2):
        flags = SimpleNamespace(reward_clip=1.0, discounting=0.99, normalize_advantages=True,
                                pg_clip=pg_clip, baseline_cost=0.5, entropy_cost=0.01,
                                vtrace_lambda=1.0)  # fmt: skip
        loss, _ = compute_loss(flags, net, batch)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    for with_clip, without in zip(*grads, strict=True):
        torch.testing.assert_close(with_clip, without)


def test_clip_fraction_counts_the_ratios_outside_the_clip_range():
    ratios = torch.tensor([[1.0, 1.05, 1.3], [0.7, 0.95, 1.0]])
    assert clip_fraction(ratios.log(), 0.1) == pytest.approx(2 / 6)
    mask = torch.tensor([[True, True, False], [True, True, True]])  # leaves out the 1.3
    assert clip_fraction(ratios.log(), 0.1, mask) == pytest.approx(1 / 5)
    assert math.isnan(clip_fraction(ratios.log(), 0.0))  # no clipped surrogate, nothing clipped


def test_entropy_cost_goes_linearly_to_entropy_cost_end_at_total_steps():
    from types import SimpleNamespace

    from examples.vtrace.loss import entropy_cost

    constant = SimpleNamespace(entropy_cost=0.02, entropy_cost_end=None, total_steps=1000)
    assert [entropy_cost(constant, s) for s in (0, 500, 5000)] == [0.02] * 3
    decaying = SimpleNamespace(entropy_cost=0.02, entropy_cost_end=0.005, total_steps=1000)
    costs = [entropy_cost(decaying, s) for s in (0, 200, 500, 1000, 1500)]
    assert costs == pytest.approx([0.02, 0.017, 0.0125, 0.005, 0.005])  # kept past total_steps


def test_the_entropy_weight_given_replaces_entropy_cost_in_the_loss():
    from types import SimpleNamespace

    from examples.vtrace.loss import compute_loss

    _, net, batch = linear_net_and_batch()
    flags = SimpleNamespace(reward_clip=1.0, discounting=0.99, normalize_advantages=False,
                            pg_clip=0.1, baseline_cost=0.5, entropy_cost=0.01,
                            vtrace_lambda=1.0)  # fmt: skip
    with torch.no_grad():
        default, stats = compute_loss(flags, net, batch)
        weighted, _ = compute_loss(flags, net, batch, entropy_weight=0.03)
    torch.testing.assert_close(
        weighted - default, (0.03 - 0.01) * torch.tensor(stats["entropy_loss"])
    )


def test_a_negative_entropy_cost_end_is_refused():
    from omegaconf import OmegaConf

    from examples.vtrace.config import ConfigError, ExperimentConfig, check_flags

    with pytest.raises(ConfigError, match="entropy_cost_end"):
        check_flags(OmegaConf.structured(ExperimentConfig(entropy_cost_end=-0.01)))
    check_flags(OmegaConf.structured(ExperimentConfig(entropy_cost_end=0.0)))
