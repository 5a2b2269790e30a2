"""Shared test helpers: free ports, and child processes that are always stopped."""

import os
import pathlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host, port, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


class Child:
    """A child process whose combined output is collected line by line in the background."""

    def __init__(self, args, name, cwd=None, env=None):
        self.name = name
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
        for key, value in (env or {}).items():  # None removes a variable
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        self.proc = subprocess.Popen(
            args,
            cwd=cwd or REPO,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # so stop() can take EnvPool workers down with it
        )
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

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self):
        """Terminate the whole process group; SIGKILL whatever is left after a grace period."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if self.wait(10) is None:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # EnvPool workers may outlive the parent
        except ProcessLookupError:
            pass
        self.wait(10)


@pytest.fixture
def children():
    """spawn(args, name) starts a child process; all are stopped at teardown, even on failure."""
    started = []

    def spawn(args, name="child", **kwargs):
        child = Child([str(a) for a in args], name, **kwargs)
        started.append(child)
        return child

    yield spawn
    for child in reversed(started):
        child.stop()
    for child in started:
        if child.proc.returncode not in (0, None, -signal.SIGTERM, -signal.SIGKILL):
            print(f"--- output of {child.name} (exit {child.proc.returncode}) ---\n{child.output}")


@pytest.fixture
def broker(children):
    """A moolib broker on a free loopback port; yields its address."""
    port = free_port()
    child = children([sys.executable, "-m", "moolib.broker", f"127.0.0.1:{port}"], "broker")
    line = child.wait_for_line(lambda s: "Broker listening at" in s, timeout=60)
    assert line, f"broker did not start:\n{child.output}"
    return f"127.0.0.1:{port}"
