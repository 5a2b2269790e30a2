"""The GPU check's measurements (bench/gpu_check.sh): the learner on the GPU for both Atari
nets (the IMPALA ResNet and the Nature CNN) in fp32, TF32 and bf16, then one V-trace peer of the
seed's command for a few minutes, its agent steps per second printed next to published figures
for moolib.

    python -m bench.gpu_run --device cuda:0 --seconds 300
    python -m bench.gpu_run --device cpu --seconds 20 --tiny      # the dry run on a CPU
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

from bench.agent import run_peers, train_rate
from bench.limits import LearnerBench, alternate, env_factory, experiment_flags, in_fresh_process
from bench.machine import matmul_gflops, measure_peak
from bench.processes import REPO
from examples.vtrace.models import bf16_supported

ENV = "ALE/Breakout-v5"
# Published agent steps per second for moolib on Atari with one GPU.
ANCHORS = [
    ("moolib's own published runs, 1 GPU, 10 CPUs", "about 3,000-3,800"),
    ("an independent benchmark, 1 A100, 10 CPUs", "about 5,100"),
]
# Sizes for the dry run on a CPU: every step of the check, in seconds.
TINY = {"actor_batch_size": 4, "num_actor_batches": 2, "batch_size": 4, "unroll_length": 5,
        "virtual_batch_size": 4}  # fmt: skip


# The Atari nets and precisions measured for the learner: "tf32" is fp32 weights and activations
# with TensorFloat-32 matrix products and convolutions (Ampere and later), "fp32" without.
# torch's default, which the experiment runs with, lies between: TF32 convolutions (cuDNN's
# default), fp32 matrix products.
ATARI_NETS = ("resnet", "nature")
LEARNER_PRECISIONS = ("fp32", "tf32", "bf16")


def set_fp32_precision(mode):
    """How float32 matmuls and convolutions run: "ieee" (true fp32) or "tf32"; returns the
    previous setting."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        before = (matmul.fp32_precision, conv.fp32_precision)
        matmul.fp32_precision = conv.fp32_precision = mode
        return before
    # torch < 2.9
    before = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
    return before


def restore_fp32_precision(before):
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        matmul.fp32_precision, conv.fp32_precision = before
    else:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class InFp32Precision:
    """A learner bench whose every step runs with float32 products in one mode: the benches of
    one net alternate, so each sets its own mode and puts the previous one back."""

    def __init__(self, bench, mode):
        self.bench, self.mode, self.samples = bench, mode, bench.samples

    def step(self):
        before = set_fp32_precision(self.mode)
        try:
            self.bench.step()
        finally:
            restore_fp32_precision(before)


def measure_atari_learners(env_name, settings, seconds, device):
    """Learner samples/s of each Atari net in each precision (alternating rounds per net, so
    that drift hits the precisions of a net alike), with torch's GFLOP per sample, and the
    device's matmul peak."""
    results = {}
    for net in ATARI_NETS:
        flags = experiment_flags({**settings, "atari_net": net})
        observation_space, action_space = env_factory(env_name, flags).spaces()
        benches = {}
        for precision in LEARNER_PRECISIONS:
            flags.precision = "bf16" if precision == "bf16" else "fp32"
            bench = LearnerBench(flags, observation_space, action_space.n, device=device)
            benches[precision] = InFp32Precision(bench, "tf32" if precision == "tf32" else "ieee")
        gflop = benches["fp32"].bench.gflop_per_sample()
        rates = alternate(benches, 3, seconds)
        results[net] = {f"learner_{p}_sps": rate for p, rate in rates.items()}
        results[net]["learner_gflop_per_sample"] = gflop
        print(f"[gpu_run] {net}: " + ", ".join(f"{p} {r:,.0f}" for p, r in rates.items())
              + " learner samples/s", flush=True)  # fmt: skip
    device = torch.device(device)
    results["bf16_supported"] = bf16_supported(device)
    if device.type == "cuda":
        results["tf32_capable"] = torch.cuda.get_device_capability(device) >= (8, 0)
    results.update(measure_peak(2, device=str(device)))
    if device.type == "cuda":
        before = set_fp32_precision("tf32")
        try:
            results["tf32_gflops"] = matmul_gflops(torch.float32, 2, 1, str(device))
        finally:
            restore_fp32_precision(before)
    return results


def resize_cost():
    """Which cv2 the envs use (OpenCV, or bench/cv2_standin where none is installed) and what
    one frame's resize costs with it: the stand-in is slower, and the peer's envs pay it."""
    import cv2
    import numpy as np

    frame = np.random.default_rng(0).integers(0, 256, (210, 160), dtype=np.uint8)
    for _ in range(20):
        cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA)
    start, n = time.perf_counter(), 500
    for _ in range(n):
        cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA)
    return {"cv2": cv2.__version__, "resize_us": (time.perf_counter() - start) / n * 1e6}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.gpu_run", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--seconds", type=float, default=300, help="the peer's measured window")
    p.add_argument("--warmup", type=float, default=45, help="seconds of the peer not measured")
    p.add_argument("--tiny", action="store_true", help="tiny sizes, for the dry run on a CPU")
    p.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "gpu_results.json")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is not available to torch {torch.__version__}")
    if not args.seconds > 0 or args.warmup < 0:
        p.error("--seconds must be positive and --warmup not negative")
    return args


def main(argv=None):
    args = parse_args(argv)
    cores = os.cpu_count()
    settings = {"num_actor_cpus": cores, "device": args.device}
    if args.tiny:
        settings.update(TINY, num_actor_cpus=min(cores, 2))
    # The learner's settings: the experiment's defaults (or the tiny ones), one torch thread.
    learner_settings = {k: v for k, v in settings.items() if k != "device"}
    results = {"device": args.device, "cores": cores, "settings": settings}
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    print(f"[gpu_run] learner on {args.device}: {', '.join(ATARI_NETS)} in "
          f"{', '.join(LEARNER_PRECISIONS)} ...", flush=True)  # fmt: skip
    results["learner"] = in_fresh_process(
        measure_atari_learners, ENV, learner_settings, 4 if args.tiny else 12, args.device
    )
    print(json.dumps(results["learner"], indent=1), flush=True)
    results["frames"] = resize_cost()
    print(f"[gpu_run] cv2 {results['frames']['cv2']}: "
          f"{results['frames']['resize_us']:.0f} us per frame resize", flush=True)  # fmt: skip
    print(f"[gpu_run] one peer on {ENV}, {cores} EnvPool processes, {args.seconds:.0f} s ...")
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp:
        rows, memory, cmds = run_peers(
            pathlib.Path(tmp), ENV, [settings], 5, args.warmup, args.seconds, group="gpu-check"
        )
    steady = [r for r in rows[0] if r["time"] >= args.warmup]
    results["agent_sps"] = train_rate(rows[0], args.warmup)
    results["acting_sps"] = statistics.fmean(r["SPS"] for r in steady)
    results["peak_rss_mb"] = memory["peak"]
    results["cmd"] = " ".join(["python", *map(str, cmds[0][1:])])
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\ncommand: {results['cmd']}")
    print(f"agent steps/s (env_train_steps/s): {results['agent_sps']:,.0f}")
    print(f"acting steps/s (env steps/s):      {results['acting_sps']:,.0f}")
    for who, figure in ANCHORS:
        print(f"  anchor: {who}: {figure} steps/s")
    print(f"{args.out} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
