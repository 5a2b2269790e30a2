"""env.episodic_life: the EnvPool adapter flags the step that loses a life, and the learner's
returns end there as at an episode's end, while the game (and its return) goes on."""

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from examples.common.envs import LIFE_LOST_KEY, TRUNCATED_KEY, OldGymApi, make_env
from examples.vtrace.loss import vtrace_returns


class Lives(gym.Env):
    """obs = step count; reward 1 per step; a life lost at each step in `losses`; the game
    ends when the lives are gone, or is cut by a time limit at `limit`."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, losses=(2, 4), limit=None):
        self.losses, self.limit = losses, limit

    def reset(self, seed=None, options=None):
        self.t, self.lives = 0, len(self.losses)
        return np.array([0.0], np.float32), {"lives": self.lives}

    def step(self, action):
        self.t += 1
        self.lives -= self.t in self.losses
        obs = np.array([float(self.t)], np.float32)
        return obs, 1.0, self.lives == 0, self.t == self.limit, {"lives": self.lives}


def play(api, steps):
    """(life_lost, done) of each step."""
    return [
        (bool(obs[LIFE_LOST_KEY]), done) for obs, _, done, _ in (api.step(0) for _ in range(steps))
    ]


def test_the_step_that_loses_a_life_is_flagged_and_the_game_goes_on():
    api = OldGymApi(Lives(losses=(2, 4)), mark_truncation=True, mark_life_loss=True)
    assert not api.reset()[LIFE_LOST_KEY]
    # The first life goes at step 2 (the game goes on), the last at step 4 (the game ends).
    assert play(api, 4) == [(False, False), (True, False), (False, False), (True, True)]
    # A new game starts with all its lives: nothing is flagged until one is lost again.
    api.reset()
    assert play(api, 2) == [(False, False), (True, False)]


def test_a_time_limit_cut_keeps_its_life_flag_and_its_filler_has_none():
    api = OldGymApi(Lives(losses=(2, 9), limit=2), mark_truncation=True, mark_life_loss=True)
    api.reset()
    api.step(0)
    obs, _, done, _ = api.step(0)
    assert obs[TRUNCATED_KEY] and obs[LIFE_LOST_KEY] and not done
    obs, _, done, _ = api.step(0)  # the filler
    assert done and not obs[LIFE_LOST_KEY]


def test_no_flag_without_the_option_and_none_for_games_without_lives():
    api = OldGymApi(Lives(), mark_truncation=True)
    assert LIFE_LOST_KEY not in api.reset()
    with pytest.raises(ValueError, match="mark_truncation"):
        OldGymApi(Lives(), mark_life_loss=True)
    pong = OldGymApi(make_env("ALE/Pong-v5", seed=0), mark_truncation=True, mark_life_loss=True)
    pong.reset()
    assert not any(lost for lost, _ in play(pong, 300))
    pong.close()


def test_breakout_flags_each_of_its_five_lives():
    api = OldGymApi(make_env("ALE/Breakout-v5", seed=0), mark_truncation=True, mark_life_loss=True)
    api.reset()
    fire, flags = 1, []
    for _ in range(20_000):  # each life ends within a few hundred steps of firing the ball
        obs, _, done, _ = api.step(fire)
        flags.append(bool(obs[LIFE_LOST_KEY]))
        if done:
            break
    assert done and sum(flags) == 5 and flags[-1]
    api.close()


def returns(batch):
    flags = SimpleNamespace(reward_clip=0, discounting=0.5, vtrace_lambda=1.0)
    T, B = batch["reward"].shape[0] - 1, 1
    outputs = {"policy_logits": torch.zeros(T + 1, B, 2), "baseline": torch.full((T + 1, B), 10.0)}
    batch = {"action": torch.zeros(T + 1, B, dtype=torch.long),
             "policy_logits": torch.zeros(T + 1, B, 2), **batch}  # fmt: skip
    return vtrace_returns(flags, batch, outputs)[0].vs[:, 0].tolist()


def test_the_learners_returns_end_at_a_lost_life():
    # Four steps, reward 1 on each; values 10 everywhere. Observation 2 comes after a lost life.
    batch = {"reward": torch.ones(5, 1), "done": torch.zeros(5, 1, dtype=torch.bool)}
    lost = torch.zeros(5, 1, dtype=torch.bool)
    lost[2] = True
    without = returns(batch)
    with_life = returns({**batch, "life_lost": lost})
    # The step into observation 2 ends the return: 1 + 0.5 * 1 from observation 0, 1 from 1.
    assert with_life[:2] == [1.5, 1.0]
    # Without the flag it goes on through the lost life; after it the two are the same.
    assert without[:2] == [1 + 0.5 * (1 + 0.5 * without[2]), 1 + 0.5 * without[2]]
    assert with_life[2:] == without[2:]
