"""Fixtures: child processes that are always stopped, and a broker on a free loopback port."""

import signal
import sys

import pytest
from helpers import Child, free_port


def pytest_configure(config):
    # A SIGTERM (kill, a CI timeout) would end pytest on the spot, and the brokers and peers the
    # running test started (each in its own session) would live on. As a KeyboardInterrupt it
    # unwinds like Ctrl-C: the fixtures' teardown stops them.
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


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
