"""Atari frames as the DQN/IMPALA agents see them, computed straight from the emulator.

    env = AtariFrames(gym.make("ALE/Pong-v5", frameskip=1), noop_max=30, frame_skip=4)

The observation is what gymnasium's ``AtariPreprocessing`` (random no-ops at reset, frame skip
with the last two frames max-pooled, grayscale, 84x84 by area interpolation) followed by
``FrameStackObservation(stack_size=4)`` gives, step for step and seed for seed
(tests/unit/test_atari.py compares the two). The difference is speed: those wrappers step the
emulator through ale-py's env, which copies an RGB screen after every emulated frame, and stack
frames by concatenating a deque after every step. Here the emulator is driven through its ALE
interface, the screen is read only on the two frames that are pooled, and the stack is kept in
one array: 2.4x the agent steps per second of one core on Pong (bench/limits.py's env limit).
"""

import cv2
import gymnasium as gym
import numpy as np

SCREEN_SIZE = 84
STACK_SIZE = 4


class AtariFrames(gym.Wrapper):
    """Preprocessed, stacked frames [4, 84, 84] uint8 of an ale-py env made with frameskip=1."""

    def __init__(self, env, noop_max=30, frame_skip=4, stack_size=STACK_SIZE):
        super().__init__(env)
        if env.unwrapped._frameskip != 1:
            raise ValueError("AtariFrames skips frames itself: make the env with frameskip=1")
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be at least 1, got {frame_skip}")
        self.noop_max = noop_max
        self.frame_skip = frame_skip
        ale = env.unwrapped.ale
        height, width = ale.getScreenDims()
        # The last two emulated frames of a step, max-pooled: Atari games draw some objects
        # only every other frame.
        self.screens = np.zeros((2, height, width), dtype=np.uint8)
        self.frames = np.zeros((stack_size, SCREEN_SIZE, SCREEN_SIZE), dtype=np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, self.frames.shape, np.uint8)

    @property
    def ale(self):
        return self.env.unwrapped.ale

    def reset(self, *, seed=None, options=None):
        _, info = self.env.reset(seed=seed, options=options)
        atari = self.env.unwrapped
        noops = atari.np_random.integers(1, self.noop_max + 1) if self.noop_max > 0 else 0
        noop = atari._action_set[0]
        for _ in range(noops):
            self.ale.act(noop)
            if self.ale.game_over():
                _, info = self.env.reset(seed=seed, options=options)
        self.ale.getScreenGrayscale(self.screens[0])
        self.screens[1].fill(0)
        self.frames[:] = self._pooled_frame()
        return self.frames.copy(), self._info(info)

    def step(self, action):
        ale = self.ale
        ale_action = self.env.unwrapped._action_set[action]
        reward = 0.0
        terminated = truncated = False
        for t in range(self.frame_skip):
            reward += ale.act(ale_action)
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            if terminated or truncated:
                break
            if t == self.frame_skip - 2:
                ale.getScreenGrayscale(self.screens[1])
            elif t == self.frame_skip - 1:
                ale.getScreenGrayscale(self.screens[0])
        # Oldest frame first, as FrameStackObservation orders them.
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = self._pooled_frame()
        return self.frames.copy(), reward, terminated, truncated, self._info({})

    def _pooled_frame(self):
        if self.frame_skip > 1:
            np.maximum(self.screens[0], self.screens[1], out=self.screens[0])
        return cv2.resize(self.screens[0], (SCREEN_SIZE, SCREEN_SIZE), interpolation=cv2.INTER_AREA)

    def _info(self, info):
        return {**info, "lives": self.ale.lives(), "frame_number": self.ale.getFrameNumber()}
