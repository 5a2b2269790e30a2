"""normalize_advantages: the policy gradient's advantages at mean 0 and std 1 over a batch's
real transitions, the filler steps of time-limit cuts left out and kept at 0."""

import torch

from examples.vtrace.loss import normalized


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
