"""Broker and peers on three separate network hosts (network namespaces joined by veth links)."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import CARTPOLE, REPO, read_rows, wait_until

pytestmark = pytest.mark.slow

SUBNET = "10.213.{}.{}"  # addresses inside namespaces this test creates, and nowhere else


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def namespaces_available():
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"mlprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot create network namespaces here ({e})"
    return None


@pytest.fixture
def hosts():
    """Three hosts on a private bridge: h0 (the broker), h1 and h2, as (namespace, address,
    the host's end of its link); removed at teardown."""
    reason = namespaces_available()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 10000
    net = tag % 250
    names = [f"ml{tag}h{i}" for i in range(3)]
    addresses = [SUBNET.format(net, i + 1) for i in range(3)]
    try:
        for name in names:
            ip("netns", "add", name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", names[0], "link", "add", "br0", "type", "bridge")
        ip("-n", names[0], "link", "set", "br0", "up")
        ip("-n", names[0], "addr", "add", f"{addresses[0]}/24", "dev", "br0")
        for i in (1, 2):
            outside, inside = f"ml{tag}v{i}", f"ml{tag}p{i}"
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            ip("link", "set", outside, "netns", names[0])
            ip("link", "set", inside, "netns", names[i])
            ip("-n", names[0], "link", "set", outside, "master", "br0", "up")
            ip("-n", names[i], "addr", "add", f"{addresses[i]}/24", "dev", inside)
            ip("-n", names[i], "link", "set", inside, "up")
        links = ["br0", *(f"ml{tag}p{i}" for i in (1, 2))]
        yield list(zip(names, addresses, links, strict=True))
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def in_host(host, *args):
    return ["ip", "netns", "exec", host[0], *[str(a) for a in args]]


def test_peers_on_different_hosts_train_together(hosts, children, tmp_path):
    broker_host, *peer_hosts = hosts
    address = f"{broker_host[1]}:4431"
    broker = children(
        in_host(broker_host, sys.executable, "-m", "moolib.broker", address), "broker"
    )
    assert broker.wait_for_line(lambda s: "Broker listening" in s, 60), broker.output

    savedir = tmp_path / "multihost"
    logs = [savedir / "peers" / f"peer{i}" / "logs.tsv" for i in range(2)]
    # No step limit: a peer that starts seconds after the other (imports on a loaded machine)
    # would otherwise find the run over. The peers are stopped once both have trained together.
    peers = []
    for i, host in enumerate(peer_hosts):
        args = in_host(
            host, sys.executable, "-m", "examples.vtrace.experiment", f"connect={address}",
            f"savedir={savedir}", "project=test", "group=multihost", f"local_name=peer{i}",
            f"seed={i}", *CARTPOLE, "log_interval=0.5", "total_steps=100000000",
        )  # fmt: skip
        peers.append(children(args, f"peer{i}", cwd=REPO))

    def trained_on_both_hosts(path):
        # The group trained on both hosts' samples: more than this peer acted on. (A step need
        # not merge both peers' batches: a peer with nothing ready skips that round.)
        # A row still being written may be cut short: only whole ones count.
        rows = [r for r in (read_rows(path) if path.exists() else []) if None not in r.values()]
        seen = [r for r in rows if r["peers"] == "2"]
        acted = sum(float(r["local_env_steps"]) for r in rows)
        return seen and acted < 0.95 * int(rows[-1]["env_train_steps"])

    together = wait_until(lambda: all(trained_on_both_hosts(p) for p in logs), 300)
    for peer in peers:
        peer.signal(signal.SIGTERM)
    for peer in peers:
        assert peer.wait(timeout=60) == 0, peer.output[-3000:]
    assert together, [read_rows(p)[-3:] if p.exists() else None for p in logs]
    assert (savedir / "checkpoint.tar").exists()


def test_a_partition_that_heals(hosts, children, tmp_path):
    """Peer B's host loses its link for a minute: A trains on alone, and once the link is back B
    rejoins by itself, taking the group's state as a newcomer does; nobody writes a traceback,
    hangs, or puts the checkpoint back."""
    import signal
    import time

    import torch

    broker_host, host_a, host_b = hosts
    address = f"{broker_host[1]}:4431"
    broker = children(
        in_host(broker_host, sys.executable, "-m", "moolib.broker", address), "broker"
    )
    assert broker.wait_for_line(lambda s: "Broker listening" in s, 60), broker.output
    savedir = tmp_path / "partition"
    peers = {}
    for name, host in (("A", host_a), ("B", host_b)):
        args = in_host(
            host, sys.executable, "-m", "examples.vtrace.experiment", f"connect={address}",
            f"savedir={savedir}", "project=test", "group=partition", f"local_name={name}",
            *CARTPOLE, "total_steps=100000000", "log_interval=1", "checkpoint_interval=5",
        )  # fmt: skip
        peers[name] = children(args, name, cwd=REPO)
    logs = {name: savedir / "peers" / name / "logs.tsv" for name in peers}
    checkpoint_versions = []

    def rows(name):
        return read_rows(logs[name]) if logs[name].exists() else []

    def wait_for(condition, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, peer in peers.items():
                assert peer.poll() is None, f"{name} ended while {what}:\n{peer.output[-3000:]}"
            path = savedir / "checkpoint.tar"
            if path.exists():
                try:
                    checkpoint_versions.append(torch.load(path, weights_only=True)["model_version"])
                except Exception:  # being replaced at this moment
                    pass
            if condition():
                return
            time.sleep(1)
        raise AssertionError(f"timed out {what}:\n{peers['B'].output[-3000:]}")

    def together():
        last = [r[-1] for r in map(rows, peers) if r]
        return len(last) == 2 and all(r["peers"] == "2" and int(r["model_version"]) > 5
                                      for r in last)  # fmt: skip

    wait_for(together, 180, "waiting for A and B to train together")

    ip("-n", host_b[0], "link", "set", host_b[2], "down")
    cut = time.monotonic()
    a_rows_at_cut = len(rows("A"))
    wait_for(lambda: time.monotonic() - cut >= 60, 70, "during the partition")
    after = rows("A")[a_rows_at_cut:]
    # A trained on through it, alone once the group noticed.
    assert int(after[-1]["model_version"]) > int(after[0]["model_version"]), after[-3:]
    assert after[-1]["peers"] == "1", after[-3:]

    ip("-n", host_b[0], "link", "set", host_b[2], "up")
    healed = time.monotonic()
    version_at_heal = int(rows("A")[-1]["model_version"])
    b_rows_at_heal = len(rows("B"))

    def b_rejoined():
        new = rows("B")[b_rows_at_heal:]
        return any(r["peers"] == "2" and int(r["model_version"]) >= version_at_heal for r in new)

    wait_for(b_rejoined, 180, "waiting for B to rejoin")
    print(f"B trained with A again {time.monotonic() - healed:.0f} s after the link came back")
    for peer in peers.values():
        peer.signal(signal.SIGTERM)
    for peer in peers.values():
        assert peer.wait(60) == 0, peer.output[-3000:]
        assert "Traceback" not in peer.output, peer.output[-3000:]
    final = torch.load(savedir / "checkpoint.tar", weights_only=True)["model_version"]
    versions = [*checkpoint_versions, final]
    assert versions == sorted(versions), versions
