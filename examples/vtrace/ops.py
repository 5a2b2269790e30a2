"""The compiled CPU ops (csrc/*.cpp, one library): MinAtar's sparse torso (minatar_torso.py) and
the V-trace loss's gradients with respect to the net's outputs (loss.py's output_gradients).

`make install` compiles them for this torch (scripts/build_ops.py) into $MOOLIB_OPS_CACHE
(default ~/.cache/moolib-examples/ops), one library per set of sources, flags and torch
version. Where the library is not built, the torch ops they stand in for run, slower, with a
warning.
"""

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch

SOURCES = sorted(Path(__file__).with_name("csrc").glob("*.cpp"))
# -fopenmp-simd: the sources' `omp simd` loops (no OpenMP runtime). -fno-loop-unroll-and-jam:
# at -O3 GCC 12 fused the torso's hidden layer's loop over two features into one scalar loop, a
# third of the speed of the vector one it replaced (seen in the AVX2 clone's machine code).
CFLAGS = ["-O3", "-fopenmp-simd", "-fno-loop-unroll-and-jam"]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "moolib-examples" / "ops"
    return Path(os.environ.get("MOOLIB_OPS_CACHE", default))


def library_name() -> str:
    """The library's name for these sources, these flags and this torch."""
    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.name.encode() + source.read_bytes())
    key.update(" ".join(CFLAGS).encode() + torch.__version__.encode())
    return f"moolib_examples_ops_{key.hexdigest()[:12]}"


def library_path() -> Path:
    name = library_name()
    return cache_dir() / name / f"{name}.so"


def build(verbose: bool = False) -> Path:
    """Compiles the ops for this torch (about 30-60 s) unless they are there; returns the
    library's path."""
    from torch.utils.cpp_extension import load

    path = library_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    load(
        name=library_name(),
        sources=[str(source) for source in SOURCES],
        extra_cflags=CFLAGS,
        build_directory=str(path.parent),
        is_python_module=False,
        verbose=verbose,
    )
    return path


@functools.cache
def loaded() -> bool:
    """Whether torch.ops.moolib_examples holds the compiled ops: loads the library once, or
    warns (once) where it was not built for these sources and this torch."""
    path = library_path()
    if not path.exists():
        logging.warning(
            "The compiled ops are not built for this torch (%s): MinAtar's torso and the "
            "V-trace loss's gradients run as torch ops, slower. `make install` builds them.",
            path,
        )
        return False
    try:
        torch.ops.load_library(str(path))
    except OSError as error:
        logging.warning("The compiled ops did not load (%s); torch ops run instead.", error)
        return False
    return True
