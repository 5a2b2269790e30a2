"""Checkpoint files that are either whole or absent, and that fail loudly when damaged."""

import os
import pathlib
import pickle
import zipfile

import torch


class CheckpointError(Exception):
    """A checkpoint exists but cannot be used; the message names the file and the reason."""


def save_atomic(obj, path):
    """Write obj with torch.save so that a crash at any moment leaves the old file intact.

    The data goes to a temporary file in the same folder, is fsynced, and then renamed over the
    target: a rename within one file system is atomic.
    """
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path, required_keys=("model", "optimizer", "model_version")):
    """Load a checkpoint written by save_atomic onto the CPU, or raise CheckpointError."""
    path = pathlib.Path(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if reason.startswith("Weights only load failed"):
            # torch's message is long and suggests unsafe loading; the file is just not ours.
            reason = "not readable as a torch checkpoint"
        raise CheckpointError(f"{path} is corrupt or truncated ({reason})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} is not a checkpoint of this project (not a dict)")
    missing = [key for key in required_keys if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (no {', '.join(missing)})"
        )
    return checkpoint
