"""How far a moolib group scales across hosts: N stand-in peers (bench/standin_peer.py), each in
its own network namespace with a bandwidth-limited link (bench/netns.py), the all-reduce timed.

    python -m bench --only netscaling     # docs/scaling.md: table and checks (~30 min)
    python -m bench.netscaling --peers 1,2 --models minatar --links 1g --smoke --out /tmp/x.json

Needs root (network namespaces); refuses to start, in one line, where they cannot be made.
The peers run moolib's real Group and Accumulator on the real models' parameters, but their
learner is a stand-in that hands over gradients without computing them, so that the network is
measured and not the two shared cores. Bandwidth is emulated (htb); latency is not (this kernel
has no netem): its term is added by the model in bench/allreduce_model.py, and said so.
"""

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import signal
import sys
import tempfile
import time

from bench import allreduce_model as model
from bench import netns
from bench.processes import REPO, Child

# name: (rate in Mbit/s or None for no limit, one-way latency in s: modelled, never emulated)
LINKS = {
    "cpu": (None, 0.0),  # no limit: only the two shared cores hold the peers back
    "10g": (10_000, 0.0001),
    "1g": (1_000, 0.0005),
    "100m": (100, 0.020),
    "2m": (2, 0.0),  # only for the real-learner check (bench/scaling_checks.py)
}
TABLE_LINKS = ["cpu", "10g", "1g", "100m"]
# Parameters of the models (no LSTM, as config.py's default); cartpole only for the real check.
MODELS = {"resnet": 1_094_115, "nature": 1_687_719, "minatar": 132_308, "cartpole": 4_675}
TABLE_MODELS = ["resnet", "nature", "minatar"]
PEER_COUNTS = [1, 2, 4, 8, 16]
# The real learner the table is combined with: a GPU learner at the published moolib runs'
# 3,000-5,000 env steps/s, on the default batch of 32 unrolls of 20 steps (config.py).
LEARNER_SPS = (5_000, 3_000)
BATCH_SIZE, UNROLL_LENGTH = 32, 20
NOTES = [
    "**Emulated and measured.** Every peer runs in its own network namespace, joined to a hub "
    "(a bridge, where the broker runs) by its own veth link; htb limits each link to the "
    "given rate in both directions. Each peer runs moolib's real Rpc, Group and Accumulator "
    "on the real model's parameters, but **its learner is a stand-in**: it copies gradients "
    "made once into `.grad` and hands them over whenever the Accumulator wants them (at most "
    "one batch per peer per step, `virtual_batch_size` = N x 32), and skips otherwise, as "
    "examples/vtrace/learner.py does; it computes nothing and takes no optimizer step, so "
    "that the network is measured, not the two cores. Measured: the group's optimizer "
    "steps/s with such always-ready learners, the reduction time of each step (from the last "
    "peer's hand-over to the last peer's arrival of the reduced gradients; median and 95th "
    "percentile), the bytes through each peer's link per step, the CPU of the peer "
    "processes (in cores) and how busy the whole machine was.",
    "**Modelled, not measured: latency.** This kernel has no netem qdisc (and no fq, which "
    "could delay packets stamped by a BPF program), so links get their bandwidth but no "
    "latency. The `+ latency` column is a model (bench/allreduce_model.py): moolib's "
    "all-reduce is a count round and a gradient round, each up a binary tree to peer 0 and "
    "down a second one, whole messages stored and forwarded, so each round has 2 (N=2), 4, 6, "
    "8 (N=16) hops one after another; each hop adds the one-way latency, and where a link "
    "idles longer than TCP's least timeout (200 ms) between steps, a slow-start restart "
    "(a round trip per doubling of the window up to what the link holds).",
    "**Modelled: the real learner.** The last three columns combine the measured reduction "
    "(plus the modelled latency) with a GPU learner at 5,000 env steps/s (the fast end of the "
    "3,000-5,000 that issue 22 gives for the published moolib runs; not measured here), on "
    "batches of 32 x 20 = 640 env steps: 128 ms per batch; the summary also gives 3,000. "
    "examples/vtrace/learner.py starts its next batch only once the Accumulator wants "
    "gradients again, so a step takes batch + reduction, and the group trains on N x 640 env "
    "steps per step. All-reduce share = reduction / (batch + reduction). k: batches each peer "
    "would have to add up per step (`virtual_batch_size` = k x N x 32) for the share to fall "
    "under 10%.",
    "**Windows.** After each change of the links, a warm-up of at least 2 steps and 2 s; then "
    "a window of at least 10 steps and 5 s, cut at 30 s (the slowest cells have only a few "
    "steps: `steps` and `window_s` of each row are in the JSON beside this file). The peers "
    "of a group start once and the links change under them.",
    "**N = 1.** A lone peer sends nothing over its link: it is measured once, with no limit, "
    "and shown for every link.",
    "**CPU.** All peers share this machine's two cores; the kernel's copying for the veth "
    "links is part of that. `(CPU)` marks cells where the machine was over 90% busy and the "
    "reduction took over 1.5x the link model's time: there the shared cores, not the link, "
    "set the time, and on separate hosts the reduction would be shorter, so the verdicts "
    "drawn from those cells are on the safe side. `link model` is bench/allreduce_model.py's "
    "time for the bandwidth alone.",
]
# The group whose stand-ins are also run at the real learner's pace (bench/scaling_checks.py).
PACED = ("resnet", "1g", 4)
BROKER_PORT = 4431  # in the run's own hub namespace, where nothing else listens
DOCS = REPO / "docs"


class Window:
    """How long to warm up after a change and to measure (seconds, and at least so many steps,
    but never longer than max_s)."""

    def __init__(self, warmup_s=2.0, warmup_steps=2, min_s=5.0, min_steps=10, max_s=30.0):
        self.warmup_s, self.warmup_steps = warmup_s, warmup_steps
        self.min_s, self.min_steps, self.max_s = min_s, min_steps, max_s


SMOKE_WINDOW = Window(warmup_s=1.0, warmup_steps=1, min_s=2.0, min_steps=3, max_s=10.0)


def cpu_ticks(pid):
    """User + system clock ticks of one process (0 once it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def machine_ticks():
    """(busy, total) clock ticks of all cores since boot."""
    values = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class Group:
    """N stand-in peers of one model on the network, in a group of their own."""

    def __init__(self, network, name, model_name, peers, workdir, extra_args=()):
        self.network, self.peers, self.name = network, peers, name
        self.stop_file = workdir / f"{name}.stop"
        self.outputs = [workdir / f"{name}-peer{i}.json" for i in range(peers)]
        self.children = []
        self.args = ["--connect", f"{network.hub_address}:{BROKER_PORT}", "--group", name,
                     "--model", model_name, "--batch-size", BATCH_SIZE, "--peers", peers,
                     "--stop-file", self.stop_file, *extra_args]  # fmt: skip

    def start(self, index, name=None):
        out = self.outputs[index] if name is None else self.outputs[index].with_suffix(".b.json")
        args = [*self.network.exec_args(index), sys.executable, "-m", "bench.standin_peer",
                *self.args, "--name", name or f"{self.network.tag}-{self.name}-peer{index}",
                "--out", out]  # fmt: skip
        # Names unique over the run (the broker may still hold a finished group's peers) and
        # over runs (the tests look for leftover processes by this run's tag).
        child = Child(args, f"peer{index}")
        self.children.append(child)
        return child

    def start_all(self, timeout_s):
        for index in range(self.peers):
            self.start(index)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.members(c) == self.peers for c in self.children):
                return
            self.check_alive()
            time.sleep(0.5)
        raise TimeoutError(f"{self.peers} peers did not form a group in {timeout_s:.0f} s")

    @staticmethod
    def members(child):
        status = next((x for x in reversed(child.lines) if x.startswith("members ")), "")
        return int(status.split()[1]) if status else 0

    @staticmethod
    def version(child):
        status = next((x for x in reversed(child.lines) if x.startswith("members ")), "")
        return int(status.split()[3]) if status else 0

    def check_alive(self):
        """Raise if a peer ended before it was told to (it prints "wrote N steps" when told)."""
        for child in self.children:
            finished = any(line.startswith("wrote ") for line in child.lines)
            if child.poll() is not None and not finished:
                raise RuntimeError(f"{child.name} ended (exit {child.poll()}):\n{child.tail()}")

    def snapshot(self):
        """Counters at this moment: time, bytes per link, CPU ticks of the peers and machine."""
        return {
            "time": time.monotonic(),
            "bytes": self.network.byte_counts(),
            "peer_ticks": sum(cpu_ticks(c.pid) for c in self.children if c.poll() is None),
            "machine_ticks": machine_ticks(),
        }

    def finish(self, timeout_s=60):
        """Stop the peers; returns each peer's records (those of the first process per index)."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            child.wait(max(1.0, deadline - time.monotonic()))
        for child in self.children:
            child.stop(grace=5)
        return [json.loads(p.read_text()) if p.exists() else None for p in self.outputs]


def wait_for_steps(group, steps, min_s, max_s):
    """Until peer 0 has seen `steps` more optimizer steps and min_s passed (at most max_s)."""
    start, first = time.monotonic(), group.version(group.children[0])
    while time.monotonic() - start < max_s:
        group.check_alive()
        done = group.version(group.children[0]) - first
        if done >= steps and time.monotonic() - start >= min_s:
            break
        time.sleep(0.25)


def measure_link(group, link, window):
    """Set every link to `link`, warm up, and measure one window; returns its two snapshots."""
    group.network.set_rate(LINKS[link][0])
    wait_for_steps(group, window.warmup_steps, window.warmup_s, window.max_s)
    before = group.snapshot()
    wait_for_steps(group, window.min_steps, window.min_s, window.max_s)
    return before, group.snapshot()


def cpu_figures(before, after, steps):
    seconds = after["time"] - before["time"]
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    busy = [a - b for a, b in zip(after["machine_ticks"], before["machine_ticks"], strict=True)]
    peer_cpu_s = (after["peer_ticks"] - before["peer_ticks"]) / ticks_per_s
    return {
        "peer_cpu_s_per_step": peer_cpu_s / steps if steps else None,
        "peer_cpu_cores": peer_cpu_s / seconds,
        "machine_busy": busy[0] / busy[1] if busy[1] else None,
    }


def link_row(model_name, link, peers, records, before, after):
    """One row of the table: what was measured in the window, then what is modelled."""
    seconds = after["time"] - before["time"]
    steps = model.window_steps([r["steps"] for r in records], before["time"], after["time"])
    row = {"model": model_name, "link": link, "peers": peers, "window_s": round(seconds, 1)}
    row.update(model.summarize_steps(steps, seconds))
    moved = [after["bytes"][i] - before["bytes"][i] for i in range(peers)]
    step_count = row["steps"]
    row["mb_per_step_per_peer_mean"] = sum(moved) / peers / step_count / 1e6 if step_count else None
    row["mb_per_step_per_peer_max"] = max(moved) / step_count / 1e6 if step_count else None
    row.update(cpu_figures(before, after, step_count))
    add_modelled(row)
    return row


def add_modelled(row):
    """The modelled columns: the bandwidth model's time, the latency term, and the real learner
    combined with the measured reduction ("real<SPS>") and with the link model ("model_real")."""
    rate_mbit, one_way_s = LINKS[row["link"]]
    size = MODELS[row["model"]] * 4
    measured_s = row["reduce_median_ms"] / 1e3 if row["steps"] else None
    if rate_mbit is None or measured_s is None:
        return
    link_s = model.step_seconds(row["peers"], size, rate_mbit * 1e6, 0)
    row["bandwidth_model_ms"] = 1e3 * link_s
    latency_s = 0.0
    if row["peers"] > 1:
        latency_s = model.latency_seconds(
            row["peers"], size, rate_mbit * 1e6, one_way_s, measured_s
        )
    row["latency_term_ms"] = 1e3 * latency_s  # modelled: this kernel cannot add latency
    row["reduce_with_latency_ms"] = 1e3 * (measured_s + latency_s)
    for sps in LEARNER_SPS:
        batch_s = model.learner_seconds(sps, BATCH_SIZE, UNROLL_LENGTH)
        for key, reduce_s in ((f"real{sps}", measured_s), (f"model_real{sps}", link_s)):
            reduce_s += latency_s
            real = model.real_learner_rate(
                batch_s, reduce_s, row["peers"], BATCH_SIZE * UNROLL_LENGTH
            )
            row[key] = {
                **real,
                "batches_per_step_for_10pct": model.batches_per_step_needed(reduce_s, batch_s),
            }


@contextlib.contextmanager
def emulated_network(slots):
    """The hub (with a broker) and `slots` peer namespaces; all of it removed on the way out,
    also on an exception, Ctrl-C or SIGTERM (which is made to unwind like Ctrl-C)."""
    reason = netns.why_unavailable()
    if reason:
        raise netns.NamespacesUnavailable(reason)
    previous = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    network, broker = None, None
    with tempfile.TemporaryDirectory(prefix="netscaling-") as tmp:
        workdir = pathlib.Path(tmp)
        try:
            network = netns.Network()
            for index in range(slots):
                network.add_peer(index)
            address = f"{network.hub_address}:{BROKER_PORT}"
            broker = Child([*network.hub_exec_args(), sys.executable, "-m", "bench.standin_peer",
                            "--broker", address, "--stop-file", workdir / "broker.stop",
                            "--name", f"{network.tag}-broker"],
                           "broker")  # fmt: skip
            if not broker.wait_for_line(lambda s: "Broker listening" in s, 60):
                raise RuntimeError(f"the broker did not start:\n{broker.tail()}")
            yield network, workdir
        finally:
            if broker is not None:
                broker.stop(grace=5)
            if network is not None:
                network.close()
            signal.signal(signal.SIGTERM, previous)


def measure_group(network, workdir, model_name, peers, links, window):
    """Rows for one model and peer count, one per link: the peers start once, the links change."""
    group = Group(network, f"{model_name}-{peers}", model_name, peers, workdir)
    windows = []
    try:
        group.start_all(timeout_s=60 + 10 * peers)
        for link in links[:1] if peers == 1 else links:  # a lone peer sends nothing
            windows.append((link, *measure_link(group, link, window)))
    finally:
        records = group.finish()
    if any(r is None for r in records):
        raise RuntimeError(f"{model_name} x {peers}: a peer wrote no records")
    rows = [link_row(model_name, link, peers, records, b, a) for link, b, a in windows]
    for link in links[1:] if peers == 1 else []:
        rows.append({**rows[0], "link": link, "measured_on_link": links[0]})
        add_modelled(rows[-1])
    return rows


def print_row(row):
    print(
        f"[netscaling] {row['model']:8} {row['link']:5} N={row['peers']:2}: "
        f"{row['steps_per_s']:7.2f} steps/s, reduce {row['reduce_median_ms']:8.1f} ms "
        f"(p95 {row['reduce_p95_ms']:8.1f}), machine busy {100 * row['machine_busy']:3.0f}%",
        flush=True,
    )


def measure_table(network, workdir, models, peer_counts, links, window, errors, save=None,
                  rows=None):  # fmt: skip
    """The table's rows, added to `rows`; a group that fails is noted in errors and the others
    are measured. save(rows) after each group, so that a stopped run leaves what it measured."""
    rows = [] if rows is None else rows
    for model_name in models:
        for peers in peer_counts:
            try:
                group_rows = measure_group(network, workdir, model_name, peers, links, window)
            except (RuntimeError, TimeoutError, OSError, ValueError) as e:
                errors[f"{model_name} x {peers}"] = f"{type(e).__name__}: {e}"
                print(f"[netscaling] {model_name} x {peers} failed: {e}", file=sys.stderr)
                continue
            for row in group_rows:
                print_row(row)
                rows.append(row)
            if save is not None:
                save(rows)
    return rows


def measure_real_check(network, workdir, window, window_s):
    """Real CartPole peers against the prediction from the stand-ins (bench/scaling_checks.py)."""
    from bench import scaling_checks

    results = []
    for peers in (2, 4):
        standin = measure_group(network, workdir, "cartpole", peers, ["cpu", "2m"], window)
        for row in standin:
            print_row(row)
        extra_s = (standin[1]["reduce_median_ms"] - standin[0]["reduce_median_ms"]) / 1e3
        unlimited, limited = scaling_checks.measure_real_pair(network, workdir, peers, window_s)
        predicted = 1 / (1 / unlimited + extra_s) if unlimited else None
        results.append({"peers": peers, "real_unlimited_steps_per_s": unlimited,
                        "real_limited_steps_per_s": limited, "predicted_steps_per_s": predicted,
                        "standin_extra_reduce_ms": 1e3 * extra_s})  # fmt: skip
        print(f"[netscaling] real check N={peers}: {results[-1]}", flush=True)
    return {"rate_mbit": scaling_checks.REAL_CHECK_RATE_MBIT, "groups": results}


def run_part(results, name, fn, *fn_args):
    """results[name] = fn(...); a part that fails is recorded under errors and the others run."""
    print(f"[netscaling] {name} ...", flush=True)
    try:
        results[name] = fn(*fn_args)
    except (RuntimeError, TimeoutError, OSError, ValueError) as e:
        results["errors"][name] = f"{type(e).__name__}: {e}"
        print(f"[netscaling] {name} failed: {results['errors'][name]}", file=sys.stderr)


def run_checks(args, window, results, network, workdir):
    """The checks of bench/scaling_checks.py (each a part of its own; a failure is noted)."""
    from bench import scaling_checks

    paced = [r for r in results["rows"] if (r["model"], r["link"], r["peers"]) == PACED]
    if args.real_check and paced and paced[0]["steps"]:
        batch_s = model.learner_seconds(LEARNER_SPS[0], BATCH_SIZE, UNROLL_LENGTH)
        run_part(results, "paced_check", scaling_checks.measure_paced_learners, network,
                 workdir, paced[0], window, batch_s)  # fmt: skip
    if args.churn:
        phase_s = 6 if args.smoke else 20
        run_part(results, "churn", scaling_checks.measure_churn, network, workdir,
                 "resnet", "1g", phase_s)  # fmt: skip
    if args.real_check:
        run_part(results, "real_check", measure_real_check, network, workdir, window,
                 5 if args.smoke else 20)  # fmt: skip


def measure_all(args, window, results, started):
    """The first model's rows, the checks, then the other models' rows (so that a run stopped
    before its end, whose rows are saved as it goes, has a bit of everything)."""

    def save(rows):  # what is measured so far, marked as partial until the end
        write_results({**results, "rows": list(rows), "partial": True}, args.out, started)

    slots = max([*args.peers, 8 if args.churn else 0, 4 if args.real_check else 0])
    with emulated_network(slots) as (network, workdir):
        for i, model_name in enumerate(args.models):
            measure_table(network, workdir, [model_name], args.peers, args.links, window,
                          results["errors"], save, rows=results["rows"])  # fmt: skip
            if i == 0:
                run_checks(args, window, results, network, workdir)
                save(results["rows"])


def split(text, choices):
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(items) - set(choices))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {sorted(choices)}")
    return items


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m bench.netscaling", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", type=lambda s: split(s, MODELS), default=TABLE_MODELS)
    p.add_argument("--links", type=lambda s: split(s, LINKS), default=TABLE_LINKS)
    p.add_argument("--peers", type=lambda s: [int(x) for x in s.split(",")], default=PEER_COUNTS)
    p.add_argument(
        "--smoke", action="store_true", help="short windows (a check, not a measurement)"
    )
    p.add_argument("--churn", action="store_true", help="also: one of 8 peers killed and restarted")
    p.add_argument("--real-check", action="store_true",
                   help="also: real CartPole peers against the model's prediction")  # fmt: skip
    p.add_argument("--out", type=pathlib.Path, default=DOCS / "scaling-results.json",
                   help="results (JSON); Markdown beside it (x-results.json: x.md)")  # fmt: skip
    p.add_argument("--note", action="append", default=[], help="a line for the report's notes")
    return p.parse_args(argv)


def markdown_path(out):
    """docs/scaling-results.json -> docs/scaling.md; any other x.json -> x.md."""
    return out.with_name(out.stem.removesuffix("-results") + ".md")


def write_results(results, out, started):
    from bench import scaling_report

    results = {
        **results,
        "load_average_end": os.getloadavg(),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    text = scaling_report.markdown(results, LEARNER_SPS, BATCH_SIZE, UNROLL_LENGTH)
    markdown_path(out).write_text(text)
    print(f"{out} and {markdown_path(out)} written; took {results['minutes']} min")


def main(argv=None, command=None):
    args = parse_args(argv)
    reason = netns.why_unavailable()
    if reason:
        print(f"netscaling: cannot run: {reason}", file=sys.stderr)
        return 2
    from bench.machine import describe_machine

    started = time.monotonic()
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command
        or "python -m bench.netscaling " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": describe_machine(),
        "load_average_start": os.getloadavg(),
        "notes": [*NOTES, *args.note],
        "rows": [],
        "errors": {},
    }
    measure_all(args, SMOKE_WINDOW if args.smoke else Window(), results, started)
    write_results(results, args.out, started)
    for part, error in results["errors"].items():
        print(f"error in {part}: {error}", file=sys.stderr)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
