"""Broker and peers on three separate network hosts (network namespaces joined by veth links)."""

import os
import shutil
import subprocess
import sys

import pytest
from helpers import CARTPOLE, REPO, read_rows

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
    """Three hosts on a private bridge: h0 (the broker), h1 and h2; removed at teardown."""
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
        yield list(zip(names, addresses, strict=True))
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
    peers = []
    for i, host in enumerate(peer_hosts):
        args = in_host(
            host, sys.executable, "-m", "examples.vtrace.experiment", f"connect={address}",
            f"savedir={savedir}", "project=test", "group=multihost", f"local_name=peer{i}",
            f"seed={i}", *CARTPOLE, "total_steps=40000",
        )  # fmt: skip
        peers.append(children(args, f"peer{i}", cwd=REPO))
    for peer in peers:
        assert peer.wait(timeout=400) == 0, peer.output
    for i in range(2):
        rows = read_rows(savedir / "peers" / f"peer{i}" / "logs.tsv")
        assert any(r["peers"] == "2" for r in rows), f"peer{i} never saw the other host"
        # The group trained on both hosts' samples: more than this peer acted on. (A step need
        # not merge both peers' batches: a peer with nothing ready skips that round.)
        acted = sum(float(r["local_env_steps"]) for r in rows)
        assert acted < 0.95 * int(rows[-1]["env_train_steps"]), (acted, rows[-1])
    assert (savedir / "checkpoint.tar").exists()
