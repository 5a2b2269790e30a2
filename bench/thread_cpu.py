"""Where a run's CPU goes: every thread's CPU time, and its time spent waiting for a core, over
the whole life of the processes whose command line contains a pattern (Linux only: it reads
/proc/<pid>/task/<tid>/schedstat once a second).

    python -m bench.minatar --games Asterix --seeds 1 --parallel 1 --workdir /tmp/acct &
    python -m bench.thread_cpu /tmp/acct/Asterix --out /tmp/acct.json

Waits for the first matching process, follows them (and their threads, the EnvPool workers
included, which are forked with the same command line) until none is left, then prints the
threads' totals, the machine's busy cores over that time, and their sum divided by the cores:
how long the run would take on those cores with none of them ever idle.
"""

import argparse
import json
import os
import pathlib
import sys
import time

PROC = pathlib.Path("/proc")


def ancestors():
    """This process and the ones that started it (a shell or `timeout` whose command line holds
    the pattern too), which are not followed."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:  # the parent's pid is the 2nd field after the command's name, which is in (...)
            pid = int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def matching_pids(pattern, skipped):
    """The processes, but for `skipped`, whose command line contains `pattern`."""
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skipped:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        if pattern in command:
            pids.append(entry.name)
    return pids


def thread_times(pid):
    """{'pid/tid': (name, seconds on a CPU, seconds runnable but waiting for one)}."""
    times = {}
    for task in (PROC / pid / "task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            on_cpu, waiting, _ = map(int, (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        times[f"{pid}/{task.name}"] = (name, on_cpu / 1e9, waiting / 1e9)
    return times


def machine_ticks():
    """(busy, all) clock ticks of every CPU since boot, from /proc/stat."""
    fields = list(map(int, (PROC / "stat").read_text().splitlines()[0].split()[1:9]))
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def follow(pattern, start_timeout, interval=1.0):
    """Sample the matching processes' threads until none is left; returns the summary."""
    skipped = ancestors()
    deadline = time.monotonic() + start_timeout
    while not matching_pids(pattern, skipped):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no process with {pattern!r} in its command line started")
        time.sleep(0.1)
    started, (busy_0, all_0) = time.monotonic(), machine_ticks()
    first, last = {}, {}
    while pids := matching_pids(pattern, skipped):
        for pid in pids:
            for key, sample in thread_times(pid).items():
                first.setdefault(key, sample)
                last[key] = sample
        time.sleep(interval)
    wall = time.monotonic() - started
    busy_1, all_1 = machine_ticks()
    cores = os.cpu_count() or 1
    threads = sorted(
        (
            {
                "thread": key,
                "name": name,
                "cpu_s": cpu - first[key][1],
                "waiting_s": waiting - first[key][2],
            }
            for key, (name, cpu, waiting) in last.items()
        ),
        key=lambda row: -row["cpu_s"],
    )
    total = sum(row["cpu_s"] for row in threads)
    return {
        "pattern": pattern,
        "wall_s": wall,
        "cores": cores,
        "machine_busy_cores": cores * (busy_1 - busy_0) / max(all_1 - all_0, 1),
        "threads_cpu_s": total,
        "never_idle_wall_s": total / cores,
        "threads": threads,
    }


def report(summary, rows=8):
    lines = [
        f"{summary['wall_s']:.0f} s wall; the threads' CPU {summary['threads_cpu_s']:.0f} s "
        f"(= {summary['never_idle_wall_s']:.0f} s on {summary['cores']} cores never idle); "
        f"the machine busy {summary['machine_busy_cores']:.2f} cores"
    ]
    for row in summary["threads"][:rows]:
        lines.append(
            f"  {row['thread']:>14} {row['name']:<15} CPU {row['cpu_s']:7.1f} s  "
            f"waiting for a core {row['waiting_s']:6.1f} s"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pattern", help="a string in the command lines of the processes")
    parser.add_argument("--out", help="also write the summary here, as JSON")
    parser.add_argument("--start-timeout", type=float, default=60.0,
                        help="seconds to wait for the first process (default 60)")  # fmt: skip
    args = parser.parse_args(argv)
    if not (PROC / "self" / "schedstat").exists():
        print("thread_cpu: error: needs Linux's /proc/<pid>/schedstat", file=sys.stderr)
        return 2
    try:
        summary = follow(args.pattern, args.start_timeout)
    except TimeoutError as e:
        print(f"thread_cpu: error: {e}", file=sys.stderr)
        return 1
    print(report(summary))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
