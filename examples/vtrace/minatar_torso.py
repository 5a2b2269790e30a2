"""The MinAtar net's torso (conv 3x3 -> ReLU -> hidden layer) as one compiled CPU op that skips
zeros, and the dense torch ops it stands in for.

A MinAtar frame has a few dozen non-zero cells of its 10 x 10 x C, and a trained net keeps
3-150 of the convolution's 1,024 features a frame (docs/results.md). The op (csrc/
minatar_torso.cpp) visits only those, reading a feature's hidden-layer weights as one row of
the weight stored transposed (MinAtarNet stores it so): a learner minibatch's forward and
backward passes through the torso took 1.5 ms instead of 3.1-3.4 on a trained Asterix net, an
act of 64 frames 0.2 ms instead of 0.5. Where more than a fifth of the features fire (a fresh
net: about half), its hidden layer runs dense.

`make install` compiles it with the other ops (ops.py). Off the CPU the dense ops run; where the
op is not built, they run with a warning.
"""

import functools

import torch
from torch import nn
from torch.nn import functional as F

from examples.vtrace import ops


@functools.cache
def compiled_op():
    """torch.ops.moolib_examples.minatar_torso; None (with a warning) where it is not built."""
    return torch.ops.moolib_examples.minatar_torso if ops.loaded() else None


def dense_torso(frames: torch.Tensor, conv: nn.Conv2d, fc: nn.Linear) -> torch.Tensor:
    x = conv(frames.permute(0, 3, 1, 2).float())
    # The conv answers channels-last input in channels-last; flatten needs NCHW order, and
    # ReLU's backward between the two layouts took 1 ms of the learner's 12 per minibatch.
    return fc(F.relu(x.contiguous()).flatten(1))


def minatar_torso(frames: torch.Tensor, conv: nn.Conv2d, fc: nn.Linear) -> torch.Tensor:
    """fc(relu(conv(frames))) for channels-last frames [N, H, W, C], the conv's features
    flattened in NCHW order: the compiled op on the CPU in float32, the dense ops elsewhere (a
    GPU's products are cheap, and bf16 autocast is for the dense kernels)."""
    on_cpu = frames.device.type == "cpu" and fc.weight.device.type == "cpu"
    if on_cpu and not torch.is_autocast_enabled("cpu"):
        op = compiled_op()
        if op is not None:
            return op(frames.float(), conv.weight, conv.bias, fc.weight, fc.bias)
    return dense_torso(frames, conv, fc)
