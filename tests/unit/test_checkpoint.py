"""Checkpoints are whole or absent, and damaged ones are refused with the file's name."""

import subprocess
import sys

import pytest
import torch

from examples.common import checkpoint


def test_round_trip(tmp_path):
    path = tmp_path / "checkpoint.tar"
    data = {"model": {"w": torch.arange(3.0)}, "optimizer": {}, "model_version": 7}
    checkpoint.save_atomic(data, path)
    loaded = checkpoint.load(path)
    assert loaded["model_version"] == 7
    torch.testing.assert_close(loaded["model"]["w"], torch.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.tar"]  # no temp file left


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.tar"
    checkpoint.save_atomic({"model": {}, "optimizer": {}, "model_version": 1}, path)
    before = path.read_bytes()

    def crash_halfway(obj, f):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", crash_halfway)
    with pytest.raises(OSError):
        checkpoint.save_atomic({"model": {}, "optimizer": {}, "model_version": 2}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.tar"]


def test_a_killed_writer_leaves_the_previous_checkpoint(tmp_path):
    # SIGKILL a process in the middle of writing a large checkpoint, many times over.
    path = tmp_path / "checkpoint.tar"
    checkpoint.save_atomic({"model": {}, "optimizer": {}, "model_version": 0}, path)
    writer = (
        "import sys, torch\n"
        "from examples.common import checkpoint\n"
        "big = {'model': {'w': torch.randn(4_000_000)}, 'optimizer': {}, 'model_version': 1}\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    checkpoint.save_atomic(big, sys.argv[1])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        import time

        time.sleep(1.5)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    loaded = checkpoint.load(path)  # whichever version it is, it is whole
    assert loaded["model_version"] in (0, 1)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "corrupt or truncated"),
        (b"garbage that is not a checkpoint", "corrupt or truncated"),
    ],
)
def test_damaged_files_are_refused_with_their_name(tmp_path, content, reason):
    path = tmp_path / "checkpoint.tar"
    path.write_bytes(content)
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(path)
    assert str(path) in str(info.value) and reason in str(info.value)


def test_truncated_checkpoint_is_refused(tmp_path):
    path = tmp_path / "checkpoint.tar"
    data = {"model": {"w": torch.randn(10000)}, "optimizer": {}, "model_version": 3}
    checkpoint.save_atomic(data, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(checkpoint.CheckpointError, match="corrupt or truncated"):
        checkpoint.load(path)


def test_other_pickles_are_refused(tmp_path):
    path = tmp_path / "checkpoint.tar"
    torch.save({"weights": [1, 2]}, path)
    with pytest.raises(checkpoint.CheckpointError, match="not a checkpoint of this project"):
        checkpoint.load(path)


def test_save_if_newer_never_puts_a_checkpoint_back(tmp_path):
    # A peer that fell behind, or never joined its group, must not replace the group's work.
    path = tmp_path / "checkpoint.tar"
    checkpoint.save_if_newer({"model": {}, "optimizer": {}, "model_version": 1892}, path)
    with pytest.raises(checkpoint.NotNewer, match="model_version 1892, newer than this peer's 528"):
        checkpoint.save_if_newer({"model": {}, "optimizer": {}, "model_version": 528}, path)
    assert checkpoint.load(path)["model_version"] == 1892
    checkpoint.save_if_newer({"model": {}, "optimizer": {}, "model_version": 1900}, path)
    assert checkpoint.load(path)["model_version"] == 1900
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.tar"]


def test_save_if_newer_keeps_a_file_it_cannot_judge(tmp_path):
    path = tmp_path / "checkpoint.tar"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoint.NotNewer, match="unreadable"):
        checkpoint.save_if_newer({"model": {}, "optimizer": {}, "model_version": 5}, path)
    assert path.read_bytes() == b"not a checkpoint"
