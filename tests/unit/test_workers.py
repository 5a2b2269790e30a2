"""examples/common/workers.py: how a dead process is described, and waiting on a step future."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from examples.common import workers


def zombie(how):
    """A child process that ended `how` and is not reaped yet, like a dead EnvPool worker. Not
    os.fork(): moolib aborts a fork from a process where it has started threads."""
    code = (
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
        if how == "kill"
        else ("import os; os._exit(3)")
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while workers.process_end(child.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return child


@pytest.mark.parametrize(
    "how, words", [("kill", "was killed by SIGKILL"), ("exit", "exited with status 3")]
)
def test_a_dead_process_is_described_without_reaping_it(how, words):
    child = zombie(how)
    try:
        assert words in workers.process_end(child.pid)
    finally:
        child.wait()
    assert workers.process_end(os.getpid()) is None


class FakeFuture:
    def __init__(self, seconds):
        self.seconds = seconds

    def result(self):
        time.sleep(self.seconds)
        return {"state": 1}


def test_result_waits_for_a_live_worker_and_names_a_dead_one():
    guard = workers.EnvWorkers(env_factory=lambda: None, num_processes=1, poll_interval=0.05)
    assert guard.result(FakeFuture(0.2)) == {"state": 1}
    child = zombie("kill")
    pid = child.pid
    try:
        guard._pids[0], guard._parents[0], guard._count.value = pid, os.getpid(), 1
        started = time.monotonic()
        with pytest.raises(workers.EnvWorkerDied, match=rf"env worker 0 \(pid {pid}\) was killed"):
            guard.result(FakeFuture(3600))  # a step that never comes
        assert time.monotonic() - started < 1
    finally:
        child.wait()
    assert threading.active_count() >= 2  # the helper thread is a daemon left waiting


def test_create_env_registers_the_worker_once_per_process(monkeypatch):
    # Not in the test process itself: it would die with its parent shell.
    monkeypatch.setattr(workers, "_set_parent_death_signal", lambda sig: None)
    made = []
    guard = workers.EnvWorkers(env_factory=lambda: made.append(1) or "env", num_processes=2)
    old = {sig: signal.getsignal(sig) for sig in workers.STOP_SIGNALS}
    try:
        assert guard.create_env() == "env" and guard.create_env() == "env"
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert guard.worker_pids() == [os.getpid()] and len(made) == 2


def test_watch_waits_from_the_start_and_calls_back_when_the_step_is_in():
    guard = workers.EnvWorkers(env_factory=lambda: None, num_processes=1, poll_interval=0.05)
    woken = threading.Event()
    step = guard.watch(FakeFuture(0.2), on_ready=woken.set)
    assert not step.ready.is_set()
    assert woken.wait(5) and step.ready.is_set()
    assert guard.result(step) == {"state": 1}
