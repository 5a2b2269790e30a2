"""Environments for moolib's EnvPool.

moolib's EnvPool worker speaks the old gym API: ``reset() -> obs`` and
``step(action) -> (obs, reward, done, info)``, resetting by itself when ``done`` is true, with obs a
contiguous numpy array or a dict of them. Gymnasium speaks the new one. ``OldGymApi`` translates;
``EnvFactory`` builds a seeded, preprocessed env by name and is what gets handed to EnvPool.
"""

import atexit
import gc
import multiprocessing
import weakref

import gymnasium as gym
import numpy as np

ATARI_PREFIX = "ALE/"
MINATAR_PREFIX = "MinAtar/"


# EnvPool's workers end with the envs still referenced from C++; without closing them first,
# ale-py's bindings report every emulator as a leak when the interpreter shuts down.
_open_envs = weakref.WeakSet()


@atexit.register
def _close_open_envs():
    for env in list(_open_envs):
        env.close()
    gc.collect()


class OldGymApi:
    """Presents a gymnasium env with the reset/step signatures moolib's EnvPool calls."""

    def __init__(self, env, seed=None):
        _open_envs.add(self)
        self.env = env
        self.seed = seed
        self.action_space = env.action_space
        self.observation_space = env.observation_space

    def reset(self):
        # Seed only the first reset: later resets continue the same random stream, so one seed
        # gives a reproducible sequence of episodes.
        obs, _ = self.env.reset(seed=self.seed)
        self.seed = None
        return _contiguous(obs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        return _contiguous(obs), float(reward), bool(terminated or truncated), info

    def close(self):
        if self.env is not None:
            self.env.close()
            self.env = None


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
    try:
        import minatar.gym

        if not any(env_id.startswith(MINATAR_PREFIX) for env_id in gym.registry):
            minatar.gym.register_envs()
    except ImportError:
        pass


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
    render_mode=None,
):
    """Create a gymnasium env by name with the standard preprocessing for its family.

    render_mode="rgb_array" makes ``env.render()`` return the env's own RGB picture (for Atari the
    emulator's screen, not the preprocessed 84x84 observation), e.g. for recording videos.
    """
    register_all()
    if name.startswith(ATARI_PREFIX):
        # Frame skipping is left to AtariPreprocessing so that random no-ops come first and the
        # last two frames of each skip are max-pooled (the DQN/IMPALA convention).
        env = gym.make(
            name,
            frameskip=1,
            repeat_action_probability=repeat_action_probability,
            full_action_space=True,
            render_mode=render_mode,
        )
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=noop_max,
            frame_skip=num_action_repeats,
            screen_size=84,
            grayscale_obs=True,
        )
        env = gym.wrappers.FrameStackObservation(env, stack_size=4)
    else:
        env = gym.make(name, render_mode=render_mode)
    if seed is not None:
        env.action_space.seed(seed)
    return env


class EnvFactory:
    """A picklable ``create_env`` for EnvPool that gives each env instance its own seed.

    EnvPool calls ``create_env()`` inside forked worker processes with no arguments. A counter in
    shared memory (inherited through the fork) numbers the instances, so instance i gets seed
    ``base_seed + i``. With one worker process the env-to-slot assignment, and hence the whole run,
    is reproducible; with several, the set of seeds is.
    """

    def __init__(self, name, seed=0, **env_kwargs):
        check_env_name(name)
        self.name = name
        self.seed = seed
        self.env_kwargs = env_kwargs
        self.counter = multiprocessing.Value("l", 0)

    def __call__(self):
        with self.counter.get_lock():
            index = self.counter.value
            self.counter.value += 1
        seed = self.seed + index
        return OldGymApi(make_env(self.name, seed=seed, **self.env_kwargs), seed=seed)

    def spaces(self):
        """(observation_space, action_space) of one env, built and closed in this process."""
        env = make_env(self.name, **self.env_kwargs)
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()
