"""Helpers shared by the tests: the repo path, free ports, child processes that are always
stopped, the TSV reader, and the CartPole settings and command line of the V-trace experiment."""

import csv
import os
import pathlib
import socket
import sys
import time

# Child has one home, shared with the benchmark, which starts its peers with it.
from bench.processes import Child  # noqa: F401

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


# CartPole settings for the V-trace experiment: they learn in a few hundred thousand steps.
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


def descendants(pid):
    """Pids of all processes below `pid` (EnvPool: its server, then the server's workers)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def write_results_run(workdir, game, seed, returns, steps=1000, seconds_per_row=2.0):
    """The logs.tsv of one finished bench.minatar / bench.atari run: a row every steps/10 env
    steps, one episode per row with the given return."""
    peer = workdir / f"{game}-s{seed}-p1-{steps}" / "peers" / f"{game}-peer0"
    peer.mkdir(parents=True)
    lines = ["step\tepisodes\tmean_episode_return\ttime"]
    for i, value in enumerate(returns, start=1):
        lines.append(f"{i * steps // 10}\t1\t{value}\t{i * seconds_per_row}")
    (peer / "logs.tsv").write_text("\n".join(lines) + "\n")


class Queue:
    """The learner's queue as AsyncLearner sees it, holding the given batches in order."""

    def __init__(self, batches):
        self.batches = list(batches)

    def ready(self):
        return bool(self.batches)

    def get(self):
        return self.batches.pop(0)


class LonePeerAccumulator:
    """As moolib's Accumulator of a group of one behaves (measured with moolib 0.0.9b0): after
    reduce_gradients the sum is in at the second update(); zero_gradients ends the step. One
    difference: moolib's wants_gradients() stays True from reduce_gradients until the next
    update() (measured again 2026-12-06), this one's turns False at once: with it, a learner
    submits its next batch after the optimizer step; with moolib, before."""

    def __init__(self):
        self.version, self.updates_left, self.ready, self.reduced = 0, None, False, 0

    def wants_gradients(self):
        return self.updates_left is None and not self.ready

    def reduce_gradients(self, batch_size):
        self.updates_left, self.reduced = 2, batch_size

    def update(self):
        if self.updates_left is not None:
            self.updates_left -= 1
            if self.updates_left == 0:
                self.updates_left, self.ready = None, True

    def has_gradients(self):
        return self.ready

    def get_gradient_stats(self):
        return {"batch_size": self.reduced}

    def zero_gradients(self):
        self.ready = False
        self.version += 1

    def model_version(self):
        return self.version

    def skip_gradients(self):
        raise AssertionError("a lone peer never skips")


def linear_learner_state():
    """A LearnerState of a tiny model (nn.Linear(2, 1)) with Adam, every .grad already there as
    the Accumulator needs: for the learner and optimizer tests."""
    import torch
    from torch import nn

    from examples.vtrace.state import LearnerState

    model = nn.Linear(2, 1)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    return LearnerState(model, torch.optim.Adam(model.parameters()))
