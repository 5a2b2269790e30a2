"""minatar_speedup: SpaceInvaders on bitboards steps exactly as MinAtar's own SpaceInvaders, and
Freeway's frames written in one call are MinAtar's."""

import numpy as np
import pytest

pytest.importorskip("minatar")
from minatar import Environment  # noqa: E402
from minatar.environments import freeway, space_invaders  # noqa: E402

from examples.common import minatar_speedup  # noqa: E402
from examples.common.envs import make_env  # noqa: E402

BitboardSpaceInvaders = minatar_speedup.BitboardSpaceInvaders
MinAtarSpaceInvaders = BitboardSpaceInvaders.__bases__[0]  # install() may have replaced the name
SCALARS = ("pos", "alien_dir", "enemy_move_interval", "alien_move_timer", "alien_shot_timer",
           "ramp_index", "shot_timer", "terminal")  # fmt: skip


def as_bits(grid):
    return sum(1 << i for i, cell in enumerate(grid.ravel()) if cell)


def random_state(rng, trial):
    """A game state that play may or may not reach: aliens anywhere (at the edges, in the
    bottom row, a single one left), bullets anywhere, every timer about to fire or not."""
    aliens = (rng.random((10, 10)) < rng.choice([0.02, 0.1, 0.3])).astype(float)
    if trial % 7 == 0:  # one alien: a kill clears the wave
        aliens[:] = 0
        aliens[rng.integers(10), rng.integers(10)] = 1
    if not aliens.any():
        aliens[0, 0] = 1  # MinAtar's aliens never all go before a new wave comes
    grids = dict(
        alien_map=aliens,
        f_bullet_map=(rng.random((10, 10)) < 0.05).astype(float),
        e_bullet_map=(rng.random((10, 10)) < 0.05).astype(float),
    )
    scalars = dict(
        pos=int(rng.integers(10)), alien_dir=int(rng.choice([-1, 1])),
        enemy_move_interval=int(rng.integers(5, 13)), alien_move_timer=int(rng.integers(3)),
        alien_shot_timer=int(rng.integers(3)), ramp_index=int(rng.integers(3)),
        shot_timer=int(rng.integers(3)), terminal=bool(rng.random() < 0.02),
    )  # fmt: skip
    return grids, scalars


def test_every_step_from_random_states_is_minatars():
    rng = np.random.default_rng(0)
    theirs, ours = MinAtarSpaceInvaders(), BitboardSpaceInvaders()
    seen = dict(kill=0, wave=0, ramp=0, descent=0, end=0)
    for trial in range(6000):
        grids, scalars = random_state(rng, trial)
        for key, value in scalars.items():
            setattr(theirs, key, value)
            setattr(ours, key, value)
        for key, grid in grids.items():
            setattr(theirs, key, grid.copy())
        ours.aliens = as_bits(grids["alien_map"])
        ours.f_bullets = as_bits(grids["f_bullet_map"])
        ours.e_bullets = as_bits(grids["e_bullet_map"])
        action = int(rng.integers(6))

        assert ours.act(action) == theirs.act(action), trial
        np.testing.assert_array_equal(ours.state(), theirs.state())
        for key in grids:
            np.testing.assert_array_equal(getattr(ours, key), getattr(theirs, key))
        assert [getattr(ours, key) for key in SCALARS] == [getattr(theirs, key) for key in SCALARS]

        before = grids["alien_map"]
        seen["kill"] += theirs.alien_map.sum() < before.sum()
        seen["wave"] += theirs.alien_map.sum() == 24 and before.sum() != 24
        seen["ramp"] += theirs.ramp_index != scalars["ramp_index"]
        seen["descent"] += theirs.alien_dir != scalars["alien_dir"]
        seen["end"] += theirs.terminal and not scalars["terminal"]
    assert min(seen.values()) >= 20, seen  # every rule was exercised


def play(module, game_class, seed, policy, actions=None, steps=4000):
    """Observations, rewards and ends of a seeded game of MinAtar's game `module` played by
    `game_class`, with sticky actions, under a seeded random policy (probabilities `policy`
    over `actions`, or over all six)."""
    saved = module.Env
    module.Env = game_class  # the class MinAtar's Environment builds
    try:
        env = Environment(module.__name__.rsplit(".", 1)[-1], sticky_action_prob=0.1)
    finally:
        module.Env = saved
    env.seed(seed)
    env.reset()
    actions = actions or list(range(6))
    chosen = np.random.default_rng(seed).choice(len(actions), size=steps, p=policy)
    frames, rewards, ends = [], [], []
    for choice in chosen:
        reward, done = env.act(actions[choice])
        frames.append(env.state())
        rewards.append(reward)
        ends.append(done)
        if done:
            env.reset()
    return np.stack(frames), np.array(rewards), np.array(ends)


FIRES_OFTEN = [0.1, 0.15, 0.15, 0.1, 0.1, 0.4]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_games_play_the_same(seed):
    frames, rewards, ends = play(space_invaders, MinAtarSpaceInvaders, seed, FIRES_OFTEN)
    our_frames, our_rewards, our_ends = play(
        space_invaders, BitboardSpaceInvaders, seed, FIRES_OFTEN
    )
    assert rewards.sum() > 100 and ends.sum() >= 50  # aliens were shot, games ended
    np.testing.assert_array_equal(our_frames, frames)
    np.testing.assert_array_equal(our_rewards, rewards)
    np.testing.assert_array_equal(our_ends, ends)


OneCallFreeway = minatar_speedup.OneCallFreeway
MinAtarFreeway = OneCallFreeway.__bases__[0]


def test_freeways_frame_is_minatars_for_any_chicken_and_cars():
    """Cars in every lane at every column (the edges, where the trail wraps around), at every
    speed in both directions, and the chicken in every row."""
    rng = np.random.default_rng(0)
    theirs, ours = MinAtarFreeway(), OneCallFreeway()
    for _ in range(3000):
        pos = int(rng.integers(10))
        speeds = rng.choice([-1, 1], 8) * rng.integers(1, 6, 8)
        cars = [[int(rng.integers(10)), lane, int(rng.integers(6)), int(speeds[lane - 1])]
                for lane in range(1, 9)]  # fmt: skip
        for game in (theirs, ours):
            game.pos, game.cars = pos, [list(car) for car in cars]
        frame = ours.state()
        np.testing.assert_array_equal(frame, theirs.state())
        assert frame.shape == (10, 10, 7) and frame.dtype == bool and frame.flags.c_contiguous


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_freeway_games_play_the_same(seed):
    """Whole games with sticky actions, under a seeded policy that mostly goes up."""
    no_op_up_down, mostly_up = [0, 2, 4], [0.2, 0.6, 0.2]
    frames, rewards, _ = play(freeway, MinAtarFreeway, seed, mostly_up, no_op_up_down, 6000)
    ours, our_rewards, _ = play(freeway, OneCallFreeway, seed, mostly_up, no_op_up_down, 6000)
    assert rewards.sum() >= 10  # the chicken crossed
    np.testing.assert_array_equal(ours, frames)
    np.testing.assert_array_equal(our_rewards, rewards)


@pytest.mark.parametrize(
    "name, module, ours, shape, channel_1",  # channel 1: SpaceInvaders' aliens, Freeway's cars
    [
        ("SpaceInvaders", space_invaders, BitboardSpaceInvaders, (10, 10, 6), 24),
        ("Freeway", freeway, OneCallFreeway, (10, 10, 7), 8),
    ],
)
def test_making_the_env_by_name_builds_ours(monkeypatch, name, module, ours, shape, channel_1):
    monkeypatch.setattr(module, "Env", ours.__bases__[0])  # MinAtar's own, as before install()
    env = make_env(f"MinAtar/{name}-v1", seed=0)
    try:
        assert type(env.unwrapped.game.env) is ours
        obs, _ = env.reset(seed=0)
        assert obs.shape == shape and obs.dtype == bool and obs[:, :, 1].sum() == channel_1
    finally:
        env.close()
