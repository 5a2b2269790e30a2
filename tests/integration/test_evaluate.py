"""examples/vtrace/evaluate.py: tables, eval.tsv, videos and clear errors.

The fast tests evaluate untrained models saved the way the experiment saves them; the slow ones
train CartPole for real once per module and evaluate that checkpoint.
"""

import os
import re
import shutil
import subprocess
import sys

import imageio
import pytest
import torch
from helpers import CARTPOLE, REPO, Child, free_port, read_rows
from omegaconf import OmegaConf

from examples.common import checkpoint
from examples.common.envs import make_env
from examples.vtrace.config import EvaluateConfig, ExperimentConfig
from examples.vtrace.evaluate import load_model, trained_settings
from examples.vtrace.models import create_model

TABLE_ROW = re.compile(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(\d+)\s*$")


def evaluate(cwd, *overrides, env=None, timeout=300):
    result = subprocess.run(
        [sys.executable, "-m", "examples.vtrace.evaluate", *overrides],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def table(stdout):
    """The (episode, return, length) rows of the printed table."""
    return [
        (int(m[1]), float(m[2]), int(m[3])) for m in map(TABLE_ROW.match, stdout.splitlines()) if m
    ]


def experiment_flags(env_name, use_lstm, savedir):
    """The resolved config as the experiment stores it in a checkpoint."""
    flags = OmegaConf.structured(ExperimentConfig)
    flags.env.name = env_name
    flags.use_lstm = use_lstm
    flags.savedir = str(savedir)
    flags.local_name = "test"
    return OmegaConf.to_container(flags, resolve=True)


def untrained_checkpoint(savedir, env_name="CartPole-v1", use_lstm=False, **changes):
    """Save a fresh model the way the experiment does; `changes` replace entries of the dict."""
    env = make_env(env_name)
    model = create_model(env.observation_space, env.action_space.n, use_lstm=use_lstm)
    env.close()
    data = {
        "model": model.state_dict(),
        "optimizer": {},
        "env_train_steps": 1000,
        "global_stats": {},
        "model_version": 7,
        "flags": experiment_flags(env_name, use_lstm, savedir),
        **changes,
    }
    savedir.mkdir(parents=True, exist_ok=True)
    checkpoint.save_atomic(data, savedir / "checkpoint.tar")
    return savedir / "checkpoint.tar"


def video_size_and_frames(path):
    with imageio.v2.get_reader(path) as reader:
        return reader.get_meta_data()["size"], reader.count_frames()


def test_lstm_checkpoint_prints_table_and_appends_rows(tmp_path):
    savedir = tmp_path / "save"
    untrained_checkpoint(savedir, use_lstm=True)
    result = evaluate(tmp_path, f"savedir={savedir}", "episodes=3")
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert [r[0] for r in rows] == [1, 2, 3]
    assert all(length > 0 and ret == length for _, ret, length in rows)  # CartPole: +1 a step
    assert "mean ± std over 3 episodes" in result.stdout
    # No Hydra outputs/ or .hydra/ in the working directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["save"]

    result = evaluate(tmp_path, f"savedir={savedir}", "episodes=2", "greedy=false", "seed=5")
    assert result.returncode == 0, result.stderr
    logged = read_rows(savedir / "eval.tsv")
    assert list(logged[0]) == ["checkpoint", "model_version", "greedy", "episode", "return",
                               "length"]  # fmt: skip
    assert [(r["greedy"], r["episode"]) for r in logged] == [
        ("1", "1"), ("1", "2"), ("1", "3"), ("0", "1"), ("0", "2"),
    ]  # fmt: skip
    assert {(r["checkpoint"], r["model_version"]) for r in logged} == {("checkpoint.tar", "7")}
    assert [float(r["return"]) for r in logged[:3]] == [r[1] for r in rows]


def test_same_seed_same_episodes(tmp_path):
    savedir = tmp_path / "save"
    untrained_checkpoint(savedir)
    first, second = (
        evaluate(tmp_path, f"savedir={savedir}", "episodes=3", "greedy=false", "seed=3")
        for _ in range(2)
    )
    assert first.returncode == second.returncode == 0
    assert table(first.stdout) == table(second.stdout)
    # Later episodes are not replays of the first.
    assert len({length for _, _, length in table(first.stdout)}) > 1


def test_checkpoint_settings_win_over_the_command_line(tmp_path):
    savedir = tmp_path / "save"
    untrained_checkpoint(savedir, use_lstm=True)
    result = evaluate(
        tmp_path, f"savedir={savedir}", "episodes=1", "env.name=ALE/Pong-v5", "use_lstm=false"
    )
    assert result.returncode == 0, result.stderr
    assert "CartPole-v1" in result.stdout
    assert "env.name=ALE/Pong-v5 ignored" in result.stderr
    assert "use_lstm=false ignored" in result.stderr


def test_checkpoint_by_name_or_path(tmp_path):
    savedir = tmp_path / "save"
    path = untrained_checkpoint(savedir)
    shutil.copy(path, savedir / "checkpoint_v7.tar")
    result = evaluate(tmp_path, f"savedir={savedir}", "checkpoint=checkpoint_v7.tar", "episodes=1")
    assert result.returncode == 0, result.stderr
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(path, other / "mine.tar")
    result = evaluate(tmp_path, f"checkpoint={other / 'mine.tar'}", "episodes=1")
    assert result.returncode == 0, result.stderr
    assert [r["checkpoint"] for r in read_rows(savedir / "eval.tsv")] == ["checkpoint_v7.tar"]
    assert [r["checkpoint"] for r in read_rows(other / "eval.tsv")] == ["mine.tar"]


def test_gif_when_mp4_cannot_be_written(tmp_path):
    savedir = tmp_path / "save"
    untrained_checkpoint(savedir)
    videos = tmp_path / "videos"
    result = evaluate(
        tmp_path, f"savedir={savedir}", "episodes=1", "max_episode_steps=20", f"video={videos}",
        env={"IMAGEIO_FFMPEG_EXE": str(tmp_path / "no-ffmpeg")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "recording GIFs instead" in result.stderr
    assert [p.name for p in videos.iterdir()] == ["episode_1.gif"]


@pytest.mark.parametrize(
    "env_name, screen",
    [("ALE/Pong-v5", (160, 210)), ("MinAtar/Breakout-v1", (160, 160))],
)
def test_video_of_pixel_envs(tmp_path, env_name, screen):
    savedir = tmp_path / "save"
    untrained_checkpoint(savedir, env_name)
    videos = tmp_path / "videos"
    result = evaluate(
        tmp_path, f"savedir={savedir}", "episodes=1", "max_episode_steps=50", f"video={videos}"
    )
    assert result.returncode == 0, result.stderr
    [(episode, _, length)] = table(result.stdout)
    assert episode == 1 and length <= 50
    # Atari: the emulator's RGB screen, not the 84x84 input; MinAtar: the grid scaled up.
    size, frames = video_size_and_frames(videos / "episode_1.mp4")
    assert size == screen
    assert frames == length + 1


def write_garbage(savedir):
    savedir.mkdir()
    (savedir / "checkpoint.tar").write_bytes(b"\x00not a checkpoint\xff" * 50)


def lstm_weights_under_plain_flags(savedir):
    # The stored flags say no LSTM, so the LSTM's weights have nowhere to go.
    path = untrained_checkpoint(savedir, use_lstm=True)
    data = checkpoint.load(path)
    data["flags"]["use_lstm"] = False
    checkpoint.save_atomic(data, path)


def no_stored_flags(savedir):
    untrained_checkpoint(savedir, flags=None)


@pytest.mark.parametrize(
    "prepare, overrides, message",
    [
        (None, [], "savedir={save} does not exist"),
        (untrained_checkpoint, ["checkpoint=checkpoint_v3.tar"],
         "no checkpoint at {save}/checkpoint_v3.tar; found: checkpoint.tar"),
        (None, ["checkpoint={tmp}/nowhere/c.tar"], "no checkpoint at {tmp}/nowhere/c.tar"),
        (write_garbage, [], "{save}/checkpoint.tar is corrupt or truncated"),
        (lstm_weights_under_plain_flags, [], "does not fit the model for CartPole-v1 "
         "(use_lstm=False): unexpected core.weight_ih_l0 and 3 more"),
        (no_stored_flags, [], "{save}/checkpoint.tar stores no flags naming its env"),
        (untrained_checkpoint, ["episodes=0"], "episodes must be a positive integer, got 0"),
        (untrained_checkpoint, ["episodes=ten"], "episodes must be a positive integer"),
        (untrained_checkpoint, ["max_episode_steps=0"], "max_episode_steps must be a positive"),
        (untrained_checkpoint, ["greedy=maybe"], "greedy must be true or false"),
        (untrained_checkpoint, ["video={tmp}/file/videos"],
         "video={tmp}/file/videos is not writable"),
    ],
)  # fmt: skip
def test_bad_input_gives_one_clear_line(tmp_path, prepare, overrides, message):
    savedir = tmp_path / "save"
    (tmp_path / "file").write_text("a file, not a folder")
    if prepare is not None:
        prepare(savedir)
    overrides = [o.format(tmp=tmp_path) for o in overrides]
    result = evaluate(tmp_path, f"savedir={savedir}", *overrides)
    assert result.returncode != 0
    expected = message.format(save=savedir, tmp=tmp_path)
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (savedir / "eval.tsv").exists()


# --- A checkpoint trained for real, once for the whole module -----------------------------


def experiment_args(broker, savedir, *overrides):
    return [
        sys.executable, "-m", "examples.vtrace.experiment", f"connect={broker}",
        f"savedir={savedir}", "project=test-evaluate", f"group={savedir.name}", *overrides,
    ]  # fmt: skip


def run_experiment(savedir, overrides, timeout):
    """Train with a broker of its own; both processes are stopped whatever happens."""
    port = free_port()
    started = []
    try:
        broker = Child([sys.executable, "-m", "moolib.broker", f"127.0.0.1:{port}"], "broker")
        started.append(broker)
        assert broker.wait_for_line(lambda s: "Broker listening at" in s, 60), broker.output
        args = experiment_args(f"127.0.0.1:{port}", savedir, *overrides)
        peer = Child(args, "experiment")
        started.append(peer)
        assert peer.wait(timeout) == 0, peer.output
    finally:
        for child in reversed(started):
            child.stop()
    assert (savedir / "checkpoint.tar").exists(), started[-1].output
    return savedir / "checkpoint.tar"


@pytest.fixture(scope="module")
def trained_cartpole(tmp_path_factory):
    savedir = tmp_path_factory.mktemp("trained") / "cartpole"
    return run_experiment(savedir, [*CARTPOLE, "seed=0", "total_steps=250000"], timeout=400)


def copy_into(path, folder):
    """A private copy, so that each test sees only its own eval.tsv rows."""
    folder.mkdir(parents=True)
    return shutil.copy(path, folder / path.name)


@pytest.mark.slow
def test_trained_checkpoint_table_and_log(trained_cartpole, tmp_path):
    savedir = tmp_path / "save"
    copy_into(trained_cartpole, savedir)
    result = evaluate(tmp_path, f"savedir={savedir}", "episodes=3")
    assert result.returncode == 0, result.stderr
    assert "episode      return   length" in result.stdout
    assert [r[0] for r in table(result.stdout)] == [1, 2, 3]
    assert len(read_rows(savedir / "eval.tsv")) == 3


@pytest.mark.slow
def test_trained_policy_beats_random(trained_cartpole, tmp_path):
    savedir = tmp_path / "save"
    copy_into(trained_cartpole, savedir)
    result = evaluate(tmp_path, f"savedir={savedir}", "episodes=5", "greedy=true")
    assert result.returncode == 0, result.stderr
    returns = [ret for _, ret, _ in table(result.stdout)]
    assert len(returns) == 5
    # A random policy scores about 22.
    assert sum(returns) / 5 > 100, result.stdout


@pytest.mark.slow
def test_trained_video_per_episode(trained_cartpole, tmp_path):
    pytest.importorskip("pygame", reason="CartPole draws its frames with pygame")
    savedir = tmp_path / "save"
    copy_into(trained_cartpole, savedir)
    videos = tmp_path / "videos"
    result = evaluate(
        tmp_path, f"savedir={savedir}", "episodes=2", "max_episode_steps=100", f"video={videos}"
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in videos.iterdir()) == ["episode_1.mp4", "episode_2.mp4"]
    for path in videos.iterdir():
        assert path.stat().st_size > 0
        size, frames = video_size_and_frames(path)
        assert size == (600, 400) and frames == 101  # 100 steps and the final state


# A net setting: the env whose net it changes (and the other settings that net needs), its
# value when on and when off (the value of checkpoints from before the key), and what a loaded
# net has of it.
PONG_NET = ("ALE/Pong-v5", {"atari_net": "nature_half", "center_frames": True})
NET_SETTINGS = {
    "center_frames": (PONG_NET[0], {"atari_net": "nature_half"}, True, False,
                      lambda net: net.center_frames),
    "center_frames_on": (*PONG_NET, "background", "mean", lambda net: net.center_frames_on),
    "layer_norm": ("MinAtar/Breakout-v1", {}, True, False,
                   lambda net: isinstance(net.norm, torch.nn.LayerNorm)),
    "minatar_hidden": ("MinAtar/Breakout-v1", {}, 256, 128, lambda net: net.fc.out_features),
}  # fmt: skip


@pytest.mark.parametrize("stored", ["on", "off", None])
@pytest.mark.parametrize("key", list(NET_SETTINGS))
def test_a_net_setting_comes_from_the_checkpoint(tmp_path, key, stored):
    env_name, needs, on, off, setting = NET_SETTINGS[key]
    value = on if stored == "on" else off
    env = make_env(env_name)
    model = create_model(env.observation_space, env.action_space.n, **needs, **{key: value})
    flags = {**experiment_flags(env_name, False, tmp_path), **needs}
    if stored is None:  # a checkpoint from before the key: it was off
        del flags[key]
    else:
        flags[key] = value
    data = {"model": model.state_dict(), "flags": flags}
    settings = trained_settings(
        data, tmp_path / "checkpoint.tar", OmegaConf.structured(EvaluateConfig)
    )
    loaded = load_model(data, tmp_path / "checkpoint.tar", env, settings, "cpu")
    env.close()
    assert setting(loaded) == value


@pytest.mark.slow
def test_atari_checkpoint_from_a_short_run(tmp_path):
    savedir = tmp_path / "pong"
    overrides = [
        "env.name=ALE/Pong-v5", "actor_batch_size=2", "num_actor_cpus=1", "batch_size=2",
        "virtual_batch_size=2", "unroll_length=5", "total_steps=300", "log_interval=1",
    ]  # fmt: skip
    run_experiment(savedir, overrides, timeout=300)
    videos = tmp_path / "videos"
    result = evaluate(
        tmp_path, f"savedir={savedir}", "episodes=1", "max_episode_steps=200", f"video={videos}"
    )
    assert result.returncode == 0, result.stderr
    assert [r[2] for r in table(result.stdout)] == [200]
    assert video_size_and_frames(videos / "episode_1.mp4") == ((160, 210), 201)
