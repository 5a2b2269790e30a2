"""Environments for moolib's EnvPool.

moolib's EnvPool worker speaks the old gym API: ``reset() -> obs`` and
``step(action) -> (obs, reward, done, info)``, resetting by itself when ``done`` is true, with obs a
contiguous numpy array or a dict of them. Gymnasium speaks the new one. ``OldGymApi`` translates;
``EnvFactory`` builds a seeded, preprocessed env by name and is what gets handed to EnvPool.
"""

import atexit
import gc
import importlib.util
import multiprocessing
import weakref

import gymnasium as gym
import numpy as np

from examples.common.atari import AtariFrames

ATARI_PREFIX = "ALE/"
MINATAR_PREFIX = "MinAtar/"
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


# EnvPool's workers end with the envs still referenced from C++; without closing them first,
# ale-py's bindings report every emulator as a leak when the interpreter shuts down.
_open_envs = weakref.WeakSet()


@atexit.register
def _close_open_envs():
    for env in list(_open_envs):
        env.close()
    gc.collect()


class OldGymApi:
    """Presents a gymnasium env with the reset/step signatures moolib's EnvPool calls.

    With ``mark_truncation``, observations become ``{"state": obs, "truncated": flag}`` and an
    episode cut by a time limit ends in two steps (see ``truncation_step``), so that a learner can
    bootstrap from the last observation instead of taking the cut for a real end. With
    ``mark_life_loss`` too, they also carry ``"life_lost"``: whether a life of the game (Atari's
    ``info["lives"]``) was lost on the step that led to them. The game goes on either way.
    """

    def __init__(self, env, seed=None, mark_truncation=False, mark_life_loss=False):
        if mark_life_loss and not mark_truncation:
            raise ValueError("mark_life_loss needs mark_truncation (the observation's dict form)")
        _open_envs.add(self)
        self.env = env
        self.seed = seed
        self.mark_truncation = mark_truncation
        self.mark_life_loss = mark_life_loss
        self.lives = 0
        self.cut_obs = None  # last observation of a truncated episode, until its filler step
        self.action_space = env.action_space
        self.observation_space = env.observation_space

    def reset(self):
        # Seed only the first reset: later resets continue the same random stream, so one seed
        # gives a reproducible sequence of episodes.
        obs, info = self.env.reset(seed=self.seed)
        self.seed = None
        self.cut_obs = None
        self.lives = info.get("lives", 0)
        return self.observation(obs, truncated=False)

    def step(self, action):
        if not self.mark_truncation:
            obs, reward, terminated, truncated, info = self.env.step(int(action))
            return _contiguous(obs), float(reward), bool(terminated or truncated), info
        return truncation_step(self, action)

    def observation(self, obs, truncated, life_lost=False):
        if not self.mark_truncation:
            return _contiguous(obs)
        return marked_observation(obs, truncated, life_lost if self.mark_life_loss else None)

    def took_a_life(self, info):
        """Whether the step that gave `info` lost a life (never for games without lives)."""
        lives = info.get("lives", self.lives)
        lost, self.lives = lives < self.lives, lives
        return lost

    def close(self):
        if self.env is not None:
            self.env.close()
            self.env = None


TRUNCATED_KEY = "truncated"
LIFE_LOST_KEY = "life_lost"


def marked_observation(obs, truncated, life_lost=None):
    """The observation as EnvPool hands it on when truncation is marked: ``state`` and a flag,
    and the life-loss flag unless it is None (not marked)."""
    if isinstance(obs, dict):
        raise TypeError("mark_truncation needs array observations, not a dict")
    marked = {"state": _contiguous(obs), TRUNCATED_KEY: np.array(bool(truncated))}
    if life_lost is not None:
        marked[LIFE_LOST_KEY] = np.array(bool(life_lost))
    return marked


def truncation_step(api, action):
    """One EnvPool step of ``api`` (an OldGymApi with mark_truncation) that keeps time limits apart
    from real ends of episodes.

    gymnasium says ``truncated`` when a time limit cuts an episode: the last observation still has
    a value. EnvPool only knows ``done``, and on done it resets and hands out the first observation
    of the next episode instead. So a truncation is spread over two steps:

    1. the last observation, with its reward, ``done=False`` and ``truncated=True``: the step
       before it bootstraps from its value as from any other observation;
    2. a filler step that ignores the action: reward 0, ``done=True``, so EnvPool resets and the
       next episode starts. The learner masks out the transition that leaves the flagged
       observation, so the filler neither teaches the value of the last observation to be 0 nor
       trains the policy on an action that never happened.
    """
    if api.cut_obs is not None:
        obs, api.cut_obs = api.cut_obs, None
        return api.observation(obs, False), 0.0, True, {}
    obs, reward, terminated, truncated, info = api.env.step(int(action))
    life_lost = api.took_a_life(info)
    if truncated and not terminated:
        api.cut_obs = obs
        return api.observation(obs, True, life_lost), float(reward), False, info
    return api.observation(obs, False, life_lost), float(reward), bool(terminated), info


def _contiguous(obs):
    # EnvPool copies the raw buffer of each array, so views and non-contiguous arrays must be
    # materialised first.
    if isinstance(obs, dict):
        return {key: np.ascontiguousarray(value) for key, value in obs.items()}
    return np.ascontiguousarray(obs)


def register_all():
    """Make the Atari and MinAtar ids known to gymnasium (neither registers by itself)."""
    import ale_py

    gym.register_envs(ale_py)
    if importlib.util.find_spec("minatar") is None:
        return
    # The same ids and entry point as minatar.gym.register_envs(), registered without importing
    # minatar: its package imports seaborn, pandas and scipy (5 s) for its display, a cost every
    # peer would pay at start even on CartPole or Atari. The entry point imports it on first make.
    for game in MINATAR_GAMES:
        name = game.title().replace("_", "")
        for version, minimal in (("v0", False), ("v1", True)):
            env_id = f"{MINATAR_PREFIX}{name}-{version}"
            if env_id not in gym.registry:
                gym.register(
                    env_id,
                    entry_point="minatar.gym:BaseEnv",
                    kwargs=dict(game=game, use_minimal_action_set=minimal),
                )


def check_env_name(name):
    """Raise ValueError with a helpful message if gymnasium cannot make ``name``."""
    register_all()
    if name not in gym.registry:
        similar = sorted(env_id for env_id in gym.registry if name.lower() in env_id.lower())
        hint = f" Did you mean one of: {', '.join(similar[:8])}?" if similar else ""
        raise ValueError(f"unknown environment {name!r}.{hint}")


def make_env(
    name,
    seed=None,
    repeat_action_probability=0.25,
    num_action_repeats=4,
    noop_max=30,
    full_action_space=False,
    render_mode=None,
):
    """Create a gymnasium env by name with the standard preprocessing for its family.

    render_mode="rgb_array" makes ``env.render()`` return the env's own RGB picture (for Atari the
    emulator's screen, not the preprocessed 84x84 observation), e.g. for recording videos.
    """
    register_all()
    if name.startswith(ATARI_PREFIX):
        # Frame skipping is left to AtariFrames so that random no-ops come first and the last
        # two frames of each skip are max-pooled (the DQN/IMPALA convention).
        env = gym.make(
            name,
            frameskip=1,
            repeat_action_probability=repeat_action_probability,
            full_action_space=full_action_space,
            render_mode=render_mode,
        )
        env = AtariFrames(env, noop_max=noop_max, frame_skip=num_action_repeats)
    else:
        if name.startswith(MINATAR_PREFIX):
            # Here, not at the top: it imports minatar, which other envs need not pay for.
            from examples.common import minatar_speedup

            minatar_speedup.install()  # before gym.make builds the game
        env = gym.make(name, render_mode=render_mode)
    if seed is not None:
        env.action_space.seed(seed)
    return env


class EnvFactory:
    """A picklable ``create_env`` for EnvPool that gives each env instance its own seed.

    EnvPool calls ``create_env()`` inside forked worker processes with no arguments. A counter in
    shared memory (inherited through the fork) numbers the instances, so instance i gets seed
    ``base_seed + i``. With one worker process the env-to-slot assignment, and hence the whole run,
    is reproducible; with several, the set of seeds is. ``mark_truncation`` and
    ``mark_life_loss`` are OldGymApi's.
    """

    def __init__(self, name, seed=0, mark_truncation=False, mark_life_loss=False, **env_kwargs):
        check_env_name(name)
        self.name = name
        self.seed = seed
        self.mark_truncation = mark_truncation
        self.mark_life_loss = mark_life_loss
        self.env_kwargs = env_kwargs
        self.counter = multiprocessing.Value("l", 0)

    def __call__(self):
        with self.counter.get_lock():
            index = self.counter.value
            self.counter.value += 1
        seed = self.seed + index
        env = make_env(self.name, seed=seed, **self.env_kwargs)
        return OldGymApi(env, seed, self.mark_truncation, self.mark_life_loss)

    def spaces(self):
        """(observation_space, action_space) of one env, built and closed in this process."""
        env = make_env(self.name, **self.env_kwargs)
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()
