"""Time-limit cuts: the EnvPool adapter keeps them apart from real ends, and V-trace bootstraps
from the last observation of a cut episode instead of learning it as a terminal state."""

import gymnasium as gym
import numpy as np
import torch

from examples.common import vtrace
from examples.common.envs import TRUNCATED_KEY, OldGymApi


class Counter(gym.Env):
    """obs = step count; reward 1 per step; truncated at `limit`, terminated at `end`."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, limit=3, end=None):
        self.limit, self.end, self.t = limit, end, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([float(self.t)], np.float32)
        return obs, 1.0, self.t == self.end, self.t == self.limit, {}


def test_unmarked_api_folds_truncation_into_done():
    api = OldGymApi(Counter(limit=2))
    assert api.reset().tolist() == [0.0]
    assert api.step(0)[2] is False
    obs, reward, done, _ = api.step(0)
    assert (obs.tolist(), reward, done) == ([2.0], 1.0, True)


def test_truncation_spreads_over_two_steps():
    api = OldGymApi(Counter(limit=2), mark_truncation=True)
    first = api.reset()
    assert first["state"].tolist() == [0.0] and not first[TRUNCATED_KEY]
    obs, reward, done, _ = api.step(1)
    assert (obs["state"].tolist(), bool(obs[TRUNCATED_KEY]), reward, done) == (
        [1.0],
        False,
        1.0,
        False,
    )
    # The cut: the last observation with its reward, not done, flagged.
    obs, reward, done, _ = api.step(1)
    assert (obs["state"].tolist(), bool(obs[TRUNCATED_KEY]), reward, done) == (
        [2.0],
        True,
        1.0,
        False,
    )
    # The filler: the action is ignored, no reward, done (EnvPool resets next).
    obs, reward, done, _ = api.step(1)
    assert (bool(obs[TRUNCATED_KEY]), reward, done) == (False, 0.0, True)
    assert api.env.t == 2  # the env was not stepped by the filler
    assert api.reset()["state"].tolist() == [0.0]


def test_termination_at_the_limit_is_a_real_end():
    api = OldGymApi(Counter(limit=2, end=2), mark_truncation=True)
    api.reset()
    api.step(0)
    obs, reward, done, _ = api.step(0)
    assert done and not obs[TRUNCATED_KEY] and reward == 1.0


def test_reset_after_cut_forgets_the_pending_filler():
    api = OldGymApi(Counter(limit=1), mark_truncation=True)
    api.reset()
    assert api.step(0)[0][TRUNCATED_KEY]
    api.reset()
    obs, _, done, _ = api.step(0)
    assert obs[TRUNCATED_KEY] and not done  # a fresh cut, not the old filler


def truncated_unroll(T=6, B=1, cut=3, value=5.0, gamma=0.9):
    """On-policy unroll where step `cut` is the flagged last obs and step cut+1 the filler."""
    log_rhos = torch.zeros(T, B)
    rewards = torch.ones(T, B)
    rewards[cut] = 0.0  # the filler's reward
    discounts = torch.full((T, B), gamma)
    discounts[cut] = 0.0  # the filler is done: nothing crosses into the next episode
    values = torch.full((T, B), value)
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[cut] = False
    return log_rhos, discounts, rewards, values, torch.full((B,), value), mask


def test_masked_step_is_bootstrapped_not_learned():
    log_rhos, discounts, rewards, values, bootstrap, mask = truncated_unroll()
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap, mask=mask)
    # The value of the cut observation is left as it is (no target of 0 for it) ...
    assert out.vs[3].item() == values[3].item()
    assert out.pg_advantages[3].item() == 0.0
    # ... and the step before it bootstraps from it: 1 + 0.9 * 5 - 5.
    assert abs(out.pg_advantages[2].item() - (1.0 + 0.9 * 5.0 - 5.0)) < 1e-6
    # Without the mask the cut observation is learned as terminal: a target of 0.
    unmasked = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    assert unmasked.vs[3].item() == 0.0


def test_nothing_leaks_across_the_cut():
    log_rhos, discounts, rewards, values, bootstrap, mask = truncated_unroll()
    base = vtrace.from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap, mask=mask
    )
    changed = rewards.clone()
    changed[4:] += 100.0  # the next episode
    after = vtrace.from_importance_weights(
        log_rhos, discounts, changed, values, bootstrap, mask=mask
    )
    assert torch.equal(base.vs[:4], after.vs[:4])
    assert torch.equal(base.pg_advantages[:4], after.pg_advantages[:4])


def test_all_true_mask_changes_nothing():
    gen = torch.Generator().manual_seed(0)
    T, B = 7, 3
    args = (torch.randn(T, B, generator=gen), torch.full((T, B), 0.9),
            torch.randn(T, B, generator=gen), torch.randn(T, B, generator=gen),
            torch.randn(B, generator=gen))  # fmt: skip
    plain = vtrace.from_importance_weights(*args)
    masked = vtrace.from_importance_weights(*args, mask=torch.ones(T, B, dtype=torch.bool))
    assert torch.equal(plain.vs, masked.vs)
    assert torch.equal(plain.pg_advantages, masked.pg_advantages)


def test_entropy_loss_leaves_out_masked_steps():
    logits = torch.randn(2, 1, 3)
    mask = torch.tensor([[True], [False]])
    assert torch.allclose(vtrace.entropy_loss(logits, mask), vtrace.entropy_loss(logits[:1]))
