"""The MinAtar net's torso (conv 3x3 -> ReLU -> hidden layer) as one compiled CPU op that skips
zeros, and the dense torch ops it stands in for.

A MinAtar frame has a few dozen non-zero cells of its 10 x 10 x C, and a trained net keeps
3-150 of the convolution's 1,024 features a frame (docs/results.md). The op (csrc/
minatar_torso.cpp) visits only those, reading a feature's hidden-layer weights as one row of
the weight stored transposed (MinAtarNet stores it so): a learner minibatch's forward and
backward passes through the torso took 1.5 ms instead of 3.1-3.4 on a trained Asterix net, an
act of 64 frames 0.2 ms instead of 0.5. Where more than a fifth of the features fire (a fresh
net: about half), its hidden layer runs dense.

`make install` compiles it for this torch (scripts/build_minatar_torso.py) into
$MOOLIB_OPS_CACHE (default ~/.cache/moolib-examples/ops), one file per source and torch
version. Off the CPU the dense ops run; where the op is not built, they run with a warning.
"""

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

SOURCE = Path(__file__).with_name("csrc") / "minatar_torso.cpp"
# -fopenmp-simd: the source's `omp simd` loops (no OpenMP runtime). -fno-loop-unroll-and-jam:
# at -O3 GCC 12 fused the hidden layer's loop over two features into one scalar loop, a third
# of the speed of the vector one it replaced (seen in the AVX2 clone's machine code).
CFLAGS = ["-O3", "-fopenmp-simd", "-fno-loop-unroll-and-jam"]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "moolib-examples" / "ops"
    return Path(os.environ.get("MOOLIB_OPS_CACHE", default))


def library_name() -> str:
    """The library's name for this source, these flags and this torch."""
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(CFLAGS).encode() + torch.__version__.encode()
    ).hexdigest()[:12]
    return f"minatar_torso_{key}"


def library_path() -> Path:
    name = library_name()
    return cache_dir() / name / f"{name}.so"


def build(verbose: bool = False) -> Path:
    """Compiles the op for this torch (about 20-40 s) unless it is there; returns its path."""
    from torch.utils.cpp_extension import load

    path = library_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    load(
        name=library_name(),
        sources=[str(SOURCE)],
        extra_cflags=CFLAGS,
        build_directory=str(path.parent),
        is_python_module=False,
        verbose=verbose,
    )
    return path


@functools.cache
def compiled_op():
    """torch.ops.moolib_examples.minatar_torso, loaded once; None (with a warning) where it was
    not built for this source and torch."""
    path = library_path()
    if not path.exists():
        logging.warning(
            "MinAtar's sparse torso is not built for this torch (%s); the dense one runs, "
            "slower. `make install` builds it.",
            path,
        )
        return None
    try:
        torch.ops.load_library(str(path))
    except OSError as error:
        logging.warning("MinAtar's sparse torso did not load (%s); the dense one runs.", error)
        return None
    return torch.ops.moolib_examples.minatar_torso


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
