"""bench/cv2_standin/cv2.py, the GPU check's stand-in for OpenCV, resizes frames exactly as
OpenCV does (INTER_AREA, uint8), on emulator screens and on random images."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from helpers import REPO

cv2 = pytest.importorskip("cv2")


def standin():
    spec = importlib.util.spec_from_file_location(
        "cv2_standin", REPO / "bench" / "cv2_standin" / "cv2.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "shape,size",
    [((210, 160), (84, 84)), ((250, 160), (84, 84)), ((210, 160), (64, 48)),
     ((100, 90), (40, 30)), ((210, 160, 3), (84, 84))],
)  # fmt: skip
def test_random_images(shape, size):
    rng = np.random.default_rng(0)
    ours = standin()
    for _ in range(50):
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        expected = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(
            ours.resize(image, size, interpolation=ours.INTER_AREA), expected
        )


@pytest.mark.parametrize("game", ["Pong", "Breakout"])
def test_emulator_screens(game):
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    ours = standin()
    env = gym.make(f"ALE/{game}-v5", frameskip=4, obs_type="grayscale")
    screen, _ = env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(300):
        expected = cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(ours.resize(screen, (84, 84)), expected)
        screen, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            screen, _ = env.reset()
    env.close()


def test_what_it_does_not_do_is_refused():
    ours = standin()
    with pytest.raises(NotImplementedError):
        ours.resize(np.zeros((168, 168), np.uint8), (84, 84))  # whole factors: another path
    with pytest.raises(NotImplementedError):
        ours.resize(np.zeros((84, 84), np.uint8), (168, 168))
