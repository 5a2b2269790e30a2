"""Helpers shared by the tests: the repo path, free ports, child processes that are always
stopped, the TSV reader, and the CartPole settings and command line of the V-trace experiment."""

import csv
import os
import pathlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

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




def read_rows(path):
    """The rows of a TSV log (logs.tsv, eval.tsv) as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def wait_until(condition, timeout, interval=0.2):
    """Poll condition() until it returns something truthy (returned) or timeout s pass (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return None


# CartPole settings for the V-trace experiment that learn in a few hundred thousand steps on 2 cores.
CARTPOLE = [
    "env.name=CartPole-v1",
    "actor_batch_size=16",
    "num_actor_cpus=1",
    "batch_size=16",
    "virtual_batch_size=16",
    "unroll_length=5",
    "optimizer.learning_rate=0.002",
    "entropy_cost=0.01",
    "log_interval=2",
]


def experiment(broker, savedir, *overrides):
    """The command line of one V-trace peer in its own group (named after savedir)."""
    return [
        sys.executable, "-m", "examples.vtrace.experiment",
        f"connect={broker}", f"savedir={savedir}", "project=test", f"group={savedir.name}",
        *overrides,
    ]  # fmt: skip
