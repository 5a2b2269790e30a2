"""The machine the benchmark runs on: its description, and its arithmetic peak (the rate of a
large matrix product in fp32 and, where the CPU has the instructions, bf16), measured in the same
run because machines of the same name differ (Intel Xeon or AMD EPYC behind the same label)."""

import contextlib
import importlib.metadata
import os
import pathlib
import platform
import subprocess
import time

import torch

from bench.cpu import describe_cpu
from bench.processes import REPO
from examples.vtrace.models import bf16_supported

MATMUL_SIZE = 2048


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
        **describe_cpu(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "bf16": bf16_supported("cpu"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "moolib": package_version("moolib"),
        "stable_baselines3": package_version("stable-baselines3"),
        "git": git_commit(),
    }


def matmul_gflops(dtype, seconds, threads=1, device="cpu"):
    """GFLOP/s of repeated n x n matrix products, the best of a few timed rounds: the rate that
    the learner's convolutions (matrix products inside oneDNN or cuDNN) can at best reach."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
        flop = 2 * MATMUL_SIZE**3
        a @ b  # warm-up: thread pools and kernel choice
        best = 0.0
        for _ in range(3):
            count, start = 0, time.perf_counter()
            while count < 2 or time.perf_counter() - start < seconds / 3:
                a @ b
                count += 1
            if device != "cpu":
                torch.cuda.synchronize()
            best = max(best, count * flop / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(previous)


def measure_peak(seconds, threads=1, device="cpu"):
    """{"fp32_gflops": ..., "bf16_gflops": ... (None without bf16 instructions)}."""
    peak = {"fp32_gflops": matmul_gflops(torch.float32, seconds, threads, device)}
    peak["bf16_gflops"] = (
        matmul_gflops(torch.bfloat16, seconds, threads, device) if bf16_supported(device) else None
    )
    peak["matmul_threads"] = threads
    return peak
