"""minatar_speedup: the same numbers as numpy's roll and sum, the same SpaceInvaders episodes."""

import numpy as np
import pytest

from examples.common import minatar_speedup
from examples.common.envs import make_env

pytest.importorskip("minatar")
from minatar import Environment  # noqa: E402
from minatar.environments import space_invaders  # noqa: E402


@pytest.mark.parametrize("shape", [(10,), (10, 10), (3, 4, 5)])
@pytest.mark.parametrize("shift", [-11, -3, -1, 0, 1, 2, 10, 13])
def test_roll_is_numpys_roll(shape, shift):
    a = np.random.default_rng(0).integers(0, 5, shape)
    for axis in range(-len(shape), len(shape)):
        rolled = minatar_speedup.roll(a, shift, axis=axis)
        assert rolled.dtype == a.dtype
        np.testing.assert_array_equal(rolled, np.roll(a, shift, axis=axis))
        assert not np.shares_memory(rolled, a)
    np.testing.assert_array_equal(minatar_speedup.roll(a, shift), np.roll(a, shift))
    np.testing.assert_array_equal(
        minatar_speedup.roll(a.astype(bool), np.int64(shift), axis=0),
        np.roll(a.astype(bool), shift, axis=0),
    )


def test_roll_of_several_axes_is_left_to_numpy():
    a = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(
        minatar_speedup.roll(a, (1, -1), axis=(0, 1)), np.roll(a, (1, -1), axis=(0, 1))
    )


def test_sum_is_numpys_sum():
    a = np.random.default_rng(0).random((10, 10)) > 0.5
    assert minatar_speedup.array_sum(a) == np.sum(a)
    assert type(minatar_speedup.array_sum(a)) is type(np.sum(a))
    np.testing.assert_array_equal(minatar_speedup.array_sum(a, axis=1), np.sum(a, axis=1))
    assert minatar_speedup.array_sum([1, 2, 3]) == 6


def play_space_invaders(seed, steps=4000):
    """Observations, rewards and ends of seeded SpaceInvaders games under a seeded policy that
    fires often, so bullets fly, aliens die and the aliens march and descend."""
    env = Environment("space_invaders", sticky_action_prob=0.1)
    env.seed(seed)
    env.reset()
    actions = np.random.default_rng(seed).choice(6, size=steps, p=[0.1, 0.15, 0.15, 0.1, 0.1, 0.4])
    frames, rewards, ends = [], [], []
    for action in actions:
        reward, done = env.act(int(action))
        frames.append(env.state().copy())
        rewards.append(reward)
        ends.append(done)
        if done:
            env.reset()
    return np.stack(frames), np.array(rewards), np.array(ends)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_space_invaders_plays_the_same(seed, monkeypatch):
    monkeypatch.setattr(space_invaders, "np", np)
    frames, rewards, ends = play_space_invaders(seed)
    monkeypatch.setattr(space_invaders, "np", minatar_speedup.LeanNumpy())
    lean_frames, lean_rewards, lean_ends = play_space_invaders(seed)
    assert rewards.sum() > 20 and ends.sum() >= 3  # aliens were shot, games ended
    np.testing.assert_array_equal(lean_frames, frames)
    np.testing.assert_array_equal(lean_rewards, rewards)
    np.testing.assert_array_equal(lean_ends, ends)


def test_making_a_minatar_env_installs_it(monkeypatch):
    monkeypatch.setattr(space_invaders, "np", np)
    make_env("MinAtar/SpaceInvaders-v1", seed=0).close()
    assert isinstance(space_invaders.np, minatar_speedup.LeanNumpy)
    assert space_invaders.np.count_nonzero is np.count_nonzero
