"""A2C on CartPole-v1: examples/a2c.py against Stable-Baselines3's A2C, 8 envs each, several
seeds: speed, and the mean return of the last 100 episodes. a2c.py's numbers are read from the
logs.tsv it writes, one row per optimizer step."""

import math
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from bench.agent import read_log
from bench.processes import REPO

# a2c.py at SB3's env count: one batch of 8 envs, so that an optimizer step takes 8 x 5 = 40
# env steps as SB3's does. The MLP run is the like-for-like comparison with SB3's MlpPolicy.
A2C_AT_8_ENVS = {
    "mlp": "--batch-size 8 --num-batches 1 --no-lstm",
    "lstm": "--batch-size 8 --num-batches 1",
}
LOG_COLUMNS = ("step", "mean_episode_return", "episodes", "SPS")


def mean_return_at(rows, step, episodes=100):
    """Mean return of the last `episodes` episodes that ended by env step `step`, from a2c.py's
    log rows (each with the mean and count of the episodes ended since the previous row)."""
    total = count = 0.0
    for row in reversed([r for r in rows if r["step"] <= step]):
        if row["episodes"]:
            total += row["mean_episode_return"] * row["episodes"]
            count += row["episodes"]
        if count >= episodes:
            break
    return total / count if count else math.nan


def run_a2c(flags, seed, workdir):
    """One a2c.py run; its speed (SPS since the start of training, at its last optimizer step)
    and the mean return of its last 100 episodes, and its log rows."""
    logfile = workdir / f"a2c-{seed}-{len(list(workdir.iterdir()))}.tsv"
    cmd = [sys.executable, "examples/a2c.py", *flags.split(), "--seed", str(seed)]
    out = subprocess.run(
        [*cmd, "--logfile", str(logfile)], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    rows = read_log(logfile, LOG_COLUMNS)
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"a2c.py failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr}")
    last = rows[-1]
    run = {
        "seed": seed,
        "sps": round(last["SPS"]),
        "steps": int(last["step"]),
        "mean_return": mean_return_at(rows, last["step"]),
    }
    return run, rows


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
            run, rows = run_a2c(flags, seed, workdir)
            run["mean_return_at_100k"] = mean_return_at(rows, 100_000)
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
