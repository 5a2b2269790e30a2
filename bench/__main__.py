"""Throughput, learning and memory benchmarks for the examples.

    python -m bench            # quick mode: about 10 minutes on a 2-core machine
    python -m bench --smoke    # every measurement with tiny sizes, about 2 minutes
    python -m bench --long     # quick mode, but the V-trace agent runs for 10 minutes
    python -m bench --only limits,agent --set num_actor_cpus=1 --env ALE/Breakout-v5
    python -m bench --only netscaling  # as root: peers on emulated hosts (bench/netscaling.py)

Writes bench/results.json and prints a table, plus a Markdown copy of it for the README. A part
that fails is recorded under "errors" (exit status 1) and the others still run.

V-trace: the agent's speed only means something next to what the machine allows, so three
numbers are measured with one set of settings (VTRACE_SETTINGS): the env limit, the learner
limit (bench/limits.py) and the agent's env_train_steps per second (bench/agent.py).
ratio = agent / min(env limit, learner limit). Other work on the machine makes absolute numbers
drift by tens of percent within minutes, so the three are measured in one run, and the two
limits once before and once after the agent (their means are used).
"""

import argparse
import datetime
import os
import pathlib
import signal
import statistics
import sys
import time

from bench import report
from bench.processes import REPO
from examples.common.envs import check_env_name
from examples.vtrace.models import ATARI_NETS, PRECISIONS

RESULTS = REPO / "bench" / "results.json"
PARTS = ["limits", "agent", "scaling", "a2c", "sb3"]
# Run only when asked for, on its own: needs root, ~25 minutes, writes docs/scaling.md.
NETSCALING = "netscaling"

# One set of settings for the three V-trace measurements: preset=atari_cpu's, the README's 2-core
# command line (examples/vtrace/preset/atari_cpu.yaml says why each). Small batches: on a CPU the
# per-sample cost of a conv net grows with the batch (caches), and the agent acts and learns in
# two threads. Two torch threads, as the preset: the learner bounds the agent, and its second
# thread sleeps while idle (OMP_WAIT_POLICY, examples/vtrace/__init__.py); acting's forward
# passes on one. `--set` tries others.
VTRACE_SETTINGS = {
    "actor_batch_size": 16,
    "num_actor_batches": 2,
    "num_actor_cpus": 2,
    "batch_size": 32,
    "unroll_length": 32,
    "max_queued_batches": 0,
    "learner_minibatches": 4,
    "learner_passes": 3,
    "minibatch_steps": True,
    "virtual_batch_size": 8,
    "env.repeat_action_probability": 0.0,
    "env.episodic_life": True,
    "pg_clip": 0.1,
    "vtrace_lambda": 0.95,
    "normalize_advantages": True,
    "grad_norm_clipping": 0.5,
    "torch_threads": 2,
    "acting_threads": 1,
    "atari_net": "nature_half",
    "center_frames": True,
    "center_frames_on": "background",
    "entropy_cost": 0.02,
    "precision": "fp32",
}
# Settings that are not whole numbers, with the values they take.
CHOICES = {"precision": ("auto", *PRECISIONS), "atari_net": tuple(ATARI_NETS)}

# Durations in seconds, sizes in env steps. The agent's warm-up skips start-up, the first learner
# steps and the group forming; its window holds enough log rows for a steady slope.
MODES = {
    "smoke": dict(env_warmup=2, env_seconds=5, learner_warmup_steps=1, learner_seconds=5,
                  agent_warmup=20, agent_seconds=15, scaling_warmup=20,
                  scaling_seconds=15, log_interval=2, a2c_steps=5_000, a2c_seeds=[0],
                  a2c_defaults_steps=5_000, sb3_steps=5_000, sb3_seeds=[0]),
    "quick": dict(env_warmup=5, env_seconds=20, learner_warmup_steps=2, learner_seconds=30,
                  agent_warmup=20, agent_seconds=90, scaling_warmup=20,
                  scaling_seconds=60, log_interval=5, a2c_steps=100_000, a2c_seeds=[0, 1, 2],
                  a2c_defaults_steps=None, sb3_steps=100_000, sb3_seeds=[0, 1, 2]),
}  # fmt: skip
for mode in MODES.values():
    mode["before_seconds"] = mode["agent_seconds"]
MODES["long"] = dict(MODES["quick"], agent_seconds=600)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description="Benchmarks of the examples.")
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
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated subset of: {', '.join(PARTS)}; or {NETSCALING} alone",
    )
    p.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results file")
    p.add_argument(
        "--before",
        type=pathlib.Path,
        metavar="DIR",
        help="a checkout of earlier code (git worktree add DIR COMMIT): its V-trace agent runs "
        "too, with the same settings, for the speed-up of the agent",
    )
    args = p.parse_args(argv)
    args.mode = "smoke" if args.smoke else "long" if args.long else "quick"
    args.parts = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(
        set(args.parts) - set(PARTS) - ({NETSCALING} if args.parts == [NETSCALING] else set())
    )
    if unknown:
        p.error(f"--only: unknown parts {unknown}; choose from {PARTS}, or {NETSCALING} alone")
    try:
        check_env_name(args.env)
    except ValueError as e:
        p.error(f"--env: {e}")
    if args.before and not (args.before / "examples" / "vtrace" / "experiment.py").is_file():
        p.error(f"--before {args.before}: no examples/vtrace/experiment.py there")
    args.settings = dict(VTRACE_SETTINGS)
    for item in args.set:
        key, _, value = item.partition("=")
        parsed = setting_value(key, value)
        if parsed is None:
            choices = ", ".join(f"{k}={'|'.join(v)}" for k, v in CHOICES.items())
            p.error(
                f"--set {item!r}: expected KEY=VALUE with KEY one of {list(VTRACE_SETTINGS)} "
                f"and VALUE of its default's type, or {choices}"
            )
        args.settings[key] = parsed
    return args


def setting_value(key, value):
    """VALUE of --set KEY=VALUE as the type of KEY's default; None if it is not one."""
    if key in CHOICES:
        return value if value in CHOICES[key] else None
    default = VTRACE_SETTINGS.get(key)
    if isinstance(default, bool):
        return {"true": True, "false": False}.get(value.lower())
    try:
        return type(default)(value) if isinstance(default, int | float) else None
    except ValueError:
        return None


def combine_limits(before, after):
    """Each limit as the mean of its measurements before and after the agent run."""
    combined = {}
    for key in after:
        if key.endswith(("_sps", "_gflops")) and isinstance(after[key], float):
            runs = [before[key], after[key]]
            combined[key] = statistics.fmean(runs)
            combined[key.removesuffix("_sps").removesuffix("_gflops") + "_runs"] = [
                round(x, 1) for x in runs
            ]
    return combined


def run_parts(args, mode, results):
    """Measure the parts asked for into results; a part that fails is noted in
    results["errors"] and the others still run."""
    # Imported here so that `--help` and bad arguments answer at once.
    from bench.a2c import measure_a2c, measure_sb3
    from bench.agent import measure_agent, measure_agent_before, measure_scaling
    from bench.limits import measure_limits

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
    if args.before and "agent_sps" in v:
        before = timed(
            "agent before", measure_agent_before, args.env, args.settings, mode, args.before
        )
        if before:
            v.update(before)
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
    if args.parts == [NETSCALING]:
        from bench import netscaling

        command = "python -m bench --only netscaling" + (" --smoke" if args.smoke else "")
        checks = ["--churn", "--real-check", *(["--smoke"] if args.smoke else [])]
        return netscaling.main(checks, command=command)
    from bench.machine import describe_machine

    # Unwind on SIGTERM as on Ctrl-C, so that the peers and brokers started here are stopped.
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    mode = MODES[args.mode]
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": args.mode,
        "env": args.env,
        "settings": args.settings,
        "machine": describe_machine(),
        "load_average_start": os.getloadavg(),
        "vtrace": {},
        "a2c": {},
        "notes": report.notes(mode, args.parts, args.settings),
        "errors": {},
        "timings_seconds": {},
    }
    run_parts(args, mode, results)
    results["load_average_end"] = os.getloadavg()
    rows = report.table_rows(results)
    results["markdown"] = report.markdown_table(results, rows)
    report.save(results, args.out)
    print()
    print(report.plain_table(rows))
    print()
    print(results["markdown"])
    minutes = sum(results["timings_seconds"].values()) / 60
    print(f"\n{args.out} written; took {minutes:.1f} min")
    for part, error in results["errors"].items():
        print(f"error in {part}: {error}", file=sys.stderr)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
