"""make results (bench.minatar): a SIGTERM to it stops the runs it started, which live in their
own sessions, and each leaves its checkpoint."""

import os
import signal
import sys

import pytest
from helpers import wait_until

pytestmark = pytest.mark.slow


def processes_mentioning(text):
    """Pids of the processes whose command line contains `text`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_sigterm_stops_the_runs_it_started_with_their_checkpoints(children, tmp_path):
    workdir = tmp_path / "runs"
    bench = children(
        [sys.executable, "-m", "bench.minatar", "--games", "Breakout", "--seeds", "1",
         "--parallel", "1", "--workdir", workdir, "--out", tmp_path / "out"],
        name="bench.minatar",
    )  # fmt: skip
    run = workdir / "Breakout-s0-p1-5000000"
    try:
        assert wait_until(lambda: list(run.glob("peers/*/logs.tsv")), timeout=180), bench.tail()
        peers = processes_mentioning(str(workdir))
        assert peers, bench.tail()
        bench.signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM, bench.tail()
        assert wait_until(lambda: not processes_mentioning(str(workdir)), timeout=30)
        assert (run / "checkpoint.tar").exists()
    finally:
        for pid in processes_mentioning(str(workdir)):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
