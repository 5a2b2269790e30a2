"""Throughput, learning and memory benchmarks for the examples (GitHub issue 6).

    python bench/run.py            # quick mode: under 15 minutes on a 2-core machine
    python bench/run.py --smoke    # every measurement with tiny sizes, about 2 minutes
    python bench/run.py --long     # quick mode, but the V-trace agent runs for 10 minutes
    python bench/run.py --only limits,agent --set num_actor_cpus=1 --env ALE/Breakout-v5

Writes bench/results.json and prints a table, plus a Markdown copy of it for the README. A part
that fails is recorded under "errors" (exit status 1) and the others still run.

V-trace: the agent's speed only means something next to what the machine allows, so three
numbers are measured with one set of settings (VTRACE_SETTINGS):

* env limit: random actions through moolib.EnvPool, no model at all;
* learner limit: forward, backward and Adam steps of the experiment's model and loss on random
  batches, no envs and no moolib, in a second thread as in the experiment;
* agent: env_train_steps per second of the real experiment (one peer, own broker), read from
  its logs.tsv after a warm-up.

ratio = agent / min(env limit, learner limit); the issue's target is 0.8. Other work on the
machine makes absolute numbers drift by tens of percent within minutes, so the three are measured
in one run, and the two limits once before and once after the agent (their means are used).

A2C: examples/a2c.py and Stable-Baselines3's A2C on CartPole-v1 with 8 envs each, 100k steps,
several seeds: speed and the mean return of the last 100 episodes.

Memory: peak and growth of the resident memory of the V-trace peer process during the agent
run. Scaling: two peers of one group on this machine against the one-peer agent run.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import datetime
import importlib.metadata
import json
import math
import multiprocessing
import os
import pathlib
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import moolib
import numpy as np
import psutil
import torch
from omegaconf import OmegaConf

from examples.common.address import with_free_port
from examples.common.envs import EnvFactory, check_env_name
from examples.vtrace.experiment import compute_loss, create_optimizer
from examples.vtrace.models import create_model

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results.json"
PARTS = ["limits", "agent", "scaling", "a2c", "sb3"]

# One set of settings for the three V-trace measurements; also the README's 2-core command line.
# Small batches: on a CPU the per-sample cost of the ResNet grows with the batch (caches), and
# the agent acts and learns in two threads. One torch thread: a second one only spins against the
# env processes. Tried on 2 cores: see `--set` to try others.
VTRACE_SETTINGS = {
    "actor_batch_size": 8,
    "num_actor_batches": 2,
    "num_actor_cpus": 2,
    "batch_size": 8,
    "unroll_length": 20,
    "virtual_batch_size": 8,
    "torch_threads": 1,
}

# Durations in seconds, sizes in env steps. The agent's warm-up skips start-up, the first learner
# steps and the group forming; its window holds enough log rows for a steady slope.
MODES = {
    "smoke": dict(env_warmup=2, env_seconds=5, learner_warmup_steps=1, learner_seconds=5,
                  agent_warmup=10, agent_seconds=15, scaling_warmup=10, scaling_seconds=15,
                  log_interval=2, a2c_steps=5_000, a2c_seeds=[0], a2c_defaults_steps=5_000,
                  sb3_steps=5_000, sb3_seeds=[0]),
    "quick": dict(env_warmup=5, env_seconds=20, learner_warmup_steps=2, learner_seconds=20,
                  agent_warmup=20, agent_seconds=90, scaling_warmup=20, scaling_seconds=60,
                  log_interval=5, a2c_steps=100_000, a2c_seeds=[0, 1, 2], a2c_defaults_steps=None,
                  sb3_steps=100_000, sb3_seeds=[0, 1, 2]),
}  # fmt: skip
MODES["long"] = dict(MODES["quick"], agent_seconds=600)

# Time allowed for a peer to start (imports, env creation, connecting) before its log must grow.
STARTUP_SECONDS = 120


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Benchmarks of the moolib examples (issue 6).")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes, about 2 minutes")
    size.add_argument("--long", action="store_true", help="run the V-trace agent for 10 minutes")
    p.add_argument("--env", default="ALE/Pong-v5", help="env of the V-trace measurements")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a V-trace setting, e.g. --set batch_size=16 (repeatable)",
    )
    p.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated subset of: {', '.join(PARTS)}"
    )
    p.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results file")
    args = p.parse_args(argv)
    args.mode = "smoke" if args.smoke else "long" if args.long else "quick"
    args.parts = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        p.error(f"--only: unknown parts {unknown}; choose from {PARTS}")
    try:
        check_env_name(args.env)
    except ValueError as e:
        p.error(f"--env: {e}")
    args.settings = dict(VTRACE_SETTINGS)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in VTRACE_SETTINGS or not value.isdigit():
            p.error(f"--set {item!r}: expected KEY=N with KEY one of {list(VTRACE_SETTINGS)}")
        args.settings[key] = int(value)
    return args


# ---------------------------------------------------------------------------------------------
# Machine description


def cpu_model():
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_gib():
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit():
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def describe_machine():
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "moolib": package_version("moolib"),
        "stable_baselines3": package_version("stable-baselines3"),
        "git": git_commit(),
    }


# ---------------------------------------------------------------------------------------------
# V-trace: env limit and learner limit, in this process


def experiment_flags(settings):
    """The experiment's config with the benchmark's settings, for compute_loss."""
    flags = OmegaConf.load(REPO / "examples" / "vtrace" / "config.yaml")
    for key, value in settings.items():
        OmegaConf.update(flags, key, value)
    return flags


def measure_env_limit(env_name, settings, warmup, seconds):
    """Env steps per second of EnvPool alone, stepped like the agent steps it."""
    B, num_batches = settings["actor_batch_size"], settings["num_actor_batches"]
    factory = EnvFactory(env_name, seed=12345)
    num_actions = factory.spaces()[1].n
    envs = moolib.EnvPool(
        factory, num_processes=settings["num_actor_cpus"], batch_size=B, num_batches=num_batches
    )
    futures = [envs.step(i, torch.zeros(B, dtype=torch.int64)) for i in range(num_batches)]
    batch = 0

    def step():
        nonlocal batch
        # Copy out of shared memory, as the agent does before the next step overwrites it.
        {key: value.clone() for key, value in futures[batch].result().items()}
        futures[batch] = envs.step(batch, torch.randint(num_actions, (B,)))
        batch = (batch + 1) % num_batches

    deadline = time.monotonic() + warmup
    while time.monotonic() < deadline:
        step()
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        step()
        steps += B
    elapsed = time.monotonic() - start
    for future in futures:  # let the workers finish before the pool goes away with this frame
        with contextlib.suppress(Exception):
            future.result()
    return {"env_limit_sps": steps / elapsed, "env_limit_seconds": round(elapsed, 1)}


def random_learner_batch(observation_space, num_actions, T, B):
    """A [T+1, B] batch with the dtypes and shapes the agent's Batcher hands the learner."""
    shape = (T + 1, B)
    if observation_space.dtype == np.uint8:
        state = torch.randint(0, 256, shape + observation_space.shape, dtype=torch.uint8)
    else:
        state = torch.randn(shape + observation_space.shape)
    return {
        "state": state,
        "done": torch.rand(shape) < 0.01,
        "reward": torch.randint(-1, 2, shape).float(),
        "action": torch.randint(num_actions, shape),
        "policy_logits": torch.randn(shape + (num_actions,)),
    }


def measure_learner_limit(env_name, settings, warmup_steps, seconds):
    """Samples (T x B) per second of the experiment's learner step, without envs or moolib."""
    flags = experiment_flags(settings)
    if flags.torch_threads > 0:
        torch.set_num_threads(flags.torch_threads)
    observation_space, action_space = EnvFactory(env_name).spaces()
    model = create_model(observation_space, action_space.n, use_lstm=flags.use_lstm)
    optimizer = create_optimizer(flags, model)
    T, B = flags.unroll_length, flags.batch_size
    batch = random_learner_batch(observation_space, action_space.n, T, B)
    if flags.use_lstm:
        batch["core_state"] = model.initial_state(B)

    def step():
        loss, _ = compute_loss(flags, model, batch)
        model.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), flags.grad_norm_clipping)
        optimizer.step()

    for _ in range(warmup_steps):
        step()
    steps, start = 0, time.monotonic()
    while steps < 3 or time.monotonic() - start < seconds:
        step()
        steps += 1
    elapsed = time.monotonic() - start
    return {
        "learner_limit_sps": steps * T * B / elapsed,
        "learner_step_seconds": elapsed / steps,
        "learner_steps": steps,
    }


def measure_learner_limit_in_thread(*args):
    """measure_learner_limit in a second thread, where the experiment runs its learner: there it
    runs a few percent faster than in a process's main thread (measured: 150 against 141 SPS
    on Pong), and the agent would otherwise seem to beat its own limit."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(measure_learner_limit, *args).result()


def in_fresh_process(fn, *args):
    """fn(*args) in a newly started interpreter: EnvPool forks its workers, which moolib refuses
    in a process that has threads already, and each measurement starts from a clean process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def measure_limits(env_name, settings, mode):
    env = in_fresh_process(
        measure_env_limit, env_name, settings, mode["env_warmup"], mode["env_seconds"]
    )
    learner = in_fresh_process(
        measure_learner_limit_in_thread,
        env_name,
        settings,
        mode["learner_warmup_steps"],
        mode["learner_seconds"],
    )
    return {**env, **learner}


def combine_limits(before, after):
    """Each limit as the mean of its measurements before and after the agent run."""
    combined = {}
    for key in ["env_limit_sps", "learner_limit_sps"]:
        runs = [before[key], after[key]]
        combined[key] = statistics.fmean(runs)
        combined[key.replace("_sps", "_runs")] = [round(x, 1) for x in runs]
    return combined


# ---------------------------------------------------------------------------------------------
# Subprocesses: a broker and experiment peers


@contextlib.contextmanager
def process_group(cmd, logfile, grace=15):
    """Run cmd in its own process group; on leaving, stop it and everything it forked."""
    with open(logfile, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        # SIGTERM to the leader only lets the experiment stop cleanly; its EnvPool workers (same
        # group) would die at once on a group-wide SIGTERM and leave it waiting on them.
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tail(path, lines=15):
    with contextlib.suppress(OSError):
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])
    return ""


def read_log(path, columns=("time", "env_train_steps", "peers", "SPS")):
    """The numbers in `columns` of each row of a peer's logs.tsv; none before it exists."""
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
    """Least-squares slope of ys over xs."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if not sxx:
        return float("nan")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx


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


def start_peers(stack, workdir, env_name, peer_settings, log_interval, group):
    """Start a broker and one experiment per entry of peer_settings, all in one group; they
    stop when `stack` closes. Returns [(name, process, logs.tsv path, command)]."""
    broker = with_free_port("127.0.0.1:0")
    stack.enter_context(
        process_group([sys.executable, "-m", "moolib.broker", broker], workdir / "broker.out")
    )
    peers = []
    for i, settings in enumerate(peer_settings):
        name = f"peer{i}"
        cmd = experiment_cmd(broker, workdir, env_name, settings, log_interval, name, group)
        proc = stack.enter_context(process_group(cmd, workdir / f"{name}.out"))
        peers.append((name, proc, workdir / "savedir" / "peers" / name / "logs.tsv", cmd))
    return peers


def check_alive(peers, workdir):
    for name, proc, _, _ in peers:
        if proc.poll() is not None:
            output = tail(workdir / f"{name}.out")
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{output}")


def run_peers(workdir, env_name, peer_settings, log_interval, warmup, seconds, group):
    """Run peers until each has logged `seconds` past `warmup` with all of them joined.

    The first peer's memory is sampled every second meanwhile. Returns (rows per peer,
    memory: samples [(seconds since start, RSS MB, after warm-up)], peak RSS MB and the RSS of
    its EnvPool workers at the end, commands).
    """
    with contextlib.ExitStack() as stack:
        peers = start_peers(stack, workdir, env_name, peer_settings, log_interval, group)
        first_pid = peers[0][1].pid
        start = time.monotonic()
        samples, peak, steady = [], None, False
        while True:
            time.sleep(1)
            check_alive(peers, workdir)
            rows = [read_log(path) for _, _, path, _ in peers]
            joined = [[r for r in peer if r["peers"] >= len(peers)] for peer in rows]
            # Memory counts as steady from the first log row past the warm-up on.
            steady = steady or any(r["time"] >= warmup for r in rows[0])
            rss = proc_status_mb(first_pid, "VmRSS")
            if rss is not None:
                samples.append((time.monotonic() - start, rss, steady))
                peak = proc_status_mb(first_pid, "VmHWM")
            if all(peer and peer[-1]["time"] >= warmup + seconds for peer in joined):
                memory = {"samples": samples, "peak": peak, "workers": workers_rss_mb(first_pid)}
                return rows, memory, [cmd for *_, cmd in peers]
            waited = time.monotonic() - start
            if not all(rows) and waited > STARTUP_SECONDS:
                output = tail(workdir / "peer0.out")
                raise RuntimeError(f"no log rows after {STARTUP_SECONDS} s:\n{output}")
            if waited > STARTUP_SECONDS + 3 * (warmup + seconds):
                output = tail(workdir / "peer0.out")
                raise RuntimeError(f"the peers log too slowly:\n{output}")


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


def measure_agent(env_name, settings, mode):
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
        )
    steady = [r for r in rows[0] if r["time"] >= warmup]
    agent = {
        "agent_sps": train_rate(rows[0], warmup),
        # Acting steps per second: above the training rate only when unrolls are dropped.
        "agent_acting_sps": statistics.fmean(r["SPS"] for r in steady),
        "agent_seconds": mode["agent_seconds"],
        "agent_warmup_seconds": warmup,
        "agent_cmd": " ".join(["python", *cmds[0][1:]]),
    }
    return agent, memory_summary(memory)


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


# ---------------------------------------------------------------------------------------------
# A2C on CartPole: examples/a2c.py and Stable-Baselines3

A2C_DONE = re.compile(
    r"done: (\d+) steps in \S+ s \((\d+) SPS\), mean return of the last (\d+) episodes ([-\d.na]+)"
)


# a2c.py at SB3's env count: one batch of 8 envs, so that an optimizer step takes 8 x 5 = 40
# env steps as SB3's does. The MLP run is the like-for-like comparison with SB3's MlpPolicy.
A2C_AT_8_ENVS = {
    "mlp": "--batch-size 8 --num-batches 1 --no-lstm",
    "lstm": "--batch-size 8 --num-batches 1",
}


def run_a2c(flags, seed, workdir):
    logfile = workdir / f"a2c-{seed}-{len(list(workdir.iterdir()))}.tsv"
    cmd = [sys.executable, "examples/a2c.py", *flags.split(), "--seed", str(seed)]
    out = subprocess.run(
        [*cmd, "--logfile", str(logfile)], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    match = A2C_DONE.search(out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"a2c.py failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr}")
    return {"seed": seed, "sps": int(match[2]), "mean_return": float(match[4])}, logfile


def mean_return_at(logfile, step, episodes=100):
    """Mean return of the last `episodes` episodes that ended by env step `step`, from a2c.py's
    log (one row per optimizer step with the mean and count of the episodes ended since)."""
    rows = read_log(logfile, ("step", "mean_episode_return", "episodes"))
    total = count = 0.0
    for row in reversed([r for r in rows if r["step"] <= step]):
        if row["episodes"]:
            total += row["mean_episode_return"] * row["episodes"]
            count += row["episodes"]
        if count >= episodes:
            break
    return total / count if count else math.nan


def measure_a2c(steps, seeds, defaults_steps):
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-a2c-") as tmp:
        workdir = pathlib.Path(tmp)
        for name, flags in A2C_AT_8_ENVS.items():
            runs = [run_a2c(f"{flags} --total-steps {steps}", s, workdir)[0] for s in seeds]
            prefix = "" if name == "mlp" else f"{name}_"
            results[f"{prefix}sps"] = statistics.fmean(r["sps"] for r in runs)
            results[f"{prefix}mean_return_{steps // 1000}k"] = statistics.fmean(
                r["mean_return"] for r in runs
            )
            results[f"{prefix}runs"] = runs
            results[f"{prefix}cmd"] = f"python examples/a2c.py {flags} --total-steps N --seed S"
        # All defaults (None: not even --total-steps), read at 100k steps.
        defaults = []
        for seed in seeds:
            flags = f"--total-steps {defaults_steps}" if defaults_steps else ""
            run, logfile = run_a2c(flags, seed, workdir)
            run["mean_return_at_100k"] = mean_return_at(logfile, 100_000)
            defaults.append(run)
    results["defaults_runs"] = defaults
    results["defaults_seeds_over_195_at_100k"] = sum(
        r["mean_return_at_100k"] >= 195 for r in defaults
    )
    return results


def run_sb3(steps, seed):
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    # make_vec_env wraps every env in a Monitor, which fills model.ep_info_buffer (last 100).
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, seed=seed, device="cpu")
    start = time.monotonic()
    model.learn(total_timesteps=steps)
    elapsed = time.monotonic() - start
    returns = [info["r"] for info in model.ep_info_buffer]
    env.close()
    return {"seed": seed, "sps": steps / elapsed, "mean_return": statistics.fmean(returns)}


def measure_sb3(steps, seeds):
    torch.set_num_threads(1)  # as a2c.py does
    runs = [run_sb3(steps, seed) for seed in seeds]
    return {
        "sb3_a2c_sps": statistics.fmean(r["sps"] for r in runs),
        f"sb3_mean_return_{steps // 1000}k": statistics.fmean(r["mean_return"] for r in runs),
        "sb3_runs": runs,
    }


# ---------------------------------------------------------------------------------------------
# Report


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def table_rows(results):
    """(measurement, value) pairs for whatever was measured."""
    v, a, m, s = (results.get(k, {}) for k in ["vtrace", "a2c", "memory", "scaling"])
    env = results["env"]
    rows = []
    if "env_limit_sps" in v:
        rows.append(
            (f"V-trace {env}: env limit (EnvPool, random actions)", f"{v['env_limit_sps']:.0f} SPS")
        )
    if "learner_limit_sps" in v:
        rows.append(
            (
                f"V-trace {env}: learner limit (fwd+bwd+Adam on T*B samples)",
                f"{v['learner_limit_sps']:.0f} SPS",
            )
        )
    if "agent_sps" in v:
        rows.append(
            (f"V-trace {env}: agent, one peer (env_train_steps/s)", f"{v['agent_sps']:.0f} SPS")
        )
    if "ratio" in v:
        rows.append(("V-trace: agent / min(env limit, learner limit)", f"{v['ratio']:.2f}"))
    if "two_peers_vs_one" in s:
        rows.append(
            (
                "V-trace: two peers on this machine vs one (total SPS)",
                f"{s['two_peers_sps']:.0f} / {s['one_peer_sps']:.0f} = {s['two_peers_vs_one']:.2f}",
            )
        )
    if "peak_rss_mb" in m:
        rows.append(("V-trace peer: peak RSS (VmHWM)", f"{m['peak_rss_mb']:.0f} MB"))
        rows.append(
            (
                f"V-trace peer: RSS growth over {m['measured_minutes']:.1f} min after warm-up",
                f"floor {m['rss_floor_growth_mb']:+.0f} MB, median {m['rss_growth_mb']:+.0f} MB "
                f"(fit {m['rss_slope_mb_per_min']:+.1f} MB/min)",
            )
        )
    for who, prefix in [("a2c.py --no-lstm", ""), ("a2c.py LSTM", "lstm_"), ("SB3", "sb3_")]:
        key = next((k for k in a if k.startswith(f"{prefix}mean_return_")), None)
        runs = a.get(f"{prefix}runs", [])
        if key and runs:
            sps = a["sb3_a2c_sps" if prefix == "sb3_" else f"{prefix}sps"]
            rows.append(
                (
                    f"A2C CartPole, {who} (8 envs): SPS / return at "
                    f"{key.removeprefix(f'{prefix}mean_return_')}, {plural(len(runs), 'seed')}",
                    f"{sps:.0f} SPS / {a[key]:.1f}",
                )
            )
    if "sps" in a and "sb3_a2c_sps" in a:
        rows.append(
            ("A2C CartPole: a2c.py --no-lstm / SB3 SPS", f"{a['sps'] / a['sb3_a2c_sps']:.2f}")
        )
    if "defaults_runs" in a:
        returns = ", ".join(f"{r['mean_return_at_100k']:.0f}" for r in a["defaults_runs"])
        rows.append(
            (
                "A2C CartPole, a2c.py defaults (16 envs, LSTM): return at 100k per seed",
                f"{returns} ({a['defaults_seeds_over_195_at_100k']} of "
                f"{len(a['defaults_runs'])} >= 195)",
            )
        )
    return rows


def plain_table(rows):
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def markdown_table(results, rows):
    m = results["machine"]
    settings = " ".join(f"{k}={v}" for k, v in results["settings"].items())
    lines = [
        f"Measured {results['date'][:10]} ({results['mode']} mode) on {m['platform']}, {m['cpu']}, "
        f"{m['cores']} cores; torch {m['torch']}, moolib {m['moolib']}. V-trace settings: "
        f"`{settings}`.",
        "",
        "| measurement | value |",
        "| --- | --- |",
        *(f"| {name} | {value} |" for name, value in rows),
    ]
    return "\n".join(lines)


def save(results, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)


def notes(mode, parts, settings):
    text = []
    if "agent" in parts:
        minutes = MODES[mode]["agent_seconds"] / 60
        text.append(
            f"memory: the agent ran {minutes:.1f} min after a {MODES[mode]['agent_warmup']} s "
            "warm-up (the issue's 10-minute no-growth check is `--long`). RSS swings by a few "
            "hundred MB with every learner step; rss_floor_growth_mb, the change of the lowest "
            "RSS from the first to the second half, is the least noisy sign of a leak."
        )
    if "limits" in parts:
        text.append(
            "env and learner limits: means of one measurement before and one after the agent "
            "run, each with the machine to itself; the agent runs acting, learning and the "
            "env workers on the same cores at once."
        )
    if "a2c" in parts or "sb3" in parts:
        text.append(
            "a2c: a2c.py with one batch of 8 envs in 1 EnvPool worker process (unroll 5: an "
            "optimizer step every 8 x 5 = 40 env steps), once with the MLP (--no-lstm, like "
            "SB3's MlpPolicy) and once with its default LSTM core; SB3 uses its defaults "
            "(MlpPolicy, all 8 envs in this process through DummyVecEnv, n_steps 5). SPS counts "
            "from the start of the training loop for a2c.py and of learn() for SB3; a2c.py's "
            "includes connecting to its broker. Defaults: a2c.py with no flags (2 x 8 envs, "
            "LSTM, 200k steps), the mean of the last 100 episodes ended by step 100k."
        )
    if "scaling" in parts:
        half = max(1, settings["num_actor_cpus"] // 2)
        text.append(
            f"scaling: each of the two peers has num_actor_cpus={half}; both share the same cores."
        )
    text.append("Other jobs may share this machine: compare numbers within one run.")
    return text


def run_parts(args, mode, results):
    """Measure the parts asked for into results; a part that fails is noted in
    results["errors"] and the others still run."""
    timings, errors, v = results["timings_seconds"], results["errors"], results["vtrace"]

    def timed(part, fn, *fn_args):
        print(f"[bench] {part} ...", flush=True)
        start = time.monotonic()
        try:
            return fn(*fn_args)
        except Exception as e:  # report it and go on: the other parts are still worth having
            errors[part] = f"{type(e).__name__}: {e}"
            print(f"[bench] {part} failed: {errors[part]}", file=sys.stderr, flush=True)
            return None
        finally:
            timings[part] = round(time.monotonic() - start, 1)
            print(f"[bench] {part}: {timings[part]:.0f} s", flush=True)

    if "limits" in args.parts:
        v.update(timed("limits", measure_limits, args.env, args.settings, mode) or {})
    if "agent" in args.parts or "scaling" in args.parts:
        agent = timed("agent", measure_agent, args.env, args.settings, mode)
        if agent:
            v.update(agent[0])
            results["memory"] = agent[1]
    if "learner_limit_sps" in v and "agent_sps" in v:
        # Again after the agent: the machine's speed drifts, and the agent ran in between.
        again = timed("limits again", measure_limits, args.env, args.settings, mode)
        if again:
            v.update(combine_limits(v, again))
    if {"env_limit_sps", "learner_limit_sps", "agent_sps"} <= v.keys():
        v["ratio"] = v["agent_sps"] / min(v["env_limit_sps"], v["learner_limit_sps"])
    if "scaling" in args.parts and "agent_sps" in v:
        scaling = timed("scaling", measure_scaling, args.env, args.settings, mode, v["agent_sps"])
        if scaling:
            results["scaling"] = scaling
    if "a2c" in args.parts:
        results["a2c"].update(
            timed(
                "a2c", measure_a2c, mode["a2c_steps"], mode["a2c_seeds"], mode["a2c_defaults_steps"]
            )
            or {}
        )
    if "sb3" in args.parts:
        results["a2c"].update(timed("sb3", measure_sb3, mode["sb3_steps"], mode["sb3_seeds"]) or {})


def main(argv=None):
    args = parse_args(argv)
    # Unwind on SIGTERM as on Ctrl-C, so that the peers and brokers started here are stopped.
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": args.mode,
        "env": args.env,
        "settings": args.settings,
        "machine": describe_machine(),
        "load_average_start": os.getloadavg(),
        "vtrace": {},
        "a2c": {},
        "notes": notes(args.mode, args.parts, args.settings),
        "errors": {},
        "timings_seconds": {},
    }
    run_parts(args, MODES[args.mode], results)
    results["load_average_end"] = os.getloadavg()
    rows = table_rows(results)
    results["markdown"] = markdown_table(results, rows)
    save(results, args.out)
    print()
    print(plain_table(rows))
    print()
    print(results["markdown"])
    minutes = sum(results["timings_seconds"].values()) / 60
    print(f"\n{args.out} written; took {minutes:.1f} min")
    for part, error in results["errors"].items():
        print(f"error in {part}: {error}", file=sys.stderr)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
