"""Child processes that are always stopped, with their output collected line by line: the
benchmark's brokers and peers, and the tests' (tests/helpers.py takes Child from here).

Only the standard library, so that the tests can import it without the benchmark's packages."""

import contextlib
import os
import pathlib
import queue
import signal
import subprocess
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


class Child:
    """A child process in its own process group, whose combined output is collected in the
    background (`lines`, `output`)."""

    def __init__(self, args, name, cwd=None, env=None):
        self.name = name
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
        for key, value in (env or {}).items():  # None removes a variable
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        self.proc = subprocess.Popen(
            [str(arg) for arg in args],
            cwd=cwd or REPO,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # so stop() can take EnvPool workers down with it
        )
        self.pid = self.proc.pid
        self.lines = []
        self._queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    @property
    def output(self):
        return "\n".join(self.lines)

    def tail(self, count=15):
        return "\n".join(self.lines[-count:])

    def wait_for_line(self, predicate, timeout):
        """Block until an output line satisfies predicate; returns it, or None on timeout/exit."""
        for line in list(self.lines):
            if predicate(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                return None
            if predicate(line):
                return line

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, grace=10):
        """SIGTERM to the child, then SIGKILL to its whole group after `grace` seconds.

        SIGTERM goes to the leader only: an experiment stops cleanly on it, but its EnvPool
        workers (same group) would die at once on a group-wide SIGTERM and leave it waiting on
        them until the SIGKILL."""
        self.signal(signal.SIGTERM)
        self.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # EnvPool workers may outlive the parent
        self.wait(grace)


@contextlib.contextmanager
def running(args, name, **kwargs):
    """A Child for the duration of a with block."""
    child = Child(args, name, **kwargs)
    try:
        yield child
    finally:
        child.stop()
