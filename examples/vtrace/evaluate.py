"""Evaluate a V-trace checkpoint: play episodes with the trained policy and report the returns.

    python -m examples.vtrace.evaluate savedir=/tmp/moolib-vtrace/savedir
    python -m examples.vtrace.evaluate savedir=... episodes=20 greedy=false seed=1
    python -m examples.vtrace.evaluate savedir=... checkpoint=checkpoint_v1200.tar video=/tmp/vids

No broker and no EnvPool: one plain gymnasium env in this process, one episode after another.
The env and the model are rebuilt from the flags stored in the checkpoint (env.name, env.*,
use_lstm, atari_net, center_frames, center_frames_on, layer_norm, minatar_hidden), so they are
the ones the weights were trained with; from the command line only device, seed, torch_threads
and the keys of evaluate.yaml are used.

Each episode is printed as it ends and appended to eval.tsv next to the checkpoint; with
video=DIR it is also recorded to DIR/episode_<i>.mp4.
"""

import math
import os
import pathlib
import statistics
import sys

import gymnasium as gym
import hydra
import imageio
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from examples.common import checkpoint
from examples.common.checkpoint import CheckpointError
from examples.common.envs import ATARI_PREFIX, check_env_name, make_env
from examples.common.tsvlog import TsvLog
from examples.vtrace.command_line import check_command_line
from examples.vtrace.config import (
    ConfigError,
    EvaluateConfig,
    check_writable,
    resolve_device,
)
from examples.vtrace.models import ARCHITECTURE_KEYS, create_model

# Tiny frames (MinAtar's 10x10 grids) are scaled up to at least this many pixels a side.
MIN_VIDEO_SIDE = 160
ATARI_HZ = 60  # the NTSC console's frame rate
DEFAULT_FPS = 15  # for envs that declare no render_fps (MinAtar)


def check_flags(flags):
    """Reject bad evaluation settings before anything is loaded."""
    if not flags.episodes > 0:
        raise ConfigError(f"episodes must be a positive integer, got {flags.episodes}")
    if flags.max_episode_steps is not None and not flags.max_episode_steps > 0:
        raise ConfigError(
            f"max_episode_steps must be a positive integer or null, got {flags.max_episode_steps}"
        )
    if not flags.checkpoint:
        raise ConfigError("checkpoint must name a checkpoint file, e.g. checkpoint.tar")


def find_checkpoint(flags):
    """The checkpoint file: a bare file name is looked up in savedir, anything else is a path."""
    given = pathlib.Path(str(flags.checkpoint))
    if given.is_absolute() or len(given.parts) > 1:
        path = given
    else:
        savedir = pathlib.Path(flags.savedir)
        if not savedir.is_dir():
            raise ConfigError(f"savedir={savedir} does not exist (or is not a folder)")
        path = savedir / given
    if not path.is_file():
        # Listing what is there saves a round trip when only the version number is wrong.
        found = sorted(p.name for p in path.parent.glob("checkpoint*.tar"))
        hint = f"; found: {', '.join(found)}" if found else ""
        raise ConfigError(f"no checkpoint at {path}{hint}")
    return path


def trained_settings(data, path, flags):
    """The env and model settings the checkpoint was trained with, from its stored flags.

    Keys the stored flags lack (a checkpoint from an older version) fall back to the config's.
    """
    saved = data.get("flags")
    saved_env = saved.get("env") if isinstance(saved, dict) else None
    if not isinstance(saved_env, dict) or not saved_env.get("name"):
        raise CheckpointError(f"{path} stores no flags naming its env; cannot rebuild its env")
    # Before env.full_action_space existed, every Atari env had all 18 actions.
    saved_env = {"full_action_space": True, **saved_env}
    env = {**OmegaConf.to_container(flags.env, resolve=True), **saved_env}
    return {
        "env": env,
        "use_lstm": bool(saved.get("use_lstm", flags.use_lstm)),
        "atari_net": saved.get("atari_net", "resnet"),  # the only Atari net before the key
        "center_frames": bool(saved.get("center_frames", False)),
        "center_frames_on": saved.get("center_frames_on", "mean"),
        "layer_norm": bool(saved.get("layer_norm", False)),
        "minatar_hidden": int(saved.get("minatar_hidden", 128)),
    }


def note_ignored_overrides(settings):
    """Say so when the command line asks for env or model settings other than the checkpoint's."""
    for override in HydraConfig.get().overrides.task:
        key, _, value = override.lstrip("+~").partition("=")
        if key not in ARCHITECTURE_KEYS and not key.startswith("env."):
            continue
        used = OmegaConf.select(OmegaConf.create(settings), key)
        if str(used).lower() != value.lower():
            print(
                f"note: {override} ignored; the checkpoint's {key}={used} is used", file=sys.stderr
            )


def build_env(env_settings, seed, render_mode):
    try:
        check_env_name(env_settings["name"])
    except ValueError as e:
        raise ConfigError(f"the checkpoint's env.name: {e}") from None
    return make_env(
        env_settings["name"],
        seed=seed,
        repeat_action_probability=env_settings["repeat_action_probability"],
        num_action_repeats=env_settings["num_action_repeats"],
        noop_max=env_settings["noop_max"],
        full_action_space=env_settings["full_action_space"],
        render_mode=render_mode,
    )


def load_model(data, path, env, settings, device):
    model = create_model(
        env.observation_space,
        env.action_space.n,
        **{key: settings[key] for key in ARCHITECTURE_KEYS},
    )
    describe = f"the model for {settings['env']['name']} (use_lstm={settings['use_lstm']})"
    if not isinstance(data["model"], dict):
        reason = f"its model entry is a {type(data['model']).__name__}, not a state_dict"
        raise CheckpointError(f"{path} does not fit {describe}: {reason}")
    try:
        missing, unexpected = model.load_state_dict(data["model"], strict=False)
    except RuntimeError as e:  # a shape that differs; torch names the key and both shapes
        reason = str(e).strip().splitlines()[-1].strip()
        raise CheckpointError(f"{path} does not fit {describe}: {reason}") from None
    problems = [
        f"{label}{keys[0]}" + (f" and {len(keys) - 1} more" if len(keys) > 1 else "")
        for label, keys in [("missing ", missing), ("unexpected ", unexpected)]
        if keys
    ]
    if problems:
        raise CheckpointError(f"{path} does not fit {describe}: {'; '.join(problems)}")
    return model.to(device).eval()


def video_frame(frame):
    """An RGB uint8 frame with even sides, as H.264 needs; tiny grids are scaled up."""
    frame = np.asarray(frame)
    if frame.dtype != np.uint8:  # MinAtar renders floats in [0, 1]
        frame = (np.clip(frame, 0.0, 1.0) * 255).astype(np.uint8)
    scale = math.ceil(MIN_VIDEO_SIDE / min(frame.shape[:2]))
    if scale > 1:
        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
    return np.pad(frame, [(0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)])


def open_video(path, fps):
    if path.suffix == ".mp4":
        # Frames already have even sides; macro_block_size=1 stops imageio from resizing them.
        return imageio.v2.get_writer(path, fps=fps, macro_block_size=1)
    return imageio.v2.get_writer(path, mode="I", duration=1000 / fps, loop=0)


def video_suffix(folder):
    """The file suffix to record with: ".mp4" if a tiny MP4 can be written here, else ".gif"."""
    probe = pathlib.Path(folder) / f".mp4-test-{os.getpid()}.mp4"
    try:
        with open_video(probe, fps=10) as writer:
            for _ in range(2):
                writer.append_data(np.zeros((16, 16, 3), np.uint8))
        return ".mp4"
    except Exception as e:  # no ffmpeg, a codec missing, ...: any of them means no MP4
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"note: cannot write MP4 ({reason}); recording GIFs instead", file=sys.stderr)
        return ".gif"
    finally:
        probe.unlink(missing_ok=True)


def video_fps(env, env_settings):
    """Frames per second that play the recording back at the env's own speed."""
    if env_settings["name"].startswith(ATARI_PREFIX):
        # One frame per agent step, which spans num_action_repeats frames of the 60 Hz console
        # (ale-py's metadata says 30 whatever the frame skip).
        return ATARI_HZ / env_settings["num_action_repeats"]
    return env.metadata.get("render_fps") or DEFAULT_FPS


class Recorder:
    """One video file per episode in a folder: MP4, or GIF where MP4 cannot be written."""

    def __init__(self, folder, fps):
        self.folder = pathlib.Path(folder)
        self.fps = fps
        self.suffix = video_suffix(self.folder)

    def open(self, episode):
        return open_video(self.folder / f"episode_{episode}{self.suffix}", self.fps)


def check_render(env, name):
    """Fail before the first episode when the env cannot draw frames (e.g. pygame missing)."""
    try:
        env.reset()
        env.render()
    except gym.error.Error as e:
        raise ConfigError(f"video: {name} cannot render frames: {e}") from None


@torch.no_grad()
def choose_action(model, obs, first, core_state, greedy):
    """One T=1, B=1 step of the model; `first` marks the first observation of an episode."""
    inputs = {
        "state": torch.as_tensor(np.asarray(obs))[None, None],
        "done": torch.tensor([[first]]),
    }
    outputs, core_state = model(inputs, core_state)
    logits = outputs["policy_logits"][0, 0]
    if greedy:
        action = logits.argmax()
    else:
        action = torch.multinomial(torch.softmax(logits, dim=-1), 1)[0]
    return int(action), core_state


def play_episode(env, model, flags, seed, writer=None):
    """Play one episode; returns (return, length). Frames go to `writer` when there is one."""
    obs, _ = env.reset(seed=seed)
    core_state = model.initial_state(1)
    episode_return, length, first = 0.0, 0, True
    while True:
        if writer is not None:
            writer.append_data(video_frame(env.render()))
        action, core_state = choose_action(model, obs, first, core_state, flags.greedy)
        obs, reward, terminated, truncated, _ = env.step(action)
        episode_return += float(reward)
        length += 1
        first = False
        capped = flags.max_episode_steps is not None and length >= flags.max_episode_steps
        if terminated or truncated or capped:
            if writer is not None:
                writer.append_data(video_frame(env.render()))  # the final state too
            return episode_return, length


def play_episodes(env, model, flags, tsv, tags, recorder=None):
    """Play flags.episodes episodes, printing each and logging it to tsv with the given tags.

    Returns the lists of episode returns and lengths.
    """
    returns, lengths = [], []
    print(f"{'episode':>7}  {'return':>10}  {'length':>7}", flush=True)
    for i in range(1, flags.episodes + 1):
        # Only the first reset is seeded: later episodes continue the same random stream, so
        # one seed gives a reproducible sequence of different episodes.
        seed = flags.seed if i == 1 else None
        if recorder is None:
            episode_return, length = play_episode(env, model, flags, seed)
        else:
            with recorder.open(i) as writer:
                episode_return, length = play_episode(env, model, flags, seed, writer)
        print(f"{i:>7}  {episode_return:>10.2f}  {length:>7}", flush=True)
        tsv.write({**tags, "episode": i, "return": episode_return, "length": length})
        returns.append(episode_return)
        lengths.append(length)
    return returns, lengths


def count(n, noun):
    return f"{n} {noun}{'' if n == 1 else 's'}"


def summary(values):
    return f"{statistics.fmean(values):.2f} ± {statistics.pstdev(values):.2f}"


def run(flags):
    check_flags(flags)
    device = resolve_device(flags.device)
    path = find_checkpoint(flags)
    data = checkpoint.load(path)
    settings = trained_settings(data, path, flags)
    note_ignored_overrides(settings)
    env_name = settings["env"]["name"]
    check_writable(path.parent, f"{path.parent} (where eval.tsv goes)")
    if flags.video:
        check_writable(flags.video, f"video={flags.video}")
        # Frames are drawn off-screen; without this, pygame (classic control) looks for a display.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if flags.torch_threads > 0:
        torch.set_num_threads(flags.torch_threads)
    torch.manual_seed(flags.seed)  # for sampled actions (greedy=false)

    try:
        env = build_env(settings["env"], flags.seed, "rgb_array" if flags.video else None)
    except gym.error.Error as e:
        raise ConfigError(f"cannot create {env_name}: {e}") from None
    tsv = TsvLog(path.parent / "eval.tsv")
    try:
        model = load_model(data, path, env, settings, device)
        recorder = None
        if flags.video:
            check_render(env, env_name)
            recorder = Recorder(flags.video, video_fps(env, settings["env"]))
        actions = "greedy" if flags.greedy else "sampled"
        print(
            f"Evaluating {path}: {env_name}, model version {data['model_version']}, "
            f"{data.get('env_train_steps', '?')} env steps trained\n"
            f"{count(flags.episodes, 'episode')}, {actions} actions, seed {flags.seed}, "
            f"on {device}\n",
            flush=True,
        )
        # These columns tell apart the rows of evaluations of different checkpoints or modes.
        tags = {"checkpoint": path.name, "model_version": data["model_version"],
                "greedy": flags.greedy}  # fmt: skip
        returns, lengths = play_episodes(env, model, flags, tsv, tags, recorder)
    finally:
        tsv.close()
        env.close()

    episodes = count(flags.episodes, "episode")
    print(f"\nmean ± std over {episodes}: return {summary(returns)}, length {summary(lengths)}")
    print(f"Rows appended to {tsv.path}")
    if recorder is not None:
        print(f"Videos: {recorder.folder}/episode_<1..{flags.episodes}>{recorder.suffix}")
    return 0


@hydra.main(version_base=None, config_path=".", config_name="evaluate")
def main(flags: DictConfig):
    try:
        return run(flags)
    except (ConfigError, CheckpointError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        sys.exit(2)
    except FileNotFoundError as e:  # the checkpoint vanished between the check and the load
        print(f"evaluate: error: no checkpoint at {e.filename}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("evaluate: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    sys.argv[1:] = check_command_line(
        "evaluate",
        EvaluateConfig,
        positive=["episodes", "max_episode_steps"],
        config_name="evaluate",
    )
    main()
