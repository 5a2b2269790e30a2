"""The GPU check's measurements (bench/gpu_check.sh): the learner on the GPU in fp32 and bf16,
then one V-trace peer of the seed's command for a few minutes, its agent steps per second
printed next to published figures for moolib.

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

import torch

from bench.agent import run_peers, train_rate
from bench.limits import in_fresh_process, measure_gpu_learner
from bench.processes import REPO

ENV = "ALE/Breakout-v5"
# Published agent steps per second for moolib on Atari with one GPU.
ANCHORS = [
    ("moolib's own published runs, 1 GPU, 10 CPUs", "about 3,000-3,800"),
    ("an independent benchmark, 1 A100, 10 CPUs", "about 5,100"),
]
# Sizes for the dry run on a CPU: every step of the check, in seconds.
TINY = {"actor_batch_size": 4, "num_actor_batches": 2, "batch_size": 4, "unroll_length": 5,
        "virtual_batch_size": 4}  # fmt: skip


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
    print(f"[gpu_run] learner on {args.device}, fp32 and bf16 ...", flush=True)
    results["learner"] = in_fresh_process(
        measure_gpu_learner, ENV, learner_settings, 10 if args.tiny else 30, args.device
    )
    print(json.dumps(results["learner"], indent=1), flush=True)
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
