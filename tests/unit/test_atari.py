"""AtariFrames gives what gymnasium's AtariPreprocessing + FrameStackObservation give, faster."""

import gymnasium as gym
import numpy as np
import pytest

from examples.common.atari import AtariFrames
from examples.common.envs import make_env, register_all


def gymnasium_reference(name, noop_max, frame_skip, full_action_space=False):
    env = gym.make(name, frameskip=1, repeat_action_probability=0.25,
                   full_action_space=full_action_space)  # fmt: skip
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=frame_skip, screen_size=84, grayscale_obs=True
    )
    return gym.wrappers.FrameStackObservation(env, stack_size=4)


def ours(name, noop_max, frame_skip, full_action_space=False):
    env = gym.make(name, frameskip=1, repeat_action_probability=0.25,
                   full_action_space=full_action_space)  # fmt: skip
    return AtariFrames(env, noop_max=noop_max, frame_skip=frame_skip)


@pytest.mark.parametrize(
    "name, noop_max, frame_skip, full_action_space",
    [("ALE/Pong-v5", 30, 4, False), ("ALE/Breakout-v5", 0, 3, True)],
)
def test_same_frames_rewards_and_ends_as_gymnasium(name, noop_max, frame_skip, full_action_space):
    register_all()
    makers = (gymnasium_reference, ours)
    envs = [make(name, noop_max, frame_skip, full_action_space) for make in makers]
    assert envs[0].observation_space == envs[1].observation_space
    assert envs[0].action_space == envs[1].action_space
    actions = np.random.default_rng(0).integers(envs[0].action_space.n, size=2500)
    obs = [env.reset(seed=3)[0] for env in envs]
    np.testing.assert_array_equal(obs[0], obs[1])
    episodes = 0
    for action in actions:
        out = [env.step(action) for env in envs]
        np.testing.assert_array_equal(out[0][0], out[1][0])
        assert out[0][1:4] == out[1][1:4]  # reward, terminated, truncated
        if out[0][2] or out[0][3]:
            episodes += 1
            obs = [env.reset()[0] for env in envs]
            np.testing.assert_array_equal(obs[0], obs[1])
    # Breakout with random actions ends its episodes within the steps above: resets compared too.
    assert episodes > 0 or name == "ALE/Pong-v5"
    for env in envs:
        env.close()


def test_observations_are_not_views_of_the_stack():
    env = make_env("ALE/Pong-v5", seed=0)
    first, _ = env.reset(seed=0)
    kept = first.copy()
    for _ in range(5):
        env.step(0)
    np.testing.assert_array_equal(first, kept)
    assert env.observation_space.shape == (4, 84, 84)
    assert env.action_space.n == 6  # v5's minimal action set by default
    assert make_env("ALE/Pong-v5", full_action_space=True).action_space.n == 18


def test_refuses_an_env_that_skips_frames_itself():
    register_all()
    with pytest.raises(ValueError, match="frameskip=1"):
        AtariFrames(gym.make("ALE/Pong-v5"))
