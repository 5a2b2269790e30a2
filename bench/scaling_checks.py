"""Two checks of the network-scaling benchmark (bench/netscaling.py), on the same emulated hosts:

* churn: one of 8 stand-in peers is killed and restarted; the group's rate in each phase, the
  pause, and that no optimizer step already reduced is lost (every surviving peer's model
  version goes up by exactly one at each step, and the restarted one continues from the group's);
* real learners: 2 and 4 real V-trace CartPole peers train together on a slow link, at the rate
  predicted from their rate without a limit plus the stand-ins' measured reduction times.
"""

import csv
import json
import os
import signal
import sys
import time
from itertools import pairwise

from bench import netscaling
from bench.processes import REPO, Child

CHURN_PEERS = 8
REAL_CHECK_RATE_MBIT = 2  # slow enough that CartPole's 19 KB of gradients take most of a step
CARTPOLE = ["env.name=CartPole-v1", "device=cpu", "actor_batch_size=16", "num_actor_cpus=1",
            "batch_size=16", "unroll_length=5", "total_steps=100000000", "log_interval=1",
            "checkpoint_interval=100000", "torch_threads=1"]  # fmt: skip


def versions_in(versions, start, end):
    return [v for t, v in versions if start <= t <= end]


def phase_rate(versions, start, end):
    inside = versions_in(versions, start, end)
    return (len(inside) / (end - start)) if end > start else 0.0


def version_jumps(versions):
    """(version, next version) wherever one peer's model version did not go up by exactly one
    from a step to the next: a step skipped (lost) or repeated."""
    return [(a, b) for a, b in pairwise(v for _, v in versions) if b != a + 1]


def longest_pause(versions, start, end):
    """The longest time without a step between start and end (edges included)."""
    times = [start, *(t for t, _ in versions if start < t < end), end]
    return max(b - a for a, b in pairwise(times))


def wait_until(condition, timeout_s, group):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        group.check_alive()
        time.sleep(0.25)
    return False


def run_churn_phases(group, phase_s):
    """Measure 8 peers, kill one, measure 7, restart it, measure 8; returns the phase times."""
    marks = {"a": time.monotonic()}
    time.sleep(phase_s)
    victim = group.children[-1]
    marks["kill"] = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)  # a crash: no goodbye to the group
    victim.wait(10)
    group.children.remove(victim)
    survivors = group.children[:-1]
    if not wait_until(lambda: group.members(survivors[0]) == CHURN_PEERS - 1, 120, group):
        raise TimeoutError("the group did not notice the killed peer within 120 s")
    marks["b"] = time.monotonic()
    time.sleep(phase_s)
    marks["restart"] = time.monotonic()
    newcomer = group.start(CHURN_PEERS - 1, name=f"{group.network.tag}-{group.name}-restarted")
    if not wait_until(lambda: group.version(newcomer) > 0, 180, group):
        raise TimeoutError("the restarted peer did not train with the group within 180 s")
    marks["c"] = time.monotonic()
    time.sleep(phase_s)
    marks["end"] = time.monotonic()
    return marks


def first_step_after(versions, moment):
    return next((t for t, _ in versions if t > moment), moment)


def churn_result(records, restarted, marks):
    survivors = records[: CHURN_PEERS - 1]
    first = survivors[0]["versions"]
    # Each phase from the group's first step in it: the pause of the change is reported apart.
    phases = {
        "8 peers": (marks["a"], marks["kill"]),
        "7 peers": (first_step_after(first, marks["b"]), marks["restart"]),
        "8 again": (first_step_after(first, marks["c"]), marks["end"]),
    }
    everyone = [*survivors, restarted]
    seen = sorted({v for r in everyone for _, v in r["versions"]})
    join_time = restarted["versions"][0][0] if restarted["versions"] else marks["end"]
    return {
        "rates": {k: phase_rate(first, a, b) for k, (a, b) in phases.items()},
        "pause_after_kill_s": longest_pause(first, marks["kill"], marks["restart"]),
        "pause_after_restart_s": longest_pause(first, marks["restart"], marks["end"]),
        # Every step that any peer received is in the group's history, and no peer's version
        # ever goes back: no reduced step was lost. A peer that missed a step's result in the
        # change jumps over it: moolib has it take the leader's model, which holds that step.
        "versions_contiguous": seen == list(range(seen[0], seen[-1] + 1)) if seen else False,
        "versions_never_decrease": all(
            all(b >= a for (_, a), (_, b) in pairwise(r["versions"])) for r in everyone
        ),
        "jumps_survivors": [version_jumps(r["versions"]) for r in survivors],
        "jumps_restarted": version_jumps(restarted["versions"]),
        "restarted_first_version": restarted["versions"][0][1] if restarted["versions"] else None,
        # survivor 0's version at its step nearest in time to the restarted peer's first step
        "group_version_at_join": min(first, key=lambda tv: abs(tv[0] - join_time))[1]
        if first
        else None,
        "last_versions": [r["versions"][-1][1] for r in everyone if r["versions"]],
        "seconds_to_rejoin": marks["c"] - marks["restart"],
    }


def measure_churn(network, workdir, model_name="resnet", link="1g", phase_s=20):
    """One of 8 peers killed and restarted. virtual_batch_size is 7 batches, so that the group
    steps with 7 peers as with 8 (each peer hands over one batch per step)."""
    vbs = ["--virtual-batch-size", netscaling.BATCH_SIZE * (CHURN_PEERS - 1)]
    group = netscaling.Group(network, f"churn-{model_name}", model_name, CHURN_PEERS, workdir, vbs)
    try:
        group.start_all(timeout_s=60 + 10 * CHURN_PEERS)
        network.set_rate(netscaling.LINKS[link][0])
        time.sleep(3)
        marks = run_churn_phases(group, phase_s)
    finally:
        records = group.finish()
    restarted_out = group.outputs[-1].with_suffix(".b.json")
    restarted = json.loads(restarted_out.read_text())
    result = churn_result(records, restarted, marks)
    result.update(model=model_name, link=link, peers=CHURN_PEERS, phase_s=phase_s)
    return result


def last_log_row(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except OSError:
        return None
    return rows[-1] if rows else None


def real_rate(logs, window_s):
    """Optimizer steps/s of the real group over window_s, from the first peer's logs.tsv (its own
    clock and model version, so no start-up is counted)."""
    before = last_log_row(logs)
    time.sleep(window_s)
    after = last_log_row(logs)
    if before is None or after is None or float(after["time"]) <= float(before["time"]):
        return None
    versions = int(after["model_version"]) - int(before["model_version"])
    return versions / (float(after["time"]) - float(before["time"]))


def start_real_peers(network, workdir, peers, broker):
    children = []
    savedir = workdir / f"real{peers}"
    for index in range(peers):
        args = [*network.exec_args(index), sys.executable, "-m", "bench.standin_peer",
                "--then-exec", sys.executable, "-m", "examples.vtrace.experiment",
                f"connect={broker}", f"savedir={savedir}", "project=netscaling",
                f"group=real{peers}", f"local_name={network.tag}-peer{index}", f"seed={index}",
                *CARTPOLE,
                f"virtual_batch_size={16 * peers}"]  # fmt: skip
        children.append(Child(args, f"real{index}", cwd=REPO))
    return children, savedir / "peers" / f"{network.tag}-peer0" / "logs.tsv"


def measure_real_pair(network, workdir, peers, window_s):
    """Real CartPole peers: optimizer steps/s with no limit, then on the slow link."""
    broker = f"{network.hub_address}:{netscaling.BROKER_PORT}"
    network.set_rate(None)
    children, logs = start_real_peers(network, workdir, peers, broker)
    try:
        deadline = time.monotonic() + 120 + 30 * peers
        while time.monotonic() < deadline:
            row = last_log_row(logs)
            if row and row["peers"] == str(peers) and int(row["model_version"]) > 20:
                break
            if any(c.poll() is not None for c in children):
                raise RuntimeError(f"a real peer ended:\n{children[0].tail()}")
            time.sleep(1)
        else:
            raise TimeoutError(f"{peers} real peers did not train together in time")
        unlimited = real_rate(logs, window_s)
        network.set_rate(REAL_CHECK_RATE_MBIT)
        time.sleep(3)
        limited = real_rate(logs, window_s)
    finally:
        for child in children:
            child.stop(grace=10)
    return unlimited, limited


def measure_paced_learners(network, workdir, table_row, window, batch_s, batches=(1, 3)):
    """Stand-ins that take batch_s per batch (sleeping: no CPU) and add up k batches per step,
    against the prediction 1 / (k x batch_s + the table's reduction time) for the same group."""
    peers, model_name = table_row["peers"], table_row["model"]
    network.set_rate(netscaling.LINKS[table_row["link"]][0])
    results = []
    for k in batches:
        extra = ["--learner-seconds", batch_s, "--batches-per-step", k,
                 "--virtual-batch-size", netscaling.BATCH_SIZE * peers * k]  # fmt: skip
        name = f"paced-{model_name}-{peers}-{k}"
        group = netscaling.Group(network, name, model_name, peers, workdir, extra)
        try:
            group.start_all(timeout_s=60 + 10 * peers)
            netscaling.wait_for_steps(group, window.warmup_steps, window.warmup_s, window.max_s)
            start, first = time.monotonic(), group.version(group.children[0])
            netscaling.wait_for_steps(group, window.min_steps, window.min_s, window.max_s)
            rate = (group.version(group.children[0]) - first) / (time.monotonic() - start)
        finally:
            group.finish()
        predicted = 1 / (k * batch_s + table_row["reduce_median_ms"] / 1e3)
        results.append({"batches_per_step": k, "measured_steps_per_s": rate,
                        "predicted_steps_per_s": predicted})  # fmt: skip
        print(f"[netscaling] paced learners {name}: {results[-1]}", flush=True)
    return {"model": model_name, "link": table_row["link"], "peers": peers,
            "batch_s": batch_s, "runs": results}  # fmt: skip
