"""Checkpoint files that are either whole or absent, and that fail loudly when damaged."""

import contextlib
import fcntl
import os
import pathlib
import pickle
import zipfile

import torch


class CheckpointError(Exception):
    """A checkpoint exists but cannot be used; the message names the file and the reason."""


class NotNewer(Exception):
    """save_if_newer did not write: the file there is newer, or cannot be judged. The message is
    one line that says so."""


def save_atomic(obj, path, before_rename=None):
    """Write obj with torch.save so that a crash at any moment leaves the old file intact.

    The data goes to a temporary file in the same folder, is fsynced, and then renamed over the
    target: a rename within one file system is atomic. `before_rename()`, if given, runs just
    before the rename and may raise to keep the old file.
    """
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def saved_version(path, key="model_version"):
    """The `key` entry of the checkpoint at path, None if there is no file; reads no tensor data
    (mmap), so that it is cheap enough to call before every write. Raises CheckpointError."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        return None
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as e:
        raise CheckpointError(f"{path} is unreadable ({type(e).__name__})") from None
    if not isinstance(data, dict) or key not in data:
        raise CheckpointError(f"{path} has no {key}")
    return data[key]


@contextlib.contextmanager
def _folder_lock(folder):
    # Peers on one machine that share a savedir: the version check and the rename happen as one.
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # also releases the lock


def save_if_newer(obj, path, key="model_version"):
    """save_atomic(obj, path), unless the checkpoint already at path has a higher obj[key].

    The file there is the judge, read just before the rename (under a lock on the folder), so a
    peer that fell behind, or never joined its group, cannot put the group's training back.
    A file that cannot be read is kept too: it is not ours to destroy. Raises NotNewer, with the
    reason in one line, when it does not write.
    """
    path = pathlib.Path(path)
    ours = obj[key]

    def judge():
        try:
            theirs = saved_version(path, key)
        except CheckpointError as e:
            raise NotNewer(f"{e}; not replacing it") from None
        if theirs is not None and theirs > ours:
            raise NotNewer(
                f"{path} holds {key} {theirs}, newer than this peer's {ours}; not replacing it"
            )

    with _folder_lock(path.parent):
        save_atomic(obj, path, before_rename=judge)


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
