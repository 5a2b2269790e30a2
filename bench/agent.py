"""The V-trace agent for real: one peer (speed, and the memory of its process), and two peers of
one group on this machine (scaling). Each run has its own broker; the numbers come from the
peers' logs.tsv."""

import contextlib
import csv
import os
import pathlib
import statistics
import sys
import tempfile
import time

import psutil

from bench.processes import Child
from examples.common.address import with_free_port

# Time allowed for a peer to start (imports, env creation, connecting) before its log must grow.
STARTUP_SECONDS = 120


def read_log(path, columns=("time", "env_train_steps", "peers", "SPS")):
    """The numbers in `columns` of each row of a TSV log; none before it exists."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    parsed = []
    for row in rows:
        # A row still being written lacks its last fields, which DictReader fills with None.
        with contextlib.suppress(TypeError, ValueError):
            parsed.append({key: float(row[key]) for key in columns})
    return parsed


def slope(xs, ys):
    """Least-squares slope of ys over xs; nan when it is undefined."""
    try:
        return statistics.linear_regression(xs, ys).slope
    except statistics.StatisticsError:  # fewer than two points, or all xs equal
        return float("nan")


def train_rate(rows, warmup, peers=1):
    """env_train_steps per second over the rows after the warm-up (with all peers joined)."""
    rows = [r for r in rows if r["time"] >= warmup and r["peers"] >= peers]
    rate = slope([r["time"] for r in rows], [r["env_train_steps"] for r in rows])
    if not rate > 0:
        raise RuntimeError(f"no training progress in the {len(rows)} log rows after the warm-up")
    return rate


def proc_status_mb(pid, field):
    """VmRSS / VmHWM of a process in MB, or None once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    return None


def experiment_cmd(broker, workdir, env_name, settings, log_interval, name, group):
    overrides = {
        "connect": broker,
        "savedir": workdir / "savedir",
        "local_name": name,
        "project": "bench",
        "group": group,
        "env.name": env_name,
        "device": "cpu",
        **settings,
        "log_interval": log_interval,
        "total_steps": 10**12,  # never reached: the benchmark stops the peer
    }
    return [sys.executable, "-m", "examples.vtrace.experiment"] + [
        f"{key}={value}" for key, value in overrides.items()
    ]


class Peers:
    """A broker and one experiment peer per entry of peer_settings, all in one group; all are
    stopped when the with block ends."""

    def __init__(self, workdir, env_name, peer_settings, log_interval, group, code=None):
        self.workdir = workdir
        self.args = (env_name, peer_settings, log_interval, group)
        # Another checkout of the examples to run the peers from (the code of an earlier commit).
        self.code = {"cwd": code, "env": {"PYTHONPATH": str(code)}} if code else {}
        self.children, self.logs, self.cmds = [], [], []

    def __enter__(self):
        env_name, peer_settings, log_interval, group = self.args
        broker = with_free_port("127.0.0.1:0")
        self.children.append(Child([sys.executable, "-m", "moolib.broker", broker], "broker"))
        for i, settings in enumerate(peer_settings):
            name = f"peer{i}"
            cmd = experiment_cmd(
                broker, self.workdir, env_name, settings, log_interval, name, group
            )
            self.children.append(Child(cmd, name, **self.code))
            self.logs.append(self.workdir / "savedir" / "peers" / name / "logs.tsv")
            self.cmds.append(cmd)
        return self

    def __exit__(self, *exc):
        # Peers first, while their broker still answers; then the broker.
        for child in reversed(self.children):
            child.stop(grace=15)

    @property
    def peers(self):
        return self.children[1:]

    def check_alive(self):
        for child in self.peers:
            if child.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.poll()}:\n{child.tail()}")


def run_peers(workdir, env_name, peer_settings, log_interval, warmup, seconds, group, code=None):
    """Run peers until each has logged `seconds` past `warmup` with all of them joined.

    The first peer's memory is sampled every second meanwhile. Returns (rows per peer,
    memory: samples [(seconds since start, RSS MB, after warm-up)], peak RSS MB and the RSS of
    its EnvPool workers at the end, commands).
    """
    with Peers(workdir, env_name, peer_settings, log_interval, group, code) as peers:
        first = peers.peers[0]
        start = time.monotonic()
        samples, peak, steady = [], None, False
        while True:
            time.sleep(1)
            peers.check_alive()
            rows = [read_log(path) for path in peers.logs]
            joined = [[r for r in peer if r["peers"] >= len(peer_settings)] for peer in rows]
            # Memory counts as steady from the first log row past the warm-up on.
            steady = steady or any(r["time"] >= warmup for r in rows[0])
            rss = proc_status_mb(first.pid, "VmRSS")
            if rss is not None:
                samples.append((time.monotonic() - start, rss, steady))
                peak = proc_status_mb(first.pid, "VmHWM")
            if all(peer and peer[-1]["time"] >= warmup + seconds for peer in joined):
                memory = {"samples": samples, "peak": peak, "workers": workers_rss_mb(first.pid)}
                return rows, memory, peers.cmds
            waited = time.monotonic() - start
            if not all(rows) and waited > STARTUP_SECONDS:
                raise RuntimeError(f"no log rows after {STARTUP_SECONDS} s:\n{first.tail()}")
            if waited > STARTUP_SECONDS + 3 * (warmup + seconds):
                raise RuntimeError(f"the peers log too slowly:\n{first.tail()}")


def workers_rss_mb(pid):
    """Summed RSS of a peer's EnvPool worker processes (shared pages count in each)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    total = 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return round(total / 2**20, 1)


def memory_summary(memory):
    """Peak RSS, and how RSS grows after the warm-up.

    RSS swings by hundreds of MB within a learner step (activations are allocated and given
    back), so growth compares the medians of the first and last quarter of the samples, the
    slope is a least-squares fit over all of them, and the floor (the lowest RSS, between
    learner steps) of the first and last half shows a leak with the least noise.
    """
    samples, peak = memory["samples"], memory["peak"]
    steady = [(t, rss) for t, rss, after_warmup in samples if after_warmup] or [
        (t, rss) for t, rss, _ in samples
    ]
    times, values = zip(*steady, strict=True)
    quarter, half = len(values) // 4 or 1, len(values) // 2 or 1
    first, last = statistics.median(values[:quarter]), statistics.median(values[-quarter:])
    return {
        "peak_rss_mb": round(peak, 1) if peak else None,
        "env_workers_rss_mb": memory["workers"],
        "rss_first_quarter_mb": round(first, 1),
        "rss_last_quarter_mb": round(last, 1),
        "rss_growth_mb": round(last - first, 1),
        "rss_slope_mb_per_min": round(slope(times, values) * 60, 2),
        "rss_floor_growth_mb": round(min(values[half:]) - min(values[:half]), 1),
        "measured_minutes": round((times[-1] - times[0]) / 60, 1),
        # One sample every ~5 s is plenty for a plot and keeps the file small.
        "rss_samples": [(round(t), round(rss, 1)) for t, rss, _ in samples[::5]],
    }


def measure_agent(env_name, settings, mode, code=None):
    """The agent's env_train_steps/s after the warm-up, and its memory; with `code`, the agent of
    that checkout (an earlier commit) instead."""
    warmup = mode["agent_warmup"]
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        rows, memory, cmds = run_peers(
            pathlib.Path(tmp),
            env_name,
            [settings],
            mode["log_interval"],
            warmup,
            mode["agent_seconds"],
            group=f"agent-{os.getpid()}",
            code=code,
        )
    steady = [r for r in rows[0] if r["time"] >= warmup]
    agent = {
        "agent_sps": train_rate(rows[0], warmup),
        # Acting steps per second: above the training rate only when unrolls are dropped.
        "agent_acting_sps": statistics.fmean(r["SPS"] for r in steady),
        "agent_seconds": mode["agent_seconds"],
        "agent_warmup_seconds": warmup,
        "agent_cmd": " ".join(["python", *map(str, cmds[0][1:])]),
    }
    return agent, memory_summary(memory)


def measure_agent_before(env_name, settings, mode, code):
    """The agent of an earlier checkout, with the same settings and duration (not the ones its
    config does not know)."""
    earlier = {key: value for key, value in settings.items() if key != "precision"}
    agent, _ = measure_agent(
        env_name, earlier, dict(mode, agent_seconds=mode["before_seconds"]), code
    )
    return {"agent_before_sps": agent["agent_sps"], "agent_before_code": str(code)}


def measure_scaling(env_name, settings, mode, one_peer_sps):
    """Two peers of one group, each with half the actor processes, against one peer."""
    half = dict(settings, num_actor_cpus=max(1, settings["num_actor_cpus"] // 2))
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        rows, _, _ = run_peers(
            pathlib.Path(tmp),
            env_name,
            [half, half],
            mode["log_interval"],
            mode["scaling_warmup"],
            mode["scaling_seconds"],
            group=f"scaling-{os.getpid()}",
        )
    # env_train_steps counts the whole group's samples on every peer: each peer's slope is
    # already the total; they differ only by when each logged.
    rates = [train_rate(peer, mode["scaling_warmup"], peers=2) for peer in rows]
    total = statistics.fmean(rates)
    return {
        "one_peer_sps": one_peer_sps,
        "two_peers_sps": total,
        "two_peers_vs_one": total / one_peer_sps,
        "per_peer_settings": half,
    }
