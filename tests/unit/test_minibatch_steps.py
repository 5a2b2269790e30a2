"""minibatch_steps=true: minibatches of single steps drawn from the whole learner batch, with
targets computed once per batch. The same loss as whole unrolls when one minibatch holds every
step; every pass covers each step once; frames keep their layout; settings that cannot work are
refused."""

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from examples.common import vtrace
from examples.vtrace.config import ConfigError, ExperimentConfig, check_flags
from examples.vtrace.loss import compute_loss
from examples.vtrace.minibatches import StepMinibatches
from examples.vtrace.models import create_model, frames_for_encode

FLAGS = SimpleNamespace(
    reward_clip=1.0, discounting=0.99, normalize_advantages=True, pg_clip=0.1,
    vtrace_lambda=0.95, baseline_cost=0.5, entropy_cost=0.01, decoupled_clip=False,
)  # fmt: skip
DECOUPLED = SimpleNamespace(**{**vars(FLAGS), "decoupled_clip": True})


def atari_batch(T=6, B=4, seed=0, truncated=True):
    generator = torch.Generator().manual_seed(seed)
    batch = {
        "state": torch.randint(0, 256, (T + 1, B, 4, 84, 84), generator=generator).to(torch.uint8),
        "done": torch.rand(T + 1, B, generator=generator) < 0.2,
        "reward": torch.randint(-1, 2, (T + 1, B), generator=generator).float(),
        "action": torch.randint(0, 6, (T + 1, B), generator=generator),
        "policy_logits": torch.randn(T + 1, B, 6, generator=generator) * 0.3,
    }
    if truncated:
        batch["truncated"] = torch.zeros(T + 1, B, dtype=torch.bool)
        batch["truncated"][2, 1] = True
    return batch


def model(seed=0):
    torch.manual_seed(seed)
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return create_model(space, 6, atari_net="nature_half")


@pytest.mark.parametrize("truncated", [True, False])
def test_one_minibatch_of_every_step_gives_the_unrolls_loss(truncated):
    net = model()
    batch = frames_for_encode(net, atari_batch(truncated=truncated))
    whole, whole_stats = compute_loss(FLAGS, net, batch)
    (minibatch,) = StepMinibatches(batch, torch.Generator().manual_seed(1)).one_pass(1)
    steps = minibatch.steps(FLAGS, net)
    assert steps["state"].shape == (1, 6 * 4, 4, 84, 84)
    shuffled, shuffled_stats = compute_loss(FLAGS, net, steps)
    torch.testing.assert_close(shuffled, whole, rtol=1e-5, atol=1e-6)
    for key in whole_stats:
        assert shuffled_stats[key] == pytest.approx(whole_stats[key], rel=1e-5, abs=1e-7)
    # And the gradients agree too.
    grads = torch.autograd.grad(whole, list(net.parameters()))
    step_grads = torch.autograd.grad(compute_loss(FLAGS, net, steps)[0], list(net.parameters()))
    for a, b in zip(grads, step_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_every_pass_covers_each_step_once_in_a_new_order_and_keeps_the_frames_layout():
    net = model()
    batch = frames_for_encode(net, atari_batch())
    whole = StepMinibatches(batch, torch.Generator().manual_seed(0))
    orders = []
    for _ in range(3):
        parts = whole.one_pass(4)
        order = torch.cat([part.indices for part in parts])
        assert sorted(order.tolist()) == list(range(6 * 4))
        orders.append(tuple(order.tolist()))
        for part in parts:
            steps = part.steps(FLAGS, net)
            frames = steps["state"]
            assert frames.shape[:2] == (1, 6) and frames.flatten(0, 1).is_contiguous(
                memory_format=torch.channels_last
            )
            t, b = part.indices // 4, part.indices % 4  # step t of unroll b
            assert torch.equal(frames[0], batch["state"][t, b])
            assert torch.equal(steps["action"][0], batch["action"][t, b])
            assert torch.equal(steps["vs"][0], whole.targets["vs"][t, b])
    assert len(set(orders)) > 1


def test_targets_are_computed_once_per_batch_with_the_first_minibatchs_weights():
    net = model()
    batch = frames_for_encode(net, atari_batch())
    whole = StepMinibatches(batch, torch.Generator().manual_seed(0))
    first, second = whole.one_pass(2)
    first.steps(FLAGS, net)
    targets = whole.targets
    with torch.no_grad():
        for param in net.parameters():
            param.add_(0.1)
    second.steps(FLAGS, net)
    assert whole.targets is targets


@pytest.mark.parametrize("overrides", [{"pg_clip": 0.0}, {"use_lstm": True, "pg_clip": 0.1}])
def test_minibatch_steps_needs_the_surrogate_and_no_lstm(overrides):
    flags = OmegaConf.structured(ExperimentConfig(minibatch_steps=True, **overrides))
    with pytest.raises(ConfigError, match="minibatch_steps"):
        check_flags(flags)
    check_flags(OmegaConf.structured(ExperimentConfig(minibatch_steps=True, pg_clip=0.1)))


def on_policy(net, batch):
    """The batch as if the net's own policy had acted it."""
    with torch.no_grad():
        outputs, _ = net({"state": batch["state"], "done": batch["done"]})
    return {**batch, "policy_logits": outputs["policy_logits"].clone()}


def test_decoupled_clip_is_ppos_loss_when_the_policy_that_acted_is_the_batch_start():
    net = model()
    batch = on_policy(net, frames_for_encode(net, atari_batch()))
    for flags in (FLAGS, DECOUPLED):
        (minibatch,) = StepMinibatches(batch, torch.Generator().manual_seed(1)).one_pass(1)
        steps = minibatch.steps(flags, net)
        loss, stats = compute_loss(flags, net, steps)
        if flags is FLAGS:
            expected, expected_stats = loss, stats
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert stats == pytest.approx(expected_stats, rel=1e-5, abs=1e-7)


def test_decoupled_clip_centres_the_ratio_on_the_batch_start_and_weights_by_the_lag():
    net = model()
    batch = frames_for_encode(net, atari_batch())  # acted by another policy: a lagging one
    first, second = StepMinibatches(batch, torch.Generator().manual_seed(1)).one_pass(2)
    steps = first.steps(DECOUPLED, net)
    # On the weights that computed the targets the ratio is 1: nothing is clipped.
    _, stats = compute_loss(DECOUPLED, net, steps)
    assert stats["clip_fraction"] == 0.0
    assert compute_loss(FLAGS, net, steps)[1]["clip_fraction"] > 0.2  # against the acting one
    # The policy term's gradient is then -sum(min(1, pi/mu) * A * grad log pi) / N.
    outputs, _ = net({"state": steps["state"], "done": steps["done"]})
    log_probs = vtrace.action_log_probs(outputs["policy_logits"], steps["action"])
    acting = vtrace.action_log_probs(steps["policy_logits"], steps["action"])
    weights = (log_probs.detach() - acting).exp().clamp(max=1.0)
    advantages = steps["advantages"]
    real = advantages[steps["mask"]]
    advantages = (advantages - real.mean()) / (real.std() + 1e-8) * steps["mask"]
    expected = -(weights * advantages * log_probs).sum() / steps["mask"].numel()
    pg_loss = (
        vtrace.clipped_surrogate_loss(
            log_probs - steps["start_log_probs"], advantages, 0.1, steps["mask"], weights
        )
        / steps["mask"].numel()
    )
    params = list(net.parameters())
    got = torch.autograd.grad(pg_loss, params, allow_unused=True, retain_graph=True)
    wanted = torch.autograd.grad(expected, params, allow_unused=True)
    for a, b in zip(got, wanted, strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # Later minibatches keep the start's log-probabilities, not the weights they learn on.
    with torch.no_grad():
        net.policy.weight.add_(torch.randn_like(net.policy.weight))
    later = second.steps(DECOUPLED, net)
    t, b = second.indices // 4, second.indices % 4
    start = first.minibatches.targets["start_log_probs"]
    torch.testing.assert_close(later["start_log_probs"][0], start[t, b])
    assert compute_loss(DECOUPLED, net, later)[1]["clip_fraction"] > 0


def test_decoupled_clip_needs_minibatch_steps():
    flags = OmegaConf.structured(ExperimentConfig(decoupled_clip=True, pg_clip=0.1))
    with pytest.raises(ConfigError, match="decoupled_clip=true needs minibatch_steps=true"):
        check_flags(flags)
    both = ExperimentConfig(decoupled_clip=True, minibatch_steps=True, pg_clip=0.1)
    check_flags(OmegaConf.structured(both))
