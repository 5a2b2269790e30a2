"""examples/a2c.py without processes: the loss by hand, the LSTM reset and the command line."""

import math

import pytest
import torch

from examples.a2c import Policy, a2c_loss, parse_args


def test_loss_matches_a_hand_computation():
    # One env, T = 2 (three steps); the episode ends on the second action (done at step 2).
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]], [[0.0, 0.0]]], requires_grad=True)
    values = torch.tensor([[1.0], [2.0], [5.0]], requires_grad=True)
    actions = torch.tensor([[0], [1], [0]])
    rewards = torch.tensor([[0.0], [1.0], [2.0]])
    done = torch.tensor([[False], [False], [True]])
    gamma = 0.9
    total, stats = a2c_loss(logits, values, actions, rewards, done, gamma, 0.5, 0.01)

    # Returns: step 1 ends the episode, so no bootstrap from values[2] = 5.
    #   R1 = r2 = 2;  R0 = r1 + 0.9 * R1 = 2.8.  Advantages: 2.8 - 1 = 1.8, 2 - 2 = 0.
    # log pi: step 0 uniform -> log 0.5; step 1 pi = (0.75, 0.25), action 1 -> log 0.25.
    pg = -(math.log(0.5) * 1.8 + math.log(0.25) * 0.0) / 2
    baseline = 0.5 * (1.8**2 + 0.0**2) / 2
    neg_entropy = (2 * 0.5 * math.log(0.5) + 0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / 2
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-6)
    assert stats["baseline_loss"] == pytest.approx(baseline, rel=1e-6)
    assert stats["entropy_loss"] == pytest.approx(neg_entropy, rel=1e-6)
    assert total.item() == pytest.approx(pg + 0.5 * baseline + 0.01 * neg_entropy, rel=1e-6)

    total.backward()
    # The baseline gradient reaches the values, but the bootstrap value (step 2) gets none.
    assert values.grad[0].item() == pytest.approx(-0.5 * 1.8 / 2, rel=1e-6)
    assert values.grad[2].item() == 0.0
    # The last step's logits only bootstrap; they get no policy gradient.
    assert torch.all(logits.grad[2] == 0)


def test_bootstrap_when_no_episode_ends():
    T, B = 3, 2
    values = torch.full((T + 1, B), 10.0)
    rewards = torch.ones(T + 1, B)
    done = torch.zeros(T + 1, B, dtype=torch.bool)
    logits = torch.zeros(T + 1, B, 2)
    actions = torch.zeros(T + 1, B, dtype=torch.int64)
    _, stats = a2c_loss(logits, values, actions, rewards, done, 0.5, 1.0, 0.0)
    # R2 = 1 + 0.5 * 10 = 6; R1 = 1 + 0.5 * 6 = 4; R0 = 1 + 0.5 * 4 = 3; advantages -7, -6, -4.
    assert stats["baseline_loss"] == pytest.approx(0.5 * (49 + 36 + 16) / 3)


def test_lstm_state_resets_on_done():
    torch.manual_seed(0)
    model = Policy(4, 2, 16, use_lstm=True)
    obs = torch.randn(4, 1, 4)
    done = torch.tensor([[False], [False], [True], [False]])
    logits, _, _ = model(obs, done, model.initial_state(1))
    fresh, _, _ = model(obs[2:], torch.zeros(2, 1, dtype=torch.bool), model.initial_state(1))
    torch.testing.assert_close(logits[2:], fresh)


def test_default_address_is_loopback():
    # moolib has no authentication: the broker inside a2c.py must not listen on the network.
    args = parse_args([])
    assert args.address.startswith("127.0.0.1:")
    assert int(args.address.rsplit(":", 1)[1]) > 0
