"""MinAtar results: the V-trace agent on the five MinAtar games next to published agents.

    python -m bench.minatar                      # 5 games x 3 seeds x 5M steps (about an hour)
    python -m bench.minatar --games Breakout --seeds 1 --steps 1000000   # a quick look
    python -m bench.minatar --peers 2 --games Breakout   # the same training by two peers

Every run is one `python -m examples.vtrace.experiment preset=minatar` peer (or `--peers` of
them in one group) on a broker this script starts, `--parallel` runs at a time. Runs that already
finished in --workdir are read, not repeated, so an interrupted table can be completed by running
the same command again. It writes, under --out (default docs/):

* minatar-results.md and .json: per game, the mean episode return over the last 10% of the
  steps (mean and spread over seeds), wall time and env steps per second, beside the returns
  published for the MinAtar paper's AC(lambda) and gymnax's PPO;
* minatar-curves.png: one panel per game, one thin line per seed and their mean.
"""

import argparse
import datetime
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
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]

# Mean return at 5M frames, read off the learning curves in the MinAtar repository's README
# (30 seeds, full action set, sticky actions 0.1), and gymnax's PPO checkpoints (its README).
PUBLISHED = {
    "Asterix": {"ac_lambda": 19.0, "dqn": 17.0, "gymnax_ppo": 15.0},
    "Breakout": {"ac_lambda": 17.5, "dqn": 10.0, "gymnax_ppo": 28.0},
    "Freeway": {"ac_lambda": 47.0, "dqn": 50.0, "gymnax_ppo": 58.0},
    "Seaquest": {"ac_lambda": 15.0, "dqn": 20.0, "gymnax_ppo": None},
    "SpaceInvaders": {"ac_lambda": 185.0, "dqn": 43.0, "gymnax_ppo": 131.0},
}
LAST_FRACTION = 0.1


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
    rows = sorted((row for log in logs for row in read_log(log)), key=lambda r: r["time"])
    if not rows:
        return None
    steps = max(row["step"] for row in rows)
    wall = max(row["time"] for row in rows)
    last = [row for row in rows if row["step"] > steps - LAST_FRACTION * total_steps]
    curve, chunk = [], total_steps / 50
    for i in range(50):
        lo, hi = i * chunk, (i + 1) * chunk
        curve.append([hi, episode_mean([r for r in rows if lo < r["step"] <= hi])])
    commit_file = pathlib.Path(logs[0]).parents[2] / "commit"
    return {
        "commit": commit_file.read_text().strip() if commit_file.exists() else None,
        "steps": int(steps),
        "final_return": episode_mean(last),
        "episodes_in_last_10pct": int(sum(row["episodes"] for row in last)),
        "wall_s": wall,
        "sps": steps / wall if wall else math.nan,
        "curve": curve,
    }


def run_logs(savedir):
    return sorted((pathlib.Path(savedir) / "peers").glob("*/logs.tsv"))


def finished(savedir, total_steps):
    summary = summarize_run(run_logs(savedir), total_steps)
    return summary is not None and summary["steps"] >= total_steps


def start_peers(args, broker, game, seed, savedir):
    """Start the peers of one run; returns their Popen objects."""
    command = [
        sys.executable, "-m", "examples.vtrace.experiment", "preset=minatar",
        f"env.name=MinAtar/{game}-v1", f"seed={seed}", f"total_steps={args.steps}",
        f"connect={broker}", f"savedir={savedir}", f"group={savedir.name}",
        "project=bench-minatar", "device=cpu", "log_interval=2",
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
                peers = start_peers(args, f"127.0.0.1:{port}", game, seed, savedir)
                running.append((game, seed, savedir, peers, time.monotonic()))
            time.sleep(2)
            for entry in list(running):
                game, seed, savedir, peers, started = entry
                if all(peer.poll() is not None for peer in peers):
                    running.remove(entry)
                    codes = [peer.returncode for peer in peers]
                    summary = summarize_run(run_logs(savedir), args.steps) or {}
                    print(
                        f"{now()} done  {savedir.name}: exit {codes}, "
                        f"{time.monotonic() - started:.0f} s, "
                        f"return {summary.get('final_return', math.nan):.2f}",
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


def build_table(args, runs):
    games = {}
    for game, seed, savedir in runs:
        summary = summarize_run(run_logs(savedir), args.steps)
        if summary is None or summary["steps"] < args.steps:
            continue
        games.setdefault(game, {})[seed] = summary
    result = {
        "command": " ".join(["python -m bench.minatar", *sys.argv[1:]]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "steps": args.steps,
        "peers": args.peers,
        "overrides": ["preset=minatar", *args.set],
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
            "published": PUBLISHED[game],
        }
    result["run_commits"] = sorted(
        {summary["commit"] or "unknown" for seeds in games.values() for summary in seeds.values()}
    )
    return result


def markdown(result):
    def num(value, digits=1):
        return "—" if value is None else f"{value:.{digits}f}"

    def against(ours, published):
        if ours is None or published is None:
            return "—"
        return "above" if ours >= published else "**below**"

    lines = [
        "| game | ours: return (mean ± std over seeds) | seeds: min – max | runs | wall time "
        "per run | env steps/s | AC(λ) | gymnax PPO | DQN | ours vs AC(λ) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for game, row in result["games"].items():
        published = row["published"]
        ours = f"**{num(row['return_mean'])}** ± {num(row['return_std'])}"
        lines.append(
            f"| {game} | {ours} | {num(row['return_min'])} – {num(row['return_max'])} "
            f"| {len(row['seeds'])} | "
            f"{num(row['wall_s_mean'] and row['wall_s_mean'] / 60)} min | "
            f"{num(row['sps_mean'], 0)} | {num(published['ac_lambda'])} | "
            f"{num(published['gymnax_ppo'])} | {num(published['dqn'])} | "
            f"{against(row['return_mean'], published['ac_lambda'])} |"
        )
    seeds = sorted({int(seed) for row in result["games"].values() for seed in row["seeds"]})
    lines += [
        "",
        "| game | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
        "| --- |" + " --- |" * len(seeds),
    ]
    for game, row in result["games"].items():
        finals = [row["seeds"].get(str(seed), {}).get("final_return") for seed in seeds]
        lines.append(f"| {game} | " + " | ".join(num(final) for final in finals) + " |")
    return "\n".join(lines) + "\n"


def seed_counts(result):
    counts = sorted({len(row["seeds"]) for row in result["games"].values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def finite(x, y):
    keep = [i for i, value in enumerate(y) if math.isfinite(value)]
    return [x[i] for i in keep], [y[i] for i in keep]


def plot_curves(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = list(result["games"])
    columns = min(3, len(games))
    rows = -(-len(games) // columns)
    size = (4.2 * columns, 3.3 * rows)
    fig, axes = plt.subplots(rows, columns, figsize=size, layout="constrained", squeeze=False)
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
        for key, label, style in [("ac_lambda", "AC(λ)", "--"), ("gymnax_ppo", "gymnax PPO", ":")]:
            value = row["published"][key]
            if value is not None:
                ax.axhline(value, ls=style, color="tab:red", lw=1.2, label=label)
        ax.set_ylim(bottom=0)
        ax.set_title(game)
        ax.set_xlabel("env steps (millions)")
        ax.grid(alpha=0.3)
    for ax in axes[::columns]:
        ax.set_ylabel("mean episode return")
    most = max(range(len(games)), key=lambda i: len(result["games"][games[i]]["seeds"]))
    axes[most].legend(fontsize=7)
    fig.suptitle(
        f"V-trace, {' '.join(result['overrides'])}, {result['peers']} peer(s) on one "
        f"{result['machine']['cpus']}-CPU machine, {seed_counts(result)} seed(s) per game "
        f"(code at commit {', '.join(result['run_commits'])})",
        fontsize=9,
    )
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
    model = "unknown CPU"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=lambda s: s.split(","), default=GAMES,
                        help="comma-separated, from " + ",".join(GAMES))  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per game")
    parser.add_argument("--steps", type=int, default=5_000_000, help="env steps per run")
    parser.add_argument("--peers", type=int, default=1, help="peers per run, in one group")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more overrides for every peer")  # fmt: skip
    parser.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/bench-minatar"),
                        help="savedirs and peer output; finished runs here are reused")  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs",
                        help="where the .md, .json and .png go")  # fmt: skip
    parser.add_argument("--name", default="minatar", help="file names: NAME-results.md, ...")
    parser.add_argument("--report-only", action="store_true", help="tables from --workdir only")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.games) - set(GAMES))
    if unknown:
        parser.error(f"unknown game(s) {', '.join(unknown)}; choose from {', '.join(GAMES)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    runs = [
        (game, seed, args.workdir / f"{game}-s{seed}-p{args.peers}-{args.steps}")
        for seed in range(args.seeds)
        for game in args.games
    ]
    if not args.report_only:
        # A SIGTERM would otherwise end this process at once and leave the runs' peers (in their
        # own sessions) training on: exit through run_all's `finally`, which stops them.
        signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
        run_all(args, runs)
    result = build_table(args, runs)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / args.name
    pathlib.Path(f"{stem}-results.json").write_text(json.dumps(no_nan(result), indent=1) + "\n")
    table = markdown(result)
    pathlib.Path(f"{stem}-results.md").write_text(table)
    plot_curves(result, f"{stem}-curves.png")
    print(table)
    print(f"wrote {stem}-results.md, {stem}-results.json, {stem}-curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
