"""Policy/value networks for the V-trace (IMPALA) experiment.

Every network has the same interface, so the actor and the learner never need to know which
environment they are looking at:

    outputs, core_state = model(inputs, core_state)

* ``inputs["state"]``: observations, time-major ``[T, B, *obs_shape]`` (acting uses ``T = 1``).
* ``inputs["done"]``: ``[T, B]`` bool; ``done[t, b]`` marks observation ``t`` as the first of a
  new episode, so the LSTM state of entry ``b`` is zeroed *before* step ``t``. Only read when
  the model has an LSTM core.
* ``outputs["policy_logits"]``: ``[T, B, num_actions]`` float32; ``outputs["baseline"]``:
  ``[T, B]`` float32.
* ``core_state``: ``(h, c)``, each ``[1, B, hidden]``, with an LSTM; ``()`` without one. Start
  from ``model.initial_state(B)``.

A net only defines its torso (``encode``); the heads and the optional LSTM live in the shared
base class. ``create_model`` picks the torso from the observation space (and, for Atari frames,
from ``atari_net``: the IMPALA ResNet or the Nature-DQN CNN).

``precision="bf16"`` runs the torso under bfloat16 autocast: the weights, their gradients, the
LSTM and the heads stay float32, so the optimizer and checkpoints see the same model either way.
On a CPU with bf16 instructions this doubles the ResNet's speed (see the README's benchmarks).
"""

import contextlib
from itertools import pairwise

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from examples.vtrace.minatar_torso import minatar_torso

# MinAtar frames are 10x10; anything this small and channels-last is treated as MinAtar.
MINATAR_MAX_SIDE = 16

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 autocast has fast kernels on this device (not merely an emulation)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    # oneDNN's own check for the AVX512-BF16 / AMX instructions.
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def layer_init(layer: nn.Module, gain: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class ActorCriticBase(nn.Module):
    """Policy and baseline heads on top of a torso, with an optional LSTM core in between."""

    # Whether precision="auto" runs this torso in bf16 where the CPU has bf16 instructions: only
    # where that was measured to be faster (bench/limits.py), not merely not slower.
    bf16_on_cpu = False

    def __init__(
        self, hidden_size: int, num_actions: int, use_lstm: bool = False, precision: str = "fp32"
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_actions = num_actions
        self.use_lstm = use_lstm
        self.precision = check_precision(precision)
        if use_lstm:
            self.core = nn.LSTM(hidden_size, hidden_size, num_layers=1)
        # Gain 0.01 keeps the initial logits close to zero, i.e. a near-uniform policy, so
        # early acting explores and the first importance weights are well behaved.
        self.policy = layer_init(nn.Linear(hidden_size, num_actions), gain=0.01)
        self.baseline = layer_init(nn.Linear(hidden_size, 1), gain=1.0)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Map a flat batch of raw observations [N, *obs_shape] to features [N, hidden]."""
        raise NotImplementedError

    def initial_state(self, batch_size: int) -> tuple:
        if not self.use_lstm:
            return ()
        device = self.policy.weight.device
        shape = (self.core.num_layers, batch_size, self.hidden_size)
        return tuple(torch.zeros(shape, device=device) for _ in range(2))

    def forward(self, inputs: dict, core_state: tuple = ()) -> tuple[dict, tuple]:
        device = self.policy.weight.device
        # Move before any dtype conversion: uint8 frames are 4x cheaper to transfer than floats.
        obs = inputs["state"].to(device)
        T, B = obs.shape[:2]

        # Time and batch are merged so the torso sees one big batch, whatever T is.
        if self.precision == "bf16":
            autocast = torch.autocast(device.type, dtype=torch.bfloat16)
        else:
            autocast = contextlib.nullcontext()
        with autocast:
            features = self.encode(obs.flatten(0, 1))
        # The heads and the LSTM in float32: logits feed a softmax and importance weights.
        features = features.float()

        if self.use_lstm:
            done = inputs["done"].to(device=device, dtype=torch.bool)
            core_out, core_state = self._unroll_core(features.view(T, B, -1), done, core_state)
            features = core_out.flatten(0, 1)

        logits = self.policy(features)
        baseline = self.baseline(features)
        outputs = {
            "policy_logits": logits.view(T, B, self.num_actions),
            "baseline": baseline.view(T, B),
        }
        return outputs, core_state

    def _unroll_core(self, x: torch.Tensor, done: torch.Tensor, core_state: tuple):
        """Run the LSTM over x [T, B, hidden], zeroing state where an episode starts."""
        T = x.shape[0]
        # Resets only happen at steps where some entry starts an episode. Between those steps
        # a single nn.LSTM call handles the whole chunk (fast cuDNN path), instead of a Python
        # loop over every step. Step 0 always opens a chunk so a done there is applied too.
        reset_steps = torch.nonzero(done.any(dim=1)).flatten().tolist()
        bounds = sorted({0, T, *reset_steps})

        h, c = core_state
        outputs = []
        for start, end in pairwise(bounds):
            keep = (~done[start]).view(1, -1, 1).to(h.dtype)
            h, c = h * keep, c * keep
            out, (h, c) = self.core(x[start:end], (h, c))
            outputs.append(out)
        return torch.cat(outputs), (h, c)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv0(F.relu(x))
        out = self.conv1(F.relu(out))
        return x + out


def conv_section(in_channels: int, out_channels: int) -> nn.Sequential:
    # padding=1 on the pool reproduces TF's "SAME" pooling: each section halves H and W
    # (rounding up), 84 -> 42 -> 21 -> 11.
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
        nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        ResidualBlock(out_channels),
        ResidualBlock(out_channels),
    )


CENTER_FRAMES_ON = ("mean", "background")
# The background is counted on every 7th pixel of every 7th row (144 of 84 x 84): for a
# minibatch of 256 stacks that took 2.6 ms where counting every pixel took 27-185 ms (the mean:
# 6-9 ms), and the background is 37-83% of an Atari frame's pixels (Pong 83%, Breakout 64%,
# MsPacman 37%), so the grid finds it.
BACKGROUND_GRID = 7


def check_center_frames_on(center_frames_on: str) -> str:
    if center_frames_on not in CENTER_FRAMES_ON:
        names = ", ".join(CENTER_FRAMES_ON)
        raise ValueError(f"center_frames_on must be one of {names}, got {center_frames_on!r}")
    return center_frames_on


def background_levels(obs: torch.Tensor) -> torch.Tensor:
    """Each stacked frame's background: the commonest grey level [N, C] of the uint8 frames
    [N, C, H, W], counted on a grid of their pixels."""
    n, c = obs.shape[:2]
    start = BACKGROUND_GRID // 2
    sample = obs[:, :, start::BACKGROUND_GRID, start::BACKGROUND_GRID].reshape(n * c, -1).long()
    sample = sample + torch.arange(n * c, device=obs.device)[:, None] * 256
    counts = torch.bincount(sample.flatten(), minlength=n * c * 256).view(n, c, 256)
    return counts.argmax(dim=-1).float()


class FramesNet(ActorCriticBase):
    """What the Atari torsos share: stacked frames [C, H, W] in 0..255, optionally centred."""

    def __init__(
        self,
        hidden_size,
        num_actions,
        use_lstm,
        precision,
        center_frames=False,
        center_frames_on="mean",
    ):
        super().__init__(hidden_size, num_actions, use_lstm, precision)
        self.center_frames = center_frames
        self.center_frames_on = check_center_frames_on(center_frames_on)

    def frame_levels(self, obs: torch.Tensor, frames: torch.Tensor, scale=1.0) -> torch.Tensor:
        """What centring subtracts from each frame [N, C], in the units of `frames` (the float
        copy of the uint8 `obs`, times `scale`)."""
        if self.center_frames_on == "mean":
            return frames.mean(dim=(2, 3))
        return background_levels(obs) * scale


class AtariNet(FramesNet):
    """IMPALA "deep" ResNet (Espeholt et al. 2018) for stacked frames [C, H, W] in 0..255."""

    # Channels-last (NHWC) activations let oneDNN (CPU) and cuDNN (tensor cores) skip a layout
    # conversion around every convolution: 1.8x faster on a CPU. The weights keep their layout.
    # torch.contiguous_format gives the layout of earlier versions (the benchmark compares both).
    memory_format = torch.channels_last
    # 1.8x the learner's samples/s of fp32 (with channels-last) on an AVX512-BF16 CPU.
    bf16_on_cpu = True

    def __init__(self, obs_shape, num_actions: int, use_lstm=False, precision="fp32", **centring):
        super().__init__(256, num_actions, use_lstm, precision, **centring)
        channels = [obs_shape[0], 16, 32, 32]
        self.sections = nn.Sequential(
            *(conv_section(c_in, c_out) for c_in, c_out in pairwise(channels))
        )
        with torch.no_grad():
            flat_size = self.sections(torch.zeros(1, *obs_shape)).numel()
        self.fc = nn.Linear(flat_size, self.hidden_size)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.contiguous(memory_format=self.memory_format).float() / 255.0
        if self.center_frames:
            x = x - self.frame_levels(obs, x, scale=1 / 255.0)[:, :, None, None]
        x = F.relu(self.sections(x))
        return F.relu(self.fc(x.flatten(1)))


class NatureNet(FramesNet):
    """The Nature-DQN torso (Mnih et al. 2015) for stacked frames [C, H, W] in 0..255: three
    convolutions (32 8x8 /4, 64 4x4 /2, 64 3x3 /1) and 512 units. A sixth of the ResNet's
    arithmetic per frame: the Atari net for CPU machines (preset=atari_cpu)."""

    memory_format = torch.channels_last  # 1.4x faster than NCHW on a CPU, as for the ResNet
    # bf16 gave 1.7x the learner's samples/s of fp32 on a CPU with AMX, but was not measured on
    # one with AVX512-BF16 alone: "auto" stays fp32 (precision=bf16 asks for it).
    bf16_on_cpu = False

    channels = (32, 64, 64)
    hidden = 512

    def __init__(self, obs_shape, num_actions: int, use_lstm=False, precision="fp32", **centring):
        super().__init__(self.hidden, num_actions, use_lstm, precision, **centring)
        c1, c2, c3 = self.channels
        self.convs = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], c1, kernel_size=8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(c1, c2, kernel_size=4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(c2, c3, kernel_size=3, stride=1)),
            nn.ReLU(),
        )
        with torch.no_grad():
            flat_size = self.convs(torch.zeros(1, *obs_shape)).numel()
        self.fc = layer_init(nn.Linear(flat_size, self.hidden_size))

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        # Frames to float before the layout change, and the 1/255 scaling applied to the first
        # layer's weights instead of to the frames: the same function, without two passes over
        # the largest tensor (they took a tenth of the learner thread's time).
        x = obs.float().contiguous(memory_format=self.memory_format)
        first = self.convs[0]
        weight = first.weight / 255.0
        if self.center_frames:
            # conv(x - level) without a pass that writes x - level: the first layer has no
            # padding, so each output sees every weight once and the level's share is
            # level . (the weights' sum per input channel).
            levels = self.frame_levels(obs, x)
            x = F.conv2d(x, weight, first.bias, first.stride)
            x = x - (levels @ weight.sum(dim=(2, 3)).T)[:, :, None, None]
        else:
            x = F.conv2d(x, weight, first.bias, first.stride)
        return F.relu(self.fc(self.convs[1:](x).flatten(1)))


class HalfNatureNet(NatureNet):
    """The Nature-DQN CNN at half its width: 16, 32 and 32 channels and 256 units, a quarter of
    the parameters and 2.4x the learner's samples/s on a CPU core (4,039 against 1,677 forward
    and backward, fp32, one thread): on two cores the agent's learner then costs less than its
    Atari envs. atari_net=nature_half."""

    channels = (16, 32, 32)
    hidden = 256


class MinAtarNet(ActorCriticBase):
    """The MinAtar baseline network for small channels-last grids [H, W, C] of 0/1."""

    def __init__(
        self, obs_shape, num_actions: int, use_lstm=False, precision="fp32", layer_norm=False,
        hidden_size=128,
    ):  # fmt: skip
        super().__init__(hidden_size, num_actions, use_lstm, precision)
        height, width, channels = obs_shape
        # No padding, as in the MinAtar paper's baseline (Young & Tian 2019): a 10x10 grid
        # gives 16 x 8 x 8 = 1024 features, so results stay comparable with published ones.
        self.conv = nn.Conv2d(channels, 16, kernel_size=3, stride=1)
        self.fc = nn.Linear(16 * (height - 2) * (width - 2), self.hidden_size)
        # The same [hidden, features] weight, stored transposed: the sparse torso reads each
        # feature's weights as one row of memory (minatar_torso.py). Checkpoints hold the
        # values either way; loading copies them into this layout.
        self.fc.weight = nn.Parameter(self.fc.weight.detach().t().contiguous().t())
        # A hidden unit whose sum is below zero on every frame gets no gradient through its
        # ReLU and stops learning; behind a layer norm it still learns, through the layer's mean
        # and spread, which all units share (docs/results.md).
        self.norm = nn.LayerNorm(self.hidden_size) if layer_norm else nn.Identity()

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(minatar_torso(obs, self.conv, self.fc)))


class MLPNet(ActorCriticBase):
    """Two tanh layers of 64 for flat vector observations (CartPole, Acrobot, ...)."""

    def __init__(self, obs_shape, num_actions: int, use_lstm: bool = False, precision="fp32"):
        super().__init__(64, num_actions, use_lstm, precision)
        # tanh keeps the features bounded, which suits unnormalised classic-control inputs.
        self.mlp = nn.Sequential(
            layer_init(nn.Linear(int(np.prod(obs_shape)), 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
        )

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(obs.to(torch.float32))


def _is_minatar(shape: tuple) -> bool:
    return len(shape) == 3 and shape[0] <= MINATAR_MAX_SIDE and shape[1] <= MINATAR_MAX_SIDE


def _is_atari(shape: tuple) -> bool:
    # Channels first: a few stacked frames, each larger than a MinAtar grid.
    return len(shape) == 3 and shape[0] <= MINATAR_MAX_SIDE < min(shape[1], shape[2])


def resolve_precision(precision: str, net: type[ActorCriticBase], device="cpu") -> str:
    """precision, with "auto" made "bf16" where it was measured faster: the nets that say so
    (bf16_on_cpu) on a CPU with bf16 instructions; "fp32" elsewhere. On a GPU bf16 is not yet
    measured (bench/gpu_check.sh does), so auto stays fp32 there."""
    if precision != "auto":
        return check_precision(precision)
    on_cpu = torch.device(device).type == "cpu"
    return "bf16" if net.bf16_on_cpu and on_cpu and bf16_supported("cpu") else "fp32"


def frames_for_encode(model, batch):
    """A learner batch whose Atari frames [T, B, C, H, W] are stored channels-last, as the
    model's encode reads them, when the model wants that layout (memory_format): converted once
    per batch here, as uint8, instead of as floats in every pass over it (a fifth of the
    learner thread's time on Pong with four passes). The same values either way."""
    if getattr(model, "memory_format", None) is not torch.channels_last:
        return batch
    frames = batch["state"]  # [T, B, C, H, W] (the nets with a memory_format take only frames)
    stored = frames.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    return {**batch, "state": stored}


ATARI_NETS = {"resnet": AtariNet, "nature": NatureNet, "nature_half": HalfNatureNet}


def create_model(
    observation_space: gym.spaces.Box,
    num_actions: int,
    use_lstm: bool = False,
    precision: str = "fp32",
    device="cpu",
    atari_net: str = "resnet",
    center_frames: bool = False,
    layer_norm: bool = False,
    center_frames_on: str = "mean",
    minatar_hidden: int = 128,
) -> ActorCriticBase:
    """Pick the torso that fits the observation space's shape; for Atari frames, `atari_net`
    ("resnet", "nature" or "nature_half") names it, and `center_frames` makes its first layer
    see each frame minus the frame's mean or background (`center_frames_on`; other nets ignore
    all three); `layer_norm` normalises the MinAtar net's hidden layer of `minatar_hidden` units
    (other nets ignore both).
    precision: "fp32", "bf16" or "auto" (see resolve_precision; device only serves that choice:
    the model is made on the CPU)."""
    if atari_net not in ATARI_NETS:
        raise ValueError(f"atari_net must be one of {', '.join(ATARI_NETS)}, got {atari_net!r}")
    shape = tuple(observation_space.shape)
    if len(shape) == 1:
        net = MLPNet
    elif _is_minatar(shape):
        net = MinAtarNet
    elif _is_atari(shape):
        net = ATARI_NETS[atari_net]
    else:
        raise ValueError(
            f"No model for observation shape {shape}: expected a 1-D vector (MLPNet), "
            f"channels-last [H, W, C] with H, W <= {MINATAR_MAX_SIDE} (MinAtarNet), or "
            f"channels-first stacked frames [C, H, W] with H, W > {MINATAR_MAX_SIDE} (AtariNet "
            "or NatureNet)."
        )
    precision = resolve_precision(precision, net, device)
    if net in ATARI_NETS.values():
        centring = {"center_frames": center_frames, "center_frames_on": center_frames_on}
        return net(shape, num_actions, use_lstm, precision, **centring)
    if net is MinAtarNet:
        return net(shape, num_actions, use_lstm, precision, layer_norm, minatar_hidden)
    return net(shape, num_actions, use_lstm, precision)


# The settings that decide the net's shape and what it computes: a checkpoint's weights belong
# to the net these made, so checkpoints store them and evaluate rebuilds the net from them.
ARCHITECTURE_KEYS = ("use_lstm", "atari_net", "center_frames", "center_frames_on", "layer_norm",
                     "minatar_hidden")  # fmt: skip


def architecture(flags) -> dict:
    """create_model's keyword arguments from an ExperimentConfig (or its DictConfig)."""
    return {key: getattr(flags, key) for key in ARCHITECTURE_KEYS}
