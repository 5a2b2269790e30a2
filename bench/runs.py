"""Results runs: the V-trace agent trained on a suite of games (MinAtar, Atari), one run per game
and seed, summarised into a Markdown table, JSON and a picture of the learning curves.

bench/minatar.py and bench/atari.py each describe their suite (a `Suite`: games, preset,
budget, published returns, table) and hand it to `main` here.

Every run is one `python -m examples.vtrace.experiment preset=...` peer (or `--peers` of them in
one group) on a broker this module starts, `--parallel` runs at a time. Runs that already
finished in --workdir are read, not repeated, so an interrupted table can be completed by running
the same command again. Under --out it writes NAME-results.md and .json (per game, the mean
episode return over the last 10% of the steps, mean and spread over seeds, wall time and env
steps per second) and NAME-curves.png (one panel per game, one thin line per seed and their mean).
`--keep` folds in the rows of earlier tables for games not run again (bench/kept.py).
"""

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import os
import pathlib
import platform
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import typing

from bench import kept
from bench.cpu import cpu_label, describe_cpu

REPO = pathlib.Path(__file__).resolve().parent.parent
LAST_FRACTION = 0.1
# The machine's CPU times at a run's start and end (cpu_times()), in its savedir; steal is the
# 8th kind on /proc/stat's line (user nice system idle iowait irq softirq steal ...).
CPU_TIMES, STEAL = "cpu_times", 7


@dataclasses.dataclass
class Suite:
    name: str  # file names (NAME-results.md, ...) and the default workdir /tmp/bench-NAME
    preset: str  # the experiment's preset=...
    env_id: typing.Callable[[str], str]  # game -> env.name
    games: list[str]
    seeds: int | dict  # default number of seeds (0..N-1), or one such number per game
    steps: int  # default env steps per run
    published: dict  # game -> what the table and the picture put beside ours
    markdown: typing.Callable[[dict], str]  # the result (build_table) -> the Markdown tables
    reference_lines: typing.Callable[[dict], list]  # published -> [(label, value, line style)]
    description: str = ""
    parallel: int = 2  # default runs at a time
    step_name: str = "env steps"  # the curves' x axis
    lowest_return: float | None = 0  # the curves' y axis starts here (None: from the data)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_log(path):
    """Rows of a peer's logs.tsv as dicts of floats; an unfinished last line is left out."""
    text = pathlib.Path(path).read_text()
    lines = text.split("\n")[:-1]
    if not lines:
        return []
    names = lines[0].split("\t")
    rows = []
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) == len(names):
            rows.append({name: _float(value) for name, value in zip(names, fields, strict=True)})
    return rows


def _float(text):
    try:
        return float(text)
    except ValueError:
        return math.nan


def episode_mean(rows):
    """Mean return of the episodes that ended in `rows` (each row's mean weighted by its count)."""
    total = count = 0.0
    for row in rows:
        n, mean = row["episodes"], row["mean_episode_return"]
        if n > 0 and math.isfinite(mean):
            total += mean * n
            count += n
    return total / count if count else math.nan


def summarize_run(logs, total_steps):
    """One run (the logs of its peers): final return, wall time, SPS and its learning curve."""
    per_peer = [read_log(log) for log in logs]
    rows = [row for peer_rows in per_peer for row in peer_rows]
    if not rows:
        return None
    steps = max(row["step"] for row in rows)
    wall = max(running_time(peer_rows) for peer_rows in per_peer)
    last = [row for row in rows if row["step"] > steps - LAST_FRACTION * total_steps]
    curve, chunk = [], total_steps / 50
    for i in range(50):
        lo, hi = i * chunk, (i + 1) * chunk
        curve.append([hi, episode_mean([r for r in rows if lo < r["step"] <= hi])])
    savedir = pathlib.Path(logs[0]).parents[2]
    commit_file = savedir / "commit"
    return {
        "commit": commit_file.read_text().strip() if commit_file.exists() else None,
        "steal": steal_share(savedir / CPU_TIMES),
        "steps": int(steps),
        "final_return": episode_mean(last),
        "episodes_in_last_10pct": int(sum(row["episodes"] for row in last)),
        "wall_s": wall,
        "sps": steps / wall if wall else math.nan,
        "curve": curve,
    }


def cpu_times():
    """The machine's CPU time so far, by kind (/proc/stat's first line); None off Linux."""
    try:
        with open("/proc/stat") as f:
            return [int(field) for field in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(path):
    """The share of the machine's CPU time its hypervisor took (steal) between the first and
    the last line of `path` (cpu_times() at a run's start and end): a VM's runs slow down by
    more than that share when a neighbour is busy. None where it was not recorded."""
    try:
        lines = pathlib.Path(path).read_text().splitlines()
        start, end = (list(map(int, line.split())) for line in (lines[0], lines[-1]))
        spent = [b - a for a, b in zip(start, end, strict=True)]
    except (OSError, ValueError, IndexError):
        return None
    return spent[STEAL] / sum(spent) if len(spent) > STEAL and sum(spent) > 0 else None


def record_cpu_times(savedir):
    times = cpu_times()
    if times is not None:
        with open(savedir / CPU_TIMES, "a") as f:
            f.write(" ".join(map(str, times)) + "\n")


def running_time(rows):
    """Seconds one peer's log spent training: the sum of its sittings' last `time`, which
    starts again from 0 when a stopped run is resumed from its checkpoint."""
    total = last = 0.0
    for row in rows:
        if row["time"] < last:
            total += last
        last = row["time"]
    return total + last


def run_logs(savedir):
    return sorted((pathlib.Path(savedir) / "peers").glob("*/logs.tsv"))


def finished(savedir, total_steps):
    summary = summarize_run(run_logs(savedir), total_steps)
    return summary is not None and summary["steps"] >= total_steps


def start_peers(args, broker, game, seed, savedir):
    """Start the peers of one run; returns their Popen objects."""
    command = [
        sys.executable, "-m", "examples.vtrace.experiment", f"preset={args.suite.preset}",
        f"env.name={args.suite.env_id(game)}", f"seed={seed}", f"total_steps={args.steps}",
        f"connect={broker}", f"savedir={savedir}", f"group={savedir.name}",
        f"project=bench-{args.suite.name}", "device=cpu", "log_interval=2",
        *args.set,
    ]  # fmt: skip
    (savedir / "commit").write_text(git_commit() + "\n")  # the code this run trained with
    peers = []
    for i in range(args.peers):
        log = open(savedir.parent / f"{savedir.name}.peer{i}.out", "a")
        peers.append(
            subprocess.Popen(
                [*command, f"local_name={savedir.name}-peer{i}"],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        log.close()
        if i == 0 and args.peers > 1:
            time.sleep(5)  # the first peer leads; the others join its group
    return peers


def run_all(args, runs):
    """Run every (game, seed) not finished yet, `args.parallel` at a time."""
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "moolib.broker", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    running = []  # (game, seed, savedir, peers, started)
    pending = [run for run in runs if not finished(run[2], args.steps)]
    try:
        time.sleep(2)
        while pending or running:
            while pending and len(running) < args.parallel:
                game, seed, savedir = pending.pop(0)
                savedir.mkdir(parents=True, exist_ok=True)
                print(f"{now()} start {savedir.name}", flush=True)
                record_cpu_times(savedir)
                peers = start_peers(args, f"127.0.0.1:{port}", game, seed, savedir)
                running.append((game, seed, savedir, peers, time.monotonic()))
            time.sleep(2)
            for entry in list(running):
                game, seed, savedir, peers, started = entry
                if all(peer.poll() is not None for peer in peers):
                    running.remove(entry)
                    record_cpu_times(savedir)
                    codes = [peer.returncode for peer in peers]
                    summary = summarize_run(run_logs(savedir), args.steps) or {}
                    steal = summary.get("steal")
                    print(
                        f"{now()} done  {savedir.name}: exit {codes}, "
                        f"{time.monotonic() - started:.0f} s, "
                        f"return {summary.get('final_return', math.nan):.2f}"
                        + ("" if steal is None else f", steal {steal:.1%}"),
                        flush=True,
                    )
    finally:
        for *_, peers, _ in running:
            for peer in peers:
                stop(peer)
        stop(broker)


def stop(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def now():
    return datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")


def spread(values):
    return statistics.stdev(values) if len(values) > 1 else 0.0


def overrides(args):
    """The experiment settings every run of this command gets beyond its game and seed."""
    return [f"preset={args.suite.preset}", *args.set]


def build_table(args, runs):
    games = {}
    for game, seed, savedir in runs:
        summary = summarize_run(run_logs(savedir), args.steps)
        if summary is None or summary["steps"] < args.steps:
            continue
        games.setdefault(game, {})[seed] = summary
    result = {
        "command": " ".join([f"python -m bench.{args.suite.name}", *args.argv]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "steps": args.steps,
        "peers": args.peers,
        "overrides": overrides(args),
        "games": {},
    }
    for game in args.games:
        seeds = games.get(game, {})
        finals = [s["final_return"] for s in seeds.values()]
        result["games"][game] = {
            "seeds": {str(seed): summary for seed, summary in sorted(seeds.items())},
            "return_mean": statistics.fmean(finals) if finals else None,
            "return_std": spread(finals) if len(finals) > 1 else None,
            "return_min": min(finals) if finals else None,
            "return_max": max(finals) if finals else None,
            "wall_s_mean": statistics.fmean(s["wall_s"] for s in seeds.values()) if seeds else None,
            "sps_mean": statistics.fmean(s["sps"] for s in seeds.values()) if seeds else None,
            "published": args.suite.published[game],
        }
    source = {key: result[key] for key in ("command", "date", "machine", "overrides")}
    for row in result["games"].values():
        row["source"] = source
    result["run_commits"] = run_commits(result)
    return result


def run_commits(result):
    seeds = [summary for row in result["games"].values() for summary in row["seeds"].values()]
    return sorted({summary["commit"] or "unknown" for summary in seeds})


def sources_lines(result):
    """For each game with runs: the command that made its row, when, on which machine."""
    lines = []
    for game, row in result["games"].items():
        source = row.get("source")
        if not source or not row["seeds"]:
            continue
        commits = sorted({summary["commit"] or "unknown" for summary in row["seeds"].values()})
        machine = source["machine"] or {}
        lines.append(
            f"- {game}: `{source['command']}`, {source['date']}, "
            f"{machine.get('cpus', '?')} x {cpu_label(machine)}, "
            f"code at {', '.join(commits)}"
        )
    return ["Runs:", "", *lines, ""] if lines else []


def num(value, digits=1):
    return "—" if value is None else f"{value:.{digits}f}"


def per_seed_table(result):
    """One row per game, one column per seed: each run's return over the last 10% of steps."""
    seeds = sorted({int(seed) for row in result["games"].values() for seed in row["seeds"]})
    if not seeds:  # no run has finished: no table rather than one without columns
        return []
    lines = [
        "| game | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
        "| --- |" + " --- |" * len(seeds),
    ]
    for game, row in result["games"].items():
        finals = [row["seeds"].get(str(seed), {}).get("final_return") for seed in seeds]
        lines.append(f"| {game} | " + " | ".join(num(final) for final in finals) + " |")
    return lines


def seed_counts(result):
    counts = sorted({len(row["seeds"]) for row in result["games"].values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def finite(x, y):
    keep = [i for i, value in enumerate(y) if math.isfinite(value)]
    return [x[i] for i in keep], [y[i] for i in keep]


def plot_curves(result, path, result_suite):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = list(result["games"])
    columns = min(3, len(games))
    rows = -(-len(games) // columns)
    size = (4.2 * columns, 3.3 * rows)
    fig, axes = plt.subplots(rows, columns, figsize=size, layout="constrained", squeeze=False)
    # One colour per reference in every panel, also where a game lacks one of them (Seaquest
    # has no gymnax PPO number).
    labels = [
        label
        for row in result["games"].values()
        for label, _, _ in result_suite.reference_lines(row["published"])
    ]
    colors = ["tab:red", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]
    reference_colors = dict(zip(dict.fromkeys(labels), itertools.cycle(colors)))
    axes = list(axes.flat)
    for ax in axes[len(games) :]:
        ax.axis("off")
    axes = axes[: len(games)]
    for ax, game in zip(axes, games, strict=True):
        row = result["games"][game]
        curves = []
        for seed, summary in row["seeds"].items():
            x = [point[0] / 1e6 for point in summary["curve"]]
            y = [point[1] for point in summary["curve"]]
            # A window without a finished episode (Freeway's envs end theirs together, every
            # 2,500 steps) is left out rather than drawn as a gap.
            ax.plot(*finite(x, y), lw=0.8, alpha=0.7, label=f"seed {seed}")
            curves.append(y)
        if len(curves) > 1:
            mean = []
            for values in zip(*curves, strict=True):
                values = [v for v in values if math.isfinite(v)]
                mean.append(statistics.fmean(values) if values else math.nan)
            ax.plot(*finite(x, mean), lw=2.2, color="black", label="mean of seeds")
        for label, value, style in result_suite.reference_lines(row["published"]):
            color = reference_colors[label]
            if isinstance(value, tuple | list):  # a range that the seeds' curves spread over
                label = f"{label} {value[0]} to {value[1]}"
                ax.axhspan(*value, color=color, alpha=0.15, label=label)
            else:
                ax.axhline(value, ls=style, color=color, lw=1.2, label=label)
        ax.set_ylim(bottom=result_suite.lowest_return)
        ax.set_title(game)
        ax.set_xlabel(f"{result_suite.step_name} (millions)")
        ax.grid(alpha=0.3)
    for ax in axes[::columns]:
        ax.set_ylabel("mean episode return")
    most = max(range(len(games)), key=lambda i: len(result["games"][games[i]]["seeds"]))
    axes[most].legend(fontsize=7)
    title = (
        f"V-trace, {' '.join(result['overrides'])}, {result['peers']} peer(s) on one "
        f"{result['machine']['cpus']}-CPU machine, {seed_counts(result)} seed(s) per game "
        f"(code at commit {', '.join(result['run_commits'])})"
    )
    # Wrapped to the figure's width: a one-game figure cut a long --set's title at both ends.
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 15)), fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def no_nan(value):
    """NaN (no finished episode in a window) as null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: no_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [no_nan(item) for item in value]
    return value


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    return {"cpus": os.cpu_count(), **describe_cpu(), "python": platform.python_version()}


def parse_args(suite, argv):
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{suite.name}", description=suite.description
    )
    parser.add_argument("--games", type=lambda s: s.split(","), default=suite.games,
                        help="comma-separated, from " + ",".join(suite.games))  # fmt: skip
    parser.add_argument("--seeds", type=int, help=f"seeds 0..N-1 per game (default: {suite.seeds})")
    parser.add_argument("--steps", type=int, default=suite.steps, help="env steps per run")
    parser.add_argument("--peers", type=int, default=1, help="peers per run, in one group")
    parser.add_argument("--parallel", type=int, default=suite.parallel, help="runs at a time")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more overrides for every peer")  # fmt: skip
    parser.add_argument("--workdir", type=pathlib.Path,
                        default=pathlib.Path(f"/tmp/bench-{suite.name}"),
                        help="savedirs and peer output; finished runs here are reused")  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs",
                        help="where the .md, .json and .png go")  # fmt: skip
    parser.add_argument("--name", default=suite.name, help="file names: NAME-results.md, ...")
    parser.add_argument("--report-only", action="store_true", help="tables from --workdir only")
    keep = ("an earlier NAME-results.json: its games without a finished run here stay in the "
            "table as they are, with the command that made them; may be given more than once "
            "(the last file holding a game gives its row)")  # fmt: skip
    parser.add_argument("--keep", type=pathlib.Path, action="append", default=[],
                        metavar="RESULTS_JSON", help=keep)  # fmt: skip
    args = parser.parse_args(argv)
    unknown = sorted(set(args.games) - set(suite.games))
    if unknown:
        parser.error(f"unknown game(s) {', '.join(unknown)}; choose from {', '.join(suite.games)}")
    for name, value in [("--seeds", args.seeds or 1), ("--steps", args.steps),
                        ("--peers", args.peers), ("--parallel", args.parallel)]:  # fmt: skip
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    args.suite = suite
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def main(suite, argv=None):
    args = parse_args(suite, argv)
    seeds = {game: args.seeds or suite.seeds for game in args.games}
    if args.seeds is None and isinstance(suite.seeds, dict):
        seeds = {game: suite.seeds[game] for game in args.games}
    runs = [
        (game, seed, args.workdir / f"{game}-s{seed}-p{args.peers}-{args.steps}")
        for seed in range(max(seeds.values()))
        for game in args.games
        if seed < seeds[game]
    ]
    try:
        earlier = [kept.read_earlier(path, args.steps, args.peers, overrides(args))
                   for path in args.keep]  # fmt: skip
    except kept.KeepError as e:
        print(f"python -m bench.{suite.name}: error: {e}", file=sys.stderr)
        return 2
    if not args.report_only:
        # A SIGTERM would otherwise end this process at once and leave the runs' peers (in their
        # own sessions) training on: exit through run_all's `finally`, which stops them.
        signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
        run_all(args, runs)
    result = build_table(args, runs)
    if earlier:
        result = kept.keep_earlier(result, earlier, suite)
        result["run_commits"] = run_commits(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / args.name
    pathlib.Path(f"{stem}-results.json").write_text(json.dumps(no_nan(result), indent=1) + "\n")
    table = suite.markdown(result)
    pathlib.Path(f"{stem}-results.md").write_text(table)
    plot_curves(result, f"{stem}-curves.png", suite)
    print(table)
    print(f"wrote {stem}-results.md, {stem}-results.json, {stem}-curves.png")
    return 0
