"""The network-scaling benchmark on emulated hosts: two stand-in peers on one bandwidth-limited
link count their steps, and every namespace and process it made is gone when it ends, whether it
finishes or is interrupted. Skipped where network namespaces cannot be made."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import wait_until

from bench import netns

pytestmark = pytest.mark.skipif(
    bool(reason := netns.why_unavailable()), reason=reason or "network namespaces available"
)

COMMAND = [sys.executable, "-m", "bench.netscaling", "--models", "minatar", "--peers", "2",
           "--smoke"]  # fmt: skip


def leftovers(pid):
    """Namespaces and processes of the run whose benchmark process was `pid`."""
    tag = f"{netns.PREFIX}{pid}"
    namespaces = netns.our_namespaces(pid)
    processes = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if tag in cmdline:
                processes.append((int(entry), cmdline))
    return namespaces, processes


def test_two_standin_peers_on_an_emulated_link(children, tmp_path):
    out = tmp_path / "scaling.json"
    run = children([*COMMAND, "--links", "1g", "--out", out], "netscaling")
    assert run.wait(timeout=300) == 0, run.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["link"], r["peers"]) for r in rows] == [("1g", 2)]
    row = rows[0]
    assert row["steps"] >= 3 and row["steps_per_s"] > 0, row
    # Each peer sends its 0.53 MB of gradients up and receives the sum: about 1.06 MB a step.
    assert 0.9 < row["mb_per_step_per_peer_mean"] < 1.6, row
    assert row["reduce_median_ms"] > 0.5 * row["bandwidth_model_ms"], row
    assert (out.with_suffix(".md")).read_text().count("Modelled, not measured: latency") == 1
    assert wait_until(lambda: leftovers(run.pid) == ([], []), 10), leftovers(run.pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_removes_everything(children, tmp_path, sig):
    run = children([*COMMAND, "--links", "100m,1g", "--out", tmp_path / "x.json"], "netscaling")
    started = wait_until(lambda: len(leftovers(run.pid)[1]) >= 3, 120)  # broker and two peers
    assert started, run.output
    assert len(leftovers(run.pid)[0]) == 3  # the hub and two peers
    time.sleep(1)
    run.signal(sig)
    assert run.wait(timeout=90) is not None, run.output
    assert wait_until(lambda: leftovers(run.pid) == ([], []), 10), leftovers(run.pid)


def test_namespaces_of_a_killed_run_are_removed_by_the_next(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.PREFIX}{dead.pid}p0"
    netns.run("ip", "netns", "add", stale)
    try:
        netns.remove_stale()
        assert stale not in netns.our_namespaces()
    finally:
        netns.run("ip", "netns", "del", stale, check=False)
